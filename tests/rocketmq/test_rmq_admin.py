"""The admin codes' pure parts: metadata control entries, argument checks, searches and fastjson bodies."""

from __future__ import annotations

import pytest
from conftest import GOLDEN
from dledger_rocketmq.broker import admin
from dledger_rocketmq.broker.port import decode_header
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import (
    KIND_GROUP_CONFIG,
    KIND_GROUP_DELETE,
    KIND_TOPIC_CONFIG,
    KIND_TOPIC_DELETE,
    ControlError,
    OffsetCommit,
    control_kind,
    decode_control,
    encode_metadata,
    encode_offset_commits,
)
from dledger_rocketmq.store.metadata import BrokerMetadata, topic_config
from dledger_rocketmq.store.offsets import ConsumerOffsetTable

from dledger.transport.remoting import FrameSplitter

FRAMES = GOLDEN / "frames"


def golden(name: str):
    [f] = FrameSplitter(header_decoder=decode_header).feed((FRAMES / f"{name}.bin").read_bytes())
    return f


# -- control kinds 3-6 ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind, configs", [
    (KIND_TOPIC_CONFIG, [topic_config("T", 4, 4), topic_config("U", 1, 1, 2, order=True)]),
    (KIND_TOPIC_DELETE, [{"topicName": "T"}]),
    (KIND_GROUP_CONFIG, [{"groupName": "g", "consumeEnable": False}]),
    (KIND_GROUP_DELETE, [{"groupName": "g"}]),
])
def test_metadata_entry_round_trip(kind, configs):
    """A metadata control entry decodes to its kind, its configs in order and the master's timestamp."""
    body = encode_metadata(kind, configs, 1795426915371)
    assert control_kind(body) == kind
    entry = decode_control(body)
    assert (entry.kind, list(entry.configs), entry.timestamp, entry.commits) == (kind, configs, 1795426915371, ())


@pytest.mark.parametrize("kind, configs, error", [
    (KIND_TOPIC_CONFIG, [], "nothing to change"),
    (KIND_TOPIC_CONFIG, [{"perm": 6}], "empty or missing name"),
    (KIND_TOPIC_CONFIG, [{"topicName": "a@b"}], "'@'"),
    (KIND_GROUP_CONFIG, [{"groupName": "g" * 300}], "exceeds"),
    (KIND_GROUP_CONFIG, [["groupName"]], "not an object"),
    (1, [{"topicName": "T"}], "not a metadata kind"),
])
def test_metadata_entry_encode_refuses(kind, configs, error):
    """Configs without a usable name, empty changes and non-metadata kinds are refused when encoding."""
    with pytest.raises(ControlError, match=error):
        encode_metadata(kind, configs, 0)


def _corrupt(body: bytes, at: int, data: bytes) -> bytes:
    return body[:at] + data + body[at + len(data):]


GOOD = encode_metadata(KIND_TOPIC_CONFIG, [topic_config("T", 4, 4)], 5)


@pytest.mark.parametrize("body, error", [
    (GOOD[:10], "truncated in its timestamp"),
    (GOOD[:18], "truncated in its length"),
    (GOOD[:-1], "out of range"),
    (GOOD + b"x", "bytes after"),
    (_corrupt(GOOD, 19, b"["), "not a JSON object|not UTF-8 JSON"),
    (_corrupt(GOOD, 5, b"\x00\x02"), "truncated|out of range"),
    (encode_metadata(KIND_TOPIC_CONFIG, [{"topicName": "T"}], 0).replace(b'"T"', b'"@"'), "'@'"),
])
def test_metadata_entry_decode_is_strict(body, error):
    """A damaged metadata entry raises ControlError saying what is wrong (never half-applied)."""
    with pytest.raises(ControlError, match=error):
        decode_control(body)


def test_offset_table_counts_metadata_entries_as_applied():
    """The offset table skips a metadata entry's (absent) commits but counts it applied: the restart replay
    starts after it, and a replay of it changes nothing."""
    table = ConsumerOffsetTable()
    assert table.on_control(3, GOOD) == 0 and table.applied_index == 3
    assert table.on_control(4, encode_offset_commits([OffsetCommit("g", "T", 0, 9)])) == 1
    assert table.query("g", "T", 0) == 9


def test_apply_change_stamps_the_entry_time(tmp_path):
    """Applying a metadata entry changes the table and stamps the DataVersion with the entry's timestamp, so
    two members applying the same entries have the same DataVersion; an equal put changes nothing."""
    a, b = BrokerMetadata(tmp_path / "a"), BrokerMetadata(tmp_path / "b")
    entries = [decode_control(encode_metadata(KIND_TOPIC_CONFIG, [topic_config("T", 4, 4)], 111)),
               decode_control(encode_metadata(KIND_GROUP_CONFIG, [{"groupName": "g"}], 222)),
               decode_control(encode_metadata(KIND_TOPIC_CONFIG, [topic_config("T", 4, 4)], 333)),
               decode_control(encode_metadata(KIND_TOPIC_DELETE, [{"topicName": "nope"}], 444))]
    changed = [a.apply_change(e) for e in entries]
    for e in entries:
        b.apply_change(e)
    assert changed == [1, 1, 0, 0]
    assert a.topics.get("T")["writeQueueNums"] == 4 and a.groups.get("g") == {"groupName": "g"}
    assert a.topics.data_version == b.topics.data_version == {"counter": 1, "timestamp": 111}
    assert a.groups.data_version == b.groups.data_version == {"counter": 1, "timestamp": 222}
    a.apply_change(decode_control(encode_metadata(KIND_TOPIC_DELETE, [{"topicName": "T"}], 555)))
    assert a.topics.get("T") is None and a.topics.data_version == {"counter": 2, "timestamp": 555}


# -- argument checks ---------------------------------------------------------------------------------------------

def test_update_topic_config_from_golden_request():
    """mqadmin updateTopic's recorded extFields give the TopicConfig the recording's broker stored."""
    config, problem = admin.update_topic_config(golden("017-update-and-create-topic-request").header.ext_fields)
    assert problem is None
    assert config == {"order": False, "perm": 6, "readQueueNums": 4, "topicFilterType": "SINGLE_TAG",
                      "topicName": "GoldenTopic", "topicSysFlag": 0, "writeQueueNums": 4}


BASE = {"topic": "T", "readQueueNums": "4", "writeQueueNums": "4", "perm": "6"}


@pytest.mark.parametrize("ext, problem", [
    ({**BASE, "topic": ""}, "blank"),
    ({**BASE, "topic": "a b"}, "illegal characters"),
    ({**BASE, "topic": "x" * 128}, "longer than topic max length"),
    ({**BASE, "topic": "TBW102"}, "conflict with system topic"),
    ({**BASE, "topic": "rmq_sys_x"}, "conflict with system topic"),
    ({**BASE, "readQueueNums": "0"}, "'readQueueNums' = 0 is not in"),
    ({**BASE, "writeQueueNums": "x"}, "not an integer"),
    ({k: v for k, v in BASE.items() if k != "perm"}, "lacks the field 'perm'"),
    ({**BASE, "perm": "8"}, "'perm' = 8"),
    ({**BASE, "topicFilterType": "SQL"}, "topicFilterType"),
    (BASE, None),
    ({**BASE, "order": True, "topicSysFlag": 3}, None),
])
def test_update_topic_config_checks(ext, problem):
    """Bad topic names (RocketMQ's TopicValidator remarks), queue counts, perms and filter types are refused."""
    config, why = admin.update_topic_config(ext)
    if problem is None:
        assert why is None and config["topicName"] == ext["topic"]
    else:
        assert config is None and problem in why


def test_subscription_group_from_golden_body():
    """mqadmin updateSubGroup's recorded body parses to the same SubscriptionGroupConfig (all fields kept)."""
    req = golden("200-update-and-create-subscriptiongroup-request")
    config, problem = admin.subscription_group_from_body(req.body)
    assert problem is None and config == fastjson.loads(req.body)


@pytest.mark.parametrize("body, problem", [
    (b"{", "not JSON"),
    (b"[]", "not a JSON object"),
    (b'{"groupName":""}', "blank"),
    (b'{"groupName":"a@b"}', "'@'"),
    (b'{"groupName":"g","retryMaxTimes":"16"}', "must be a int"),
    (b'{"groupName":"g","consumeEnable":1}', "must be a bool"),
    (b'{"groupName":"g","brokerId":99999999999}', "out of int range"),
])
def test_subscription_group_checks(body, problem):
    """A group body that is not a SubscriptionGroupConfig is refused with a one-line reason."""
    config, why = admin.subscription_group_from_body(body)
    assert config is None and problem in why


def test_subscription_group_defaults_and_unknown_fields():
    """Missing fields take RocketMQ's defaults; unknown fields are dropped."""
    config, _ = admin.subscription_group_from_body(b'{"groupName":"g","retryMaxTimes":3,"whatever":1}')
    assert config["retryMaxTimes"] == 3 and config["consumeEnable"] is True and "whatever" not in config


# -- searches ---------------------------------------------------------------------------------------------------

TIMES = [10, 20, 20, 20, 30]  # a batch of three stored in one millisecond, as in the recording


@pytest.mark.parametrize("timestamp, offset", [(5, 0), (10, 0), (11, 1), (20, 1), (21, 4), (30, 4), (31, 5)])
def test_first_at_or_after(timestamp, offset):
    """The search returns the first message stored at or after the time (not any of equal ones), max if none."""
    assert admin.first_at_or_after(0, len(TIMES), timestamp, TIMES.__getitem__) == offset


def test_first_at_or_after_reads_log_many():
    """The search reads O(log n) store times (a queue of a million messages costs ~20 reads)."""
    reads = []
    admin.first_at_or_after(0, 1_000_000, 500_000, lambda o: reads.append(o) or o)
    assert len(reads) <= 21


@pytest.mark.parametrize("props, key, unique, hit", [
    ({"KEYS": "key-B1 key-B2"}, "key-B2", False, True),
    ({"KEYS": "key-B1 key-B2"}, "key-B", False, False),
    ({"KEYS": "k", "UNIQ_KEY": "U"}, "U", False, True),
    ({"KEYS": "U"}, "U", True, False),
    ({"UNIQ_KEY": "U"}, "U", True, True),
])
def test_key_matches(props, key, unique, hit):
    """A key query matches a KEYS word or the UNIQ_KEY; a unique-key query only the UNIQ_KEY."""
    assert admin.key_matches(props, key, unique) is hit


def test_query_args_from_golden_requests():
    """The recorded QUERY_MESSAGE requests (key and unique key) parse; maxNum is capped."""
    key = admin.query_args(golden("012-query-message-key-request").header.ext_fields)
    assert (key.topic, key.key, key.unique, key.begin, key.max_num) == ("GoldenTopic", "key-A1", False, 0, 32)
    uniq = admin.query_args(golden("012-query-message-uniqkey-request").header.ext_fields)
    assert uniq.unique and uniq.end == (1 << 63) - 1
    assert admin.query_args({"topic": "T", "key": "k", "maxNum": "100000"}).max_num == admin.QUERY_MAX_NUM
    with pytest.raises(ValueError, match="'key'"):
        admin.query_args({"topic": "T"})


# -- bodies -----------------------------------------------------------------------------------------------------

def test_message_queue_order_matches_recording():
    """MessageQueue keys iterate as in the recorded ConsumeStats: GoldenTopic queues 0, 2, 1, 3, then %RETRY%."""
    keys = [("RaftNode00", q, "GoldenTopic") for q in range(4)] + [("RaftNode00", 0, "%RETRY%golden_push_cg")]
    order = admin.java_order(keys, lambda k: admin.message_queue_hash(*k))
    assert [(k[1], k[2][:3]) for k in order] == [(0, "Gol"), (2, "Gol"), (1, "Gol"), (3, "Gol"), (0, "%RE")]


def test_topic_stats_body_is_the_recorded_one():
    """GET_TOPIC_STATS_INFO's body for a new 4-queue topic is byte for byte the recorded one (object keys)."""
    want = golden("202-get-topic-stats-info-response").body
    assert admin.topic_stats_body("RaftNode00", "GoldenTopic", {q: (0, 0, 0) for q in range(4)}) == want


def test_consume_stats_body_is_the_recorded_one():
    """GET_CONSUME_STATS's body with the recorded offsets and times is byte for byte the recorded one."""
    want = golden("208-get-consume-stats-response").body
    rows = [("GoldenTopic", 0, 3, 1795427020243), ("GoldenTopic", 1, 3, 1795427018592),
            ("GoldenTopic", 2, 8, 1795427027953), ("GoldenTopic", 3, 4, 1795427018128),
            ("%RETRY%golden_push_cg", 0, 1, 1795427045685)]
    progress = [admin.QueueProgress(t, q, o, o, ts) for t, q, o, ts in rows]
    assert admin.consume_stats_body("RaftNode00", progress, consume_tps=1.0) == want


@pytest.mark.parametrize("value, text", [(0.0, "0.0"), (1.0, "1.0"), (2.5, "2.5"), (1e-05, "1.0E-5")])
def test_java_double(value, text):
    """Doubles are written as Java/fastjson writes them."""
    assert admin.java_double(value) == text


def test_runtime_info_keys_and_order_match_recording():
    """GET_BROKER_RUNTIME_INFO has every recorded key, in the recorded (HashMap) order, idle values as recorded."""
    want = fastjson.loads(golden("028-get-broker-runtime-info-response").body)["table"]
    path_key = next(k for k in want if k.startswith("commitLogDiskRatio_"))
    got = fastjson.loads(admin.runtime_info_body({}, path_key))["table"]
    assert set(got) == set(want)
    common = [k for k in want if k != path_key]
    assert [k for k in got if k != path_key] == common
    for key in ("getFoundTps", "putTps", "getTotalTps", "remainHowManyDataToFlush", "putMessageDistributeTime"):
        assert got[key] == want[key]


@pytest.mark.parametrize("ms, text", [(31_000, "[ 0 days, 0 hours, 0 minutes, 31 seconds ]"),
                                      (90_061_000, "[ 1 days, 1 hours, 1 minutes, 1 seconds ]")])
def test_runtime_text(ms, text):
    """The runtime value reads as RocketMQ's."""
    assert admin.runtime_text(ms) == text


def test_capacity_text():
    """commitLogDirCapacity reads as RocketMQ's (binary units, one decimal)."""
    assert admin.capacity_text(252 << 30, int(70.3 * (1 << 30))) == "Total : 252.0 GiB, Free : 70.3 GiB."
