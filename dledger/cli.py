"""The ``dledger`` command: one entry point, one module per sub-command under :mod:`dledger.commands`.

Each command module exposes ``register(subparsers)``, which adds its parser
and sets ``func`` to a callable taking the parsed arguments and returning an
exit status.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from dledger import __version__
from dledger.errors import ConfigError, DLedgerError, StoreError

#: Sub-command modules, in the order ``--help`` lists them.
COMMAND_MODULES = [
    "dledger.commands.demo",
    "dledger.commands.client",
    "dledger.commands.info",
    "dledger.commands.store",
    "dledger.commands.bench",
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dledger",
        description="dledger: a Raft-replicated commit log (DLedger-compatible). "
                    "Run members with 'twistd dledger'; this command talks to them and to their stores.")
    parser.add_argument("--version", action="version", version=f"dledger {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the ``dledger`` command line; returns the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ConfigError, StoreError) as exc:
        print(f"dledger: error: {exc}", file=sys.stderr)
        return 2
    except DLedgerError as exc:
        print(f"dledger: {exc.code.name} ({int(exc.code)}): {exc.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
