"""CONSUMER_SEND_MSG_BACK (retry / dead-letter copies), ordered-consumer locks, refused transactions."""

from __future__ import annotations

import json

import pytest
from dledger_rocketmq.broker.port import ArgumentError, BrokerPort, encode_command
from dledger_rocketmq.broker.retry import (
    LockTable,
    SendBackArgs,
    max_reconsume_times,
    parse_lock_body,
    send_back,
    send_back_args,
)
from dledger_rocketmq.common.message import Address, MessageRecord, decode_record, encode_properties
from dledger_rocketmq.store.schedule import SCHEDULE_TOPIC, java_properties, to_schedule
from rmq_cluster_util import broker_cluster, master, put, settled
from test_rmq_clients import Conn, golden, same_shape
from test_rmq_longpoll import wait_reply

from dledger.transport.remoting import Header

#: The properties of golden store entry 174: the pull consumer's send-back (delay level 1) of the message at
#: offset 345, re-delivered from SCHEDULE_TOPIC_XXXX to %RETRY%golden_pull_cg (same bytes as stored delayed).
GOLDEN_174 = ("REAL_TOPIC\x01%RETRY%golden_pull_cg\x02ORIGIN_MESSAGE_ID\x017F00000100007CA70000000000000159\x02"
              "RETRY_TOPIC\x01GoldenTopic\x02KEYS\x01key-B1 key-B2\x02UNIQ_KEY\x01"
              "FD000000000000000000000000000002792B5FFD2B277362314D0001\x02CLUSTER\x01RaftCluster\x02WAIT\x01false"
              "\x02DELAY\x011\x02TAGS\x01TagB\x02REAL_QID\x010")


def original(**kw) -> MessageRecord:
    props = {"KEYS": "key-B1 key-B2", "UNIQ_KEY": "FD000000000000000000000000000002792B5FFD2B277362314D0001",
             "CLUSTER": "RaftCluster", "TAGS": "TagB"}
    props.update(kw.pop("props", {}))
    base = dict(topic="GoldenTopic", body=b"Hello RocketMQ golden #2 (two keys, no user props)", queue_id=2,
                properties=java_properties(props), physical_offset=345, born_timestamp=1795427014989,
                born_host=Address("127.0.0.1", 34518), store_host=Address("127.0.0.1", 31911), queue_offset=1)
    base.update(kw)
    return MessageRecord(**base)


def test_send_back_copy_is_the_recorded_one():
    """Level 1 send-back of the recorded message: %RETRY% copy, reconsume 1, properties byte-equal to the store."""
    back = send_back(original(), SendBackArgs("golden_pull_cg", 345, 1), max_times=16)
    assert not back.dead and back.topic["topicName"] == "%RETRY%golden_pull_cg" and back.topic["perm"] == 6
    rec = back.record
    assert (rec.topic, rec.queue_id, rec.reconsume_times, rec.born_host, rec.born_timestamp) == \
        ("%RETRY%golden_pull_cg", 0, 1, Address("127.0.0.1", 34518), 1795427014989)
    scheduled = to_schedule(rec)
    assert (scheduled.topic, scheduled.queue_id) == (SCHEDULE_TOPIC, 0)
    assert scheduled.properties.decode() == GOLDEN_174


@pytest.mark.parametrize("reconsumed, level, max_times, dead, delay", [
    (0, 0, 16, False, "3"), (2, 0, 16, False, "5"), (2, 7, 16, False, "7"),
    (16, 0, 16, True, None), (3, 0, 3, True, None), (0, -1, 16, True, None),
])
def test_send_back_retry_or_dead(reconsumed, level, max_times, dead, delay):
    """Level 0 -> 3 + reconsumeTimes; the given level otherwise; %DLQ% after max attempts or for a negative level."""
    back = send_back(original(reconsume_times=reconsumed), SendBackArgs("g", 345, level), max_times=max_times)
    props = back.record.property_map
    assert back.dead is dead and props.get("DELAY") == delay
    assert back.record.topic == ("%DLQ%g" if dead else "%RETRY%g")
    assert back.record.reconsume_times == reconsumed + 1


def test_send_back_of_a_retried_message_keeps_its_origin():
    """A copy of a copy keeps the first RETRY_TOPIC and ORIGIN_MESSAGE_ID (the consumer sees the first message)."""
    again = original(topic="%RETRY%g", physical_offset=9999, reconsume_times=1,
                     props={"RETRY_TOPIC": "GoldenTopic", "ORIGIN_MESSAGE_ID": "FIRST", "DELAY": "3"})
    props = send_back(again, SendBackArgs("g", 9999, 0), max_times=16).record.property_map
    assert (props["RETRY_TOPIC"], props["ORIGIN_MESSAGE_ID"], props["DELAY"]) == ("GoldenTopic", "FIRST", "4")


@pytest.mark.parametrize("ext, version, want", [
    ({"maxReconsumeTimes": "3"}, 409, 3), ({"maxReconsumeTimes": "3"}, 120, 16), ({}, 409, 16),
])
def test_max_reconsume_times(ext, version, want):
    """The request's maxReconsumeTimes counts from V3_4_9 on; otherwise the group's retryMaxTimes."""
    args = send_back_args({"group": "g", "offset": "1", **ext})
    assert max_reconsume_times(args, 16, version) == want


def test_send_back_args_golden_and_errors():
    """The recorded headers parse; a missing offset is an ArgumentError naming it."""
    a = send_back_args(golden("036-consumer-send-msg-back-delaylevel-0-request").header.ext_fields)
    assert (a.group, a.offset, a.delay_level, a.max_reconsume_times) == ("golden_push_cg", 2968, 0, 16)
    with pytest.raises(ArgumentError, match="offset"):
        send_back_args({"group": "g"})


def test_lock_table():
    """A queue is locked by one client until 60 s without renewal; its holder renews; others get nothing."""
    t = LockTable()
    q1, q2 = ("b", "T", 0), ("b", "T", 1)
    assert t.lock("g", [q1], "A", 0) == [q1]
    assert t.lock("g", [q1, q2], "B", 1000) == [q2]
    assert t.lock("g", [q1], "A", 50_000) == [q1]  # renewed
    assert t.lock("g", [q1], "B", 100_000) == []
    assert t.lock("g", [q1], "B", 110_001) == [q1]  # A's lock expired
    t.unlock("g", [q1, q2], "A")  # not A's any more: nothing changes
    assert t.holder("g", q1, 110_001) == "B" and t.holder("g", q2, 1000) == "B"
    t.unlock("g", [q1, q2], "B")
    assert t.holder("g", q1, 110_001) is None and t.lock("other", [q1], "C", 0) == [q1]


@pytest.mark.parametrize("body", [b"x", b"{}", b'{"consumerGroup":"g","clientId":"c","mqSet":[{"topic":"T"}]}',
                                  b'{"consumerGroup":1,"clientId":"c"}'])
def test_lock_body_errors(body):
    """A lock body that is not a LockBatchRequestBody is a one-line ArgumentError."""
    with pytest.raises(ArgumentError, match="lock body"):
        parse_lock_body(body)


# -- through a port --------------------------------------------------------------------------------------------

@pytest.fixture
def group(tmp_path):
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    return cluster, b, BrokerPort(b, "tcp:0")


def replay_with_offset(conn, name, offset):
    """Replay a recorded send-back with ``offset`` (where the message is in this store); the reply."""
    request = golden(f"{name}-request")
    ext = dict(request.header.ext_fields, offset=str(offset))
    conn.send(encode_command(Header(36, request.header.opaque, 0, "JAVA", 409, None, ext)))
    reply, _ = wait_reply(conn, request.header.opaque, 10.0)
    return reply


def test_send_back_through_the_port(group):
    """Both recorded send-backs: SUCCESS as recorded; copies go through SCHEDULE_TOPIC_XXXX to %RETRY%<group>."""
    cluster, b, port = group
    props = encode_properties({"TAGS": "TagB", "KEYS": "k"})
    first = put(cluster, b, MessageRecord(topic="GoldenTopic", body=b"one", queue_id=2, properties=props))
    second = put(cluster, b, MessageRecord(topic="GoldenTopic", body=b"two", queue_id=2, properties=props,
                                           reconsume_times=16))
    assert settled(cluster)
    conn = Conn(cluster, port)
    reply = replay_with_offset(conn, "036-consumer-send-msg-back-delaylevel-1", first.physical_offset)
    same_shape(reply, "036-consumer-send-msg-back-delaylevel-1")
    assert settled(cluster)
    assert b.max_offset(SCHEDULE_TOPIC, 0) == 1  # level 1 -> queue 0
    assert b.meta.topics.get("%RETRY%golden_pull_cg")["writeQueueNums"] == 1
    cluster.run(3.0)  # level 1 = 1 s
    assert settled(cluster) and b.max_offset("%RETRY%golden_pull_cg", 0) == 1
    got = b.get_messages("golden_pull_cg", "%RETRY%golden_pull_cg", 0, 0, 32)
    copy = decode_record(got.records[0])
    assert copy.body == b"one" and copy.reconsume_times == 1
    assert copy.property_map["ORIGIN_MESSAGE_ID"] == first.msg_id
    assert copy.property_map["RETRY_TOPIC"] == "GoldenTopic"
    reply = replay_with_offset(conn, "036-consumer-send-msg-back-delaylevel-0", second.physical_offset)
    same_shape(reply, "036-consumer-send-msg-back-delaylevel-0")
    assert settled(cluster) and b.max_offset("%DLQ%golden_push_cg", 0) == 1  # reconsumed 16 times: dead
    bad = replay_with_offset(conn, "036-consumer-send-msg-back-delaylevel-0", first.physical_offset + 3)
    assert bad.header.code == 1 and "look message by offset failed" in bad.header.remark


def test_locks_and_transactions_through_the_port(group):
    """LOCK/UNLOCK_BATCH_MQ answer the queues locked; END_TRANSACTION and half messages get a clear refusal."""
    cluster, b, port = group
    conn = Conn(cluster, port)
    mqs = [{"brokerName": "broker-a", "queueId": q, "topic": "T"} for q in (0, 1)]

    def ask(code, opaque, body):
        conn.send(encode_command(Header(code, opaque, 0, "JAVA", 409, None, None), json.dumps(body).encode()))
        reply, _ = wait_reply(conn, opaque, 2.0)
        return reply
    lock = ask(41, 1, {"clientId": "A", "consumerGroup": "g", "mqSet": mqs})
    assert lock.header.code == 0 and json.loads(lock.body)["lockOKMQSet"] == mqs
    assert json.loads(ask(41, 2, {"clientId": "B", "consumerGroup": "g", "mqSet": mqs}).body) == {"lockOKMQSet": []}
    assert ask(42, 3, {"clientId": "A", "consumerGroup": "g", "mqSet": mqs[:1]}).header.code == 0
    assert json.loads(ask(41, 4, {"clientId": "B", "consumerGroup": "g", "mqSet": mqs}).body)["lockOKMQSet"] == \
        mqs[:1]
    conn.send(encode_command(Header(37, 5, 0, "JAVA", 409, None, {"producerGroup": "p"})))
    reply, _ = wait_reply(conn, 5, 1.0)
    assert reply.header.code == 16 and "transactional messages are not supported" in reply.header.remark
    half = dict(golden("310-send-message-v2-request").header.ext_fields, f="4")
    conn.send(encode_command(Header(310, 6, 0, "JAVA", 409, None, half), b"half"))
    reply, _ = wait_reply(conn, 6, 1.0)
    assert reply.header.code == 16 and b.max_offset("GoldenTopic", 1) == 0


@pytest.mark.parametrize("offset", [-1, 0, 1, 47, 2 ** 62])
def test_send_back_hostile_offsets(group, offset):
    """A send-back naming an offset that holds no record is answered 1 with one line, nothing is stored."""
    cluster, b, port = group
    assert put(cluster, b, MessageRecord(topic="T", body=b"x")).ok
    assert settled(cluster)
    conn = Conn(cluster, port)
    reply = replay_with_offset(conn, "036-consumer-send-msg-back-delaylevel-1", offset)
    assert reply.header.code == 1 and reply.header.remark.startswith(f"look message by offset failed, {offset}")
    assert b.max_offset(SCHEDULE_TOPIC, 0) == 0
