"""Read-only access to a store on disk for offline tools: find it, verify all of it, walk its entries.

Unlike start-up recovery, nothing here writes: files are mapped read-only,
LMDB is opened read-only without a lock file, and every problem is reported
instead of repaired.  Verification is complete (every entry, every CRC,
every index record), because that is what an operator runs it for.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from dledger.entry import INDEX_UNIT_SIZE, CodecError, Entry, decode_entry
from dledger.errors import StoreError
from dledger.store import ownership, termfile
from dledger.store.checkpoint import read_checkpoint
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFileList
from dledger.store.ownership import UNKNOWN_TERM, Decision, TermVote
from dledger.store.recovery import damage_line, find_damage, judge
from dledger.store.scan import decode_at, first_entry, has_java_zero_crc, scan_forward

KINDS = ("mmap", "lmdb")


def locate(path: str | Path, kind: str | None = None) -> tuple[str, Path]:
    """``(kind, directory)`` of the store at ``path``: a member dir ``dledger-<id>``, its ``lmdb/``, or a base dir."""
    p = Path(path)
    if not p.is_dir():
        raise StoreError(f"{p} is not a directory")
    lmdb_dir = p if (p / "data.mdb").exists() else (p / "lmdb" if (p / "lmdb" / "data.mdb").exists() else None)
    is_mmap = (p / "data").is_dir() or (p / "index").is_dir() or (p / "checkpoint").exists() or \
        (p / "currterm").exists()
    if kind == "lmdb" and lmdb_dir is not None or kind is None and lmdb_dir is not None and not is_mmap:
        return "lmdb", lmdb_dir
    if kind == "mmap" and is_mmap or kind is None and is_mmap and lmdb_dir is None:
        return "mmap", p
    if is_mmap and lmdb_dir is not None:
        raise StoreError(f"{p} holds both an mmap store and an LMDB store; choose one with --type")
    members = sorted(c for c in p.iterdir() if c.is_dir() and c.name.startswith("dledger-"))
    if len(members) == 1:
        return locate(members[0], kind)
    if len(members) > 1:
        raise StoreError(f"{p} holds several members ({', '.join(c.name for c in members)}); point at one of them")
    raise StoreError(f"no {kind or 'dledger'} store in {p} (expected data/ and index/, lmdb/, or dledger-<id>/)")


@dataclass
class Report:
    """What verification found. ``problems[0]`` is the first problem, ``problem_at`` where it is."""

    kind: str
    path: Path
    begin: int = -1
    end: int = -1
    end_term: int = -1
    entries: int = 0
    committed: int | None = None
    committed_source: str = ""
    files: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    problem_at: str | None = None
    notes: list[str] = field(default_factory=list)
    identity: dict | None = None
    in_use_by: str | None = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str, at: str | None = None) -> None:
        if not self.problems:
            self.problem_at = at
        self.problems.append(text)

    def as_dict(self) -> dict:
        return {"kind": self.kind, "path": str(self.path), "ok": self.ok, "entries": self.entries,
                "begin": self.begin, "end": self.end, "end_term": self.end_term, "committed": self.committed,
                "files": self.files, "problems": self.problems, "first_problem_at": self.problem_at,
                "notes": self.notes, "identity": self.identity, "in_use_by": self.in_use_by}


def _file_size(directory: Path) -> int | None:
    """The file size the store was written with: the step between file names, else the largest file.

    (The step, because one truncated file must not pass for the size: recovery reports it as truncated.)
    """
    files = [p for p in directory.iterdir() if not p.name.endswith(".tmp")] if directory.is_dir() else []
    sizes = {p.stat().st_size for p in files}
    starts = sorted(int(p.name) for p in files if p.name.isdigit())
    steps = {b - a for a, b in zip(starts, starts[1:], strict=False)}
    if steps and min(steps) >= max(sizes):
        return min(steps)
    return max(sizes) if sizes else None


def _describe(lst: MappedFileList, what: str) -> str:
    if not lst.files:
        return f"{what}: no files"
    return (f"{what}: {len(lst.files)} files of {lst.file_size} bytes "
            f"({lst.files[0].path.name} .. {lst.files[-1].path.name})")


class MmapReader:
    """A read-only view of an mmap store directory (sizes inferred from the files unless given)."""

    def __init__(self, member_dir: Path, *, data_file_size: int | None = None, index_file_size: int | None = None,
                 accept_zero_crc: bool = False):
        self.member_dir = Path(member_dir)
        self.accept_zero_crc = accept_zero_crc
        self.notes: list[str] = []
        data_size = data_file_size or _file_size(self.member_dir / "data") or 1
        index_size = index_file_size or _file_size(self.member_dir / "index") or INDEX_UNIT_SIZE
        self.data = MappedFileList(self.member_dir / "data", data_size, readonly=True, kind="data")
        self.index = MappedFileList(self.member_dir / "index", index_size, readonly=True, kind="index")
        self.notes += self.data.load(stop_at_gap=True)
        try:
            self.notes += self.index.load(contiguous=False)
        except BaseException:
            self.data.close()
            raise
        self.ilog = IndexLog(self.index)

    def close(self) -> None:
        self.data.close()
        self.index.close()

    def first(self) -> tuple[Entry | None, str | None]:
        return first_entry(self.data, accept_zero_crc=self.accept_zero_crc)

    def walk(self, on_entry: Callable[[Entry], str | None], start: Entry | None = None):
        """Walk and verify from ``start`` (default: the first entry); returns the ScanResult."""
        if start is None:
            start, _why = self.first()
        if start is None:
            return None
        return scan_forward(self.data, start.pos, start.index, -1, accept_zero_crc=self.accept_zero_crc,
                            on_entry=on_entry)

    def entry_via_index(self, index: int) -> Entry | None:
        """Entry ``index`` through its index record, if the record and the entry agree."""
        rec = self.ilog.read(index)
        if rec is None:
            return None
        try:
            e = decode_at(self.data, rec[1], accept_zero_crc=self.accept_zero_crc)
        except CodecError:
            return None
        return e if (e.magic, e.pos, e.size, e.index, e.term) == rec else None


def verify_mmap(member_dir: Path, *, data_file_size: int | None = None, index_file_size: int | None = None,
                accept_zero_crc: bool = False) -> Report:
    report = Report("mmap", Path(member_dir))
    _identity(report, Path(member_dir))
    try:
        reader = MmapReader(member_dir, data_file_size=data_file_size, index_file_size=index_file_size,
                            accept_zero_crc=accept_zero_crc)
    except StoreError as exc:
        report.problem(str(exc))
        return report
    try:
        _verify_mmap(reader, report)
    finally:
        reader.close()
    return report


def _verify_mmap(reader: MmapReader, report: Report) -> None:
    data, index = reader.data, reader.index
    report.files = [_describe(data, "data"), _describe(index, "index")]
    for note in reader.notes:
        report.problem(note)
    for path in getattr(index, "stragglers", []):
        report.problem(f"index file {path} follows a gap in the index files")
    first, why = reader.first()
    if first is None and why and not reader.accept_zero_crc:
        probe, _ = first_entry(data, accept_zero_crc=True)
        if probe is not None and has_java_zero_crc(data, probe.pos):
            why = f"{why} -- entries carry bodyCrc 0 (Java DLedger 0.3.2?); leave out --strict-crc to accept them"
    checkpoint, ck_note = read_checkpoint(reader.member_dir)
    committed = checkpoint.committed_index if checkpoint is not None else -1
    result = None
    if first is not None:
        report.begin = first.index

        def check_index(e: Entry) -> None:
            if not reader.ilog.matches(e):
                rec = reader.ilog.read(e.index)
                state = "missing" if rec is None else f"says {rec}"
                report.problem(f"index record {e.index} {state}, data has "
                               f"{(e.magic, e.pos, e.size, e.index, e.term)}",
                               f"index offset {e.index * INDEX_UNIT_SIZE}")
            return None

        result = reader.walk(check_index, first)
        report.entries, report.end, report.end_term = result.count, result.last_index, result.last_term
        off = (report.end + 1) * INDEX_UNIT_SIZE
        for f in index.files:
            if f.end <= off:
                continue
            nz = f.first_nonzero(max(0, off - f.start))
            if nz >= 0:
                stale = (f.start + nz) // INDEX_UNIT_SIZE
                report.problem(f"stale index record {stale} after the end of the log ({report.end})",
                               f"index offset {f.start + nz}")
                break
    # The finding start-up recovery would act on, in the same words (see recovery.judge).
    if result is None:
        damage = find_damage(data, problem=why, problem_pos=data.start if why else None, next_index=None, end=-1,
                             write_pos=max(data.start, 0), committed=committed,
                             accept_zero_crc=reader.accept_zero_crc)
    else:
        damage = find_damage(data, problem=result.problem, problem_pos=result.problem_pos,
                             next_index=result.last_index + 1, end=result.last_index, write_pos=result.write_pos,
                             committed=committed, accept_zero_crc=reader.accept_zero_crc,
                             stop_pos=result.stop_pos)
    if damage is not None:
        line = damage_line(data.directory, damage, committed, judge(damage, committed, False))
        report.problems.insert(0, line)
        report.problem_at = damage.at
    note = ck_note
    if checkpoint is None:
        report.notes.append(f"no checkpoint ({note})")
    else:
        report.committed, report.committed_source = checkpoint.committed_index, "checkpoint"
        if checkpoint.end_index > report.end:
            report.problem(f"checkpoint endIndex {checkpoint.end_index} is past the end of the log ({report.end}): "
                           f"flushed entries are missing")
        if note:
            report.notes.append(f"checkpoint: {note}")
    state, saved, problem, known = termfile.read_state(reader.member_dir)
    if saved is not None:
        report.notes.append(f"currterm: term {saved[0]}, voted for {saved[1] or 'nobody'}")
    else:
        last = report.end_term if report.end >= 0 else mmap_last_term(reader.member_dir)
        _check_term_vote(report, state, str(reader.member_dir / termfile.NAME), problem, reader.member_dir, last,
                         known)


def _identity(report: Report, member_dir: Path) -> None:
    """Record the identity record (or its absence, or why it is unreadable) and whether a member runs here."""
    try:
        report.identity = ownership.read_identity(member_dir)
    except StoreError as exc:
        report.problem(str(exc))
    report.in_use_by = ownership.holder(member_dir)
    if report.in_use_by is not None:
        report.notes.append(f"in use by pid {report.in_use_by} (a running member): the end of the log may be "
                            f"changing while this runs")


def _check_term_vote(report: Report, state: TermVote, where: str, problem: str, member_dir: Path,
                     last: int | None, known: tuple[int, ...] = ()) -> None:
    """A missing or damaged term/vote record is a problem wherever a member would refuse to start on it."""
    decision = ownership.term_vote_decision(state, last, report.identity is not None)
    if decision is Decision.REFUSE:
        report.problem(ownership.lost_message(where, problem, member_dir, last, known,
                                              outcome="a member refuses to start on this store"))
    else:
        report.notes.append("no term/vote record yet (a new store: a member starts at term 0)")


def mmap_last_term(member_dir: str | Path) -> int | None:
    """The term of the last entry of an mmap log, read-only: None for no data, UNKNOWN_TERM for undecodable data.

    For the term/vote rule (:mod:`.ownership`), so it runs before recovery
    and must not write: it maps the files read-only (sizes from the files),
    starts at the checkpoint's end when its index record checks out and
    walks to the end accepting zero CRCs (the term is all it wants).
    """
    member_dir = Path(member_dir)
    data_dir = member_dir / "data"
    if not data_dir.is_dir() or not any(not p.name.endswith(".tmp") for p in data_dir.iterdir()):
        return None
    try:
        reader = MmapReader(member_dir, accept_zero_crc=True)
    except StoreError:
        return UNKNOWN_TERM
    try:
        first, _why = reader.first()
        if first is None:
            return UNKNOWN_TERM if any(f.first_nonzero(0) >= 0 for f in reader.data.files) else None
        start = first
        checkpoint, _note = read_checkpoint(member_dir)
        if checkpoint is not None and checkpoint.end_index > first.index:
            start = reader.entry_via_index(checkpoint.end_index) or first
        result = scan_forward(reader.data, start.pos, start.index, -1, accept_zero_crc=True, check_tail=False)
        return max(start.term, result.last_term)
    finally:
        reader.close()


def iter_mmap(member_dir: Path, start: int | None, stop: int | None, *, data_file_size: int | None = None,
              index_file_size: int | None = None, accept_zero_crc: bool = False,
              chunk: int = 1000) -> Iterator[Entry]:
    """Entries from ``start`` to ``stop`` (inclusive), verified as they are read; StoreError at a bad one.

    Walks ``chunk`` entries at a time, so a huge log is never held in memory;
    starts through the index at ``start`` when its record checks out.
    """
    reader = MmapReader(member_dir, data_file_size=data_file_size, index_file_size=index_file_size,
                        accept_zero_crc=accept_zero_crc)
    try:
        first, why = reader.first()
        if first is None:
            if why:
                raise StoreError(why)
            return
        at = first
        if start is not None and start > first.index:
            at = reader.entry_via_index(start) or first
        pos, index, prev_term = at.pos, at.index, -1
        while stop is None or index <= stop:
            batch: list[Entry] = []
            last = index + chunk - 1 if stop is None else min(stop, index + chunk - 1)
            result = scan_forward(reader.data, pos, index, prev_term, accept_zero_crc=accept_zero_crc,
                                  on_entry=batch.append, check_tail=False, stop_after=last)
            yield from (e for e in batch if start is None or e.index >= start)
            if result.problem:
                raise StoreError(f"stopped at {result.problem}")
            if result.last_index < last:
                return
            pos, index, prev_term = result.write_pos, result.last_index + 1, result.last_term
    finally:
        reader.close()


def verify_lmdb(env_dir: Path, *, accept_zero_crc: bool = False) -> Report:
    from dledger.store.lmdbstore import SharedEnv, member_dir_of  # lmdb is only needed for LMDB stores

    report = Report("lmdb", Path(env_dir))
    _identity(report, member_dir_of(env_dir))
    size = os.path.getsize(Path(env_dir) / "data.mdb")
    report.files = [f"data.mdb: {size} bytes"]
    try:
        shared = SharedEnv.acquire(env_dir, readonly=True)
    except StoreError as exc:
        report.problem(str(exc))
        return report
    try:
        with shared.env.begin() as txn:
            prev = None
            for raw_key, value in txn.cursor(db=shared.entries):
                k = int.from_bytes(raw_key, "big")
                try:
                    e = decode_entry(value, accept_zero_crc=accept_zero_crc, exact=True)
                except CodecError as exc:
                    report.problem(f"entry under key {k}: {exc}", f"key {k}")
                    break
                if e.index != k:
                    report.problem(f"entry under key {k} is entry {e.index}", f"key {k}")
                    break
                if prev is not None:
                    if k != prev.index + 1:
                        report.problem(f"keys jump from {prev.index} to {k}", f"key {k}")
                        break
                    if e.term < prev.term or e.pos < prev.pos + prev.size:
                        report.problem(f"entry {k} (term {e.term}, pos {e.pos}) does not follow entry "
                                       f"{prev.index} (term {prev.term}, pos {prev.pos}, size {prev.size})",
                                       f"key {k}")
                        break
                else:
                    report.begin = k
                report.entries += 1
                report.end, report.end_term = k, e.term
                prev = e
            meta = {name: shared.read_int(txn, name.encode()) for name in ("begin", "end", "committed")}
            try:
                saved = shared.read_term_vote(txn)
                state, problem = (TermVote.OK if saved is not None else TermVote.MISSING), "is missing"
            except StoreError as exc:
                saved, state, problem = None, TermVote.DAMAGED, f"is damaged ({exc})"
            last_term = shared.last_term(txn)
    finally:
        shared.release()
    report.committed, report.committed_source = meta["committed"], "meta"
    if report.entries and report.ok and (meta["begin"], meta["end"]) != (report.begin, report.end):
        report.problem(f"metadata says entries [{meta['begin']}, {meta['end']}] but the keys are "
                       f"[{report.begin}, {report.end}]")
    if saved is not None:
        report.notes.append(f"term {saved[0]}, voted for {saved[1] or 'nobody'}")
    else:
        _check_term_vote(report, state, f"the term/vote record of LMDB store {env_dir}", problem,
                         member_dir_of(env_dir), last_term)
    return report


def iter_lmdb(env_dir: Path, start: int | None, stop: int | None, *,
              accept_zero_crc: bool = False) -> Iterator[Entry]:
    from dledger.store.lmdbstore import SharedEnv, key

    shared = SharedEnv.acquire(env_dir, readonly=True)
    try:
        with shared.env.begin() as txn:
            cursor = txn.cursor(db=shared.entries)
            found = cursor.set_range(key(start or 0))
            while found:
                k = int.from_bytes(cursor.key(), "big")
                if stop is not None and k > stop:
                    return
                try:
                    yield decode_entry(cursor.value(), accept_zero_crc=accept_zero_crc, exact=True)
                except CodecError as exc:
                    raise StoreError(f"entry under key {k} is damaged: {exc}") from None
                found = cursor.next()
    finally:
        shared.release()
