"""In-process groups on mmap stores: the leader repairs an entry it cannot read instead of giving up (issue 21)."""

import shutil

from twisted.logger import globalLogPublisher

from dledger.codes import ResponseCode, Role
from dledger.entry import Entry
from dledger.errors import BatchAppendError, DLedgerError
from dledger.store.memory import MemoryTermVoteStore
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.cluster import Cluster


def mmap_cluster(tmp_path, seed=3):
    holder = {}

    def factory(mid, cfg, state):
        return MmapLogStore(tmp_path / f"dledger-{mid}", state, data_file_size=64 << 10, index_file_size=32 * 1024,
                            max_entry_size=4096, clock=holder["cluster"].clock)

    cluster = Cluster(3, seed=seed, store_factory=factory)
    holder["cluster"] = cluster
    return cluster


def lines_at(level):
    lines = []
    observer = lambda e: lines.append(e) if e["log_level"].name == level and "log_format" in e else None
    globalLogPublisher.addObserver(observer)
    return lines, observer


def test_a_leader_that_cannot_read_an_entry_repairs_it_from_a_follower_and_keeps_leading(tmp_path):
    """Entry 5 damaged on the leader, a wiped follower needs it: repaired from the other follower, no transfer."""
    cluster = mmap_cluster(tmp_path)
    cluster.start()
    try:
        leader_id = cluster.append_committed([b"entry-%d" % i for i in range(20)])
        leader = cluster.servers[leader_id]
        store = leader.store
        end = store.ledger_end_index
        wiped, healthy = leader.state.peers
        e5 = store.get(5)
        f = store._data.file_for(e5.pos)
        with open(f.path, "r+b") as fh:
            fh.seek(e5.pos - f.start + 48)
            fh.write(b"X")
        store.recent_entries.clear()  # the entries it wrote are no longer held in memory: reads go to the file
        cluster.crash(wiped)
        shutil.rmtree(tmp_path / f"dledger-{wiped}")
        cluster.term_stores[wiped] = MemoryTermVoteStore()
        warns, observer = lines_at("warn")
        try:
            cluster.restart(wiped)
            refilled = cluster.servers[wiped].store
            assert cluster.run_until(lambda: refilled.ledger_end_index >= end and refilled.committed_index >= end, 10)
        finally:
            globalLogPublisher.removeObserver(observer)
        assert cluster.leader() == leader_id and leader.state.role is Role.LEADER, "no transfer was needed"
        assert leader.damaged is None and leader.elector.store_damaged is None
        assert store.check_entry(5) == e5
        assert [refilled.get(i).body for i in range(end + 1)] == [store.get(i).body for i in range(end + 1)]
        texts = [e["log_format"].format(**e) for e in warns]
        repaired = [t for t in texts if "repaired damaged entry 5" in t]
        assert len(repaired) == 1 and f.path.name in repaired[0] and f"from {healthy}" in repaired[0], texts
    finally:
        cluster.stop()


def test_a_follower_refusing_for_its_disk_is_shown_and_probed_once_per_heartbeat(tmp_path):
    """DISK_FULL answers: one leader line, `disk full` in metadata, one push in flight; cleared when it stores again."""
    from dledger.messages import MetadataRequest

    cluster = Cluster(3, seed=5)
    cluster.start()
    try:
        leader_id = cluster.append_committed([b"a", b"b"])
        leader = cluster.servers[leader_id]
        peer = leader.state.peers[0]
        follower = cluster.servers[peer]
        full = {"on": True}
        real = follower.guard.append_batch_as_follower
        calls = []

        def refusing(entries, term, leader):
            if full["on"]:
                calls.append(len(entries))
                raise BatchAppendError(DLedgerError(ResponseCode.DISK_FULL, "disk full: no room"), [])
            return real(entries, term, leader)
        follower.entry_handler._append_batch = refusing
        errors, observer = lines_at("error")
        try:
            client = cluster.client()
            ds = [client.append(b"x%d" % i) for i in range(50)]
            assert cluster.run_until(lambda: all(d.called for d in ds), 10)
            cluster.run(2.0)
            dispatcher = leader.replicator.dispatchers[peer]
            assert dispatcher.disk_problem == "disk full"
            assert leader.replicator.peer_disk_problems() == {peer: "disk full"}
            meta = leader.handle_metadata(MetadataRequest(group="g0", detail=True))
            assert meta.peer_disk == {peer: "disk full"}
            heartbeat = leader.config.heart_beat_time_interval_ms / 1000.0
            assert len(calls) <= 2.0 / heartbeat + 3, f"{len(calls)} refused pushes in 2 s: not one per heartbeat"
            full["on"] = False
            end = leader.store.ledger_end_index
            assert cluster.run_until(lambda: follower.store.ledger_end_index == end, 10)
            cluster.run(0.5)
            assert dispatcher.disk_problem is None and leader.replicator.peer_disk_problems() == {}
        finally:
            globalLogPublisher.removeObserver(observer)
        texts = [e["log_format"].format(**e) for e in errors]
        assert len([t for t in texts if f"follower {peer} cannot store entries" in t]) == 1, texts
    finally:
        cluster.stop()


def test_entries_held_in_memory_are_not_what_check_entry_reads(tmp_path):
    """check_entry reads the files: a byte flipped under the in-memory tail is seen by it, not by get()."""
    from dledger.testing.store_contract import FakeMemberState
    store = MmapLogStore(tmp_path / "m", FakeMemberState(), data_file_size=4096, index_file_size=32 * 64,
                         max_entry_size=1024)
    store.startup()
    e = store.append_as_leader(Entry(body=b"hello world", term=1))
    f = store._data.file_for(e.pos)
    with open(f.path, "r+b") as fh:
        fh.seek(e.pos + 48)
        fh.write(b"J")
    assert store.get(0).body == b"hello world"
    try:
        store.check_entry(0)
    except DLedgerError as exc:
        assert exc.code is ResponseCode.DISK_ERROR and f.path.name in exc.message
    else:
        raise AssertionError("check_entry served the in-memory copy")
