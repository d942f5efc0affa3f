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

:class:`MmapLogStore` is the store's state and its wiring (options, group commit, disk checks); what it
does is in its bases, one concern each, over that one state: :class:`.MmapAppendWriter` (appends,
truncation: the hot path, :mod:`.mmapwriter`), :class:`.MmapReader` (reads, :mod:`.mmapreader`),
:class:`.MmapLifeCycle` (the recovery glue: startup, checkpoints, timers, shutdown, :mod:`.mmaplifecycle`),
:class:`.MmapFileSet` (the open files, :mod:`.mmapfileset`), and :class:`.MmapDiskHealth`,
:class:`.MmapRepair`, :class:`.MmapDeletion`.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from dledger import diskio
from dledger.codes import ResponseCode
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
from dledger.store import ownership
from dledger.store.checkpoint import Checkpoint
from dledger.store.flushing import FlushTracker
from dledger.store.groupcommit import FlushPlan, GroupCommit
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFile, MappedFileList
from dledger.store.mmapdelete import MmapDeletion
from dledger.store.mmapfileset import MmapFileSet
from dledger.store.mmaphealth import MmapDiskHealth
from dledger.store.mmaplifecycle import MmapLifeCycle
from dledger.store.mmapoptions import MmapStoreOptions
from dledger.store.mmapreader import MmapReader
from dledger.store.mmaprepair import MmapRepair
from dledger.store.mmapwriter import MmapAppendWriter
from dledger.store.recent import RecentEntries
from dledger.store.recovery import Recovered
from dledger.store.retention import RetentionPolicy
from dledger.store.termvote import FileTermVoteStore
from dledger.store.writefail import WriteFailures

log = Logger()


@implementer(IPlainLogStore, IRetainingLogStore, IBatchLogStore, IPositionReader, IDiskHealth, IRepairableLogStore,
             ICompactingLogStore)
class MmapLogStore(MmapAppendWriter, MmapReader, MmapLifeCycle, MmapFileSet, MmapDiskHealth, MmapRepair,
                   MmapDeletion):
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
        #: Removed files still open, with the number of the last round started when each was removed.
        self._graveyard: list[tuple[int, MappedFile]] = []
        self._gc = GroupCommit(blocking_io, self._prepare_flush, after_round=self._bury, depth=options.flush_rounds)
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
    def flush_rounds(self) -> int:
        """How many flush rounds may run at once (``options.flush_rounds``): a caller may ask that many."""
        return self.options.flush_rounds

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
    def disk_full(self) -> bool:
        """Appends are refused for want of space: the disk is past ``diskFullRatio``, or a write found it full."""
        return self._disk_full or self._writes.code is ResponseCode.DISK_FULL

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
