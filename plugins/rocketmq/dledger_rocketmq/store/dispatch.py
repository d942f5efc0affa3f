"""Consume-queue dispatch from dledger's commit feed (RocketMQ's ReputMessageService without its polling loop).

The :class:`Dispatcher` is an ``ICommitListener``: dledger hands it committed
entries in log order (NOOPs left out) as the committed index moves.  Each
entry body is one of (contract): a RocketMQ record -> its consume queue; a
control entry (``b"RMQC"``) -> ``on_control(index, body)``; anything else ->
skipped with a rate-limited warning.  Only committed entries ever reach a
queue, so a consumer can never see a message a leader change could take back.

Recovery (:meth:`Dispatcher.recover`, at service start, store recovered):

* queue files that do not open (bad names, holes, damaged units) are
  deleted and rebuilt from the log (from its first entry);
* units whose record is not wholly below the log's committed position are
  dropped (``truncate_physical``; a member that lost unflushed data);
* dispatch resumes after the entry holding the last indexed record (its
  index read from the entry header at ``physical offset - 48``), or at the
  log's first entry; records already indexed are replays the queues skip.
  Control entries go to ``on_control`` (the broker's metadata state machine
  applies them itself, :mod:`dledger_rocketmq.store.machine`);
* a queue whose units all index records the log no longer holds (compacted
  away, or the log reset to an installed snapshot) restarts at its next
  record (:meth:`Dispatcher._after_gap`).

Queue appends are page-cache writes done inline on the reactor thread (a
unit is 20 bytes): units are buffered per queue and written once
``drain_after`` entries were delivered since the last write (a commit-feed
delivery is a push's worth, ~30 entries: per delivery, the pwrites of the
queues it touched cost as much as decoding its records), one pwrite per
queue file, through file descriptors kept open (a bounded LRU,
``max_open_files``); every read of a queue, every flush and the stop write
them first, so readers and fsyncs see every dispatched unit.  fsyncs happen on the
broker's timer (:meth:`flush_with`: on the member's BlockingIO, a pool
thread) and at stop (:meth:`flush`, inline), for the queues written since
the last one only.  The
queues are rebuildable from the log, so a unit lost in a power cut or a
crash (buffered, or in the page cache) is re-dispatched at the next start.
"""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from pathlib import Path

from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from zope.interface import implementer

from dledger.entry import BODY_OFFSET, HEADER, HEADER_SIZE
from dledger.errors import DLedgerError
from dledger.interfaces import ICommitListener
from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.common.errors import CodecError, CorruptRecordError, StoreLayoutError
from dledger_rocketmq.common.message import (
    BORN_HOST_POSITION,
    BORNHOST_V6_FLAG,
    HOST_V6_FLAGS,
    MESSAGE_MAGIC,
    PROPERTY_TAGS,
    STOREHOST_V6_FLAG,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_TYPE_MASK,
    decode_record,
    parse_properties,
    property_value,
)
from dledger_rocketmq.common.native import speedups
from dledger_rocketmq.store.commitlog import CONTROL_PREFIX, is_record_body
from dledger_rocketmq.store.consumequeue import (
    DEFAULT_FILE_SIZE,
    DEFAULT_OPEN_FILES,
    DELAY_LEVELS_MS,
    SCHEDULE_TOPIC,
    ConsumeQueues,
    Unit,
    is_dispatched,
    is_dispatched_flag,
    tag_hash,
    tags_code_of,
    unit_for,
)

log = Logger()


class EntryKind:
    RECORD = "record"
    CONTROL = "control"
    FOREIGN = "foreign"


def entry_kind(body: bytes) -> str:
    """What a committed entry body is to the broker layer (contract: records, ``RMQC`` control, foreign)."""
    if body[:4] == CONTROL_PREFIX:
        return EntryKind.CONTROL
    if is_record_body(body):
        return EntryKind.RECORD
    return EntryKind.FOREIGN


_HEAD = struct.Struct(">iiiiiqqiq")  # TOTALSIZE .. BORNTIMESTAMP
_I64 = struct.Struct(">q")
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")


def index_fields(body: bytes, levels: tuple[int, ...] = DELAY_LEVELS_MS) -> tuple[str, int, int, Unit] | None:
    """``(topic, queue_id, queue_offset, unit)`` of a committed record; None if it gets no unit.

    What :func:`~dledger_rocketmq.store.consumequeue.unit_for` gives for the
    decoded record, without decoding hosts or copying the body (dispatch
    runs on every member for every message).  CorruptRecordError if the
    field lengths do not add up to TOTALSIZE = the body's length.
    """
    try:
        size, _magic, _crc, qid, _flag, qoff, phys, sys_flag, _born = _HEAD.unpack_from(body, 0)
        pos = BORN_HOST_POSITION + (20 if sys_flag & BORNHOST_V6_FLAG else 8)
        store_ts = _I64.unpack_from(body, pos)[0]
        pos += 8 + (20 if sys_flag & STOREHOST_V6_FLAG else 8) + 12  # store host, reconsume times, prepared offset
        pos += 4 + _I32.unpack_from(body, pos)[0]
        topic_len = body[pos]
        topic = body[pos + 1:pos + 1 + topic_len].decode()
        pos += 1 + topic_len
        props_len = _I16.unpack_from(body, pos)[0]
        props = body[pos + 2:pos + 2 + props_len]
        pos += 2 + props_len
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"not a valid record: {exc}", 0) from None
    if size != len(body) or pos != size or props_len < 0:
        raise CorruptRecordError(f"field lengths add up to {pos}, TOTALSIZE says {size}, entry body has "
                                 f"{len(body)} bytes", 0)
    if not is_dispatched_flag(sys_flag):
        return None
    if topic == SCHEDULE_TOPIC:  # the unit holds the delivery time, from the DELAY property
        code = tags_code_of(topic, parse_properties(props), store_ts, levels)
    else:
        code = tag_hash(property_value(props, PROPERTY_TAGS))
    return topic, qid, qoff, Unit(phys, size, code)


#: Entries delivered before the buffered units are written (:meth:`Dispatcher.entries_committed`): at most
#: ~20 KiB held, and a pwrite per touched queue per ~1,000 entries instead of per delivery.
DRAIN_AFTER = 1024

#: TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG, BODYLEN of a record whose hosts are both
#: IPv4 (the common case): one unpack instead of five, fields not needed (STORETIMESTAMP among them) skipped.
_V4_HEAD = struct.Struct(">ii4xi4xqqi44xi")
_V4_HEAD_SIZE = _V4_HEAD.size
_SLOW_FLAGS = HOST_V6_FLAGS | TRANSACTION_TYPE_MASK
_TAGS_KEY = PROPERTY_TAGS.encode() + b"\x01"
_TAGS_KEY_LEN = len(_TAGS_KEY)
_SCHEDULE_TOPIC = SCHEDULE_TOPIC.encode()


def quick_unit(body: bytes) -> tuple[bytes, int, int, int, int, bytes | None] | None:
    """``(topic, queue_id, queue_offset, physical_offset, size, tags)`` of a plain record; None: ask index_fields.

    The fast path of :func:`index_fields` (dispatch runs on every member for
    every message): one unpack, the topic left as bytes, TAGS found with one
    search from the end.  It answers only where the answer is certainly
    :func:`index_fields`' (IPv4 hosts, lengths adding up exactly, a
    non-transactional or committed record outside the schedule topic, at
    most one TAGS item that is well formed and non-empty) and gives None for
    anything else, which then takes the full decode with its errors.
    ``tags`` is the raw TAGS value (None without one): its hash is cached by
    the caller.
    """
    size = len(body)
    if size < _V4_HEAD_SIZE:
        return None
    total, magic, qid, qoff, phys, sys_flag, body_len = _V4_HEAD.unpack_from(body)
    if magic != MESSAGE_MAGIC or total != size or body_len < 0:
        return None
    if sys_flag & _SLOW_FLAGS and (sys_flag & HOST_V6_FLAGS
                                   or sys_flag & TRANSACTION_TYPE_MASK not in (0, TRANSACTION_COMMIT_TYPE)):
        return None  # one test for the common sysFlag (no IPv6 host, not a transaction)
    pos = _V4_HEAD_SIZE + body_len
    if pos >= size:
        return None
    topic_end = pos + 1 + body[pos]
    topic = body[pos + 1:topic_end]
    if topic_end + 2 > size or topic == _SCHEDULE_TOPIC:
        return None
    start = topic_end + 2
    if start + (body[topic_end] << 8 | body[topic_end + 1]) != size:  # also refuses a negative PROPERTIES length
        return None
    i = body.rfind(_TAGS_KEY, start)
    if i < 0:
        return topic, qid, qoff, phys, size, None
    if i != start and (body[i - 1] != 2 or body.find(_TAGS_KEY, start, i) >= 0):
        return None  # not an item start, or an earlier item a property_value scan would have to weigh (none
        # can be before the first item: the search for one is skipped there)
    value_end = body.find(b"\x02", i + _TAGS_KEY_LEN)
    tags = body[i + _TAGS_KEY_LEN:value_end if value_end >= 0 else size]
    return (topic, qid, qoff, phys, size, tags) if tags else None


def _native_quick_unit():
    """:func:`quick_unit` in C when the plugin's optional extension is built and not refused
    (:mod:`dledger_rocketmq.common.native`),
    configured with this module's constants, non-bytes bodies handed back to :func:`quick_unit`; else
    :func:`quick_unit`.  The same answers either way (equivalence tests); ~0.2 us per record instead of ~1.5."""
    ext = speedups
    if ext is None:
        return quick_unit
    ext.configure(MESSAGE_MAGIC, _SLOW_FLAGS, HOST_V6_FLAGS, TRANSACTION_TYPE_MASK, TRANSACTION_COMMIT_TYPE,
                  _SCHEDULE_TOPIC, _TAGS_KEY, quick_unit)
    return ext.quick_unit


#: What dispatch calls per record: :func:`quick_unit`, in C where built.
fast_quick_unit = _native_quick_unit()


def _never(_body: bytes) -> None:
    """No fast path (a dispatcher that verifies every record's CRC decodes each one)."""
    return None


def resume_physical(queues_end: int, committed_position: int) -> int:
    """Where the queues may keep units after a restart: never past the log's committed end."""
    return min(queues_end, committed_position)


def resume_index(after_records: int, controls_from: int | None, log_begin: int) -> int:
    """Where dispatch resumes: after the last indexed record, or earlier where control entries may be unapplied.

    Never before the log's first entry (entries before it are gone; the
    commit feed would skip ahead anyway).
    """
    if controls_from is None or controls_from >= after_records:
        return after_records
    return max(controls_from, log_begin, 0)


def only_noops_between(store, done: int, index: int) -> bool:
    """Whether the committed entries after ``done`` up to ``index`` are all NOOPs (which no feed delivers).

    A feed's consumer that applied ``done`` is then as far as ``index``;
    entries the log no longer holds (before its begin: compaction, a
    snapshot installed) count as done.  Reads at most 64 entries.
    """
    if done >= index:
        return True
    begin = max(done + 1, store.ledger_begin_index, 0)
    if index - begin >= 64 or index > store.committed_index:
        return False
    if begin > index:
        return True
    try:
        rest = store.get_range(begin, index - begin + 1, 1 << 62)
    except DLedgerError:
        return False
    return all(e.is_control for e in rest if e.index <= index)


@implementer(ICommitListener)
class Dispatcher:
    """Feeds consume queues from committed entries; tracks what has been dispatched."""

    def __init__(self, server, root: str | Path, *, file_size: int = DEFAULT_FILE_SIZE,
                 on_control: Callable[[int, bytes], object] | None = None, verify_crc: bool = False,
                 max_open_files: int = DEFAULT_OPEN_FILES, drain_after: int = DRAIN_AFTER):
        self.server = server
        self.root = Path(root)
        self.file_size = file_size
        self.max_open_files = max_open_files
        self.on_control = on_control or (lambda index, body: None)
        self.verify_crc = verify_crc
        #: Entries delivered between writes of the buffered units (1: at the end of every delivery).
        self.drain_after = max(int(drain_after), 1)
        self._since_drain = 0
        #: (dispatched index, position) before the oldest delivery whose units may not be written yet: where a
        #: failed write puts the dispatcher back (None: everything delivered is written).
        self._undrained: tuple[int, int] | None = None
        #: Called ``(topic, queue_id, next_offset)`` before a queue whose records the log no longer holds
        #: restarts further on (see :meth:`_after_gap`): the broker keeps the offset as the queue's base.
        self.on_rebase: Callable[[str, int, int], object] = lambda topic, queue_id, next_offset: None
        self.queues: ConsumeQueues | None = None
        #: Index of the last entry dispatched (-1: none) and the log position just past it.
        self.dispatched_index = -1
        self.dispatched_position = 0
        self._start = 0
        self._waiters: list[tuple[int, Deferred]] = []
        self._warn = RateLimitedLog(log, server.clock, interval=10.0)
        self.skipped = 0
        #: Called ``(topic, queue_id, max_offset)`` for each queue that got units, once a delivery is written
        #: (long polling wakes held pulls with it); one that raises is logged and does not stop dispatch.
        self.arrival_listeners: list[Callable[[str, int, int], object]] = []
        self._touched: dict[tuple[str, int], None] = {}
        #: Queues by (raw topic, queue id) and tag hashes by raw TAGS, for the fast path (see _dispatch).
        self._queue_cache: dict[tuple[bytes, int], object] = {}
        self._queue_cache_owner: ConsumeQueues | None = None
        self._tag_codes: dict[bytes, int] = {}

    # -- recovery ------------------------------------------------------------------------
    def _open(self) -> ConsumeQueues:
        try:
            return ConsumeQueues(self.root, file_size=self.file_size, max_open_files=self.max_open_files)
        except (StoreLayoutError, CodecError) as exc:
            log.warn("{id}: consume queues in {root} are damaged ({exc}); rebuilding them from the log",
                     id=self.server.self_id, root=str(self.root), exc=exc)
            shutil.rmtree(self.root / "consumequeue", ignore_errors=True)
            return ConsumeQueues(self.root, file_size=self.file_size, max_open_files=self.max_open_files)

    def recover(self, controls_from: int | None = None) -> int:
        """Open (or rebuild) the queues, drop units past the committed end; returns the index to resume at.

        ``controls_from``: the first index whose control entry may not have
        been applied yet (the offset table's ``applied_index + 1``, as last
        persisted).  Dispatch resumes there if that is earlier than after the
        last indexed record, so control entries committed between the two
        are applied again after a restart (records in between are replays
        the queues skip); see :func:`resume_index`.
        """
        store = self.server.store
        self.close()  # a restarted service: the previous queues' files
        self.queues = self._open()
        committed = store.committed_position()
        dropped = self.queues.truncate_physical(committed)
        if dropped:
            log.info("{id}: dropped {n} consume-queue units past the committed position {c}",
                     id=self.server.self_id, n=dropped, c=committed)
        end = self.queues.max_physical_offset()
        self._start = store.ledger_begin_index if store.ledger_begin_index >= 0 else 0
        if end > 0:
            last = max((q for q in self.queues.queues() if not q.empty), key=lambda q: q.max_physical_offset)
            unit = last.get(last.max_offset - 1)
            pos = unit.physical_offset - BODY_OFFSET
            try:
                header = store.read_at(pos, HEADER_SIZE)
                index = HEADER.unpack_from(header)[2]
                self._start = index + 1
                self.dispatched_index = index
                self.dispatched_position = pos + HEADER_SIZE + unit.size
            except DLedgerError as exc:  # e.g. before the log's begin (retention): start from the log's begin
                log.warn("{id}: cannot read the entry at {pos} ({exc}); dispatching from index {i}",
                         id=self.server.self_id, pos=pos, exc=exc, i=self._start)
        start = resume_index(self._start, controls_from, store.ledger_begin_index)
        if start < self._start:
            self._start = start
            self.dispatched_index = start - 1  # not caught up before those control entries are applied again
            try:
                self.dispatched_position = store.get(start).pos if start > 0 else store.begin_position()
            except (DLedgerError, IndexError):
                self.dispatched_position = store.begin_position()
            if self.dispatched_index < 0:
                self.dispatched_position = 0
        return self._start

    # -- ICommitListener ---------------------------------------------------------------------
    def start_index(self) -> int:
        return self._start

    def entries_committed(self, entries: list) -> None:
        """Index a delivery: units buffered per queue, written (one pwrite per queue file) once ``drain_after``
        entries were delivered since the last write, or by the next read, flush or stop.

        If a write fails (here or in whatever drained), the dispatched
        position goes back to before the oldest delivery not written (units
        written are replays when it comes again) and the OSError propagates,
        as it did when each unit was written at once.
        """
        queues = self.queues
        if self._undrained is None:
            self._undrained = (self.dispatched_index, self.dispatched_position)
        self._touched.clear()
        self._since_drain += len(entries)
        try:
            self._dispatch(queues, entries)
        finally:
            if self._since_drain >= self.drain_after:
                self.drain()
        self._wake()
        if self._touched and self.arrival_listeners:
            self._tell_arrivals(queues)

    def drain(self) -> None:
        """Write every buffered unit now (one pwrite per queue file); OSError if a write failed (the dispatched
        position is then back before the oldest delivery not written, see :meth:`_drain_failed`)."""
        self._since_drain = 0
        if self.queues is not None:
            try:
                self.queues.drain()
            finally:
                self._undrained = None

    def _drain_failed(self) -> None:
        """A queue's buffered units could not be written (they are dropped): back to before them."""
        if self._undrained is not None:
            self.dispatched_index, self.dispatched_position = self._undrained
            self._undrained = None

    def _tell_arrivals(self, queues: ConsumeQueues) -> None:
        touched, self._touched = self._touched, {}
        for topic, qid in touched:
            q = queues.find(topic, qid)
            if q is None:
                continue
            for listener in list(self.arrival_listeners):
                try:
                    listener(topic, qid, q.max_offset)
                except Exception:
                    log.failure("{id}: arrival listener {l!r} failed", id=self.server.self_id, l=listener)

    def _dispatch(self, queues: ConsumeQueues, entries: list) -> None:
        """Index ``entries`` in order: plain records by :func:`quick_unit`, everything else by :meth:`_dispatch_one`.

        The dispatched index/position are those of the last entry handled,
        also when one raises (the caller reverts them if the write fails).
        """
        if self._queue_cache_owner is not queues:
            self._queue_cache.clear()
            self._queue_cache_owner = queues
            queues.drain_failed = self._drain_failed
        cache = self._queue_cache
        hashes = self._tag_codes
        touched = self._touched
        quick = fast_quick_unit if not self.verify_crc else _never
        last = None
        grown = None  # the queue last marked touched: a run of one queue's records marks it once
        # The previous fast-path record's raw topic, queue id and queue: a batch's records (one topic and queue,
        # consecutive entries) find their queue with one comparison instead of a key and a cache lookup.
        run_topic, run_qid, run_queue = None, -1, None
        try:
            for entry in entries:
                found = quick(entry.body)
                if found is not None:
                    topic, qid, qoff, phys, size, tags = found
                    if qid == run_qid and topic == run_topic:
                        queue = run_queue
                    else:
                        queue = cache.get((topic, qid)) or self._cache_queue(queues, topic, qid)
                        run_topic, run_qid, run_queue = topic, qid, queue
                    if queue is not None:
                        code = 0 if tags is None else hashes.get(tags)
                        if code is None:
                            code = self._tag_code(tags)
                        try:
                            appended = queue.append_next(qoff, phys, size, code)
                        except CodecError as exc:
                            appended = self._after_gap(queue, qoff, Unit(phys, size, code), entry.index, exc)
                        if appended and queue is not grown:
                            touched[(queue.topic, qid)] = None
                            grown = queue
                        last = entry
                        continue
                self._dispatch_one(queues, entry)
                run_topic, run_qid, run_queue = None, -1, None  # a control entry may have changed the topics
                last = entry
        finally:
            if last is not None:
                self.dispatched_index = last.index
                self.dispatched_position = last.pos + HEADER_SIZE + len(last.body)

    def _after_gap(self, queue, queue_offset: int, unit: Unit, index: int, exc: CodecError) -> bool:
        """A unit that does not follow its queue: if the queue's units all index records the log no longer
        holds (entries before it were compacted away, or the log was reset to an installed snapshot, while this
        member had not dispatched them), the queue restarts at the unit, as RocketMQ's queues do after CommitLog
        files are deleted; otherwise the entry is not dispatched (logged, rate-limited).  True if appended."""
        store = self.server.store
        begin = store.begin_position() if hasattr(store, "begin_position") else 0
        if (queue_offset > queue.max_offset and queue.max_physical_offset <= begin
                and unit.physical_offset >= begin):
            self._warn.warn("rebase", "{id}: consume queue {t}/{q} ends at offset {n} with records the log no longer "
                            "holds (it starts at position {b}); restarting it at offset {o}",
                            id=self.server.self_id, t=queue.topic, q=queue.queue_id, n=queue.max_offset, b=begin,
                            o=queue_offset)
            self.on_rebase(queue.topic, queue.queue_id, queue.max_offset)
            queue.destroy()
            return queue.append(queue_offset, unit, defer=True)
        self._warn.warn("bad-record", "{id}: entry {i} not dispatched: {exc}", id=self.server.self_id, i=index,
                        exc=exc)
        return False

    def _cache_queue(self, queues: ConsumeQueues, topic: bytes, qid: int):
        """The queue of a raw topic name, remembered (None if the name is not UTF-8: the full decode reports it)."""
        try:
            name = topic.decode()
        except UnicodeDecodeError:
            return None
        queue = self._queue_cache[(topic, qid)] = queues.queue(name, qid)
        return queue

    def _tag_code(self, tags: bytes) -> int:
        """``tag_hash`` of a raw TAGS value (as index_fields decodes it), remembered for the next few thousand."""
        if len(self._tag_codes) >= 4096:
            self._tag_codes.clear()
        code = self._tag_codes[tags] = tag_hash(tags.decode("utf-8", errors="replace"))
        return code

    def _dispatch_one(self, queues: ConsumeQueues, entry) -> None:
        """One entry the fast path does not take: any record (full decode), a control entry, a foreign body."""
        body = entry.body
        kind = entry_kind(body)
        if kind == EntryKind.RECORD:
            try:
                if self.verify_crc:
                    record = decode_record(body, verify_crc=True)
                    found = ((record.topic, record.queue_id, record.queue_offset, unit_for(record, queues.levels))
                             if is_dispatched(record) else None)
                else:
                    found = index_fields(body, queues.levels)
                if found is not None:
                    topic, qid, qoff, unit = found
                    queue = queues.queue(topic, qid)
                    try:
                        appended = queue.append(qoff, unit, defer=True)
                    except CodecError as exc:
                        appended = self._after_gap(queue, qoff, unit, entry.index, exc)
                    if appended:
                        self._touched[(topic, qid)] = None
            except CodecError as exc:
                self._warn.warn("bad-record", "{id}: entry {i} not dispatched: {exc}",
                                id=self.server.self_id, i=entry.index, exc=exc)
        elif kind == EntryKind.CONTROL:
            self._queue_cache.clear()  # a control entry may change topics: look queues up afresh
            try:
                self.on_control(entry.index, body)
            except Exception as exc:
                self._warn.warn("bad-control", "{id}: control entry {i} failed: {exc}",
                                id=self.server.self_id, i=entry.index, exc=exc)
        else:
            self.skipped += 1
            self._warn.warn("foreign", "{id}: entry {i} is neither a RocketMQ record nor a control entry; "
                            "skipped ({n} so far)", id=self.server.self_id, i=entry.index, n=self.skipped)

    # -- catching up ------------------------------------------------------------------------------
    def lag(self) -> int:
        """Committed bytes not dispatched yet (RocketMQ's dispatchBehindBytes); 0 once caught up.

        A tail of NOOPs (a new leader's first entry) is never delivered to
        the dispatcher, so it does not count as lag.
        """
        store = self.server.store
        if self.caught_up(store.committed_index):
            return 0
        done = self.dispatched_position if self.dispatched_index >= 0 else store.begin_position()
        return max(store.committed_position() - done, 0)

    def caught_up(self, index: int) -> bool:
        """Has every entry up to ``index`` that the feed delivers (all but NOOPs) been dispatched?

        The feed never delivers NOOPs, so a log whose tail is a new leader's
        NOOP is caught up once the entries before it are dispatched: what is
        left between the last dispatched entry and ``index`` is read and
        must be NOOPs only.
        """
        return self.dispatched_index >= index or only_noops_between(self.server.store, self.dispatched_index, index)

    def wait_dispatched(self, index: int) -> Deferred:
        """Fires once every entry up to ``index`` has been dispatched (at once if already)."""
        d = Deferred()
        if self.caught_up(index):
            d.callback(self.dispatched_index)
        else:
            self._waiters.append((index, d))
        return d

    def _wake(self) -> None:
        ready = [(i, d) for i, d in self._waiters if self.caught_up(i)]
        if ready:
            self._waiters = [(i, d) for i, d in self._waiters if not self.caught_up(i)]
            for _, d in ready:
                if not d.called:  # a waiter may have been cancelled (its wait timed out)
                    d.callback(self.dispatched_index)

    def fail_waiters(self, exc: Exception) -> None:
        """Fail every :meth:`wait_dispatched` still waiting (the broker stops: nothing more will be dispatched)."""
        waiters, self._waiters = self._waiters, []
        for _, d in waiters:
            if not d.called:
                d.errback(exc)

    def flush(self) -> None:
        """Write the buffered units and fsync the consume queues written since the last flush, inline (at stop, in
        tests and tools)."""
        if self.queues is not None:
            self.drain()
            self.queues.flush()

    def flush_with(self, io) -> Deferred:
        """The broker's periodic flush: the fsyncs run by ``io`` (the member's BlockingIO: a pool thread)."""
        if self.queues is None:
            return succeed(None)
        try:
            self.drain()  # the units buffered since the last write first (a write error fails this flush)
        except OSError:
            return fail()
        return self.queues.flush_with(io)

    def close(self) -> None:
        """Flush and close the queues' open files (at stop; the queues stay usable and reopen files on demand)."""
        if self.queues is not None:
            try:
                self.flush()
            finally:
                self.queues.close()
