"""The one place where dledger makes blocking disk syscalls (fsync, msync, rename).

Everything else in the core is reactor-driven.  A :class:`BlockingIO`
decides *where* a blocking call runs: inline (tests, simulations and tools,
so results are deterministic) or on the reactor's thread pool (a running
member, so a slow fsync never stalls heartbeats).  Small metadata files are
always written inline with :func:`write_atomic`, because a vote must not be
answered before its promise is on disk.
"""

from __future__ import annotations

import errno
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


# -- file-store helpers ---------------------------------------------------------
# Opening, sizing, listing and unlinking files are quick metadata calls run
# inline; what can stall for milliseconds (fsync, directory fsync) goes through
# ``flush_files``, which a store hands to its ``BlockingIO``.

def create_sized_file(path: str | Path, size: int, *, preallocate: bool = True) -> None:
    """Create ``path`` at exactly ``size`` bytes, never leaving a short file behind.

    The file is sized under a ``.tmp`` name and renamed into place, so a crash
    leaves either no file or a full-size one.  With ``preallocate`` the blocks
    are reserved up front (reading as zeros, like a sparse file): a full disk
    then fails here with ENOSPC instead of killing the process with SIGBUS
    when a page of a mapped sparse file cannot be allocated.  Not durable
    until the file and its directory are fsynced (the store's next flush).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        if preallocate and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise
    except BaseException:
        os.close(fd)
        remove_file(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` of ``fd`` into the page cache (durable only after a flush).

    Stores append with this rather than by storing into their memory map:
    a page dirtied through a shared mapping has to be write-protected again
    (and the TLBs of other CPUs flushed) before each writeback, which made
    mmap appends and their fdatasync 2-3x slower (docs/benchmarks.md).  The
    page cache is shared, so the mapping sees the bytes at once.
    """
    n = os.pwrite(fd, data, offset)
    if n != len(data):
        view = memoryview(data)[n:]
        offset += n
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n


def remove_file(path: str | Path) -> bool:
    """Unlink ``path``; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def file_mtime(path: str | Path) -> float:
    """Last modification time of ``path`` (seconds since the epoch)."""
    return os.stat(path).st_mtime


def flush_files(data_fds: list[int], full_fds: list[int], dirs: list[str]) -> None:
    """Make file contents durable: fdatasync ``data_fds``, fsync ``full_fds`` (new files), then ``dirs``.

    On Linux, pages written through a shared mmap live in the page cache, so
    fdatasync of the file writes them back exactly as msync(MS_SYNC) would,
    and unlike ``mmap.flush`` it releases the GIL while it waits.
    """
    for fd in data_fds:
        fsync_fd(fd)
    for fd in full_fds:
        os.fsync(fd)
    for d in dirs:
        fsync_dir(d)


def data_regions(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The ``[a, b)`` ranges of ``[start, end)`` that may hold data (holes of a sparse file skipped).

    Uses SEEK_DATA/SEEK_HOLE where the platform has them; otherwise the whole
    range is reported, which is always correct, only slower to scan.
    """
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(start, end)] if start < end else []
    out = []
    pos = start
    while pos < end:
        try:
            a = os.lseek(fd, pos, seek_data)
        except OSError:  # ENXIO: no data after pos
            break
        if a >= end:
            break
        b = min(os.lseek(fd, a, seek_hole), end)
        out.append((a, b))
        pos = b
    return out


def disk_used_ratio(path: str | Path) -> float:
    """Fraction of the partition holding ``path`` that is in use, as Java DLedger computes it."""
    st = os.statvfs(path)
    if not st.f_blocks:
        return 0.0
    return (st.f_blocks - st.f_bfree) / st.f_blocks
