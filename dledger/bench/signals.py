"""How a benchmark run stopped by a signal ends: shared by the runners (``dledger.bench.*``) and the command.

It lives below both so that the runners need nothing from :mod:`dledger.commands.bench`, which imports them
(issue #26: no import circles).
"""

from __future__ import annotations

import signal


def interrupted(reactor) -> KeyboardInterrupt:
    """The exception that ends a command whose reactor a signal stopped: Terminated for SIGTERM (exit 143)."""
    from dledger.cli import Terminated

    signum = getattr(reactor, "_exitSignal", None)  # which signal twistd-style reactors record
    return Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt()
