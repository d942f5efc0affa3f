"""Client sessions: heartbeat parsing, the group registry's decisions, golden replays of 34/35/38/40/203, expiry."""

from __future__ import annotations

import json

import pytest
from conftest import GOLDEN
from dledger_rocketmq.broker.clients import (
    ClientChannel,
    ClientRegistry,
    ConsumerData,
    ConsumerGroup,
    Heartbeat,
    HeartbeatError,
    Subscription,
    consumer_list_reply,
    parse_heartbeat,
    pull_subscription_check,
)
from dledger_rocketmq.broker.port import BrokerPort, decode_header, encode_command
from dledger_rocketmq.client.client import RocketMQClient
from dledger_rocketmq.plugin import broker_for
from rmq_cluster_util import broker_cluster, master
from twisted.internet.defer import Deferred
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport

from dledger.transport.remoting import FrameSplitter, Header

FRAMES = GOLDEN / "frames"


def golden(name: str):
    [f] = FrameSplitter(header_decoder=decode_header).feed((FRAMES / f"{name}.bin").read_bytes())
    return f


def hb(client: str, *consumers: ConsumerData, producers: tuple[str, ...] = ()) -> Heartbeat:
    return Heartbeat(client, producers, consumers)


def sub(topic: str, version: int = 1, expr: str = "*") -> Subscription:
    return Subscription(topic, expr, sub_version=version)


# -- parsing ---------------------------------------------------------------------------------------------------

def test_parse_golden_heartbeats():
    """The four recorded HeartbeatData bodies (Java producer/push/pull, ali-ons push) parse to their groups."""
    producer = parse_heartbeat(golden("034-heart-beat-producer-request").body)
    assert producer.client_id == "192.0.2.2@golden-producer"
    assert producer.producer_groups == ("golden_producer_group", "CLIENT_INNER_PRODUCER") and not producer.consumers
    push = parse_heartbeat(golden("034-heart-beat-consumer-consume-passively-request").body)
    [data] = push.consumers
    assert (data.group, data.consume_type, data.consume_from_where) == \
        ("golden_push_cg", "CONSUME_PASSIVELY", "CONSUME_FROM_FIRST_OFFSET")
    topic, retry = data.subscriptions
    assert topic.tags_set == ("TagA", "TagBig", "TagC", "TagB") and topic.code_set[1] == -1797401818
    assert topic.tag_codes == {2598919, -1797401818, 2598921, 2598920}
    assert (retry.topic, retry.sub_string, retry.tag_codes) == ("%RETRY%golden_push_cg", "*", None)
    pull = parse_heartbeat(golden("034-heart-beat-consumer-consume-actively-request").body)
    assert pull.consumers[0].consume_type == "CONSUME_ACTIVELY" and pull.client_id.endswith("@STREAM")
    alions = parse_heartbeat(golden("034-heart-beat-alions-consumer-consume-passively-request").body)
    [a] = alions.consumers
    assert a.subscriptions[0].expression_type == "TAG" and a.subscriptions[0].sub_version == 1795427018641


@pytest.mark.parametrize("body, error", [
    (b"not json", "not JSON"),
    (b"[1]", "not a JSON object"),
    (b'{"consumerDataSet":[]}', "clientID"),
    (b'{"clientID":"c","producerDataSet":[1]}', "producerDataSet item"),
    (b'{"clientID":"c","consumerDataSet":[{"groupName":"g","subscriptionDataSet":[{"topic":"T",'
     b'"subVersion":"x"}]}]}', "subVersion"),
])
def test_parse_heartbeat_errors(body, error):
    """A body that is not HeartbeatData is a one-line HeartbeatError (answered SYSTEM_ERROR), never a traceback."""
    with pytest.raises(HeartbeatError, match=error):
        parse_heartbeat(body)


# -- the registry -----------------------------------------------------------------------------------------------

def test_registry_membership_changes_are_reported():
    """Joining, a topic added or dropped are changes; a repeated heartbeat or a newer subVersion are not."""
    r = ClientRegistry()
    a, b = object(), object()
    assert r.heartbeat(a, hb("A", ConsumerData("g", subscriptions=(sub("T"),))), now_ms=0) == ["g"]
    assert r.heartbeat(a, hb("A", ConsumerData("g", subscriptions=(sub("T"),))), now_ms=1) == []
    assert r.heartbeat(a, hb("A", ConsumerData("g", subscriptions=(sub("T", 5, "X"),))), now_ms=2) == []
    assert r.subscription("g", "T").sub_string == "X"
    assert r.heartbeat(a, hb("A", ConsumerData("g", subscriptions=(sub("T", 3, "OLD"),))), now_ms=3) == []
    assert r.subscription("g", "T").sub_string == "X"  # an older heartbeat does not take it back
    assert r.heartbeat(b, hb("B", ConsumerData("g", subscriptions=(sub("T", 5), sub("U")))), now_ms=4) == ["g"]
    assert r.consumer_ids("g") == ["A", "B"]
    assert r.heartbeat(b, hb("B", ConsumerData("g", subscriptions=(sub("T", 5),))), now_ms=5) == ["g"]
    assert r.subscription("g", "U") is None


def test_registry_leaving_notifies_the_rest():
    """Unregister or a closed connection removes the channel; only groups with members left are notified."""
    r = ClientRegistry()
    a, b = object(), object()
    r.heartbeat(a, hb("A", ConsumerData("g"), ConsumerData("solo"), producers=("p",)), now_ms=0)
    r.heartbeat(b, hb("B", ConsumerData("g")), now_ms=0)
    assert r.unregister(b, consumer_group="g") == ["g"]
    assert r.consumer_ids("g") == ["A"]
    assert r.unregister(b, consumer_group="g") == []  # not a member any more
    r.heartbeat(b, hb("B", ConsumerData("g")), now_ms=0)
    assert sorted(r.channel_closed(a)) == ["g"]  # "solo" is empty and gone, nobody to tell
    assert "solo" not in r.consumers and "p" not in r.producers
    assert r.unregister(b, producer_group="p") == []
    assert r.channel_closed(b) == [] and r.consumers == {}


@pytest.mark.parametrize("last, now, expired", [(0, 119_999, False), (0, 120_000, True), (50_000, 169_999, False)])
def test_registry_expiry(last, now, expired):
    """A channel is expired 120 s after its last heartbeat (producer or consumer), not before."""
    r = ClientRegistry()
    a = object()
    r.heartbeat(a, hb("A", ConsumerData("g"), producers=("p",)), now_ms=last)
    assert r.expired(now) == ([a] if expired else [])
    assert r.last_heartbeat_ms(a) == last and r.last_heartbeat_ms(object()) is None


def test_replies_and_subscription_checks():
    """Consumer list: ids or SYSTEM_ERROR as recorded; pull checks: not exist, not latest, broadcast, found."""
    assert consumer_list_reply("g", []) == (1, "no consumer for this group, g", b"")
    assert consumer_list_reply("g", ["x"])[2] == b'{"consumerIdList":["x"]}'
    group = ConsumerGroup("g", subscriptions={"T": sub("T", 10)})
    assert pull_subscription_check(None, "T", 0)[0] == 24
    assert pull_subscription_check(group, "U", 0)[0] == 24
    assert pull_subscription_check(group, "T", 11) == (25, "the consumer's subscription not latest")
    assert pull_subscription_check(group, "T", 10) == sub("T", 10)
    group.message_model = "BROADCASTING"
    assert pull_subscription_check(group, "T", 0, broadcast_enabled=False)[0] == 16
    assert pull_subscription_check(group, "T", 0) == sub("T", 10)


def test_connection_body_is_the_recorded_bytes():
    """GET_CONSUMER_CONNECTION_LIST's body equals the recorded one byte for byte given the same state."""
    want = golden("203-get-consumer-connection-list-response").body
    obj = json.loads(want)
    group = ConsumerGroup("golden_push_cg", obj["consumeType"], obj["messageModel"], obj["consumeFromWhere"])
    [c] = obj["connectionSet"]
    group.channels[1] = ClientChannel(1, c["clientId"], c["language"], c["version"], c["clientAddr"])
    for topic in ("GoldenTopic", "%RETRY%golden_push_cg"):  # insertion order differs from the recorded order
        s = obj["subscriptionTable"][topic]
        group.subscriptions[topic] = Subscription(topic, s["subString"], s["expressionType"], tuple(s["tagsSet"]),
                                                  tuple(s["codeSet"]), s["subVersion"], s["classFilterMode"])
    assert group.connection_body() == want


# -- golden replay through a port -------------------------------------------------------------------------------

class Conn:
    """One client connection to the port on a StringTransport; collects every frame the port writes."""

    def __init__(self, cluster, port):
        self.cluster = cluster
        self.proto = port.factory.buildProtocol(None)
        self.tr = StringTransport()
        self.proto.makeConnection(self.tr)
        self.seen = 0

    def send(self, data: bytes) -> None:
        self.proto.dataReceived(data)

    def frames(self):
        """Frames written since the last call."""
        data = self.tr.value()[self.seen:]
        self.seen = len(self.tr.value())
        return list(FrameSplitter(header_decoder=decode_header).feed(data))

    def ask(self, name: str):
        """Replay a recorded request; (its reply, the other frames written meanwhile)."""
        request = golden(f"{name}-request")
        self.send((FRAMES / f"{name}-request.bin").read_bytes())
        got = []

        def answered():
            got.extend(self.frames())
            return any(f.header.is_response for f in got)
        assert self.cluster.run_until(answered, 10), f"{name}: no reply"
        [reply] = [f for f in got if f.header.is_response]
        assert reply.header.opaque == request.header.opaque
        return reply, [f for f in got if not f.header.is_response]

    def close(self):
        self.proto.connectionLost(None)


def same_shape(got, name):
    want = golden(f"{name}-response")
    assert (got.header.code, got.header.remark) == (want.header.code, want.header.remark), name
    assert got.header.serialize_type == want.header.serialize_type
    assert got.header.ext_fields == want.header.ext_fields, name  # None (absent) or {} as recorded
    return want


@pytest.fixture
def cluster_port(tmp_path):
    cluster = broker_cluster(tmp_path)
    return cluster, BrokerPort(master(cluster), "tcp:0")


def test_replay_heartbeats_unregister_and_consumer_lists(cluster_port):
    """34/35/38/40 as recorded: heartbeats answered, members notified, lists equal, unregister ends membership."""
    cluster, port = cluster_port
    producer = Conn(cluster, port)
    reply, others = producer.ask("034-heart-beat-producer")
    same_shape(reply, "034-heart-beat-producer")
    assert others == []  # producers are not notified
    pull = Conn(cluster, port)
    reply, notes = pull.ask("034-heart-beat-consumer-consume-actively")
    same_shape(reply, "034-heart-beat-consumer-consume-actively")
    [note] = notes
    want = golden("040-notify-consumer-ids-changed-broker-to-client-request")
    assert (note.header.code, note.header.flag, note.header.ext_fields) == \
        (40, 2, want.header.ext_fields)
    alions = Conn(cluster, port)
    reply, notes = alions.ask("034-heart-beat-alions-consumer-consume-passively")
    same_shape(reply, "034-heart-beat-alions-consumer-consume-passively")
    assert [n.header.ext_fields for n in notes] == \
        [golden("040-notify-consumer-ids-changed-broker-to-client-alions-request").header.ext_fields]
    # Created through the log (so every member and a later master know them): there once committed.
    meta = port.broker.meta
    assert cluster.run_until(lambda: meta.topics.get("%RETRY%ons_test_cg_1795427018640") is not None, 5)
    assert meta.topics.get("%RETRY%ons_test_cg_1795427018640")["readQueueNums"] == 1
    assert cluster.run_until(lambda: meta.groups.get("golden_pull_cg") is not None, 5)
    assert cluster.run_until(lambda: all(broker_for(s).meta.groups.get("golden_pull_cg") is not None
                                         for s in cluster.servers.values()), 5)
    for name in ("038-get-consumer-list-by-group", "038-get-consumer-list-by-group-alions",
                 "038-get-consumer-list-by-group-system-error"):
        conn = alions if "alions" in name else pull
        reply, _ = conn.ask(name)
        want = same_shape(reply, name)
        assert reply.body == want.body
    for name, conn in (("035-unregister-client-producer", producer), ("035-unregister-client-consumer", pull),
                       ("035-unregister-client-alions-consumer", alions),
                       ("035-unregister-client-alions-producer", alions),
                       ("035-unregister-client-rocketmq-serialize-producer", producer)):
        same_shape(conn.ask(name)[0], name)
    assert port.sessions.registry.consumers == {}
    reply, _ = pull.ask("038-get-consumer-list-by-group")
    assert (reply.header.code, reply.header.remark) == (1, "no consumer for this group, golden_pull_cg")


def test_replay_connection_list(cluster_port):
    """203 after the push consumer's heartbeat: the recorded body's shape; an unknown group is not online."""
    cluster, port = cluster_port
    push = Conn(cluster, port)
    push.ask("034-heart-beat-consumer-consume-passively")
    reply, _ = push.ask("203-get-consumer-connection-list")
    want = same_shape(reply, "203-get-consumer-connection-list")
    got, recorded = json.loads(reply.body), json.loads(want.body)
    assert list(got) == list(recorded)
    assert list(got["subscriptionTable"]) == list(recorded["subscriptionTable"])
    assert [c["clientId"] for c in got["connectionSet"]] == ["192.0.2.2@golden-push-A"]
    assert list(got["connectionSet"][0]) == list(recorded["connectionSet"][0])
    header = Header(203, 5, 0, "JAVA", 409, None, {"consumerGroup": "nobody"})
    push.send(encode_command(header))
    [f] = push.frames()
    assert (f.header.code, f.header.remark) == (206, "the consumer group[nobody] not online")


def test_closed_connection_and_expiry_end_registrations(cluster_port):
    """A closed connection leaves its groups (the rest notified); a silent one is dropped and closed after 120 s."""
    cluster, port = cluster_port
    a, b = Conn(cluster, port), Conn(cluster, port)
    a.ask("034-heart-beat-consumer-consume-passively")
    body = golden("034-heart-beat-consumer-consume-passively-request").body.replace(b"golden-push-A", b"golden-push-B")
    b.send(encode_command(Header(34, 77, 0, "JAVA", 409, None, None), body))
    assert cluster.run_until(lambda: len(port.sessions.registry.consumer_ids("golden_push_cg")) == 2, 5)
    a.frames()
    b.close()
    assert port.sessions.registry.consumer_ids("golden_push_cg") == ["192.0.2.2@golden-push-A"]
    assert [f.header.code for f in a.frames()] == [40]
    cluster.run(100.0)
    a.send(encode_command(Header(34, 78, 0, "JAVA", 409, None, None),
                          golden("034-heart-beat-consumer-consume-passively-request").body))
    cluster.run(100.0)  # 200 s since the first heartbeat, 100 s since the last: still there
    assert port.sessions.registry.consumer_ids("golden_push_cg") == ["192.0.2.2@golden-push-A"]
    assert not a.tr.disconnecting
    cluster.run(21.0)
    assert port.sessions.registry.consumers == {} and a.tr.disconnecting
    assert port.sessions._expiry == {}


def test_client_ignores_broker_requests_with_a_colliding_opaque():
    """A broker->client request (NOTIFY, opaque from the broker's counter) leaves the client's pending request alone."""
    client = RocketMQClient(Clock())
    pending = Deferred()
    client._pending[1] = pending  # the client's request with opaque 1, not answered yet
    client._reply(Header(40, 1, 2, "JAVA", 409, None, {"consumerGroup": "g"}), b"")
    assert client._pending.get(1) is pending and not pending.called
    client._reply(Header(0, 1, 1, "JAVA", 409, None, {}), b"ok")
    assert pending.called and 1 not in client._pending


def test_replay_consumer_running_info_forwarded_to_the_client(cluster_port):
    """307 from mqadmin goes to the client on its connection; the client's answer comes back as recorded."""
    cluster, port = cluster_port
    push, admin = Conn(cluster, port), Conn(cluster, port)
    push.ask("034-heart-beat-consumer-consume-passively")
    push.frames()
    admin.send((FRAMES / "307-get-consumer-running-info-request.bin").read_bytes())
    [forwarded] = push.frames()
    want = golden("307-get-consumer-running-info-broker-to-client-request")
    assert (forwarded.header.code, forwarded.header.flag, forwarded.header.ext_fields) == \
        (307, 0, want.header.ext_fields)
    assert admin.frames() == []  # waiting for the client
    answer = golden("307-get-consumer-running-info-broker-to-client-response")
    h = answer.header
    push.send(encode_command(Header(h.code, forwarded.header.opaque, h.flag, h.language, h.version, h.remark,
                                    h.ext_fields), answer.body))
    [reply] = admin.frames()
    recorded = same_shape(reply, "307-get-consumer-running-info")
    assert reply.header.opaque == recorded.header.opaque and reply.body == recorded.body
    push.send(encode_command(Header(0, forwarded.header.opaque, 1, "JAVA", 409, None, None)))  # late duplicate
    assert admin.frames() == []


def test_consumer_running_info_errors(cluster_port):
    """307 for a client not online is 1; a client that does not answer is 207 after 10 s; a closed one is 1."""
    cluster, port = cluster_port
    push, admin = Conn(cluster, port), Conn(cluster, port)
    ask = golden("307-get-consumer-running-info-request").header.ext_fields
    admin.send(encode_command(Header(307, 1, 0, "JAVA", 409, None, ask)))
    [reply] = admin.frames()
    assert (reply.header.code, reply.header.remark) == \
        (1, "The Consumer <golden_push_cg> <192.0.2.2@golden-push-A> not online")
    push.ask("034-heart-beat-consumer-consume-passively")
    admin.send(encode_command(Header(307, 2, 0, "JAVA", 409, None, ask)))
    cluster.run(9.9)
    assert admin.frames() == []
    cluster.run(0.2)
    [reply] = admin.frames()
    assert reply.header.code == 207 and "Timeout" in reply.header.remark
    admin.send(encode_command(Header(307, 3, 0, "JAVA", 409, None, ask)))
    push.close()
    [reply] = admin.frames()
    assert reply.header.code == 1 and "connection closed" in reply.header.remark
    assert port.sessions._calls == {}


def test_expiry_timer_rearms_when_the_clock_rounds_short(cluster_port):
    """A deadline that fires a millisecond early (float rounding) re-arms instead of forgetting the channel."""
    cluster, port = cluster_port
    conn = Conn(cluster, port)
    conn.ask("034-heart-beat-producer")
    sessions = port.sessions
    [channel] = sessions.registry.producers["golden_producer_group"]
    for members in sessions.registry.producers.values():
        members[channel].last_update_ms += 5  # as if the heartbeat had been stamped 5 ms after its timer
    cluster.run(120.001)
    assert sessions.registry.producers and not conn.tr.disconnecting and channel in sessions._expiry
    cluster.run(0.01)
    assert sessions.registry.producers == {} and conn.tr.disconnecting
