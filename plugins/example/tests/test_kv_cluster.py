"""The kv map in whole groups in one process (``dledger.testing.Cluster``, virtual time): writes, linearizable
reads across a leader change, cas, snapshots through the member's real state machines, and a history under
faults checked with the kv history checker."""

from __future__ import annotations

import random

import pytest
from dledger_example.kv import plugin as kvplugin
from dledger_example.kv.client import KVClient
from dledger_example.kv.codec import Reply
from dledger_example.kv.history import KVHistory, RecordingKV, kv_violations
from dledger_example.kv.machine import KVMachine

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.testing import Cluster, isolated_plugin_manager
from dledger.transport.inprocess import FaultSettings


@pytest.fixture
def kv_cluster(tmp_path):
    """Groups running dledger's own plugins and the kv map only; snapshots in the test's own directory."""

    def make(n=3, seed=1, **options):
        options.setdefault("extras", {"kv.enabled": True})
        return Cluster(n, seed=seed, plugin_manager=isolated_plugin_manager(kvplugin),
                       store_base_dir=str(tmp_path / f"seed{seed}"), **options)
    return make


def machine(cluster, mid) -> KVMachine:
    return kvplugin.kv_of(cluster.servers[mid]).machine


def result(cluster, d, what="the answer", timeout=30):
    out = []
    d.addBoth(out.append)
    cluster.wait_until(lambda: out, timeout, what)
    if isinstance(out[0], Exception) or hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def test_a_put_on_the_leader_is_read_after_a_leader_change(kv_cluster):
    """A get through the new leader sees the write acknowledged by the old one (ReadIndex + wait_applied)."""
    cluster = kv_cluster()
    cluster.start()
    old = cluster.wait_for_leader()
    kv = KVClient(cluster.client())
    put = result(cluster, kv.put("colour", b"blue"))
    assert put.ok and put.index > 0
    cluster.crash(old)
    new = cluster.wait_for_leader()
    got = result(cluster, kv.read("colour"))
    assert new != old and got == Reply(True, got.index, b"blue") and got.index >= put.index
    assert result(cluster, kv.get("nothing", b"default")) == b"default"


def test_cas_conflict_and_delete(kv_cluster):
    """A cas that does not match changes nothing and answers with the value found; delete says what it removed."""
    cluster = kv_cluster()
    cluster.start()
    cluster.wait_for_leader()
    kv = KVClient(cluster.client())
    assert result(cluster, kv.cas("k", None, b"1")).ok  # create if absent
    conflict = result(cluster, kv.cas("k", None, b"2"))
    assert conflict.ok is False and conflict.value == b"1"
    wrong = result(cluster, kv.cas("k", b"0", b"2"))
    assert (wrong.ok, wrong.value) == (False, b"1")
    assert result(cluster, kv.cas("k", b"1", b"2")).ok
    removed = result(cluster, kv.delete("k"))
    assert (removed.ok, removed.value) == (True, b"2")
    assert result(cluster, kv.delete("k")).ok is False
    cluster.wait_applied()
    assert all(machine(cluster, m).data == {} for m in cluster.ids)


def test_a_follower_refers_to_the_leader_and_bad_requests_are_refused(kv_cluster):
    cluster = kv_cluster()
    cluster.start()
    leader = cluster.wait_for_leader()
    cluster.wait_applied()
    follower = next(m for m in cluster.ids if m != leader)
    from dledger_example.kv.codec import encode_get
    from dledger_example.kv.handlers import GET_CODE, WRITE_CODE
    client = cluster.client()
    with pytest.raises(DLedgerError) as exc:
        result(cluster, client.request(GET_CODE, encode_get("k"), member=follower))
    assert exc.value.code is ResponseCode.NOT_LEADER and exc.value.leader_id == leader
    with pytest.raises(DLedgerError) as exc:
        result(cluster, client.request(WRITE_CODE, b"not a write"))
    assert exc.value.code is ResponseCode.UNEXPECTED_ARGUMENT and "kv.write: not a kv entry" in exc.value.message


def test_members_without_kv_enabled_answer_unsupported(kv_cluster):
    cluster = kv_cluster(extras={})
    cluster.start()
    cluster.wait_for_leader()
    with pytest.raises(DLedgerError) as exc:
        result(cluster, KVClient(cluster.client()).read("k"))
    assert exc.value.code is ResponseCode.UNSUPPORTED


def test_snapshot_and_restore_round_trip_through_the_members_state_machines(kv_cluster, monkeypatch):
    """A snapshot taken by the member (server.snapshots.take) holds the kv section; a restarted member restores
    it, then applies only the entries after it, and ends with the same map as the others."""
    restored = []
    real_restore = KVMachine.restore

    def spy(self, reader):
        restored.append(self.member)
        return real_restore(self, reader)
    monkeypatch.setattr(KVMachine, "restore", spy)
    cluster = kv_cluster()
    cluster.start()
    leader = cluster.wait_for_leader()
    kv = KVClient(cluster.client())
    for i in range(20):
        result(cluster, kv.put(f"k{i}", b"v%d" % i))
    cluster.wait_applied()
    follower = next(m for m in cluster.ids if m != leader)
    manifest = result(cluster, cluster.servers[follower].snapshots.take(), "the snapshot")
    assert [s.name for s in manifest.sections] == ["kv"] and manifest.index >= 20
    result(cluster, kv.put("k0", b"after"))
    result(cluster, kv.delete("k1"))
    cluster.crash(follower)
    result(cluster, kv.put("k2", b"while down"))
    cluster.restart(follower)
    cluster.wait_applied()
    assert restored == [follower]
    expected = machine(cluster, leader).data
    assert machine(cluster, follower).data == expected and expected["k0"][0] == b"after" and "k1" not in expected
    assert result(cluster, kv.get("k2")) == b"while down"


@pytest.mark.parametrize("seed", range(3))
def test_history_under_faults_is_linearizable(kv_cluster, seed):
    """Puts, cas and gets from three clients while messages are lost and duplicated, members crash and the
    group splits: the recorded history is explained by the converged log (kv_violations)."""
    rng = random.Random(seed)
    cluster = kv_cluster(n=5, seed=seed, faults=FaultSettings(min_delay=0.001, max_delay=0.03, loss=0.05,
                                                              duplicate=0.05))
    cluster.start()
    history = KVHistory()
    clients = [RecordingKV(KVClient(cluster.client(f"c{i}")), history, cluster.clock, f"c{i}") for i in range(3)]
    for step in range(40):
        c = rng.choice(clients)
        key = rng.choice("ab")
        pick = rng.random()
        d = c.read(key) if pick < 0.4 else c.put(key, b"%d" % step) if pick < 0.7 else \
            c.cas(key, rng.choice([None, b"%d" % (step - 1)]), b"%d" % step)
        d.addErrback(lambda f: None)
        cluster.run(0.15)
        if step % 13 == 5:
            victim = rng.choice(sorted(cluster.servers))
            cluster.crash(victim)
            cluster.run(1.0)
            cluster.restart(victim)
        if step % 13 == 9:
            ids = list(cluster.ids)
            rng.shuffle(ids)
            cluster.partition(ids[:2], ids[2:])
            cluster.run(1.0)
            cluster.heal()
    cluster.network.faults = FaultSettings()
    cluster.run_until(lambda: all(op.completed is not None for op in history.ops), 120)
    log = cluster.converged(timeout=120)
    done = [op for op in history.ops if op.reply is not None]
    assert len(done) > 20 and any(op.kind == "get" and op.reply.ok for op in done)
    assert kv_violations(history, log) == []
    first = {mid: machine(cluster, mid).data for mid in cluster.ids}
    assert all(data == first[cluster.ids[0]] for data in first.values())


def test_deferred_dict_behaves_like_a_dict(kv_cluster):
    """DeferredDict: set/get/contains/pop/cas with values through a codec (JSON here), Deferreds throughout."""
    from dledger_example.kv.client import DeferredDict

    cluster = kv_cluster()
    cluster.start()
    cluster.wait_for_leader()
    d = DeferredDict(cluster.client(), codec="json")
    assert result(cluster, d.set("cfg", {"size": 3, "tags": ["a"]})) is None
    assert result(cluster, d.get("cfg")) == {"size": 3, "tags": ["a"]}
    assert result(cluster, d.contains("cfg")) and not result(cluster, d.contains("other"))
    assert result(cluster, d.cas("cfg", {"size": 3, "tags": ["a"]}, [1, 2])) is True
    assert result(cluster, d.cas("cfg", {"size": 3}, None)) is False
    assert result(cluster, d.pop("cfg")) == [1, 2]
    assert result(cluster, d.pop("cfg", "gone")) == "gone"
    with pytest.raises(KeyError):
        result(cluster, d.pop("cfg"))


def test_automatic_snapshots_compact_the_log_and_a_restart_restores_the_map(kv_cluster):
    """With snapshotThreshold small and no trailing entries the members snapshot the map as it grows and drop the
    log below; a member restarted after that rebuilds its map from the snapshot and the few entries after it."""
    cluster = kv_cluster(snapshot_threshold=10, trailing_entries=0)
    cluster.start()
    leader = cluster.wait_for_leader()
    kv = KVClient(cluster.client())
    for i in range(40):
        result(cluster, kv.put(f"k{i % 7}", b"v%d" % i))
    result(cluster, kv.cas("k0", b"v35", b"swapped"))
    cluster.wait_applied()
    follower = next(m for m in cluster.ids if m != leader)
    store = cluster.servers[follower].store
    # A member compacts once it knows every peer is a dledger member (peer-kind probes, once a second).
    assert cluster.run_until(lambda: store.ledger_begin_index > 10, 10), "the log was not compacted"
    cluster.crash(follower)
    result(cluster, kv.put("k1", b"while down"))
    cluster.restart(follower)
    cluster.wait_applied()
    expected = machine(cluster, leader).data
    assert machine(cluster, follower).data == expected
    assert expected["k0"][0] == b"swapped" and expected["k1"][0] == b"while down" and len(expected) == 7
