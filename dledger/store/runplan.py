"""Where the entries of a batch go in the mmap store's data files: runs, blank markers, new files (pure).

The mmap store writes a batch as *runs*: entries encoded back to back and
written with one ``pwrite``, all inside one data file.  An entry extends the
current run when it ends at or before the run's *limit* (the last byte an
entry may end at in that file: its end minus room for a blank marker, SPEC
§5) and is not oversized; that comparison is the only placement work the
append loop does per entry.  Any other entry starts a new run, and :func:`next_run` decides
where: at the end of the log if it fits there, else at the start of the
next file, after a blank marker that fills the rest of the current one (the
rule of :func:`dledger.entry.place_entry`, which every store shares), and
whether a data file must be created first.  It refuses an oversized entry,
and one whose position was fixed elsewhere (a follower stores the leader's
positions) but disagrees with where it must go.

The store then only writes what the plan says; the decision is a function
of numbers, table-tested in ``tests/test_store_runplan.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

from dledger.codes import ResponseCode
from dledger.entry import MIN_BLANK_LEN
from dledger.errors import DLedgerError
from dledger.store.base import place


def run_limit(file_end: int) -> int:
    """The last byte an entry may end at in the data file ending at ``file_end`` (room for a blank marker stays)."""
    return file_end - MIN_BLANK_LEN


def extends_run(run_end: int, size: int, limit: int, max_size: int) -> bool:
    """Whether an entry of ``size`` bytes goes right after the run ending at ``run_end`` (the append loop's test)."""
    return run_end + size <= limit and size <= max_size


@dataclass(frozen=True)
class NextRun:
    """Where the next run starts and what must be written before it.

    ``blank`` bytes at ``blank_at`` are a blank marker filling the rest of a
    data file (``blank_at`` None: nothing to write, either because the entry
    fits where the log ends or because no file holds that position);
    ``new_file`` is the start of the data file to create first (None: ``pos``
    lies in a file that exists); ``limit`` is the new run's :func:`run_limit`.
    """

    pos: int
    blank_at: int | None
    blank: int
    new_file: int | None
    limit: int


def next_run(write_pos: int, size: int, *, file_size: int, max_size: int, files_start: int, files_end: int,
             fixed_pos: int | None = None, index: int = -1) -> NextRun:
    """Place an entry of ``size`` bytes that does not extend the current run; the log ends at ``write_pos``.

    ``[files_start, files_end)`` is what the data files cover (-1, -1 when
    there are none).  ``fixed_pos`` is the position the entry already has
    (follower entries, entries a truncate checked): it must be where the
    entry goes, or the members' byte offsets would differ -- DISK_ERROR.  An
    entry over ``max_size``, or that cannot fit any data file, is refused with
    UNEXPECTED_ARGUMENT before anything is written.
    """
    pos, blank = place(write_pos, size, file_size, max_size)
    if fixed_pos is not None and fixed_pos != pos:
        raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index}: placement changed under us")
    blank_at = write_pos if blank and files_start <= write_pos < files_end else None
    new_file = None if files_start <= pos < files_end else pos - pos % file_size
    return NextRun(pos, blank_at, blank, new_file, run_limit(pos - pos % file_size + file_size))
