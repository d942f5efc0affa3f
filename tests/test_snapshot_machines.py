"""server.snapshots: machines fed in lockstep, snapshots taken and restored, the log compacted after each."""

import pytest
from twisted.internet.defer import Deferred, succeed
from zope.interface import implementer

from dledger.errors import StoreError
from dledger.interfaces import IStateMachine
from dledger.testing import Cluster
from dledger.testing.statemachine import DictMachine


def _cluster(tmp_path, n=1, **options):
    machines = {}

    def sm(mid, server):
        m = DictMachine()
        machines.setdefault(mid, []).append(m)
        server.add_state_machine(m)
        return []

    options.setdefault("snapshot_threshold", 0)
    options.setdefault("snapshot_threshold_bytes", 0)
    cluster = Cluster(n, handlers=sm, store_base_dir=str(tmp_path), **options)
    return cluster, machines


def _append(cluster, bodies):
    client = cluster.client()
    ds = [client.append(b) for b in bodies]
    assert cluster.run_until(lambda: all(d.called for d in ds), 30)
    cluster.wait_applied()


def _take(cluster, mid):
    d = cluster.servers[mid].snapshots.take()
    assert cluster.run_until(lambda: d.called, 10)
    result = []
    d.addBoth(result.append)
    return result[0]


def test_snapshot_then_restart_applies_only_the_entries_after_it(tmp_path):
    """A restarted member restores the snapshot and applies only what follows; its state matches the log's."""
    cluster, machines = _cluster(tmp_path, trailing_entries=2)
    cluster.start()
    cluster.wait_for_leader()
    _append(cluster, [f"k{i}=v{i}".encode() for i in range(20)])
    manifest = _take(cluster, "n0")
    server = cluster.servers["n0"]
    assert manifest.index == server.snapshots.applied_index
    assert server.store.ledger_begin_index == manifest.index - 2  # compacted, trailingEntries kept
    _append(cluster, [b"k0=new", b"after=1"])
    before = machines["n0"][-1].state()
    cluster.crash("n0")
    cluster.start("n0")
    cluster.wait_for_leader()
    cluster.wait_applied()
    again = machines["n0"][-1]
    assert again.restores == 1 and again.state() == before


def test_take_is_consistent_across_machines_and_repeats_the_newest(tmp_path):
    """Two machines snapshot at the same applied index; a second take with nothing new returns the same one."""
    cluster = Cluster(1, store_base_dir=str(tmp_path), snapshot_threshold=0, snapshot_threshold_bytes=0,
                      handlers=lambda mid, s: [s.add_state_machine(DictMachine("a")),
                                               s.add_state_machine(DictMachine("b"))] and [])
    cluster.start()
    cluster.wait_for_leader()
    _append(cluster, [b"x=1", b"y=2"])
    m1 = _take(cluster, "n0")
    assert [s.name for s in m1.sections] == ["a", "b"]
    assert _take(cluster, "n0") == m1


def test_threshold_takes_snapshots_and_prunes(tmp_path):
    """snapshotThreshold entries trigger a snapshot; maxSnapshotReservedNum of them are kept."""
    cluster, machines = _cluster(tmp_path, snapshot_threshold=5, max_snapshot_reserved_num=2, trailing_entries=0)
    cluster.start()
    cluster.wait_for_leader()
    for k in range(4):
        _append(cluster, [f"r{k}-{i}=1".encode() for i in range(6)])
    snaps = cluster.servers["n0"].snapshots.snapshot_store
    assert len(snaps.manifests) == 2
    on_disk = sorted(p.name for p in snaps.directory.iterdir())
    assert on_disk == sorted(m.dirname for m in snaps.manifests)


def test_compaction_waits_for_java_peers(tmp_path):
    """While a peer may be a Java DLedger member, a snapshot deletes nothing from the log."""
    cluster, machines = _cluster(tmp_path, trailing_entries=0)
    cluster.start()
    cluster.wait_for_leader()
    server = cluster.servers["n0"]
    server.snapshots.peers_take_snapshots = lambda: False
    _append(cluster, [b"a=1"] * 10)
    begin = server.store.ledger_begin_index
    _take(cluster, "n0")
    assert server.store.ledger_begin_index == begin


def test_no_machine_nothing_to_snapshot(tmp_path):
    """take() without a registered machine is a one-line refusal."""
    cluster = Cluster(1, store_base_dir=str(tmp_path))
    cluster.start()
    cluster.wait_for_leader()
    failure = _take(cluster, "n0")
    assert "no state machine" in failure.getErrorMessage() and "\n" not in failure.getErrorMessage()


def test_damaged_newest_falls_back_to_the_previous(tmp_path):
    """A damaged newest snapshot is skipped (one line); the previous one is restored, then the log after it."""
    cluster, machines = _cluster(tmp_path, trailing_entries=100)
    cluster.start()
    cluster.wait_for_leader()
    _append(cluster, [b"a=1", b"b=2"])
    first = _take(cluster, "n0")
    _append(cluster, [b"c=3"])
    second = _take(cluster, "n0")
    before = machines["n0"][-1].state()
    snaps = cluster.servers["n0"].snapshots.snapshot_store
    f = snaps.path_of(second) / second.files[0].path
    raw = bytearray(f.read_bytes())
    raw[0] ^= 0xFF
    f.write_bytes(bytes(raw))
    cluster.crash("n0")
    cluster.start("n0")
    cluster.wait_for_leader()
    cluster.wait_applied()
    server = cluster.servers["n0"]
    assert [name for name, _why in server.snapshots.snapshot_store.damaged] == [second.dirname]
    assert machines["n0"][-1].state() == before
    assert server.snapshots.snapshot_store.newest() == first


def test_no_intact_snapshot_and_a_compacted_log_refuses_to_start(tmp_path):
    """Every snapshot damaged and the log compacted past them: start fails with one line naming the fix."""
    cluster, machines = _cluster(tmp_path, trailing_entries=0)
    cluster.start()
    cluster.wait_for_leader()
    _append(cluster, [b"a=1"] * 10)
    m = _take(cluster, "n0")
    _append(cluster, [b"z=1"])  # its flush makes the compaction durable
    assert cluster.servers["n0"].store.ledger_begin_index > 0
    snaps = cluster.servers["n0"].snapshots.snapshot_store
    (snaps.path_of(m) / "manifest.json").write_text("{not json")
    cluster.crash("n0")
    server = cluster.build("n0")
    d = server.start()
    failures = []
    d.addErrback(failures.append)
    cluster.run_until(lambda: d.called, 5)
    assert failures and failures[0].check(StoreError)
    msg = failures[0].getErrorMessage()
    assert "cannot start" in msg and "fix:" in msg and "\n" not in msg


@implementer(IStateMachine)
class SlowMachine(DictMachine):
    """Applies wait for a Deferred the test fires: a snapshot must wait for the batch in flight."""

    def __init__(self):
        super().__init__("slow")
        self.gate: Deferred | None = None

    def apply(self, entries):
        super().apply(entries)
        self.gate = Deferred()
        return self.gate


def test_snapshot_waits_for_the_batch_in_flight(tmp_path):
    """take() during a slow apply snapshots at the end of that batch, never half-way through it."""
    slow = SlowMachine()
    cluster = Cluster(1, store_base_dir=str(tmp_path), snapshot_threshold=0, snapshot_threshold_bytes=0,
                      handlers=lambda mid, s: s.add_state_machine(slow) or [])
    cluster.start()
    cluster.wait_for_leader()
    d = cluster.client().append(b"a=1")
    assert cluster.run_until(lambda: slow.gate is not None, 10)
    server = cluster.servers["n0"]
    taken = server.snapshots.take()
    cluster.run_until(lambda: False, 0.5)
    assert not taken.called  # the batch is still being applied
    slow.gate.callback(None)
    assert cluster.run_until(lambda: taken.called and d.called, 10)
    result = []
    taken.addCallback(result.append)
    assert result[0].index == slow.last_index == server.snapshots.applied_index


def test_wait_applied_fires_in_order(tmp_path):
    """wait_applied(i) fires once every machine applied i, not before."""
    cluster, machines = _cluster(tmp_path)
    cluster.start()
    cluster.wait_for_leader()
    server = cluster.servers["n0"]
    target = server.store.ledger_end_index + 3
    w = server.snapshots.wait_applied(target)
    assert not w.called
    _append(cluster, [b"a=1", b"b=2", b"c=3"])
    assert w.called and server.snapshots.applied_index >= target


def test_add_rejects_bad_names_and_duplicates(tmp_path):
    """A machine's name is a directory name and unique on the member."""
    cluster = Cluster(1, store_base_dir=str(tmp_path))
    server = cluster.build("n0")
    server.add_state_machine(DictMachine("ok"))
    with pytest.raises(ValueError, match="already registered"):
        server.add_state_machine(DictMachine("ok"))
    with pytest.raises(ValueError, match="must match"):
        server.add_state_machine(DictMachine("Bad/Name"))
    assert succeed(None).called
