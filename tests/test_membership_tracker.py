"""The configuration tracker (dledger.membership.tracker): appends, truncation, compaction, snapshots, restart scans.

The unit tests drive a :class:`Membership` over a memory store through the member's LogGuard (the path every
write takes); the store tests restart real groups on the mmap and lmdb stores, where the start-up scan reads
the log back (the mmap store through its index records).
"""

from __future__ import annotations

import pytest

from dledger.codes import EntryType, Role
from dledger.entry import Entry, without_control, without_noops
from dledger.membership.configuration import Configuration, MemberInfo, MemberRole
from dledger.membership.rules import Change, Op
from dledger.membership.tracker import Membership, config_entry_indexes
from dledger.snapshot.manifest import Manifest, ManifestError
from dledger.store.guard import LogGuard, seal_leader_entry
from dledger.store.lmdbstore import LmdbLogStore
from dledger.store.memory import MemoryLogStore
from dledger.store.mmapfile import MmapLogStore
from dledger.testing import Cluster

BOOT = Configuration(tuple(MemberInfo(f"n{i}", f"127.0.0.1:{i + 1}") for i in range(3)))
WITH_N3 = BOOT.replace(MemberInfo("n3", "127.0.0.1:4", MemberRole.LEARNER, promote=True))


class _State:
    """Just enough of an IMemberState for LogGuard's role checks."""

    self_id = "n0"
    role = Role.FOLLOWER
    curr_term = 2
    leader_id = "n1"


def _member():
    state = _State()
    store = MemoryLogStore(state)
    guard = LogGuard(store, state)
    membership = Membership("n0", store, BOOT)
    guard.membership = membership
    seen = []
    membership.observe(lambda old, new: seen.append((old.index, new.index)))
    return guard, store, membership, seen


def _entries(magics, start=0, term=2):
    out, pos = [], 0
    for k, magic in enumerate(magics):
        body = WITH_N3.encode() if magic == EntryType.CONFIG_CHANGE else f"e{start + k}".encode()
        e = Entry(body=body, index=start + k, term=term, pos=pos, magic=magic).sealed()
        out.append(e)
        pos += e.size
    return out


def test_follower_batches_truncation_and_compaction_move_the_configuration():
    guard, store, membership, seen = _member()
    N, C = EntryType.NORMAL, EntryType.CONFIG_CHANGE
    entries = _entries([N, N, C, N, N])
    guard.append_batch_as_follower(entries, 2, "n1")
    assert membership.configuration == WITH_N3.at(2, 2) and seen == [(0, 2)]
    assert not membership.committed()  # in force at once, committed or not
    guard.truncate(entries[1], 2, "n1")  # the leader cut us back before the configuration entry
    assert membership.configuration == BOOT and seen[-1] == (2, 0)
    guard.append_batch_as_follower(_entries([N, N, C, N])[2:], 2, "n1")
    assert membership.configuration.index == 2
    membership.compacted(3)  # the entries before 3 are gone: their configuration becomes the base
    assert membership.base.index == 2 and membership.history == [] and membership.configuration.index == 2
    assert membership.at(1) == membership.base  # the base answers for what it covers


def test_a_configuration_entry_of_an_unknown_format_is_ignored_loudly():
    guard, _store, membership, seen = _member()
    bad = Entry(body=b'{"dledgerConfig": 99}', index=0, term=2, pos=0, magic=EntryType.CONFIG_CHANGE).sealed()
    guard.append_batch_as_follower([bad], 2, "n1")
    assert membership.configuration == BOOT and seen == []


def test_installed_snapshot_replaces_base_and_history():
    _guard, _store, membership, seen = _member()
    membership.installed(WITH_N3, 40, 3)
    assert membership.configuration == WITH_N3.at(40, 3) and seen == [(0, 40)]
    membership.installed(None, 50, 3)  # a manifest without a configuration keeps the one in force
    assert membership.configuration.same_members(WITH_N3) and membership.configuration.index == 50


def test_control_entries_are_filtered_by_one_function_and_never_hooked():
    entries = _entries([EntryType.NORMAL, EntryType.NOOP, EntryType.CONFIG_CHANGE, EntryType.NORMAL])
    assert [e.index for e in without_noops(entries)] == [0, 3]
    assert without_control is without_noops
    assert all(e.is_control for e in entries[1:3]) and not entries[0].is_control

    class Hook:
        called = 0

        def before_append(self, entry, view, offset):
            Hook.called += 1
            view[offset:offset + 1] = b"X"

    config = entries[2]
    stored = seal_leader_entry([Hook()], Entry(body=config.body, term=2, magic=EntryType.CONFIG_CHANGE), 2, 0)
    assert stored.body == config.body and Hook.called == 0


def test_manifest_records_roles_and_reads_old_manifests():
    m = Manifest(10, 2, 999, ("n0-127.0.0.1:1",), configuration=WITH_N3.to_json())
    again = Manifest.from_bytes(m.to_bytes())
    assert again.configuration == WITH_N3.to_json() and again.config() == WITH_N3.at(10, 2)
    old = Manifest.from_bytes(b'{"format":1,"index":1,"term":1,"nextPos":0,"members":["n0-h:1"],"sections":[]}')
    assert old.configuration is None and old.config() is None
    with pytest.raises(ManifestError, match="configuration"):
        Manifest.from_json({**m.to_json(), "configuration": {"dledgerConfig": 1, "members": []}})


def _factory(kind, root, clock_box):
    def factory(mid, config, state):
        if kind == "mmap":
            return MmapLogStore(root / f"dledger-{mid}", state, data_file_size=4096, index_file_size=512,
                                clock=clock_box[0], disk_usage=lambda: 0.1)
        return LmdbLogStore(root / f"dledger-{mid}" / "lmdb", state, data_file_size=4096, map_size=1 << 20,
                            clock=clock_box[0])
    return factory


@pytest.mark.parametrize("kind", ["mmap", "lmdb"])
def test_restart_rescans_the_log_on_durable_stores(tmp_path, kind):
    clock_box = [None]
    c = Cluster(3, seed=5, store_factory=_factory(kind, tmp_path, clock_box), learner_promote_lag=-1)
    clock_box[0] = c.clock
    c.start()
    c.append_committed([b"x" * 100 for _ in range(30)])
    config = c.change(Change(Op.ADD, "n3", "127.0.0.1:29999", learner=True))  # a learner that never starts
    c.append_committed([b"y" * 100 for _ in range(30)])
    lid = c.leader()
    store = c.servers[lid].store
    assert config_entry_indexes(store, store.ledger_begin_index, store.ledger_end_index) == [config.index]
    if kind == "mmap":  # no state machines, so no snapshot records it: retention keeps the entry in the log
        assert all(s.store.retention_floor == config.index for s in c.servers.values())
    c.stop()
    c.run(1)
    c.start()
    c.wait_for_leader(30)
    assert all(s.membership.configuration == config for s in c.servers.values())
    assert all(s.state.members == ("n0", "n1", "n2", "n3") and s.state.voters == ("n0", "n1", "n2")
               for s in c.servers.values())
    c.stop()
    c.run(1)


def test_install_snapshot_carries_the_configuration_to_a_new_learner(tmp_path):
    """The leader compacted past the entry that added a learner: the snapshot carries the configuration to it."""
    from dledger.testing.statemachine import DictMachine

    def sm(mid, server):
        server.add_state_machine(DictMachine(piece=700))
        return []

    c = Cluster(3, seed=2, handlers=sm, store_base_dir=str(tmp_path), snapshot_threshold=0,
                snapshot_threshold_bytes=0, trailing_entries=0, learner_promote_lag=-1)
    c.start()
    c.append_committed([f"k{i}=v".encode() for i in range(50)])
    address = c.add_member("n3")
    stop = c.network.drop_matching(lambda src, dst, req: dst == "n3" and type(req).__name__ == "PushEntryRequest")
    config = c.change(Change(Op.ADD, "n3", address, learner=True))
    more = c.client().append(b"more=1")
    c.wait_until(lambda: more.called, 30, "an append after the change")
    c.wait_applied(ids=["n0", "n1", "n2"])
    assert c.run_until(lambda: all(c.servers[m].peer_kinds.all_take_snapshots() for m in ("n0", "n1", "n2")), 30)
    takes = [c.servers[m].snapshots.take() for m in ("n0", "n1", "n2")]
    assert c.run_until(lambda: all(d.called for d in takes), 30)
    lid = c.leader()
    assert c.servers[lid].store.ledger_begin_index > config.index  # the configuration entry is compacted away
    manifest = c.servers[lid].snapshots.snapshot_store.newest()
    assert manifest.config().same_members(config)
    stop()
    learner = c.servers["n3"]
    c.wait_until(lambda: learner.store.ledger_end_index == c.servers[lid].store.ledger_end_index, 30, "caught up")
    assert learner.store.snapshot_base[0] == manifest.index  # it came through InstallSnapshot
    assert learner.membership.configuration.same_members(config)
    assert learner.state.voters == ("n0", "n1", "n2") and learner.elector.vote_rounds == 0
    promoted = c.change(Change(Op.PROMOTE, "n3"))
    c.wait_until(lambda: learner.membership.configuration == promoted, 30, "the promotion reaches n3")
