"""argparse types and options shared by every ``dledger`` command: a bad number is a usage error (exit 2), never a hang.

``--batch 0`` once made ``dledger bench store`` loop forever and ``--timeout -1`` failed deep inside
Twisted with an AssertionError; checking each number where it is parsed gives one line that names
the option's rule, and argparse turns it into the usage text and exit status 2.
"""

from __future__ import annotations

import argparse
import math
import os


def _number(text: str, kind: type) -> float | int:
    try:
        value = kind(text)
    except ValueError:
        what = "an integer" if kind is int else "a number"
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if kind is float and not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1 (counts, sizes of batches, in-flight requests)."""
    value = _number(text, int)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def non_negative_int(text: str) -> int:
    """An integer >= 0 (indexes, body sizes)."""
    value = _number(text, int)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0 (timeouts, durations in seconds)."""
    value = _number(text, float)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """A finite number >= 0 (warm-up times)."""
    value = _number(text, float)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {text}")
    return value


def add_tls_options(group, peer: str = "the members'") -> None:
    """``--tls-ca/--tls-cert/--tls-key`` with their ``$DLEDGER_TLS_*`` defaults, as every dledger client takes them.

    The one definition the ``dledger`` client commands, ``dledger ingest`` and ``dledger rocketmq`` share, so
    a credential option means the same everywhere (docs/security.md).
    """
    group.add_argument("--tls-ca", default=os.environ.get("DLEDGER_TLS_CA"),
                       help=f"speak TLS; {peer} certificates must chain to this CA file (default $DLEDGER_TLS_CA)")
    group.add_argument("--tls-cert", default=os.environ.get("DLEDGER_TLS_CERT"),
                       help="client certificate for authMode=tls; its role decides what it may do "
                            "(default $DLEDGER_TLS_CERT)")
    group.add_argument("--tls-key", default=os.environ.get("DLEDGER_TLS_KEY"),
                       help="its private key (default $DLEDGER_TLS_KEY)")


def add_secret_options(group) -> None:
    """``--client-name/--token-file`` (authMode secret) with their ``$DLEDGER_*`` defaults."""
    group.add_argument("--client-name", default=os.environ.get("DLEDGER_CLIENT_NAME"),
                       help="this client's name in the members' clientsFile, for --token-file")
    group.add_argument("--token-file", default=os.environ.get("DLEDGER_TOKEN_FILE"),
                       help="file holding this client's token for authMode=secret (default $DLEDGER_TOKEN_FILE)")
