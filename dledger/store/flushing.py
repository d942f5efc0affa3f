"""What of the mmap store's files is not durable yet, what a flush round syncs, and which pages it may unmap.

The store appends into the page cache and remembers where unflushed bytes
begin: ``data_lo`` (a data position) and ``index_lo`` (an entry index; its
record is at ``index_lo * 32``).  A flush round (:meth:`FlushTracker.prepare`,
run by :class:`.groupcommit.GroupCommit`) syncs the data files holding
``[data_lo, write_pos)``, new files in full and the directories that gained or
lost files, in one job; if it fails, the marks go back so the next round
covers it all again.

Index records are not synced by the rounds (issue #28: one fdatasync per
round, not one for the data and one for the index): an entry is durable when
its bytes are, because recovery walks the data forward from the checkpoint
and rewrites every index record past it from the data.  What recovery does
trust -- the records up to the checkpoint's ``endIndex`` -- is synced by the
checkpoint's own job before the checkpoint is replaced
(:meth:`FlushTracker.index_sync`).  After a
round, flushed pages are unmapped (RSS only) in steps of
:data:`RELEASE_STEP` bytes.  The decisions -- which files a range touches,
whether a round is needed, when a release is due and how far it reaches --
are pure functions, table-tested in ``tests/test_store_flushing.py``.
"""

from __future__ import annotations

import functools
import mmap
import os
from collections.abc import Callable

from dledger import diskio
from dledger.entry import INDEX_UNIT_SIZE
from dledger.store.groupcommit import FlushPlan
from dledger.store.mappedfiles import MappedFile, MappedFileList

#: Flushed pages are unmapped (RSS) once this many bytes of a log were flushed since the last time.
RELEASE_STEP = 1 << 20
#: Index pages read back are unmapped again once they span this much (a record per entry: 64 KiB is 2,048).
INDEX_RELEASE_STEP = 1 << 16


def here_bytes_setting(environ=os.environ) -> int:
    """The largest round (data bytes) a member syncs on its reactor thread (:func:`flush_here`):
    ``DLEDGER_FLUSH_HERE_BYTES``, 0 (never: every round on the worker thread) when unset.

    Off by default: on the shared machine of issue #28's round 2g it cut the members' CPU per entry at
    2,000/s (0.75-0.82x) but not the p99, which an ``fdatasync`` of a busy disk on the reactor thread made
    worse (docs/benchmarks.md, "Round 2g"); a quiet machine's rerun decides.  An environment variable rather
    than a member option so that one benchmark compares both on the same code
    (``DLEDGER_FLUSH_HERE_BYTES=65536 dledger bench cluster``); the one place that reads it.
    """
    value = environ.get("DLEDGER_FLUSH_HERE_BYTES", "")
    try:
        return max(0, int(value)) if value.strip() else 0
    except ValueError:
        raise ValueError(f"DLEDGER_FLUSH_HERE_BYTES must be a whole number of bytes, not {value!r}") from None


#: See :func:`here_bytes_setting`.
HERE_BYTES = here_bytes_setting()


def flush_here(nbytes: int, new_files: bool, dirs: bool, limit: int) -> bool:
    """Whether a round syncing ``nbytes`` of data runs on the reactor thread instead of a worker.

    Only a round of data bytes in files synced before, up to ``limit``: at 10,000 appends/s a round holds
    ~20 entries (~21 KiB), its ``fdatasync`` ~0.2-0.3 ms, and the hand-off to a worker and back (a queue, a
    thread wake-up, the reactor's waker, the GIL each way) costs each round CPU and a wait behind the
    reactor's turn at least as long (docs/benchmarks.md, "Round 2g").  New files and directories (an
    ``fsync`` each, slower) and large rounds (a loaded member's: its reactor has other work to do meanwhile)
    stay on the worker.
    """
    return 0 < nbytes <= limit and not new_files and not dirs


def span(first_start: int, file_size: int, count: int, lo: int, hi: int) -> tuple[int, int]:
    """Positions ``[a, b)`` in a list of ``count`` files of ``file_size`` bytes (the first at ``first_start``)
    of the files holding bytes ``[lo, hi)``; ``a >= b`` when none does."""
    if not count or hi <= lo:
        return 0, 0
    return max(0, (lo - first_start) // file_size), min(count, (hi - 1 - first_start) // file_size + 1)


def files_between(lst: MappedFileList, lo: int, hi: int) -> list[MappedFile]:
    """The files of ``lst`` holding bytes ``[lo, hi)``."""
    files = lst.files
    if not files:
        return []
    a, b = span(files[0].start, lst.file_size, len(files), lo, hi)
    return files[a:b]


def needs_flush(data_lo: int, write_pos: int, dirs_changed: bool) -> bool:
    """Whether a round has work: data bytes, or a directory that gained or lost files (index records are
    synced with the checkpoint, see the module docstring)."""
    return data_lo < write_pos or dirs_changed


def index_sync_due(index_lo: int, checkpoint_end: int) -> bool:
    """Whether records a checkpoint up to ``checkpoint_end`` would vouch for are not durable yet."""
    return index_lo <= checkpoint_end


def release_due(released_to: int, flushed_to: int, step: int = RELEASE_STEP) -> bool:
    """Whether enough was flushed since the last release to unmap again (not after every small round)."""
    return flushed_to - released_to >= step


def released_mark(lo: int, upto: int, page: int = mmap.PAGESIZE) -> int:
    """How far a release of ``[lo, upto)`` reached: whole pages only, the partial last one is released later."""
    return max(lo, upto - upto % page)


class FlushTracker:
    """An open mmap store's unflushed ranges and released pages over its ``data`` and ``index`` file lists.

    ``write_pos()`` tells where the data log ends now (read when a round has
    finished, to release only what that round made durable).
    """

    def __init__(self, data: MappedFileList, index: MappedFileList, write_pos: Callable[[], int], *,
                 release_pages: bool = True):
        self.data, self.index = data, index
        self._write_pos = write_pos
        self.release_pages = release_pages
        #: The largest round synced on the calling thread (:func:`flush_here`); 0 for never.
        self.here_bytes = HERE_BYTES
        self.data_lo = 0
        self.index_lo = 0
        self.data_released = 0
        self.index_released = 0
        #: ``[lo, hi)`` of the data read back (mapped in again) below ``data_released`` since the last
        #: release of it, and the same for the index (byte offsets); None when nothing was.
        self.data_reread: list[int] | None = None
        self.index_reread: list[int] | None = None

    def restart(self, write_pos: int, end_index: int) -> None:
        """Everything before ``write_pos`` and up to ``end_index`` is durable (after recovery, after a reset)."""
        self.data_lo, self.index_lo = write_pos, end_index + 1
        self.data_released = self.data.start if self.data.files else 0
        self.index_released = self.index.start if self.index.files else 0

    def mark_data(self, pos: int) -> None:
        """Bytes from ``pos`` on changed (a blank marker, a truncate)."""
        self.data_lo = min(self.data_lo, pos)

    def mark_index(self, index: int) -> None:
        """Records from ``index`` on changed (repaired, or dropped by a truncate)."""
        self.index_lo = min(self.index_lo, index)

    def dropped_below(self) -> None:
        """Retention removed data files from the start: nothing below the first one is left to release."""
        self.data_released = max(self.data_released, self.data.start)

    def dirty(self, write_pos: int, end_index: int) -> bool:
        return needs_flush(self.data_lo, write_pos, self.data.dir_dirty or self.index.dir_dirty)

    def prepare(self, write_pos: int, end_index: int) -> FlushPlan:
        """One flush round up to ``end_index``: what to sync, and how to put the marks back if it fails.

        The entries up to ``end_index`` are durable once their data bytes are (index records: see the module
        docstring); new files, index files too, are synced in full with their directories as before.
        """
        data, index = self.data, self.index
        data_lo = self.data_lo
        touched = files_between(data, data_lo, write_pos)
        new = [f for lst in (data, index) for f in lst.files if f.new]
        dirs = [lst for lst in (data, index) if lst.dir_dirty or any(f.new for f in lst.files)]
        if not touched and not new and not dirs:
            return FlushPlan(end_index, None)
        self.data_lo = write_pos
        for f in new:
            f.new = False
        for lst in dirs:
            lst.dir_dirty = False
        synced = [f.fd for f in touched if f not in new]
        # One job for the round (data files first, then new files, directories): one thread
        # hand-off per round.  Syncing data and index on two pool threads side by side made each round a
        # little shorter but cost a member more CPU in wake-ups than it saved (docs/benchmarks.md).
        work = functools.partial(diskio.flush_files, synced, [f.fd for f in new], [str(lst.directory) for lst in dirs])

        def failed(_failure) -> None:
            self.data_lo = min(self.data_lo, data_lo)
            for f in new:
                f.new = True
            for lst in dirs:
                lst.dir_dirty = True

        def done(_result) -> None:
            self.flushed(upto=write_pos)  # what this round synced, not what a round after it took

        here = flush_here(write_pos - data_lo, bool(new), bool(dirs), self.here_bytes)
        return FlushPlan(end_index, work, done=done, failed=failed, here=here)

    def index_sync(self, checkpoint_end: int) -> tuple[list[int], Callable[[], None]]:
        """The index files to fdatasync before a checkpoint up to ``checkpoint_end`` is written, and an undo.

        Marks the records up to ``checkpoint_end`` durable; call the undo if the checkpoint's job fails, so
        the next checkpoint syncs them again.
        """
        index_lo = self.index_lo
        if not index_sync_due(index_lo, checkpoint_end):
            return [], lambda: None
        fds = [f.fd for f in files_between(self.index, index_lo * INDEX_UNIT_SIZE,
                                           (checkpoint_end + 1) * INDEX_UNIT_SIZE)]
        self.index_lo = checkpoint_end + 1

        def undo() -> None:
            self.index_lo = min(self.index_lo, index_lo)

        return fds, undo

    def note_read(self, pos: int, end: int, index: int | None = None) -> None:
        """Data bytes ``[pos, end)`` (and index record ``index``) were read from the files, not from memory.

        A read maps pages in again; below the released marks nothing unmapped them, and a follower
        catching up from far behind made the leader's RSS grow by everything it read back (issue #28
        target 4: 377 MB after a follower paused for 8 s under load).  Once a read-back range spans a
        release step it is unmapped again, here (a leader that no longer appends runs no flush rounds).
        """
        if pos < self.data_released and self.release_pages:
            r = self.data_reread = widened(self.data_reread, pos, min(end, self.data_released))
            if r is not None and release_due(r[0], r[1]):
                _release(self.data, r[0], r[1])
                self.data_reread = None
        if index is None or not self.release_pages:
            return
        ioff = index * INDEX_UNIT_SIZE
        if ioff < self.index_released:
            r = self.index_reread = widened(self.index_reread, ioff, min(ioff + INDEX_UNIT_SIZE, self.index_released))
            if r is not None and release_due(r[0], r[1], INDEX_RELEASE_STEP):
                _release(self.index, r[0], r[1])
                self.index_reread = None

    def flushed(self, _result=None, *, upto: int | None = None) -> None:
        """After a round: drop our mapping of flushed, full pages so RSS does not grow with the log.

        In steps of :data:`RELEASE_STEP` bytes, not after every round: a busy member runs hundreds of
        rounds a second, each covering a few KiB, and a madvise per file per round is work for nothing.
        """
        if not self.release_pages:
            return
        data_to = min(self.data_lo, self._write_pos())
        if upto is not None:
            data_to = min(data_to, upto)
        if release_due(self.data_released, data_to):
            self.data_released = _release(self.data, self.data_released, data_to)
        index_to = self.index_lo * INDEX_UNIT_SIZE
        if release_due(self.index_released, index_to):
            self.index_released = _release(self.index, self.index_released, index_to)


def widened(span_: list[int] | None, lo: int, hi: int) -> list[int] | None:
    """``span_`` (``[lo, hi)`` or None) grown to cover ``[lo, hi)`` as well; None stays None for an empty range."""
    if hi <= lo:
        return span_
    if span_ is None:
        return [lo, hi]
    return [min(span_[0], lo), max(span_[1], hi)]


def _release(lst: MappedFileList, lo: int, upto: int) -> int:
    """Unmap the flushed pages of ``lst`` in ``[lo, upto)``; returns how far that reached."""
    if not lst.files:
        return lo
    lo = max(lo, lst.start)
    for f in files_between(lst, lo, upto):
        f.release(max(lo, f.start) - f.start, min(upto, f.end) - f.start)
    return released_mark(lo, upto)
