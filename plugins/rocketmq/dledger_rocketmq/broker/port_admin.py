"""The broker port's admin, query and metadata codes (an extension module of :mod:`dledger_rocketmq.broker.port`).

``install(port)`` adds handlers for what mqadmin and a RocketMQ slave send
to a broker:

- topics and subscription groups: UPDATE_AND_CREATE_TOPIC (17),
  DELETE_TOPIC_IN_BROKER (215), UPDATE_AND_CREATE_SUBSCRIPTIONGROUP (200),
  DELETE_SUBSCRIPTIONGROUP (207).  Unlike RocketMQ (which changes the
  master's table and lets slaves copy it every 10 s), each change is a
  CONTROL entry in the dledger log (:mod:`~dledger_rocketmq.common.control` kinds
  3-6) applied by every member in log order, and the reply is sent once the
  entry is committed and applied here: a new master knows every topic
  created before the switch;
- the slave-sync serving side: GET_ALL_TOPIC_CONFIG (21),
  GET_ALL_CONSUMER_OFFSET (43), GET_ALL_DELAY_OFFSET (45),
  GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201), bodies in RocketMQ's fastjson form;
- queries: SEARCH_OFFSET_BY_TIMESTAMP (29), GET_EARLIEST_MSG_STORETIME (32),
  VIEW_MESSAGE_BY_ID (33), QUERY_MESSAGE (12, a bounded scan of the topic's
  queues instead of an index file), GET_BROKER_RUNTIME_INFO (28),
  GET_TOPIC_STATS_INFO (202), GET_CONSUME_STATS (208);
- statistics and who is connected (mqadmin statsAll, brokerConsumeStats,
  producerConnection, queryMsgById's message track): VIEW_BROKER_STATS_DATA
  (315), GET_BROKER_CONSUME_STATS (317), QUERY_TOPIC_CONSUME_BY_WHO (300),
  GET_PRODUCER_CONNECTION_LIST (204).  The figures are the port's
  :class:`~dledger_rocketmq.broker.brokerstats.BrokerStatsManager` (``port.broker_stats``).

The decisions and body formats are in :mod:`dledger_rocketmq.broker.admin`.
"""

from __future__ import annotations

import os
import struct
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.errors import DLedgerError
from dledger_rocketmq.broker import admin
from dledger_rocketmq.broker.port import (
    QUERY_NOT_FOUND,
    SUCCESS,
    SYSTEM_ERROR,
    TOPIC_NOT_EXIST,
    VERSION,
    Reply,
    Request,
    ext_int,
    ext_str,
)
from dledger_rocketmq.broker.sync import SyncKind, master_body
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import (
    KIND_GROUP_CONFIG,
    KIND_GROUP_DELETE,
    KIND_TOPIC_CONFIG,
    KIND_TOPIC_DELETE,
)
from dledger_rocketmq.common.errors import CodecError
from dledger_rocketmq.common.message import MESSAGE_MAGIC, decode_record
from dledger_rocketmq.store.commitlog import store_timestamp_position

log = Logger()

QUERY_MESSAGE = 12
UPDATE_AND_CREATE_TOPIC = 17
GET_ALL_TOPIC_CONFIG = 21
GET_BROKER_RUNTIME_INFO = 28
SEARCH_OFFSET_BY_TIMESTAMP = 29
GET_EARLIEST_MSG_STORETIME = 32
VIEW_MESSAGE_BY_ID = 33
GET_ALL_CONSUMER_OFFSET = 43
GET_ALL_DELAY_OFFSET = 45
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
GET_ALL_SUBSCRIPTIONGROUP_CONFIG = 201
GET_TOPIC_STATS_INFO = 202
DELETE_SUBSCRIPTIONGROUP = 207
GET_CONSUME_STATS = 208
DELETE_TOPIC_IN_BROKER = 215
GET_PRODUCER_CONNECTION_LIST = 204
QUERY_TOPIC_CONSUME_BY_WHO = 300
VIEW_BROKER_STATS_DATA = 315
GET_BROKER_CONSUME_STATS = 317

#: UPDATE_AND_CREATE_TOPIC's success remark, as a 4.9.8 broker sends it (it never sets one).
NOT_SET = "not set any response code"
#: Bytes read to find a record's store time: up to STORETIMESTAMP with IPv6 hosts.
_TIME_PREFIX = 80
_I32, _I64 = struct.Struct(">i"), struct.Struct(">q")


def install(port) -> None:
    """Add this module's handlers to a BrokerPort (``port.EXTENSIONS``)."""
    AdminHandlers(port).install()


class AdminHandlers:
    """The handlers of one port (they read ``port.broker``); see the module docstring."""

    def __init__(self, port) -> None:
        self.port = port
        self.boot_ms = port.now_ms()

    @property
    def broker(self):
        return self.port.broker

    def install(self) -> None:
        self.port.handlers.update({
            UPDATE_AND_CREATE_TOPIC: self.update_topic, DELETE_TOPIC_IN_BROKER: self.delete_topic,
            UPDATE_AND_CREATE_SUBSCRIPTIONGROUP: self.update_group, DELETE_SUBSCRIPTIONGROUP: self.delete_group,
            GET_ALL_TOPIC_CONFIG: self.all_topics, GET_ALL_CONSUMER_OFFSET: self.all_offsets,
            GET_ALL_DELAY_OFFSET: self.all_delay_offsets, GET_ALL_SUBSCRIPTIONGROUP_CONFIG: self.all_groups,
            SEARCH_OFFSET_BY_TIMESTAMP: self.search_offset, GET_EARLIEST_MSG_STORETIME: self.earliest_time,
            VIEW_MESSAGE_BY_ID: self.view_message, QUERY_MESSAGE: self.query_message,
            GET_BROKER_RUNTIME_INFO: self.runtime_info, GET_TOPIC_STATS_INFO: self.topic_stats,
            GET_CONSUME_STATS: self.consume_stats, QUERY_TOPIC_CONSUME_BY_WHO: self.consume_by_who,
            VIEW_BROKER_STATS_DATA: self.view_stats, GET_BROKER_CONSUME_STATS: self.broker_consume_stats,
            GET_PRODUCER_CONNECTION_LIST: self.producer_connections,
        })

    # -- reading the store ---------------------------------------------------------------------------
    def record_at(self, phys: int) -> bytes | None:
        """The whole committed record starting at physical offset ``phys``, or None if none starts there."""
        broker = self.broker
        try:
            head = broker.get_message(phys, 8)
            size, magic = struct.unpack(">ii", head)
            if magic != MESSAGE_MAGIC or not 8 < size <= broker.options.max_message_size + 1024:
                return None
            data = broker.get_message(phys, size)
            decode_record(data, verify_crc=False)
            return data
        except (DLedgerError, CodecError, ValueError, OSError, struct.error):
            return None

    def unit_store_time(self, topic: str, queue_id: int, offset: int) -> int:
        """STORETIMESTAMP of the message at a queue offset; -1 if there is none (RocketMQ's getStoreTime)."""
        q = self.broker._queue(topic, queue_id)
        unit = q.get(offset) if q is not None else None
        if unit is None or unit.is_filler:
            return -1
        try:
            head = self.broker.get_message(unit.physical_offset, min(unit.size, _TIME_PREFIX))
            (sys_flag,) = _I32.unpack_from(head, 36)
            return _I64.unpack_from(head, store_timestamp_position(sys_flag))[0]
        except (DLedgerError, ValueError, OSError, struct.error):
            return -1

    # -- topics and groups through the log ---------------------------------------------------------------
    def _not_master(self) -> Reply | None:
        broker = self.broker
        if broker.role == "MASTER":
            return None
        leader = broker.server.state.leader_id
        return Reply(SYSTEM_ERROR, f"{broker.server.self_id} is not the master (leader {leader}); send admin "
                                   "requests to the master")

    def _change(self, kind: int, configs: list[dict], reply: Reply) -> Deferred:
        return self.broker.change_metadata(kind, configs).addCallback(lambda _: reply)

    def update_topic(self, req: Request) -> Reply | Deferred:
        config, problem = admin.update_topic_config(req.ext)
        if problem is None and config["topicName"] == self.broker.options.cluster_name:
            problem = f"the topic[{config['topicName']}] is conflict with system reserved words."
        if problem is not None:
            return Reply(SYSTEM_ERROR, problem)
        return self._not_master() or self._change(KIND_TOPIC_CONFIG, [config], Reply(SUCCESS, NOT_SET))

    def delete_topic(self, req: Request) -> Reply | Deferred:
        topic = ext_str(req.ext, "topic")
        problem = admin.topic_name_error(topic)
        if problem is not None:
            return Reply(SYSTEM_ERROR, problem)
        return self._not_master() or self._change(KIND_TOPIC_DELETE, [{"topicName": topic}], Reply(SUCCESS))

    def update_group(self, req: Request) -> Reply | Deferred:
        config, problem = admin.subscription_group_from_body(req.body)
        if problem is not None:
            return Reply(SYSTEM_ERROR, problem)
        return self._not_master() or self._change(KIND_GROUP_CONFIG, [config], Reply(SUCCESS))

    def delete_group(self, req: Request) -> Reply | Deferred:
        group = ext_str(req.ext, "groupName")
        problem = admin.group_name_error(group)
        if problem is not None:
            return Reply(SYSTEM_ERROR, problem)
        return self._not_master() or self._change(KIND_GROUP_DELETE, [{"groupName": group}], Reply(SUCCESS))

    # -- slave sync, serving side ---------------------------------------------------------------------------
    def all_topics(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, {}, master_body(self.broker.meta, SyncKind.TOPIC_CONFIG))

    def all_offsets(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, None, master_body(self.broker.meta, SyncKind.CONSUMER_OFFSET))

    def all_delay_offsets(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, None, master_body(self.broker.meta, SyncKind.DELAY_OFFSET))

    def all_groups(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, None, master_body(self.broker.meta, SyncKind.SUBSCRIPTION_GROUP))

    # -- queries ------------------------------------------------------------------------------------------
    def search_offset(self, req: Request) -> Reply:
        topic, queue_id = ext_str(req.ext, "topic"), ext_int(req.ext, "queueId")
        timestamp = ext_int(req.ext, "timestamp", bits=64)
        q = self.broker._queue(topic, queue_id)
        offset = 0
        if q is not None and q.max_offset > q.min_offset:
            offset = admin.first_at_or_after(q.min_offset, q.max_offset, timestamp,
                                             lambda o: self.unit_store_time(topic, queue_id, o))
        return Reply(SUCCESS, None, {"offset": str(offset)})

    def earliest_time(self, req: Request) -> Reply:
        topic, queue_id = ext_str(req.ext, "topic"), ext_int(req.ext, "queueId")
        q = self.broker._queue(topic, queue_id)
        ts = self.unit_store_time(topic, queue_id, q.min_offset) if q is not None and q.max_offset > 0 else -1
        return Reply(SUCCESS, None, {"timestamp": str(ts)})

    def view_message(self, req: Request) -> Reply:
        offset = ext_int(req.ext, "offset", bits=64)
        data = self.record_at(offset)
        if data is None:
            return Reply(SYSTEM_ERROR, f"can not find message by the offset, {offset}")
        return Reply(SUCCESS, None, None, data)

    def query_message(self, req: Request) -> Reply:
        try:
            args = admin.query_args(req.ext)
        except ValueError as exc:
            return Reply(SYSTEM_ERROR, str(exc))
        found = self.scan_for_key(args)
        last = self.broker.commitlog.max_physical_offset()
        ext = {"indexLastUpdateTimestamp": str(self.last_store_time()), "indexLastUpdatePhyoffset": str(last)}
        if not found:
            return Reply(QUERY_NOT_FOUND, "can not find message, maybe time range not correct", ext)
        return Reply(SUCCESS, None, ext, b"".join(found))

    def scan_for_key(self, args: admin.QueryArgs) -> list[bytes]:
        """Records of ``args.topic`` carrying the key and stored in [begin, end], newest first per queue.

        No index file: every queue of the topic is read backwards from its end,
        at most QUERY_SCAN_LIMIT units in all, stopping a queue at the first
        message stored before ``begin`` (store times grow along a queue).
        """
        queues = self.broker.dispatcher.queues
        if queues is None:
            return []
        found: list[tuple[int, bytes]] = []
        budget = admin.QUERY_SCAN_LIMIT
        for q in sorted((q for q in queues.queues() if q.topic == args.topic), key=lambda q: q.queue_id):
            offset = q.max_offset - 1
            while offset >= q.min_offset and budget > 0 and len(found) < args.max_num:
                budget -= 1
                unit = q.get(offset)
                offset -= 1
                if unit is None or unit.is_filler:
                    continue
                data = self.record_at(unit.physical_offset)
                if data is None:
                    continue
                record = decode_record(data, verify_crc=False)
                if record.store_timestamp < args.begin:
                    break
                if record.store_timestamp <= args.end and admin.key_matches(record.property_map, args.key,
                                                                            args.unique):
                    found.append((unit.physical_offset, data))
        return [data for _, data in sorted(found)[:args.max_num]]

    def last_store_time(self) -> int:
        """Store time of the newest record (QUERY_MESSAGE's indexLastUpdateTimestamp); 0 if none is known."""
        queues = self.broker.dispatcher.queues
        best = (-1, None)
        for q in (queues.queues() if queues is not None else []):
            if q.max_offset > q.min_offset and q.max_physical_offset > best[0]:
                best = (q.max_physical_offset, q)
        if best[1] is None:
            return 0
        q = best[1]
        return max(self.unit_store_time(q.topic, q.queue_id, q.max_offset - 1), 0)

    def topic_stats(self, req: Request) -> Reply:
        topic = ext_str(req.ext, "topic")
        config = self.broker.meta.topics.get(topic)
        if config is None:
            return Reply(TOPIC_NOT_EXIST, f"topic[{topic}] not exist")
        offsets = {}
        for i in range(int(config.get("writeQueueNums", 0))):
            lo, hi = max(self.broker.min_offset(topic, i), 0), max(self.broker.max_offset(topic, i), 0)
            ts = max(self.unit_store_time(topic, i, hi - 1), 0) if hi > 0 else 0
            offsets[i] = (lo, hi, ts)
        return Reply(SUCCESS, None, None, admin.topic_stats_body(self.broker.options.broker_name, topic, offsets))

    def group_progress(self, group: str, topic: str, queue_count_key: str = "readQueueNums"
                       ) -> list[admin.QueueProgress] | None:
        """Each queue's broker offset, the group's offset and the last consumed store time (None: no topic)."""
        broker = self.broker
        config = broker.meta.topics.get(topic)
        if config is None:
            return None
        progress = []
        for i in range(int(config.get(queue_count_key, 0))):
            consumer = max(broker.query_offset(group, topic, i), 0)
            last = self.unit_store_time(topic, i, consumer - 1) if consumer > 0 else 0
            progress.append(admin.QueueProgress(topic, i, max(broker.max_offset(topic, i), 0), consumer,
                                                max(last, 0)))
        return progress

    def consume_stats(self, req: Request) -> Reply:
        group = ext_str(req.ext, "consumerGroup")
        wanted = req.ext.get("topic")
        broker = self.broker
        offsets = broker.meta.offsets
        topics = [wanted] if wanted else sorted({c.topic for c in offsets.items() if c.group == group})
        progress, tps = [], 0.0
        for topic in topics:
            queues = self.group_progress(group, topic)
            if queues is None:
                continue
            progress.extend(queues)
            tps += self.port.broker_stats.group_get_tps(group, topic)
        return Reply(SUCCESS, None, None, admin.consume_stats_body(broker.options.broker_name, progress, tps))

    def consume_by_who(self, req: Request) -> Reply:
        """QUERY_TOPIC_CONSUME_BY_WHO: the groups online subscribing to the topic, and those with offsets in it."""
        topic = ext_str(req.ext, "topic")
        groups = {c.group for c in self.broker.meta.offsets.items() if c.topic == topic}
        registry = getattr(getattr(self.port, "sessions", None), "registry", None)
        if registry is not None:
            groups.update(g for g, info in registry.consumers.items() if topic in info.subscriptions)
        return Reply(SUCCESS, None, None, admin.group_list_body(groups))

    def view_stats(self, req: Request) -> Reply:
        """VIEW_BROKER_STATS_DATA: one BrokerStatsManager item's minute, hour and day windows."""
        name, key = ext_str(req.ext, "statsName"), ext_str(req.ext, "statsKey")
        view = self.port.broker_stats.view(name, key)
        if view is None:
            return Reply(SYSTEM_ERROR, f"The stats <{name}> <{key}> not exist")
        return Reply(SUCCESS, None, None, admin.broker_stats_body(view))

    def broker_consume_stats(self, req: Request) -> Reply:
        """GET_BROKER_CONSUME_STATS (mqadmin brokerConsumeStats): every subscription group's ConsumeStats per topic
        it has offsets in (with ``isOrder``, ordered topics only), and the sum of their lags."""
        broker = self.broker
        is_order = str(req.ext.get("isOrder", "false")).lower() == "true"
        by_group: dict[str, list[str]] = {}
        total_diff = 0
        offsets = list(broker.meta.offsets.items())
        for group in fastjson.java_map_order(broker.meta.groups.table, 1024):  # subscriptionGroupTable's order
            texts = []
            for topic in sorted({c.topic for c in offsets if c.group == group}):
                config = broker.meta.topics.get(topic)
                if config is None or (is_order and not config.get("order", False)):
                    continue
                queues = self.group_progress(group, topic, "writeQueueNums") or []
                total_diff += sum(q.broker_offset - q.consumer_offset for q in queues)
                texts.append(admin.consume_stats_json(broker.options.broker_name, queues,
                                                      self.port.broker_stats.group_get_tps(group, topic)))
            by_group[group] = texts
        addr = str(broker.store_host)
        return Reply(SUCCESS, None, None, admin.consume_stats_list_body(addr, by_group, total_diff))

    def producer_connections(self, req: Request) -> Reply:
        """GET_PRODUCER_CONNECTION_LIST (mqadmin producerConnection): the group's producer connections."""
        group = ext_str(req.ext, "producerGroup")
        registry = getattr(getattr(self.port, "sessions", None), "registry", None)
        members = registry.producers.get(group) if registry is not None else None
        if not members:
            return Reply(SYSTEM_ERROR, f"the producer group[{group}] not exist")
        return Reply(SUCCESS, None, None, admin.producer_connection_body(c.to_json() for c in members.values()))

    def runtime_info(self, req: Request) -> Reply:
        broker = self.broker
        now = self.port.now_ms()
        commitlog = broker.commitlog
        values: dict[str, Any] = {
            "brokerVersionDesc": "V4_9_8", "brokerVersion": str(VERSION), "bootTimestamp": str(self.boot_ms),
            "runtime": admin.runtime_text(now - self.boot_ms),
            "commitLogMinOffset": str(commitlog.min_physical_offset()),
            "commitLogMaxOffset": str(commitlog.max_physical_offset()),
            "dispatchBehindBytes": str(broker.lag()),
            "earliestMessageTimeStamp": str(self.earliest_store_time()),
        }
        values.update(self.port.broker_stats.runtime_values())
        try:
            st = os.statvfs(broker.root)
            total, free = st.f_blocks * st.f_frsize, st.f_bfree * st.f_frsize
            ratio = admin.disk_ratio(total, free)
            values.update(commitLogDiskRatio=ratio, consumeQueueDiskRatio=ratio,
                          commitLogDirCapacity=admin.capacity_text(total, free))
        except OSError:
            values.update(commitLogDiskRatio="-1", consumeQueueDiskRatio="-1", commitLogDirCapacity="unknown")
        key = f"commitLogDiskRatio_{broker.root}"
        return Reply(SUCCESS, None, None, admin.runtime_info_body(values, key))

    def earliest_store_time(self) -> int:
        """Store time of the oldest record still in the log (-1 if none), for earliestMessageTimeStamp."""
        queues = self.broker.dispatcher.queues
        best = None
        for q in (queues.queues() if queues is not None else []):
            unit = q.get(q.min_offset) if q.max_offset > q.min_offset else None
            if unit is not None and (best is None or unit.physical_offset < best[0]):
                best = (unit.physical_offset, q)
        if best is None:
            return -1
        q = best[1]
        return self.unit_store_time(q.topic, q.queue_id, q.min_offset)
