"""The broker port: pure request/reply decisions, golden frame replay, and a client against an in-process group."""

from __future__ import annotations

import dataclasses
import json
import struct

import pytest
import pytest_twisted
from conftest import GOLDEN
from dledger_rocketmq.broker.broker import GetResult, GetStatus
from dledger_rocketmq.broker.port import (
    SEND_BATCH_MESSAGE,
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    V2_NAMES,
    ArgumentError,
    BrokerPort,
    PullArgs,
    SendArgs,
    decode_header,
    encode_command,
    pull_args,
    pull_reply,
    query_offset_reply,
    send_args,
    send_reply,
    send_topic_check,
    subscription_tags,
)
from dledger_rocketmq.client.client import PullResult, RocketMQClient, RocketMQError, client_factory
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.commitlog import PutResult, PutStatus
from rmq_cluster_util import broker_cluster, master, msg, put, settled
from twisted.internet.testing import StringTransport
from twisted.test.iosim import FakeTransport, connect

from dledger.transport.remoting import FrameSplitter, FrameTooLargeError, Header

FRAMES = GOLDEN / "frames"


def frame(name: str):
    [f] = FrameSplitter(header_decoder=decode_header).feed((FRAMES / f"{name}.bin").read_bytes())
    return f


# -- pure decisions ------------------------------------------------------------------------------------------

def test_send_args_v2_short_names_and_alions_numbers():
    """SEND_MESSAGE_V2's a..n names map to SendMessageRequestHeader fields; ali-ons numbers parse like strings."""
    java = send_args(310, frame("310-send-message-v2-request").header.ext_fields)
    assert (java.topic, java.queue_id, java.default_topic, java.batch) == ("GoldenTopic", 1, "TBW102", False)
    alions = send_args(310, frame("310-send-message-v2-alions-request").header.ext_fields)
    assert (alions.topic, alions.queue_id, alions.default_topic_queue_nums) == ("GoldenTopic", 0, 4)
    v1 = send_args(10, frame("010-send-message-request").header.ext_fields)
    assert (v1.topic, v1.queue_id, v1.producer_group) == ("GoldenTopic", 2, "golden_producer_group2")
    assert send_args(320, frame("320-send-batch-message-request").header.ext_fields).batch is True


@pytest.mark.parametrize("ext, error", [
    ({"b": "T"}, "queueId"),
    ({"b": "T", "e": "x"}, "not an integer"),
    ({"b": "T", "e": "99999999999"}, "out of range"),
])
def test_send_args_errors(ext, error):
    """A send header without a queue id, or with a non-number, is an ArgumentError naming the field."""
    with pytest.raises(ArgumentError, match=error):
        send_args(310, ext)


def _args(**kw) -> SendArgs:
    base = dict(producer_group="p", topic="T", default_topic="TBW102", default_topic_queue_nums=4, queue_id=1,
                sys_flag=0, born_timestamp=0, flag=0, properties="", reconsume_times=0, batch=False)
    base.update(kw)
    return SendArgs(**base)


TOPIC = {"topicName": "T", "perm": 6, "readQueueNums": 4, "writeQueueNums": 4}
DEFAULT = {"topicName": "TBW102", "perm": 7, "readQueueNums": 8, "writeQueueNums": 8}


@pytest.mark.parametrize("args, topic, default, code, created, queue", [
    (_args(), TOPIC, DEFAULT, None, None, 1),
    (_args(queue_id=-1), TOPIC, DEFAULT, None, None, 0),
    (_args(queue_id=4), TOPIC, DEFAULT, 1, None, 0),
    (_args(), None, DEFAULT, None, 4, 1),
    (_args(default_topic_queue_nums=16), None, DEFAULT, None, 8, 1),
    (_args(), None, None, 17, None, 0),
    (_args(), None, {**DEFAULT, "perm": 6}, 17, None, 0),
    (_args(), {**TOPIC, "perm": 4}, DEFAULT, 14, None, 0),
])
def test_send_topic_check(args, topic, default, code, created, queue):
    """Known topics pass, unknown ones are created from an inheritable default topic, else TOPIC_NOT_EXIST."""
    error, create, queue_id = send_topic_check(args, topic, default, can_create=True)
    assert (error.code if error else None) == code
    assert (create["writeQueueNums"] if create else None) == created
    assert queue_id == queue


@pytest.mark.parametrize("result, code, keys", [
    (PutResult(PutStatus.PUT_OK, "ID", 2, 5, 48, ("ID",), 1), 0, {"msgId", "queueId", "queueOffset"}),
    (PutResult(PutStatus.PUT_OK, "A", 2, 5, 48, ("A", "B"), 2), 0, {"msgId", "queueId", "queueOffset"}),
    (PutResult(PutStatus.SERVICE_NOT_AVAILABLE), 14, set()),
    (PutResult(PutStatus.MESSAGE_ILLEGAL, error="too big"), 13, set()),
    (PutResult(PutStatus.OS_PAGECACHE_BUSY), 2, set()),
    (PutResult(PutStatus.UNKNOWN_ERROR), 1, set()),
])
def test_send_reply(result, code, keys):
    """Put statuses map to SendMessageProcessor's response codes; SUCCESS carries msgId/queueId/queueOffset."""
    reply = send_reply(result)
    assert reply.code == code
    assert set(reply.ext) == keys | {"MSG_REGION", "TRACE_ON"}
    if len(result.msg_ids) > 1:
        assert reply.ext["msgId"] == "A,B"


def _pull(offset=0) -> PullArgs:
    return PullArgs("g", "T", 0, offset, 32, 4, 0, "*", "TAG")


@pytest.mark.parametrize("status, offset, is_master, code", [
    (GetStatus.FOUND, 0, True, 0),
    (GetStatus.NO_MATCHED_MESSAGE, 0, True, 20),
    (GetStatus.NO_MESSAGE_IN_QUEUE, 0, True, 19),
    (GetStatus.NO_MESSAGE_IN_QUEUE, 3, True, 21),
    (GetStatus.NO_MATCHED_LOGIC_QUEUE, 3, False, 20),
    (GetStatus.OFFSET_OVERFLOW_ONE, 7, True, 19),
    (GetStatus.OFFSET_OVERFLOW_BADLY, 9, True, 21),
    (GetStatus.OFFSET_OVERFLOW_BADLY, 9, False, 20),
    (GetStatus.OFFSET_TOO_SMALL, 0, True, 21),
])
def test_pull_reply(status, offset, is_master, code):
    """GetMessageStatus -> pull response code as PullMessageProcessor (no suspend); a slave never says MOVED."""
    result = GetResult(status, [b"r1", b"r2"] if status is GetStatus.FOUND else [], 8, 0, 7)
    reply = pull_reply(_pull(offset), result, is_master=is_master)
    assert (reply.code, reply.remark) == (code, status.name)
    assert set(reply.ext) == {"suggestWhichBrokerId", "nextBeginOffset", "minOffset", "maxOffset"}
    assert reply.body == (b"r1r2" if code == 0 else b"")


@pytest.mark.parametrize("expr, tags", [(None, None), ("*", None), ("A", ["A"]), ("A || B", ["A", "B"]),
                                        ("A||*", None)])
def test_subscription_tags(expr, tags):
    """TAG expressions split on ||; * means every message."""
    assert subscription_tags(expr) == tags


def test_pull_args_ignores_subscription_without_flag():
    """The subscription is read only with sysFlag bit 4 (as Java); the golden pull header parses."""
    a = pull_args(frame("011-pull-message-sysflag-subscription-found-request").header.ext_fields)
    assert (a.group, a.topic, a.queue_id, a.offset, a.max_nums, a.subscription) == \
        ("golden_pull_cg", "GoldenTopic", 2, 0, 32, "*")
    assert pull_args({"consumerGroup": "g", "topic": "T", "queueId": "0", "queueOffset": "0", "maxMsgNums": "1",
                      "sysFlag": "0", "subscription": "A"}).subscription is None


@pytest.mark.parametrize("stored, min_offset, code, offset", [(5, 0, 0, "5"), (-1, 0, 0, "0"), (-1, 3, 22, None)])
def test_query_offset_reply(stored, min_offset, code, offset):
    """A stored offset is returned; none and the queue starts at 0 -> 0; else QUERY_NOT_FOUND."""
    reply = query_offset_reply(stored, min_offset)
    assert reply.code == code and reply.ext.get("offset") == offset


def test_headers_both_serialize_types_round_trip():
    """A reply is written in the request's serialize type and decodes back to the same header."""
    for kind in ("JSON", "ROCKETMQ"):
        h = Header(0, 7, 1, "JAVA", 409, "FOUND", {"a": "1", "b": "x"}, kind)
        [f] = FrameSplitter(header_decoder=decode_header).feed(encode_command(h, b"body"))
        assert (f.header, f.body) == (h, b"body")
        assert struct.unpack_from(">I", encode_command(h), 4)[0] >> 24 == (1 if kind == "ROCKETMQ" else 0)


def test_oversized_frame_closes_connection(tmp_path):
    """A frame over maxFrameSize closes the connection without an answer (bounded buffers)."""
    cluster = broker_cluster(tmp_path)
    port = BrokerPort(master(cluster), "tcp:0", max_frame_size=1024)
    proto, tr = _server(port)
    proto.dataReceived(struct.pack(">i", 5000) + b"x" * 10)
    assert tr.disconnecting and tr.value() == b""
    assert isinstance(proto.splitter._broken, FrameTooLargeError)


# -- golden replay ------------------------------------------------------------------------------------------

def _server(port):
    proto = port.factory.buildProtocol(None)
    tr = StringTransport()
    proto.makeConnection(tr)
    return proto, tr


def _ask(cluster, port, name, *, expect_reply=True):
    proto, tr = _server(port)
    proto.dataReceived((FRAMES / f"{name}-request.bin").read_bytes())
    if not expect_reply:
        cluster.run(1.0)
        assert tr.value() == b""
        return None
    assert cluster.run_until(lambda: bool(tr.value()), 10), f"{name}: no reply"
    [got] = FrameSplitter(header_decoder=decode_header).feed(tr.value())
    return got


def _same_shape(got, name):
    [want] = FrameSplitter(header_decoder=decode_header).feed((FRAMES / f"{name}-response.bin").read_bytes())
    assert got.header.code == want.header.code, (name, got.header.remark)
    assert got.header.opaque == want.header.opaque
    assert got.header.serialize_type == want.header.serialize_type
    assert got.header.flag == want.header.flag == 1
    assert set(got.header.ext_fields or {}) == set(want.header.ext_fields or {}), name
    return want


def test_replay_golden_frames(tmp_path):
    """Recorded requests of the eight codes get replies with the recorded code, opaque, type and ext field names."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    port = BrokerPort(b, "tcp:0")
    for name in ["310-send-message-v2", "310-send-message-v2-alions", "310-send-message-v2-rocketmq-serialize",
                 "010-send-message", "320-send-batch-message", "310-send-message-v2-topic-not-exist"]:
        _same_shape(_ask(cluster, port, name), name)
    _ask(cluster, port, "310-send-message-v2-oneway", expect_reply=False)
    batch = _ask(cluster, port, "320-send-batch-message")
    assert len(batch.header.ext_fields["msgId"].split(",")) == 3
    while b.max_offset("GoldenTopic", 2) < 7:
        assert put(cluster, b, msg(topic="GoldenTopic", queue_id=2)).ok
    assert b.max_offset("GoldenTopic", 2) == 8
    assert settled(cluster)
    for name in ["011-pull-message-sysflag-subscription-found",
                 "011-pull-message-alions-sysflag-suspend-subscription-found",
                 "014-query-consumer-offset", "014-query-consumer-offset-alions", "015-update-consumer-offset-twoway",
                 "015-update-consumer-offset-alions-twoway", "030-get-max-offset", "031-get-min-offset"]:
        got = _ask(cluster, port, name)
        want = _same_shape(got, name)
        assert got.header.remark == want.header.remark
    assert b.query_offset("golden_pull_cg", "GoldenTopic", 2) == 3
    _ask(cluster, port, "015-update-consumer-offset-oneway", expect_reply=False)
    assert b.query_offset("golden_pull_cg", "GoldenTopic", 2) == 4
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    _same_shape(_ask(cluster, BrokerPort(slave, "tcp:0"), "310-send-message-v2-service-not-available"),
                "310-send-message-v2-service-not-available")


def test_unsupported_code_and_bad_fields(tmp_path):
    """Other request codes get REQUEST_CODE_NOT_SUPPORTED; a missing field gets SYSTEM_ERROR naming it."""
    cluster = broker_cluster(tmp_path)
    port = BrokerPort(master(cluster), "tcp:0")
    for code, ext, want in [(105, {"topic": "T"}, 3), (30, {"queueId": "0"}, 1), (11, {"topic": "T"}, 1)]:
        proto, tr = _server(port)
        proto.dataReceived(encode_command(Header(code, 9, 0, "JAVA", 409, None, ext)))
        [f] = FrameSplitter(header_decoder=decode_header).feed(tr.value())
        assert (f.header.code, f.header.opaque) == (want, 9)
        assert want == 3 or "topic" in f.header.remark or "consumerGroup" in f.header.remark


# -- client against an in-process group -------------------------------------------------------------------------

class _Conn:
    def __init__(self, cluster, port):
        self.cluster = cluster
        self.client = RocketMQClient(cluster.clock, timeout=5.0)
        sp = port.factory.buildProtocol(None)
        cp = client_factory(self.client).buildProtocol(None)
        self.pump = connect(sp, FakeTransport(sp, True), cp, FakeTransport(cp, False), greet=False)

    def wait(self, d):
        out = []
        d.addBoth(out.append)

        def check():
            self.pump.pump()
            return bool(out)
        assert self.cluster.run_until(check, 15), "no answer"
        if isinstance(out[0], Exception) or hasattr(out[0], "raiseException"):
            out[0].raiseException()
        return out[0]


def test_client_send_pull_offsets_and_slave(tmp_path):
    """The client sends, batch-sends and pulls through the port; offsets commit; a slave refuses sends, serves pulls."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    c = _Conn(cluster, BrokerPort(b, "tcp:0"))
    r = c.wait(c.client.send("TopicA", b"one", tags="A", keys=["k1", "k2"]))
    assert (r.queue_id, r.queue_offset) == (0, 0) and len(r.msg_id) == 32
    rb = c.wait(c.client.send_batch("TopicA", [b"two", b"three"], tags="B"))
    assert rb.queue_offset == 1 and len(rb.msg_id.split(",")) == 2
    assert settled(cluster)
    p = c.wait(c.client.pull("g", "TopicA", 0, 0, 32))
    assert isinstance(p, PullResult) and p.code == 0
    assert [m.body for m in p.messages] == [b"one", b"two", b"three"]
    assert p.messages[0].keys == ["k1", "k2"] and p.next_begin_offset == 3
    only_b = c.wait(c.client.pull("g", "TopicA", 0, 0, 32, subscription="B"))
    assert [m.body for m in only_b.messages] == [b"two", b"three"]
    assert c.wait(c.client.pull("g", "TopicA", 0, 3, 32)).code == 19
    assert c.wait(c.client.max_offset("TopicA", 0)) == 3
    assert c.wait(c.client.min_offset("TopicA", 0)) == 0
    c.wait(c.client.commit_offset("g", "TopicA", 0, 2))
    assert c.wait(c.client.query_offset("g", "TopicA", 0)) == 2
    with pytest.raises(RocketMQError) as err:
        c.wait(c.client.pull("g", "NoSuchTopic", 0, 0, 32))
    assert err.value.code == 17
    assert settled(cluster)  # the slave has applied the offset commit (the master's answer does not wait for it)
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    s = _Conn(cluster, BrokerPort(slave, "tcp:0"))
    with pytest.raises(RocketMQError) as err:
        s.wait(s.client.send("TopicA", b"x"))
    assert err.value.code == 14
    sp = s.wait(s.client.pull("g", "TopicA", 0, 1, 32))
    assert sp.code == 0 and [m.body for m in sp.messages] == [b"two", b"three"] and sp.suggest_broker_id == 0
    assert s.wait(s.client.query_offset("g", "TopicA", 0)) == 2


# -- real sockets ---------------------------------------------------------------------------------------------

@pytest.mark.network
@pytest_twisted.inlineCallbacks
def test_port_on_real_sockets_with_client_and_cli(reactor, tmp_path, capsys):
    """Members listen on 127.0.0.1; the client and the CLI send and pull; a slave refuses sends over TCP."""
    from dledger_rocketmq.client import cli as rmq_cli  # noqa: F401 (the CLI module the hook adds)
    from dledger_rocketmq.client.client import connect as rmq_connect
    from dledger_rocketmq.plugin import port_for
    from twisted.internet import threads

    from dledger import cli, plugins
    from dledger.testing import Cluster

    cluster = Cluster(3, seed=3, clock=reactor, plugin_manager=plugins.make_plugin_manager(),
                      store_base_dir=str(tmp_path), extras={"rocketmq.enabled": True,
                                                            "rocketmq.mappedFileSizeConsumeQueue": 1000,
                                                            "rocketmq.listen": "tcp:0:interface=127.0.0.1"})
    cluster.start()
    clients = []
    try:
        yield cluster.when(lambda: any(broker_for(s).role == "MASTER" for s in cluster.servers.values()), 20)
        ports = {}
        for s in cluster.servers.values():
            ports[s.self_id] = (yield port_for(s).listening).getHost().port
        m = next(s for s in cluster.servers.values() if broker_for(s).role == "MASTER")
        sl = next(s for s in cluster.servers.values() if s is not m)
        c = yield rmq_connect(reactor, "127.0.0.1", ports[m.self_id], timeout=5)
        clients.append(c)
        r = yield c.send("NetTopic", b"over tcp", tags="N")
        assert r.queue_offset == 0
        addr = f"127.0.0.1:{ports[m.self_id]}"
        status = yield threads.deferToThread(cli.main, ["rocketmq", "send", addr, "NetTopic", "cli-1", "cli-2",
                                                        "--batch", "--json"])
        assert status == 0
        yield cluster.when(lambda: broker_for(m).max_offset("NetTopic", 0) == 3, 10)
        p = yield c.pull("g", "NetTopic", 0, 0, 10)
        assert [x.body for x in p.messages] == [b"over tcp", b"cli-1", b"cli-2"]
        capsys.readouterr()
        status = yield threads.deferToThread(cli.main, ["rocketmq", "pull", addr, "g", "NetTopic", "--offset", "1",
                                                        "--commit", "--json"])
        out = json.loads(capsys.readouterr().out)
        assert status == 0 and [x["body"] for x in out["messages"]] == ["cli-1", "cli-2"]
        assert (yield c.query_offset("g", "NetTopic", 0)) == 3
        s = yield rmq_connect(reactor, "127.0.0.1", ports[sl.self_id], timeout=5)
        clients.append(s)
        with pytest.raises(RocketMQError) as err:
            yield s.send("NetTopic", b"refused")
        assert err.value.code == 14
        status = yield threads.deferToThread(cli.main, ["rocketmq", "offsets", "127.0.0.1:1", "NetTopic"])
        assert status == 1 and "cannot connect" in capsys.readouterr().err
    finally:
        for c in clients:
            c.close()
        yield cluster.stop()


@pytest.mark.network
@pytest_twisted.inlineCallbacks
def test_port_in_use_fails_the_start(reactor):
    """A broker port that cannot bind raises CannotListenError from startService (the member start fails)."""
    from types import SimpleNamespace

    from twisted.internet import protocol
    from twisted.internet.error import CannotListenError

    taken = reactor.listenTCP(0, protocol.Factory(), interface="127.0.0.1")
    try:
        broker = SimpleNamespace(server=SimpleNamespace(self_id="n0", clock=reactor))
        port = BrokerPort(broker, f"tcp:{taken.getHost().port}:interface=127.0.0.1", reactor=reactor)
        with pytest.raises(CannotListenError):
            port.startService()
        assert not port.running and port.listening_port is None
        assert not port._stats_loop.running  # no statistics timer left behind on the reactor
        assert (yield port.listening) is None
    finally:
        yield taken.stopListening()


def test_the_single_sends_of_one_read_are_one_store_batch_each_answered(tmp_path):
    """Three SEND_MESSAGE_V2 frames in one read: one append request of three records; three SUCCESS replies,
    each with its own consecutive queueOffset and msgId."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    port = BrokerPort(b, "tcp:0")
    first = _ask(cluster, port, "310-send-message-v2")  # the topic exists from here on
    assert first.header.code == 0
    calls = []
    real = b.server.handle_requests_answering
    b.server.handle_requests_answering = lambda reqs, *a: calls.extend(len(r.bodies()) for r in reqs) or real(reqs, *a)
    proto, tr = _server(port)
    proto.dataReceived((FRAMES / "310-send-message-v2-request.bin").read_bytes() * 3)
    assert calls == [3]
    splitter = FrameSplitter(header_decoder=decode_header)
    replies = []

    def three_replies() -> bool:
        replies.extend(splitter.feed(tr.value()))
        tr.clear()
        return len(replies) == 3
    assert cluster.run_until(three_replies, 10)
    assert [r.header.code for r in replies] == [0, 0, 0]
    offsets = [int(r.header.ext_fields["queueOffset"]) for r in replies]
    start = int(first.header.ext_fields["queueOffset"]) + 1
    assert offsets == [start, start + 1, start + 2]
    assert len({r.header.ext_fields["msgId"] for r in replies}) == 3


_V2_JAVA = {"a": "pg", "b": "T", "c": "TBW102", "d": "8", "e": "3", "f": "0", "g": "1764258000000", "h": "0",
            "i": "TAGS\u0001A\u0002UNIQ_KEY\u0001X", "j": "0", "k": "false", "m": "false", "n": "b0"}


@pytest.mark.parametrize("ext", [
    _V2_JAVA,
    {"b": "T", "e": "0"},  # every default
    {**_V2_JAVA, "d": "", "f": "", "g": "", "h": "", "j": "", "i": ""},  # empty fields: their defaults
    {**_V2_JAVA, "m": "TRUE", "f": "-2147483648", "g": "-9223372036854775808"},
    {**_V2_JAVA, "e": "2147483647", "g": "9223372036854775807"},
])
@pytest.mark.parametrize("code", [SEND_MESSAGE_V2, SEND_BATCH_MESSAGE])
def test_send_args_v2_fast_path_reads_what_the_general_path_reads(ext, code):
    """A well-formed V2 header is read straight from its short names: the same SendArgs as the general path
    (the V2 names renamed to V1's, as it does)."""
    renamed = {V2_NAMES[k]: v for k, v in ext.items()}
    general = send_args(SEND_MESSAGE, renamed)
    assert send_args(code, ext) == dataclasses.replace(general, batch=general.batch or code == SEND_BATCH_MESSAGE)


@pytest.mark.parametrize("ext, error", [
    ({"b": "T", "e": ""}, "queueId"),
    ({"b": "T", "e": "1", "d": "x"}, "defaultTopicQueueNums"),
    ({"b": "T", "e": "1", "f": "2147483648"}, "sysFlag"),
    ({"b": "T", "e": "1", "g": "9223372036854775808"}, "bornTimestamp"),
])
def test_send_args_v2_errors_name_the_field(ext, error):
    """What the fast path does not take goes the general way: the error names the field by its long name."""
    with pytest.raises(ArgumentError, match=error):
        send_args(SEND_MESSAGE_V2, ext)
