"""InstallSnapshot in an in-process group: a wiped follower of a compacted group comes back through a snapshot."""

import shutil

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from dledger.codes import ResponseCode, Role
from dledger.errors import DLedgerError
from dledger.messages import InstallSnapshotRequest
from dledger.replication import snapshot_rules
from dledger.replication.peerkind import PeerKind
from dledger.testing import Cluster
from dledger.testing.statemachine import DictMachine


@pytest.fixture
def caplog_lines():
    """The formatted lines logged during the test."""
    events = []
    globalLogPublisher.addObserver(events.append)
    yield lambda: [formatEvent(e) for e in events]
    globalLogPublisher.removeObserver(events.append)


def _cluster(tmp_path, n=3, **options):
    machines = {}

    def sm(mid, server):
        m = DictMachine(piece=700)
        machines.setdefault(mid, []).append(m)
        server.add_state_machine(m)
        return []

    options.setdefault("snapshot_threshold", 0)
    options.setdefault("snapshot_threshold_bytes", 0)
    options.setdefault("trailing_entries", 0)
    options.setdefault("snapshot_chunk_size", 1024)
    options.setdefault("snapshot_file_size", 4096)
    cluster = Cluster(n, handlers=sm, store_base_dir=str(tmp_path), **options)
    return cluster, machines


def _append(cluster, bodies):
    client = cluster.client()
    ds = [client.append(b) for b in bodies]
    assert cluster.run_until(lambda: all(d.called for d in ds), 60)
    cluster.wait_applied()


def _take_everywhere(cluster):
    """Every member snapshots at its applied index (they are equal after wait_applied) and compacts."""
    ds = [s.snapshots.take() for s in cluster.servers.values()]
    assert cluster.run_until(lambda: all(d.called for d in ds), 30)
    out = []
    for d in ds:
        d.addBoth(out.append)
    assert all(not isinstance(m, Exception) and hasattr(m, "index") for m in out), out
    return out[0]


def _wipe(cluster, mid):
    """As ``rm -rf`` of the member's store directory: its log, term/vote and snapshots are gone."""
    cluster.wipe(mid)
    shutil.rmtree(cluster.configs[mid].member_dir, ignore_errors=True)


def _install_requests(cluster, dst):
    """Record every InstallSnapshot request to ``dst`` as (src, path, offset, size) (none are dropped)."""
    seen = []

    def watch(src, to, request):
        if to == dst and isinstance(request, InstallSnapshotRequest):
            seen.append((src, request.path, request.offset, len(request.data or b"")))
        return False

    cluster.network.drop_matching(watch)
    return seen


def _states(machines, cluster):
    return {mid: machines[mid][-1].state() for mid in cluster.servers}


def _compacted_group(tmp_path, entries=120, **options):
    cluster, machines = _cluster(tmp_path, **options)
    cluster.start()
    cluster.wait_for_leader()
    # compaction waits until every member knows its peers are dledger members (peers_take_snapshots)
    assert cluster.run_until(lambda: all(s.peer_kinds.all_take_snapshots() for s in cluster.servers.values()), 30)
    _append(cluster, [f"k{i}={'v' * 60}".encode() for i in range(entries)])
    manifest = _take_everywhere(cluster)
    _append(cluster, [b"after=1", b"after=2"])
    leader = cluster.servers[cluster.leader()]
    assert leader.store.ledger_begin_index > 0  # compacted: a wiped follower cannot be filled from the log
    assert manifest.size > 4 * 1024  # several chunk files, many chunks
    return cluster, machines, manifest


def test_wiped_follower_returns_through_install_snapshot(tmp_path):
    """A wiped follower of a compacted group gets the snapshot, then the entries after it; every state agrees."""
    cluster, machines, manifest = _compacted_group(tmp_path)
    follower = next(m for m, s in cluster.servers.items() if s.state.role is Role.FOLLOWER)
    _wipe(cluster, follower)
    seen = _install_requests(cluster, follower)
    cluster.restart(follower)
    _append(cluster, [b"later=1"])
    cluster.wait_applied()
    s = cluster.servers[follower]
    assert s.store.snapshot_base == (manifest.index, manifest.term)
    assert machines[follower][-1].restores == 1
    states = _states(machines, cluster)
    assert all(st == states[follower] for st in states.values()), states
    chunks = [x for x in seen if x[1] is not None]
    total = snapshot_rules.ordinal(snapshot_rules.files_of(manifest), None)
    assert sum(size for *_, size in chunks) == total  # every byte sent once
    assert max(size for *_, size in chunks) <= 1024  # snapshotChunkSize


def test_transfer_resumes_after_leader_dies_halfway(tmp_path):
    """The leader dies mid-transfer; the new leader (same snapshot) resumes where the follower stands."""
    cluster, machines, manifest = _compacted_group(tmp_path, entries=200)
    old = cluster.leader()
    follower = next(m for m in cluster.servers if m != old)
    _wipe(cluster, follower)
    seen = _install_requests(cluster, follower)
    total = snapshot_rules.ordinal(snapshot_rules.files_of(manifest), None)

    def halfway():
        return sum(size for src, _p, _o, size in seen if src == old) >= total // 2

    cluster.restart(follower)
    assert cluster.run_until(halfway, 30)
    cluster.crash(old)
    assert cluster.run_until(lambda: cluster.servers[follower].store.snapshot_base[0] == manifest.index, 60)
    new = [x for x in seen if x[0] != old and x[1] is not None]
    assert new, "the new leader sent nothing"
    files = snapshot_rules.files_of(manifest)
    first = snapshot_rules.ordinal(files, (new[0][1], new[0][2]))
    assert first > 0  # resumed, not restarted from byte 0
    assert sum(size for *_, size in new) <= total - first + 4 * 1024  # at most a window sent twice
    cluster.restart(old)
    _append(cluster, [b"later=1"])
    cluster.wait_applied()
    states = _states(machines, cluster)
    assert all(st == states[follower] for st in states.values()), states


def test_damaged_chunk_is_fetched_again(tmp_path):
    """A chunk damaged on the way fails the file's CRC at finish; the follower asks for the file again."""
    cluster, machines, manifest = _compacted_group(tmp_path)
    follower = next(m for m, s in cluster.servers.items() if s.state.role is Role.FOLLOWER)
    _wipe(cluster, follower)
    damaged = []

    def damage(src, dst, request):
        if dst == follower and isinstance(request, InstallSnapshotRequest) and request.data and not damaged:
            request.data = b"\xff" + request.data[1:]
            damaged.append(request.path)
        return False

    cluster.network.drop_matching(damage)
    cluster.restart(follower)
    _append(cluster, [b"later=1"])
    cluster.wait_applied()
    assert damaged and cluster.servers[follower].store.snapshot_base == (manifest.index, manifest.term)
    states = _states(machines, cluster)
    assert all(st == states[follower] for st in states.values()), states


def test_java_follower_is_never_sent_a_snapshot(tmp_path, caplog_lines):
    """A follower known to be Java DLedger gets the old TRUNCATE and the leader names the fix (rate-limited)."""
    cluster, machines, manifest = _compacted_group(tmp_path)
    leader_id = cluster.leader()
    leader = cluster.servers[leader_id]
    follower = next(m for m in cluster.servers if m != leader_id)
    leader.peer_kinds.kinds[follower] = PeerKind.JAVA
    _wipe(cluster, follower)
    seen = _install_requests(cluster, follower)
    cluster.restart(follower)
    cluster.run(3)
    assert seen == []
    lines = [line for line in caplog_lines() if "is a Java DLedger member and needs entries below" in line]
    assert len(lines) == 1 and "Fix:" in lines[0]


def test_install_only_from_the_current_leader(tmp_path):
    """A member installs only from the leader it follows in the current term, and never below its commit."""
    cluster, machines, manifest = _compacted_group(tmp_path)
    leader_id = cluster.leader()
    follower = next(m for m in cluster.servers if m != leader_id)
    s = cluster.servers[follower]
    text = manifest.to_bytes().decode()
    base = dict(group="g0", term=s.state.curr_term, snapshot_index=manifest.index, snapshot_term=manifest.term,
                manifest=text)
    other = next(m for m in cluster.servers if m not in (leader_id, follower))
    for req, code in [
        (InstallSnapshotRequest(**base, leader_id=other), ResponseCode.INCONSISTENT_LEADER),
        (InstallSnapshotRequest(**{**base, "term": base["term"] - 1}, leader_id=leader_id),
         ResponseCode.INCONSISTENT_TERM),
        (InstallSnapshotRequest(**base, leader_id=leader_id), ResponseCode.INCONSISTENT_STATE),  # committed past it
        (InstallSnapshotRequest(**{**base, "manifest": "{"}, leader_id=leader_id), ResponseCode.UNEXPECTED_ARGUMENT),
    ]:
        with pytest.raises(DLedgerError) as info:
            s.snapshot_receive.handle(req)
        assert info.value.code is code
    assert s.store.snapshot_base == (-1, -1)


# -- the leader's SnapshotSend on its own (task.Clock, fake store and transport) ------------------------

class _Store:
    def __init__(self):
        self.reads = []

    def read_file(self, manifest, path, offset, size):
        from twisted.internet.defer import Deferred
        d = Deferred()
        self.reads.append((d, size))
        return d

    def hold(self, manifest):
        pass

    def release(self, manifest):
        pass


def _sender(files=((2048,),)):
    from twisted.internet import task
    from twisted.internet.defer import Deferred

    from dledger.replication.snapshot_send import SnapshotSend
    from dledger.snapshot.manifest import FileInfo, Manifest, Section

    manifest = Manifest(10, 1, 100, ("n0",), (Section("dict", (FileInfo("dict/000000", 2048, 0),)),))
    clock, store, sent, outcome = task.Clock(), _Store(), [], []

    def send(req, timeout):
        d = Deferred()
        sent.append((req, d))
        return d

    s = SnapshotSend(peer="n1", manifest=manifest, snapshot_store=store, send=send,
                     request_base=lambda: dict(group="g0", term=2, leader_id="n0"), clock=clock, timeout=1.0,
                     poll_interval=0.5, chunk_size=1024, window=4, on_done=outcome.append,
                     on_failed=lambda why, unsupported: outcome.append(why))
    return s, clock, store, sent, outcome


def _answer(req, **kw):
    from dledger.messages import InstallSnapshotResponse
    return InstallSnapshotResponse(snapshot_index=req.snapshot_index, snapshot_term=req.snapshot_term, **kw)


def test_sender_never_waits_with_nothing_pending():
    """A reply that ends the transfer while a (now stale) chunk is being read still leads to a poll, then done.

    Found by the snapshot soak (seed 5219): the stale read's completion only tried to send, the dispatcher
    then waited in INSTALL for good.
    """
    s, clock, store, sent, outcome = _sender()
    s.start()
    status, d = sent.pop()
    d.callback(_answer(status, next_path="dict/000000", next_offset=0))
    read0, _ = store.reads.pop(0)
    read0.callback(b"a" * 1024)  # chunk 0 goes out; chunk 1 is being read
    chunk0, d0 = sent.pop()
    assert chunk0.offset == 0 and s.reading
    d0.callback(_answer(chunk0))  # the follower has everything already (no next place): nothing more to send
    read1, _ = store.reads.pop(0)
    read1.callback(b"b" * 1024)  # stale now
    assert not sent and clock.getDelayedCalls(), "nothing in flight and nothing scheduled"
    clock.advance(0.5)
    poll, dp = sent.pop()
    assert poll.path is None
    dp.callback(_answer(poll, installed=True))
    assert outcome and outcome[0].index == 10


def test_sender_streams_a_window_and_resends_after_a_rewind():
    """At most ``window`` chunks unanswered; a follower asking for an earlier place gets it again from there."""
    s, clock, store, sent, outcome = _sender()
    s.window = 1
    s.start()
    status, d = sent.pop()
    d.callback(_answer(status, next_path="dict/000000", next_offset=0))
    store.reads.pop(0)[0].callback(b"a" * 1024)
    assert len(sent) == 1 and not store.reads  # window 1: the next chunk waits for the answer
    chunk0, d0 = sent.pop()
    d0.callback(_answer(chunk0, next_path="dict/000000", next_offset=0))  # not taken: send it again
    store.reads.pop(0)[0].callback(b"a" * 1024)
    again, d1 = sent.pop()
    assert again.offset == 0
    d1.callback(_answer(again, next_path="dict/000000", next_offset=1024))
    store.reads.pop(0)[0].callback(b"b" * 1024)
    last, d2 = sent.pop()
    assert last.offset == 1024
    d2.callback(_answer(last, installing=True))
    clock.advance(0.5)
    poll, dp = sent.pop()
    dp.callback(_answer(poll, installed=True))
    assert outcome and outcome[0].index == 10
