"""The ``dledger`` command: one entry point, one module per sub-command under :mod:`dledger.commands`.

Each command module exposes ``register(subparsers)``, which adds its parser
and sets ``func`` to a callable taking the parsed arguments and returning an
exit status.  Plugins add commands the same way through the
``dledger_cli_commands(subparsers)`` hook.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading  # allowed: only to ask whether this is the main thread (signal handlers), no thread is started

from dledger import __version__
from dledger.errors import ConfigError, DLedgerError, StoreError

#: Sub-command modules, in the order ``--help`` lists them.
COMMAND_MODULES = [
    "dledger.commands.demo",
    "dledger.commands.client",
    "dledger.commands.members",
    "dledger.commands.info",
    "dledger.commands.store",
    "dledger.commands.bench",
    "dledger.commands.certs",
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
    from dledger import plugins

    # Plugins' commands, each on its own: one that fails is a line on stderr, the others still work.
    for problem in plugins.call_each(plugins.get_plugin_manager(), "dledger_cli_commands", subparsers=subparsers):
        print(problem, file=sys.stderr)
    return parser


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: unwinds like Ctrl-C, so ``with``/``finally`` blocks remove temporary directories."""

    def __init__(self, signum: int):
        super().__init__(f"signal {signum}")
        self.status = 128 + signum


def _raise_terminated(signum: int, _frame) -> None:
    raise Terminated(signum)


def main(argv: list[str] | None = None) -> int:
    """Run the ``dledger`` command line; returns the exit status.

    Operator mistakes print one line: bad arguments and configs exit 2, protocol errors 1.  SIGTERM
    and Ctrl-C unwind the command (its temporary directories are removed) and exit 143 / 130; a
    closed stdout (``dledger metadata | head -1``) ends the command quietly with 141.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        return int(args.func(args) or 0)
    except (ConfigError, StoreError) as exc:
        print(f"dledger: error: {exc}", file=sys.stderr)
        return 2
    except DLedgerError as exc:
        print(f"dledger: {exc.code.name} ({int(exc.code)}): {exc.message}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        silence_stdout()
        return 141
    except Terminated as exc:
        return exc.status
    except KeyboardInterrupt:
        return 130
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous)


def silence_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's last flush does not fail again on a closed pipe."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":  # pragma: no cover
    # Run the module's importable copy: ``python -m dledger.cli`` would otherwise define a second
    # ``Terminated`` class in ``__main__`` that the commands (importing ``dledger.cli``) do not raise.
    from dledger.cli import main as _main

    sys.exit(_main())
