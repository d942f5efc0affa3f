"""Pure decisions and body formats of the broker's admin, query and metadata codes (used by ``port_admin``).

Why a module of its own: the admin codes (mqadmin's updateTopic,
updateSubGroup, topicStatus, consumerProgress, brokerStatus, clusterList,
queryMsgById / queryMsgByKey, and a RocketMQ slave's SlaveSynchronize) answer
with RocketMQ's fastjson bodies, some of which are not JSON at all: a
``MessageQueue`` bean as a *map key* (``{{"brokerName":..,"queueId":0,..}:{..}}``
in GET_TOPIC_STATS_INFO and GET_CONSUME_STATS) and maps in Java ``HashMap``
iteration order.  Here are the argument checks (extFields -> values or a
RocketMQ error remark), the searches over a queue, and the body encoders,
each a small function with table tests; the port module only moves bytes.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import MAX_NAME_LENGTH
from dledger_rocketmq.store.consumequeue import java_string_hash
from dledger_rocketmq.store.metadata import (
    BENCHMARK_TOPIC,
    DEFAULT_TOPIC,
    OFFSET_MOVED_EVENT,
    PERM_INHERIT,
    PERM_READ,
    PERM_WRITE,
    SELF_TEST_TOPIC,
    subscription_group_config,
    topic_config,
)

# -- topics ---------------------------------------------------------------------------------------------------

#: RocketMQ's TopicValidator: the characters a topic may use, and its longest name.
TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
TOPIC_MAX_LENGTH = 127
#: Topics an admin may not create or change (TopicValidator's system topics; 4.9.8).
SYSTEM_TOPICS = frozenset({DEFAULT_TOPIC, "SCHEDULE_TOPIC_XXXX", BENCHMARK_TOPIC, "RMQ_SYS_TRANS_HALF_TOPIC",
                           "RMQ_SYS_TRACE_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC", "TRANS_CHECK_MAX_TIME_TOPIC",
                           SELF_TEST_TOPIC, OFFSET_MOVED_EVENT})
SYSTEM_TOPIC_PREFIX = "rmq_sys_"
#: Most queues an admin may give a topic (each queue is a directory of consume-queue files on every member).
MAX_QUEUE_NUMS = 16384
FILTER_TYPES = ("SINGLE_TAG", "MULTI_TAG")


def topic_name_error(topic: str | None) -> str | None:
    """RocketMQ's remark for a topic name an admin may not use (TopicValidator), None if it is fine."""
    if not topic or not topic.strip():
        return "The specified topic is blank."
    if not TOPIC_PATTERN.match(topic):
        return "The specified topic contains illegal characters, allowing only ^[%|a-zA-Z0-9_-]+$"
    if len(topic) > TOPIC_MAX_LENGTH:
        return "The specified topic is longer than topic max length."
    if topic in SYSTEM_TOPICS or topic.startswith(SYSTEM_TOPIC_PREFIX):
        return f"The topic[{topic}] is conflict with system topic."
    return None


def _int(ext: Mapping[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = ext.get(key)
    if value is None or value == "":
        if default is None:
            raise ValueError(f"the request lacks the field {key!r}")
        return default
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"field {key!r} is not an integer: {value!r:.40}") from None
    if not lo <= n <= hi:
        raise ValueError(f"field {key!r} = {n} is not in {lo}..{hi}")
    return n


def update_topic_config(ext: Mapping[str, Any]) -> tuple[dict[str, Any] | None, str | None]:
    """UPDATE_AND_CREATE_TOPIC's extFields -> (TopicConfig, None), or (None, the error remark).

    The fields are CreateTopicRequestHeader's: topic, readQueueNums,
    writeQueueNums, perm (required), topicFilterType, topicSysFlag, order.
    Unlike RocketMQ, a queue count outside 1..16384 or a perm outside 0..7
    is refused (RocketMQ stores what it is given, even 0 queues).
    """
    topic = ext.get("topic")
    problem = topic_name_error(topic)
    if problem is not None:
        return None, problem
    try:
        read = _int(ext, "readQueueNums", 1, MAX_QUEUE_NUMS)
        write = _int(ext, "writeQueueNums", 1, MAX_QUEUE_NUMS)
        perm = _int(ext, "perm", 0, PERM_READ | PERM_WRITE | PERM_INHERIT)
        sys_flag = _int(ext, "topicSysFlag", 0, (1 << 31) - 1, 0)
    except ValueError as exc:
        return None, str(exc)
    filter_type = ext.get("topicFilterType") or "SINGLE_TAG"
    if filter_type not in FILTER_TYPES:
        return None, f"field 'topicFilterType' = {filter_type!r:.40} is not one of {', '.join(FILTER_TYPES)}"
    order = str(ext.get("order", "false")).lower() == "true"
    return topic_config(topic, read, write, perm, order=order, filter_type=filter_type, sys_flag=sys_flag), None


# -- subscription groups --------------------------------------------------------------------------------------

#: SubscriptionGroupConfig's fields (4.9.8) and their JSON types.
GROUP_FIELDS: dict[str, type] = {"groupName": str, "consumeEnable": bool, "consumeFromMinEnable": bool,
                                 "consumeBroadcastEnable": bool, "retryQueueNums": int, "retryMaxTimes": int,
                                 "brokerId": int, "whichBrokerWhenConsumeSlowly": int,
                                 "notifyConsumerIdsChangedEnable": bool}


def group_name_error(group: Any) -> str | None:
    """Why ``group`` cannot name a subscription group (None if it can): empty, too long, '@' or a control char."""
    if not isinstance(group, str) or not group.strip():
        return "the subscription group name is blank"
    if len(group.encode("utf-8")) > MAX_NAME_LENGTH:
        return f"the subscription group name exceeds {MAX_NAME_LENGTH} bytes"
    if "@" in group or any(ord(c) < 32 for c in group):
        return "the subscription group name contains '@' or a control character"
    return None


def subscription_group_from_body(body: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """UPDATE_AND_CREATE_SUBSCRIPTIONGROUP's body (a SubscriptionGroupConfig) -> (config, None) or (None, why).

    Known fields are type-checked and the missing ones take RocketMQ's
    defaults; unknown fields are dropped (fastjson ignores them too).
    """
    try:
        data = fastjson.loads(body)
    except ValueError as exc:
        return None, f"the subscription group body is not JSON: {exc}"
    if not isinstance(data, dict):
        return None, "the subscription group body is not a JSON object"
    problem = group_name_error(data.get("groupName"))
    if problem is not None:
        return None, problem
    fields = {}
    for key, kind in GROUP_FIELDS.items():
        if key not in data or data[key] is None:
            continue
        value = data[key]
        if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
            return None, f"subscription group field {key!r} must be a {kind.__name__}, got {value!r:.40}"
        if kind is int and not -(1 << 31) <= value < (1 << 31):
            return None, f"subscription group field {key!r} = {value} is out of int range"
        fields[key] = value
    return subscription_group_config(fields.pop("groupName"), **fields), None


# -- MessageQueue-keyed bodies --------------------------------------------------------------------------------

def _i32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def message_queue_hash(broker_name: str, queue_id: int, topic: str) -> int:
    """Java ``MessageQueue.hashCode()`` (31-based over brokerName, queueId, topic)."""
    result = _i32(31 + java_string_hash(broker_name))
    result = _i32(31 * result + queue_id)
    return _i32(31 * result + java_string_hash(topic))


def java_order(keys: Iterable[Any], hash_of: Callable[[Any], int], *, capacity: int = 16,
               concurrent: bool = False) -> list[Any]:
    """``keys`` (insertion order) in the iteration order of a Java HashMap / ConcurrentHashMap.

    ``capacity`` is the constructor's argument (16 for ``new HashMap<>()``;
    a no-argument ``ConcurrentHashMap`` starts at 16 buckets, i.e. capacity 10
    here); buckets in index order, insertion order within a bucket.
    """
    keys = list(keys)
    n = fastjson.table_size(capacity, len(keys), concurrent=concurrent)

    def bucket(k: Any) -> int:
        h = hash_of(k) & 0xFFFFFFFF
        return (h ^ (h >> 16)) & (n - 1)
    return sorted(keys, key=bucket)


def java_double(value: float) -> str:
    """A double as fastjson writes it (``1.0``, ``0.5``, ``1.0E-5``)."""
    text = repr(float(value))
    if "e" in text:
        mantissa, _, exp = text.partition("e")
        if "." not in mantissa:
            mantissa += ".0"
        return f"{mantissa}E{int(exp)}"
    return text


MQ = tuple[str, int, str]  # (brokerName, queueId, topic)


def mq_table_json(entries: Mapping[MQ, dict[str, Any]], *, capacity: int = 16, concurrent: bool = False) -> str:
    """A ``{MessageQueue: bean}`` map as fastjson writes it: each key an object, unquoted, in Java map order."""
    order = java_order(entries, lambda k: message_queue_hash(*k), capacity=capacity, concurrent=concurrent)
    parts = []
    for mq in order:
        key = fastjson.dumps({"brokerName": mq[0], "queueId": mq[1], "topic": mq[2]})
        parts.append(f"{key}:{fastjson.dumps(dict(sorted(entries[mq].items())))}")
    return "{" + ",".join(parts) + "}"


def topic_stats_body(broker_name: str, topic: str, offsets: Mapping[int, tuple[int, int, int]]) -> bytes:
    """GET_TOPIC_STATS_INFO's TopicStatsTable: queue id -> (minOffset, maxOffset, lastUpdateTimestamp).

    The table is a no-argument ConcurrentHashMap (16 buckets).
    """
    entries = {(broker_name, q, topic): {"minOffset": lo, "maxOffset": hi, "lastUpdateTimestamp": ts}
               for q, (lo, hi, ts) in offsets.items()}
    return ('{"offsetTable":' + mq_table_json(entries, capacity=10, concurrent=True) + "}").encode("utf-8")


@dataclass(frozen=True)
class QueueProgress:
    """One queue of GET_CONSUME_STATS: the broker's max offset, the group's offset, the last consumed store time."""

    topic: str
    queue_id: int
    broker_offset: int
    consumer_offset: int
    last_timestamp: int


def consume_stats_body(broker_name: str, queues: Iterable[QueueProgress], consume_tps: float = 0.0) -> bytes:
    """GET_CONSUME_STATS's ConsumeStats: ``{"consumeTps":d,"offsetTable":{MessageQueue: OffsetWrapper}}``."""
    return consume_stats_json(broker_name, queues, consume_tps).encode()


def consume_stats_json(broker_name: str, queues: Iterable[QueueProgress], consume_tps: float = 0.0) -> str:
    """One ConsumeStats as fastjson writes it (the body of GET_CONSUME_STATS, an element of 317's lists)."""
    entries = {(broker_name, p.queue_id, p.topic): {"brokerOffset": p.broker_offset,
                                                    "consumerOffset": p.consumer_offset,
                                                    "lastTimestamp": p.last_timestamp} for p in queues}
    return f'{{"consumeTps":{java_double(consume_tps)},"offsetTable":{mq_table_json(entries)}}}'


def consume_stats_list_body(broker_addr: str, groups: Mapping[str, list[str]], total_diff: int) -> bytes:
    """GET_BROKER_CONSUME_STATS's ConsumeStatsList: ``groups`` maps each group to its ConsumeStats texts
    (:func:`consume_stats_json`), one ``{group: [..]}`` map per group as RocketMQ builds it."""
    items = ",".join(f"{{{fastjson.dumps(g)}:[{','.join(stats)}]}}" for g, stats in groups.items())
    return (f'{{"brokerAddr":{fastjson.dumps(broker_addr)},"consumeStatsList":[{items}],'
            f'"totalDiff":{total_diff}}}').encode()


def group_list_body(groups: Iterable[str]) -> bytes:
    """QUERY_TOPIC_CONSUME_BY_WHO's GroupList: ``{"groupList":[..]}`` in the HashSet's order."""
    order = fastjson.java_map_order(sorted(set(groups)), 16, concurrent=False)
    return fastjson.dumps({"groupList": order}).encode()


def broker_stats_body(view: Mapping[str, Mapping[str, float]]) -> bytes:
    """VIEW_BROKER_STATS_DATA's BrokerStatsData: statsDay / statsHour / statsMinute, each {avgpt, sum, tps}."""
    def item(s: Mapping[str, float]) -> str:
        return f'{{"avgpt":{java_double(s["avgpt"])},"sum":{int(s["sum"])},"tps":{java_double(s["tps"])}}}'
    return ("{" + ",".join(f'"{k}":{item(view[k])}' for k in ("statsDay", "statsHour", "statsMinute"))
            + "}").encode()


def producer_connection_body(connections: Iterable[Mapping[str, Any]]) -> bytes:
    """GET_PRODUCER_CONNECTION_LIST's ProducerConnection: ``{"connectionSet":[Connection..]}``."""
    return fastjson.dumps({"connectionSet": [dict(sorted(c.items())) for c in connections]}).encode()


def disk_ratio(total: int, free: int) -> str:
    """commitLogDiskRatio as RocketMQ reports it: (total - free) / total as a Java double (-1 if unknown).

    ``free`` is what Java's ``File.getFreeSpace`` gives (``f_bfree``, reserved blocks included);
    ``mqadmin clusterList`` prints it as #SPACE with 4 decimals.
    """
    return java_double((total - free) / total) if total > 0 else "-1"


def hours_since(now_ms: int, earliest_ms: int) -> str:
    """``clusterList``'s #Hour: hours since ``earliestMessageTimeStamp``, as mqadmin computes and prints it."""
    return f"{(now_ms - earliest_ms) / 1000.0 / 60.0 / 60.0:2.2f}"


# -- GET_BROKER_RUNTIME_INFO ------------------------------------------------------------------------------

#: The keys a 4.9.8 broker reports, in an insertion order that reproduces its HashMap order.  mqadmin
#: clusterList parses putTps / getTransferedTps (first word as a double), the msg*Total*Morning counters
#: (longs), earliestMessageTimeStamp (long), commitLogDiskRatio (double) and brokerVersionDesc.
RUNTIME_KEYS = (
    "msgPutTotalTodayNow", "commitLogDiskRatio", "getFoundTps", "EndTransactionThreadPoolQueueCapacity",
    "sendThreadPoolQueueHeadWaitTimeMills", "putMessageDistributeTime", "queryThreadPoolQueueHeadWaitTimeMills",
    "remainHowManyDataToFlush", "msgGetTotalTodayNow", "putMessageFailedTimes", "putLatency999",
    "commitLogMaxOffset", "queryThreadPoolQueueSize", "getMessageEntireTimeMax", "msgPutTotalTodayMorning",
    "putMessageTimesTotal", "putLatency99", "bootTimestamp", "msgGetTotalTodayMorning",
    "msgPutTotalYesterdayMorning", "msgGetTotalYesterdayMorning", "pullThreadPoolQueueSize", "brokerVersionDesc",
    "sendThreadPoolQueueSize", "startAcceptSendRequestTimeStamp", "commitLogMinOffset", "putMessageEntireTimeMax",
    "pullThreadPoolQueueHeadWaitTimeMills", "runtime", "earliestMessageTimeStamp", "commitLogDirCapacity",
    "dispatchMaxBuffer", "brokerVersion", "putTps", "remainTransientStoreBufferNumbs", "getMissTps",
    "queryThreadPoolQueueCapacity", "putMessageAverageSize", "getTransferedTps", "dispatchBehindBytes",
    "putMessageSizeTotal", "sendThreadPoolQueueCapacity", "EndTransactionQueueSize", "getTotalTps",
    "pullThreadPoolQueueCapacity", "consumeQueueDiskRatio", "pageCacheLockTimeMills",
)
#: What a key we do not measure reports (RocketMQ's own idle values).
RUNTIME_IDLE = {"getFoundTps": "0.0  ", "putTps": "0.0  ", "getMissTps": "0.0  ", "getTransferedTps": "0.0  ",
                "getTotalTps": "0.0 0.0 0.0", "putLatency99": "0.00", "putLatency999": "0.00",
                "putMessageAverageSize": "0.0", "putMessageDistributeTime": "null",
                "remainHowManyDataToFlush": "0 B", "remainTransientStoreBufferNumbs": "2147483647",
                "EndTransactionThreadPoolQueueCapacity": "100000", "queryThreadPoolQueueCapacity": "20000",
                "sendThreadPoolQueueCapacity": "10000", "pullThreadPoolQueueCapacity": "100000"}


def runtime_text(ms: int) -> str:
    """RocketMQ's ``runtime`` value: ``[ 0 days, 0 hours, 0 minutes, 31 seconds ]``."""
    s = max(ms, 0) // 1000
    return f"[ {s // 86400} days, {s % 86400 // 3600} hours, {s % 3600 // 60} minutes, {s % 60} seconds ]"


def capacity_text(total: int, free: int) -> str:
    """RocketMQ's ``commitLogDirCapacity``: ``Total : 252.0 GiB, Free : 70.3 GiB.``"""
    def human(n: int) -> str:
        if n < 1024:
            return f"{n} B"
        units = "KMGTPE"
        exp = 0
        value = float(n)
        while value >= 1024 and exp < len(units):
            value /= 1024
            exp += 1
        return f"{value:.1f} {units[exp - 1]}iB"
    return f"Total : {human(total)}, Free : {human(free)}."


def runtime_info_body(values: Mapping[str, str], disk_ratio_key: str | None = None) -> bytes:
    """The KVTable body ``{"table":{...}}``: every RUNTIME_KEYS key (``values`` over the idle defaults) plus
    ``commitLogDiskRatio_<path>``, in Java HashMap order."""
    table = {k: str(values.get(k, RUNTIME_IDLE.get(k, "0"))) for k in RUNTIME_KEYS}
    if disk_ratio_key is not None:
        table[disk_ratio_key] = str(values.get(disk_ratio_key, values.get("commitLogDiskRatio", "0")))
    ordered = {k: table[k] for k in java_order(table, java_string_hash)}
    return fastjson.dumps({"table": ordered}).encode("utf-8")


# -- queries ------------------------------------------------------------------------------------------------

def first_at_or_after(lo: int, hi: int, timestamp: int, store_time: Callable[[int], int]) -> int:
    """The first queue offset in [lo, hi) whose message was stored at or after ``timestamp`` (``hi`` if none).

    A binary search over store times (``store_time(offset)``), which grow
    along a queue.  RocketMQ's search stops at *any* message stored at
    exactly ``timestamp`` (offset 3 of a batch of three with one store time,
    in the recording), so a consumer reset to that time skips the batch's
    first messages; the first one is what a reset by time means.
    """
    while lo < hi:
        mid = (lo + hi) // 2
        if store_time(mid) < timestamp:
            lo = mid + 1
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class QueryArgs:
    """QUERY_MESSAGE's header: topic, key, maxNum, [beginTimestamp, endTimestamp], unique-key query or not."""

    topic: str
    key: str
    max_num: int
    begin: int
    end: int
    unique: bool


#: Most records one QUERY_MESSAGE answers, and most queue units it reads (the scan's bound; see docs).
QUERY_MAX_NUM = 64
QUERY_SCAN_LIMIT = 20000


def query_args(ext: Mapping[str, Any]) -> QueryArgs:
    """QUERY_MESSAGE's extFields (ValueError naming the field when one is missing or bad)."""
    topic, key = ext.get("topic"), ext.get("key")
    if not topic:
        raise ValueError("the request lacks the field 'topic'")
    if not key:
        raise ValueError("the request lacks the field 'key'")
    max_num = _int(ext, "maxNum", 1, 1 << 31, 32)
    begin = _int(ext, "beginTimestamp", -(1 << 63), (1 << 63) - 1, 0)
    end = _int(ext, "endTimestamp", -(1 << 63), (1 << 63) - 1, (1 << 63) - 1)
    unique = str(ext.get("_UNIQUE_KEY_QUERY", "false")).lower() == "true"
    return QueryArgs(topic, key, min(max_num, QUERY_MAX_NUM), begin, end, unique)


def key_matches(props: Mapping[str, str], key: str, unique: bool) -> bool:
    """Whether a message's properties carry ``key``: its UNIQ_KEY (unique query) or one of its KEYS words.

    RocketMQ's index holds both kinds under one hash, so a key query also finds
    a message whose UNIQ_KEY is the key; so does this.
    """
    if props.get("UNIQ_KEY") == key:
        return True
    return not unique and key in props.get("KEYS", "").split()
