"""The broker's metadata machine inside members (issue #22 item 6), in process on virtual time.

A 3-member broker group on dledger.testing.Cluster: topics, groups, offsets
and the ACL through the log; a snapshot and compaction on a member; the
member restarted with its config/ files gone restores the snapshot and is
fed only the entries after it; consume queues after compaction.
"""

from __future__ import annotations

import shutil

import pytest
from dledger_rocketmq.broker.broker import GetStatus
from dledger_rocketmq.common.control import KIND_GROUP_CONFIG, KIND_TOPIC_CONFIG, OffsetCommit
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.machine import BrokerMachine
from dledger_rocketmq.store.metadata import subscription_group_config, topic_config
from rmq_cluster_util import master, msg, put, settled
from test_rmq_machine import CONFIG, tables

from dledger import plugins
from dledger.testing import Cluster


def snap_cluster(tmp_path, **options) -> Cluster:
    """A started broker group whose members snapshot only on demand and keep no trailing entries."""
    extras = {"rocketmq.enabled": True, "rocketmq.mappedFileSizeConsumeQueue": 1000}
    cluster = Cluster(3, seed=3, plugin_manager=plugins.make_plugin_manager(), store_base_dir=str(tmp_path),
                      extras=extras, snapshot_threshold=0, trailing_entries=0, **options)
    cluster.start()
    # Compaction waits until every peer is known to be a dledger member (it may be Java otherwise).
    assert cluster.run_until(lambda: all(s.snapshots.peers_take_snapshots() for s in cluster.servers.values()), 10)
    return cluster


def wait(cluster, d, timeout=20.0):
    out = []
    d.addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), timeout), "no answer"
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def transfer(cluster, to: str, tries: int = 10) -> None:
    """``dledger transfer --to``: retried while the group settles (a transfer is refused while the target lags)."""
    for _ in range(tries):
        if cluster.servers[to].state.role.name == "LEADER":
            return
        out = []
        cluster.client().transfer(to).addBoth(out.append)
        cluster.run_until(lambda out=out: bool(out), 10)
        cluster.run(1.0)
    assert cluster.servers[to].state.role.name == "LEADER", f"{to} never became leader"


def populate(cluster, b, n_records=12):
    """Topics, a group, offsets (a reset among them), the ACL, records in two queues; returns what was committed."""
    wait(cluster, b.change_metadata(KIND_TOPIC_CONFIG, [topic_config("SnapTopic", 2, 2)]))
    wait(cluster, b.change_metadata(KIND_GROUP_CONFIG, [subscription_group_config("cg", retryMaxTimes=5)]))
    wait(cluster, b.change_acl(CONFIG, "admin"))
    for i in range(n_records):
        assert put(cluster, b, msg(topic="SnapTopic", body=b"m%d" % i, queue_id=i % 2)).ok
    wait(cluster, b.commit_offsets([OffsetCommit("cg", "SnapTopic", 0, 5), OffsetCommit("cg", "SnapTopic", 1, 6)]))
    wait(cluster, b.commit_offsets([OffsetCommit("cg", "SnapTopic", 1, 3)], reset=True))
    assert settled(cluster)


def test_a_member_restarts_from_its_snapshot_and_applies_only_the_tail(tmp_path, monkeypatch):
    """Snapshot + compaction on a follower; more changes; restarted without config/: the snapshot's tables plus
    the tail, each entry after the snapshot applied once, none before it."""
    cluster = snap_cluster(tmp_path)
    b = master(cluster)
    populate(cluster, b)
    victim = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    vs = cluster.servers[victim]
    manifest = wait(cluster, vs.snapshots.take())
    assert manifest.section("rocketmq") is not None
    assert vs.store.ledger_begin_index == manifest.index  # trailingEntries = 0: everything below it is gone
    # The tail: a commit after the reset, a commit that a replay of the reset would undo, a new topic, records.
    wait(cluster, b.commit_offsets([OffsetCommit("cg", "SnapTopic", 1, 8)]))
    wait(cluster, b.change_metadata(KIND_TOPIC_CONFIG, [topic_config("AfterSnap", 1, 1)]))
    for i in range(4):
        assert put(cluster, b, msg(topic="SnapTopic", body=b"t%d" % i, queue_id=i % 2)).ok
    assert settled(cluster)
    expected = tables(b.meta)

    fed: list[tuple[int, int]] = []
    real_apply = BrokerMachine.apply

    def spy(self, entries):
        if self.meta.config_dir.parent.name == f"rocketmq-{victim}":
            fed.append((entries[0].index, entries[-1].index))
        return real_apply(self, entries)
    monkeypatch.setattr(BrokerMachine, "apply", spy)
    config = broker_for(vs).meta.config_dir
    cluster.crash(victim)
    shutil.rmtree(config)  # the files are not the source of truth: the snapshot is
    cluster.restart(victim)
    rb = broker_for(cluster.servers[victim])
    assert rb.machine.restored_index <= manifest.index and rb.machine.restored_index >= manifest.index - 1
    assert settled(cluster)
    assert fed and min(first for first, _ in fed) > manifest.index  # only the entries after the snapshot
    assert tables(rb.meta) == expected
    assert rb.query_offset("cg", "SnapTopic", 1) == 8 and rb.meta.topics.get("AfterSnap") is not None
    assert rb.meta.acl.config == CONFIG
    wait(cluster, rb.meta.persist())  # config/ comes back in RocketMQ's shapes
    assert (config / "topics.json").read_text() == b.meta.topics.to_json()
    assert (config / "consumerOffset.json").read_text() == b.meta.offsets.to_json()


def test_consume_queues_after_compaction_start_at_the_first_kept_record(tmp_path):
    """A compacted member's queues: min offset = the first unit whose record is still in the log; a pull below it
    is OFFSET_TOO_SMALL; a restart rebuilds the queues from the log that remains."""
    cluster = snap_cluster(tmp_path)
    b = master(cluster)
    populate(cluster, b, n_records=10)  # offsets 0..4 in queues 0 and 1
    victim = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    vs = cluster.servers[victim]
    wait(cluster, vs.snapshots.take())
    for i in range(6):
        assert put(cluster, b, msg(topic="SnapTopic", body=b"late%d" % i, queue_id=i % 2)).ok
    assert settled(cluster)
    vb = broker_for(vs)
    assert [vb.min_offset("SnapTopic", q) for q in (0, 1)] == [5, 5]  # 0..4 were compacted away
    assert [vb.max_offset("SnapTopic", q) for q in (0, 1)] == [8, 8]
    assert [b.min_offset("SnapTopic", q) for q in (0, 1)] == [0, 0]  # the master kept its log
    low = vb.get_messages("cg", "SnapTopic", 0, 2, 32)
    assert (low.status, low.min_offset) == (GetStatus.OFFSET_TOO_SMALL, 5)  # a slave keeps the offset itself
    found = vb.get_messages("cg", "SnapTopic", 0, 5, 32)
    assert found.status is GetStatus.FOUND and len(found.records) == 3

    shutil.rmtree(vb.root / "consumequeue")  # queues rebuilt from the CommitLog that remains
    cluster.crash(victim)
    cluster.restart(victim)
    assert settled(cluster)
    rb = broker_for(cluster.servers[victim])
    assert [rb.min_offset("SnapTopic", q) for q in (0, 1)] == [5, 5]
    assert [rb.max_offset("SnapTopic", q) for q in (0, 1)] == [8, 8]
    assert len(rb.get_messages("cg", "SnapTopic", 1, 5, 32).records) == 3


@pytest.mark.parametrize("queue_records", [True, False])
def test_queue_bases_from_the_snapshot_keep_queue_offsets_going(tmp_path, queue_records):
    """A member with no record of a queue since the snapshot (queues wiped, log compacted) answers its offsets
    from the snapshot's queue bases, and as master continues the queue instead of starting it at 0."""
    cluster = snap_cluster(tmp_path)
    b = master(cluster)
    populate(cluster, b, n_records=10)
    victim = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    vs = cluster.servers[victim]
    wait(cluster, vs.snapshots.take())
    wait(cluster, vs.store.flush())  # the compaction reaches the (simulated) disk
    if queue_records:
        assert put(cluster, b, msg(topic="SnapTopic", body=b"after", queue_id=0)).ok
    assert settled(cluster)
    shutil.rmtree(broker_for(vs).root / "consumequeue")
    cluster.crash(victim)
    cluster.restart(victim)
    assert settled(cluster)
    rb = broker_for(cluster.servers[victim])
    assert rb.machine.queue_bases[("SnapTopic", 1)] == 5
    assert (rb.min_offset("SnapTopic", 1), rb.max_offset("SnapTopic", 1)) == (5, 5)
    at = rb.get_messages("cg", "SnapTopic", 1, 5, 32)
    assert at.status is GetStatus.OFFSET_OVERFLOW_ONE and at.next_begin_offset == 5
    if queue_records:
        assert (rb.min_offset("SnapTopic", 0), rb.max_offset("SnapTopic", 0)) == (5, 6)
    # Make it master: its queue-offset table continues queue 1 at 5 (a table from its queues alone would say 0).
    transfer(cluster, rb.server.self_id)
    nb = master(cluster)
    assert nb is rb
    result = put(cluster, nb, msg(topic="SnapTopic", body=b"next", queue_id=1))
    assert result.ok and result.queue_offset == 5
    assert settled(cluster)
    assert all(broker_for(s).max_offset("SnapTopic", 1) == 6 for s in cluster.servers.values())


def test_a_wiped_member_returns_through_install_snapshot_and_serves_as_master(tmp_path):
    """Every member snapshotted and compacted; a follower wiped (log, snapshots, broker dir) comes back through
    InstallSnapshot with every topic, group, offset and the ACL; made master, a consumer resumes at its committed
    offsets (no re-delivery below them) and queue offsets continue."""
    from dledger_rocketmq.common.message import decode_record
    cluster = snap_cluster(tmp_path, snapshot_chunk_size=1024, snapshot_file_size=4096)
    b = master(cluster)
    populate(cluster, b, n_records=10)  # offsets 0..4 in each queue
    wait(cluster, b.commit_offsets([OffsetCommit("cg", "SnapTopic", 0, 5), OffsetCommit("cg", "SnapTopic", 1, 5)]))
    assert settled(cluster)
    for s in cluster.servers.values():
        wait(cluster, s.snapshots.take())
    for i in range(6):  # after the snapshot: offsets 5..7 in each queue, in the log the wiped member receives
        assert put(cluster, b, msg(topic="SnapTopic", body=b"tail%d" % i, queue_id=i % 2)).ok
    wait(cluster, b.commit_offsets([OffsetCommit("cg", "SnapTopic", 0, 6)]))
    assert settled(cluster)
    assert all(s.store.ledger_begin_index > 0 for s in cluster.servers.values())
    expected = tables(b.meta)

    victim = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    root = broker_for(cluster.servers[victim]).root
    cluster.wipe(victim)
    shutil.rmtree(cluster.configs[victim].member_dir, ignore_errors=True)
    shutil.rmtree(root)
    cluster.restart(victim)
    assert settled(cluster, 60)
    rb = broker_for(cluster.servers[victim])
    assert rb.machine.restored_index >= 0, "the wiped member did not restore a snapshot"
    assert tables(rb.meta) == expected
    assert rb.meta.acl.config == CONFIG and rb.meta.groups.get("cg")["retryMaxTimes"] == 5

    transfer(cluster, victim)
    nb = master(cluster)
    assert nb is rb
    assert [nb.query_offset("cg", "SnapTopic", q) for q in (0, 1)] == [6, 5]
    for q, committed in ((0, 6), (1, 5)):
        got = nb.get_messages("cg", "SnapTopic", q, nb.query_offset("cg", "SnapTopic", q), 32)
        assert got.status is GetStatus.FOUND
        offsets = [decode_record(r).queue_offset for r in got.records]
        assert offsets == list(range(committed, 8)), offsets  # from the committed offset on, nothing below
    assert (nb.min_offset("SnapTopic", 0), nb.max_offset("SnapTopic", 0)) == (5, 8)
    result = put(cluster, nb, msg(topic="SnapTopic", body=b"new", queue_id=1))
    assert result.ok and result.queue_offset == 8


def test_a_snapshot_fails_with_one_line_when_dispatch_never_reaches_its_index(tmp_path):
    """The snapshot waits for the consume-queue dispatch (queue bases, flushed units), boundedly: the member's
    snapshot fails with one line, nothing is compacted, and the next one works once dispatch is back."""
    cluster = snap_cluster(tmp_path)
    b = master(cluster)
    populate(cluster, b, n_records=4)
    victim = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    vs, vb = cluster.servers[victim], broker_for(cluster.servers[victim])
    real = vb.dispatcher.caught_up
    vb.dispatcher.caught_up = lambda index: False  # this member's dispatch is stuck
    out = []
    vs.snapshots.take().addBoth(out.append)
    cluster.run(vb.queue_flush.snapshot_dispatch_timeout - 1)
    assert out == []
    assert cluster.run_until(lambda: bool(out), 5)
    why = out[0].getErrorMessage()
    assert "consume-queue dispatch did not reach index" in why and "\n" not in why, why
    assert vs.store.ledger_begin_index == 0
    vb.dispatcher.caught_up = real
    assert wait(cluster, vs.snapshots.take()).section("rocketmq") is not None
    assert vs.store.ledger_begin_index > 0
