"""The index log: record ``i`` (32 bytes) at absolute offset ``i * 32``, telling where entry ``i`` lives.

The index is derived data: every record can be rebuilt from the data log,
so recovery and reads check records against the entries they point to and
rewrite the ones that are missing or disagree instead of trusting them.
"""

from __future__ import annotations

import enum

from dledger.entry import HEADER_SIZE, INDEX_RECORD, INDEX_UNIT_SIZE, VALID_MAGICS, Entry
from dledger.store.mappedfiles import MappedFileList

_unpack = INDEX_RECORD.unpack_from
_pack_into = INDEX_RECORD.pack_into

Record = tuple[int, int, int, int, int]


def record_ok(rec: Record, index: int) -> bool:
    """Whether ``(magic, pos, size, index, term)`` can be record ``index`` at all (else it is missing or torn).

    The one validity rule for reads and recovery alike: a record that fails
    it is rebuilt from the data, never believed.
    """
    return (rec[3] == index and rec[0] in VALID_MAGICS and rec[1] >= 0 and rec[2] >= HEADER_SIZE
            and rec[4] >= 0)


class RecordVerdict(enum.Enum):
    """What a walk over the data does about the index record of an entry it verified (:func:`judge_record`)."""

    AGREES = "agrees"
    REWRITE = "rewrite"  # missing, torn or stale: written again from the entry
    CONFLICT = "conflict"  # same place, other term or magic: one copy is damaged, and which is unknown


def judge_record(rec: Record | None, e: Entry) -> RecordVerdict:
    """Compare a verified entry with its (valid or None) record.

    A record that agrees on pos and size but not on term or magic is a
    second copy contradicting the entry's header (which no CRC covers): one
    of them is damaged, so that is reported, not repaired.
    """
    if rec is None:
        return RecordVerdict.REWRITE
    if rec == (e.magic, e.pos, e.size, e.index, e.term):
        return RecordVerdict.AGREES
    if rec[1] == e.pos and rec[2] == e.size:
        return RecordVerdict.CONFLICT
    return RecordVerdict.REWRITE


def conflict_line(rec: Record, e: Entry) -> str:
    """How a :attr:`RecordVerdict.CONFLICT` is reported."""
    return (f"entry {e.index} at pos {e.pos} says term {e.term} magic {e.magic} but its index record "
            f"says term {rec[4]} magic {rec[0]}")


class IndexLog:
    """Reads and writes index records on a :class:`MappedFileList` of index files."""

    def __init__(self, files: MappedFileList):
        self.files = files

    def read(self, index: int) -> tuple[int, int, int, int, int] | None:
        """``(magic, pos, size, index, term)`` of record ``index`` if it looks valid, else None."""
        off = index * INDEX_UNIT_SIZE
        f = self.files.file_for(off)
        if f is None:
            return None
        rec = _unpack(f.mm, off - f.start)
        return rec if record_ok(rec, index) else None

    def matches(self, e: Entry) -> bool:
        return judge_record(self.read(e.index), e) is RecordVerdict.AGREES

    def fix(self, e: Entry, rewritten: list[int]) -> str | None:
        """Make the record of the verified entry ``e`` agree with it (appending its index to ``rewritten``
        if it had to be written), or return the :func:`conflict_line` that stops the walk."""
        rec = self.read(e.index)
        verdict = judge_record(rec, e)
        if verdict is RecordVerdict.CONFLICT:
            return conflict_line(rec, e)
        if verdict is RecordVerdict.REWRITE:
            self.write(e)
            rewritten.append(e.index)
        return None

    def write(self, e: Entry) -> None:
        """Write the record of ``e``, creating the index file it needs (after the last, or the first one)."""
        off = e.index * INDEX_UNIT_SIZE
        files = self.files
        f = files.file_for(off)
        if f is None:
            size = files.file_size
            if not files.files:
                f = files.create(off - off % size)
            elif files.end <= off < files.end + size:
                f = files.create(files.end)
            else:
                raise ValueError(f"index record {e.index} is not next to the index files "
                                 f"[{files.start}, {files.end})")
        _pack_into(f.mm, off - f.start, e.magic, e.pos, e.size, e.index, e.term)

    def covers(self, first: int, last: int) -> bool:
        """Whether index files exist for every record in ``[first, last]``."""
        files = self.files
        return bool(files.files) and files.start <= first * INDEX_UNIT_SIZE and \
            (last + 1) * INDEX_UNIT_SIZE <= files.end

    def drop_below(self, begin: int, closer) -> int:
        """Remove index files holding only records below ``begin``."""
        files = self.files
        count = 0
        for f in files.files:
            if f.end <= begin * INDEX_UNIT_SIZE:
                count += 1
            else:
                break
        return files.remove_first(count, closer)

    def cut_after(self, end: int, closer) -> tuple[int, int]:
        """Zero records after ``end`` and remove later files; returns (bytes zeroed, files removed)."""
        files = self.files
        off = (end + 1) * INDEX_UNIT_SIZE
        keep = [f for f in files.files if f.start < off]
        zeroed = 0
        if keep and keep[-1].end > off:
            zeroed = keep[-1].zero(off - keep[-1].start, keep[-1].size)
        return zeroed, files.remove_after(len(keep), closer)
