"""The LMDB store (``storeType = "lmdb"``): entries keyed by big-endian index, metadata in the same transaction.

One LMDB environment under ``<storeBaseDir>/dledger-<selfId>/lmdb/`` holds
three named databases: ``entries`` (8-byte big-endian index -> the entry
encoded by :mod:`dledger.entry`), ``meta`` (``begin``, ``end``,
``committed``) and ``termvote`` (the term store of this store type).

Appends are buffered in memory (reads see them) and written by
:meth:`LmdbLogStore.flush` in one write transaction together with the
metadata and any pending truncation, so a crash loses exactly the
appends of the rounds that had not committed, never half of one.  Rounds
go through :class:`dledger.store.groupcommit.GroupCommit`, on the thread pool
when the member gives us a threaded :class:`dledger.diskio.BlockingIO`.  A
full map is grown (doubled) on the reactor thread, when no transaction is
open, and the round retried.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from pathlib import Path

import lmdb
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.config import FLUSH_POLICIES, GiB, MiB
from dledger.entry import (
    CodecError,
    Entry,
    decode_entry,
    encode_entry,
)
from dledger.errors import DamagedStoreError, DLedgerError, StoreError
from dledger.hookspecs import hookimpl
from dledger.interfaces import (
    IBatchLogStore,
    ICompactingLogStore,
    IPlainLogStore,
    IPositionReader,
    ITermVoteStore,
)
from dledger.plugin_types import StoreType
from dledger.store import base, ownership, positions
from dledger.store.groupcommit import FlushPlan, GroupCommit
from dledger.store.ownership import TermVote

log = Logger()

ENTRIES, META, TERMVOTE = b"entries", b"meta", b"termvote"
_KEY = struct.Struct(">Q")
_INT = struct.Struct(">q")
_MAP_FULL = object()
ENV_DIR = "lmdb"


def member_dir_of(env_dir: str | Path) -> Path:
    """The member directory an environment belongs to (``<member dir>/lmdb``), where its lock and identity live."""
    env_dir = Path(env_dir)
    return env_dir.parent if env_dir.name == ENV_DIR else env_dir


def key(index: int) -> bytes:
    """The key of entry ``index``: 8 bytes big-endian, so LMDB's byte order is index order."""
    return _KEY.pack(index)


class SharedEnv:
    """One open LMDB environment per directory, shared by the log store and the term store of a member.

    LMDB must not be opened twice in one process, so both stores acquire the
    same handle; it is closed when the last one releases it.
    """

    _open: dict[str, SharedEnv] = {}

    def __init__(self, path: Path, map_size: int, readonly: bool):
        self.path = path
        self.readonly = readonly
        self.refs = 0
        try:
            self.env = lmdb.open(str(path), map_size=map_size, max_dbs=4, subdir=True, readonly=readonly,
                                 lock=not readonly, sync=True, metasync=True, readahead=False, create=not readonly)
            self.entries = self.env.open_db(ENTRIES, create=not readonly)
            self.meta = self.env.open_db(META, create=not readonly)
            self.termvote = self.env.open_db(TERMVOTE, create=not readonly)
        except lmdb.Error as exc:
            raise StoreError(f"cannot open LMDB store {path}: {exc}") from None

    @classmethod
    def acquire(cls, path: str | Path, map_size: int = 1 * GiB, *, readonly: bool = False) -> SharedEnv:
        path = Path(path)
        if not readonly:
            path.mkdir(parents=True, exist_ok=True)
        name = str(path.resolve())
        shared = cls._open.get(name)
        if shared is None:
            shared = cls._open[name] = cls(path, map_size, readonly)
        shared.refs += 1
        return shared

    def release(self) -> None:
        self.refs -= 1
        if self.refs <= 0:
            self._open.pop(str(self.path.resolve()), None)
            self.env.close()

    def grow(self) -> int:
        """Double the map size (call only when no transaction of this process is open)."""
        size = self.env.info()["map_size"] * 2
        self.env.set_mapsize(size)
        log.info("LMDB store {path}: map grown to {size} bytes", path=str(self.path), size=size)
        return size

    def read_int(self, txn, name: bytes) -> int | None:
        """A ``meta`` value (``begin``, ``end``, ``committed``), None if absent."""
        raw = txn.get(name, db=self.meta)
        return None if raw is None else _INT.unpack(raw)[0]

    def last_term(self, txn) -> int | None:
        """Term of the last stored entry (None: no entries; UNKNOWN_TERM if it does not decode)."""
        cursor = txn.cursor(db=self.entries)
        if not cursor.last():
            return None
        try:
            return decode_entry(cursor.value(), accept_zero_crc=True, verify_crc=False, exact=True).term
        except CodecError:
            return ownership.UNKNOWN_TERM

    def read_term_vote(self, txn) -> tuple[int, str | None] | None:
        """``(term, vote)`` from the ``termvote`` database, None if never saved; StoreError if damaged."""
        term = txn.get(b"currTerm", db=self.termvote)
        vote = txn.get(b"voteLeader", db=self.termvote)
        if term is None:
            return None
        if len(term) != _INT.size or _INT.unpack(term)[0] < 0:
            raise StoreError(f"{self.path}: currTerm record is damaged ({term!r})")
        return _INT.unpack(term)[0], (vote.decode() if vote else None)


class _Round:
    """What one write transaction applies: truncation, the entries, deletion below begin, the metadata."""

    __slots__ = ("drop_all", "delete_from", "delete_below", "entries", "begin", "end", "committed", "epoch", "base")

    def __init__(self, drop_all, delete_from, delete_below, entries, begin, end, committed, epoch, base=None):
        self.drop_all, self.delete_from, self.delete_below = drop_all, delete_from, delete_below
        self.entries, self.begin, self.end, self.committed, self.epoch = entries, begin, end, committed, epoch
        #: ``(index, term, next_pos)`` of a reset_to_snapshot to record, else None.
        self.base = base


def _write_round(shared: SharedEnv, rnd: _Round):
    """Blocking: apply a round in one write transaction (durable when it returns). _MAP_FULL if it did not fit."""
    db = shared.entries
    try:
        with shared.env.begin(write=True) as txn:
            cursor = txn.cursor(db=db)
            if rnd.drop_all:
                txn.drop(db, delete=False)
            else:
                if rnd.delete_from is not None and cursor.set_range(key(rnd.delete_from)):
                    while cursor.delete():
                        pass
            if rnd.entries:
                cursor.putmulti([(key(e.index), encode_entry(e)) for e in rnd.entries], append=True)
            if rnd.delete_below is not None and cursor.first():
                while cursor.key() < key(rnd.delete_below) and cursor.delete():
                    pass
            for name, value in ((b"begin", rnd.begin), (b"end", rnd.end), (b"committed", rnd.committed)):
                txn.put(name, _INT.pack(value), db=shared.meta)
            if rnd.base is not None:
                for name, value in zip((b"baseIndex", b"baseTerm", b"basePos"), rnd.base, strict=True):
                    txn.put(name, _INT.pack(value), db=shared.meta)
    except lmdb.MapFullError:
        return _MAP_FULL
    return None


@implementer(IPlainLogStore, IBatchLogStore, IPositionReader, ICompactingLogStore)
class LmdbLogStore(base.PlannedTruncate, positions.EntryPositionReader):
    """Entries in LMDB; see the module docstring."""

    def __init__(self, path: str | Path, member_state, *, data_file_size: int = 1 * GiB,
                 max_entry_size: int = 4 * MiB, map_size: int = 1 * GiB, flush_policy: str = "sync",
                 flush_interval_ms: int = 10, accept_zero_crc: bool = False, clock=None,
                 blocking_io: diskio.BlockingIO = diskio.INLINE, truncate_damaged: bool = False):
        if flush_policy not in FLUSH_POLICIES:
            raise ValueError(f"flush policy {flush_policy!r} is not one of {FLUSH_POLICIES}")
        self.path = Path(path)
        self.member_state = member_state
        self.data_file_size = data_file_size
        self.max_entry_size = max_entry_size
        self.map_size = map_size
        self.flush_policy = flush_policy
        self.flush_interval_ms = flush_interval_ms
        self.accept_zero_crc = accept_zero_crc
        self.clock = clock
        self.io = blocking_io
        self.truncate_damaged = truncate_damaged
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self._write_pos = 0
        self._shared: SharedEnv | None = None
        self._pending: list[Entry] = []
        self._pending_start = 0
        self._inflight: list[Entry] = []
        self._inflight_start = 0
        self._drop_all = False
        self._delete_from: int | None = None
        self._delete_below: int | None = None
        self._base_pending: tuple[int, int, int] | None = None
        #: ``(index, term)`` of the last :meth:`reset_to_snapshot` (``(-1, -1)``: none); kept in ``meta``.
        self.snapshot_base = (-1, -1)
        self._epoch = 0
        self._gc = GroupCommit(blocking_io, self._prepare_flush)
        self._timer: LoopingCall | None = None
        #: Who opens the store (a member: its identity is checked); the member directory is locked at startup anyway.
        self.owner: ownership.Owner | None = None
        self._claim: ownership.Claim | None = None

    @classmethod
    def from_config(cls, config, member_state, *, clock=None, blocking_io=None, **_unused) -> LmdbLogStore:
        if clock is None and config.flush_policy == "async":
            from twisted.internet import reactor as clock
        return cls(Path(config.member_dir) / ENV_DIR, member_state,
                   data_file_size=config.mapped_file_size_for_entry_data, max_entry_size=config.max_entry_size,
                   map_size=config.lmdb_map_size, flush_policy=config.flush_policy,
                   flush_interval_ms=config.flush_file_interval, accept_zero_crc=config.accept_java_zero_crc,
                   clock=clock, blocking_io=blocking_io or diskio.INLINE,
                   truncate_damaged=config.truncate_damaged)

    #: ``ILogStore.flush_rounds``: one round at a time (an LMDB sync covers the whole environment; a second
    #: round beside it would sync the same pages again).
    flush_rounds = 1

    # -- life cycle ------------------------------------------------------------
    @property
    def flushed_index(self) -> int:
        return min(self._gc.flushed_index, self.ledger_end_index)

    @property
    def flush_stats(self):
        return self._gc.stats

    def startup(self) -> None:
        """Lock the member directory (before anything is opened), then open; see :meth:`_startup`."""
        if self._shared is not None:
            return
        self._claim = ownership.claim(member_dir_of(self.path), self.owner)
        try:
            self._startup()
        except BaseException:
            self._release_claim()
            raise

    def _startup(self) -> None:
        """Open the environment and load begin/end/committed; the last entry must decode."""
        self._shared = SharedEnv.acquire(self.path, self.map_size)
        shared = self._shared
        with shared.env.begin() as txn:
            cursor = txn.cursor(db=shared.entries)
            if cursor.first():
                begin = _KEY.unpack(cursor.key())[0]
                try:
                    self._decode(cursor.value(), begin)
                    cursor.last()
                    end = _KEY.unpack(cursor.key())[0]
                    last = self._decode(cursor.value(), end)
                except DLedgerError as exc:
                    shared.release()
                    self._shared = None
                    raise StoreError(f"LMDB store {self.path}: {exc.message}") from None
                committed = shared.read_int(txn, b"committed")
                self.ledger_begin_index, self.ledger_end_index = begin, end
                self.ledger_end_term, self._write_pos = last.term, last.pos + last.size
                self.committed_index = base.committed_after_recovery(
                    -1 if committed is None else committed, begin, end)
                meta_end = shared.read_int(txn, b"end")
                if meta_end != end:
                    log.warn("LMDB store {path}: metadata end {meta} differs from the last key {end}",
                             path=str(self.path), meta=meta_end, end=end)
            else:
                committed = shared.read_int(txn, b"committed")
            base_index = shared.read_int(txn, b"baseIndex")
            if base_index is not None:
                self.snapshot_base = (base_index, shared.read_int(txn, b"baseTerm"))
                if self.ledger_end_index < 0:  # empty with a base: the log continues after the snapshot
                    self.ledger_begin_index, self.ledger_end_index = base_index + 1, base_index
                    self.ledger_end_term = self.snapshot_base[1]
                    self._write_pos = shared.read_int(txn, b"basePos")
                    self.committed_index = base_index
        self._check_committed_held(committed)
        self._pending_start = self.ledger_end_index + 1
        self._gc.flushed_index = self.ledger_end_index
        log.info("LMDB store {path}: entries [{begin}, {end}], committed {committed}", path=str(self.path),
                 begin=self.ledger_begin_index, end=self.ledger_end_index, committed=self.committed_index)
        if self.clock is not None and self.flush_policy == "async":
            self._timer = LoopingCall(self._periodic_flush)
            self._timer.clock = self.clock
            self._timer.start(self.flush_interval_ms / 1000.0, now=False).addErrback(
                lambda f: log.failure("LMDB flush timer stopped", f))

    def _check_committed_held(self, committed: int | None) -> None:
        """Refuse to start below the committed index the metadata records (see :mod:`.recovery`'s rule).

        Entries and metadata change in one transaction, so a last key below
        ``committed`` means the environment lost entries (damage, not a
        crash): starting would claim less than this member acknowledged,
        silently.  ``truncate_damaged`` is the operator's permission.
        """
        if committed is None or committed <= self.ledger_end_index:
            return
        line = (f"damaged store {self.path}: the last entry is {self.ledger_end_index} but the metadata says "
                f"entries up to {committed} are committed")
        if self.truncate_damaged:
            log.error("{line}; starting anyway as asked (--truncate-damaged): the member re-fetches them from "
                      "the leader", line=line)
            return
        self._shared.release()
        self._shared = None
        raise DamagedStoreError(f"{line}: restore the store from a backup, or start with --truncate-damaged "
                                f"(truncateDamaged = true) to re-fetch them from the leader")

    def _periodic_flush(self):
        if self._gc.busy or not self._dirty():
            return None
        return self._gc.request().addErrback(lambda f: log.failure("periodic flush failed", f))

    def _release_claim(self) -> None:
        ownership.release(self._claim)
        self._claim = None

    def shutdown(self) -> Deferred:
        if self._shared is None:
            return succeed(None)
        if self._timer is not None and self._timer.running:
            self._timer.stop()
        d = self._gc.request()

        def close(result):
            if self._shared is not None:
                self._shared.release()
                self._shared = None
            self._release_claim()
            return result

        d.addBoth(close)
        d.addCallback(lambda _: None)
        return d

    def abandon(self) -> None:
        """Drop the store as a killed process would: buffered (unflushed) appends are lost, nothing is written."""
        if self._timer is not None and self._timer.running:
            self._timer.stop()
        if self._shared is not None:
            self._shared.release()
            self._shared = None
        self._release_claim()

    # -- appends ---------------------------------------------------------------
    def _place(self, size: int) -> int:
        return base.place(self._write_pos, size, self.data_file_size, self.max_entry_size)[0]

    def _push(self, e: Entry) -> Entry:
        if self.ledger_end_index < 0:
            self.ledger_begin_index = e.index
        self._pending.append(e)
        self.ledger_end_index, self.ledger_end_term = e.index, e.term
        self._write_pos = e.pos + e.size
        return e

    def append_as_leader(self, entry: Entry, seal=None) -> Entry:
        if entry.channel or entry.chain_crc:
            base.check_reserved_fields(entry)
        pos = self._place(entry.size)
        index = self.ledger_end_index + 1
        return self._push(base.placed(entry, index, pos) if seal is None else seal(entry, index, pos))

    def _check_follower_entry(self, entry: Entry, write_pos: int) -> None:
        base.check_follower_entry(entry, write_pos, self.data_file_size, self.max_entry_size, self.accept_zero_crc)

    def append_as_follower(self, entry: Entry, leader_term: int, leader_id: str) -> Entry:
        base.check_next_index(entry, self.ledger_end_index)
        self._check_follower_entry(entry, self._write_pos)
        return self._push(entry)

    def append_batch_as_leader(self, entries: Sequence[Entry], seal=None) -> list[Entry]:
        """One-entry appends in a row: LMDB buffers appends until the flush's transaction anyway."""
        return base.append_each(self.append_as_leader, entries, seal)

    def append_batch_as_follower(self, entries: Sequence[Entry], leader_term: int, leader_id: str) -> list[Entry]:
        return base.append_each(self.append_as_follower, entries, leader_term, leader_id)

    # truncate(): base.PlannedTruncate, with the steps below.
    def _replace(self, entry: Entry) -> None:
        prev = self.get(entry.index - 1)
        self._check_follower_entry(entry, prev.pos + prev.size)
        self._drop_after(entry.index - 1)
        self._push(entry)

    def _append_next(self, entry: Entry) -> None:
        self._check_follower_entry(entry, self._write_pos)
        self._push(entry)

    def _reset(self, entry: Entry) -> None:
        base.check_entry_size(entry.size, self.max_entry_size)
        base.check_reserved_fields(entry)
        base.check_body_crc(entry, self.accept_zero_crc)
        self._drop_all, self._delete_from, self._delete_below = True, None, None
        self._pending, self._pending_start = [], entry.index
        self._epoch += 1
        self.ledger_begin_index = self.ledger_end_index = -1
        self._push(entry)
        self.committed_index = entry.index - 1
        self._gc.cap(entry.index - 1)

    def _drop_after(self, keep: int) -> None:
        if keep >= self.ledger_end_index:
            return
        last = self.get(keep)
        if keep + 1 < self._pending_start:
            self._pending, self._pending_start = [], keep + 1
            self._delete_from = keep + 1 if self._delete_from is None else min(self._delete_from, keep + 1)
        else:
            del self._pending[keep + 1 - self._pending_start:]
        self.ledger_end_index, self.ledger_end_term = keep, last.term
        self._write_pos = last.pos + last.size
        self._gc.cap(keep)

    def delete_before(self, index: int) -> int:
        """Drop entries below ``index`` (never a non-committed one); the next flush deletes them. Returns the count."""
        if index <= self.ledger_begin_index:
            return 0
        if index > self.committed_index + 1 or index > self.ledger_end_index:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"cannot delete below {index}: committed index is {self.committed_index}")
        removed = index - self.ledger_begin_index
        self._delete_below = index
        self.ledger_begin_index = index
        if index > self._pending_start:
            del self._pending[:index - self._pending_start]
            self._pending_start = index
        return removed

    def compact(self, below_index: int) -> int:
        """Delete the entries below ``below_index`` (never past the committed index, never the last entry).

        The next flush deletes them and records the new begin index in the same transaction.
        """
        below = base.compact_floor(below_index, self.ledger_begin_index, self.ledger_end_index, self.committed_index)
        if below > self.ledger_begin_index:
            self.delete_before(below)
        return self.ledger_begin_index

    def reset_to_snapshot(self, index: int, term: int, next_pos: int) -> None:
        """Drop every entry; the log is empty with a base at ``index`` (one transaction at the next flush)."""
        base.check_snapshot_base(index, term, next_pos)
        self._drop_all, self._delete_from, self._delete_below = True, None, None
        self._pending, self._pending_start = [], index + 1
        self._inflight = []
        self._epoch += 1
        self.ledger_begin_index, self.ledger_end_index, self.ledger_end_term = index + 1, index, term
        self._write_pos = next_pos
        self.committed_index = index
        self.snapshot_base = (index, term)
        self._base_pending = (index, term, next_pos)
        self._gc.cap(index)

    # -- reads -----------------------------------------------------------------
    def _decode(self, raw: bytes, index: int) -> Entry:
        try:
            e = decode_entry(raw, accept_zero_crc=self.accept_zero_crc, max_size=self.data_file_size, exact=True)
        except CodecError as exc:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} in {self.path} is damaged: {exc}") from None
        if e.index != index or e.channel or e.chain_crc:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"entry stored under key {index} is entry {e.index} "
                               f"(or has non-zero reserved fields)")
        return e

    def get(self, index: int) -> Entry:
        begin, end = self.ledger_begin_index, self.ledger_end_index
        if end < 0 or index < begin or index > end:
            raise base.index_out_of_range(index, begin, end)
        if index >= self._pending_start:
            return self._pending[index - self._pending_start]
        k = index - self._inflight_start
        if 0 <= k < len(self._inflight):
            return self._inflight[k]
        with self._shared.env.begin() as txn:
            raw = txn.get(key(index), db=self._shared.entries)
        if raw is None:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} is missing from {self.path}")
        return self._decode(raw, index)

    def get_range(self, begin_index: int, max_count: int, max_bytes: int) -> list[Entry]:
        return base.read_range(self.get, begin_index, self.ledger_end_index, max_count, max_bytes)

    def get_first_log_of_target_term(self, term: int, end_index: int) -> int:
        return base.first_index_of_term(lambda i: self.get(i).term, term, self.ledger_begin_index,
                                        self.ledger_end_index, end_index)

    def update_committed_index(self, term: int, index: int) -> None:
        self.committed_index = base.next_committed_index(
            self.committed_index, term, self.member_state.curr_term, index,
            self.ledger_begin_index, self.ledger_end_index)

    # -- durability ------------------------------------------------------------
    def flush(self) -> Deferred:
        """Write the buffered appends and truncations in one durable transaction (group commit)."""
        if self._shared is None:
            return succeed(self.flushed_index)
        return self._gc.request()

    def _dirty(self) -> bool:
        return bool(self._pending or self._drop_all or self._delete_from is not None
                    or self._delete_below is not None or self._base_pending is not None
                    or self._gc.flushed_index < self.ledger_end_index)

    def _prepare_flush(self) -> FlushPlan:
        target = self.ledger_end_index
        if not self._dirty():
            return FlushPlan(target, None)
        rnd = _Round(self._drop_all, self._delete_from, self._delete_below, self._pending,
                     self.ledger_begin_index, target, min(self.committed_index, target), self._epoch,
                     self._base_pending)
        self._inflight, self._inflight_start = self._pending, self._pending_start
        self._pending, self._pending_start = [], target + 1
        self._drop_all, self._delete_from, self._delete_below = False, None, None
        self._base_pending = None
        shared = self._shared

        def work():
            return _write_round(shared, rnd)

        def done(result) -> bool:
            if result is _MAP_FULL:
                shared.grow()
                return False
            self._inflight = []
            return True

        def failed(_failure) -> None:
            self._inflight = []
            if rnd.epoch != self._epoch:
                return  # the log was reset meanwhile; the failed round's state is gone anyway
            self._drop_all = self._drop_all or rnd.drop_all
            self._base_pending = self._base_pending or rnd.base
            self._delete_from = _lowest(self._delete_from, rnd.delete_from)
            self._delete_below = max(x for x in (self._delete_below, rnd.delete_below, -1) if x is not None)
            if self._delete_below < 0:
                self._delete_below = None
            keep = [e for e in rnd.entries if e.index < self._pending_start and e.index <= self.ledger_end_index]
            if keep:
                self._pending = keep + self._pending
                self._pending_start = keep[0].index

        return FlushPlan(target, work, done=done, failed=failed)


def _lowest(a: int | None, b: int | None) -> int | None:
    values = [x for x in (a, b) if x is not None]
    return min(values) if values else None


@implementer(ITermVoteStore)
class LmdbTermVoteStore:
    """``currTerm``/``voteLeader`` in the ``termvote`` database of the member's environment; durable per save.

    Saved on the reactor thread (``save_off_reactor`` False): a full map is grown in :meth:`save`, and
    growing is only safe while no other transaction of the process is open, which a save on a pool
    thread, beside the log store's flush rounds, could not ensure.
    """

    save_off_reactor = False

    def __init__(self, path: str | Path, map_size: int = 1 * GiB, owner: ownership.Owner | None = None):
        self.path = Path(path)
        self.map_size = map_size
        self.owner = owner
        self._shared: SharedEnv | None = None
        self._claim: ownership.Claim | None = None

    def _env(self) -> SharedEnv:
        if self._claim is None:
            self._claim = ownership.claim(member_dir_of(self.path), self.owner)
        if self._shared is None:
            self._shared = SharedEnv.acquire(self.path, self.map_size)
        return self._shared

    def load(self) -> tuple[int, str | None]:
        """The saved term and vote; the same rule as ``currterm`` (see :mod:`.ownership`) when there is none."""
        try:
            return self._load()
        except BaseException:
            self.close()
            raise

    def _load(self) -> tuple[int, str | None]:
        member_dir = member_dir_of(self.path)
        had_identity = (member_dir / ownership.IDENTITY_NAME).exists()
        shared = self._env()
        problem, saved = "", None
        with shared.env.begin() as txn:
            try:
                saved = shared.read_term_vote(txn)
                state = TermVote.OK if saved is not None else TermVote.MISSING
                problem = "is missing"
            except StoreError as exc:
                state, problem = TermVote.DAMAGED, f"is damaged ({str(exc).removeprefix(f'{self.path}: ')})"
            last = None if state is TermVote.OK else shared.last_term(txn)
        return ownership.settle_term_vote(state, saved, problem, last, had_identity=had_identity,
                                          where=f"the term/vote record of LMDB store {self.path}",
                                          store_dir=member_dir, save=self.save, claim=self._claim, owner=self.owner)

    def save(self, term: int, vote_for: str | None) -> None:
        if term < 0:
            raise ValueError(f"term must be >= 0, got {term}")
        shared = self._env()
        while True:
            try:
                with shared.env.begin(write=True) as txn:
                    txn.put(b"currTerm", _INT.pack(term), db=shared.termvote)
                    txn.put(b"voteLeader", (vote_for or "").encode(), db=shared.termvote)
                return
            except lmdb.MapFullError:
                shared.grow()

    def close(self) -> None:
        if self._shared is not None:
            self._shared.release()
            self._shared = None
        ownership.release(self._claim)
        self._claim = None


def _log_store(config, member_state, **kwargs) -> LmdbLogStore:
    """A member's log store: :meth:`LmdbLogStore.from_config`, owned by the member (identity checked at startup)."""
    store = LmdbLogStore.from_config(config, member_state, **kwargs)
    store.owner = ownership.Owner.from_config(config)
    return store


def _term_store(config) -> LmdbTermVoteStore:
    return LmdbTermVoteStore(Path(config.member_dir) / ENV_DIR, config.lmdb_map_size,
                             ownership.Owner.from_config(config))


@hookimpl
def dledger_store_types():
    return [StoreType(
        name="lmdb",
        make_log_store=_log_store,
        make_term_store=_term_store,
        description="LMDB: entries keyed by big-endian index, metadata and term/vote in the same environment",
    )]
