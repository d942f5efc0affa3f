"""Waiting, from plain (blocking) test code, for something another process does: a bounded poll.

A test that starts real processes (``twistd`` members, a name server, a
benchmark) cannot be told when the other process has listened on its port
or created its files; it can only look.  :func:`wait_until` looks until the
condition holds or the deadline passes, so the wait stops by itself and a
failure names what never happened.  Code on a reactor uses
:meth:`dledger.launcher.LocalGroup.wait_for` instead.
"""

from __future__ import annotations

import time  # allowed: blocking test code polling another process (never imported by the core)
from collections.abc import Callable
from typing import Any


def wait_until(condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.05) -> Any:
    """Call ``condition`` until it returns something truthy, which is returned; TimeoutError naming ``what``.

    ``condition`` runs at least once, then every ``interval`` seconds until
    ``timeout`` seconds have passed; exceptions it raises propagate (a
    condition that tolerates a not-yet-ready peer catches them itself).
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)  # allowed: blocking test code waiting on another process, bounded by timeout
