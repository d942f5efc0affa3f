"""The mmap file store (``storeType = "mmap"``): DLedger's data and index files, byte for byte.

Layout under ``<storeBaseDir>/dledger-<selfId>/``: ``data/`` and ``index/``
(fixed-size files named by their start offset, see
:mod:`dledger.store.mappedfiles`), ``checkpoint`` (:mod:`.checkpoint`) and
``currterm`` (:mod:`.termvote`).  Entries are encoded with the codec of
:mod:`dledger.entry` and written into the page cache at their position
(``pwrite``), index record ``i`` is stored at ``i * 32`` of the mapped index
files, and reads, recovery and verification go through the mappings; a Java
DLedger 0.3.2 store opens as it is, and ours have the same layout.  (Storing
entries into the data mapping instead made appends and fdatasync 2-3x slower:
see ``docs/benchmarks.md``.)

Nothing per entry is kept in Python: the index files *are* the index, so
memory stays flat however long the log grows.  Appends only touch memory;
:meth:`MmapLogStore.flush` makes them durable, many per fsync (group
commit), on the reactor thread pool when the member gives us a threaded
:class:`dledger.diskio.BlockingIO`.  Start-up recovery is in
:mod:`.recovery`, retention rules in :mod:`.retention`.
"""

from __future__ import annotations

import errno
import functools
import mmap
from collections.abc import Sequence
from pathlib import Path

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.config import FLUSH_POLICIES, GiB, MiB
from dledger.entry import (
    HEADER,
    HEADER_SIZE,
    INDEX_RECORD,
    INDEX_UNIT_SIZE,
    MIN_BLANK_LEN,
    VALID_MAGICS,
    CodecError,
    Entry,
    EntryList,
    body_crc,
    decode_entry,
    encode_blank,
)
from dledger.errors import BatchAppendError, DLedgerError, StoreError
from dledger.hookspecs import hookimpl
from dledger.interfaces import IBatchLogStore, IPlainLogStore, IPositionReader, IRetainingLogStore
from dledger.plugin_types import StoreType
from dledger.store import base, ownership, positions
from dledger.store.base import TruncateAction
from dledger.store.checkpoint import Checkpoint, read_checkpoint, write_checkpoint
from dledger.store.groupcommit import FlushPlan, GroupCommit
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFile, MappedFileList
from dledger.store.recovery import Recovered, recover, verified_entry
from dledger.store.retention import CleanMode, RetentionPolicy
from dledger.store.scan import decode_at, scan_forward
from dledger.store.termvote import FileTermVoteStore

log = Logger()

_write_at = diskio.write_at
_pack_header = HEADER.pack
_pack_index = INDEX_RECORD.pack_into
_unpack_index = INDEX_RECORD.unpack_from
_REPAIR_LOOKBACK = 64
#: Flushed pages are unmapped (RSS) once this many bytes of a log were flushed since the last time.
_RELEASE_STEP = 1 << 20


@implementer(IPlainLogStore, IRetainingLogStore, IBatchLogStore, IPositionReader)
class MmapLogStore:
    """Data and index files under ``member_dir``; see the module docstring.

    ``clock`` (an ``IReactorTime``) drives the periodic checkpoint, the
    ``async`` flush and retention/disk checks; without one nothing runs by
    itself (offline tools).  ``disk_usage()`` returns the used fraction of
    the disk (tests patch it).  ``full_verify`` makes start-up verify every
    entry instead of starting at the checkpoint.
    """

    def __init__(self, member_dir: str | Path, member_state, *,
                 data_file_size: int = 1 * GiB, index_file_size: int = 160 * MiB,
                 max_entry_size: int = 4 * MiB, flush_policy: str = "sync", flush_interval_ms: int = 10,
                 checkpoint_interval_ms: int = 3000, clean_interval_ms: int = 1000,
                 retention: RetentionPolicy | None = None, accept_zero_crc: bool = False,
                 clock=None, blocking_io: diskio.BlockingIO = diskio.INLINE, disk_usage=None,
                 full_verify: bool = False, release_flushed_pages: bool = True, truncate_damaged: bool = False):
        if index_file_size <= 0 or index_file_size % INDEX_UNIT_SIZE:
            raise ValueError(f"index file size {index_file_size} is not a positive multiple of {INDEX_UNIT_SIZE}")
        if data_file_size < HEADER_SIZE + MIN_BLANK_LEN:
            raise ValueError(f"data file size {data_file_size} cannot hold an entry")
        if flush_policy not in FLUSH_POLICIES:
            raise ValueError(f"flush policy {flush_policy!r} is not one of {FLUSH_POLICIES}")
        self.member_dir = Path(member_dir)
        self.member_state = member_state
        self.data_file_size = data_file_size
        self.index_file_size = index_file_size
        self.max_entry_size = max_entry_size
        self.flush_policy = flush_policy
        self.flush_interval_ms = flush_interval_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.clean_interval_ms = clean_interval_ms
        self.retention = retention or RetentionPolicy()
        self.accept_zero_crc = accept_zero_crc
        self.clock = clock
        self.io = blocking_io
        self.full_verify = full_verify
        self.truncate_damaged = truncate_damaged
        self.release_flushed_pages = release_flushed_pages
        self._disk_usage = disk_usage or (lambda: diskio.disk_used_ratio(self.member_dir))
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.recovered: Recovered | None = None
        self._begin_pos = -1
        self._write_pos = 0
        self._initial_pos = 0
        self._data: MappedFileList | None = None
        self._index: MappedFileList | None = None
        self._ilog: IndexLog | None = None
        self._graveyard: list[MappedFile] = []
        self._gc = GroupCommit(blocking_io, self._prepare_flush, after_round=self._bury)
        self._data_dirty_lo = 0
        self._index_dirty_lo = 0
        self._released_to = 0
        self._index_released_to = 0
        self._disk_full = False
        self._used_ratio = 0.0
        self._timers: list[LoopingCall] = []
        self._checkpoint_written: Checkpoint | None = None
        self._checkpoint_running: Deferred | None = None
        self._open = False
        self._set_data_tail(None)
        self._set_index_tail(None)
        #: Who opens the store (a member: its identity is checked); the directory is locked at startup either way.
        self.owner: ownership.Owner | None = None
        self._claim: ownership.Claim | None = None

    @classmethod
    def from_config(cls, config, member_state, *, clock=None, blocking_io=None, disk_usage=None) -> MmapLogStore:
        """The store a member runs: options from ``config``; timers on ``clock`` (default: the global reactor)."""
        if clock is None:
            from twisted.internet import reactor as clock
        return cls(config.member_dir, member_state,
                   data_file_size=config.mapped_file_size_for_entry_data,
                   index_file_size=config.mapped_file_size_for_entry_index,
                   max_entry_size=config.max_entry_size, flush_policy=config.flush_policy,
                   flush_interval_ms=config.flush_file_interval, checkpoint_interval_ms=config.check_point_interval,
                   retention=RetentionPolicy.from_config(config), accept_zero_crc=config.accept_java_zero_crc,
                   clock=clock, blocking_io=blocking_io or diskio.INLINE, disk_usage=disk_usage,
                   truncate_damaged=config.truncate_damaged)

    # -- state -----------------------------------------------------------------
    @property
    def flushed_index(self) -> int:
        return min(self._gc.flushed_index, self.ledger_end_index)

    @property
    def flush_stats(self):
        """Latency and reactor-blocked time of recent flush rounds (:class:`.groupcommit.FlushStats`)."""
        return self._gc.stats

    @property
    def disk_full(self) -> bool:
        return self._disk_full

    @property
    def data_files(self) -> list[Path]:
        return [f.path for f in self._data.files] if self._data else []

    @property
    def index_files(self) -> list[Path]:
        return [f.path for f in self._index.files] if self._index else []

    def set_initial_position(self, pos: int) -> None:
        """Where the first entry goes when :meth:`startup` finds the log empty (default 0).

        For a log that continues another one: a RocketMQ CommitLog migrated
        to dledger starts its dledger data at the end of the old files
        (``dividedCommitlogOffset``), so physical offsets never overlap.  A
        multiple of the data file size (the first data file is named by it);
        call it before :meth:`startup`; a log that holds entries keeps its
        own positions (followers take the leader's positions anyway).
        """
        if pos < 0 or pos % self.data_file_size:
            raise ValueError(f"initial position {pos} is not a non-negative multiple of the data file size "
                             f"{self.data_file_size}")
        if self._open:
            raise ValueError("set_initial_position must be called before the store starts")
        self._initial_pos = pos

    # -- life cycle ------------------------------------------------------------
    def startup(self) -> None:
        """Lock the directory (before anything is read or repaired), then open and recover; see :meth:`_startup`."""
        if self._open:
            return
        self._claim = ownership.claim(self.member_dir, self.owner)
        try:
            self._startup()
        except BaseException:
            ownership.release(self._claim)
            self._claim = None
            raise

    def _startup(self) -> None:
        """Open the files, recover (see :mod:`.recovery`), make the repairs durable, start the timers."""
        self.member_dir.mkdir(parents=True, exist_ok=True)
        data = MappedFileList(self.member_dir / "data", self.data_file_size, kind="data")
        index = MappedFileList(self.member_dir / "index", self.index_file_size, kind="index")
        notes = data.load(stop_at_gap=True)
        try:
            notes += index.load(contiguous=False)
        except BaseException:
            data.close()
            raise
        for path in index.stragglers:
            diskio.remove_file(path)
            index.dir_dirty = True
            notes.append(f"removed index file {path.name} (after a gap; rebuilt from the data)")
        checkpoint, ck_note = read_checkpoint(self.member_dir)
        if ck_note and (checkpoint is not None or data.files):
            notes.append(f"checkpoint: {ck_note}")
        self._data, self._index, self._ilog = data, index, IndexLog(index)
        try:
            rec = recover(data, index, checkpoint, accept_zero_crc=self.accept_zero_crc,
                          closer=self._close_file, full=self.full_verify, truncate_damaged=self.truncate_damaged)
        except BaseException:
            data.close()
            index.close()
            self._data = self._index = self._ilog = None
            raise
        rec.notes[:0] = notes
        rec.removed_index_files += len(index.stragglers)
        self.recovered = rec
        self.ledger_begin_index, self._begin_pos = rec.begin, rec.begin_pos
        self.ledger_end_index, self.ledger_end_term = rec.end, rec.end_term
        self._write_pos = rec.write_pos if rec.end >= 0 else (0 if data.files else self._initial_pos)
        self.committed_index = rec.committed
        self._refresh_tails()
        self._make_recovery_durable(rec, checkpoint)
        claimed = checkpoint.committed_index if checkpoint is not None else -1
        if rec.forced and checkpoint is not None and checkpoint.committed_index > rec.committed:
            # Never claim, even after a crash right now, a committed index the log no longer holds.
            checkpoint = Checkpoint(end_index=rec.end, committed_index=rec.committed)
            write_checkpoint(self.member_dir, checkpoint)
        self._gc.flushed_index = rec.end
        self._data_dirty_lo = self._write_pos
        self._index_dirty_lo = rec.end + 1
        self._released_to = data.start if data.files else 0
        self._index_released_to = index.start if index.files else 0
        self._checkpoint_written = checkpoint
        self._open = True
        msg = "mmap store {dir}: {summary}"
        if claimed > rec.end:  # committed entries are missing here: an operator must hear of it
            rec.notes.append(f"the checkpoint claims more than the log holds: committed index {claimed} but "
                             f"entries only up to {rec.end} (see docs/operations.md, Troubleshooting)")
        if rec.forced:
            log.error(msg, dir=str(self.member_dir), summary=rec.summary())
        elif rec.cut or claimed > rec.end:
            log.warn(msg, dir=str(self.member_dir), summary=rec.summary())
        else:
            log.info(msg, dir=str(self.member_dir), summary=rec.summary())
        self.check_disk()
        if self.clock is not None:
            self._start_timers()

    def _make_recovery_durable(self, rec: Recovered, checkpoint: Checkpoint | None) -> None:
        """Fsync what recovery verified past the checkpoint or repaired, before anything is acknowledged."""
        anchor_pos = self._begin_pos
        if not rec.full_scan and rec.anchor >= 0:
            r = self._ilog.read(rec.anchor)
            anchor_pos = r[1] if r else anchor_pos
        data_fds = [f.fd for f in self._data.files if f.end > anchor_pos]
        index_fds = [f.fd for f in self._index.files if f.end > max(rec.anchor, 0) * INDEX_UNIT_SIZE]
        if rec.full_scan or rec.rebuilt_index:
            index_fds = [f.fd for f in self._index.files]
        dirs = [str(lst.directory) for lst in (self._data, self._index) if lst.dir_dirty or any(
            f.new for f in lst.files)]
        for lst in (self._data, self._index):
            lst.dir_dirty = False
            for f in lst.files:
                f.new = False
        diskio.flush_files(data_fds + index_fds, [], [d for d in dirs if Path(d).is_dir()])

    def shutdown(self) -> Deferred:
        """Stop the timers, flush, write the checkpoint, close the files."""
        if not self._open:
            return succeed(None)
        for lc in self._timers:
            if lc.running:
                lc.stop()
        self._timers = []
        d = self._gc.request()

        def after_flush(_):
            prev = self._checkpoint_running
            if prev is not None:
                wait: Deferred = Deferred()
                prev.addBoth(lambda r: wait.callback(None))
                return wait.addCallback(lambda _: self._write_checkpoint(force=True))
            return self._write_checkpoint(force=True)

        def close(result):
            self._close_all()
            return result

        d.addCallback(after_flush)
        d.addBoth(close)
        d.addCallback(lambda _: None)
        return d

    def abandon(self) -> None:
        """Drop the store as a killed process would: timers stop and files close, nothing more is written.

        What was already written stays in the page cache, exactly as after a
        SIGKILL; in-process tests use this to restart a member from its files.
        """
        for lc in self._timers:
            if lc.running:
                lc.stop()
        self._timers = []
        self._close_all()

    def _close_all(self) -> None:
        if not self._open:
            return
        self._open = False
        for lst in (self._data, self._index):
            if lst is not None:
                lst.close()
        for f in self._graveyard:
            f.close()
        self._graveyard = []
        self._set_data_tail(None)
        self._set_index_tail(None)
        ownership.release(self._claim)  # last: the files are closed, another process may have them
        self._claim = None

    def _close_file(self, f: MappedFile) -> None:
        """Close a removed file now, or after the running flush round (it may be syncing its descriptor)."""
        if self._gc.busy:
            self._graveyard.append(f)
        else:
            f.close()

    def _bury(self) -> None:
        if not self._gc.busy:
            for f in self._graveyard:
                f.close()
            self._graveyard = []

    # -- timers ----------------------------------------------------------------
    def _start_timers(self) -> None:
        def every(ms: int, fn) -> None:
            lc = LoopingCall(fn)
            lc.clock = self.clock
            lc.start(ms / 1000.0, now=False).addErrback(
                lambda f: log.failure("mmap store timer {fn} stopped", f, fn=fn.__name__))
            self._timers.append(lc)

        every(self.checkpoint_interval_ms, self._periodic_checkpoint)
        if self.flush_policy == "async":
            every(self.flush_interval_ms, self._periodic_flush)
        every(self.clean_interval_ms, self._periodic_clean)

    def _periodic_flush(self):
        if self._gc.busy or not self._dirty():
            return None
        return self._gc.request().addErrback(lambda f: log.failure("periodic flush failed", f))

    def _periodic_checkpoint(self) -> None:
        if self._checkpoint_running is None:
            self._write_checkpoint(force=False).addErrback(lambda f: log.failure("checkpoint write failed", f))

    def _periodic_clean(self) -> None:
        try:
            self.clean_expired(self.clock.seconds())
        except Exception:
            log.failure("retention check failed")

    def _current_checkpoint(self) -> Checkpoint:
        flushed = self.flushed_index
        return Checkpoint(end_index=flushed, committed_index=min(self.committed_index, flushed))

    def _write_checkpoint(self, *, force: bool) -> Deferred:
        ck = self._current_checkpoint()
        if not force and ck == self._checkpoint_written:
            return succeed(None)
        d = self.io.run(write_checkpoint, self.member_dir, ck)
        self._checkpoint_running = d

        def written(result):
            self._checkpoint_running = None
            self._checkpoint_written = ck
            return result

        def failed(failure):
            self._checkpoint_running = None
            return failure

        d.addCallbacks(written, failed)
        return d

    # -- appends ---------------------------------------------------------------
    def _set_data_tail(self, f: MappedFile | None) -> None:
        """Cache the last data file for the append path (``_dlimit``: last byte an entry may end at)."""
        if f is None:
            self._dfd, self._dstart, self._dlimit = -1, 0, -1
        else:
            self._dfd, self._dstart, self._dlimit = f.fd, f.start, f.end - MIN_BLANK_LEN

    def _set_index_tail(self, f: MappedFile | None) -> None:
        if f is None:
            self._imm, self._istart, self._isize = None, 0, 0
        else:
            self._imm, self._istart, self._isize = f.mm, f.start, f.size

    def _refresh_tails(self) -> None:
        self._set_data_tail(self._data.files[-1] if self._data and self._data.files else None)
        self._set_index_tail(self._index.files[-1] if self._index and self._index.files else None)

    def append_as_leader(self, entry: Entry, seal=None) -> Entry:
        return _one(self.append_batch_as_leader, entry, seal)

    def append_batch_as_leader(self, entries: Sequence[Entry], seal=None) -> list[Entry]:
        """Leader appends of ``entries`` in order, one ``pwrite`` per run of entries in one data file."""
        return self._append(entries, _LEADER, seal)

    def append_as_follower(self, entry: Entry, leader_term: int, leader_id: str) -> Entry:
        return _one(self.append_batch_as_follower, entry, leader_term, leader_id)

    def append_batch_as_follower(self, entries: Sequence[Entry], leader_term: int, leader_id: str) -> list[Entry]:
        """Follower appends of ``entries`` in order, one ``pwrite`` per run of entries in one data file."""
        return self._append(entries, _FOLLOWER)

    def _append(self, entries: Sequence[Entry], mode: int, seal=None) -> list[Entry]:
        """Store ``entries`` at the end of the log: checks per entry, then one write per run (see IBatchLogStore).

        ``mode`` is ``_LEADER`` (assign index and pos, then store
        ``seal(entry, index, pos)``, the core's hooks and CRC, or seal the
        CRC here without one), ``_FOLLOWER`` (the leader's entries, every follower check)
        or ``_PLACED`` (an entry truncate or reset has checked already).  A run
        ends where the next entry needs a new data file: it is written (with
        its index records) before the blank marker and the new file, so the
        blank marker rules are those of one-entry appends.  The first failing
        entry stops the batch; what was written before it stays.  A hook that
        raises fails its entry with AppendHookError (see
        :func:`dledger.store.guard.seal_leader_entry`), after the entries before it were written.
        """
        run = _Run(self._write_pos)
        stored: list[Entry] = []
        index = self.ledger_end_index + 1
        # A push's entries arrive encoded (checked by their CRCs): write those bytes instead of encoding again.
        known = entries.known_section() if mode == _FOLLOWER and type(entries) is EntryList else None
        run.src = known[0] if known is not None else None
        src_off = 0
        try:
            for entry in entries:
                body = entry.body
                size = HEADER_SIZE + len(body)
                wp = run.end
                if mode == _LEADER:
                    if self._disk_full:
                        self._refuse_disk_full()
                    if entry.channel or entry.chain_crc:
                        base.check_reserved_fields(entry)
                    if wp + size > self._dlimit or size > self.max_entry_size:
                        run = self._next_run(run, stored, size)
                        wp = run.end
                    if seal is not None:
                        e = seal(entry, index, wp)
                        body = e.body
                    else:
                        e = Entry(body, index, entry.term, wp, entry.magic, 0, 0, body_crc(body))
                else:
                    e = entry
                    if mode == _FOLLOWER:
                        base.check_next_index(entry, index - 1)
                        base.check_follower_entry(entry, wp, self.data_file_size, self.max_entry_size,
                                                  self.accept_zero_crc)
                        if self._disk_full:
                            self._refuse_disk_full()
                    if e.pos != wp or e.pos + size > self._dlimit:
                        run = self._next_run(run, stored, size)
                        if run.end != e.pos:
                            raise DLedgerError(ResponseCode.DISK_ERROR,
                                               f"entry {e.index}: placement changed under us")
                        if known is not None:
                            run.src, run.src_off = known[0], src_off
                if run.src is None:
                    run.add(e, body, size)
                else:
                    run.entries.append(e)
                    run.end += size
                    src_off += size
                index = e.index + 1
            self._write_run(run, stored)
        except Exception as exc:
            error = exc
            if not run.written:  # the entries before the failing one stay appended
                try:
                    self._write_run(run, stored)
                except DLedgerError as write_error:
                    error = write_error
            if isinstance(error, DLedgerError):
                raise BatchAppendError(error, stored) from None
            raise  # a failing hook (or a failing file creation) propagates as it is
        return stored

    def _next_run(self, run: _Run, stored: list[Entry], size: int) -> _Run:
        """Write ``run``, then make room for an entry of ``size`` (blank marker, new file); the run that follows."""
        self._write_run(run, stored)
        return _Run(self._make_room(size))

    def _write_run(self, run: _Run, stored: list[Entry]) -> None:
        """Write a run's entries with one pwrite, then their index records; only then do they count as stored."""
        run.written = True
        entries = run.entries
        if not entries:
            return
        data = run.buf if run.src is None else run.src[run.src_off:run.src_off + run.end - run.pos]
        try:
            _write_at(self._dfd, data, run.pos - self._dstart)
        except OSError as exc:
            raise _disk_error(exc, entries[0].index) from None
        for e in entries:
            ioff = e.index * INDEX_UNIT_SIZE - self._istart
            if not 0 <= ioff < self._isize:
                ioff = self._index_room(e.index)
            _pack_index(self._imm, ioff, e.magic, e.pos, HEADER_SIZE + len(e.body), e.index, e.term)
        last = entries[-1]
        self.ledger_end_index = last.index
        self.ledger_end_term = last.term
        self._write_pos = run.end
        if self.ledger_begin_index < 0:
            self.ledger_begin_index, self._begin_pos = entries[0].index, run.pos
        stored.extend(entries)

    def _make_room(self, size: int) -> int:
        """Place an entry that does not fit the current file: checks first, then the blank marker and a new file."""
        wp = self._write_pos
        pos, blank = base.place(wp, size, self.data_file_size, self.max_entry_size)
        if self._data.file_for(pos) is None:
            self.check_disk()
            if self._disk_full:
                self._refuse_disk_full()
        if blank:
            f = self._data.file_for(wp)
            if f is not None:
                _write_at(f.fd, encode_blank(blank), wp - f.start)
                self._data_dirty_lo = min(self._data_dirty_lo, wp)
        f = self._data.file_for(pos)
        if f is None:
            try:
                f = self._data.create(pos - pos % self.data_file_size)
            except OSError as exc:
                raise _disk_error(exc, self.ledger_end_index + 1) from None
        self._set_data_tail(f)
        self._write_pos = pos
        return pos

    def _index_room(self, index: int) -> int:
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        if f is None:
            start = off - off % self.index_file_size
            if self._index.files and start != self._index.end:
                raise StoreError(f"index record {index} does not follow the index files in {self._index.directory}")
            f = self._index.create(start)
        self._set_index_tail(f)
        return off - f.start

    def _refuse_disk_full(self):
        base.check_disk_not_full(True, self._used_ratio, self.retention.disk_full_ratio)

    # -- truncate --------------------------------------------------------------
    def truncate(self, entry: Entry, leader_term: int, leader_id: str) -> int:
        action = base.plan_truncate(entry, self.ledger_begin_index, self.ledger_end_index,
                                    self.committed_index, self.get)
        if action is TruncateAction.DROP_AFTER:
            self._drop_after(entry.index)
        elif action is TruncateAction.REPLACE:
            prev = self._record(entry.index - 1)
            base.check_follower_entry(entry, prev[1] + prev[2], self.data_file_size, self.max_entry_size,
                                      self.accept_zero_crc)
            if self._disk_full:
                self._refuse_disk_full()
            self._drop_after(entry.index - 1)
            _one(self._append, entry, _PLACED)
        elif action is TruncateAction.APPEND:
            _one(self._append, entry, _FOLLOWER)
        else:
            self._reset(entry)
        self.committed_index = min(self.committed_index, self.ledger_end_index)
        return entry.index

    def _drop_after(self, keep: int) -> None:
        """Drop entries after ``keep`` (which stays): zero their bytes and index records, remove later files."""
        old_end, old_wp = self.ledger_end_index, self._write_pos
        if keep >= old_end:
            return
        rec = self._record(keep)
        new_wp = rec[1] + rec[2]
        f = self._data.file_for(new_wp)
        f.mm[new_wp - f.start:min(old_wp, f.end) - f.start] = bytes(min(old_wp, f.end) - new_wp)
        self._data.remove_after(self._data.position_of(f) + 1, self._close_file)
        ioff = (keep + 1) * INDEX_UNIT_SIZE
        kept = [g for g in self._index.files if g.start < ioff]
        if kept:
            g = kept[-1]
            hi = min((old_end + 1) * INDEX_UNIT_SIZE, g.end)
            if hi > ioff:
                g.mm[ioff - g.start:hi - g.start] = bytes(hi - ioff)
        self._index.remove_after(len(kept), self._close_file)
        self.ledger_end_index, self.ledger_end_term = keep, rec[4]
        self._write_pos = new_wp
        self._data_dirty_lo = min(self._data_dirty_lo, new_wp)
        self._index_dirty_lo = min(self._index_dirty_lo, keep + 1)
        self._gc.cap(keep)
        self._refresh_tails()

    def _reset(self, entry: Entry) -> None:
        """Start the log over at ``entry`` (a follower behind the leader's begin, or an empty one)."""
        base.check_entry_size(entry.size, self.max_entry_size)
        rel = entry.pos % self.data_file_size
        if rel + entry.size + MIN_BLANK_LEN > self.data_file_size:
            raise DLedgerError(ResponseCode.DISK_ERROR,
                               f"entry {entry.index} at pos {entry.pos} does not fit a {self.data_file_size}-byte "
                               f"data file here (data file sizes differ between members?)")
        base.check_reserved_fields(entry)
        base.check_body_crc(entry, self.accept_zero_crc)
        if self._disk_full:
            self._refuse_disk_full()
        self._data.remove_after(0, self._close_file)
        self._index.remove_after(0, self._close_file)
        # The old files must be gone for good before new ones appear, or a crash could mix the two logs.
        for lst in (self._data, self._index):
            if lst.directory.is_dir():
                diskio.fsync_dir(lst.directory)
        # Nor may a crash leave the old checkpoint claiming committed entries that were just dropped
        # (recovery refuses to start below a committed index; the leader's log starts past ours).
        ck = self._checkpoint_written
        if ck is not None and ck.committed_index >= 0 or self._checkpoint_running is not None:
            self._checkpoint_written = Checkpoint(end_index=-1, committed_index=-1)
            write_checkpoint(self.member_dir, self._checkpoint_written)
        self._set_data_tail(None)
        self._set_index_tail(None)
        self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
        self._write_pos = entry.pos - rel
        self._data.create(self._write_pos)
        self._refresh_tails()
        self._write_pos = entry.pos
        _one(self._append, entry, _PLACED)
        self._begin_pos = entry.pos
        self.committed_index = entry.index - 1
        self._gc.cap(entry.index - 1)
        self._data_dirty_lo = entry.pos
        self._index_dirty_lo = entry.index
        self._released_to = self._data.start
        self._index_released_to = self._index.start

    # -- reads -----------------------------------------------------------------
    def _record(self, index: int) -> tuple[int, int, int, int, int]:
        """Index record ``index`` (magic, pos, size, index, term), repaired from the data if it is damaged."""
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        if f is not None:
            rec = _unpack_index(f.mm, off - f.start)
            if rec[3] == index and rec[0] in VALID_MAGICS and rec[2] >= HEADER_SIZE:
                return rec
        return self._repair_index(index)

    def _repair_index(self, index: int) -> tuple[int, int, int, int, int]:
        """Rewrite index records up to ``index`` from the data, starting at the newest record that checks out."""
        anchor = None
        for k in range(index - 1, max(self.ledger_begin_index, index - _REPAIR_LOOKBACK) - 1, -1):
            anchor = verified_entry(self._data, self._ilog, k, self.accept_zero_crc, verify_crc=False)
            if anchor is not None:
                break
        try:
            if anchor is None:
                anchor = decode_at(self._data, self._begin_pos, accept_zero_crc=self.accept_zero_crc,
                                   verify_crc=False)
        except CodecError as exc:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"cannot locate entry {index}: {exc}") from None
        rewritten = []

        def fix(e: Entry) -> str | None:
            conflict = self._ilog.check(e)
            if conflict:
                return conflict
            if not self._ilog.matches(e):
                self._ilog.write(e)
                rewritten.append(e.index)
            return None

        result = scan_forward(self._data, anchor.pos, anchor.index, -1, accept_zero_crc=self.accept_zero_crc,
                              on_entry=fix, check_tail=False, stop_after=index)
        if result.last_index != index:
            raise DLedgerError(ResponseCode.DISK_ERROR,
                               f"cannot read entry {index}: {result.problem or 'the data log ends before it'}")
        if rewritten:
            log.warn("mmap store {dir}: rewrote {n} damaged index records ({first}..{last}) from the data",
                     dir=str(self.member_dir), n=len(rewritten), first=rewritten[0], last=rewritten[-1])
            self._index_dirty_lo = min(self._index_dirty_lo, rewritten[0])
        self._refresh_tails()
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        return _unpack_index(f.mm, off - f.start)

    def get(self, index: int) -> Entry:
        """Entry ``index``, checked against its index record; DISK_ERROR rather than a damaged entry."""
        if index > self.ledger_end_index or index < self.ledger_begin_index or self.ledger_end_index < 0:
            raise base.index_out_of_range(index, self.ledger_begin_index, self.ledger_end_index)
        problem = "index record and data disagree"
        for attempt in (0, 1):
            rec = self._record(index) if attempt == 0 else self._repair_index(index)
            pos = rec[1]
            f = self._data.file_for(pos)
            if f is None:
                continue
            try:
                e = decode_entry(f.mm, pos - f.start, accept_zero_crc=self.accept_zero_crc, max_size=f.size)
            except CodecError as exc:
                problem = f"entry {index} at pos {pos} is damaged: {exc}"
                continue
            if (e.magic, e.pos, e.size, e.index, e.term) == rec:
                if e.channel or e.chain_crc:
                    raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} at pos {pos} has non-zero "
                                       f"reserved fields (damaged header)")
                return e
            if (e.index, e.pos, e.size) == (index, pos, rec[2]):
                raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} at pos {pos} says term {e.term} "
                                   f"magic {e.magic} but its index record says term {rec[4]} magic {rec[0]}")
        raise DLedgerError(ResponseCode.DISK_ERROR, problem)

    def get_range(self, begin_index: int, max_count: int, max_bytes: int) -> list[Entry]:
        return base.read_range(self.get, begin_index, self.ledger_end_index, max_count, max_bytes)

    def get_first_log_of_target_term(self, term: int, end_index: int) -> int:
        return base.first_index_of_term(lambda i: self._record(i)[4], term, self.ledger_begin_index,
                                        self.ledger_end_index, end_index)

    def update_committed_index(self, term: int, index: int) -> None:
        self.committed_index = base.next_committed_index(
            self.committed_index, term, self.member_state.curr_term, index,
            self.ledger_begin_index, self.ledger_end_index)

    # -- reads by position (IPositionReader) ----------------------------------
    def begin_position(self) -> int:
        """The first entry's ``pos`` (where the next entry goes when the log is empty)."""
        return self._begin_pos if self.ledger_end_index >= 0 else self._write_pos

    def committed_position(self) -> int:
        """Just past the last committed entry; :meth:`begin_position` when nothing here is committed."""
        if self.ledger_end_index < 0 or self.committed_index < self.ledger_begin_index:
            return self.begin_position()
        rec = self._record(self.committed_index)
        return rec[1] + rec[2]

    def read_at(self, pos: int, size: int) -> bytes:
        """Committed bytes of the data files, straight from the mappings (a read may span files)."""
        if not self._open:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"mmap store {self.member_dir} is not open")
        positions.check_read(pos, size, self.begin_position(), self.committed_position())
        out = bytearray()
        end = pos + size
        while pos < end:
            f = self._data.file_for(pos)
            if f is None:
                raise DLedgerError(ResponseCode.DISK_ERROR, f"no data file holds position {pos}")
            upto = min(end, f.end)
            out += f.mm[pos - f.start:upto - f.start]
            pos = upto
        return bytes(out)

    # -- durability ------------------------------------------------------------
    def flush(self) -> Deferred:
        """Make everything appended so far durable; fires with :attr:`flushed_index` (group commit)."""
        if not self._open:
            return succeed(self.flushed_index)
        return self._gc.request()

    def _dirty(self) -> bool:
        return (self._data_dirty_lo < self._write_pos or self._index_dirty_lo <= self.ledger_end_index
                or self._data.dir_dirty or self._index.dir_dirty)

    def _files_between(self, lst: MappedFileList, lo: int, hi: int) -> list[MappedFile]:
        files = lst.files
        if not files or hi <= lo:
            return []
        size = lst.file_size
        a = max(0, (lo - files[0].start) // size)
        b = min(len(files), (hi - 1 - files[0].start) // size + 1)
        return files[a:b]

    def _prepare_flush(self) -> FlushPlan:
        target = self.ledger_end_index
        data_lo, index_lo = self._data_dirty_lo, self._index_dirty_lo
        touched = self._files_between(self._data, data_lo, self._write_pos) + self._files_between(
            self._index, index_lo * INDEX_UNIT_SIZE, (target + 1) * INDEX_UNIT_SIZE)
        new = [f for lst in (self._data, self._index) for f in lst.files if f.new]
        dirs = [lst for lst in (self._data, self._index) if lst.dir_dirty or any(f.new for f in lst.files)]
        if not touched and not new and not dirs:
            return FlushPlan(target, None)
        self._data_dirty_lo, self._index_dirty_lo = self._write_pos, target + 1
        for f in new:
            f.new = False
        for lst in dirs:
            lst.dir_dirty = False
        synced = [f.fd for f in touched if f not in new]
        # One job for the round (data files first, then index files, new files, directories): one thread
        # hand-off per round.  Syncing data and index on two pool threads side by side made each round a
        # little shorter but cost a member more CPU in wake-ups than it saved (docs/benchmarks.md).
        work = functools.partial(diskio.flush_files, synced, [f.fd for f in new], [str(lst.directory) for lst in dirs])

        def failed(_failure) -> None:
            self._data_dirty_lo = min(self._data_dirty_lo, data_lo)
            self._index_dirty_lo = min(self._index_dirty_lo, index_lo)
            for f in new:
                f.new = True
            for lst in dirs:
                lst.dir_dirty = True

        return FlushPlan(target, work, done=self._flushed, failed=failed)

    def _flushed(self, _result) -> None:
        """After a round: drop our mapping of flushed, full pages so RSS does not grow with the log.

        In steps of ``_RELEASE_STEP`` bytes, not after every round: a busy member runs hundreds of
        rounds a second, each covering a few KiB, and a madvise per file per round is work for nothing.
        """
        if not self.release_flushed_pages:
            return
        data_to = min(self._data_dirty_lo, self._write_pos)
        if data_to - self._released_to >= _RELEASE_STEP:
            self._released_to = self._release(self._data, self._released_to, data_to)
        index_to = self._index_dirty_lo * INDEX_UNIT_SIZE
        if index_to - self._index_released_to >= _RELEASE_STEP:
            self._index_released_to = self._release(self._index, self._index_released_to, index_to)

    def _release(self, lst: MappedFileList, lo: int, upto: int) -> int:
        if not lst.files:
            return lo
        lo = max(lo, lst.start)
        for f in self._files_between(lst, lo, upto):
            f.release(max(lo, f.start) - f.start, min(upto, f.end) - f.start)
        return max(lo, upto - upto % mmap.PAGESIZE)

    # -- retention and disk space ----------------------------------------------
    def check_disk(self) -> float:
        """Measure disk usage and set or clear the disk-full state; returns the used fraction."""
        ratio = self._disk_usage()
        full = self.retention.disk_full(ratio)
        if full != self._disk_full:
            if full:
                log.error("mmap store {dir}: disk {ratio:.1%} used, over diskFullRatio; refusing appends",
                          dir=str(self.member_dir), ratio=ratio)
            else:
                log.info("mmap store {dir}: disk {ratio:.1%} used; appends resume", dir=str(self.member_dir),
                         ratio=ratio)
        self._disk_full, self._used_ratio = full, ratio
        return ratio

    def _first_index_from(self, k: int) -> int | None:
        """Index of the first entry in data file ``k`` or a later one (blank-only files skipped)."""
        for f in self._data.files[k:]:
            pos = self._begin_pos if f.start <= self._begin_pos < f.end else f.start
            try:
                return decode_at(self._data, pos, accept_zero_crc=self.accept_zero_crc, verify_crc=False).index
            except CodecError:
                continue
        return None

    def clean_expired(self, now: float) -> int:
        """Delete whole data files past retention (see :mod:`.retention`); returns how many entries went."""
        if not self._open:
            return 0
        used = self.check_disk()
        mode = self.retention.mode(now, used)
        if mode is CleanMode.NONE:
            return 0
        old_begin = self.ledger_begin_index
        files = 0
        while len(self._data.files) > 1:
            next_first = self._first_index_from(1)
            if next_first is None or next_first - 1 > self.committed_index:
                break
            expired = self.retention.expired(now, diskio.file_mtime(self._data.files[0].path))
            if not expired and not (mode is CleanMode.FORCE and self.retention.keep_forcing(used)):
                break
            self._data.remove_first(1, self._close_file)
            self.ledger_begin_index = next_first
            self._begin_pos = self._record(next_first)[1]
            files += 1
            if mode is CleanMode.FORCE:
                used = self._disk_usage()
        if not files:
            return 0
        self._released_to = max(self._released_to, self._data.start)
        self._ilog.drop_below(self.ledger_begin_index, self._close_file)
        self._refresh_tails()
        log.info("mmap store {dir}: retention ({mode}) removed {files} data files, entries [{a}, {b}]",
                 dir=str(self.member_dir), mode=mode.value, files=files, a=old_begin, b=self.ledger_begin_index - 1)
        self.check_disk()
        return self.ledger_begin_index - old_begin


_LEADER, _FOLLOWER, _PLACED = 0, 1, 2


class _Run:
    """Entries encoded back to back for one ``pwrite`` at ``pos`` (they all lie in one data file)."""

    __slots__ = ("pos", "end", "buf", "entries", "written", "src", "src_off")

    def __init__(self, pos: int):
        self.pos = self.end = pos
        self.buf = bytearray()
        self.entries: list[Entry] = []
        self.written = False  # a write was attempted (successful or not): never write it twice
        # Or the entries are already encoded: bytes [src_off, src_off + end - pos) of src.
        self.src: bytes | memoryview | None = None
        self.src_off = 0

    def add(self, e: Entry, body: bytes, size: int) -> None:
        self.buf += _pack_header(e.magic, size, e.index, e.term, e.pos, e.channel, e.chain_crc, e.body_crc,
                                 size - HEADER_SIZE)
        self.buf += body
        self.entries.append(e)
        self.end += size


def _one(append_batch, entry: Entry, *args) -> Entry:
    """A one-entry append as a batch of one, raising the entry's own error rather than a BatchAppendError."""
    try:
        return append_batch((entry,), *args)[0]
    except BatchAppendError as exc:
        raise exc.cause from None


def _disk_error(exc: OSError, index: int) -> DLedgerError:
    """A failed write as the error a leader or peer sees: DISK_FULL for ENOSPC, else DISK_ERROR."""
    code = ResponseCode.DISK_FULL if exc.errno == errno.ENOSPC else ResponseCode.DISK_ERROR
    return DLedgerError(code, f"cannot write entry {index}: {exc}")


def _log_store(config, member_state, **kwargs) -> MmapLogStore:
    """A member's log store: :meth:`MmapLogStore.from_config`, owned by the member (identity checked at startup)."""
    store = MmapLogStore.from_config(config, member_state, **kwargs)
    store.owner = ownership.Owner.from_config(config)
    return store


def _term_store(config) -> FileTermVoteStore:
    return FileTermVoteStore(config.member_dir, ownership.Owner.from_config(config))


@hookimpl
def dledger_store_types():
    return [StoreType(
        name="mmap",
        make_log_store=_log_store,
        make_term_store=_term_store,
        description="DLedger's memory-mapped data/index files (Java-compatible); currterm file",
    )]
