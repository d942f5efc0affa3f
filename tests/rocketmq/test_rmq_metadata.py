"""Broker metadata files (dledger_rocketmq.store.metadata): RocketMQ's config/*.json, load, .bak, periodic persist."""

from __future__ import annotations

import shutil

import pytest
from conftest import GOLDEN, STORE
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import OffsetCommit
from dledger_rocketmq.store.metadata import (
    BrokerMetadata,
    MetadataError,
    default_topics,
    subscription_group_config,
    subscription_group_table,
    topic_config,
    topic_table,
)
from test_rmq_offsets import frame_body
from twisted.internet import defer, task

CONFIG = STORE / "config"
FILES = ("topics.json", "subscriptionGroup.json", "consumerOffset.json", "delayOffset.json")


@pytest.fixture
def golden_dir(tmp_path):
    """A store directory holding a copy of the golden config/ files."""
    shutil.copytree(CONFIG, tmp_path / "config")
    return tmp_path


def golden_meta(store_dir, **kw) -> BrokerMetadata:
    meta = BrokerMetadata(store_dir, cluster_name="RaftCluster", broker_name="RaftNode00", **kw)
    meta.load()
    return meta


@pytest.mark.parametrize("name", FILES)
def test_golden_files_load_and_reserialise_equal(golden_dir, name):
    """Each golden config file loads and is written back byte for byte (tabs, unquoted keys, Java order)."""
    meta = golden_meta(golden_dir)
    assert dict(meta.snapshot(force=True))[name] == (CONFIG / name).read_bytes()


def test_golden_values(golden_dir):
    """Loaded values are the golden ones (topics, groups, offsets, delay offsets, data versions)."""
    meta = golden_meta(golden_dir)
    assert meta.topics.get("GoldenTopic") == topic_config("GoldenTopic", 4, 4, 6)
    assert meta.topics.data_version == {"counter": 8, "timestamp": 1795427039157}
    assert meta.groups.get("golden_push_cg") == subscription_group_config(
        "golden_push_cg", consumeBroadcastEnable=False, consumeFromMinEnable=False)
    assert meta.offsets.query("golden_lite_cg", "GoldenTopic", 2) == 8
    assert meta.delay_offsets.items() == {1: 1, 2: 1, 3: 1}


def test_default_topics_are_the_golden_system_topics():
    """The system topics created before loading equal the golden broker's (cluster RaftCluster, broker RaftNode00)."""
    golden = fastjson.loads((CONFIG / "topics.json").read_text())["topicConfigTable"]
    for name, config in default_topics("RaftCluster", "RaftNode00").items():
        assert golden[name] == config, name
    assert set(default_topics("C", "B")) == {"SELF_TEST_TOPIC", "TBW102", "BenchmarkTest", "C", "B",
                                            "OFFSET_MOVED_EVENT", "SCHEDULE_TOPIC_XXXX", "C_REPLY_TOPIC"}
    assert "TBW102" not in default_topics("C", "B", auto_create_topic=False)


def test_default_groups_are_the_golden_system_groups():
    """The system subscription groups equal the golden broker's."""
    golden = fastjson.loads((CONFIG / "subscriptionGroup.json").read_text())["subscriptionGroupTable"]
    meta = BrokerMetadata("unused")
    for name, config in meta.groups.table.items():
        assert golden[name] == config, name


def test_missing_files_mean_defaults(tmp_path):
    """An empty store starts with the system topics and groups, no offsets, and persist creates all files."""
    meta = BrokerMetadata(tmp_path, cluster_name="C", broker_name="B")
    meta.load()
    assert meta.topics.get("SCHEDULE_TOPIC_XXXX")["readQueueNums"] == 18
    assert meta.offsets.query("g", "T", 0) == -1 and meta.delay_offsets.items() == {}
    written = meta.persist().result
    assert set(FILES) <= set(written)
    again = BrokerMetadata(tmp_path, cluster_name="C", broker_name="B")
    again.load()
    assert again.topics.to_json() == meta.topics.to_json()


@pytest.mark.parametrize("name", FILES)
def test_damaged_file_falls_back_to_bak(golden_dir, name):
    """A damaged file loads its .bak (the previous content), as RocketMQ's ConfigManager does."""
    (golden_dir / "config" / name).write_text("{garbage")
    meta = golden_meta(golden_dir)
    assert dict(meta.snapshot(force=True))[name] == (CONFIG / f"{name}.bak").read_bytes()


@pytest.mark.parametrize("name, content, reason", [
    ("topics.json", "{", "not JSON"),
    ("consumerOffset.json", '{"offsetTable":{"x":{0:1}}}', "not topic@group"),
    ("delayOffset.json", "", "empty"),
    ("subscriptionGroup.json", '{"subscriptionGroupTable":{"g":{"groupName":"h"}}}', "names itself"),
])
def test_damaged_file_without_bak_is_a_one_line_error(golden_dir, name, content, reason):
    """Damaged file and no usable .bak: MetadataError naming the file and the reason (RocketMQ starts empty)."""
    (golden_dir / "config" / name).write_text(content)
    (golden_dir / "config" / f"{name}.bak").unlink()
    with pytest.raises(MetadataError) as info:
        golden_meta(golden_dir)
    text = str(info.value)
    assert str(golden_dir / "config" / name) in text and reason in text and "\n" not in text


def test_persist_writes_only_changed_tables_with_bak(golden_dir):
    """After a commit only consumerOffset.json (+ its applied index) is rewritten; the old content goes to .bak."""
    meta = golden_meta(golden_dir)
    old = (golden_dir / "config" / "consumerOffset.json").read_bytes()
    assert meta.persist().result == []
    meta.offsets.apply([OffsetCommit("golden_pull_cg", "GoldenTopic", 2, 9)])
    assert meta.persist().result == ["consumerOffset.json", "consumerOffset.json.dledger"]
    assert (golden_dir / "config" / "consumerOffset.json.bak").read_bytes() == old
    reloaded = golden_meta(golden_dir)
    assert reloaded.offsets.query("golden_pull_cg", "GoldenTopic", 2) == 9


def test_applied_index_survives_restart(tmp_path):
    """The last applied control-entry index is persisted with the offsets and reloaded."""
    meta = BrokerMetadata(tmp_path)
    meta.offsets.applied_index = 41
    meta.persist()
    again = BrokerMetadata(tmp_path)
    again.load()
    assert again.offsets.applied_index == 41


def test_periodic_persist_on_injected_clock_and_on_stop(tmp_path):
    """The service persists changed tables every persist_interval on its clock and once more when stopped."""
    clock = task.Clock()
    meta = BrokerMetadata(tmp_path, clock=clock, persist_interval=5.0)
    meta.startService()
    path = tmp_path / "config" / "consumerOffset.json"
    assert not path.exists()
    clock.advance(5)
    assert path.exists()
    meta.offsets.apply([OffsetCommit("g", "T", 0, 3)])
    clock.advance(4.9)
    assert "T@g" not in path.read_text()
    clock.advance(0.1)
    assert "T@g" in path.read_text()
    meta.offsets.apply([OffsetCommit("g", "T", 0, 4)])
    d = meta.stopService()
    assert d.called and '"T@g":{0:4' in path.read_text()
    assert not clock.getDelayedCalls()


def test_persist_runs_through_the_blocking_io(tmp_path):
    """Writes go through the injected BlockingIO; a second persist waits for the first."""
    calls = []

    class HeldIO:
        def run(self, fn, *args):
            d = defer.Deferred()
            calls.append((d, fn, args))
            return d

    meta = BrokerMetadata(tmp_path, io=HeldIO())
    results = []
    meta.persist().addCallback(results.append)
    meta.persist().addCallback(results.append)
    assert len(calls) == 1 and results == []
    d, fn, args = calls[0]
    fn(*args)
    d.callback(None)
    assert sorted(map(len, results)) == [0, 5] and len(calls) == 1  # the second found nothing changed
    assert (tmp_path / "config" / "topics.json").exists()


def test_topic_put_moves_data_version():
    """put() bumps the DataVersion counter with the clock's time in ms."""
    clock = task.Clock()
    clock.advance(12.5)
    table = topic_table(clock=clock)
    table.put(topic_config("T", 4, 4))
    assert table.data_version == {"counter": 1, "timestamp": 12500}


@pytest.mark.parametrize("frame, factory, capacity_key", [
    ("021-get-all-topic-config-end-of-run-with-data-response.bin", topic_table, "topicConfigTable"),
    ("201-get-all-subscriptiongroup-config-end-of-run-with-data-response.bin", subscription_group_table,
     "subscriptionGroupTable"),
])
def test_golden_get_all_bodies_round_trip(frame, factory, capacity_key):
    """GET_ALL_TOPIC_CONFIG / GET_ALL_SUBSCRIPTIONGROUP_CONFIG bodies parse and re-serialise compactly."""
    body = frame_body(GOLDEN / "frames" / frame)
    table = factory(fastjson.loads(body))
    assert capacity_key in table.to_dict()
    assert table.to_json(pretty=False).encode() == body
