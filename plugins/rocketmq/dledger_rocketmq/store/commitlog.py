"""The CommitLog on dledger: puts, queue offsets, the append hook, committed reads, put statuses.

One RocketMQ CommitLog record is one dledger entry body (contract); a put of
one message or a batch is ONE dledger append request (``batch_msgs``), so
the leader stores it as one store batch.

**Queue offsets (the rule).**  The leader owns a table ``(topic, queue) ->
next queue offset``.  A put *plans* offsets for its records from the table
(:func:`plan_offsets`, pure, no mutation), encodes the records with them and
hands the request to the member's append path, all synchronously in one
reactor turn; the store places the entries (and runs the append hook) inside
that call.  Only then is the table advanced, and only by the records the
store actually accepted (``ledger_end_index`` after minus before): a refused
put (not leader, pending full, disk full, hook refusal) leaves no hole and
no double assignment, a partly stored batch advances by its stored prefix.
Nothing else can run between planning and advancing, so no lock is needed
and two puts can never get the same offsets (apache/rocketmq#2865 lost
offsets by assigning batch offsets outside the put lock).  A put whose
entries were stored but then fail later (quorum timeout, term change) keeps
its offsets: its entries are in the log and may commit.  When the member
becomes master the table is rebuilt from the consume queues after dispatch
has caught up with a fully committed log (:mod:`dledger_rocketmq.broker.roles`), so
anything a lost leadership truncated is forgotten there.

The append hook refuses RocketMQ records that do not come through
:meth:`CommitLog.put` (e.g. a raw dledger client appending a record): they
would carry queue offsets the table never assigned.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Protocol

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger.codes import ResponseCode, Role
from dledger.entry import BODY_OFFSET
from dledger.errors import DLedgerError
from dledger.interfaces import ANSWER_LATER, IAppendHook, IPositionReader
from dledger.messages import AppendEntryRequest
from dledger_rocketmq.common.errors import CodecError
from dledger_rocketmq.common.message import (
    BORN_HOST_POSITION,
    BORNHOST_V6_FLAG,
    DEFAULT_MAX_MESSAGE_SIZE,
    MAGIC_POSITION,
    MESSAGE_MAGIC,
    PHYSICAL_OFFSET_POSITION,
    SYS_FLAG_POSITION,
    Address,
    MessageRecord,
    SendRecord,
    encode_batch_records,
    encode_record,
    encode_send,
    message_ids,
)
from dledger_rocketmq.store.consumequeue import is_dispatched

log = Logger()

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_TOTAL_MAGIC = struct.Struct(">ii")

CONTROL_PREFIX = b"RMQC"


class PutStatus(Enum):
    """RocketMQ's PutMessageStatus (names as in Java)."""

    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPEDFILE_FAILED = "CREATE_MAPEDFILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGECACHE_BUSY = "OS_PAGECACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"


_STATUS_FOR_CODE = {
    ResponseCode.SUCCESS: PutStatus.PUT_OK,
    ResponseCode.NOT_LEADER: PutStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.INCONSISTENT_LEADER: PutStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.LEADER_NOT_READY: PutStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.DISK_FULL: PutStatus.SERVICE_NOT_AVAILABLE,
    ResponseCode.WAIT_QUORUM_ACK_TIMEOUT: PutStatus.OS_PAGECACHE_BUSY,
    ResponseCode.LEADER_PENDING_FULL: PutStatus.OS_PAGECACHE_BUSY,
}


def put_status_for(code: ResponseCode | int) -> PutStatus:
    """RocketMQ's put status for a dledger response code (DLedgerCommitLog's mapping; anything else: UNKNOWN_ERROR)."""
    try:
        code = ResponseCode(int(code))
    except ValueError:
        return PutStatus.UNKNOWN_ERROR
    return _STATUS_FOR_CODE.get(code, PutStatus.UNKNOWN_ERROR)


@dataclass(slots=True)
class PutResult:
    """What a put answers: for a batch, ``queue_offset``/``physical_offset``/``msg_id`` are the first record's.

    Not frozen, though nothing changes one once made (one may be shared by the puts of a refused read): a
    frozen dataclass's ``__init__`` sets each field through ``object.__setattr__``, ~0.7 us more per single
    send on the master, which makes one per send (issue #28 1c).
    """

    status: PutStatus
    msg_id: str | None = None
    queue_id: int = -1
    queue_offset: int = -1
    physical_offset: int = -1
    msg_ids: tuple[str, ...] = ()
    count: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.status is PutStatus.PUT_OK


QueueKey = tuple[str, int]


def plan_offsets(table: dict[QueueKey, int], records: Sequence[MessageRecord]) -> list[int]:
    """The queue offset of each record: consecutive per (topic, queue) from ``table``; the table is not changed.

    A record that gets no consume-queue unit (prepared / rolled-back
    transaction) gets offset 0 and advances nothing, as in RocketMQ.
    """
    nexts: dict[QueueKey, int] = {}
    out = []
    for r in records:
        if not is_dispatched(r):
            out.append(0)
            continue
        key = (r.topic, r.queue_id)
        n = nexts.get(key, table.get(key, 0))
        out.append(n)
        nexts[key] = n + 1
    return out


def advance_offsets(table: dict[QueueKey, int], records: Sequence[MessageRecord], offsets: Sequence[int],
                    stored: int) -> None:
    """Advance ``table`` past the first ``stored`` records (those the store accepted), nothing more."""
    for r, q in zip(records[:stored], offsets[:stored], strict=True):
        if is_dispatched(r):
            key = (r.topic, r.queue_id)
            table[key] = max(table.get(key, 0), q + 1)


def store_timestamp_position(sys_flag: int) -> int:
    """Where STORETIMESTAMP sits in a record: after BORNHOST (8 bytes, or 20 for IPv6)."""
    return BORN_HOST_POSITION + (20 if sys_flag & BORNHOST_V6_FLAG else 8)


_STORE_TS_V4, _STORE_TS_V6 = store_timestamp_position(0), store_timestamp_position(BORNHOST_V6_FLAG)


def is_record_body(body: bytes | bytearray | memoryview, offset: int = 0) -> bool:
    """True if a RocketMQ CommitLog record (MESSAGE_MAGIC at bytes 4..8) starts at ``offset``."""
    return (len(body) - offset >= 8
            and _I32.unpack_from(body, offset + MAGIC_POSITION)[0] == MESSAGE_MAGIC)


def _answered(resp, ok: PutResult) -> PutResult:
    """``ok`` if the pending append committed.

    A pending append that does not commit is *answered* (WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED), not
    failed: only SUCCESS means a quorum holds it (the nemesis found PUT_OK for a message no quorum held).
    """
    code = getattr(resp, "code", ResponseCode.SUCCESS)
    if int(code) != int(ResponseCode.SUCCESS):
        return PutResult(put_status_for(code), error=f"the append was answered {ResponseCode(int(code)).name}")
    return ok


def _failed(f) -> PutResult:
    code = getattr(f.value, "code", ResponseCode.UNKNOWN)
    return PutResult(put_status_for(code), error=str(f.value))


class PutSink(Protocol):
    """Who a gathered put answers (:meth:`CommitLog.put_gathered`): a plain call per put, no Deferred.

    ``put_answered(token, result)`` once per put, on the reactor thread; then ``answers_done()`` once after
    the puts of one read that were answered together (at the flush for those refused there, at the commit
    for the others): the broker port writes their replies and counts their statistics there, once.
    """

    def put_answered(self, token: Any, result: PutResult) -> None: ...

    def answers_done(self) -> None: ...


class DeferredPuts:
    """The :class:`PutSink` of a put whose caller holds a Deferred (:meth:`CommitLog.put`): the answer fires it."""

    @staticmethod
    def put_answered(token: Deferred, result: PutResult) -> None:
        token.callback(result)

    @staticmethod
    def answers_done() -> None:
        pass


DEFERRED_PUTS = DeferredPuts()


def answer_puts(answers: list, results) -> None:
    """Answer gathered puts: ``answers`` of ``(sink, token, ok)``, ``results`` a PutResult for all or None (each its
    ``ok``); then each sink's :meth:`~PutSink.answers_done` once, after all its puts were answered.

    Every put is answered once even if a sink raises (logged): the others of the read must not be left waiting.
    """
    last = None
    done = []
    for sink, token, ok in answers:
        if sink is not last:
            last = sink
            if sink not in done:
                done.append(sink)
        try:
            sink.put_answered(token, ok if results is None else results)
        except Exception:
            log.failure("answering a gathered put failed")
    for sink in done:
        try:
            sink.answers_done()
        except Exception:
            log.failure("answering the gathered puts of a read failed")


class _ReadPuts:
    """The gathered puts of one read, as the token of their one append request.

    The member may answer that request before :meth:`CommitLog.flush_gathered` has listed the puts (a
    member alone commits inside its append): the response then waits here until they are listed.
    """

    __slots__ = ("answers", "listed", "response")

    def __init__(self):
        self.answers: list = []  # (sink, token, ok)
        self.listed = False
        self.response = None

    def listed_all(self) -> None:
        self.listed = True
        if self.response is not None:
            _answer_committed(self, self.response)


def _answer_committed(puts: _ReadPuts, resp) -> None:
    """The gathered puts' one append request answered (``answer`` of the member's answering API): each put too.

    Only SUCCESS means a quorum holds them (:func:`_answered`); a timeout or a lost leadership answers each
    put with that.
    """
    if not puts.listed:
        puts.response = resp
        return
    code = getattr(resp, "code", ResponseCode.SUCCESS)
    answer_puts(puts.answers, None if int(code) == int(ResponseCode.SUCCESS) else _answered(resp, None))


def _answer_committed_d(resp, puts: _ReadPuts) -> None:
    _answer_committed(puts, resp)


def _fail_committed(f, puts: _ReadPuts) -> None:
    puts.listed = True
    answer_puts(puts.answers, _failed(f))


@implementer(IAppendHook)
class PhysicalOffsetHook:
    """Leader-side append hook: PHYSICALOFFSET = entry.pos + 48 and STORETIMESTAMP = now, for broker puts only."""

    def __init__(self, commitlog: CommitLog):
        self.commitlog = commitlog

    def before_append(self, entry, buffer, body_offset: int) -> None:
        """Runs for every entry a leader appends: the common case is a few unpacks and packs.

        The store time is the put's (one per batch, as RocketMQ stamps a
        batch with one ``storeTimestamp``).
        """
        cl = self.commitlog
        size = len(buffer) - body_offset
        if size < 8:
            return
        total, magic = _TOTAL_MAGIC.unpack_from(buffer, body_offset)
        if magic != MESSAGE_MAGIC:
            return  # control entries and foreign bodies pass unchanged
        if not cl.putting:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               "RocketMQ records must be put through the broker (it assigns queue offsets)")
        if total != size:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"record TOTALSIZE {total} != entry body of {size} bytes")
        physical = entry.pos + BODY_OFFSET
        _I64.pack_into(buffer, body_offset + PHYSICAL_OFFSET_POSITION, physical)
        sys_flag = _I32.unpack_from(buffer, body_offset + SYS_FLAG_POSITION)[0]
        _I64.pack_into(buffer, body_offset + (_STORE_TS_V6 if sys_flag & BORNHOST_V6_FLAG else _STORE_TS_V4),
                       cl.put_ms)
        cl.placed.append(physical)


@dataclass
class CommitLog:
    """Puts records through the member (leader only) and reads committed records by physical offset.

    ``old_reader`` serves offsets below ``divided`` (a migrated store's old
    CommitLog files, see :mod:`dledger_rocketmq.store.migration`).
    """

    server: object
    store_host: Address = field(default_factory=lambda: Address("127.0.0.1", 10911))
    max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE
    divided: int = 0
    old_reader: object | None = None
    #: May puts be taken?  The role manager sets it (master, table rebuilt); the leader check is separate.
    writable: Callable[[], bool] = lambda: True

    def __post_init__(self):
        self.offsets: dict[QueueKey, int] = {}
        self.putting = False
        self.placed: list[int] = []
        self.put_ms = 0  # the store time of the put in progress (the hook writes it)
        self.hook = PhysicalOffsetHook(self)
        self.gathering = 0  # > 0: single-record puts wait in ``gathered`` for :meth:`flush_gathered`
        self.gathered: list[tuple[MessageRecord, PutSink, Any]] = []

    def now_ms(self) -> int:
        return int(self.server.clock.seconds() * 1000)

    # -- offsets -------------------------------------------------------------------------
    def reset_offsets(self, table: dict[str, int] | dict[QueueKey, int]) -> None:
        """Replace the queue-offset table (a new master's ``topicQueueTable``: ``"topic-qid" -> next``)."""
        out: dict[QueueKey, int] = {}
        for key, value in table.items():
            if isinstance(key, str):
                topic, _, qid = key.rpartition("-")
                key = (topic, int(qid))
            out[key] = int(value)
        self.offsets = out

    # -- puts ------------------------------------------------------------------------------
    def put(self, records: Sequence[MessageRecord]) -> Deferred:
        """Append ``records`` as one dledger batch; fires with a :class:`PutResult` (never errbacks).

        Each record is stored with this broker's STOREHOST (and the sysFlag
        IPv6 bits that go with it), its planned queue offset, and the
        physical offset and store time the append hook writes.
        """
        if self.gathering and len(records) == 1:
            d = Deferred()
            self.gathered.append((records[0], DEFERRED_PUTS, d))
            return d
        refused = self._refuse_put(len(records))
        if refused is not None:
            return refused
        offsets = plan_offsets(self.offsets, records)
        try:
            host = self.store_host
            limit = self.max_message_size
            bodies = [encode_record(r, max_size=limit, queue_offset=q, physical_offset=0, store_host=host)
                      for r, q in zip(records, offsets, strict=True)]
        except CodecError as exc:
            return succeed(PutResult(PutStatus.MESSAGE_ILLEGAL, error=str(exc)))
        return self._append(bodies, records[0].queue_id, offsets[0],
                            lambda stored: advance_offsets(self.offsets, records, offsets, stored))

    def put_batch(self, template: MessageRecord, items: Sequence) -> Deferred:
        """``put(batch_records(items, template))`` without a MessageRecord per message (SEND_BATCH_MESSAGE).

        The items share the template's topic and queue, so their queue
        offsets are consecutive (all 0 for records that get no unit, as
        :func:`plan_offsets` gives); the records are encoded together
        (:func:`~dledger_rocketmq.common.message.encode_batch_records`).  The caller
        applies no DELAY rewrite: a batch with a DELAY property goes through :meth:`put`.
        """
        refused = self._refuse_put(len(items))
        if refused is not None:
            return refused
        key = (template.topic, template.queue_id)
        step = 1 if is_dispatched(template) else 0
        first = self.offsets.get(key, 0) if step else 0
        try:
            bodies = encode_batch_records(template, items, first_queue_offset=first, queue_offset_step=step,
                                          store_host=self.store_host, max_size=self.max_message_size)
        except CodecError as exc:
            return succeed(PutResult(PutStatus.MESSAGE_ILLEGAL, error=str(exc)))

        def advance(stored: int) -> None:
            if step and stored:
                self.offsets[key] = max(self.offsets.get(key, 0), first + stored)
        return self._append(bodies, template.queue_id, first, advance)

    # -- gathered puts: the single sends of one read, one store batch ------------------------------
    def gather(self) -> None:
        """Hold single-record puts until :meth:`flush_gathered`, which appends them as ONE store batch.

        The broker port calls the pair around the frames of one read: a
        many-threaded producer's single sends arrive several to a read, and
        one store write, one replicator wake-up and one pass of offset
        planning for all of them cost less than one each.  Each put keeps
        its own answer (its own pending append: one refused or failed put
        does not fail the others).  Calls nest; the outermost flush appends.
        """
        self.gathering += 1

    def put_gathered(self, record: MessageRecord | SendRecord, sink: PutSink, token: Any) -> bool:
        """Hold ``record`` for :meth:`flush_gathered`, answered by ``sink.put_answered(token, result)``; False
        if no gathering is open (the caller puts it with :meth:`put` instead).

        The broker port's lean path for the single sends of one read: no Deferred per put, and the sink
        answers the read's sends together (:class:`PutSink`).  The port hands it a :class:`SendRecord` (a
        send with a DELAY level: a MessageRecord), encoded at the flush by :func:`encode_send` (the same bytes
        as :func:`encode_record` of its MessageRecord).
        """
        if not self.gathering:
            return False
        self.gathered.append((record, sink, token))
        return True

    def flush_gathered(self) -> None:
        """Append the puts held since :meth:`gather` as ONE dledger append request and answer each.

        One request, not one per put: the member keeps one pending append
        (one response, one resolution at commit, answered by a plain call
        through its answering API: no Deferred) for the whole read instead of
        one per send, and the answers are fanned out from it to each put's
        sink (:func:`answer_puts`).
        A put that cannot be encoded, or is over the member's entry size,
        fails alone before anything is appended.  A refusal of the request
        (pending appends full, leadership lost, disk full, another plugin's
        hook) answers every put of it; the records the store took before the
        refusal keep their queue offsets (the table advances by the stored
        prefix, so no gap) and may commit, as a batch send's do.
        """
        self.gathering -= 1
        if self.gathering or not self.gathered:
            return
        puts, self.gathered = self.gathered, []
        refused = self._refuse_put(len(puts))
        if refused is not None:
            answer_puts([(sink, token, None) for _, sink, token in puts], refused.result)
            return
        server, offsets = self.server, self.offsets
        host, limit = self.store_host, self.max_message_size
        # The member checks each entry's size after the queue offsets are planned and would refuse the whole
        # request: the check is made here first, so an oversized put fails alone and leaves no gap.
        entry_limit = server.config.max_entry_size - BODY_OFFSET
        nexts: dict[QueueKey, int] = {}  # offsets planned here; the table advances only by what is stored
        waiting, bodies, bad = [], [], []
        for record, sink, token in puts:
            key = None
            q = 0
            if is_dispatched(record):
                key = (record.topic, record.queue_id)
                q = nexts.get(key)
                if q is None:
                    q = offsets.get(key, 0)
            try:
                if type(record) is SendRecord:  # the port's lean path: one pass
                    body = encode_send(record, queue_offset=q, store_host=host, max_size=limit)
                else:
                    body = encode_record(record, max_size=limit, queue_offset=q, physical_offset=0, store_host=host)
            except CodecError as exc:
                bad.append((sink, token, PutResult(PutStatus.MESSAGE_ILLEGAL, error=str(exc))))
                continue
            if len(body) > entry_limit:
                bad.append((sink, token, PutResult(put_status_for(ResponseCode.UNEXPECTED_ARGUMENT),
                                                   error=f"record of {len(body)} bytes exceeds maxEntrySize")))
                continue
            if key is not None:
                nexts[key] = q + 1
            bodies.append(body)
            waiting.append((record.queue_id, key, q, sink, token))
        if bad:
            answer_puts(bad, None)
        if not bodies:
            return
        store = server.store
        before = store.ledger_end_index
        puts = _ReadPuts()
        result = self._placing(self._append_answering,
                               (AppendEntryRequest(group=server.config.group, batch_msgs=bodies), puts))
        stored = store.ledger_end_index - before
        for _, key, q, _, _ in waiting[:stored]:
            if key is not None and offsets.get(key, 0) <= q:
                offsets[key] = q + 1
        if isinstance(result, DLedgerError):
            answer_puts([(sink, token, None) for *_, sink, token in waiting],
                        PutResult(put_status_for(result.code), error=str(result)))
            return
        prefix = host.packed().hex().upper()
        answers = puts.answers
        for (queue_id, _, q, sink, token), physical in zip(waiting, self.placed, strict=True):
            msg_id = f"{prefix}{physical & 0xFFFFFFFFFFFFFFFF:016X}"
            answers.append((sink, token, PutResult(PutStatus.PUT_OK, msg_id=msg_id, queue_id=queue_id,
                                                   queue_offset=q, physical_offset=physical, msg_ids=(msg_id,),
                                                   count=1)))
        if result is ANSWER_LATER:
            puts.listed_all()
        else:  # the member's statistics are on: it answers through a Deferred
            puts.listed = True
            result.addCallbacks(_answer_committed_d, _fail_committed, callbackArgs=(puts,), errbackArgs=(puts,))

    def _append_answering(self, request_puts: tuple) -> Any:
        """The gathered puts' one request through the member's answering API: :data:`ANSWER_LATER` (answered by
        :func:`_answer_committed` with the :class:`_ReadPuts`) or a Deferred (the member's statistics on); a
        refusal raised (:meth:`_placing` returns it)."""
        request, puts = request_puts
        (result,) = self.server.handle_requests_answering([request], _answer_committed, [puts])
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def _refuse_put(self, count: int) -> Deferred | None:
        """The PutResult of a put that cannot be taken here (nothing to put, not the master); None if it can."""
        if not count:
            return succeed(PutResult(PutStatus.MESSAGE_ILLEGAL, error="no message"))
        server = self.server
        if server.state.role is not Role.LEADER or not self.writable():
            return succeed(PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=f"{server.self_id} is not the master"))
        return None

    def _placing(self, append: Callable, request):
        """``append(request)`` on the member with the append hook armed: the bracket of every put.

        Inside it the hook (:class:`PhysicalOffsetHook`) stamps each record
        with this put's store time and collects the entries' physical offsets
        in ``placed``; outside it the hook refuses RocketMQ records.  A
        refusal is returned, not raised (a bug below us as INTERNAL_ERROR,
        logged): every put must be answered.
        """
        self.putting, self.placed, self.put_ms = True, [], self.now_ms()
        try:
            return append(request)
        except DLedgerError as exc:
            return exc
        except Exception as exc:  # a bug below us must not leave the caller without an answer
            log.failure("{id}: put failed", id=self.server.self_id)
            return DLedgerError(ResponseCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            self.putting = False

    def _append(self, bodies: list[bytes], queue_id: int, first_offset: int,
                advance: Callable[[int], None]) -> Deferred:
        """Append encoded records as one dledger batch, advance the queue offsets by what was stored; a PutResult."""
        server = self.server
        store = server.store
        before = store.ledger_end_index
        d = self._placing(server.handle_append, AppendEntryRequest(group=server.config.group, batch_msgs=bodies))
        stored = store.ledger_end_index - before
        advance(stored)
        placed = self.placed[:stored]
        if isinstance(d, DLedgerError):
            return succeed(PutResult(put_status_for(d.code), error=str(d)))
        ids = message_ids(self.store_host, placed)
        ok = PutResult(PutStatus.PUT_OK, msg_id=ids[0] if ids else None, queue_id=queue_id,
                       queue_offset=first_offset, physical_offset=placed[0] if placed else -1, msg_ids=ids,
                       count=len(bodies))

        d.addCallbacks(_answered, _failed, callbackArgs=(ok,))
        return d

    # -- reads ---------------------------------------------------------------------------------
    def max_physical_offset(self) -> int:
        """Where committed data ends: nothing at or past it is visible."""
        store = self.server.store
        end = store.committed_position() if IPositionReader.providedBy(store) else 0
        return max(end, self.divided)

    def min_physical_offset(self) -> int:
        if self.old_reader is not None and self.divided:
            return min(self.old_reader.old_files, default=self.divided)
        return self.server.store.begin_position()

    def get_message(self, offset: int, size: int) -> bytes:
        """``size`` committed bytes at physical ``offset`` (one record: its offset and TOTALSIZE)."""
        if offset < self.divided and self.old_reader is not None:
            return self.old_reader.get_message(offset, size)
        store = self.server.store
        if not IPositionReader.providedBy(store):
            raise DLedgerError(ResponseCode.UNSUPPORTED, f"store {type(store).__name__} cannot read by position")
        return store.read_at(offset, size)
