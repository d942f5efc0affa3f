"""Delayed messages (dledger_rocketmq.store.schedule): the SCHEDULE_TOPIC_XXXX rewrite and DelayedDelivery."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
from conftest import CQ_FILE_SIZE, STORE, golden_entries
from dledger_rocketmq.common.message import MessageRecord, decode_record, encode_properties, encode_record
from dledger_rocketmq.store.consumequeue import SCHEDULE_TOPIC, ConsumeQueues, Unit, tags_code
from dledger_rocketmq.store.offsets import DelayOffsetTable
from dledger_rocketmq.store.schedule import (
    DelayedDelivery,
    ScheduleError,
    ScheduleQueueReader,
    correct_deliver_timestamp,
    delay_level,
    from_schedule,
    level_for_queue_id,
    put_succeeded,
    queue_id_for_level,
    to_schedule,
)
from twisted.internet import defer, task

GOLDEN = {e.index: decode_record(e.body) for e in golden_entries(STORE / "dledger-n1" / "data")}
#: (schedule record index, its re-delivered record index) in the golden store.
PAIRS = [(3, 54), (173, 174), (175, 176)]
T0 = 1_800_000_000_000  # ms


def unscheduled(record: MessageRecord) -> MessageRecord:
    """The message as sent, before the broker moved it into the schedule topic."""
    props = record.property_map
    topic, qid = props.pop("REAL_TOPIC"), int(props.pop("REAL_QID"))
    return dataclasses.replace(record, topic=topic, queue_id=qid, properties=encode_properties(props))


# -- pure functions ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("level, qid", [(1, 0), (2, 1), (18, 17)])
def test_level_queue_mapping(level, qid):
    """Level n lives in queue n - 1 and back."""
    assert queue_id_for_level(level) == qid and level_for_queue_id(qid) == level


@pytest.mark.parametrize("now, deliver, level_ms, due", [
    (1000, 1500, 1000, 1500),  # due in the future, within the level's delay
    (1000, 500, 1000, 500),  # overdue
    (1000, 2000, 1000, 2000),  # exactly now + delay
    (1000, 2001, 1000, 1000),  # beyond now + delay (clock went back, bogus unit): now
])
def test_correct_deliver_timestamp(now, deliver, level_ms, due):
    """A delivery time beyond now + the level's delay is corrected to now, as RocketMQ does."""
    assert correct_deliver_timestamp(now, deliver, level_ms) == due


@pytest.mark.parametrize("result, ok", [
    (None, True), (SimpleNamespace(status=SimpleNamespace(name="PUT_OK")), True),
    (SimpleNamespace(status=SimpleNamespace(name="SERVICE_NOT_AVAILABLE")), False),
    (SimpleNamespace(status="PUT_OK"), True), (SimpleNamespace(status="OS_PAGECACHE_BUSY"), False),
])
def test_put_succeeded(result, ok):
    """Only PUT_OK (or a result without a status) counts as stored."""
    assert put_succeeded(result) is ok


@pytest.mark.parametrize("sched, real", PAIRS)
def test_to_schedule_reproduces_golden_records(sched, real):
    """Rewriting the sent message gives the golden SCHEDULE_TOPIC_XXXX record byte for byte."""
    stored = GOLDEN[sched]
    assert encode_record(to_schedule(unscheduled(stored))) == encode_record(stored)
    assert stored.topic == SCHEDULE_TOPIC and stored.queue_id == delay_level(stored) - 1


@pytest.mark.parametrize("sched, real", PAIRS)
def test_from_schedule_reproduces_golden_redeliveries(sched, real):
    """The re-put record equals the golden re-delivered record (same property bytes, DELAY kept)."""
    want = GOLDEN[real]
    got = from_schedule(GOLDEN[sched], want.store_timestamp)
    got = dataclasses.replace(got, queue_offset=want.queue_offset, physical_offset=want.physical_offset)
    assert encode_record(got) == encode_record(want)


def test_level_above_last_is_the_last():
    """DELAY 20 is stored as level 18 (queue 17) and DELAY says 18."""
    record = MessageRecord(topic="T", body=b"x", properties=encode_properties({"DELAY": "20"}), queue_id=3)
    out = to_schedule(record)
    assert out.queue_id == 17 and out.property_map == {"DELAY": "18", "REAL_TOPIC": "T", "REAL_QID": "3"}


@pytest.mark.parametrize("props, sys_flag", [({}, 0), ({"DELAY": "0"}, 0), ({"DELAY": "x"}, 0),
                                             ({"DELAY": "2"}, 0x4), ({"DELAY": "2"}, 0xC)])
def test_not_delayed_is_unchanged(props, sys_flag):
    """No/zero/bad DELAY, or a prepared/rolled-back transaction message: not rewritten."""
    record = MessageRecord(topic="T", body=b"x", properties=encode_properties(props), sys_flag=sys_flag)
    assert to_schedule(record) is record


def test_schedule_unit_tags_code_is_delivery_time():
    """The rewritten record's consume-queue tags code is store time + the level's delay."""
    record = MessageRecord(topic="T", body=b"x", properties=encode_properties({"DELAY": "3"}), store_timestamp=T0)
    assert tags_code(to_schedule(record)) == T0 + 10_000


@pytest.mark.parametrize("props, message", [({"REAL_QID": "0"}, "no REAL_TOPIC/REAL_QID"),
                                            ({"REAL_TOPIC": "T", "REAL_QID": "z"}, "'z' is not a number")])
def test_from_schedule_errors(props, message):
    """A schedule record without its real topic/queue raises a one-line ScheduleError."""
    with pytest.raises(ScheduleError, match=message):
        from_schedule(MessageRecord(topic=SCHEDULE_TOPIC, body=b"", properties=encode_properties(props)), 0)


# -- DelayedDelivery with fakes ---------------------------------------------------------------------------

class FakeStore:
    """SCHEDULE_TOPIC_XXXX queues and a log in memory; put answers are scripted."""

    def __init__(self):
        self.log: dict[int, bytes] = {}
        self.queues: dict[int, list[Unit]] = {}
        self.puts: list[MessageRecord] = []
        self.answers: list = []  # per put: None ok, an Exception, a status name, or a held Deferred
        self.next_pos = 48

    def add(self, level, real_topic="T", deliver_at=T0 + 5000, body=b"m"):
        record = to_schedule(MessageRecord(topic=real_topic, body=body, queue_id=1,
                                           properties=encode_properties({"DELAY": str(level)})))
        record = dataclasses.replace(record, physical_offset=self.next_pos)
        data = encode_record(record)
        self.log[self.next_pos] = data
        self.queues.setdefault(level - 1, []).append(Unit(self.next_pos, len(data), deliver_at))
        self.next_pos += len(data) + 48

    def read(self, qid, offset, n):
        units = self.queues.get(qid, [])
        return [(q, units[q]) for q in range(offset, min(len(units), offset + n))]

    def max_offset(self, qid):
        return len(self.queues.get(qid, []))

    def get_message(self, pos, size):
        return self.log[pos][:size]

    def put(self, record):
        answer = self.answers.pop(0) if self.answers else None
        if isinstance(answer, defer.Deferred):
            answer.addCallback(lambda r: (self.puts.append(record), r)[1])
            return answer
        if isinstance(answer, Exception):
            return defer.fail(answer)
        if answer is None:
            self.puts.append(record)  # stored
        return defer.succeed(SimpleNamespace(status=SimpleNamespace(name=answer or "PUT_OK")))


def start(store, offsets=None, **kw):
    clock = task.Clock()
    clock.advance(T0 / 1000)
    offsets = offsets if offsets is not None else DelayOffsetTable()
    service = DelayedDelivery(store, store.get_message, store.put, offsets, clock=clock, **kw)
    service.startService()
    return clock, offsets, service


def test_delivers_when_due_not_before():
    """A level-2 message due at T0+5 s is re-put to its real topic then, and the level's offset moves to 1."""
    store = FakeStore()
    store.add(2)
    clock, offsets, service = start(store)
    clock.advance(4.9)
    assert store.puts == [] and offsets.get(2) == 0
    clock.advance(0.1)
    assert [(r.topic, r.queue_id, r.body) for r in store.puts] == [("T", 1, b"m")]
    assert store.puts[0].store_timestamp == T0 + 5000
    assert offsets.get(2) == 1 and service.delivered == 1


def test_failed_put_keeps_offset_and_retries():
    """A failed or non-PUT_OK put leaves the offset; the message is re-put after 10 s (nothing lost)."""
    store = FakeStore()
    store.add(1, deliver_at=T0)
    store.answers = [RuntimeError("not leader"), "SERVICE_NOT_AVAILABLE", None]
    clock, offsets, service = start(store)
    clock.advance(1)
    assert offsets.get(1) == 0 and service.failures == 1
    clock.advance(10)
    assert offsets.get(1) == 0 and service.failures == 2
    clock.advance(10)
    assert offsets.get(1) == 1 and len(store.puts) == 1


def test_offset_advances_only_after_put_completes():
    """While a put is in flight the offset stays; it moves when the put succeeds."""
    store = FakeStore()
    store.add(1, deliver_at=T0)
    store.add(1, deliver_at=T0)
    held = defer.Deferred()
    store.answers = [held]
    clock, offsets, service = start(store)
    clock.advance(1)
    assert offsets.get(1) == 0
    held.callback(SimpleNamespace(status="PUT_OK"))
    assert offsets.get(1) == 2 and len(store.puts) == 2


def test_stop_waits_for_put_and_leaves_no_timer():
    """stopService fires once the put in flight ends; its offset is kept; no timers remain."""
    store = FakeStore()
    store.add(1, deliver_at=T0)
    store.add(1, deliver_at=T0)
    held = defer.Deferred()
    store.answers = [held]
    clock, offsets, service = start(store)
    clock.advance(1)
    stopped = service.stopService()
    assert not stopped.called and not clock.getDelayedCalls()
    held.callback(None)
    assert stopped.called and offsets.get(1) == 1 and len(store.puts) == 1
    assert not clock.getDelayedCalls()


def test_restart_during_put_runs_one_loop_per_level():
    """Stopped and restarted while a put is in flight: the level resumes once, with no duplicate delivery."""
    store = FakeStore()
    store.add(1, deliver_at=T0)
    store.add(1, deliver_at=T0, body=b"second")
    held = defer.Deferred()
    store.answers = [held]
    clock, offsets, service = start(store)
    clock.advance(1)
    service.stopService()
    service.startService()
    clock.advance(1)  # the restarted service's first run would fire here
    assert len(store.puts) == 0
    held.callback(None)
    clock.advance(1)
    assert [r.body for r in store.puts] == [b"m", b"second"] and offsets.get(1) == 2


def test_undecodable_record_is_skipped():
    """A unit whose bytes are not a record is skipped (logged), and delivery goes on."""
    store = FakeStore()
    store.add(1, deliver_at=T0)
    store.add(1, deliver_at=T0, body=b"second")
    first = min(store.log)
    store.log[first] = b"\x00" * len(store.log[first])
    clock, offsets, service = start(store)
    clock.advance(1)
    assert [r.body for r in store.puts] == [b"second"] and service.skipped == 1 and offsets.get(1) == 2


def test_offset_beyond_queue_end_is_reset():
    """A delay offset past the queue's end (queue truncated) restarts at the end, so new messages are not skipped."""
    store = FakeStore()
    store.add(1, deliver_at=T0)
    clock, offsets, service = start(store, DelayOffsetTable({1: 5}))
    clock.advance(1)
    assert offsets.get(1) == 1
    store.add(1, deliver_at=T0 + 1000)
    clock.advance(1)
    assert len(store.puts) == 1 and offsets.get(1) == 2


def test_bogus_future_time_delivered_now():
    """A unit due beyond now + the level's delay (clock went back) is delivered at once."""
    store = FakeStore()
    store.add(1, deliver_at=T0 + 3_600_000)
    clock, offsets, service = start(store)
    clock.advance(1)
    assert len(store.puts) == 1


def test_levels_are_independent():
    """A level waiting for its next message does not hold back another level's due messages."""
    store = FakeStore()
    store.add(18, deliver_at=T0 + 7_000_000)  # within 2 h: waits
    store.add(1, deliver_at=T0 + 1000)
    clock, offsets, service = start(store)
    clock.advance(1)
    assert [r.topic for r in store.puts] == ["T"] and offsets.get(1) == 1 and offsets.get(18) == 0


def test_restart_resumes_from_offsets():
    """A new master starting with the persisted offsets delivers only what was not delivered."""
    store = FakeStore()
    for n in range(3):
        store.add(1, deliver_at=T0, body=b"%d" % n)
    clock, offsets, service = start(store, DelayOffsetTable({1: 2}))
    clock.advance(1)
    assert [r.body for r in store.puts] == [b"2"]


def test_golden_schedule_queues_redeliver_golden_records(main_store):
    """Over the golden store's SCHEDULE_TOPIC_XXXX queues the re-put records are the golden re-deliveries."""
    log = {e.pos + 48: e.body for e in golden_entries(STORE / "dledger-n1" / "data")}
    reader = ScheduleQueueReader(ConsumeQueues(main_store, file_size=CQ_FILE_SIZE))
    puts = []

    def put(record):
        puts.append(record)
        return defer.succeed(None)
    clock = task.Clock()
    clock.advance(1795427100)  # after every recorded delivery time
    offsets = DelayOffsetTable()
    service = DelayedDelivery(reader, lambda pos, size: log[pos][:size], put, offsets, clock=clock)
    service.startService()
    clock.advance(1)
    assert offsets.items() == {1: 1, 2: 1, 3: 1}  # = the golden delayOffset.json
    want = {GOLDEN[r].body: GOLDEN[r] for _, r in PAIRS}
    assert len(puts) == 3
    for got in puts:
        w = want[got.body]
        got = dataclasses.replace(got, queue_offset=w.queue_offset, physical_offset=w.physical_offset,
                                  store_timestamp=w.store_timestamp)
        assert encode_record(got) == encode_record(w)
    service.stopService()
