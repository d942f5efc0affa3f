"""Start-up recovery of the mmap store: find the durable prefix of the log and cut everything after it.

What a crash (or a power cut) can leave behind, and how it is handled:

* a torn last entry, zero pages in the middle of unflushed data, a blank
  marker without the entry that should follow it, a new file with nothing
  in it: the forward walk stops at the first entry that does not verify,
  and everything after it is zeroed or removed, so it cannot come back --
  but only when that is a *tail* (:func:`judge`): nothing after it verifies
  and it is above the checkpoint's committed index.  Damage that is not a
  tail (bad media, a zeroed, truncated or missing data file with good files
  after it, committed entries gone) raises :class:`DamagedStoreError`
  before anything is changed, unless the operator asked for the cut
  (``truncate_damaged``): a member must not silently lose entries it may
  have acknowledged;
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
from enum import Enum

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.entry import (
    BLANK_MAGIC,
    HEADER_SIZE,
    INDEX_UNIT_SIZE,
    VALID_MAGICS,
    CodecError,
    Entry,
    decode_entry,
    peek,
)
from dledger.errors import DamagedStoreError, DLedgerError, StoreError
from dledger.store.base import committed_after_recovery
from dledger.store.checkpoint import Checkpoint
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFile, MappedFileList, file_name
from dledger.store.scan import (
    ScanResult,
    decode_at,
    first_entry,
    has_java_zero_crc,
    scan_forward,
    where,
    zero_after,
)


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
    verdict: Verdict | None = None
    damage: Damage | None = None

    @property
    def changed(self) -> bool:
        """Whether recovery wrote or removed anything (then it must be made durable)."""
        return bool(self.rebuilt_index or self.zeroed_bytes or self.removed_data_files or self.removed_index_files)

    @property
    def cut(self) -> bool:
        return self.problem is not None

    @property
    def forced(self) -> bool:
        """Whether the operator's ``--truncate-damaged`` cut entries recovery would otherwise have refused to."""
        return self.verdict is Verdict.CUT_FORCED

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
            accept_zero_crc: bool, closer, full: bool = False, truncate_damaged: bool = False) -> Recovered:
    """Recover the log held by ``data``/``index`` in place (both writable and loaded).

    Raises :class:`DamagedStoreError` (before any data byte is changed) when
    :func:`judge` says the damage found may not be cut; ``truncate_damaged``
    is the operator's explicit permission to cut there anyway, and makes the
    walk start at the first entry (the cut must be at the *first* damage,
    also one before the checkpoint, as ``dledger store verify`` reports it).
    """
    full = full or truncate_damaged
    rec = Recovered()
    ilog = IndexLog(index)
    committed = checkpoint.committed_index if checkpoint is not None else -1
    first, why = first_entry(data, accept_zero_crc=accept_zero_crc)
    if not accept_zero_crc:
        _refuse_java_crc(data, first, why)
    if first is None:
        damage = find_damage(data, problem=why, problem_pos=data.start if why else None, next_index=None,
                             end=-1, write_pos=max(data.start, 0), committed=committed,
                             accept_zero_crc=accept_zero_crc)
        _judge(rec, data, damage, committed, truncate_damaged)
        rec.removed_data_files = _remove_stragglers(data) + data.remove_after(0, closer)
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
        else:
            trouble = _check_file_edges(data, ilog, first, anchor, accept_zero_crc)
            if trouble:
                rec.notes.append(trouble)
                anchor = None
    if anchor is None:
        anchor, rec.full_scan = first, True
    rec.anchor = anchor.index

    result, rewritten = rewrite_index(data, ilog, anchor, accept_zero_crc=accept_zero_crc)
    rec.rebuilt_index += len(rewritten)
    rec.verified = result.count
    empty = result.count == 0 and anchor is first
    damage = find_damage(data, problem=result.problem, problem_pos=result.problem_pos,
                         next_index=result.last_index + 1, end=-1 if empty else result.last_index,
                         write_pos=result.write_pos, committed=committed, accept_zero_crc=accept_zero_crc,
                         stop_pos=result.stop_pos)
    _judge(rec, data, damage, committed, truncate_damaged)
    if empty:
        rec.begin = rec.begin_pos = -1
        rec.removed_data_files = _remove_stragglers(data) + data.remove_after(0, closer)
        rec.removed_index_files += index.remove_after(0, closer)
        return rec
    rec.end, rec.end_term, rec.write_pos = result.last_index, result.last_term, result.write_pos
    rec.removed_data_files = _remove_stragglers(data)
    last_file = data.file_for(result.write_pos - 1)
    if rec.damage is not None or result.stop_pos != result.write_pos or last_file is not data.files[-1]:
        for f in data.files:
            if f.start <= result.write_pos:
                f.restore_size()
        zeroed, removed = zero_after(data, result.write_pos, closer)
        rec.zeroed_bytes += zeroed
        rec.removed_data_files += removed
    zeroed, removed = ilog.cut_after(rec.end, closer)
    rec.zeroed_bytes += zeroed
    rec.removed_index_files += removed
    rec.committed = committed_after_recovery(committed, rec.begin, rec.end)
    return rec


# -- index repair: one walk for start-up and for reads -------------------------------------------------------
#: How many records before a damaged one a read looks back for a record that still checks out.
REPAIR_LOOKBACK = 64


def rewrite_index(data: MappedFileList, ilog: IndexLog, anchor: Entry, *, accept_zero_crc: bool,
                  stop_after: int | None = None) -> tuple[ScanResult, list[int]]:
    """Walk the data from the verified ``anchor``, rewriting every index record that is missing, torn or stale.

    Returns the walk's result and the indexes whose records were written.  A
    record contradicting its entry in place (:attr:`.RecordVerdict.CONFLICT`)
    stops the walk there as a problem.  Without ``stop_after`` the walk goes
    to the end of the log and checks the bytes after it (start-up); with it,
    it stops after that entry (a read repairing the record it needs).
    """
    rewritten: list[int] = []
    result = scan_forward(data, anchor.pos, anchor.index, -1, accept_zero_crc=accept_zero_crc,
                          on_entry=lambda e: ilog.fix(e, rewritten), check_tail=stop_after is None,
                          stop_after=stop_after)
    return result, rewritten


def repair_index(data: MappedFileList, ilog: IndexLog, index: int, *, begin: int, begin_pos: int,
                 accept_zero_crc: bool) -> list[int]:
    """Rewrite the records up to ``index`` from the data (a read found record ``index`` damaged).

    The walk starts at the newest of the :data:`REPAIR_LOOKBACK` records
    before it that still checks out against its entry, else at the first
    entry of the log (``begin``, at ``begin_pos``).  Returns the indexes
    rewritten; DISK_ERROR when entry ``index`` cannot be reached.
    """
    anchor = None
    for k in range(index - 1, max(begin, index - REPAIR_LOOKBACK) - 1, -1):
        anchor = verified_entry(data, ilog, k, accept_zero_crc, verify_crc=False)
        if anchor is not None:
            break
    try:
        if anchor is None:
            anchor = decode_at(data, begin_pos, accept_zero_crc=accept_zero_crc, verify_crc=False)
    except CodecError as exc:
        raise DLedgerError(ResponseCode.DISK_ERROR, f"cannot locate entry {index}: {exc}") from None
    result, rewritten = rewrite_index(data, ilog, anchor, accept_zero_crc=accept_zero_crc, stop_after=index)
    if result.last_index != index:
        raise DLedgerError(ResponseCode.DISK_ERROR,
                           f"cannot read entry {index}: {result.problem or 'the data log ends before it'}")
    return rewritten


# -- the rule: what recovery may cut on its own ------------------------------------------------------------
class Verdict(Enum):
    """What recovery does about the first damage it found (see :func:`judge`)."""

    CLEAN = "clean"
    #: A torn or corrupt tail: nothing verifiable after it, nothing committed in it. Cut, logged at warn.
    CUT_TAIL = "cut tail"
    #: Cutting would drop committed or verified entries: refuse to start (DamagedStoreError).
    REFUSE = "refuse"
    #: The same damage, but the operator asked for the cut (``--truncate-damaged``): cut, logged at error.
    CUT_FORCED = "cut as asked"


@dataclass(frozen=True)
class Damage:
    """The first damage in the data log, as recovery and ``dledger store verify`` describe it.

    ``index`` is the first entry the damage costs (None when it cannot be
    known, e.g. the first entry of the log is unreadable); ``followed_by``
    names a verified entry after the damaged region (None: nothing after it
    verifies, so it is a tail).
    """

    pos: int
    at: str
    what: str
    index: int | None
    followed_by: str | None = None


def judge(damage: Damage | None, committed: int, truncate_damaged: bool) -> Verdict:
    """May recovery cut the log at ``damage``? The checkpoint's ``committed`` index is a promise it must keep.

    A tail is damage after which nothing verifies, above the committed index
    (a crash tears the unflushed end of a log; nothing there was committed
    by this member's promise).  Anything else -- damage at or below the
    committed index, an unknown index while something is committed, or
    verified entries after the damaged region -- is not what a crash leaves:
    cutting would silently drop entries this member acknowledged, so it
    refuses unless the operator asked for the cut.
    """
    if damage is None:
        return Verdict.CLEAN
    if damage.followed_by is None and _above(damage, committed):
        return Verdict.CUT_TAIL
    return Verdict.CUT_FORCED if truncate_damaged else Verdict.REFUSE


def _above(damage: Damage, committed: int) -> bool:
    return damage.index > committed if damage.index is not None else committed < 0


def damage_line(directory, damage: Damage, committed: int, verdict: Verdict) -> str:
    """The one line an operator reads about ``damage`` (the DamagedStoreError message, verify's problem)."""
    idx = f", entry {damage.index}" if damage.index is not None else ""
    head = f"damaged store {directory}: {damage.what} [{damage.at}{idx}]"
    if verdict is Verdict.CUT_TAIL:
        return f"{head}: a torn tail above the committed index {committed}; recovery cuts it"
    reasons = []
    if damage.followed_by is not None:
        reasons.append(f"{damage.followed_by} after it verifies")
    if not _above(damage, committed):
        reasons.append(f"the checkpoint says entries up to {committed} are committed")
    why = " and ".join(reasons)
    if verdict is Verdict.CUT_FORCED:
        return (f"{head}; cut the log there as asked (--truncate-damaged) although {why}; "
                f"the member re-fetches the rest from the leader")
    return (f"{head}; {why}, so recovery will not cut the log there: restore the damaged file from a backup, "
            f"or start with --truncate-damaged (truncateDamaged = true) to cut it and re-fetch from the leader")


def find_damage(data: MappedFileList, *, problem: str | None, problem_pos: int | None, next_index: int | None,
                end: int, write_pos: int, committed: int, accept_zero_crc: bool,
                stop_pos: int | None = None) -> Damage | None:
    """The first damage: what the walk stopped at, else a missing or truncated data file, else a log that
    ends below the committed index; with a verified entry after it, if there is one.

    ``stop_pos`` is where the walk stopped (a zero header, or the end of the
    files): bytes found after it are reported there, in the file that ends
    the log, since that is where the damage is (a zeroed file, a hole).
    """
    stop_pos = write_pos if stop_pos is None else stop_pos
    search_from = None
    if problem is not None:
        pos, what, index = problem_pos, problem, next_index
        if pos > stop_pos:
            # Non-zero bytes after the end: the walk stopped too early, where the damage is; the bytes
            # found may themselves be a good entry.
            pos, search_from = stop_pos, stop_pos
            what = (f"zero bytes where entry {next_index} should start, but non-zero bytes follow at "
                    f"{where(data, problem_pos)}" if next_index is not None else problem)
        else:
            search_from = pos + 1  # the entry the walk refused
    elif data.stragglers:
        pos, index = data.end, next_index
        what = (f"data file {data.missing_after()} is missing ({data.files[-1].path.name} is followed by "
                f"{data.stragglers[0].name})")
    elif data.truncated:
        f = data.truncated[0]
        pos, what, index = f.start + f.length, "", next_index
    elif end < committed:
        pos, index = stop_pos, end + 1
        what = f"the log ends at entry {end}" if end >= 0 else "the data log is empty"
        index = end + 1 if end >= 0 else None
    else:
        return None
    shortened = [f"data file {f.path.name} is truncated: {f.length} of {f.size} bytes"
                 for f in data.truncated if f.start <= pos]
    if shortened:
        what = "; ".join([what, *shortened]) if what else "; ".join(shortened)
    follower = next_verified(data, pos + 1 if search_from is None else search_from,
                             0 if index is None else index, accept_zero_crc)
    followed_by = None
    if follower is not None:
        followed_by = f"entry {follower.index} at {where(data, follower.pos)}"
    elif data.stragglers:
        followed_by = _verified_in_stragglers(data, accept_zero_crc)
    at = where(data, pos)
    if data.file_for(pos) is None:
        at = f"pos {pos} (file {file_name(pos - pos % data.file_size)} offset {pos % data.file_size}, missing)"
    return Damage(pos, at, what, index, followed_by)


_MAGIC_BYTES = tuple(m.to_bytes(4, "big") for m in sorted(VALID_MAGICS))


def next_verified(data: MappedFileList, pos: int, min_index: int, accept_zero_crc: bool,
                  files: list[MappedFile] | None = None) -> Entry | None:
    """The first entry at or after absolute ``pos`` that verifies (CRC, its ``pos`` field) with index >= min_index.

    This is the proof that a damaged region is not a tail.  Candidates are
    found by searching for the entry magics (``mmap.find``, in C) and checked
    by their ``pos`` field before being decoded, so a mostly empty file is
    searched quickly.
    """
    for f in data.files if files is None else files:
        if f.end <= pos:
            continue
        e = _search_file(f, max(0, pos - f.start), min_index, accept_zero_crc)
        if e is not None:
            return e
    return None


def _search_file(f: MappedFile, rel: int, min_index: int, accept_zero_crc: bool) -> Entry | None:
    mm = f.mm
    nxt = {m: mm.find(m, rel) for m in _MAGIC_BYTES}
    while True:
        live = [v for v in nxt.values() if v >= 0]
        if not live:
            return None
        cand = min(live)
        if cand + HEADER_SIZE <= f.size and int.from_bytes(mm[cand + 24:cand + 32], "big", signed=True) \
                == f.start + cand:
            try:
                e = decode_entry(mm, cand, accept_zero_crc=accept_zero_crc, max_size=f.size)
            except CodecError:
                e = None
            if e is not None and e.index >= min_index:
                return e
        for m, v in nxt.items():
            if v == cand:
                nxt[m] = mm.find(m, cand + 1)


def _verified_in_stragglers(data: MappedFileList, accept_zero_crc: bool) -> str | None:
    """A verified entry in a data file after a gap (opened read-only just to look)."""
    for path in data.stragglers:
        length = path.stat().st_size
        if length > data.file_size or not length:
            continue
        f = MappedFile(path, int(path.name), data.file_size, readonly=True, length=length)
        try:
            e = _search_file(f, 0, 0, accept_zero_crc)
        finally:
            f.close()
        if e is not None:
            return f"entry {e.index} in data file {path.name} offset {e.pos - f.start}"
    return None


def _judge(rec: Recovered, data: MappedFileList, damage: Damage | None, committed: int,
           truncate_damaged: bool) -> None:
    """Apply :func:`judge`: raise before anything is cut, or record what is about to be cut and why."""
    verdict = judge(damage, committed, truncate_damaged)
    rec.verdict = verdict
    if damage is None:
        return
    line = damage_line(data.directory, damage, committed, verdict)
    if verdict is Verdict.REFUSE:
        raise DamagedStoreError(line, damage)
    rec.damage = damage
    rec.problem, rec.problem_pos = line, damage.pos


def _remove_stragglers(data: MappedFileList) -> int:
    """Remove data files after a gap, highest first (only once the cut was judged allowed)."""
    for path in reversed(data.stragglers):
        diskio.remove_file(path)
    removed, data.stragglers = len(data.stragglers), []
    if removed:
        data.dir_dirty = True
    return removed


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


def _check_file_edges(data: MappedFileList, ilog: IndexLog, first: Entry, anchor: Entry,
                      accept_zero_crc: bool) -> str | None:
    """Why the data files before the anchor cannot be trusted without a walk, or None.

    Each data file after the first must start with an entry (or be one blank
    marker), and the entry before it -- the last of the previous file -- must
    be where its index record says: a zeroed, truncated or replaced file is
    found here with two header reads per file, and then the full walk judges it.
    """
    for f in data.files:
        if f.truncated and f.start <= anchor.pos:
            return f"data file {f.path.name} is truncated: {f.length} of {f.size} bytes"
    files = [f for f in data.files if first.pos < f.start <= anchor.pos]
    for f in files:
        magic, size = peek(f.mm, 0)
        if magic == BLANK_MAGIC and size == f.size:
            continue
        try:
            e = decode_at(data, f.start, accept_zero_crc=accept_zero_crc, verify_crc=False)
        except CodecError as exc:
            return f"data file {f.path.name} does not start with an entry ({exc})"
        if e.index - 1 >= first.index and verified_entry(data, ilog, e.index - 1, accept_zero_crc,
                                                         verify_crc=False) is None:
            return f"entry {e.index - 1} before data file {f.path.name} is not where its index record says"
    return None


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
