"""Role switching (seed 004): pure decisions, and a 3-member group whose master is killed."""

from __future__ import annotations

import pytest
from dledger_rocketmq.broker.roles import (
    MASTER,
    SLAVE,
    RoleAction,
    Step,
    broker_id_for,
    leader_step,
    role_action,
    waiting_for,
)
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.commitlog import PutStatus
from rmq_cluster_util import broker_cluster, master, msg, put, queue_units, settled

from dledger.codes import Role
from dledger.messages import LeadershipTransferRequest


@pytest.mark.parametrize("self_id, members, expect", [
    ("n0", None, 1), ("n1", None, 2), ("n12", None, 13), ("b3", None, 4),
    ("alpha", ["gamma", "alpha", "beta"], 1), ("gamma", ["gamma", "alpha", "beta"], 3),
])
def test_broker_id_for(self_id, members, expect):
    """Slave broker ids follow RocketMQ (selfId 'n<k>' -> k + 1, never 0); other ids use their sorted position."""
    assert broker_id_for(self_id, members) == expect


@pytest.mark.parametrize("role, broker_role, action", [
    (Role.CANDIDATE, SLAVE, RoleAction.NOTHING),
    (Role.CANDIDATE, MASTER, RoleAction.BECOME_SLAVE),
    (Role.FOLLOWER, SLAVE, RoleAction.BECOME_SLAVE),
    (Role.FOLLOWER, MASTER, RoleAction.BECOME_SLAVE),
    (Role.LEADER, SLAVE, RoleAction.WAIT_FOR_MASTER),
])
def test_role_action(role, broker_role, action):
    """Each dledger role change asks for what DLedgerRoleChangeHandler does."""
    assert role_action(role, broker_role) is action


BASE = dict(leader_of_term=True, leader_ready=True, ledger_end=10, committed=10, dispatched=True,
            elapsed=1.0, timeout=30.0)


@pytest.mark.parametrize("change, step", [
    ({}, Step.BECOME_MASTER),
    ({"committed": 11}, Step.BECOME_MASTER),  # committed past the end (dledger#316) must not hang
    ({"leader_of_term": False}, Step.GIVE_UP),
    ({"leader_of_term": False, "elapsed": 99.0}, Step.GIVE_UP),
    ({"leader_ready": False}, Step.WAIT),
    ({"committed": 9}, Step.WAIT),
    ({"dispatched": False}, Step.WAIT),
    ({"dispatched": False, "elapsed": 30.0}, Step.TIMED_OUT),
    ({"leader_ready": False, "elapsed": 31.0}, Step.TIMED_OUT),
])
def test_leader_step(change, step):
    """The LEADER wait switches only when ready, committed and dispatched; gives up on lost leadership; is bounded."""
    assert leader_step(**{**BASE, **change}) is step


def test_waiting_for_names_what_is_missing():
    """The timeout line says what the wait still lacks."""
    why = waiting_for(leader_ready=False, ledger_end=12, committed=10, dispatched=False, lag=300)
    assert "first entry" in why and "entries 11..12" in why and "300 bytes behind" in why
    assert waiting_for(leader_ready=True, ledger_end=1, committed=1, dispatched=True, lag=0) == "nothing"


def test_one_master_with_broker_id_0_and_slaves_with_derived_ids(tmp_path):
    """Exactly the leader becomes MASTER (id 0); the others are SLAVEs with ids n<k> -> k + 1."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    assert b.broker_id == 0 and b.server.state.role is Role.LEADER
    for mid, s in cluster.servers.items():
        if broker_for(s) is not b:
            assert broker_for(s).role == SLAVE and broker_for(s).broker_id == int(mid[1:]) + 1


def test_master_killed_twice_loses_nothing_and_switches_only_after_catch_up(tmp_path):
    """Master killed twice while producing: nothing acked lost, offsets contiguous, new masters caught up first."""
    cluster = broker_cluster(tmp_path, seed=3)
    switches = []

    def watch():
        for s in cluster.servers.values():
            br = broker_for(s)
            if not getattr(br, "_watched", False):
                br._watched = True
                br.master_callbacks.append(lambda _b, br=br: switches.append(
                    (br.server.self_id, br.dispatcher.caught_up(br.server.store.committed_index),
                     br.server.store.committed_index >= br.server.store.ledger_end_index,
                     dict(br.commitlog.offsets) == {("T", 0): br.max_offset("T", 0)} or br.max_offset("T", 0) == 0)))
    watch()
    acked = []
    for _round in range(3):
        b = master(cluster)
        for i in range(4):
            r = put(cluster, b, [msg(body=b"r%d-%d-%d" % (_round, i, k)) for k in range(3)])
            assert r.status is PutStatus.PUT_OK, r
            acked.append(r)
        if _round < 2:
            victim = b.server.self_id
            cluster.crash(victim)
            master(cluster)  # a new master among the survivors
            cluster.restart(victim)
            watch()
    assert settled(cluster, 30)
    assert len(switches) == 3 and all(all(s[1:]) for s in switches), switches
    units = {mid: queue_units(broker_for(s), "T", 0) for mid, s in cluster.servers.items()}
    first = next(iter(units.values()))
    assert all(u == first for u in units.values())
    assert [o for o, _ in first] == list(range(len(first)))  # contiguous
    stored = {u.physical_offset for _, u in first}
    for r in acked:  # every acknowledged record is indexed at the offsets its put returned
        for k, mid in enumerate(r.msg_ids):
            assert int(mid[16:], 16) in stored
            assert dict(first)[r.queue_offset + k].physical_offset == int(mid[16:], 16)


def test_a_leader_that_cannot_catch_up_hands_leadership_on(tmp_path):
    """If dispatch never catches up, the leader stays slave, and after masterWaitTimeout hands leadership on."""
    cluster = broker_cluster(tmp_path, **{"rocketmq.masterWaitTimeout": 2.0})
    b = master(cluster)
    put(cluster, b, msg())
    assert settled(cluster)
    stuck = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    nb = broker_for(cluster.servers[stuck])
    nb.dispatcher.caught_up = lambda index: False  # this member's dispatch never catches up
    out = []
    req = LeadershipTransferRequest(group=b.server.config.group, term=b.server.state.curr_term,
                                    transfer_id=b.server.self_id, transferee_id=stuck)
    b.server.handle_leadership_transfer(req).addBoth(out.append)
    assert cluster.run_until(lambda: nb.server.state.role is Role.LEADER, 20)
    led_at = cluster.clock.seconds()
    assert nb.role == SLAVE
    assert cluster.run_until(lambda: nb.server.state.role is not Role.LEADER, 10), "never handed leadership on"
    assert cluster.clock.seconds() - led_at >= 2.0  # not before the bound
    assert nb.role == SLAVE and master(cluster).server.self_id != stuck


def test_role_callbacks_run_in_order_and_a_failing_one_does_not_stop_the_switch(tmp_path):
    """Master callbacks run on the new master, slave callbacks on every slave; a raising callback is only logged."""
    cluster = broker_cluster(tmp_path)
    calls = []
    for s in cluster.servers.values():
        br = broker_for(s)
        br.master_callbacks += [lambda b: (_ for _ in ()).throw(RuntimeError("boom")),
                                lambda b: calls.append(("master", b.server.self_id, b.broker_id))]
        br.slave_callbacks.append(lambda b: calls.append(("slave", b.server.self_id, b.broker_id)))
    b = master(cluster)
    cluster.run(1.0)
    assert ("master", b.server.self_id, 0) in calls
    slaves = {mid for kind, mid, _ in calls if kind == "slave"}
    assert slaves >= set(cluster.servers) - {b.server.self_id}
    assert [c for c in calls if c[0] == "master"] == [("master", b.server.self_id, 0)]
