"""Start-up recovery of the mmap store: find the durable prefix of the log and cut everything after it.

What a crash (or a power cut) can leave behind, and how it is handled:

* a torn last entry, zero pages in the middle of unflushed data, a blank
  marker without the entry that should follow it, a new file with nothing
  in it: the forward walk stops at the first entry that does not verify,
  and everything after it is zeroed or removed, so it cannot come back;
* index records that are stale beyond the data, torn, missing or whose
  files were deleted: records are checked against the entries they point
  to and rewritten from the data;
* a checkpoint newer than the data (Java writes ``endIndex`` without a
  flush) or older than it, or none at all: the checkpoint is only where
  verification starts, never a claim that is believed.

To keep start-up fast on a large log, verification starts at the
checkpoint's ``endIndex`` (everything up to it was flushed when the
checkpoint was written; reads still verify each entry's CRC), found through
the index, stepping back 1, 2, 4, ... entries until an entry verifies, then
walks forward to the end.  A missing checkpoint, an index that does not
cover the durable prefix or fails a spot check, or ``full=True`` makes it
walk from the first entry instead.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dledger.entry import INDEX_UNIT_SIZE, CodecError, Entry
from dledger.errors import StoreError
from dledger.store.base import committed_after_recovery
from dledger.store.checkpoint import Checkpoint
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFileList
from dledger.store.scan import decode_at, first_entry, has_java_zero_crc, scan_forward, zero_after


@dataclass
class Recovered:
    """The recovered log and an account of what recovery had to do."""

    begin: int = -1
    begin_pos: int = -1
    end: int = -1
    end_term: int = -1
    write_pos: int = 0
    committed: int = -1
    anchor: int = -1
    full_scan: bool = False
    verified: int = 0
    rebuilt_index: int = 0
    problem: str | None = None
    problem_pos: int | None = None
    zeroed_bytes: int = 0
    removed_data_files: int = 0
    removed_index_files: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether recovery wrote or removed anything (then it must be made durable)."""
        return bool(self.rebuilt_index or self.zeroed_bytes or self.removed_data_files or self.removed_index_files)

    @property
    def cut(self) -> bool:
        return self.problem is not None

    def summary(self) -> str:
        parts = [f"entries [{self.begin}, {self.end}]" if self.end >= 0 else "empty log",
                 f"committed {self.committed}",
                 f"verified {self.verified} from index {self.anchor}" + (" (full scan)" if self.full_scan else "")]
        if self.problem:
            parts.append(f"CUT at {self.problem_pos}: {self.problem}")
        if self.zeroed_bytes or self.removed_data_files:
            parts.append(f"zeroed {self.zeroed_bytes} bytes and removed {self.removed_data_files} data files "
                         f"after pos {self.write_pos}")
        if self.rebuilt_index or self.removed_index_files:
            parts.append(f"rewrote {self.rebuilt_index} index records, removed {self.removed_index_files} index files")
        parts.extend(self.notes)
        return "; ".join(parts)


def recover(data: MappedFileList, index: MappedFileList, checkpoint: Checkpoint | None, *,
            accept_zero_crc: bool, closer, full: bool = False) -> Recovered:
    """Recover the log held by ``data``/``index`` in place (both writable and loaded)."""
    rec = Recovered()
    ilog = IndexLog(index)
    first, why = first_entry(data, accept_zero_crc=accept_zero_crc)
    if not accept_zero_crc:
        _refuse_java_crc(data, first, why)
    if first is None:
        if why:
            rec.problem, rec.problem_pos = why, data.start
        rec.removed_data_files = data.remove_after(0, closer)
        rec.removed_index_files = index.remove_after(0, closer)
        return rec
    rec.begin, rec.begin_pos = first.index, first.pos
    rec.removed_index_files += ilog.drop_below(first.index, closer)
    if index.files and index.start > first.index * INDEX_UNIT_SIZE:
        rec.notes.append("index files do not reach the first entry; rebuilding the index")
        rec.removed_index_files += index.remove_after(0, closer)

    anchor = None
    if full:
        pass
    elif checkpoint is None:
        rec.notes.append("no usable checkpoint")
    elif checkpoint.end_index < first.index:
        rec.notes.append(f"checkpoint endIndex {checkpoint.end_index} is before the first entry {first.index}")
    else:
        anchor = _anchor_from_index(data, ilog, first.index, checkpoint.end_index, accept_zero_crc)
        if anchor is None:
            anchor = _anchor_from_data(data, first, checkpoint.end_index, accept_zero_crc)
        if anchor is None:
            rec.notes.append(f"no entry at or before checkpoint endIndex {checkpoint.end_index} verifies")
        elif not ilog.covers(first.index, anchor.index):
            rec.notes.append(f"index files do not cover [{first.index}, {anchor.index}]")
            anchor = None
        elif not _spot_check(data, ilog, first.index, anchor.index, accept_zero_crc):
            rec.notes.append("index spot check failed")
            anchor = None
    if anchor is None:
        anchor, rec.full_scan = first, True
    rec.anchor = anchor.index

    def fix(e: Entry) -> str | None:
        conflict = ilog.check(e)
        if conflict:
            return conflict
        if not ilog.matches(e):
            ilog.write(e)
            rec.rebuilt_index += 1
        return None

    result = scan_forward(data, anchor.pos, anchor.index, -1, accept_zero_crc=accept_zero_crc, on_entry=fix)
    rec.verified = result.count
    if result.count == 0 and anchor is first:
        rec.begin = rec.begin_pos = -1
        rec.problem, rec.problem_pos = result.problem, result.problem_pos
        rec.removed_data_files = data.remove_after(0, closer)
        rec.removed_index_files += index.remove_after(0, closer)
        return rec
    rec.end, rec.end_term, rec.write_pos = result.last_index, result.last_term, result.write_pos
    rec.problem, rec.problem_pos = result.problem, result.problem_pos
    last_file = data.file_for(result.write_pos - 1)
    if result.problem or result.stop_pos != result.write_pos or last_file is not data.files[-1]:
        rec.zeroed_bytes, rec.removed_data_files = zero_after(data, result.write_pos, closer)
    zeroed, removed = ilog.cut_after(rec.end, closer)
    rec.zeroed_bytes += zeroed
    rec.removed_index_files += removed
    ck_committed = checkpoint.committed_index if checkpoint is not None else -1
    rec.committed = committed_after_recovery(ck_committed, rec.begin, rec.end)
    return rec


def _spot_check(data: MappedFileList, ilog: IndexLog, begin: int, upto: int, accept_zero_crc: bool) -> bool:
    """Check the first and last record of each index file in ``[begin, upto]`` against the data headers."""
    per_file = ilog.files.file_size // INDEX_UNIT_SIZE
    for f in ilog.files.files:
        lo = max(begin, f.start // INDEX_UNIT_SIZE)
        hi = min(upto, f.start // INDEX_UNIT_SIZE + per_file - 1)
        if lo > hi:
            continue
        for i in {lo, hi}:
            if verified_entry(data, ilog, i, accept_zero_crc, verify_crc=False) is None:
                return False
    return True


def verified_entry(data: MappedFileList, ilog: IndexLog, i: int, accept_zero_crc: bool,
              verify_crc: bool = True) -> Entry | None:
    """Entry ``i`` if its index record is valid and the entry it points to agrees, else None."""
    rec = ilog.read(i)
    if rec is None:
        return None
    try:
        e = decode_at(data, rec[1], accept_zero_crc=accept_zero_crc, verify_crc=verify_crc)
    except CodecError:
        return None
    if (e.magic, e.pos, e.size, e.index, e.term) != rec:
        return None
    return e


def _anchor_from_index(data: MappedFileList, ilog: IndexLog, begin: int, end: int,
                       accept_zero_crc: bool) -> Entry | None:
    """The newest entry at ``end``, ``end - 1``, ``end - 2``, ``end - 4``, ... that verifies through the index."""
    step = 0
    while end - step >= begin:
        e = verified_entry(data, ilog, end - step, accept_zero_crc)
        if e is not None:
            return e
        step = step * 2 or 1
    return None


def _anchor_from_data(data: MappedFileList, first: Entry, end: int, accept_zero_crc: bool) -> Entry | None:
    """The first entry of the newest data file that verifies and is not after ``end`` (index unusable)."""
    for f in reversed(data.files):
        if f.end <= first.pos:
            break
        pos = first.pos if f.start <= first.pos else f.start
        try:
            e = decode_at(data, pos, accept_zero_crc=accept_zero_crc)
        except CodecError:
            continue
        if e.index <= end:
            return e
    return None


def _refuse_java_crc(data: MappedFileList, first: Entry | None, why: str | None) -> None:
    """A Java-written log has bodyCrc 0 everywhere: refuse it clearly rather than cut every entry."""
    if first is None:
        probe, _ = first_entry(data, accept_zero_crc=True) if why else (None, None)
        if probe is not None and has_java_zero_crc(data, probe.pos):
            raise StoreError(f"{data.directory}: entries carry bodyCrc 0 (written by Java DLedger 0.3.2?); "
                             f"set acceptJavaZeroCrc = true to open this store")
