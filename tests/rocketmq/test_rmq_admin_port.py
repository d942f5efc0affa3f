"""The broker port's admin, query and slave-sync codes: golden frame replay on an in-process group, and topic /
subscription-group changes carried by the dledger log across a master switch and a restart."""

from __future__ import annotations

import re

from conftest import GOLDEN
from dledger_rocketmq.broker.port import BrokerPort, decode_header, encode_command
from dledger_rocketmq.broker.port_admin import NOT_SET
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import KIND_TOPIC_CONFIG, KIND_TOPIC_DELETE, OffsetCommit, encode_metadata
from dledger_rocketmq.common.message import MessageRecord, encode_properties
from dledger_rocketmq.plugin import broker_for
from rmq_cluster_util import broker_cluster, master, put, settled
from twisted.internet.testing import StringTransport

from dledger.transport.remoting import FrameSplitter, Header

FRAMES = GOLDEN / "frames"
NAMES = {"rocketmq.brokerName": "RaftNode00", "rocketmq.brokerClusterName": "RaftCluster"}


def split(data: bytes):
    return FrameSplitter(header_decoder=decode_header).feed(data)


def golden(name: str):
    [f] = split((FRAMES / f"{name}.bin").read_bytes())
    return f


def ask(cluster, port, data: bytes, timeout: float = 10.0):
    """Feed one request frame to a fresh connection of ``port``; the reply frame (run on virtual time)."""
    proto = port.factory.buildProtocol(None)
    tr = StringTransport()
    proto.makeConnection(tr)
    proto.dataReceived(data)
    assert cluster.run_until(lambda: bool(tr.value()), timeout), "no reply"
    [got] = split(tr.value())
    return got


def replay(cluster, port, name: str, **ext):
    """Replay a recorded request (extFields overridden by ``ext``); the reply frame."""
    if not ext:
        return ask(cluster, port, (FRAMES / f"{name}-request.bin").read_bytes())
    req = golden(f"{name}-request")
    h = req.header
    header = Header(h.code, h.opaque, h.flag, h.language, h.version, h.remark, {**h.ext_fields, **ext},
                    h.serialize_type)
    return ask(cluster, port, encode_command(header, req.body))


def wait(cluster, d):
    """Run until ``d`` has its result (a chained Deferred counts only once it fired); the result."""
    out = []
    d.addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10), "no result"
    assert not hasattr(out[0], "getErrorMessage"), out[0]
    return out[0]


def same_header(got, name: str):
    """The reply's header has the recorded code, opaque, flag, serialize type and extFields names."""
    want = golden(f"{name}-response")
    assert (got.header.code, got.header.opaque, got.header.flag, got.header.serialize_type) == (
        want.header.code, want.header.opaque, want.header.flag, want.header.serialize_type), got.header.remark
    assert (got.header.ext_fields is None) == (want.header.ext_fields is None), name
    assert set(got.header.ext_fields or {}) == set(want.header.ext_fields or {}), name
    return want


def group(tmp_path, **extras):
    cluster = broker_cluster(tmp_path, **NAMES, **extras)
    b = master(cluster)
    return cluster, b, BrokerPort(b, "tcp:0")


def others(cluster, b):
    return [broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b]


def test_update_topic_and_group_replies_are_the_recorded_frames(tmp_path):
    """UPDATE_AND_CREATE_TOPIC and UPDATE_AND_CREATE_SUBSCRIPTIONGROUP are answered with the recorded frames
    byte for byte (the topic reply's "not set any response code" remark included), once every member has the
    change."""
    cluster, b, port = group(tmp_path)
    for name in ("017-update-and-create-topic", "200-update-and-create-subscriptiongroup"):
        got = replay(cluster, port, name)
        assert encode_command(got.header, got.body) == (FRAMES / f"{name}-response.bin").read_bytes()
    assert golden("017-update-and-create-topic-response").header.remark == NOT_SET
    assert settled(cluster)
    for broker in [b, *others(cluster, b)]:
        assert broker.meta.topics.get("GoldenTopic") == {
            "order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
            "topicName": "GoldenTopic", "topicSysFlag": 0, "writeQueueNums": 4}
        assert broker.meta.groups.get("golden_push_cg")["consumeBroadcastEnable"] is False
        assert broker.meta.topics.data_version == b.meta.topics.data_version


def test_slave_sync_bodies_are_the_recorded_ones(tmp_path):
    """GET_ALL_TOPIC_CONFIG / CONSUMER_OFFSET / DELAY_OFFSET / SUBSCRIPTIONGROUP_CONFIG of a fresh broker named
    as in the recording answer the recorded frames byte for byte (the DataVersion timestamps set to ours)."""
    cluster, b, port = group(tmp_path)
    stamps = {"021-get-all-topic-config": b.meta.topics.data_version["timestamp"],
              "201-get-all-subscriptiongroup-config": b.meta.groups.data_version["timestamp"]}
    for name in ("021-get-all-topic-config", "043-get-all-consumer-offset", "045-get-all-delay-offset",
                 "201-get-all-subscriptiongroup-config"):
        got = replay(cluster, port, name)
        want = golden(f"{name}-response")
        same_header(got, name)
        body = want.body
        if name in stamps:
            body = re.sub(rb'"timestamp":\d+', b'"timestamp":%d' % stamps[name], body, count=1)
        assert got.body == body, name


def test_slave_sync_bodies_with_data_load_as_recorded_shapes(tmp_path):
    """With topics, offsets and delay offsets, the bodies parse back (fastjson) into the same tables."""
    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    wait(cluster, b.commit_offsets([OffsetCommit("golden_pull_cg", "GoldenTopic", 2, 4)]))
    b.meta.delay_offsets.advance(1, 1)
    topics = fastjson.loads(replay(cluster, port, "021-get-all-topic-config").body)
    assert topics["topicConfigTable"]["GoldenTopic"]["writeQueueNums"] == 4
    offsets = replay(cluster, port, "043-get-all-consumer-offset").body
    assert offsets == b'{"offsetTable":{"GoldenTopic@golden_pull_cg":{2:4}}}'
    assert replay(cluster, port, "045-get-all-delay-offset").body == b'{"offsetTable":{1:1}}'


def _record(topic: str, queue_id: int, body: bytes, **props) -> MessageRecord:
    return MessageRecord(topic=topic, body=body, queue_id=queue_id, properties=encode_properties(props),
                         born_timestamp=1)


def _fill(cluster, b):
    """GoldenTopic queue 2: one message at t0, a batch of three one second later, one more a second later."""
    uniq = golden("012-query-message-uniqkey-request").header.ext_fields["key"]
    results = [put(cluster, b, _record("GoldenTopic", 2, b"#2", KEYS="key-B1 key-B2", UNIQ_KEY=uniq, TAGS="TagB"))]
    cluster.run(1.0)
    results.append(put(cluster, b, [_record("GoldenTopic", 2, b"batch%d" % i, KEYS=f"key-batch-{i}")
                                    for i in range(3)]))
    cluster.run(1.0)
    results.append(put(cluster, b, _record("GoldenTopic", 1, b"#1", KEYS="key-A1", TAGS="TagA")))
    assert all(r.ok for r in results)
    assert settled(cluster)
    return results


def test_queries_replayed(tmp_path):
    """SEARCH_OFFSET_BY_TIMESTAMP, GET_EARLIEST_MSG_STORETIME, VIEW_MESSAGE_BY_ID and QUERY_MESSAGE (key and
    unique key) replayed from the recording answer with the recorded header shapes and the stored records."""
    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    first, batch, a1 = _fill(cluster, b)
    record = b.get_message(first.physical_offset, int.from_bytes(b.get_message(first.physical_offset, 4), "big"))
    first_time = int.from_bytes(record[56:64], "big")

    earliest = replay(cluster, port, "032-get-earliest-msg-storetime")
    same_header(earliest, "032-get-earliest-msg-storetime")
    assert earliest.header.ext_fields == {"timestamp": str(first_time)}

    search = "029-search-offset-by-timestamp"
    same_header(replay(cluster, port, search), search)
    # the batch (offsets 1..3) has one store time: the first of them is the answer (RocketMQ answered 3)
    assert replay(cluster, port, search, timestamp=str(first_time + 1000)).header.ext_fields == {"offset": "1"}
    assert replay(cluster, port, search, timestamp=str(first_time)).header.ext_fields == {"offset": "0"}
    assert replay(cluster, port, search, timestamp=str(first_time + 10**6)).header.ext_fields == {"offset": "4"}

    view = replay(cluster, port, "033-view-message-by-id", offset=str(first.physical_offset))
    same_header(view, "033-view-message-by-id")
    assert view.body == record
    bad = replay(cluster, port, "033-view-message-by-id", offset=str(first.physical_offset + 1))
    assert bad.header.code == 1 and "can not find message by the offset" in bad.header.remark

    key = replay(cluster, port, "012-query-message-key")
    same_header(key, "012-query-message-key")
    assert key.body == b.get_message(a1.physical_offset, len(key.body))
    uniq = replay(cluster, port, "012-query-message-uniqkey", beginTimestamp="0")
    same_header(uniq, "012-query-message-uniqkey")
    assert uniq.body == record
    late = replay(cluster, port, "012-query-message-uniqkey")  # recorded beginTimestamp: after our messages
    assert late.header.code == 22 and set(late.header.ext_fields) == set(key.header.ext_fields)
    both = replay(cluster, port, "012-query-message-key", key="key-B2")
    assert both.body == record


def test_stats_replayed(tmp_path):
    """GET_TOPIC_STATS_INFO, GET_CONSUME_STATS and GET_BROKER_RUNTIME_INFO replayed: recorded header shapes,
    bodies with the recorded structure (object map keys) and our values."""
    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    stats = replay(cluster, port, "202-get-topic-stats-info")
    same_header(stats, "202-get-topic-stats-info")
    assert stats.body == golden("202-get-topic-stats-info-response").body  # a new topic: all zeros, as recorded
    _, batch, _ = _fill(cluster, b)
    stats = replay(cluster, port, "202-get-topic-stats-info")
    assert b'"queueId":2,"topic":"GoldenTopic"}:{"lastUpdateTimestamp":' in stats.body
    assert b'"maxOffset":4,"minOffset":0}' in stats.body

    wait(cluster, b.commit_offsets([OffsetCommit("golden_push_cg", "GoldenTopic", 2, 3)]))
    consume = replay(cluster, port, "208-get-consume-stats")
    same_header(consume, "208-get-consume-stats")
    text = consume.body.decode()
    assert text.startswith('{"consumeTps":0.0,"offsetTable":{{"brokerName":"RaftNode00","queueId":0,')
    assert re.search(r'"queueId":2,"topic":"GoldenTopic"\}:\{"brokerOffset":4,"consumerOffset":3,'
                     r'"lastTimestamp":[1-9]\d*\}', text)

    info = replay(cluster, port, "028-get-broker-runtime-info")
    want = same_header(info, "028-get-broker-runtime-info")
    table = fastjson.loads(info.body)["table"]
    assert len(table) == len(fastjson.loads(want.body)["table"])
    assert table["brokerVersionDesc"] == "V4_9_8" and int(table["commitLogMaxOffset"]) > 0
    # a broker up less than 10 s has no 10 s rate yet: RocketMQ's putTps is then blank (mqadmin reads 0)
    assert table["putTps"].split() == [] and float(table["commitLogDiskRatio"]) >= 0
    assert int(table["earliestMessageTimeStamp"]) > 0


def test_unknown_topic_stats_and_admin_errors(tmp_path):
    """Stats of an unknown topic are TOPIC_NOT_EXIST; bad admin requests and admin requests to a slave get
    SYSTEM_ERROR with a one-line reason and change nothing."""
    cluster, b, port = group(tmp_path)
    got = replay(cluster, port, "202-get-topic-stats-info", topic="Nope")
    assert (got.header.code, got.header.remark) == (17, "topic[Nope] not exist")
    bad = replay(cluster, port, "017-update-and-create-topic", topic="TBW102")
    assert bad.header.code == 1 and "conflict with system topic" in bad.header.remark
    bad = replay(cluster, port, "017-update-and-create-topic", topic="RaftCluster")
    assert bad.header.code == 1 and "reserved" in bad.header.remark
    slave = BrokerPort(others(cluster, b)[0], "tcp:0")
    refused = replay(cluster, slave, "017-update-and-create-topic")
    assert refused.header.code == 1 and "not the master" in refused.header.remark
    refused = replay(cluster, slave, "200-update-and-create-subscriptiongroup")
    assert refused.header.code == 1 and "not the master" in refused.header.remark
    assert settled(cluster)
    assert all(br.meta.topics.get("GoldenTopic") is None for br in [b, *others(cluster, b)])


def test_delete_topic_and_group_through_the_log(tmp_path):
    """DELETE_TOPIC_IN_BROKER (215) and DELETE_SUBSCRIPTIONGROUP (207) remove the config on every member."""
    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    replay(cluster, port, "200-update-and-create-subscriptiongroup")
    for code, ext in ((215, {"topic": "GoldenTopic"}), (207, {"groupName": "golden_push_cg"})):
        got = ask(cluster, port, encode_command(Header(code, 7, 0, "JAVA", 409, None, ext)))
        assert (got.header.code, got.header.opaque) == (0, 7)
    assert settled(cluster)
    for broker in [b, *others(cluster, b)]:
        assert broker.meta.topics.get("GoldenTopic") is None and broker.meta.groups.get("golden_push_cg") is None


def test_auto_created_topic_is_known_to_the_new_master(tmp_path):
    """A topic auto-created by a send (the recorded GoldenAutoTopic send) and one made by updateTopic are in
    the new master's table right after the master is killed: no 10 s metadata sync needed (RocketMQ's new master
    would not know them until its next sync)."""
    cluster, b, port = group(tmp_path)
    sent = replay(cluster, port, "310-send-message-v2-autocreate-topic")
    same_header(sent, "310-send-message-v2-autocreate-topic")
    replay(cluster, port, "017-update-and-create-topic")
    want = b.meta.topics.get("GoldenAutoTopic")
    assert want is not None and (want["writeQueueNums"], want["perm"]) == (4, 6)  # as the recording's broker
    old = b.server.self_id
    cluster.crash(old)
    new = master(cluster)
    assert new.server.self_id != old
    assert new.meta.topics.get("GoldenAutoTopic") == want
    assert new.meta.topics.get("GoldenTopic")["readQueueNums"] == 4
    got = replay(cluster, BrokerPort(new, "tcp:0"), "021-get-all-topic-config")
    assert {"GoldenAutoTopic", "GoldenTopic"} <= set(fastjson.loads(got.body)["topicConfigTable"])


def test_restarted_member_applies_metadata_entries_once(tmp_path):
    """A member crashed and restarted replays the log from its persisted applied index: its topic table and
    DataVersion end equal to the others' (no entry applied twice, none missed)."""
    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    victim = others(cluster, b)[0].server.self_id
    assert settled(cluster)
    cluster.run(6.0)  # a metadata persist: the victim's files include the first change
    cluster.crash(victim)
    replay(cluster, port, "310-send-message-v2-autocreate-topic")
    replay(cluster, port, "200-update-and-create-subscriptiongroup")
    cluster.restart(victim)
    assert settled(cluster, 30)
    back = broker_for(cluster.servers[victim])
    assert back.meta.topics.to_json() == b.meta.topics.to_json()
    assert back.meta.groups.to_json() == b.meta.groups.to_json()


def test_metadata_entry_replayed_below_applied_index_is_skipped(tmp_path):
    """A metadata entry the dispatcher passes again (dispatch resumes before the applied index when the consume
    queues were flushed less recently than the metadata) does not move the DataVersion a second time."""
    cluster, b, _ = group(tmp_path)
    index = b.meta.offsets.applied_index + 100
    body = encode_metadata(KIND_TOPIC_CONFIG, [{"topicName": "X", "perm": 6}], 7)
    before = b.meta.topics.data_version["counter"]
    b._on_control(index, body)
    b._on_control(index, body)
    b._on_control(index - 1, encode_metadata(KIND_TOPIC_DELETE, [{"topicName": "X"}], 8))
    assert b.meta.topics.data_version == {"counter": before + 1, "timestamp": 7}
    assert b.meta.topics.get("X") == {"topicName": "X", "perm": 6}


def test_hostile_query_fields_get_one_line_errors(tmp_path):
    """Negative, huge or non-numeric offsets, times and queue ids get SYSTEM_ERROR (or an empty answer), never
    a traceback or a hang; the port keeps serving."""
    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    _fill(cluster, b)
    for offset in ("-1", "0", "9223372036854775807", "48"):
        got = replay(cluster, port, "033-view-message-by-id", offset=offset)
        assert got.header.code == 1 and "can not find message" in got.header.remark, offset
    got = replay(cluster, port, "033-view-message-by-id", offset="x")
    assert got.header.code == 1 and "'offset'" in got.header.remark
    for ext in ({"timestamp": "-5"}, {"queueId": "99"}, {"timestamp": "9223372036854775807"}):
        got = replay(cluster, port, "029-search-offset-by-timestamp", **ext)
        assert got.header.code == 0 and int(got.header.ext_fields["offset"]) >= 0
    got = replay(cluster, port, "029-search-offset-by-timestamp", timestamp="1e9")
    assert got.header.code == 1 and "'timestamp'" in got.header.remark
    got = replay(cluster, port, "012-query-message-key", maxNum="-3")
    assert got.header.code == 1 and "'maxNum'" in got.header.remark
    got = replay(cluster, port, "200-update-and-create-subscriptiongroup")
    assert got.header.code == 0
    got = ask(cluster, port, encode_command(Header(200, 3, 0, "JAVA", 409, None, None), b"\xff\xfe"))
    assert got.header.code == 1 and "not JSON" in got.header.remark


def test_served_sync_bodies_load_into_a_slave(tmp_path):
    """The four GET_ALL bodies the port serves load, through the slave sync's own rule (apply_sync), into a
    fresh member's metadata with the master's tables."""
    from dledger_rocketmq.broker.sync import SyncKind, apply_sync
    from dledger_rocketmq.store.metadata import BrokerMetadata

    cluster, b, port = group(tmp_path)
    replay(cluster, port, "017-update-and-create-topic")
    replay(cluster, port, "200-update-and-create-subscriptiongroup")
    wait(cluster, b.commit_offsets([OffsetCommit("golden_pull_cg", "GoldenTopic", 2, 4)]))
    b.meta.delay_offsets.advance(3, 7)
    slave = BrokerMetadata(tmp_path / "slave", cluster_name="RaftCluster", broker_name="RaftNode00")
    for kind, name in ((SyncKind.TOPIC_CONFIG, "021-get-all-topic-config"),
                       (SyncKind.CONSUMER_OFFSET, "043-get-all-consumer-offset"),
                       (SyncKind.DELAY_OFFSET, "045-get-all-delay-offset"),
                       (SyncKind.SUBSCRIPTION_GROUP, "201-get-all-subscriptiongroup-config")):
        assert apply_sync(slave, kind, replay(cluster, port, name).body), name
    assert slave.topics.to_json() == b.meta.topics.to_json()
    assert slave.groups.to_json() == b.meta.groups.to_json()
    assert slave.offsets.to_json() == b.meta.offsets.to_json()
    assert slave.delay_offsets.to_json() == b.meta.delay_offsets.to_json()


def test_metadata_callbacks_run_on_every_member_once_per_change(tmp_path):
    """Each member's metadata_callbacks see a topic change once when it is applied (a failing one is logged
    and does not stop the others); an unchanged re-put calls nothing."""
    cluster, b, port = group(tmp_path)
    seen = []
    for broker in [b, *others(cluster, b)]:
        broker.metadata_callbacks.append(lambda br, e: 1 / 0)
        broker.metadata_callbacks.append(lambda br, e: seen.append((br.server.self_id, e.kind)))
    replay(cluster, port, "017-update-and-create-topic")
    assert settled(cluster)
    replay(cluster, port, "017-update-and-create-topic")
    assert settled(cluster)
    assert sorted(seen) == sorted((s, KIND_TOPIC_CONFIG) for s in cluster.servers)
