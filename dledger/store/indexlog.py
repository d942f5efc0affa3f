"""The index log: record ``i`` (32 bytes) at absolute offset ``i * 32``, telling where entry ``i`` lives.

The index is derived data: every record can be rebuilt from the data log,
so recovery and reads check records against the entries they point to and
rewrite the ones that are missing or disagree instead of trusting them.
"""

from __future__ import annotations

from dledger.entry import INDEX_RECORD, INDEX_UNIT_SIZE, VALID_MAGICS, Entry
from dledger.store.mappedfiles import MappedFileList

_unpack = INDEX_RECORD.unpack_from
_pack_into = INDEX_RECORD.pack_into


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
        if rec[3] != index or rec[0] not in VALID_MAGICS or rec[1] < 0 or rec[2] <= 0 or rec[4] < 0:
            return None
        return rec

    def matches(self, e: Entry) -> bool:
        return self.read(e.index) == (e.magic, e.pos, e.size, e.index, e.term)

    def check(self, e: Entry) -> str | None:
        """Compare ``e`` with its record: None if they agree or the record is missing/stale (then rewrite it).

        A record that agrees on index, pos and size but not on term or magic
        is a second copy contradicting the entry's header (which no CRC
        covers): one of them is damaged, so that is reported, not repaired.
        """
        rec = self.read(e.index)
        if rec is None or rec == (e.magic, e.pos, e.size, e.index, e.term):
            return None
        if rec[1] == e.pos and rec[2] == e.size:
            return (f"entry {e.index} at pos {e.pos} says term {e.term} magic {e.magic} but its index record "
                    f"says term {rec[4]} magic {rec[0]}")
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
