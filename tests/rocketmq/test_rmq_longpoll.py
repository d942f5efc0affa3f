"""Long polling (held pulls), push consumers' subscription checks and the pull past the end of a queue."""

from __future__ import annotations

import json

import pytest
from dledger_rocketmq.broker.broker import GetStatus, queue_status
from dledger_rocketmq.broker.longpoll import MAX_SUSPEND_MS, PullHolds, hold_seconds, should_hold, wakes
from dledger_rocketmq.broker.port import BrokerPort, encode_command
from rmq_cluster_util import broker_cluster, master, msg, put, settled
from test_rmq_clients import FRAMES, Conn, golden, same_shape
from twisted.internet.task import Clock

from dledger.transport.remoting import Header

# -- pure decisions --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ms, seconds", [(15000, 15.0), (5000, 5.0), (0, 1.0), (-5, 1.0),
                                         (10 ** 12, MAX_SUSPEND_MS / 1000)])
def test_hold_seconds(ms, seconds):
    """A hold lasts suspendTimeoutMillis, short polling (1 s) without one, never more than the cap."""
    assert hold_seconds(ms) == seconds


@pytest.mark.parametrize("code, sys_flag, allow, held", [
    (19, 2, True, True), (19, 3, True, True), (19, 6, True, True), (19, 4, True, False),
    (19, 2, False, False), (20, 2, True, False), (0, 2, True, False), (21, 2, True, False),
])
def test_should_hold(code, sys_flag, allow, held):
    """Only a first attempt with SUSPEND that would be PULL_NOT_FOUND is held."""
    assert should_hold(code, sys_flag, allow) is held


@pytest.mark.parametrize("offset, max_offset, woken", [(7, 7, False), (7, 8, True), (0, 0, False), (0, 1, True),
                                                       (9, 8, False)])
def test_wakes(offset, max_offset, woken):
    """A held pull wakes once the queue's max offset is past its offset."""
    assert wakes(offset, max_offset) is woken


def test_pull_holds_wake_timeout_drop_and_answer_all():
    """Held pulls are answered on arrival or timeout, forgotten with their connection, answered all at once."""
    clock = Clock()
    holds = PullHolds(clock)
    answers = []
    a, b = object(), object()
    d1 = holds.hold("T", 0, 5, 15.0, a, lambda: "woken")
    d1.addCallback(answers.append)
    holds.arrived("T", 0, 5)
    holds.arrived("T", 1, 9)
    assert answers == [] and len(holds) == 1
    holds.arrived("T", 0, 6)
    assert answers == ["woken"] and len(holds) == 0 and clock.getDelayedCalls() == []
    holds.hold("T", 0, 6, 15.0, a, lambda: "late").addCallback(answers.append)
    clock.advance(14.9)
    assert answers == ["woken"]
    clock.advance(0.1)
    assert answers == ["woken", "late"] and holds.expired == 1
    holds.hold("T", 0, 6, 15.0, a, lambda: "never").addCallback(answers.append)
    holds.hold("T", 0, 6, 15.0, b, lambda: "now").addCallback(answers.append)
    assert holds.drop_connection(a) == 1 and len(holds) == 1
    assert holds.answer_all() == 1
    clock.advance(60)
    assert answers == ["woken", "late", "now"] and clock.getDelayedCalls() == []


def test_pull_holds_rerun_failure_is_an_errback():
    """A re-run that raises fails the held Deferred (the port answers SYSTEM_ERROR) instead of hanging it."""
    holds = PullHolds(Clock())
    failures = []
    holds.hold("T", 0, 0, 1.0, object(), lambda: 1 / 0).addErrback(failures.append)
    holds.arrived("T", 0, 1)
    assert failures and failures[0].check(ZeroDivisionError)


@pytest.mark.parametrize("offset, lo, hi, status, nxt", [
    (8, 0, 7, GetStatus.OFFSET_OVERFLOW_BADLY, 7),  # golden 011-...-pull-offset-moved
    (107, 0, 7, GetStatus.OFFSET_OVERFLOW_BADLY, 7),
    (12, 3, 9, GetStatus.OFFSET_OVERFLOW_BADLY, 9),
])
def test_overflow_badly_moves_to_max(offset, lo, hi, status, nxt):
    """A pull past the end of a queue is corrected to its max offset, also when the queue starts at 0."""
    assert queue_status(offset, lo, hi) == (status, nxt)


# -- in-process: a port on a 3-member group ------------------------------------------------------------------------

def fill(cluster, b, topic, queue_id, upto, tags=None):
    """Put messages until the queue's max offset is ``upto`` (a put answers before its unit is dispatched)."""
    assert settled(cluster)
    for _ in range(upto - b.max_offset(topic, queue_id)):
        assert put(cluster, b, msg(topic=topic, queue_id=queue_id, tags=tags)).ok
    assert settled(cluster) and b.max_offset(topic, queue_id) == upto


def push_heartbeat(conn, version_prefix=b"18954270"):
    """The recorded push consumer heartbeat, its subVersions made newer than every recorded pull's."""
    body = golden("034-heart-beat-consumer-consume-passively-request").body.replace(b"17954270", version_prefix)
    conn.send(encode_command(Header(34, 900, 0, "JAVA", 409, None, None), body))
    assert conn.cluster.run_until(lambda: any(f.header.opaque == 900 for f in conn.frames()), 5)


def wait_reply(conn, opaque, limit):
    got = []

    def answered():
        got.extend(f for f in conn.frames() if f.header.is_response and f.header.opaque == opaque)
        return bool(got)
    start = conn.cluster.clock.seconds()
    conn.cluster.run_until(answered, limit)
    return (got[0] if got else None), conn.cluster.clock.seconds() - start


@pytest.fixture
def group(tmp_path):
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    return cluster, b, BrokerPort(b, "tcp:0")


def test_held_pull_answered_when_a_message_is_put(group):
    """A SUSPEND pull at the end of the queue is held, answered FOUND as soon as a message arrives, as recorded."""
    cluster, b, port = group
    fill(cluster, b, "GoldenTopic", 2, 7)
    conn = Conn(cluster, port)
    conn.send((FRAMES / "011-pull-message-sysflag-suspend-subscription-held-found-request.bin"
               ).read_bytes())
    reply, _ = wait_reply(conn, 42, 1.0)
    assert reply is None and len(port.sessions.holds) == 1
    d = b.put_message(msg(topic="GoldenTopic", queue_id=2))
    reply, waited = wait_reply(conn, 42, 4.0)
    assert d.called and reply is not None and waited < 1.0
    want = same_shape(reply, "011-pull-message-sysflag-suspend-subscription-held-found")
    assert reply.header.ext_fields == want.header.ext_fields and len(port.sessions.holds) == 0
    conn.send((FRAMES / "011-pull-message-sysflag-suspend-subscription-held-pull-not-found-"
               "request.bin").read_bytes())
    reply, _ = wait_reply(conn, 67, 4.9)
    assert reply is None
    reply, _ = wait_reply(conn, 67, 0.5)
    want = same_shape(reply, "011-pull-message-sysflag-suspend-subscription-held-pull-not-found")
    assert reply.header.ext_fields == want.header.ext_fields


def test_push_consumer_pulls_use_the_heartbeat_subscription(group):
    """Push pulls (no SUBSCRIPTION flag): not-latest as recorded, held to their timeout, woken past other tags."""
    cluster, b, port = group
    fill(cluster, b, "GoldenTopic", 0, 3, tags="TagA")
    fill(cluster, b, "GoldenTopic", 3, 2, tags="TagA")
    conn = Conn(cluster, port)
    for name in ("011-pull-message-sysflag-suspend-subscription-not-latest",
                 "011-pull-message-sysflag-commitoffset-suspend-subscription-not-latest"):
        reply, _ = conn.ask(name)
        assert reply.header.code == 24  # no heartbeat yet: the group is unknown
    push_heartbeat(conn, b"17954270")  # the recorded heartbeat: older subscriptions than these pulls
    for name in ("011-pull-message-sysflag-suspend-subscription-not-latest",
                 "011-pull-message-sysflag-commitoffset-suspend-subscription-not-latest"):
        same_shape(conn.ask(name)[0], name)
    assert b.query_offset("golden_push_cg", "GoldenTopic", 3) == -1  # a refused pull commits nothing
    push_heartbeat(conn)
    name = "011-pull-message-sysflag-suspend-held-pull-not-found"
    conn.send((FRAMES / f"{name}-request.bin").read_bytes())
    reply, _ = wait_reply(conn, 48, 14.5)
    assert reply is None and len(port.sessions.holds) == 1
    reply, _ = wait_reply(conn, 48, 1.0)
    want = same_shape(reply, name)
    assert reply.header.ext_fields == want.header.ext_fields
    conn.send((FRAMES / f"{name}-request.bin").read_bytes())
    assert wait_reply(conn, 48, 1.0)[0] is None
    assert put(cluster, b, msg(topic="GoldenTopic", queue_id=0, tags="TagZ")).ok  # not subscribed
    reply, waited = wait_reply(conn, 48, 3.0)
    assert (reply.header.code, reply.header.remark, reply.header.ext_fields["nextBeginOffset"]) == \
        (20, "NO_MATCHED_MESSAGE", "4")
    assert put(cluster, b, msg(topic="GoldenTopic", queue_id=0, tags="TagB")).ok
    assert settled(cluster)
    pulled = Header(11, 49, 0, "JAVA", 409, None, {**golden(f"{name}-request").header.ext_fields,
                                                    "queueOffset": "4"})
    conn.send(encode_command(pulled))
    reply, _ = wait_reply(conn, 49, 2.0)
    assert (reply.header.code, reply.header.ext_fields["nextBeginOffset"]) == (0, "5")
    assert len(reply.body) > 0 and b"TagB" in reply.body


def test_retry_topic_held_pull_found(group):
    """The push consumer's %RETRY% pull (topic made by its heartbeat, queue not yet existing) is held and woken."""
    cluster, b, port = group
    conn = Conn(cluster, port)
    push_heartbeat(conn)
    name = "011-pull-message-sysflag-suspend-retry-topic-held-found"
    conn.send((FRAMES / f"{name}-request.bin").read_bytes())
    assert wait_reply(conn, 56, 2.0)[0] is None
    assert put(cluster, b, msg(topic="%RETRY%golden_push_cg", queue_id=0)).ok
    reply, _ = wait_reply(conn, 56, 2.0)
    want = same_shape(reply, name)
    assert reply.header.ext_fields == want.header.ext_fields


def test_pull_offset_moved_as_recorded(group):
    """A pull past the end of a queue starting at 0 answers PULL_OFFSET_MOVED with nextBeginOffset = max (golden)."""
    cluster, b, port = group
    fill(cluster, b, "GoldenTopic", 2, 7)
    conn = Conn(cluster, port)
    reply, _ = conn.ask("011-pull-message-sysflag-subscription-pull-offset-moved")
    want = same_shape(reply, "011-pull-message-sysflag-subscription-pull-offset-moved")
    assert reply.header.ext_fields == want.header.ext_fields


def test_held_pulls_end_with_connection_stop_and_role_change(group):
    """A closed connection drops its held pull; a role change and the port's stop answer the held pulls at once."""
    cluster, b, port = group
    fill(cluster, b, "GoldenTopic", 2, 8)
    request = (FRAMES / "011-pull-message-sysflag-suspend-subscription-held-pull-not-found-"
               "request.bin").read_bytes()
    gone = Conn(cluster, port)
    gone.send(request)
    assert len(port.sessions.holds) == 1
    gone.close()
    assert len(port.sessions.holds) == 0
    conn = Conn(cluster, port)
    conn.send(request)
    assert wait_reply(conn, 67, 1.0)[0] is None
    b._tell(b.slave_callbacks, "slave")
    reply, waited = wait_reply(conn, 67, 0.1)
    assert reply.header.code == 19 and waited < 0.1
    conn.send(request)
    assert wait_reply(conn, 67, 1.0)[0] is None
    port.stopService()
    got = [f for f in conn.frames() if f.header.is_response]
    assert [f.header.code for f in got] == [19] and conn.tr.disconnecting
    assert len(port.sessions.holds) == 0
    assert put(cluster, b, msg(topic="GoldenTopic", queue_id=2)).ok and settled(cluster)  # no-op listener


def test_send_through_the_port_wakes_a_held_pull(group):
    """End to end: a pull consumer's held pull is answered FOUND as soon as a producer's send is committed."""
    cluster, b, port = group
    producer, consumer = Conn(cluster, port), Conn(cluster, port)
    sent = producer.ask("310-send-message-v2")[0]  # GoldenTopic (auto-created) queue 1, offset 0
    assert (sent.header.code, sent.header.ext_fields["queueOffset"]) == (0, "0")
    assert settled(cluster)
    ext = dict(golden("011-pull-message-sysflag-suspend-subscription-held-found-request").header.ext_fields,
               queueId="1", queueOffset="1")
    consumer.send(encode_command(Header(11, 500, 0, "JAVA", 409, None, ext)))
    assert wait_reply(consumer, 500, 3.0)[0] is None
    producer.send((FRAMES / "310-send-message-v2-request.bin").read_bytes())
    reply, waited = wait_reply(consumer, 500, 2.0)
    assert reply is not None and waited < 1.0
    assert (reply.header.code, reply.header.ext_fields["nextBeginOffset"]) == (0, "2") and reply.body


def test_slave_holds_pulls_until_replication_brings_the_message(tmp_path):
    """A slave's held pull is answered when the master's message is committed and dispatched on the slave."""
    from dledger_rocketmq.plugin import broker_for
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    fill(cluster, b, "GoldenTopic", 2, 8)
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    assert cluster.run_until(lambda: slave.max_offset("GoldenTopic", 2) == 8, 10)
    port = BrokerPort(slave, "tcp:0")
    conn = Conn(cluster, port)
    conn.send((FRAMES / "011-pull-message-sysflag-suspend-subscription-held-pull-not-found-request.bin").read_bytes())
    assert wait_reply(conn, 67, 2.0)[0] is None and len(port.sessions.holds) == 1
    b.put_message(msg(topic="GoldenTopic", queue_id=2))
    reply, waited = wait_reply(conn, 67, 3.0)
    assert reply is not None and waited < 3.0
    assert (reply.header.code, reply.header.ext_fields["nextBeginOffset"]) == (0, "9")


def test_arrival_listeners_see_each_queue_once_and_survive_a_failing_one(tmp_path):
    """The dispatcher tells listeners (topic, queue, max offset) per delivery; one that raises does not stop it."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    seen = []

    def broken(*_):
        raise RuntimeError("listener bug")
    b.dispatcher.arrival_listeners[:0] = [broken, lambda *a: seen.append(a)]
    assert put(cluster, b, [msg(topic="A", queue_id=1), msg(topic="A", queue_id=1)]).ok
    assert put(cluster, b, msg(topic="B")).ok
    assert settled(cluster)
    assert seen == [("A", 1, 2), ("B", 0, 1)]
    assert b.max_offset("B", 0) == 1


def test_sql92_subscriptions_are_refused_not_served_unfiltered(group):
    """A pull whose subscription is not a TAG expression is answered SYSTEM_ERROR (no property filter here)."""
    cluster, b, port = group
    fill(cluster, b, "GoldenTopic", 2, 1)
    conn = Conn(cluster, port)
    ext = dict(golden("011-pull-message-sysflag-subscription-found-request").header.ext_fields,
               expressionType="SQL92", subscription="a > 1")
    conn.send(encode_command(Header(11, 600, 0, "JAVA", 409, None, ext)))
    reply, _ = wait_reply(conn, 600, 1.0)
    assert (reply.header.code, reply.header.remark) == \
        (1, "The broker does not support consumer to filter message by SQL92")


def test_python_client_long_polls(group):
    """RocketMQClient.pull(suspend=...) is held at the end of the queue and fires FOUND when a message comes."""
    from dledger_rocketmq.client.client import RocketMQClient, client_factory
    from twisted.test.iosim import FakeTransport, connect
    cluster, b, port = group
    fill(cluster, b, "TopicL", 0, 1)
    client = RocketMQClient(cluster.clock, timeout=2.0)
    sp, cp = port.factory.buildProtocol(None), client_factory(client).buildProtocol(None)
    pump = connect(sp, FakeTransport(sp, True), cp, FakeTransport(cp, False), greet=False)
    out = []
    client.pull("g", "TopicL", 0, 1, suspend=8.0).addBoth(out.append)

    def pumped(n):
        for _ in range(n):
            pump.pump()
            cluster.run(0.1)
    pumped(50)  # 5 s: longer than the client's own 2 s timeout, shorter than the suspend
    assert out == [] and len(port.sessions.holds) == 1
    b.put_message(msg(topic="TopicL", queue_id=0, body=b"late"))
    pumped(10)
    [result] = out
    assert result.code == 0 and [m.body for m in result.messages] == [b"late"] and result.next_begin_offset == 2


HELD = ["011-pull-message-sysflag-commitoffset-suspend-held-pull-not-found",
        "011-pull-message-sysflag-commitoffset-suspend-held-pull-retry-immediately",
        "011-pull-message-sysflag-suspend-held-pull-not-found",
        "011-pull-message-sysflag-suspend-held-pull-retry-immediately",
        "011-pull-message-sysflag-suspend-retry-topic-held-found",
        "011-pull-message-sysflag-suspend-retry-topic-held-pull-not-found",
        "011-pull-message-sysflag-suspend-subscription-held-found",
        "011-pull-message-sysflag-suspend-subscription-held-pull-not-found"]


@pytest.mark.parametrize("name", HELD)
def test_replay_every_held_pull(group, name):
    """Each recorded held pull, with its queue as recorded: held, then answered with the recorded code and fields
    (FOUND: messages arrive; NO_MATCHED_MESSAGE: messages of another tag arrive; PULL_NOT_FOUND: the timeout)."""
    cluster, b, port = group
    request, want = golden(f"{name}-request"), golden(f"{name}-response")
    ext, got_ext = request.header.ext_fields, want.header.ext_fields
    topic, qid, offset = ext["topic"], int(ext["queueId"]), int(ext["queueOffset"])
    conn = Conn(cluster, port)
    if not int(ext["sysFlag"]) & 4:  # a push consumer: its heartbeat (subscription TagA, as new as the pull)
        sub = {"classFilterMode": False, "codeSet": [2598919], "expressionType": "TAG", "subString": "TagA",
               "subVersion": int(ext["subVersion"]), "tagsSet": ["TagA"], "topic": topic}
        if topic.startswith("%RETRY%"):
            sub.update(codeSet=[], subString="*", tagsSet=[])
        body = {"clientID": "c@1", "consumerDataSet": [{"consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                                        "consumeType": "CONSUME_PASSIVELY",
                                                        "groupName": ext["consumerGroup"],
                                                        "messageModel": "CLUSTERING",
                                                        "subscriptionDataSet": [sub], "unitMode": False}],
                "producerDataSet": []}
        conn.send(encode_command(Header(34, 1, 0, "JAVA", 409, None, None), json.dumps(body).encode()))
    fill(cluster, b, topic, qid, offset, tags="TagA")
    conn.frames()
    conn.send((FRAMES / f"{name}-request.bin").read_bytes())
    opaque = request.header.opaque
    assert wait_reply(conn, opaque, 0.5)[0] is None and len(port.sessions.holds) == 1
    more = int(got_ext["maxOffset"]) - offset
    if want.header.code == 0:
        assert put(cluster, b, [msg(topic=topic, queue_id=qid, tags="TagA") for _ in range(more)]).ok
    elif want.header.code == 20:
        assert put(cluster, b, [msg(topic=topic, queue_id=qid, tags="TagZ") for _ in range(more)]).ok
    reply, _ = wait_reply(conn, opaque, int(ext["suspendTimeoutMillis"]) / 1000.0 + 1.0)
    assert reply is not None, name
    same_shape(reply, name)
    assert reply.header.ext_fields == got_ext
