"""The one place where dledger makes blocking disk syscalls (fsync, msync, rename).

Everything else in the core is reactor-driven.  A :class:`BlockingIO`
decides *where* a blocking call runs: inline (tests, simulations and tools,
so results are deterministic) or on the reactor's thread pool (a running
member, so a slow fsync never stalls heartbeats).  Small metadata files are
always written inline with :func:`write_atomic`, because a vote must not be
answered before its promise is on disk.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.threads import deferToThreadPool


class BlockingIO:
    """Runs blocking callables inline or on the reactor thread pool; always returns a Deferred."""

    def __init__(self, reactor: Any = None, *, threaded: bool = False):
        if threaded and reactor is None:
            raise ValueError("a threaded BlockingIO needs a reactor")
        self.reactor = reactor
        self.threaded = threaded

    def run(self, fn: Callable[..., Any], *args: Any) -> Deferred:
        if self.threaded:
            return deferToThreadPool(self.reactor, self.reactor.getThreadPool(), fn, *args)
        return maybeDeferred(fn, *args)


#: Runs everything inline: for tests, simulations and offline tools.
INLINE = BlockingIO()


def fsync_fd(fd: int) -> None:
    """fdatasync where available (metadata is not needed to read data back), else fsync."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def fsync_dir(path: str | Path) -> None:
    """Make a rename or file creation in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, *, backup: bool = False) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    Temp file, fsync, rename, fsync of the directory.  With ``backup`` the
    previous content is first copied to ``<path>.bak`` (Java DLedger's habit,
    kept so that its tools find what they expect).
    """
    path = Path(path)
    if backup and path.exists():
        write_atomic(path.with_name(path.name + ".bak"), path.read_bytes())
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
