"""The Broker facade: one per member with ``rocketmq.enabled``; what the broker port (and tests) call.

It ties the CommitLog on dledger (:mod:`~dledger_rocketmq.store.commitlog`), the
consume-queue dispatch (:mod:`~dledger_rocketmq.store.dispatch`), role switching
(:mod:`~dledger_rocketmq.broker.roles`) and the metadata (:mod:`~dledger_rocketmq.store.metadata`,
consumer offsets through the log, :mod:`~dledger_rocketmq.broker.sync`,
:mod:`~dledger_rocketmq.store.schedule`) together and is itself a Twisted service
of the member (added by the plugin's ``dledger_services`` hook): started once
the member serves (store recovered, metadata loaded), stopped before the
store closes (delayed delivery stopped, queues flushed, metadata persisted).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from twisted.application.service import MultiService, Service
from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger_rocketmq.broker.controls import ControlWriter
from dledger_rocketmq.broker.mixed import MixedGroup
from dledger_rocketmq.broker.queueflush import QueueFlusher
from dledger_rocketmq.broker.roles import MASTER, RoleManager
from dledger_rocketmq.broker.sync import SlaveSync, SyncKind
from dledger_rocketmq.common.batch import BatchItem, any_properties_contain, batch_records
from dledger_rocketmq.common.control import KIND_ACL_CONFIG, OffsetCommit
from dledger_rocketmq.common.message import (
    DEFAULT_MAX_MESSAGE_SIZE,
    PROPERTY_DELAY_TIME_LEVEL,
    Address,
    MessageRecord,
)
from dledger_rocketmq.store import oldlog
from dledger_rocketmq.store.commitlog import CommitLog, PutResult, PutStatus  # noqa: F401 (part of the facade's API)
from dledger_rocketmq.store.consumequeue import DEFAULT_FILE_SIZE
from dledger_rocketmq.store.dispatch import Dispatcher
from dledger_rocketmq.store.machine import BrokerMachine, MachineFeed
from dledger_rocketmq.store.metadata import BrokerMetadata
from dledger_rocketmq.store.schedule import DelayedDelivery, ScheduleQueueReader, to_schedule

log = Logger()
#: The property whose presence sends a batch through the DELAY rewrite (:meth:`Broker.put_batch`).
_DELAY_KEY = PROPERTY_DELAY_TIME_LEVEL.encode()


class GetStatus(Enum):
    """RocketMQ's GetMessageStatus (names as in Java)."""

    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"


@dataclass(frozen=True)
class GetResult:
    status: GetStatus
    records: list[bytes]
    next_begin_offset: int
    min_offset: int
    max_offset: int


def next_offset_correction(old: int, new: int, *, is_master: bool, offset_check_in_slave: bool = False) -> int:
    """RocketMQ's nextOffsetCorrection: a master (or a slave told to) corrects a bad offset; a slave keeps it."""
    return new if is_master or offset_check_in_slave else old


def queue_status(offset: int, min_offset: int, max_offset: int) -> tuple[GetStatus | None, int]:
    """The status of a pull at ``offset`` before reading, and the corrected next offset (None: read units).

    RocketMQ's DefaultMessageStore.getMessage: an empty queue (max 0) ->
    NO_MESSAGE_IN_QUEUE (next 0); below min -> OFFSET_TOO_SMALL (next min);
    exactly max -> OFFSET_OVERFLOW_ONE (next offset); past max ->
    OFFSET_OVERFLOW_BADLY (next max, also when min is 0: the golden 4.9.8
    pull at max+1 of a queue starting at 0 answered nextBeginOffset = max;
    going back to 0 would make the consumer read the whole queue again).
    """
    if max_offset == 0:
        return GetStatus.NO_MESSAGE_IN_QUEUE, 0
    if offset < min_offset:
        return GetStatus.OFFSET_TOO_SMALL, min_offset
    if offset == max_offset:
        return GetStatus.OFFSET_OVERFLOW_ONE, offset
    if offset > max_offset:
        return GetStatus.OFFSET_OVERFLOW_BADLY, max_offset
    return None, offset


def first_kept_offset(lo: int, hi: int, physical_at: Callable[[int], int], min_physical: int) -> int:
    """The first queue offset in ``[lo, hi)`` whose record is still in the CommitLog (``hi`` if none).

    A queue's units are in CommitLog order, so a binary search over
    ``physical_at(queue offset)`` finds where the records compaction (or
    retention) removed end: the queue's min offset as RocketMQ's
    ``correctMinOffset`` moves it after CommitLog files are deleted.
    """
    if hi <= lo or physical_at(lo) >= min_physical:
        return lo
    while lo < hi:
        mid = (lo + hi) // 2
        if physical_at(mid) < min_physical:
            lo = mid + 1
        else:
            hi = mid
    return lo


class Progress:
    """How far a member's broker is: the consume-queue dispatch *and* the metadata machine.

    What the role manager waits on before a leader becomes master (both
    caught up with the committed log: queues complete, tables complete).
    """

    def __init__(self, dispatcher: Dispatcher, machine: BrokerMachine) -> None:
        self.dispatcher = dispatcher
        self.machine = machine

    @property
    def dispatched_index(self) -> int:
        return min(self.dispatcher.dispatched_index, self.machine.applied_index)

    def caught_up(self, index: int) -> bool:
        return self.dispatcher.caught_up(index) and self.machine.caught_up(index)

    def lag(self) -> int:
        return self.dispatcher.lag()

    def wait_dispatched(self, index: int) -> Deferred:
        """Fires once both reached ``index``; cancelling it cancels both waits."""
        waits = [self.machine.wait_applied(index), self.dispatcher.wait_dispatched(index)]

        def cancel(_):
            for w in waits:
                if not w.called:
                    w.cancel()
        d = Deferred(cancel)
        left = [len(waits)]

        def one(result):
            if isinstance(result, Failure):
                if not d.called:
                    d.errback(result)
                return None
            left[0] -= 1
            if left[0] == 0 and not d.called:
                d.callback(self.dispatched_index)
            return None
        for w in waits:
            w.addBoth(one)
        return d


def tag_matches(tag_codes: set[int] | None, unit_tags_code: int) -> bool:
    """Consume-queue filtering by tag hash (RocketMQ's ExpressionMessageFilter): None or empty = ``*``."""
    return not tag_codes or unit_tags_code in tag_codes


@dataclass(frozen=True)
class BrokerOptions:
    """The plugin's options (see :mod:`dledger_rocketmq.plugin`), short names as in RocketMQ."""

    broker_name: str = "broker-a"
    cluster_name: str = "DefaultCluster"
    store_dir: str = ""
    store_host: str = "127.0.0.1:10911"
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    consume_queue_file_size: int = DEFAULT_FILE_SIZE
    master_wait_timeout: float = 30.0
    flush_interval: float = 1.0
    offset_check_in_slave: bool = False
    forward_sends: bool = True
    commitlog_dir: str = ""
    commitlog_file_size: int = 0
    persist_interval: float = 5.0
    listen: str = ""
    vip_listen: str = ""
    max_frame_size: int = 16 * 1024 * 1024
    namesrv_addr: str = ""
    register_period_ms: int = 30_000
    compressed_register: bool = False
    namesrv_listen: str = ""
    acl_enable: bool = False
    acl_file: str = ""
    allow_anonymous: bool = False
    tls_client_auth: bool = False
    access_key: str = ""
    secret_key_file: str = ""
    keep_java_compatible: bool = False


def parse_host(text: str) -> Address:
    """``ip:port`` (IPv6 as ``[ip]:port`` or ``ip:port`` with the last colon) -> Address."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"expected ip:port, got {text!r}")
    return Address(host.strip("[]"), int(port))


def delayed(record: MessageRecord) -> MessageRecord:
    """The record a send stores: :func:`~dledger_rocketmq.store.schedule.to_schedule` for a DELAY level > 0,
    else itself.

    A byte check first, so ordinary sends do not parse their properties.
    """
    if PROPERTY_DELAY_TIME_LEVEL.encode() not in record.properties:
        return record
    return to_schedule(record)


class Broker(MultiService):
    """The broker layer on one member (contract ``broker.Broker``).

    Its children: the metadata (``meta``, a :class:`BrokerMetadata` under
    ``<root>/config``: loaded when the broker is made, i.e. while the member
    is built at its start, persisted every ``persist_interval``
    and at stop) and, with a ``fetch``, the slave metadata sync.  ``fetch``
    (``fetch(SyncKind) -> Deferred`` of a GET_ALL_* body from the master) is
    what the broker port will provide; without it there is no sync, which
    consumer offsets do not need (they go through the log).  Delayed delivery
    runs while master.  Control entries are applied by the metadata state
    machine (``machine``, :mod:`~dledger_rocketmq.store.machine`); ``on_control``
    is the dispatcher's control callback (default: nothing).
    """

    name = "rocketmq-broker"

    def __init__(self, server, options: BrokerOptions | None = None, *,
                 on_control: Callable[[int, bytes], object] | None = None,
                 on_master: Callable[[Broker], object] | None = None,
                 on_slave: Callable[[Broker], object] | None = None,
                 fetch: Callable[[SyncKind], Deferred] | None = None,
                 io: diskio.BlockingIO | None = None):
        super().__init__()
        self.server = server
        self.options = options = options or BrokerOptions()
        root = options.store_dir or str(Path(server.config.store_base_dir) / f"rocketmq-{server.self_id}")
        self.root = Path(root.replace("{id}", server.self_id))
        self.store_host = parse_host(options.store_host)
        #: Where the metadata's blocking writes run: the store's BlockingIO (threaded under twistd, inline in
        #: in-process tests), as the core passes ``blocking_io`` to stores.
        self.io = io or getattr(server.store, "io", None) or diskio.INLINE
        self.meta = BrokerMetadata(self.root, cluster_name=options.cluster_name, broker_name=options.broker_name,
                                   clock=server.clock, io=self.io, persist_interval=options.persist_interval)
        # Loaded while the member is built (part of its start under twistd): a damaged file without a usable
        # .bak raises MetadataError, a dledger StoreError, so the start fails with its one line and no
        # traceback (a plugin service failing later, in startService, is logged with one by dledger.services).
        self.meta.load()
        self.meta.setServiceParent(self)
        #: The metadata as a state machine (name "rocketmq"): it applies the control entries, is snapshotted
        #: and restored; the member's StateMachines feeds it (registered by the plugin's dledger_state_machines
        #: hook), else the broker feeds it from the commit feed (:class:`~dledger_rocketmq.store.machine.MachineFeed`).
        self.machine = BrokerMachine(self.meta, queue_state=lambda index: self.queue_flush.queue_state(index),
                                     on_applied=self._metadata_applied, store=server.store)
        #: Control entries go to the machine; the dispatcher only indexes records (a custom ``on_control``
        #: still receives them, as before).
        self.dispatcher = Dispatcher(server, self.root, file_size=options.consume_queue_file_size,
                                     on_control=on_control or (lambda index, body: None))
        self.progress = Progress(self.dispatcher, self.machine)
        #: The consume queues' periodic flush and the flush a snapshot waits for (:mod:`.queueflush`).
        self.queue_flush = QueueFlusher(server, self.dispatcher, self.machine, options.flush_interval,
                                        running=lambda: self.running)
        self.dispatcher.on_rebase = self._queue_rebased
        self.roles = RoleManager(server, self.progress, rebuild=self._rebuild_table,
                                 on_master=lambda m: self._tell(self.master_callbacks, "master"),
                                 on_slave=lambda m: self._tell(self.slave_callbacks, "slave"),
                                 timeout=options.master_wait_timeout)
        old, divided = None, 0
        if options.commitlog_dir:  # a plain CommitLog to continue (seed 003): before the store opens
            old, divided = oldlog.prepare(server, options.commitlog_dir.replace("{id}", server.self_id),
                                          options.commitlog_file_size or server.config.mapped_file_size_for_entry_data)
            snapshots = getattr(server, "snapshots", None)
            if old is not None and snapshots is not None and hasattr(snapshots, "trailing"):
                # Like retention: no dledger file may go while old files exist (the first one's start is
                # dividedCommitlogOffset); snapshots are still taken, the log is just not compacted.
                snapshots.trailing = 1 << 62
                log.info("{id}: old CommitLog files exist: the log is not compacted after snapshots",
                         id=server.self_id)
        self.commitlog = CommitLog(server, store_host=self.store_host, max_message_size=options.max_message_size,
                                   divided=divided, old_reader=old, writable=self.roles.is_master)
        #: Called with the broker when it becomes master (start delayed delivery, stop the metadata sync) and
        #: when it becomes (or stays, on a master change) slave (start / restart the sync), in order.
        self.master_callbacks: list[Callable[[Broker], object]] = [on_master] if on_master else []
        self.slave_callbacks: list[Callable[[Broker], object]] = [on_slave] if on_slave else []
        self.sync: SlaveSync | None = None
        if fetch is not None:
            self.sync = SlaveSync(self.meta, fetch, clock=server.clock)
            self.sync.setServiceParent(self)
        #: Delayed delivery (made when first master: it reads the queues the dispatcher opens at start).
        self.delivery: DelayedDelivery | None = None
        #: Mixed with Java brokers (issue #27): plain records only, the term-start NOOP a record Java reads.
        self.mixed = MixedGroup(self, keep_java_compatible=options.keep_java_compatible)
        self.mixed.setServiceParent(self)
        server.noop_body = self.mixed.noop_body
        self.master_callbacks.insert(0, Broker._master_duties)
        self.slave_callbacks.insert(0, Broker._slave_duties)
        #: Called with (broker, ControlEntry) on every member after a topic or subscription-group change from
        #: the log changed its tables (e.g. to re-register with the name server, as RocketMQ does after a topic
        #: is created); one that raises is logged.
        self.metadata_callbacks: list[Callable[[Broker, object], object]] = []
        #: Offset commits and metadata changes as control entries through the log (:mod:`.controls`).
        self.controls = ControlWriter(self)
        #: (topic, queue id) -> ((queue min, log's min physical offset), first kept offset): see _kept_min.
        self._kept: dict[tuple[str, int], tuple[tuple[int, int], int]] = {}

    # -- service ---------------------------------------------------------------------------
    def fed_by_core(self) -> bool:
        """Whether the member's StateMachines (``server.snapshots``) feeds, snapshots and restores the machine."""
        machines = getattr(self.server, "snapshots", None)
        return machines is not None and self.machine in list(getattr(machines, "machines", ()))

    def startService(self):
        """Recover dispatch (records after the last indexed one), feed the machine unless the core does, start."""
        self.root.mkdir(parents=True, exist_ok=True)
        start = self.dispatcher.recover()
        fed = self.fed_by_core()
        log.info("{id}: broker {name} on {root}: dispatch resumes at index {i} (queues {q}); metadata applied up to "
                 "index {a}, {how}", id=self.server.self_id, name=self.options.broker_name,
                 root=str(self.root), i=start, q=len(self.dispatcher.queues.queues()), a=self.machine.applied_index,
                 how="state machine 'rocketmq' (snapshots)" if fed else "fed from the commit feed (no snapshots)")
        if self.sync is None:
            log.info("{id}: slave metadata sync is off until the broker port exists (consumer offsets go through "
                     "the log and do not need it)", id=self.server.self_id)
        if not fed:
            self.server.add_commit_listener(MachineFeed(self.machine))
        self.server.add_commit_listener(self.dispatcher)
        super().startService()
        self.queue_flush.start()

    def stopService(self):
        """Stop delayed delivery (puts in flight end), flush the queues, then the children (metadata persisted)."""
        Service.stopService(self)
        self.queue_flush.stop()
        self.roles.stop()
        self.dispatcher.fail_waiters(DLedgerError(ResponseCode.TERM_CHANGED, f"{self.server.self_id} is stopping"))
        self.machine.fail_waiters(DLedgerError(ResponseCode.TERM_CHANGED, f"{self.server.self_id} is stopping"))
        d = self._stop_delivery()
        if self.queue_flush.flushing is not None:  # a round still syncing on a pool thread: the last flush after it
            flushing = self.queue_flush.flushing
            d.addBoth(lambda _: flushing)

        def rest(_):
            try:
                self.dispatcher.close()  # flush, then close the queues' cached file descriptors
            except OSError as exc:
                log.error("{id}: consume-queue flush failed: {exc}", id=self.server.self_id, exc=exc)
            return MultiService.stopService(self)
        return d.addBoth(rest)

    # -- metadata ------------------------------------------------------------------------------
    def _on_control(self, index: int, body: bytes) -> object:
        """Apply a committed control entry once (the machine's :meth:`~BrokerMachine.apply_control`)."""
        return self.machine.apply_control(index, body)

    def _metadata_applied(self, index: int, entry) -> None:
        """A metadata entry changed the tables: say so for the ACL, tell ``metadata_callbacks`` otherwise."""
        if entry.kind == KIND_ACL_CONFIG:
            log.info("{id}: ACL from log index {i} in effect ({n} accounts, source {s})",
                     id=self.server.self_id, i=index, n=len(self.meta.acl.config.accounts), s=self.meta.acl.source)
            return
        for cb in list(self.metadata_callbacks):
            try:
                cb(self, entry)
            except Exception:
                log.failure("{id}: metadata callback {cb!r} failed", id=self.server.self_id, cb=cb)

    def _queue_rebased(self, topic: str, queue_id: int, next_offset: int) -> None:
        bases = self.machine.queue_bases
        bases[(topic, queue_id)] = max(bases.get((topic, queue_id), 0), next_offset)

    @property
    def offsets(self):
        """The consumer offset table (``meta.offsets``), fed from committed control entries on every member."""
        return self.meta.offsets

    def query_offset(self, group: str, topic: str, queue_id: int) -> int:
        """The group's committed offset in (topic, queue), -1 if none (RocketMQ's queryOffset)."""
        return self.meta.offsets.query(group, topic, queue_id)

    def commit_offsets(self, commits: Sequence[OffsetCommit], *, reset: bool = False) -> Deferred:
        """Commit consumer offsets as one control entry through the log (master only).

        Fires with the entry's log index once it is committed *and* applied to
        this member's table (a following :meth:`query_offset` sees it); fails
        with a :class:`DLedgerError` (NOT_LEADER on a slave or a leader that is
        not master yet; ControlError for bad commits).
        """
        return self.controls.commit_offsets(commits, reset=reset)

    def change_metadata(self, kind: int, configs: Sequence[dict]) -> Deferred:
        """Create/replace or delete topic or subscription-group configs through the log (master only).

        ``kind`` is a :mod:`~dledger_rocketmq.common.control` metadata kind (3-6).
        Fires with the entry's index once it is committed and applied here
        (``meta.topics`` / ``meta.groups`` show it); every member applies it
        in log order.  Fails as :meth:`commit_offsets` does.
        """
        return self.controls.change_metadata(kind, configs)

    def change_acl(self, config, source: str, file_source: str | None = None) -> Deferred:
        """Put ``config`` (an :class:`~dledger_rocketmq.common.acl.AclConfig`) in effect on every member, through the
        log (master only); fires with the entry's index once committed and applied here.  ``file_source``: the file
        this config comes from (None: an admin change, the last file applied stays the group's)."""
        return self.controls.change_acl(config, source, file_source)

    def create_topic(self, config: dict) -> Deferred:
        """Create a topic through the log (a send's auto-creation); concurrent calls for one name share one entry."""
        return self.controls.create_topic(config)

    def create_group(self, config: dict) -> Deferred:
        """Create a subscription group through the log (a heartbeat's auto-creation); one entry per name at a time."""
        return self.controls.create_group(config)

    def append_control(self, body: bytes, *, force: bool = False) -> Deferred:
        """Append one control entry (master only); fires with its index once committed and applied here.

        In a group mixed with Java brokers :meth:`MixedGroup.route_control` may apply it to this member's tables
        instead (fires with -1; slaves get them by the slave sync); ``force``: append anyway.
        """
        return self.controls.append(body, force=force)

    # -- role duties ------------------------------------------------------------------------------
    def _master_duties(self) -> None:
        """Become master: stop the metadata sync, start delayed delivery."""
        if self.sync is not None:
            self.sync.become_master()
        if not self.running:
            return
        if self.delivery is None:
            self.delivery = DelayedDelivery(ScheduleQueueReader(self.dispatcher.queues), self.get_message,
                                            self.put_as_is, self.meta.delay_offsets, clock=self.server.clock)
        self.delivery.offsets = self.meta.delay_offsets
        if not self.delivery.running:
            self.delivery.startService()

    def _slave_duties(self) -> None:
        """Become (or stay, on a master change) slave: stop delayed delivery, (re)start the sync."""
        self._stop_delivery()
        if self.sync is not None:
            master = self.server.state.leader_id
            if self.sync.syncing:
                self.sync.master_changed(master)
            else:
                self.sync.become_slave(master)

    def _stop_delivery(self) -> Deferred:
        if self.delivery is not None and self.delivery.running:
            return maybeDeferred(self.delivery.stopService)
        return succeed(None)

    def _tell(self, callbacks: list, what: str) -> None:
        """Run role callbacks; one that raises is logged and does not stop the others or the switch."""
        for cb in list(callbacks):
            try:
                cb(self)
            except Exception:
                log.failure("{id}: {what} callback {cb!r} failed", id=self.server.self_id, what=what, cb=cb)

    def _rebuild_table(self) -> None:
        """A new master's topic-queue table: the next offset of every consume queue (dispatch has caught up)."""
        queues = self.dispatcher.queues
        table = {f"{topic}-{qid}": nxt for (topic, qid), nxt in self.machine.queue_bases.items() if nxt > 0}
        for key, nxt in (queues.topic_queue_table() if queues is not None else {}).items():
            table[key] = max(table.get(key, 0), nxt)
        self.commitlog.reset_offsets(table)

    # -- role --------------------------------------------------------------------------------
    @property
    def role(self) -> str:
        """"MASTER" once switched (see :mod:`dledger_rocketmq.broker.roles`), else "SLAVE"."""
        return MASTER if self.roles.is_master() else "SLAVE"

    @property
    def broker_id(self) -> int:
        return self.roles.broker_id if self.roles.is_master() else self.roles.slave_id

    # -- puts ---------------------------------------------------------------------------------
    def put_message(self, msg: MessageRecord) -> Deferred:
        """Store one message; fires with a :class:`PutResult` (SERVICE_NOT_AVAILABLE on a slave).

        A message with a DELAY level > 0 is stored in SCHEDULE_TOPIC_XXXX (:func:`delayed`).
        """
        return self.commitlog.put([delayed(msg)])

    def put_gathered(self, msg: MessageRecord, sink, token) -> bool:
        """:meth:`put_message` for the broker port's lean path: held for the read's one store batch and answered
        by ``sink.put_answered(token, result)`` (:meth:`.CommitLog.put_gathered`, no Deferred); False if no
        read is being gathered (then :meth:`put_message`)."""
        return self.commitlog.put_gathered(delayed(msg), sink, token)

    def put_messages(self, msgs: Sequence[MessageRecord]) -> Deferred:
        """Store a batch as one dledger batch with consecutive queue offsets; fires with a :class:`PutResult`."""
        return self.commitlog.put([delayed(m) for m in msgs])

    def put_batch(self, template: MessageRecord, items: Sequence) -> Deferred:
        """``put_messages(batch_records(items, template))``, encoded a batch at a time (SEND_BATCH_MESSAGE).

        ``items``: BatchItems or :func:`~dledger_rocketmq.common.batch.batch_views`.
        A batch where a message carries a DELAY level (stock clients refuse to
        send one) takes :meth:`put_messages`, which rewrites each such message.
        """
        if any_properties_contain(items, _DELAY_KEY):
            return self.put_messages(batch_records([BatchItem(bytes(b), bytes(p), f) for b, p, f in items], template))
        return self.commitlog.put_batch(template, items)

    def put_as_is(self, msg: MessageRecord) -> Deferred:
        """Store a record without the delay rewrite (delayed delivery's re-put: its DELAY property stays).

        Offsets, store host and store time are stamped as for any put.
        """
        return self.commitlog.put([msg])

    # -- reads ------------------------------------------------------------------------------------
    def _queue(self, topic: str, queue_id: int):
        queues = self.dispatcher.queues
        return queues.find(topic, queue_id) if queues is not None else None

    def max_offset(self, topic: str, queue_id: int) -> int:
        """The queue's next offset; for a queue this member has no record of, its offset in the snapshot restored."""
        q = self._queue(topic, queue_id)
        if q is None or q.empty:
            base = self.machine.queue_bases.get((topic, queue_id), 0)
            return max(base, q.max_offset if q is not None else 0)
        return q.max_offset

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first offset still readable: units whose record compaction (or retention) removed do not count."""
        q = self._queue(topic, queue_id)
        if q is None or q.empty:
            return self.max_offset(topic, queue_id)
        return self._kept_min(q)

    def _kept_min(self, q) -> int:
        """:func:`first_kept_offset` of queue ``q``, remembered until the queue's min or the log's begin moves."""
        lo, hi = q.min_offset, q.max_offset
        min_physical = self.commitlog.min_physical_offset()
        key = (q.topic, q.queue_id)
        known = self._kept.get(key)
        if known is not None and known[0] == (lo, min_physical) and known[1] < hi:
            return known[1]

        def physical_at(offset: int) -> int:
            unit = q.get(offset)
            return -1 if unit is None or unit.is_filler else unit.physical_offset
        kept = first_kept_offset(lo, hi, physical_at, min_physical)
        if len(self._kept) > 65536:
            self._kept.clear()
        self._kept[key] = ((lo, min_physical), kept)
        return kept

    def get_message(self, phys_offset: int, size: int) -> bytes:
        """Raw committed record bytes at a physical offset (RocketMQ's ``getMessage(offset, size)``)."""
        return self.commitlog.get_message(phys_offset, size)

    def get_messages(self, group: str, topic: str, queue_id: int, offset: int, max_nums: int,
                     tag_codes: set[int] | Sequence[int] | None = None) -> GetResult:
        """Committed records of a queue from ``offset`` with RocketMQ's GetMessageStatus semantics.

        ``tag_codes``: tag hashes to keep (``tag_hash(tag)``), None for all.
        Units are scanned up to max(800, max_nums) per call, like RocketMQ.
        """
        q = self._queue(topic, queue_id)
        is_master = self.roles.is_master()
        if q is None and (topic, queue_id) in self.machine.queue_bases:  # no record here since the snapshot
            base = self.machine.queue_bases[(topic, queue_id)]
            status, nxt = queue_status(offset, base, base)
            nxt = next_offset_correction(offset, nxt, is_master=is_master,
                                         offset_check_in_slave=self.options.offset_check_in_slave)
            return GetResult(status or GetStatus.NO_MESSAGE_IN_QUEUE, [], nxt, base, base)
        if q is None:
            return GetResult(GetStatus.NO_MATCHED_LOGIC_QUEUE,
                             [], next_offset_correction(offset, 0, is_master=is_master,
                                                        offset_check_in_slave=self.options.offset_check_in_slave),
                             0, 0)
        lo, hi = self._kept_min(q), q.max_offset
        status, nxt = queue_status(offset, lo, hi)
        if status is not None:
            nxt = next_offset_correction(offset, nxt, is_master=is_master,
                                         offset_check_in_slave=self.options.offset_check_in_slave)
            return GetResult(status, [], nxt, lo, hi)
        codes = set(tag_codes) if tag_codes else None
        scan = max(16000 // 20, max_nums)
        records: list[bytes] = []
        scanned = 0
        min_phys = self.commitlog.min_physical_offset()
        for qoff, unit in q.read(offset, scan):
            scanned = qoff - offset + 1
            if unit.is_filler or unit.physical_offset < min_phys:
                continue
            if not tag_matches(codes, unit.tags_code):
                continue
            try:
                records.append(self.get_message(unit.physical_offset, unit.size))
            except DLedgerError:
                scanned -= 1  # not readable (yet): stop before it, the consumer retries from this offset
                break
            if len(records) >= max_nums:
                break
        nxt = offset + scanned
        if records:
            status = GetStatus.FOUND
        else:
            status = GetStatus.NO_MATCHED_MESSAGE
        return GetResult(status, records, nxt, lo, hi)

    def lag(self) -> int:
        """Committed bytes not yet dispatched into consume queues."""
        return self.dispatcher.lag()
