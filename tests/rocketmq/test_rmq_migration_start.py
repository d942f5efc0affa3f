"""The first DLedger start over the golden plain store: blank record, log at dividedCommitlogOffset, old reads."""

from __future__ import annotations

import pytest
from conftest import CQ_FILE_SIZE, FILE_SIZE, MIGRATION, restore
from dledger_rocketmq.broker.broker import GetStatus
from dledger_rocketmq.common.errors import StoreLayoutError
from dledger_rocketmq.common.message import decode_record
from dledger_rocketmq.store.commitlog import PutStatus
from rmq_cluster_util import master, msg, put, settled

from dledger import plugins
from dledger.store.mmapfile import MmapLogStore
from dledger.testing import Cluster


def one_member(root, **extras):
    """A one-member group n0 on mmap stores under ``root`` (RocketMQ's layout: commitlog/, dledger-n0/)."""
    opts = {"rocketmq.enabled": True, "rocketmq.storeDir": str(root), "rocketmq.mappedFileSizeConsumeQueue":
            CQ_FILE_SIZE, "rocketmq.storePathCommitLog": str(root / "commitlog"),
            "rocketmq.mappedFileSizeCommitLog": FILE_SIZE}
    opts.update(extras)
    cluster = Cluster(1, seed=2, plugin_manager=plugins.make_plugin_manager(), store_base_dir=str(root),
                      mapped_file_size_for_entry_data=FILE_SIZE, extras=opts,
                      store_factory=lambda mid, cfg, state: MmapLogStore.from_config(cfg, state,
                                                                                      clock=cluster.clock))
    cluster.start()
    return cluster


@pytest.fixture
def plain(tmp_path):
    return restore(MIGRATION / "phase1-plain", tmp_path / "store")


def test_first_start_continues_the_plain_commitlog(plain, tmp_path):
    """Blank as RocketMQ writes it, dledger data from 65536, old messages served, queue offsets continue."""
    golden_old = restore(MIGRATION / "phase2-dledger", tmp_path / "p2") / "commitlog" / "00000000000000000000"
    cluster = one_member(plain)
    b = master(cluster)
    assert (plain / "commitlog" / "00000000000000000000").read_bytes() == golden_old.read_bytes()
    assert b.commitlog.divided == 65536
    old = b.get_messages("g", "GoldenMigr", 0, 0, 32)
    assert old.status is GetStatus.FOUND and [decode_record(r).physical_offset for r in old.records] == [0, 1048]
    r = put(cluster, b, msg(topic="GoldenMigr", queue_id=0, body=b"after"))
    assert r.status is PutStatus.PUT_OK and r.queue_offset == 2 and r.physical_offset >= 65536 + 48
    assert settled(cluster)
    got = b.get_messages("g", "GoldenMigr", 0, 0, 32)
    assert [decode_record(x).body for x in got.records][-1] == b"after" and got.next_begin_offset == 3
    assert sorted(p.name for p in (plain / "dledger-n0" / "data").iterdir()) == ["00000000000000065536"]
    assert b.server.store.retention.file_reserved_hours == float("inf")  # dledger files kept while old ones exist
    assert b.server.snapshots.trailing >= 1 << 62  # and not compacted after a snapshot either
    cluster.crash("n0")
    cluster.restart("n0")  # a later start: divided from the first data file, nothing written to the old file
    b = master(cluster)
    assert b.commitlog.divided == 65536
    assert (plain / "commitlog" / "00000000000000000000").read_bytes() == golden_old.read_bytes()
    got = b.get_messages("g", "GoldenMigr", 0, 0, 32)
    assert [decode_record(x).physical_offset for x in got.records][:2] == [0, 1048] and len(got.records) == 3


def test_a_store_that_cannot_start_at_a_position_is_refused(plain):
    """With a store lacking set_initial_position (memory), the migration refuses with one clear line."""
    opts = {"rocketmq.enabled": True, "rocketmq.storeDir": str(plain), "rocketmq.storePathCommitLog":
            str(plain / "commitlog"), "rocketmq.mappedFileSizeCommitLog": FILE_SIZE}
    cluster = Cluster(1, seed=3, plugin_manager=plugins.make_plugin_manager(),
                      store_base_dir=str(plain), extras=opts)
    with pytest.raises(StoreLayoutError, match="needs a store that can start its log at 65536"):
        cluster.start()
