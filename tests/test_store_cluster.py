"""The durable stores under a real in-process group: replication, a clean restart, and the offline verifier."""

from __future__ import annotations

import pytest

from dledger.cli import main
from dledger.store.lmdbstore import LmdbLogStore, LmdbTermVoteStore
from dledger.store.mmapfile import MmapLogStore
from dledger.store.termvote import FileTermVoteStore
from dledger.testing.cluster import Cluster


def make_factory(kind, root, clock_box):
    def factory(mid, config, state):
        if kind == "mmap":
            return MmapLogStore(root / f"dledger-{mid}", state, data_file_size=4096, index_file_size=512,
                                clock=clock_box[0], disk_usage=lambda: 0.1)
        return LmdbLogStore(root / f"dledger-{mid}" / "lmdb", state, data_file_size=4096, map_size=1 << 20,
                            clock=clock_box[0])
    return factory


def append_all(cluster, bodies):
    client = cluster.client()
    results = [client.append(b) for b in bodies]
    assert cluster.run_until(lambda: all(d.called for d in results), timeout=120)
    return results


@pytest.mark.parametrize("kind", ["mmap", "lmdb"])
def test_group_replicates_restarts_and_verifies(tmp_path, kind, capsys):
    """Three members on durable stores agree on the log, keep it across a restart, and each store verifies."""
    clock_box = [None]
    cluster = Cluster(3, seed=3, store_factory=make_factory(kind, tmp_path, clock_box))
    clock_box[0] = cluster.clock
    cluster.start()
    cluster.wait_for_leader()
    first = [f"before-{i:03d}-".encode() * 5 for i in range(60)]
    append_all(cluster, first)
    cluster.run(3)
    logs = {mid: [e.body for e in cluster.committed_entries(mid) if e.magic == 1] for mid in cluster.ids}
    log = logs[cluster.ids[0]]
    assert sorted(log) == sorted(first), "every append committed once (concurrent appends: any order)"
    assert all(other == log for other in logs.values()), "all members hold the same log"
    cluster.stop()
    cluster.run(1)

    cluster.start()
    cluster.wait_for_leader()
    second = [f"after-{i:03d}".encode() for i in range(20)]
    append_all(cluster, second)
    cluster.run(3)
    for mid in cluster.ids:
        again = [e.body for e in cluster.committed_entries(mid) if e.magic == 1]
        assert again[:len(log)] == log, "the restart kept the log"
        assert sorted(again[len(log):]) == sorted(second)
    cluster.stop()
    cluster.run(1)

    for mid in cluster.ids:
        # The simulated members keep term and vote in memory; a real member keeps them beside its log.
        saved = cluster.term_stores[mid]
        durable = (FileTermVoteStore(tmp_path / f"dledger-{mid}") if kind == "mmap"
                   else LmdbTermVoteStore(tmp_path / f"dledger-{mid}" / "lmdb", 1 << 20))
        durable.save(saved.term, saved.vote_for)
        durable.close()
        code = main(["store", "verify", str(tmp_path / f"dledger-{mid}")])
        out = capsys.readouterr().out
        assert code == 0, out
        assert "status:    OK" in out
