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

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.entry import (
    HEADER,
    HEADER_SIZE,
    INDEX_RECORD,
    INDEX_UNIT_SIZE,
    MIN_BLANK_LEN,
    Entry,
    EntryList,
    body_crc,
    encode_blank,
    encoded_size,
)
from dledger.errors import BatchAppendError, DLedgerError, StoreError
from dledger.hookspecs import hookimpl
from dledger.interfaces import (
    IBatchLogStore,
    ICompactingLogStore,
    IDiskHealth,
    IPlainLogStore,
    IPositionReader,
    IRepairableLogStore,
    IRetainingLogStore,
)
from dledger.plugin_types import StoreType
from dledger.ratelog import RateLimitedLog
from dledger.store import base, ownership, positions, runplan
from dledger.store.base import TruncateAction
from dledger.store.checkpoint import Checkpoint, checkpoint_after_index, read_checkpoint, write_checkpoint
from dledger.store.flushing import FlushTracker, index_sync_due
from dledger.store.groupcommit import FlushPlan, GroupCommit
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFile, MappedFileList
from dledger.store.mmapdelete import MmapDeletion
from dledger.store.mmaphealth import MmapDiskHealth
from dledger.store.mmapoptions import MmapStoreOptions
from dledger.store.mmaprepair import MmapRepair
from dledger.store.recent import RecentEntries
from dledger.store.recovery import Recovered, recover, repair_index
from dledger.store.retention import RetentionPolicy
from dledger.store.termvote import FileTermVoteStore
from dledger.store.writefail import WriteFailures

log = Logger()

_write_at = diskio.write_at
_pack_header_into = HEADER.pack_into
_pack_index = INDEX_RECORD.pack_into
_unpack_index = INDEX_RECORD.unpack_from


@implementer(IPlainLogStore, IRetainingLogStore, IBatchLogStore, IPositionReader, IDiskHealth, IRepairableLogStore,
             ICompactingLogStore)
class MmapLogStore(MmapDiskHealth, MmapRepair, MmapDeletion):
    """Data and index files under ``member_dir``; see the module docstring.

    ``clock`` (an ``IReactorTime``) drives the periodic checkpoint, the
    ``async`` flush and retention/disk checks; without one nothing runs by
    itself (offline tools).  ``disk_usage()`` returns the used fraction of
    the disk (tests pass their own).  What the store is configured with is
    one :class:`MmapStoreOptions` value, :attr:`options`.
    """

    def __init__(self, member_dir: str | Path, member_state, options: MmapStoreOptions | None = None, *,
                 clock=None, blocking_io: diskio.BlockingIO = diskio.INLINE, disk_usage=None, **settings):
        """``options`` (default: :class:`MmapStoreOptions`'s defaults), with ``settings`` (its fields, as
        keywords) replacing some of them; ``clock``, ``blocking_io`` and ``disk_usage`` are what it is wired to."""
        options = options or MmapStoreOptions()
        if settings:
            options = dataclasses.replace(options, **settings)
        self.options = options
        self.member_dir = Path(member_dir)
        self.member_state = member_state
        # Read on every append: plain attributes rather than ``self.options.x``.
        self.data_file_size = options.data_file_size
        self.max_entry_size = options.max_entry_size
        self.accept_zero_crc = options.accept_zero_crc
        self.clock = clock
        self.io = blocking_io
        self._disk_usage = disk_usage or (lambda: diskio.disk_used_ratio(self.member_dir))
        self.ledger_begin_index = -1
        self.ledger_end_index = -1
        self.ledger_end_term = -1
        self.committed_index = -1
        self.recovered: Recovered | None = None
        self._begin_pos = -1
        self._write_pos = 0
        self._initial_pos = 0
        #: Retention deletes no entry at or above this index (None: no such limit).  A member with state
        #: machines sets it past its newest snapshot, so retention never takes what no snapshot holds.
        self.retention_floor: int | None = None
        self.snapshot_base = (-1, -1)
        #: The newest entries as written, for reads of the tail (the commit feed's, a follower's pushes).
        self._recent = RecentEntries()
        self._data: MappedFileList | None = None
        self._index: MappedFileList | None = None
        self._ilog: IndexLog | None = None
        self._graveyard: list[MappedFile] = []
        self._gc = GroupCommit(blocking_io, self._prepare_flush, after_round=self._bury)
        self._flushing: FlushTracker | None = None
        self._disk_full = False
        self._used_ratio = 0.0
        #: A failed write (ENOSPC, EIO ...) and until when appends are refused without trying (:mod:`.writefail`).
        self._writes = WriteFailures()
        self._write_log = RateLimitedLog(log, clock if clock is not None else _NO_CLOCK, interval=60.0)
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
        return cls(config.member_dir, member_state, MmapStoreOptions.from_config(config), clock=clock,
                   blocking_io=blocking_io or diskio.INLINE, disk_usage=disk_usage)

    # -- state -----------------------------------------------------------------
    @property
    def flushed_index(self) -> int:
        return min(self._gc.flushed_index, self.ledger_end_index)

    @property
    def recent_entries(self) -> RecentEntries:
        """The newest entries, held in memory as appended (cut where the log is cut; see :mod:`.recent`).

        A leader pushes from them instead of keeping a copy of every entry it appends.
        """
        return self._recent

    @property
    def flush_stats(self):
        """Latency and reactor-blocked time of recent flush rounds (:class:`.groupcommit.FlushStats`)."""
        return self._gc.stats

    @property
    def retention(self) -> RetentionPolicy:
        """When old data files go and when the disk counts as full (``options.retention``).

        It may be replaced while the store runs (the RocketMQ plugin keeps every data file while an
        old CommitLog exists); the next retention check uses the new policy.
        """
        return self.options.retention

    @retention.setter
    def retention(self, policy: RetentionPolicy) -> None:
        self.options = dataclasses.replace(self.options, retention=policy)

    @property
    def closing_files(self) -> tuple[MappedFile, ...]:
        """Removed files still open because the running flush round may be syncing their descriptors.

        Read-only, for tests and diagnostics: they are closed when that round ends (or at shutdown).
        """
        return tuple(self._graveyard)

    @property
    def disk_full(self) -> bool:
        """Appends are refused for want of space: the disk is past ``diskFullRatio``, or a write found it full."""
        return self._disk_full or self._writes.code is ResponseCode.DISK_FULL

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
        index = MappedFileList(self.member_dir / "index", self.options.index_file_size, kind="index")
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
                          closer=self._close_file, full=self.options.full_verify,
                          truncate_damaged=self.options.truncate_damaged)
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
        self._recent.clear()
        self._write_pos = rec.write_pos if rec.end >= 0 else (0 if data.files else self._initial_pos)
        self.committed_index = rec.committed
        self.snapshot_base, base_pos = self._read_base()
        if rec.end < 0 and self.snapshot_base[0] >= 0:  # empty with a base: the log continues after a snapshot
            base_index, base_term = self.snapshot_base
            self.ledger_begin_index, self.ledger_end_index = base_index + 1, base_index
            self.ledger_end_term = base_term
            self._write_pos = self._begin_pos = base_pos
            self.committed_index = base_index
        self._refresh_tails()
        self._make_recovery_durable(rec, checkpoint)
        claimed = checkpoint.committed_index if checkpoint is not None else -1
        if rec.forced and checkpoint is not None and checkpoint.committed_index > rec.committed:
            # Never claim, even after a crash right now, a committed index the log no longer holds.
            checkpoint = Checkpoint(end_index=rec.end, committed_index=rec.committed)
            write_checkpoint(self.member_dir, checkpoint)
        self._gc.flushed_index = self.ledger_end_index
        self._flushing = FlushTracker(data, index, lambda: self._write_pos,
                                      release_pages=self.options.release_flushed_pages)
        self._flushing.restart(self._write_pos, self.ledger_end_index)
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
        self._recent.clear()
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

        every(self.options.checkpoint_interval_ms, self._periodic_checkpoint)
        if self.options.flush_policy == "async":
            every(self.options.flush_interval_ms, self._periodic_flush)
        every(self.options.clean_interval_ms, self._periodic_clean)

    def _periodic_flush(self):
        if self._gc.busy or not self._flushing.dirty(self._write_pos, self.ledger_end_index):
            return None
        return self._gc.request().addErrback(self._background_failed, "periodic flush")

    def _periodic_checkpoint(self) -> None:
        if self._checkpoint_running is None:
            self._write_checkpoint(force=False).addErrback(self._background_failed, "checkpoint write")

    def _background_failed(self, failure, what: str) -> None:
        """A timer's write failed: an OSError is one line naming the directory and free space (once a minute).

        A full disk fails the checkpoint every ``checkPointInterval``: a traceback each time told an operator
        nothing more and buried everything else.  Anything but an OSError is a bug: logged with its traceback.
        """
        exc = failure.value
        if not isinstance(exc, OSError):
            log.failure("mmap store {dir}: {what} failed", failure, dir=str(self.member_dir), what=what)
            return
        self._write_log.error((what, exc.errno), "mmap store {dir}: {what} failed: {why}; {free} free on its "
                              "disk (tried again every interval)", dir=str(self.member_dir), what=what,
                              why=exc.strerror or exc, free=diskio.format_bytes(diskio.free_bytes(self.member_dir)))

    def _periodic_clean(self) -> None:
        try:
            self.clean_expired(self.clock.seconds())
        except Exception:
            log.failure("retention check failed")

    def _current_checkpoint(self) -> Checkpoint:
        if self.ledger_begin_index > self.ledger_end_index:  # empty with a base: snapshot_base says it all
            return Checkpoint(end_index=-1, committed_index=-1)
        flushed = self.flushed_index
        return Checkpoint(end_index=flushed, committed_index=min(self.committed_index, flushed))

    def _write_checkpoint(self, *, force: bool) -> Deferred:
        """Replace the checkpoint, after syncing the index records it vouches for (flush rounds sync only data)."""
        ck = self._current_checkpoint()
        if not force and ck == self._checkpoint_written and not index_sync_due(self._flushing.index_lo,
                                                                                 ck.end_index):
            return succeed(None)
        index_fds, undo = self._flushing.index_sync(ck.end_index)
        d = self.io.run(checkpoint_after_index, index_fds, self.member_dir, ck)
        self._checkpoint_running = d

        def written(result):
            self._checkpoint_running = None
            self._checkpoint_written = ck
            return result

        def failed(failure):
            self._checkpoint_running = None
            undo()
            return failure

        d.addCallbacks(written, failed)
        return d

    # -- appends ---------------------------------------------------------------
    def _set_data_tail(self, f: MappedFile | None) -> None:
        """Cache the last data file for the append path (``_dlimit``: last byte an entry may end at)."""
        if f is None:
            self._dfd, self._dstart, self._dlimit = -1, 0, -1
        else:
            self._dfd, self._dstart, self._dlimit = f.fd, f.start, runplan.run_limit(f.end)

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
        if self._writes.current is not None and self.clock is not None:
            refused = self._writes.refusal(self.clock.seconds())
            if refused is not None:  # a write failed a moment ago: do not hammer the disk (see .writefail)
                raise BatchAppendError(refused, [])
        stored: list[Entry] = []
        index = self.ledger_end_index + 1
        # A push's entries arrive encoded (checked by their CRCs): write those bytes instead of encoding again.
        known = entries.known_section() if mode == _FOLLOWER and type(entries) is EntryList else None
        # Otherwise they are encoded into a buffer sized for them at once, as far as the current data file
        # takes them (a run never crosses a file; the next run gets a buffer for the rest).
        room = self._dlimit - self._write_pos
        need = 0 if known is not None or room <= 0 else min(encoded_size(entries), room)
        run = _Run(self._write_pos, need)
        run.src = known[0] if known is not None else None
        crc_checked = known is not None and entries.crc_checked  # the bytes written are the ones checked
        into = getattr(seal, "into", None)  # the guard's seal that encodes into the run's buffer (one copy less)
        src_off = 0
        todo = entries
        if crc_checked and not self._disk_full:
            # A decoded push its decode found to be one plain run: the follower's checks made on the run as a
            # whole, its bytes written as they came.  Anything else goes entry by entry.
            end = base.follower_run_end(entries, index, run.pos, self._dlimit, self.data_file_size,
                                        self.max_entry_size)
            if end is not None:
                run.entries.extend(entries)
                run.end = end
                todo = ()
        try:
            for entry in todo:
                body = entry.body
                size = HEADER_SIZE + len(body)
                wp = run.end
                if mode == _LEADER:
                    if self._disk_full:
                        self._refuse_disk_full()
                    if entry.channel or entry.chain_crc:
                        base.check_reserved_fields(entry)
                    if wp + size > self._dlimit or size > self.max_entry_size:  # runplan.extends_run, negated, inline
                        run = self._next_run(run, stored, size, None, _left(entries, stored, run))
                        wp = run.end
                    if into is not None:
                        e = into(entry, index, wp, run.room(size), wp - run.pos)
                        run.entries.append(e)
                        run.end += size
                        index += 1
                        continue
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
                                                  self.accept_zero_crc, crc_checked)
                        if self._disk_full:
                            self._refuse_disk_full()
                    if e.pos != wp or e.pos + size > self._dlimit:
                        left = 0 if known is not None else _left(entries, stored, run)
                        run = self._next_run(run, stored, size, e, left)
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
            try:
                if not run.written:  # the entries before the failing one stay appended
                    try:
                        self._write_run(run, stored)
                    except DLedgerError as write_error:
                        error = write_error
                if isinstance(error, DLedgerError):
                    raise BatchAppendError(error, stored) from None
                raise  # a failing hook propagates as it is
            finally:
                # ``error`` -> its traceback -> this frame -> ``error`` is a reference cycle holding the
                # append's entries (a follower's whole push): only the cyclic collector, which a member runs
                # rarely (tap.tune_gc), would free it.  A follower refusing every push on a full disk grew to
                # about 1 GB that way (issue 21).
                del error
        return stored

    def _next_run(self, run: _Run, stored: list[Entry], size: int, placed: Entry | None = None,
                  capacity: int = 0) -> _Run:
        """Write ``run``, then start the run :func:`.runplan.next_run` plans for an entry of ``size`` bytes.

        ``placed`` is an entry whose position is fixed already (follower, truncate). The plan is made
        first; the run before is written whatever it says (the batch rule: earlier entries stay).
        ``capacity``: the bytes the new run's buffer is made for (the entries left; at most one file holds).
        """
        data = self._data
        plan = runplan.next_run(run.end, size, file_size=self.data_file_size, max_size=self.max_entry_size,
                                files_start=data.start, files_end=data.end,
                                fixed_pos=None if placed is None else placed.pos,
                                index=-1 if placed is None else placed.index)
        self._write_run(run, stored)
        return _Run(self._start_run(plan), min(capacity, self.data_file_size))

    def _write_run(self, run: _Run, stored: list[Entry]) -> None:
        """Write a run's entries with one pwrite, then their index records; only then do they count as stored."""
        run.written = True
        entries = run.entries
        if not entries:
            return
        data = run.written_bytes() if run.src is None else run.src[run.src_off:run.src_off + run.end - run.pos]
        try:
            _write_at(self._dfd, data, run.pos - self._dstart)
        except OSError as exc:
            raise self._write_failed(exc, f"cannot write entries {entries[0].index}..{entries[-1].index} at "
                                          f"position {run.pos}") from None
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
        # A leader's run buffer (never changed again) is the encoding of these entries: pushes cut theirs from it.
        self._recent.extend(entries, run.end - run.pos, data if run.src is None else None)
        stored.extend(entries)
        if self._writes.current is not None:
            self._writes_resumed()

    def _start_run(self, plan: runplan.NextRun) -> int:
        """Do what ``plan`` says before its run: refuse on a full disk before a new file, blank marker, new file."""
        if plan.new_file is not None:
            self.check_disk()
            if self._disk_full:
                self._refuse_disk_full()
        if plan.blank_at is not None:
            f = self._data.file_for(plan.blank_at)
            try:
                _write_at(f.fd, encode_blank(plan.blank), plan.blank_at - f.start)
            except OSError as exc:
                raise self._write_failed(exc, f"cannot write the blank marker at position {plan.blank_at}") from None
            self._flushing.mark_data(plan.blank_at)
        if plan.new_file is None:
            f = self._data.file_for(plan.pos)
        else:
            f = self._create(self._data, plan.new_file)
        self._set_data_tail(f)
        self._write_pos = plan.pos
        return plan.pos

    def _index_room(self, index: int) -> int:
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        if f is None:
            start = off - off % self.options.index_file_size
            if self._index.files and start != self._index.end:
                raise StoreError(f"index record {index} does not follow the index files in {self._index.directory}")
            f = self._create(self._index, start)
        self._set_index_tail(f)
        return off - f.start

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
        self._recent.drop_after(keep)
        self._write_pos = new_wp
        self._flushing.mark_data(new_wp)
        self._flushing.mark_index(keep + 1)
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
        self._recent.clear()
        self._write_pos = entry.pos - rel
        self._create(self._data, self._write_pos)
        self._refresh_tails()
        self._write_pos = entry.pos
        _one(self._append, entry, _PLACED)
        self._begin_pos = entry.pos
        self.committed_index = entry.index - 1
        self._gc.cap(entry.index - 1)
        self._flushing.restart(entry.pos, entry.index - 1)

    # -- reads -----------------------------------------------------------------
    def _record(self, index: int) -> tuple[int, int, int, int, int]:
        """Index record ``index`` (magic, pos, size, index, term), repaired from the data if it is damaged."""
        rec = self._ilog.read(index)
        return rec if rec is not None else self._repair_index(index)

    def _repair_index(self, index: int) -> tuple[int, int, int, int, int]:
        """Rewrite index records up to ``index`` from the data (see :func:`.recovery.repair_index`)."""
        rewritten = repair_index(self._data, self._ilog, index, begin=self.ledger_begin_index,
                                 begin_pos=self._begin_pos, accept_zero_crc=self.accept_zero_crc)
        if rewritten:
            log.warn("mmap store {dir}: rewrote {n} damaged index records ({first}..{last}) from the data",
                     dir=str(self.member_dir), n=len(rewritten), first=rewritten[0], last=rewritten[-1])
            self._flushing.mark_index(rewritten[0])
        self._refresh_tails()
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        return _unpack_index(f.mm, off - f.start)

    def get(self, index: int) -> Entry:
        """Entry ``index``, checked against its index record; DISK_ERROR rather than a damaged entry."""
        if index > self.ledger_end_index or index < self.ledger_begin_index or self.ledger_end_index < 0:
            raise base.index_out_of_range(index, self.ledger_begin_index, self.ledger_end_index)
        held = self._recent.get(index)
        if held is not None:
            return held
        entry = self.check_entry(index)
        self._flushing.note_read(entry.pos, entry.pos + HEADER_SIZE + len(entry.body), index)
        return entry

    def get_range(self, begin_index: int, max_count: int, max_bytes: int) -> list[Entry]:
        if self.ledger_begin_index <= begin_index <= self.ledger_end_index:
            held = self._recent.get_range(begin_index, max_count, max_bytes)
            if held is not None:
                return held
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
        self._flushing.note_read(end - size, end)
        return bytes(out)

    # -- durability ------------------------------------------------------------
    def flush(self) -> Deferred:
        """Make everything appended so far durable; fires with :attr:`flushed_index` (group commit)."""
        if not self._open:
            return succeed(self.flushed_index)
        return self._gc.request()

    def _prepare_flush(self) -> FlushPlan:
        """The next group-commit round (see :meth:`.flushing.FlushTracker.prepare`)."""
        return self._flushing.prepare(self._write_pos, self.ledger_end_index)

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


_LEADER, _FOLLOWER, _PLACED = 0, 1, 2


def _left(entries: Sequence[Entry], stored: list[Entry], run: _Run) -> int:
    """Encoded bytes of the entries of an append not yet in ``stored`` or ``run`` (the next run's buffer)."""
    return encoded_size(entries[len(stored) + len(run.entries):])


class _Run:
    """Entries encoded back to back for one ``pwrite`` at ``pos`` (they all lie in one data file).

    The buffer is allocated once at the size the append's entries need (``capacity``) and written
    through ``view`` at offsets: growing one ``bytearray`` entry by entry re-allocates it every 12.5 %,
    and each re-allocation may copy the whole buffer (about 8x a 1 MiB run's bytes, measured on a
    RocketMQ master).  Bytes past ``end - pos`` are not part of the run (a failed entry may have left
    some there).
    """

    __slots__ = ("pos", "end", "buf", "view", "entries", "written", "src", "src_off")

    def __init__(self, pos: int, capacity: int = 0):
        self.pos = self.end = pos
        self.buf = bytearray(capacity)
        self.view = memoryview(self.buf)
        self.entries: list[Entry] = []
        self.written = False  # a write was attempted (successful or not): never write it twice
        # Or the entries are already encoded: bytes [src_off, src_off + end - pos) of src.
        self.src: bytes | memoryview | None = None
        self.src_off = 0

    def room(self, size: int) -> memoryview:
        """The buffer's view, with room for ``size`` more bytes (a larger buffer if the estimate fell short)."""
        used = self.end - self.pos
        if used + size > len(self.buf):
            buf = bytearray(max(used + size, 2 * len(self.buf)))
            view = memoryview(buf)
            view[:used] = self.view[:used]
            self.buf, self.view = buf, view
        return self.view

    def add(self, e: Entry, body: bytes, size: int) -> None:
        off = self.end - self.pos
        view = self.room(size)
        _pack_header_into(view, off, e.magic, size, e.index, e.term, e.pos, e.channel, e.chain_crc, e.body_crc,
                          size - HEADER_SIZE)
        view[off + HEADER_SIZE:off + size] = body
        self.entries.append(e)
        self.end += size

    def written_bytes(self) -> memoryview:
        """The encoded entries of the run (the part of the buffer in use)."""
        return self.view[:self.end - self.pos]


def _one(append_batch, entry: Entry, *args) -> Entry:
    """A one-entry append as a batch of one, raising the entry's own error rather than a BatchAppendError."""
    try:
        return append_batch((entry,), *args)[0]
    except BatchAppendError as exc:
        raise exc.cause from None


class _NoClock:
    """The time of a store built without a clock (offline tools): always 0, so a line per key is logged once."""

    @staticmethod
    def seconds() -> float:
        return 0.0


_NO_CLOCK = _NoClock()


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
