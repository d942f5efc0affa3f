"""CONSUMER_SEND_MSG_BACK decisions (pure): where a message a consumer could not handle goes next.

A consumer that gives up on a message for now (push consumer:
RECONSUME_LATER) sends it back by its commit-log offset.  The broker
re-puts a copy to the group's retry topic ``%RETRY%<group>`` with a delay
level (3 + reconsumeTimes unless the client names one), so it comes back
through SCHEDULE_TOPIC_XXXX after 10 s, 30 s, 1 min, ...; after
``maxReconsumeTimes`` (default 16) attempts, or when the client asks with
a negative level, the copy goes to the dead-letter topic ``%DLQ%<group>``
instead.  The copy keeps body, flag, sysFlag, born time and host; its
properties gain RETRY_TOPIC (the first real topic), ORIGIN_MESSAGE_ID (the
first copy's offsetMsgId), WAIT=false and DELAY, as RocketMQ 4.9.8 stores
them (golden store entry 174).

Also here: the ordered-consumer lock table (LOCK_BATCH_MQ / UNLOCK_BATCH_MQ).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any

from dledger_rocketmq.broker.port import ArgumentError, ext_bool, ext_int, ext_str
from dledger_rocketmq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_WAIT_STORE_MSG_OK,
    MessageRecord,
)
from dledger_rocketmq.store.metadata import PERM_READ, PERM_WRITE, topic_config
from dledger_rocketmq.store.schedule import java_properties

PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
RETRY_PREFIX = "%RETRY%"
DLQ_PREFIX = "%DLQ%"
DEFAULT_MAX_RECONSUME_TIMES = 16
DLQ_QUEUE_NUMS = 1
#: The header version from which the request's maxReconsumeTimes counts (MQVersion V3_4_9's ordinal).
V3_4_9 = 121
#: Ordered consumers' queue locks expire after this long without a renewal (rocketmq.broker.rebalance.lockMaxLiveTime).
LOCK_MAX_LIVE_MS = 60_000


def retry_topic(group: str) -> str:
    return RETRY_PREFIX + group


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


@dataclass(frozen=True)
class SendBackArgs:
    """ConsumerSendMsgBackRequestHeader."""

    group: str
    offset: int
    delay_level: int = 0
    origin_msg_id: str | None = None
    origin_topic: str | None = None
    unit_mode: bool = False
    max_reconsume_times: int | None = None


def send_back_args(ext: dict[str, str]) -> SendBackArgs:
    max_times = ext.get("maxReconsumeTimes")
    return SendBackArgs(group=ext_str(ext, "group"), offset=ext_int(ext, "offset", bits=64),
                        delay_level=ext_int(ext, "delayLevel", 0), origin_msg_id=ext.get("originMsgId"),
                        origin_topic=ext.get("originTopic"), unit_mode=ext_bool(ext, "unitMode"),
                        max_reconsume_times=ext_int(ext, "maxReconsumeTimes") if max_times not in (None, "") else None)


def max_reconsume_times(args: SendBackArgs, group_retry_max: int, request_version: int) -> int:
    """The group's retryMaxTimes, or the request's own value for clients from V3_4_9 on (both send it)."""
    if request_version >= V3_4_9 and args.max_reconsume_times is not None:
        return args.max_reconsume_times
    return group_retry_max


@dataclass(frozen=True)
class SendBack:
    """What a send-back stores: the record, the topic config to create if missing, whether it is dead."""

    record: MessageRecord
    topic: dict[str, Any]
    dead: bool


def send_back(original: MessageRecord, args: SendBackArgs, *, max_times: int, retry_queue_nums: int = 1
              ) -> SendBack:
    """The copy to put for a send-back of ``original`` (decoded from the commit log at ``args.offset``).

    Retry: ``%RETRY%<group>`` (queue ``offset % retryQueueNums``; RocketMQ
    picks one at random), DELAY = the given level, or 3 + reconsumeTimes
    for level 0.  Dead (reconsumeTimes >= max_times, or a negative level):
    ``%DLQ%<group>`` queue 0, no new DELAY.
    """
    if retry_queue_nums <= 0:
        raise ArgumentError(f"group {args.group} has retryQueueNums {retry_queue_nums}")
    props = original.property_map
    if PROPERTY_RETRY_TOPIC not in props:
        props[PROPERTY_RETRY_TOPIC] = original.topic
    props[PROPERTY_WAIT_STORE_MSG_OK] = "false"
    dead = original.reconsume_times >= max_times or args.delay_level < 0
    if dead:
        topic = topic_config(dlq_topic(args.group), DLQ_QUEUE_NUMS, DLQ_QUEUE_NUMS, PERM_WRITE)
        queue_id = 0
    else:
        level = args.delay_level if args.delay_level > 0 else 3 + original.reconsume_times
        props[PROPERTY_DELAY_TIME_LEVEL] = str(level)
        topic = topic_config(retry_topic(args.group), retry_queue_nums, retry_queue_nums, PERM_READ | PERM_WRITE)
        queue_id = args.offset % retry_queue_nums
    if not props.get(PROPERTY_ORIGIN_MESSAGE_ID):
        props[PROPERTY_ORIGIN_MESSAGE_ID] = original.message_id
    record = dataclasses.replace(original, topic=topic["topicName"], queue_id=queue_id, queue_offset=0,
                                 physical_offset=0, store_timestamp=0, properties=java_properties(props),
                                 reconsume_times=original.reconsume_times + 1, prepared_transaction_offset=0,
                                 body_crc=None)
    return SendBack(record, topic, dead)


# -- ordered consumers' queue locks ------------------------------------------------------------------------------

def parse_lock_body(body: bytes) -> tuple[str, str, list[tuple[str, str, int]]]:
    """LockBatchRequestBody / UnlockBatchRequestBody JSON -> (consumerGroup, clientId, [(broker, topic, queue)])."""
    try:
        obj = json.loads(body.decode("utf-8"))
        group, client = obj["consumerGroup"], obj["clientId"]
        mqs = [(str(m["brokerName"]), str(m["topic"]), int(m["queueId"])) for m in obj.get("mqSet") or []]
    except (UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArgumentError(f"lock body is not a LockBatchRequestBody: {str(exc)[:80]}") from None
    if not isinstance(group, str) or not isinstance(client, str):
        raise ArgumentError("lock body: consumerGroup and clientId must be strings")
    return group, client, mqs


def mq_json(mq: tuple[str, str, int]) -> dict[str, Any]:
    return {"brokerName": mq[0], "queueId": mq[2], "topic": mq[1]}


class LockTable:
    """RocketMQ's RebalanceLockManager: per group, which client holds which queue, until 60 s without renewal."""

    def __init__(self, max_live_ms: int = LOCK_MAX_LIVE_MS):
        self.max_live_ms = max_live_ms
        self._table: dict[str, dict[tuple[str, str, int], list]] = {}

    def lock(self, group: str, mqs: list[tuple[str, str, int]], client_id: str, now_ms: int
             ) -> list[tuple[str, str, int]]:
        """Lock (or renew) each queue for ``client_id``; the queues it holds now (free, expired, or its own)."""
        table = self._table.setdefault(group, {})
        ok = []
        for mq in mqs:
            entry = table.get(mq)
            if entry is None or entry[0] == client_id or now_ms - entry[1] > self.max_live_ms:
                table[mq] = [client_id, now_ms]
                ok.append(mq)
        return ok

    def unlock(self, group: str, mqs: list[tuple[str, str, int]], client_id: str) -> None:
        """Release the queues ``client_id`` holds (others' locks stay)."""
        table = self._table.get(group, {})
        for mq in mqs:
            entry = table.get(mq)
            if entry is not None and entry[0] == client_id:
                del table[mq]
        if not table:
            self._table.pop(group, None)

    def holder(self, group: str, mq: tuple[str, str, int], now_ms: int) -> str | None:
        entry = self._table.get(group, {}).get(mq)
        if entry is None or now_ms - entry[1] > self.max_live_ms:
            return None
        return entry[0]

    def clear(self) -> None:
        self._table.clear()
