"""The name server's route table (RocketMQ 4.x RouteInfoManager semantics), pure: no I/O, time passed in.

Why a module of its own: every decision the name server makes -- who is
the master of a broker group, which queues a topic has, when a broker has
gone silent -- lives here as plain data and small functions, so the table
tests need no sockets and no reactor; :mod:`dledger_rocketmq.namesrv.namesrv` only
moves frames and time.

What it keeps (names as in RocketMQ): per brokerName a ``BrokerData``
(cluster, brokerName, ``brokerAddrs`` brokerId -> address; id 0 is the
master), per cluster the set of its brokerNames, per topic one
``QueueData`` per brokerName (taken from the *master's* registrations
only), and per broker address its liveness (last registration time, the
DataVersion it registered, its connection, its HA address).

Differences from RocketMQ 4.9.8, all on the side of a route that names
exactly one live master:

- one address has one brokerId per group (a broker switching from slave to
  master, or back, moves its entry instead of appearing twice);
- when the master's entry goes (it registers as a slave, unregisters, its
  connection closes or it expires) and another live broker of the group
  last registered as brokerId 0, that one becomes the master again at once
  instead of after its next registration (up to 30 s without a master);
- UNREGISTER_BROKER removes an id only if it still names the unregistering
  address (a late goodbye from an old master does not remove the new one),
  and every other id of that group naming the address (a removed member
  that stepped down from master says goodbye with its slave id: its stale
  brokerId 0 entry goes too, issue #23);
- a connection that closes removes every address registered over it.
"""

from __future__ import annotations

import json
import struct
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dledger_rocketmq.common import fastjson

MASTER_ID = 0
#: Seconds without a registration after which a broker is dropped (RocketMQ's BROKER_CHANNEL_EXPIRED_TIME).
BROKER_EXPIRY = 120.0
#: GET_ROUTEINFO_BY_TOPIC answers clients with a header ``version`` >= this (V4_9_4) in standard JSON.
STANDARD_JSON_VERSION = 401
#: Java map capacities of RouteInfoManager's tables (their iteration order is the order of the bodies).
BROKER_TABLE_CAPACITY = 128
CLUSTER_TABLE_CAPACITY = 32
SET_CAPACITY = 16


class RegisterBodyError(ValueError):
    """A REGISTER_BROKER body that is not a RegisterBrokerBody (JSON or compressed)."""


# -- RegisterBrokerBody: both forms ---------------------------------------------------------------------------

@dataclass
class RegisterBody:
    """A decoded RegisterBrokerBody: the broker's DataVersion, topic configs (name -> bean) and filter servers."""

    data_version: dict[str, int]
    topics: dict[str, dict[str, Any]]
    filter_servers: list[str] = field(default_factory=list)


def _data_version(value: Any) -> dict[str, int]:
    if not isinstance(value, dict):
        raise RegisterBodyError("dataVersion is not an object")
    out = {}
    for key in ("counter", "timestamp"):
        v = value.get(key, 0)
        if isinstance(v, bool) or not isinstance(v, int):
            raise RegisterBodyError(f"dataVersion.{key} is not an integer")
        out[key] = v
    return out


def _topic_bean(name: str, bean: Any) -> dict[str, Any]:
    if not isinstance(bean, dict):
        raise RegisterBodyError(f"topic config {name!r} is not an object")
    return {"order": bool(bean.get("order", False)), "perm": int(bean.get("perm", 6)),
            "readQueueNums": int(bean.get("readQueueNums", 16)),
            "topicFilterType": str(bean.get("topicFilterType", "SINGLE_TAG")), "topicName": name,
            "topicSysFlag": int(bean.get("topicSysFlag", 0)), "writeQueueNums": int(bean.get("writeQueueNums", 16))}


def decode_register_body(body: bytes, *, compressed: bool) -> RegisterBody:
    """The RegisterBrokerBody of a REGISTER_BROKER request (RegisterBodyError with a one-line reason)."""
    if not body:
        return RegisterBody({"counter": 0, "timestamp": 0}, {})
    if compressed:
        return _decode_compressed(body)
    try:
        data = fastjson.loads(body)
    except ValueError as exc:
        raise RegisterBodyError(f"register body: {exc}") from None
    if not isinstance(data, dict):
        raise RegisterBodyError("register body is not a JSON object")
    wrapper = data.get("topicConfigSerializeWrapper")
    wrapper = {} if wrapper is None else wrapper
    if not isinstance(wrapper, dict):
        raise RegisterBodyError("topicConfigSerializeWrapper is not an object")
    table = wrapper.get("topicConfigTable")
    table = {} if table is None else table
    if not isinstance(table, dict):
        raise RegisterBodyError("topicConfigTable is not an object")
    try:
        topics = {str(name): _topic_bean(str(name), bean) for name, bean in table.items()}
    except (TypeError, ValueError) as exc:
        raise RegisterBodyError(f"bad topic config: {exc}") from None
    servers = data.get("filterServerList")
    servers = [] if servers is None else servers
    if not isinstance(servers, list):
        raise RegisterBodyError("filterServerList is not a list")
    return RegisterBody(_data_version(wrapper.get("dataVersion", {})), topics, [str(s) for s in servers])


_I32 = struct.Struct(">i")
#: Inflated size limit: a compressed body may not expand without bound (a hostile zlib bomb).
MAX_INFLATED = 64 * 1024 * 1024


def _decode_compressed(body: bytes) -> RegisterBody:
    d = zlib.decompressobj()
    try:
        raw = d.decompress(body, MAX_INFLATED)
    except zlib.error as exc:
        raise RegisterBodyError(f"compressed register body: {exc}") from None
    if d.unconsumed_tail:
        raise RegisterBodyError(f"compressed register body inflates to more than {MAX_INFLATED} bytes")
    pos = 0

    def chunk() -> bytes:
        nonlocal pos
        if pos + 4 > len(raw):
            raise RegisterBodyError("compressed register body is truncated")
        (n,) = _I32.unpack_from(raw, pos)
        if n < 0 or pos + 4 + n > len(raw):
            raise RegisterBodyError(f"compressed register body: length {n} out of range")
        pos += 4 + n
        return raw[pos - n:pos]

    try:
        version = _data_version(json.loads(chunk()))
        if pos + 4 > len(raw):
            raise RegisterBodyError("compressed register body is truncated")
        (count,) = _I32.unpack_from(raw, pos)
        pos += 4
        if count < 0:
            raise RegisterBodyError(f"compressed register body: topic count {count}")
        topics = {}
        for _ in range(count):
            parts = chunk().decode("utf-8").split(" ")
            if len(parts) < 5:
                raise RegisterBodyError(f"compressed register body: bad topic config {' '.join(parts)!r:.60}")
            name, read, write, perm, kind = parts[:5]
            topics[name] = _topic_bean(name, {"readQueueNums": int(read), "writeQueueNums": int(write),
                                              "perm": int(perm), "topicFilterType": kind})
        servers = json.loads(chunk()) if pos < len(raw) else []
    except (UnicodeDecodeError, ValueError) as exc:
        if isinstance(exc, RegisterBodyError):
            raise
        raise RegisterBodyError(f"compressed register body: {exc}") from None
    if not isinstance(servers, list):
        raise RegisterBodyError("filterServerList is not a list")
    return RegisterBody(version, topics, [str(s) for s in servers])


def encode_register_body(data_version: Mapping[str, int], topics: Iterable[Mapping[str, Any]], *,
                         compressed: bool = False, filter_servers: Iterable[str] = ()) -> bytes:
    """A RegisterBrokerBody as a 4.9.8 broker sends it; ``topics`` in the broker's table (map) order.

    JSON: fastjson, bean fields alphabetical.  Compressed: zlib (level 9, as
    Java's BEST_COMPRESSION) of ``int32 len + DataVersion JSON, int32 count,
    per topic int32 len + "name read write perm filterType", int32 len +
    filterServerList JSON``.
    """
    version = {"counter": int(data_version["counter"]), "timestamp": int(data_version["timestamp"])}
    servers = list(filter_servers)
    if not compressed:
        table = {t["topicName"]: dict(sorted(_topic_bean(t["topicName"], t).items())) for t in topics}
        return fastjson.dumps({"filterServerList": servers, "topicConfigSerializeWrapper": {
            "dataVersion": version, "topicConfigTable": table}}).encode("utf-8")
    parts = []

    def put(b: bytes) -> None:
        parts.append(_I32.pack(len(b)) + b)
    put(fastjson.dumps(version).encode())
    # Java copies the table into a fresh ConcurrentHashMap (putAll presizes it for the count) and writes that
    # copy: its iteration order, not the table's.
    by_name = {t["topicName"]: t for t in topics}
    topics = [by_name[n] for n in fastjson.java_map_order(by_name, max(1, len(by_name)), concurrent=True)]
    parts.append(_I32.pack(len(topics)))
    for t in topics:
        bean = _topic_bean(t["topicName"], t)
        put(f"{bean['topicName']} {bean['readQueueNums']} {bean['writeQueueNums']} {bean['perm']} "
            f"{bean['topicFilterType']}".encode())
    put(fastjson.dumps(servers).encode())
    return zlib.compress(b"".join(parts), 9)


def body_crc32(body: bytes) -> int:
    """``bodyCrc32`` of a REGISTER_BROKER request: RocketMQ's UtilAll.crc32 (the CRC-32, sign bit cleared)."""
    return zlib.crc32(body) & 0x7FFFFFFF


def crc_matches(claimed: int, body: bytes) -> bool:
    """RocketMQ's check: a claimed CRC of 0 means "not sent"; any other must match the body."""
    return claimed == 0 or claimed == body_crc32(body)


# -- liveness decisions ---------------------------------------------------------------------------------------

def is_expired(last_update: float, now: float, expiry: float = BROKER_EXPIRY) -> bool:
    """RocketMQ's scanNotActiveBroker test: dropped once ``expiry`` seconds passed *strictly* since the update."""
    return last_update + expiry < now


def expired_brokers(last_updates: Mapping[str, float], now: float, expiry: float = BROKER_EXPIRY) -> list[str]:
    """The addresses whose last registration is older than ``expiry`` (sorted, for a stable log)."""
    return sorted(addr for addr, last in last_updates.items() if is_expired(last, now, expiry))


def queue_data(broker_name: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The QueueData a topic config of ``broker_name`` adds to the route (fields alphabetical, as fastjson)."""
    return {"brokerName": broker_name, "perm": int(config.get("perm", 6)),
            "readQueueNums": int(config.get("readQueueNums", 16)), "topicSysFlag": int(config.get("topicSysFlag", 0)),
            "writeQueueNums": int(config.get("writeQueueNums", 16))}


# -- the table ------------------------------------------------------------------------------------------------

@dataclass
class BrokerLive:
    """What the name server remembers of one broker address between registrations."""

    last_update: float
    data_version: dict[str, int] | None
    conn: Any
    ha_server_addr: str
    broker_name: str = ""
    broker_id: int = -1  # the id of its latest registration (a master that stepped down re-registers with another)


@dataclass(frozen=True)
class RegisterResult:
    """What a slave's registration answer carries: the group's master and its HA address (None: no master)."""

    master_addr: str | None = None
    ha_server_addr: str | None = None


class RouteTable:
    """RocketMQ's RouteInfoManager tables and operations (see the module docstring for the differences)."""

    def __init__(self) -> None:
        #: topic -> brokerName -> QueueData
        self.topic_queues: dict[str, dict[str, dict[str, Any]]] = {}
        #: brokerName -> {"cluster", "brokerName", "brokerAddrs": {id: addr}}
        self.brokers: dict[str, dict[str, Any]] = {}
        #: cluster -> brokerNames (insertion-ordered)
        self.clusters: dict[str, dict[str, None]] = {}
        self.live: dict[str, BrokerLive] = {}
        self.filter_servers: dict[str, list[str]] = {}

    # -- registration ---------------------------------------------------------------------
    def register(self, cluster: str, addr: str, name: str, broker_id: int, ha_server_addr: str,
                 body: RegisterBody, conn: Any, now: float) -> RegisterResult:
        """A REGISTER_BROKER: record the address under its id, the master's topics, liveness; the slave's answer."""
        self.clusters.setdefault(cluster, {})[name] = None
        data = self.brokers.get(name)
        first = data is None
        if data is None:
            data = self.brokers[name] = {"cluster": cluster, "brokerName": name, "brokerAddrs": {}}
        addrs: dict[int, str] = data["brokerAddrs"]
        for other in [i for i, a in addrs.items() if a == addr and i != broker_id]:
            del addrs[other]  # the same broker under another id (a role switch): one entry per address
        old = addrs.get(broker_id)
        addrs[broker_id] = addr
        first = first or old is None
        prev = self.live.get(addr)
        if broker_id == MASTER_ID and (first or prev is None or prev.data_version != body.data_version):
            for topic, config in body.topics.items():
                self.topic_queues.setdefault(topic, {})[name] = queue_data(name, config)
        self.live[addr] = BrokerLive(now, dict(body.data_version), conn, ha_server_addr, name, broker_id)
        if body.filter_servers:
            self.filter_servers[addr] = list(body.filter_servers)
        else:
            self.filter_servers.pop(addr, None)
        if broker_id == MASTER_ID:
            return RegisterResult()
        self._refill_master(name)
        master = addrs.get(MASTER_ID)
        live = self.live.get(master) if master is not None else None
        if live is None:
            return RegisterResult()
        return RegisterResult(master, live.ha_server_addr)

    def unregister(self, cluster: str, addr: str, name: str, broker_id: int) -> None:
        """An UNREGISTER_BROKER (a graceful stop)."""
        self.live.pop(addr, None)
        self.filter_servers.pop(addr, None)
        data = self.brokers.get(name)
        if data is not None:
            for i in [i for i, a in data["brokerAddrs"].items() if a == addr]:
                del data["brokerAddrs"][i]
        self._settle(name, cluster)

    def remove_addr(self, addr: str) -> list[str]:
        """Forget a broker address everywhere (its connection closed, or it expired); the brokerNames touched."""
        self.live.pop(addr, None)
        self.filter_servers.pop(addr, None)
        touched = []
        for name, data in list(self.brokers.items()):
            addrs = data["brokerAddrs"]
            gone = [i for i, a in addrs.items() if a == addr]
            for i in gone:
                del addrs[i]
            if gone:
                touched.append(name)
                self._settle(name, data["cluster"])
        return touched

    def connection_closed(self, conn: Any) -> list[str]:
        """Every address registered over ``conn`` is removed at once; the addresses removed."""
        addrs = [a for a, live in self.live.items() if live.conn is conn]
        for addr in addrs:
            self.remove_addr(addr)
        return addrs

    def expire(self, now: float, expiry: float = BROKER_EXPIRY) -> list[tuple[str, Any]]:
        """Drop brokers silent for more than ``expiry`` s; their (address, connection) pairs (to be closed)."""
        out = []
        for addr in expired_brokers({a: live.last_update for a, live in self.live.items()}, now, expiry):
            out.append((addr, self.live[addr].conn))
            self.remove_addr(addr)
        return out

    def query_data_version(self, addr: str, data_version: Mapping[str, int], now: float
                           ) -> tuple[bool, dict[str, int] | None]:
        """QUERY_DATA_VERSION: (changed, the stored DataVersion); an unchanged broker counts as alive again."""
        live = self.live.get(addr)
        changed = live is None or live.data_version != dict(data_version)
        if not changed:
            live.last_update = now
        return changed, (dict(live.data_version) if live is not None and live.data_version is not None else None)

    def _refill_master(self, name: str) -> None:
        """No master entry but a live broker of the group whose latest registration said brokerId 0: restore it."""
        data = self.brokers.get(name)
        if data is None or MASTER_ID in data["brokerAddrs"]:
            return
        claims = [(live.last_update, a) for a, live in self.live.items()
                  if live.broker_name == name and live.broker_id == MASTER_ID]
        if not claims:
            return
        _, addr = max(claims)
        addrs = data["brokerAddrs"]
        for other in [i for i, a in addrs.items() if a == addr]:
            del addrs[other]
        addrs[MASTER_ID] = addr

    def _settle(self, name: str, cluster: str) -> None:
        """After removals in group ``name``: refill its master, or drop the group, its cluster entry, its queues."""
        data = self.brokers.get(name)
        if data is None:
            return
        self._refill_master(name)
        if data["brokerAddrs"]:
            return
        del self.brokers[name]
        for cname in [cluster] + [c for c in self.clusters if c != cluster]:
            names = self.clusters.get(cname)
            if names is not None and name in names:
                del names[name]
                if not names:
                    del self.clusters[cname]
                break
        for topic in list(self.topic_queues):
            queues = self.topic_queues[topic]
            queues.pop(name, None)
            if not queues:
                del self.topic_queues[topic]

    # -- queries ------------------------------------------------------------------------------
    def route(self, topic: str) -> dict[str, Any] | None:
        """TopicRouteData of ``topic`` (None when no queue or no broker names it: TOPIC_NOT_EXIST)."""
        queues = self.topic_queues.get(topic)
        if not queues:
            return None
        datas = []
        filters: dict[str, list[str]] = {}
        for name in sorted(queues):
            data = self.brokers.get(name)
            if data is None:
                continue
            addrs = dict(sorted(data["brokerAddrs"].items()))
            datas.append({"brokerAddrs": addrs, "brokerName": name, "cluster": data["cluster"]})
            for addr in addrs.values():
                if addr in self.filter_servers:
                    filters[addr] = list(self.filter_servers[addr])
        if not datas:
            return None
        return {"brokerDatas": datas, "filterServerTable": filters,
                "queueDatas": [dict(queues[n]) for n in sorted(queues)]}

    def cluster_info(self) -> dict[str, Any]:
        """ClusterInfo: brokerAddrTable and clusterAddrTable in the iteration order of RocketMQ's HashMaps."""
        brokers = {}
        for name in fastjson.java_map_order(self.brokers, BROKER_TABLE_CAPACITY, concurrent=False):
            data = self.brokers[name]
            brokers[name] = {"brokerAddrs": dict(sorted(data["brokerAddrs"].items())), "brokerName": name,
                             "cluster": data["cluster"]}
        clusters = {c: fastjson.java_map_order(self.clusters[c], SET_CAPACITY, concurrent=False)
                    for c in fastjson.java_map_order(self.clusters, CLUSTER_TABLE_CAPACITY, concurrent=False)}
        return {"brokerAddrTable": brokers, "clusterAddrTable": clusters}

    def delete_topic(self, topic: str) -> bool:
        """RouteInfoManager.deleteTopic (mqadmin deleteTopic / deleteSubGroup's retry topic): the topic's queue
        data goes; a broker that still has the topic brings it back with its next registration, as in RocketMQ."""
        return self.topic_queues.pop(topic, None) is not None

    def topic_list(self) -> list[str]:
        """Every topic with a route, in the order RocketMQ writes them (its TopicList is a default HashSet)."""
        return fastjson.java_map_order(self.topic_queues, SET_CAPACITY, concurrent=False)

    def masters(self, name: str) -> list[str]:
        """The addresses group ``name``'s route names as master (never more than one)."""
        data = self.brokers.get(name)
        return [a for i, a in (data["brokerAddrs"].items() if data else ()) if i == MASTER_ID]


# -- bodies ---------------------------------------------------------------------------------------------------

def route_body(route: Mapping[str, Any], client_version: int) -> bytes:
    """GET_ROUTEINFO_BY_TOPIC's body: standard JSON (quoted keys) for clients >= V4_9_4, else fastjson."""
    if client_version >= STANDARD_JSON_VERSION:
        std = {**route, "brokerDatas": [{**d, "brokerAddrs": {str(i): a for i, a in d["brokerAddrs"].items()}}
                                        for d in route["brokerDatas"]]}
        return json.dumps(std, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return fastjson.dumps(dict(route)).encode("utf-8")


def cluster_info_body(info: Mapping[str, Any]) -> bytes:
    return fastjson.dumps(dict(info)).encode("utf-8")


def topic_list_body(topics: Iterable[str]) -> bytes:
    return fastjson.dumps({"topicList": list(topics)}).encode("utf-8")


def data_version_body(version: Mapping[str, int]) -> bytes:
    return fastjson.dumps({"counter": int(version["counter"]), "timestamp": int(version["timestamp"])}).encode()


def parse_data_version(body: bytes) -> dict[str, int]:
    """The DataVersion JSON body of QUERY_DATA_VERSION (RegisterBodyError if malformed)."""
    try:
        return _data_version(fastjson.loads(body))
    except ValueError as exc:
        if isinstance(exc, RegisterBodyError):
            raise
        raise RegisterBodyError(f"data version body: {exc}") from None
