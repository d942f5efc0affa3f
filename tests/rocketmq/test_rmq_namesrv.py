"""The name server: route table decisions, register bodies, golden replay of scenario 1, expiry on task.Clock."""

from __future__ import annotations

import json
import zlib
from datetime import datetime

import pytest
from conftest import GOLDEN
from dledger_rocketmq.broker.port import decode_header, encode_command
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.namesrv import routes
from dledger_rocketmq.namesrv.namesrv import NameServer
from dledger_rocketmq.namesrv.routes import RegisterBody, RouteTable
from twisted.internet.testing import MemoryReactorClock, StringTransport

from dledger.transport.remoting import FrameSplitter, Header

FRAMES = GOLDEN / "frames"
STREAM = GOLDEN / "streams" / "1-admin-routes"


def frame(name: str):
    [f] = FrameSplitter(header_decoder=decode_header).feed((FRAMES / f"{name}.bin").read_bytes())
    return f


def frames_of(data: bytes):
    return list(FrameSplitter(header_decoder=decode_header).feed(data))


def body(counter: int = 1, topics: dict | None = None) -> RegisterBody:
    topics = topics if topics is not None else {"T": {"topicName": "T", "perm": 6, "readQueueNums": 4,
                                                      "writeQueueNums": 4}}
    return RegisterBody({"counter": counter, "timestamp": 5}, topics)


def reg(table: RouteTable, addr: str, broker_id: int, *, name: str = "g", counter: int = 1, conn=None,
        now: float = 0.0, topics: dict | None = None):
    return table.register("C", addr, name, broker_id, addr + "ha", body(counter, topics), conn, now)


# -- pure decisions -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("last, now, expired", [
    (0.0, 119.9, False),
    (0.0, 120.0, False),  # RocketMQ: last + 120 s < now, strictly
    (0.0, 120.001, True),
    (100.0, 200.0, False),
    (100.0, 221.0, True),
])
def test_is_expired(last, now, expired):
    """A broker is expired only once more than 120 s passed since its last registration."""
    assert routes.is_expired(last, now) is expired


def test_expired_brokers_sorted():
    """expired_brokers names exactly the silent addresses, sorted."""
    assert routes.expired_brokers({"b:1": 0.0, "a:1": 1.0, "c:1": 200.0}, 200.0) == ["a:1", "b:1"]


def test_slave_learns_master_and_master_gets_empty_answer():
    """A slave's registration answer names the master and its HA address; a master's answer is empty."""
    t = RouteTable()
    assert reg(t, "s:1", 1) == routes.RegisterResult()  # no master yet
    assert reg(t, "m:1", 0) == routes.RegisterResult()
    assert reg(t, "s:1", 1) == routes.RegisterResult("m:1", "m:1ha")


def test_new_master_replaces_old_and_route_names_one_master():
    """A broker registering as id 0 moves the previous master out, and its own slave entry goes."""
    t = RouteTable()
    reg(t, "a:1", 0)
    reg(t, "b:1", 2)
    reg(t, "c:1", 3)
    reg(t, "c:1", 0)  # c became master (a was killed or stepped down)
    addrs = t.route("T")["brokerDatas"][0]["brokerAddrs"]
    assert addrs == {0: "c:1", 2: "b:1"} and t.masters("g") == ["c:1"]
    reg(t, "a:1", 1)  # the old master re-registers as a slave
    assert t.route("T")["brokerDatas"][0]["brokerAddrs"] == {0: "c:1", 1: "a:1", 2: "b:1"}


def test_master_stepping_down_restores_the_other_claimant():
    """An old master that steps down (re-registers as slave) hands id 0 back to the live broker that claimed it."""
    t = RouteTable()
    reg(t, "b:1", 0, now=1)  # new master
    reg(t, "a:1", 0, now=2)  # a stale master's periodic registration overwrites it
    assert t.masters("g") == ["a:1"]
    reg(t, "a:1", 1, now=3)  # the stale master steps down
    assert t.masters("g") == ["b:1"] and t.route("T")["brokerDatas"][0]["brokerAddrs"] == {0: "b:1", 1: "a:1"}


def test_connection_close_removes_broker_and_group_topics():
    """A closed connection removes its brokers at once; the last broker of a group takes the group's topics."""
    t = RouteTable()
    m, s = object(), object()
    reg(t, "m:1", 0, conn=m)
    reg(t, "s:1", 1, conn=s)
    assert t.connection_closed(m) == ["m:1"]
    assert t.route("T")["brokerDatas"][0]["brokerAddrs"] == {1: "s:1"}
    assert reg(t, "s:1", 1, conn=s) == routes.RegisterResult()  # no master: no masterAddr
    t.connection_closed(s)
    assert t.route("T") is None and t.brokers == {} and t.clusters == {} and t.topic_list() == []


def test_unregister_only_removes_the_unregistering_address():
    """A late UNREGISTER_BROKER of an old master does not remove the new master of the same id."""
    t = RouteTable()
    reg(t, "new:1", 0)
    t.unregister("C", "old:1", "g", 0)
    assert t.masters("g") == ["new:1"]
    t.unregister("C", "new:1", "g", 0)
    assert t.route("T") is None


def test_topics_come_from_the_master_and_changed_versions_only():
    """Queue data is taken from id-0 registrations, and again only when the DataVersion changed."""
    t = RouteTable()
    reg(t, "s:1", 1, topics={"S": {"topicName": "S"}})
    assert t.route("S") is None
    reg(t, "m:1", 0, counter=1)
    reg(t, "m:1", 0, counter=1, topics={"T": {"topicName": "T", "perm": 2, "readQueueNums": 8,
                                               "writeQueueNums": 8}})
    assert t.route("T")["queueDatas"][0]["readQueueNums"] == 4  # same version: not re-read
    reg(t, "m:1", 0, counter=2, topics={"T": {"topicName": "T", "perm": 2, "readQueueNums": 8,
                                               "writeQueueNums": 8}})
    assert t.route("T")["queueDatas"] == [{"brokerName": "g", "perm": 2, "readQueueNums": 8, "topicSysFlag": 0,
                                           "writeQueueNums": 8}]


def test_query_data_version_refreshes_only_unchanged():
    """QUERY_DATA_VERSION: an unchanged DataVersion keeps the broker alive; a changed one does not."""
    t = RouteTable()
    reg(t, "m:1", 0, counter=3, now=0)
    assert t.query_data_version("m:1", {"counter": 3, "timestamp": 5}, 100) == (False, {"counter": 3,
                                                                                         "timestamp": 5})
    assert t.live["m:1"].last_update == 100
    assert t.query_data_version("m:1", {"counter": 4, "timestamp": 5}, 200)[0] is True
    assert t.live["m:1"].last_update == 100
    assert t.query_data_version("x:1", {"counter": 0, "timestamp": 0}, 1) == (True, None)


def test_expire_drops_silent_brokers_and_returns_connections():
    """RouteTable.expire drops brokers silent for more than 120 s and hands back their connections."""
    t = RouteTable()
    c = object()
    reg(t, "m:1", 0, conn=c, now=0)
    reg(t, "s:1", 1, now=100)
    assert t.expire(120) == []
    assert t.expire(121) == [("m:1", c)]
    assert t.masters("g") == [] and t.route("T")["brokerDatas"][0]["brokerAddrs"] == {1: "s:1"}


# -- register bodies ------------------------------------------------------------------------------------------

REGISTER_REQUESTS = sorted(p.stem for p in FRAMES.glob("103-*-request.bin"))


@pytest.mark.parametrize("name", REGISTER_REQUESTS)
def test_register_bodies_decode_and_reencode_byte_for_byte(name):
    """Every recorded RegisterBrokerBody (JSON and zlib) decodes, passes bodyCrc32 and re-encodes to its bytes."""
    f = frame(name)
    ext = f.header.ext_fields
    compressed = ext["compressed"] == "true"
    assert routes.crc_matches(int(ext["bodyCrc32"]), f.body)
    b = routes.decode_register_body(f.body, compressed=compressed)
    assert b.topics and b.data_version["timestamp"] > 0
    assert routes.encode_register_body(b.data_version, b.topics.values(), compressed=compressed,
                                       filter_servers=b.filter_servers) == f.body


@pytest.mark.parametrize("data, compressed, error", [
    (b"{", False, "not JSON"),
    (b"[1]", False, "not a JSON object"),
    (b'{"topicConfigSerializeWrapper":{"topicConfigTable":[]}}', False, "not an object"),
    (b"\x78\xda garbage", True, "compressed register body"),
    (zlib.compress(b"\x00\x00\x00\x02{}"), True, "truncated"),
    (zlib.compress(b"\x7f\x00\x00\x00"), True, "out of range"),
])
def test_bad_register_bodies_are_one_line_errors(data, compressed, error):
    """A malformed register body is a RegisterBodyError naming the problem."""
    with pytest.raises(routes.RegisterBodyError, match=error):
        routes.decode_register_body(data, compressed=compressed)


def test_route_body_standard_json_for_new_clients_fastjson_for_old():
    """Route bodies: quoted keys for version >= 401, fastjson's unquoted numeric keys for ali-ons (121)."""
    route = {"brokerDatas": [{"brokerAddrs": {0: "a:1", 2: "b:1"}, "brokerName": "g", "cluster": "C"}],
             "filterServerTable": {}, "queueDatas": []}
    assert b'{"0":"a:1","2":"b:1"}' in routes.route_body(route, 409)
    assert b'{0:"a:1",2:"b:1"}' in routes.route_body(route, 121)


# -- the service: frames in, frames out ------------------------------------------------------------------------

class Conn:
    """One client connection to a NameServer over a StringTransport."""

    def __init__(self, ns: NameServer):
        self.proto = ns.factory.buildProtocol(None)
        self.transport = StringTransport()
        self.proto.makeConnection(self.transport)
        self.splitter = FrameSplitter(header_decoder=decode_header)

    def send(self, data: bytes) -> list:
        self.proto.dataReceived(data)
        out = self.transport.value()
        self.transport.clear()
        return list(self.splitter.feed(out))

    def ask(self, code: int, ext: dict | None = None, body: bytes = b"", *, opaque: int = 1, version: int = 409,
            oneway: bool = False):
        replies = self.send(encode_command(Header(code, opaque, 2 if oneway else 0, "JAVA", version, None, ext),
                                           body))
        assert len(replies) == (0 if oneway else 1)
        return replies[0] if replies else None

    def close(self) -> None:
        self.proto.connectionLost(None)


def register_ext(addr: str, broker_id: int, data: bytes, *, name: str = "g", compressed: bool = False) -> dict:
    return {"brokerName": name, "brokerAddr": addr, "clusterName": "C", "haServerAddr": addr + "ha",
            "brokerId": str(broker_id), "compressed": "true" if compressed else "false",
            "bodyCrc32": str(routes.body_crc32(data))}


def topics_body(counter: int = 1, **kw) -> bytes:
    return routes.encode_register_body({"counter": counter, "timestamp": 7},
                                       [{"topicName": "T", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}], **kw)


@pytest.fixture
def ns():
    clock = MemoryReactorClock()
    server = NameServer("tcp:9876", reactor=clock)
    server.startService()
    yield server
    server.stopService()


def test_register_route_and_unknown_codes(ns):
    """Over the wire: registrations (JSON, compressed), the route, a bad CRC, unknown codes, a missing topic."""
    m, s = Conn(ns), Conn(ns)
    data = topics_body()
    r = m.ask(103, register_ext("m:1", 0, data), data)
    assert (r.header.code, r.header.ext_fields, r.body) == (0, {}, b"")
    cdata = topics_body(compressed=True)
    r = s.ask(103, register_ext("s:1", 1, cdata, compressed=True), cdata)
    assert r.header.code == 0 and r.header.ext_fields == {"haServerAddr": "m:1ha", "masterAddr": "m:1"}
    r = s.ask(105, {"topic": "T"})
    assert json.loads(r.body)["brokerDatas"][0]["brokerAddrs"] == {"0": "m:1", "1": "s:1"}
    bad = s.ask(103, {**register_ext("s:1", 1, cdata, compressed=True), "bodyCrc32": "12"}, cdata)
    assert (bad.header.code, bad.header.remark) == (1, "crc32 not match")
    garbled = s.ask(103, register_ext("s:1", 1, b"{oops"), b"{oops")
    assert garbled.header.code == 1 and "not JSON" in garbled.header.remark
    r = s.ask(999)
    assert (r.header.code, r.header.remark) == (3, " request type 999 not supported")
    r = s.ask(105, {"topic": "Nope"})
    assert r.header.code == 17 and r.header.remark.startswith("No topic route info in name server for the topic: Nope")
    assert s.ask(103, register_ext("s:1", 1, data), data, oneway=True) is None  # oneway: never answered


def test_connection_close_removes_at_once_and_silence_after_120s(ns):
    """A broker goes the moment its connection closes; a silent one after 120 s (scan every 10 s, task clock)."""
    clock = ns.clock
    m, s = Conn(ns), Conn(ns)
    data = topics_body()
    m.ask(103, register_ext("m:1", 0, data), data)
    s.ask(103, register_ext("s:1", 1, data), data)
    m.close()
    assert ns.table.masters("g") == [] and "m:1" not in ns.table.live
    clock.advance(110)
    s.ask(322, {"brokerAddr": "s:1", "brokerName": "g", "clusterName": "C", "brokerId": "1"},
          routes.data_version_body({"counter": 1, "timestamp": 7}))  # unchanged: alive again at 110
    clock.advance(120)
    assert "s:1" in ns.table.live and not s.transport.disconnecting
    clock.advance(10)  # 240 s: last update 110 + 120 < 240
    assert "s:1" not in ns.table.live and s.transport.disconnecting
    assert ns.table.route("T") is None


def test_unregister_and_cluster_topic_lists(ns):
    """UNREGISTER_BROKER answers with no extFields; cluster info and topic list use fastjson's forms."""
    c = Conn(ns)
    data = topics_body()
    c.ask(103, register_ext("m:1", 0, data), data)
    c.ask(103, register_ext("n:1", 0, data, name="h"), data)
    info = c.ask(106)
    assert info.body.startswith(b'{"brokerAddrTable":{') and b'{0:"m:1"}' in info.body
    assert fastjson.loads(info.body)["clusterAddrTable"] == {"C": ["g", "h"]}
    assert json.loads(c.ask(206).body) == {"topicList": ["T"]}
    r = c.ask(104, {"brokerName": "g", "brokerAddr": "m:1", "clusterName": "C", "brokerId": "0"})
    assert (r.header.code, r.header.ext_fields) == (0, None)
    assert fastjson.loads(c.ask(106).body)["clusterAddrTable"] == {"C": ["h"]}


def test_delete_topic_in_namesrv(ns):
    """DELETE_TOPIC_IN_NAMESRV (216, the second half of mqadmin deleteTopic): the route goes until a broker
    registers the topic again; an unknown topic is fine, a request without a topic is SYSTEM_ERROR."""
    c = Conn(ns)
    data = topics_body()
    c.ask(103, register_ext("m:1", 0, data), data)
    assert c.ask(105, {"topic": "T"}).header.code == 0
    assert c.ask(216, {"topic": "T"}).header.code == 0
    assert c.ask(105, {"topic": "T"}).header.code == 17 and json.loads(c.ask(206).body) == {"topicList": []}
    assert c.ask(216, {"topic": "Nope"}).header.code == 0
    assert c.ask(216, {}).header.code == 1
    c.ask(103, register_ext("m:1", 0, topics_body(counter=2)), topics_body(counter=2))
    assert c.ask(105, {"topic": "T"}).header.code == 0


def test_missing_field_is_system_error(ns):
    """A register request without brokerAddr is answered SYSTEM_ERROR naming the field."""
    c = Conn(ns)
    r = c.ask(103, {"brokerName": "g", "clusterName": "C", "brokerId": "0"})
    assert r.header.code == 1 and "brokerAddr" in r.header.remark


# -- golden replay ----------------------------------------------------------------------------------------------

def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _rows():
    lines = (STREAM / "frames.tsv").read_text().splitlines()
    head = lines[0].split("\t")
    rows = [dict(zip(head, line.split("\t"), strict=False)) for line in lines[1:]]
    return [r for r in rows if r["connection"].endswith("-namesrv.0")]


def _by_opaque(frames):
    return {f.header.opaque: f for f in frames}


def test_replay_scenario_1_into_our_name_server():
    """Scenario 1 replayed: the brokers' registrations and mqadmin's requests get the recorded replies."""
    clock = MemoryReactorClock()
    ns = NameServer("tcp:9876", reactor=clock)
    conns: dict[str, Conn] = {}
    ours: dict[str, list] = {}
    rows = sorted((r for r in _rows() if r["dir"] == "c2s"), key=lambda r: r["time(UTC)"])
    assert len(rows) > 40
    codes = set()
    for row in rows:
        name = row["connection"]
        if name not in conns:
            conns[name] = Conn(ns)
            ours[name] = []
        clock.advance(max(0.0, _epoch(row["time(UTC)"]) - clock.seconds()))
        data = (STREAM / f"{name}.c2s.bin").read_bytes()
        off, n = int(row["offset"]), int(row["length"])
        ours[name] += conns[name].send(data[off:off + n])
        codes.add(int(row["code"]))
    assert codes == {103, 105, 106, 206, 322}
    compared = 0
    for name, conn_replies in ours.items():
        recorded = _by_opaque(frames_of((STREAM / f"{name}.s2c.bin").read_bytes()))
        mine = _by_opaque(conn_replies)
        assert set(recorded) <= set(mine), name
        for opaque, want in recorded.items():
            got = mine[opaque]
            assert (got.header.code, got.header.remark, got.header.ext_fields) == (
                want.header.code, want.header.remark, want.header.ext_fields), (name, opaque)
            assert got.body == want.body, (name, opaque, got.body[:200], want.body[:200])
            compared += 1
    assert compared == sum(len(frames_of((STREAM / f"{n}.s2c.bin").read_bytes())) for n in ours) >= 30


@pytest.mark.parametrize("pair", ["105-get-routeinfo-by-topic-alions", "105-get-routeinfo-by-topic-rocketmq-serialize",
                                  "105-get-routeinfo-by-topic-topic-not-exist"])
def test_single_route_requests_after_golden_registrations(pair):
    """ali-ons (version 121) gets fastjson keys, a ROCKETMQ-serialized request a binary reply, a missing topic 17."""
    clock = MemoryReactorClock()
    ns = NameServer("tcp:9876", reactor=clock)
    for name in ["103-register-broker-slave-request", "103-register-broker-master-oneway-request",
                 "103-register-broker-master-request", "103-register-broker-slave-compressed-request"]:
        Conn(ns).send((FRAMES / f"{name}.bin").read_bytes())
    [got] = Conn(ns).send((FRAMES / f"{pair}-request.bin").read_bytes())
    want = frame(f"{pair}-response")
    assert (got.header.code, got.header.remark, got.header.serialize_type) == (
        want.header.code, want.header.remark, want.header.serialize_type)
    if want.body:
        assert got.body == want.body  # byte for byte: quoted keys for 4.9.8, unquoted for ali-ons
