"""Delayed messages: RocketMQ's 18 delay levels through ``SCHEDULE_TOPIC_XXXX`` (ScheduleMessageService).

A message sent with property ``DELAY`` = level (1..18: ``1s 5s 10s 30s 1m 2m
3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h``) is stored in ``SCHEDULE_TOPIC_XXXX``,
queue ``level - 1``, with ``REAL_TOPIC`` / ``REAL_QID`` holding where it was
sent (:func:`to_schedule`); its consume-queue unit's tags code is the delivery
time (``consumequeue.tags_code``).  On the master, :class:`DelayedDelivery`
walks each level's queue from ``delayOffset.json``'s offset and, once a unit
is due, re-puts the record to its real topic and queue (:func:`from_schedule`).

Compatibility, checked against the golden store: the schedule record's
properties are the message's map in Java ``HashMap`` order plus
``REAL_TOPIC``/``REAL_QID``; the re-delivered record keeps exactly the
schedule record's property bytes (``DELAY`` included: RocketMQ clears it only
in its in-memory map), body, flag, sys flag, born time/host and reconsume
times, with a new store time.  Because ``DELAY`` stays in the bytes, the
``put`` given to :class:`DelayedDelivery` must store the record as it is and
must not apply the delay rewrite again.

Difference from RocketMQ: its timer task advances the level's offset together
with scheduling the next run; here the offset moves only after ``put``
succeeded (PUT_OK), one message at a time per level, so a crash or a failed
put repeats a delivery (at least once) but never skips one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.errors import CodecError
from dledger_rocketmq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    MessageRecord,
    decode_record,
    encode_properties,
    parse_properties,
)
from dledger_rocketmq.store.consumequeue import DELAY_LEVELS_MS, SCHEDULE_TOPIC, ConsumeQueues, Unit
from dledger_rocketmq.store.offsets import DelayOffsetTable

log = Logger(namespace="dledger_rocketmq.store.schedule")

TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: ScheduleMessageService's timings (seconds): first run after start, idle poll, retry after a failed put.
FIRST_DELAY = 1.0
IDLE_DELAY = 0.1
RETRY_DELAY = 10.0
#: Units read per run of a level.
BATCH = 32


class ScheduleError(ValueError):
    """A record in SCHEDULE_TOPIC_XXXX cannot be re-delivered (no REAL_TOPIC / REAL_QID); one line."""


def queue_id_for_level(level: int) -> int:
    return level - 1


def level_for_queue_id(queue_id: int) -> int:
    return queue_id + 1


def delay_level(record: MessageRecord) -> int:
    """The DELAY property as an int (0 when absent or not a number)."""
    try:
        return int(record.property_map.get(PROPERTY_DELAY_TIME_LEVEL, "0"))
    except ValueError:
        return 0


def java_properties(props: dict[str, str]) -> bytes:
    """Properties as the broker re-encodes a message's map: Java HashMap order, no trailing separator."""
    order = fastjson.java_map_order(props, 16, concurrent=False)
    return encode_properties([(name, props[name]) for name in order])


def to_schedule(record: MessageRecord, levels: tuple[int, ...] = DELAY_LEVELS_MS) -> MessageRecord:
    """The record a delayed send is stored as; ``record`` itself if it is not delayed.

    Delayed: DELAY > 0 and not a prepared/rolled-back transaction message.  A
    level above the last is the last (and DELAY says so).  Topic becomes
    SCHEDULE_TOPIC_XXXX, queue id ``level - 1``; REAL_TOPIC and REAL_QID are
    added to the map (existing keys keep their place, as in a Java map).
    """
    level = delay_level(record)
    if level <= 0 or record.topic == SCHEDULE_TOPIC or record.transaction_type not in (
            TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
        return record
    props = parse_properties(record.properties)
    if level > len(levels):
        level = len(levels)
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
    props[PROPERTY_REAL_TOPIC] = record.topic
    props[PROPERTY_REAL_QUEUE_ID] = str(record.queue_id)
    return dataclasses.replace(record, topic=SCHEDULE_TOPIC, queue_id=queue_id_for_level(level),
                               properties=java_properties(props))


def from_schedule(record: MessageRecord, store_timestamp: int) -> MessageRecord:
    """The record to re-put when a scheduled message is due: real topic and queue, same property bytes.

    Queue and physical offsets are 0 (the put assigns them); the store time is ``store_timestamp``.
    """
    props = record.property_map
    topic = props.get(PROPERTY_REAL_TOPIC)
    qid = props.get(PROPERTY_REAL_QUEUE_ID)
    if not topic or qid is None:
        raise ScheduleError(f"schedule record at {record.physical_offset} has no {PROPERTY_REAL_TOPIC}/"
                            f"{PROPERTY_REAL_QUEUE_ID} property")
    try:
        queue_id = int(qid)
    except ValueError:
        raise ScheduleError(f"schedule record at {record.physical_offset}: {PROPERTY_REAL_QUEUE_ID} {qid!r} "
                            "is not a number") from None
    return dataclasses.replace(record, topic=topic, queue_id=queue_id, queue_offset=0, physical_offset=0,
                               store_timestamp=store_timestamp, body_crc=None)


def correct_deliver_timestamp(now_ms: int, deliver_ms: int, level_ms: int) -> int:
    """When a unit is due: its tags code, unless that is beyond ``now + the level's delay``
    (the clock went back, or the unit is bogus): then now, as RocketMQ's correctDeliverTimestamp."""
    return now_ms if deliver_ms > now_ms + level_ms else deliver_ms


def put_succeeded(result: Any) -> bool:
    """Whether a put's result means stored: PUT_OK (a status object or name), or a result without a status."""
    status = getattr(result, "status", None)
    if status is None:
        return True
    return getattr(status, "name", str(status)) == "PUT_OK"


class ScheduleQueueReader:
    """The SCHEDULE_TOPIC_XXXX queues of a ``ConsumeQueues``, as :class:`DelayedDelivery` reads them."""

    def __init__(self, queues: ConsumeQueues) -> None:
        self.queues = queues

    def read(self, queue_id: int, offset: int, max_count: int) -> list[tuple[int, Unit]]:
        return self.queues.queue(SCHEDULE_TOPIC, queue_id).read(offset, max_count)

    def max_offset(self, queue_id: int) -> int:
        return self.queues.queue(SCHEDULE_TOPIC, queue_id).max_offset


class DelayedDelivery(service.Service):
    """Re-puts due delayed messages to their real topic; run it on the master only.

    ``reader``: ``read(queue_id, offset, max_count) -> [(queue offset, Unit)]``
    and ``max_offset(queue_id)`` over SCHEDULE_TOPIC_XXXX (:class:`ScheduleQueueReader`).
    ``get_message(physical_offset, size)``: the record bytes (or a Deferred of them).
    ``put(record)``: a Deferred firing when stored (a PutResult whose status is not
    PUT_OK, or a failure, counts as not stored); it must not re-apply the delay rewrite.
    ``offsets``: the delay offsets (``BrokerMetadata.delay_offsets``), advanced per level.
    ``clock``: an IReactorTime whose ``seconds()`` is wall-clock time (tags codes are epoch ms).
    """

    def __init__(self, reader: Any, get_message: Callable[[int, int], Any],
                 put: Callable[[MessageRecord], defer.Deferred], offsets: DelayOffsetTable, *, clock: Any,
                 levels: tuple[int, ...] = DELAY_LEVELS_MS, first_delay: float = FIRST_DELAY,
                 idle_delay: float = IDLE_DELAY, retry_delay: float = RETRY_DELAY, batch: int = BATCH) -> None:
        self.reader = reader
        self.get_message = get_message
        self.put = put
        self.offsets = offsets
        self.clock = clock
        self.levels = levels
        self.first_delay = first_delay
        self.idle_delay = idle_delay
        self.retry_delay = retry_delay
        self.batch = batch
        self.delivered = 0
        self.skipped = 0
        self.failures = 0
        self._timers: dict[int, Any] = {}
        self._runs: dict[int, defer.Deferred] = {}
        self._log = RateLimitedLog(log, clock, interval=30.0)

    def _now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    # -- service ----------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        for level in range(1, len(self.levels) + 1):
            if level not in self._runs:  # a run still in flight from before a stop schedules itself
                self._schedule(level, self.first_delay)

    def stopService(self) -> defer.Deferred:
        """Cancel every timer; fires once the puts in flight have ended (their offsets are kept)."""
        super().stopService()
        for timer in self._timers.values():
            if timer.active():
                timer.cancel()
        self._timers.clear()
        runs = list(self._runs.values())
        return defer.DeferredList(runs, consumeErrors=True).addCallback(lambda _: None)

    def _schedule(self, level: int, delay: float) -> None:
        if self.running:
            self._timers[level] = self.clock.callLater(delay, self._start_run, level)

    def _start_run(self, level: int) -> None:
        self._timers.pop(level, None)
        d = self._runs[level] = self._run(level)

        def failed(f: Any) -> float:
            log.failure("delay level {delay}: delivery run failed", f, delay=level)
            return self.retry_delay

        def done(delay: Any) -> None:
            self._runs.pop(level, None)
            if delay is not None:
                self._schedule(level, delay)
        d.addErrback(failed).addCallback(done)

    # -- one level --------------------------------------------------------

    @defer.inlineCallbacks
    def _run(self, level: int):
        """Deliver what is due in ``level``; returns the delay until the next run (None: stopped)."""
        qid = queue_id_for_level(level)
        level_ms = self.levels[level - 1]
        try:
            offset = self.offsets.get(level)
            end = self.reader.max_offset(qid)
            if offset > end:  # the queue was truncated below our offset: new messages would be skipped
                self._log.warn(("beyond", level), "delay level {delay}: offset {offset} beyond queue end {end}; "
                               "continuing from {end}", delay=level, offset=offset, end=end)
                self.offsets.reset(level, end)
                offset = end
            units = self.reader.read(qid, offset, self.batch)
        except Exception as exc:  # a failed read is retried, never fatal
            self._log.error(("read", level), "delay level {delay}: reading its queue failed: {err}",
                            delay=level, err=exc)
            return self.retry_delay
        if not units:
            return self.idle_delay
        for queue_offset, unit in units:
            if not self.running:
                return None
            if queue_offset > self.offsets.get(level):  # units below the queue's minimum are gone
                self.offsets.advance(level, queue_offset)
            now = self._now_ms()
            due = correct_deliver_timestamp(now, unit.tags_code, level_ms)
            if due > now:
                return (due - now) / 1000.0
            try:
                data = yield defer.maybeDeferred(self.get_message, unit.physical_offset, unit.size)
            except Exception as exc:  # e.g. the store is closing: try again later
                self._log.error(("get", level), "delay level {delay}: reading the message at {pos} failed: {err}",
                                delay=level, pos=unit.physical_offset, err=exc)
                return self.retry_delay
            record = self._restore(level, unit, data)
            if record is not None:
                try:
                    result = yield self.put(record)
                    ok = put_succeeded(result)
                    reason = getattr(getattr(result, "status", None), "name", result)
                except Exception as exc:  # a failed put is retried after retry_delay
                    ok, reason = False, exc
                if not ok:
                    self.failures += 1
                    self._log.warn(("put", level), "delay level {delay}: re-putting the message at {pos} to "
                                   "{topic} failed ({reason}); retrying in {retry}s", delay=level,
                                   pos=unit.physical_offset, topic=record.topic, reason=reason,
                                   retry=self.retry_delay)
                    return self.retry_delay if self.running else None
                self.delivered += 1
            self.offsets.advance(level, queue_offset + 1)
        return 0.0 if self.running else None

    def _restore(self, level: int, unit: Unit, data: Any) -> MessageRecord | None:
        """The record to re-put, or None (logged, skipped) if the stored bytes cannot be delivered."""
        try:
            if data is None:
                raise ScheduleError(f"no message at {unit.physical_offset}")
            record = from_schedule(decode_record(data), self._now_ms())
            if record.topic == TRANS_HALF_TOPIC:
                raise ScheduleError(f"schedule record at {unit.physical_offset} targets {TRANS_HALF_TOPIC}")
            return record
        except (CodecError, ScheduleError) as exc:
            self.skipped += 1
            log.error("delay level {delay}: skipping the unit at {pos}: {err}", delay=level,
                      pos=unit.physical_offset, err=exc)
            return None
