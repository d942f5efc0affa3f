"""The metadata wired into the Broker: offsets through the log, restart replay, delayed delivery, files, sync."""

from __future__ import annotations

import functools
import json
import shutil

import pytest
from dledger_rocketmq import plugin
from dledger_rocketmq.broker.broker import Broker, delayed
from dledger_rocketmq.broker.sync import master_body
from dledger_rocketmq.common.control import OffsetCommit
from dledger_rocketmq.common.message import MessageRecord, decode_record, encode_properties
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.commitlog import PutStatus
from dledger_rocketmq.store.consumequeue import SCHEDULE_TOPIC
from dledger_rocketmq.store.dispatch import resume_index
from dledger_rocketmq.store.metadata import APPLIED_INDEX_FILE, CONSUMER_OFFSET_FILE, MetadataError, topic_config
from dledger_rocketmq.store.offsets import ConsumerOffsetTable
from rmq_cluster_util import broker_cluster, master, msg, put, settled
from twisted.internet.defer import succeed

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.tap import start_error_line


def commit(cluster, broker, commits, timeout: float = 10.0):
    """Run ``broker.commit_offsets(commits)`` until answered; its result (an index or a Failure)."""
    out = []
    broker.commit_offsets(commits).addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), timeout), "commit never answered"
    return out[0]


def delayed_msg(level: int, topic: str = "T", body: bytes = b"later", queue_id: int = 0) -> MessageRecord:
    return MessageRecord(topic=topic, body=body, queue_id=queue_id, born_timestamp=1,
                         properties=encode_properties({"DELAY": str(level), "KEYS": "k"}))


@pytest.mark.parametrize("after_records, controls_from, begin, expect", [
    (10, None, 0, 10), (10, 10, 0, 10), (10, 12, 0, 10), (10, 4, 0, 4), (10, 0, 0, 0), (10, 2, 5, 5),
])
def test_resume_index(after_records, controls_from, begin, expect):
    """Dispatch resumes before the last indexed record when control entries after applied_index may be unapplied."""
    assert resume_index(after_records, controls_from, begin) == expect


def test_delayed_rewrites_only_messages_with_a_delay_level():
    """The send path moves DELAY > 0 messages to SCHEDULE_TOPIC_XXXX queue level-1 and leaves others alone."""
    plain = msg()
    assert delayed(plain) is plain
    assert delayed(delayed_msg(0)).topic == "T"
    d = delayed(delayed_msg(3, topic="Real", queue_id=2))
    assert (d.topic, d.queue_id) == (SCHEDULE_TOPIC, 2)
    assert d.property_map["REAL_TOPIC"] == "Real" and d.property_map["REAL_QID"] == "2"


def test_offsets_committed_through_the_broker_survive_a_master_crash(tmp_path):
    """Every commit acknowledged by Broker.commit_offsets is known to the new master after the old one is killed."""
    cluster = broker_cluster(tmp_path, seed=5)
    b = master(cluster)
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    refused = commit(cluster, slave, [OffsetCommit("cg", "T", 0, 1)])
    assert isinstance(refused.value, DLedgerError) and refused.value.code is ResponseCode.NOT_LEADER
    acked: dict[int, int] = {}
    for n in range(1, 61):
        if n % 7 == 0:
            assert put(cluster, b, msg(body=b"m%d" % n)).ok  # records between the control entries
        c = OffsetCommit("cg", "T", n % 4, n)
        index = commit(cluster, b, [c])
        assert isinstance(index, int), index
        assert b.query_offset("cg", "T", c.queue_id) == c.offset  # applied here when the commit answers
        acked[c.queue_id] = c.offset
    old = b.server.self_id
    cluster.crash(old)
    nb = master(cluster)
    assert nb.server.self_id != old
    lost = [q for q, off in acked.items() if nb.query_offset("cg", "T", q) != off]
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged offsets lost: {lost}"
    assert nb.offsets is nb.meta.offsets and len(nb.offsets) == 4
    cluster.restart(old)  # the old master rebuilds the same table from its metadata and the log
    assert settled(cluster, 30)
    assert broker_for(cluster.servers[old]).offsets.to_json() == nb.offsets.to_json()


def test_a_restart_reapplies_control_entries_committed_after_the_persisted_applied_index(tmp_path):
    """Offset commits after the last persisted metadata, followed by records, are applied again after a restart."""
    cluster = broker_cluster(tmp_path, seed=2)
    b = master(cluster)
    assert isinstance(commit(cluster, b, [OffsetCommit("cg", "T", 0, 1)]), int)
    assert settled(cluster)
    victim = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    vb = broker_for(cluster.servers[victim])
    done = []
    vb.meta.persist(force=True).addBoth(done.append)
    assert cluster.run_until(lambda: bool(done))
    saved = tmp_path / "saved-config"
    shutil.copytree(vb.meta.config_dir, saved)
    persisted = json.loads((saved / APPLIED_INDEX_FILE).read_text())["appliedIndex"]
    assert isinstance(commit(cluster, b, [OffsetCommit("cg", "T", 0, 5), OffsetCommit("cg", "T", 1, 7)]), int)
    for i in range(3):  # records after the control entry: the queues resume after them
        assert put(cluster, b, msg(body=b"after-%d" % i)).ok
    assert settled(cluster)
    assert vb.query_offset("cg", "T", 0) == 5
    config = vb.meta.config_dir
    cluster.crash(victim)
    shutil.rmtree(config)  # as if the last periodic persist had not happened before the kill
    shutil.copytree(saved, config)
    cluster.restart(victim)
    rb = broker_for(cluster.servers[victim])
    assert rb.offsets.applied_index == persisted
    assert settled(cluster)
    assert (rb.query_offset("cg", "T", 0), rb.query_offset("cg", "T", 1)) == (5, 7)
    assert rb.offsets.to_json() == b.offsets.to_json()
    # The metadata machine re-applied them; the consume-queue dispatch no longer goes back for control entries.
    assert rb.dispatcher.start_index() > persisted + 1


def test_a_delayed_message_is_delivered_once_after_its_delay_on_the_master(tmp_path):
    """DELAY=1 (1 s): invisible in its topic before its time, then delivered exactly once, DELAY bytes kept."""
    cluster = broker_cluster(tmp_path, seed=4)
    b = master(cluster)
    cluster.run(2.0)  # delayed delivery's first run is 1 s after becoming master
    sent_at = cluster.clock.seconds()
    r = put(cluster, b, delayed_msg(1))
    assert r.ok and r.queue_id == 0
    assert cluster.run_until(lambda: b.max_offset(SCHEDULE_TOPIC, 0) == 1, 5)
    assert not cluster.run_until(lambda: b.max_offset("T", 0) > 0, sent_at + 0.9 - cluster.clock.seconds()), \
        "delivered before its delay"
    assert cluster.run_until(lambda: b.max_offset("T", 0) == 1, 3), "never delivered"
    assert cluster.clock.seconds() - sent_at >= 1.0
    cluster.run(5.0)
    assert b.max_offset("T", 0) == 1, "delivered more than once"
    got = b.get_messages("cg", "T", 0, 0, 10)
    rec = decode_record(got.records[0])
    assert rec.body == b"later" and rec.topic == "T" and rec.property_map["DELAY"] == "1"
    assert rec.physical_offset > r.physical_offset and rec.store_timestamp >= int((sent_at + 1.0) * 1000)
    assert b.meta.delay_offsets.get(1) == 1
    assert settled(cluster)
    for s in cluster.servers.values():
        other = broker_for(s)
        assert other.max_offset("T", 0) == 1
        if other is not b:
            assert other.delivery is None or not other.delivery.running  # delivery runs on the master only


def test_a_delayed_batch_goes_to_the_schedule_queue(tmp_path):
    """put_messages applies the delay rewrite to each message of a batch before offsets are planned."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    r = put(cluster, b, [delayed_msg(2, body=b"a"), delayed_msg(2, body=b"b")])
    assert r.status is PutStatus.PUT_OK and r.queue_offset == 0
    assert settled(cluster)
    assert b.max_offset(SCHEDULE_TOPIC, 1) == 2 and b.max_offset("T", 0) == 0


def test_delayed_delivery_stops_on_step_down(tmp_path):
    """When the master's leadership moves away, its delayed delivery stops and the new master's starts."""
    cluster = broker_cluster(tmp_path, seed=6)
    b = master(cluster)
    cluster.run(0.5)
    assert b.delivery is not None and b.delivery.running
    cluster.partition([b.server.self_id], [m for m in cluster.servers if m != b.server.self_id])
    assert cluster.run_until(lambda: b.role != "MASTER", 20)
    assert not b.delivery.running
    nb = master(cluster)  # the majority side elects a new master
    assert nb is not b and nb.delivery is not None and nb.delivery.running
    cluster.heal()
    cluster.run(5.0)
    assert b.role != "MASTER" and not b.delivery.running


def test_metadata_files_are_written_on_stop(tmp_path):
    """With no periodic persist, stopping the members writes consumerOffset.json (and its applied index)."""
    cluster = broker_cluster(tmp_path, **{"rocketmq.flushConsumerOffsetInterval": 0})
    b = master(cluster)
    index = commit(cluster, b, [OffsetCommit("cg", "T", 3, 42)])
    assert settled(cluster)
    brokers = [broker_for(s) for s in cluster.servers.values()]
    assert not any((br.meta.config_dir / CONSUMER_OFFSET_FILE).exists() for br in brokers)
    out = []
    cluster.stop().addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 60)
    for br in brokers:
        path = br.meta.config_dir / CONSUMER_OFFSET_FILE
        assert ConsumerOffsetTable.from_json(path.read_bytes()).query("cg", "T", 3) == 42
        applied = json.loads((br.meta.config_dir / APPLIED_INDEX_FILE).read_text())["appliedIndex"]
        assert applied >= index
        assert (br.meta.config_dir / "topics.json").exists()


def test_damaged_metadata_fails_the_member_start_with_one_line(tmp_path):
    """A topics.json that does not parse, with no .bak, stops the member's start with a one-line MetadataError."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    victim = b.server.self_id
    config = b.meta.config_dir
    cluster.crash(victim)  # the crash's service stop writes the files
    (config / "topics.json").write_text("{ not json")
    (config / "topics.json.bak").unlink(missing_ok=True)
    with pytest.raises(MetadataError) as info:
        cluster.restart(victim)  # the broker loads its metadata while the member is built
    err = info.value
    line = start_error_line(err)
    assert line is not None and "topics.json" in line and "\n" not in line


def test_slave_sync_runs_on_slaves_only_when_a_fetch_is_given(tmp_path, monkeypatch):
    """With an injected fetch, slaves copy the master's topics; the master does not sync; no fetch, no sync."""
    current = {}

    def fetch(kind):
        return succeed(master_body(current["b"].meta, kind))
    monkeypatch.setattr(plugin, "Broker", functools.partial(Broker, fetch=fetch))
    cluster = broker_cluster(tmp_path)
    b = current["b"] = master(cluster)
    b.meta.topics.put(topic_config("NewTopic", 4, 4))
    cluster.run(11.0)  # one sync interval
    for s in cluster.servers.values():
        br = broker_for(s)
        assert br.sync is not None
        if br is b:
            assert not br.sync.syncing and br.meta.topics.get("NewTopic") is not None
        else:
            assert br.sync.syncing and br.sync.rounds >= 1
            assert br.meta.topics.get("NewTopic") == topic_config("NewTopic", 4, 4)
    monkeypatch.undo()
    plain = broker_cluster(tmp_path / "plain")
    assert all(broker_for(s).sync is None for s in plain.servers.values())


def test_a_commit_waiting_for_dispatch_fails_when_the_broker_stops(tmp_path):
    """A commit_offsets still waiting for its entry to be applied fails with TERM_CHANGED at stop, never hangs."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    b.machine.caught_up = lambda index: False  # this member's metadata machine never catches up
    out = []
    b.commit_offsets([OffsetCommit("cg", "T", 0, 1)]).addBoth(out.append)
    cluster.run(2.0)
    assert out == []
    stopped = []
    b.server.stop().addBoth(stopped.append)
    assert cluster.run_until(lambda: bool(out) and bool(stopped), 40)
    assert isinstance(out[0].value, DLedgerError) and out[0].value.code is ResponseCode.TERM_CHANGED
