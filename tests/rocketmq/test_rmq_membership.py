"""Broker members coming and going (issue #23 item 6): broker ids, registration gated on catch-up, removal.

Pure decisions as tables; the gate driven on ``task.Clock`` against a real in-memory name server
(:class:`dledger_rocketmq.namesrv.namesrv.NameServer` over iosim) with a fake ``server.membership``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from dledger_rocketmq.broker.membership import Action, MemberRegistration, departed_broker_ids, registration_step
from dledger_rocketmq.broker.roles import JOINED_BASE, RoleManager, joined_broker_id, member_broker_id, transfer_targets
from dledger_rocketmq.namesrv import registration
from dledger_rocketmq.namesrv.namesrv import NameServer
from dledger_rocketmq.namesrv.registration import Registration
from test_rmq_registration import Net, fake_broker, settle
from twisted.internet import task
from twisted.internet.defer import Deferred

from dledger.membership.configuration import Configuration, MemberInfo, MemberRole

# -- broker ids -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("self_id, bootstrap, joined, expect", [
    ("n0", ["n0", "n1", "n2"], False, 1),
    ("n3", ["n0", "n1", "n2", "n3"], True, 4),  # a member added later: its number, whoever else is there
    ("n7", ["n3", "n7"], True, 8),  # the --peers a joining member was given do not matter
    ("alpha", ["gamma", "alpha", "beta"], False, 1),  # bootstrap members keep their position (as before)
    ("gamma", ["gamma", "alpha", "beta"], False, 3),
])
def test_member_broker_id(self_id, bootstrap, joined, expect):
    """Broker ids do not depend on the configuration in force: n<k> -> k + 1; others their bootstrap position."""
    assert member_broker_id(self_id, bootstrap, joined=joined) == expect


def test_joined_member_with_an_unnumbered_id_gets_a_stable_id_above_the_positions():
    """'delta' joining {alpha, beta, gamma} must not take position 3 (gamma's) nor move when members change."""
    a = member_broker_id("delta", ["alpha", "beta", "gamma", "delta"], joined=True)
    b = member_broker_id("delta", ["delta", "epsilon"], joined=True)
    assert a == b == joined_broker_id("delta") >= JOINED_BASE
    assert joined_broker_id("delta") != joined_broker_id("epsilon")


def _server(self_id="n3", peers=("n0", "n1", "n2", "n3"), join=True, membership=None):
    config = SimpleNamespace(members={p: None for p in peers}, join_existing=join, group="g")
    return SimpleNamespace(self_id=self_id, config=config, state=SimpleNamespace(member_set=frozenset(peers)),
                           clock=task.Clock(), membership=membership)


def test_role_manager_slave_id_uses_the_bootstrap_peers_not_the_configuration():
    """The id is fixed when the member starts: a later configuration without some member does not move it."""
    server = _server("zeta", peers=("alpha", "zeta"), join=False)
    server.state.member_set = frozenset({"zeta"})  # whatever the member set becomes
    assert RoleManager(server, None).slave_id == 2
    server.config.join_existing = True
    assert RoleManager(server, None).slave_id == joined_broker_id("zeta")


def _config(*members, index=0):
    return Configuration(tuple(MemberInfo(m.rstrip("?"), f"127.0.0.1:{20911 + i}",
                                          MemberRole.LEARNER if m.endswith("?") else MemberRole.VOTER)
                               for i, m in enumerate(members)), index, 1 if index else 0)


def test_leadership_is_handed_only_to_voters():
    """A master that cannot finish its switch hands over to a voter, never to a learner (learners never lead)."""
    membership = SimpleNamespace(configuration=_config("n0", "n1", "n2?", index=5))
    server = _server("n0", membership=membership)
    server.state.peers = ("n1", "n2")
    assert transfer_targets(server) == ["n1"]
    server.membership = None
    assert transfer_targets(server) == ["n1", "n2"]


# -- when to register --------------------------------------------------------------------------------------------

R, W, X = Action.REGISTER, Action.WAIT, Action.WITHDRAW


@pytest.mark.parametrize("is_master, member, voter, config_index, committed, dispatched, latched, action, why", [
    (True, False, False, 9, 0, False, False, R, "master"),  # a removed leader masters until it steps down
    (False, False, False, 9, 9, True, True, X, "removed"),
    (False, False, False, 9, 9, True, False, X, "removed"),
    (False, True, True, 0, 0, True, False, R, "caught up"),  # a bootstrap member: as before
    (False, True, True, 0, -1, True, False, R, "caught up"),  # ... even before anything is committed
    (False, True, False, 7, 7, True, False, W, "learner"),
    (False, True, True, 12, 11, False, False, W, "not committed"),
    (False, True, True, 12, 12, False, False, W, "not dispatched"),
    (False, True, True, 12, 12, True, False, R, "caught up"),
    (False, True, True, 15, 13, False, True, R, "registered member"),  # a later change does not unregister it
    (False, True, False, 15, 13, False, True, R, "registered member"),
])
def test_registration_step(is_master, member, voter, config_index, committed, dispatched, latched, action, why):
    """Register a slave only once it is a voter whose promotion is committed and dispatched here; removed: withdraw."""
    got, reason = registration_step(is_master=is_master, member=member, voter=voter, config_index=config_index,
                                    committed=committed, dispatched=dispatched, latched=latched)
    assert got is action and why in reason


# -- the gate against a name server --------------------------------------------------------------------------------

class FakeMembership:
    """``server.membership`` as the contract has it: the configuration in force, observers called (old, new)."""

    def __init__(self, config: Configuration):
        self.configuration = config
        self.observers = []

    def observe(self, callback):
        self.observers.append(callback)

    def committed(self) -> bool:
        return True

    def change(self, config: Configuration) -> None:
        old, self.configuration = self.configuration, config
        for cb in self.observers:
            cb(old, config)


class FakeProgress:
    def __init__(self):
        self.dispatched = 0
        self.waits: list[tuple[int, Deferred]] = []

    def caught_up(self, index):
        return self.dispatched >= index

    def wait_dispatched(self, index):
        d = Deferred()
        self.waits.append((index, d))
        return d

    def advance(self, index):
        self.dispatched = index
        for i, d in list(self.waits):
            if i <= index and not d.called:
                d.callback(index)


@pytest.fixture
def net(monkeypatch):
    n = Net()
    monkeypatch.setattr(registration, "connect_client", n.connect)
    return n


def joining_member(tmp_path, clock, membership):
    b = fake_broker(tmp_path, clock, addr="10.0.0.4:10911", broker_id=4)
    b.server.self_id = "n3"
    b.server.membership = membership
    b.server.store = SimpleNamespace(committed_index=0)
    b.progress = FakeProgress()
    return b


def test_new_member_registers_only_once_caught_up_and_removal_unregisters(tmp_path, net):
    """A learner is not in the route; the promoted voter appears once its promotion is committed and dispatched;
    removed, it sends UNREGISTER_BROKER and stops its heartbeat; a truncated removal puts it back."""
    clock = task.Clock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    membership = FakeMembership(_config("n0", "n1", "n2", "n3?", index=10))
    b = joining_member(tmp_path, clock, membership)
    reg = Registration(b, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    gate = MemberRegistration(b)
    gate.attach(reg)
    codes = []
    real = ns.handle
    ns.handle = lambda conn, header, body: (codes.append(header.code), real(conn, header, body))
    reg.startService()
    settle(clock, net, 60.0)
    assert codes == [] and "10.0.0.4:10911" not in ns.table.live  # a learner: never registered
    assert gate.status()["registration"] == "wait"

    membership.change(_config("n0", "n1", "n2", "n3", index=14))  # promoted (entry 14, not committed here yet)
    settle(clock, net, 5.0)
    assert codes == [] and "committed" in gate.reason
    b.server.store.committed_index = 14
    b.progress.advance(13)
    settle(clock, net, 5.0)
    assert codes == []  # committed, but the queues are not dispatched up to the promotion yet
    b.progress.advance(14)
    settle(clock, net, 1.0)  # the next catch-up check
    assert codes == [registration.REGISTER_BROKER]
    assert ns.table.brokers["g"]["brokerAddrs"] == {4: "10.0.0.4:10911"}

    membership.change(_config("n0", "n2", "n3", index=20))  # n1 leaves: n3 stays registered, no catch-up wait
    settle(clock, net, 31.0)
    assert codes.count(registration.UNREGISTER_BROKER) == 0 and codes.count(registration.REGISTER_BROKER) >= 2

    membership.change(_config("n0", "n2", index=25))  # n3 removed
    settle(clock, net)
    assert codes[-1] == registration.UNREGISTER_BROKER
    assert "10.0.0.4:10911" not in ns.table.live and ns.table.brokers == {}
    n = len(codes)
    settle(clock, net, 90.0)
    assert len(codes) == n  # no heartbeat after removal

    b.server.store.committed_index = 24
    membership.change(_config("n0", "n2", "n3", index=20))  # the removal was truncated away: back, caught up again
    b.progress.advance(24)
    settle(clock, net, 1.0)
    assert codes[-1] == registration.REGISTER_BROKER and ns.table.brokers["g"]["brokerAddrs"] == {4: "10.0.0.4:10911"}
    reg.stopService()
    settle(clock, net)


def test_removed_master_withdraws_once_it_steps_down(tmp_path, net):
    """A leader removing itself stays master (id 0) until it steps down, then unregisters and goes quiet."""
    clock = task.Clock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    membership = FakeMembership(_config("n0", "n1", "n2", "n3"))
    b = joining_member(tmp_path, clock, membership)
    b.role, b.broker_id = "MASTER", 0
    reg = Registration(b, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    MemberRegistration(b).attach(reg)
    reg.startService()
    settle(clock, net)
    assert ns.table.masters("g") == ["10.0.0.4:10911"]
    membership.change(_config("n0", "n1", "n2", index=30))
    settle(clock, net, 31.0)
    assert ns.table.masters("g") == ["10.0.0.4:10911"]  # still the master until the change commits
    b.role, b.broker_id = "SLAVE", 4
    for cb in b.slave_callbacks:
        cb(b)
    settle(clock, net)
    assert ns.table.brokers == {} and "10.0.0.4:10911" not in ns.table.live
    registrations = reg.registrations
    settle(clock, net, 60.0)
    assert reg.registrations == registrations
    reg.stopService()
    settle(clock, net)


def test_without_membership_the_gate_is_open(tmp_path, net):
    """A dledger without ``server.membership``: registration as before (at start, no wait)."""
    clock = task.Clock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    b = joining_member(tmp_path, clock, None)
    del b.server.membership
    reg = Registration(b, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    MemberRegistration(b).attach(reg)
    reg.startService()
    settle(clock, net)
    assert reg.registrations == 1 and ns.table.brokers["g"]["brokerAddrs"] == {4: "10.0.0.4:10911"}
    reg.stopService()
    settle(clock, net)


@pytest.mark.parametrize("old, new, expect", [
    (("n0", "n1", "n2"), ("n0", "n2"), {"n1": 2}),
    (("n0", "n1", "n2"), ("n1", "n2"), {}),  # this member (n0) leaving: it withdraws itself
    (("n0", "alpha"), ("n0",), {"alpha": None}),  # no n<k>: the master cannot know its id
    (("n0", "n1"), ("n0", "n1", "n3"), {}),
])
def test_departed_broker_ids(old, new, expect):
    assert departed_broker_ids(_config(*old), _config(*new), "n0") == expect


def test_master_unregisters_a_removed_member_that_does_not_know_it(tmp_path, net):
    """A removed member cut off from the group keeps registering; the master, once the removal commits,
    unregisters the address the name server lists for its broker id."""
    clock = task.Clock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    membership = FakeMembership(_config("n0", "n1", "n2"))
    committed = [True]
    membership.committed = lambda: committed[0]
    m = joining_member(tmp_path, clock, membership)
    m.server.self_id, m.role, m.broker_id = "n0", "MASTER", 0
    m.server.clock = clock
    reg = Registration(m, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    gate = MemberRegistration(m)
    gate.attach(reg)
    zombie = fake_broker(tmp_path, clock, addr="10.0.0.2:10911", broker_id=2)
    rz = Registration(zombie, ["127.0.0.1:9876"], period=30.0, reactor=clock)  # never learns of its removal
    reg.startService()
    rz.startService()
    settle(clock, net)
    assert brokers_of(ns) == {0: "10.0.0.4:10911", 2: "10.0.0.2:10911"}
    committed[0] = False
    membership.change(_config("n0", "n2", index=9))
    settle(clock, net, 3.0)
    assert 2 in brokers_of(ns)  # not before the removal commits
    committed[0] = True
    settle(clock, net, 2.0)
    assert brokers_of(ns) == {0: "10.0.0.4:10911"} and "10.0.0.2:10911" not in ns.table.live
    assert gate.withdrawn_by_master == [("n1", 2, "10.0.0.2:10911")]
    reg.stopService()
    rz.stopService()
    settle(clock, net)
    assert clock.getDelayedCalls() == [] or all(not c.active() for c in clock.getDelayedCalls())


def brokers_of(ns) -> dict:
    data = ns.table.brokers.get("g")
    return dict(data["brokerAddrs"]) if data else {}


# -- an in-process broker group (virtual time) whose members change ------------------------------------------------

def test_in_process_group_replaces_a_slave_and_the_new_member_becomes_master(tmp_path, net):
    """n3 joins: not in the route as a learner; once promoted and caught up it is slave 4 holding every message;
    n1 removed: unregistered; then the master removed: leadership moves, and n3 as master serves everything."""
    from dledger_rocketmq.broker.port import BrokerPort
    from dledger_rocketmq.common.message import decode_record
    from dledger_rocketmq.plugin import broker_for, registration_for
    from rmq_cluster_util import msg, put, queue_units
    from test_rmq_registration import group_with_namesrv, run, serve_sync

    from dledger.membership.rules import Change, Op

    cluster, ns = group_with_namesrv(tmp_path, net, **{"rocketmq.masterWaitTimeout": 5.0})
    addr = {f"n{k}": f"127.0.0.1:{30911 + k}" for k in range(4)}

    def master():
        found = [m for m, s in cluster.servers.items() if broker_for(s).role == "MASTER"]
        return found[0] if len(found) == 1 else None
    assert run(cluster, net, lambda: master() is not None and len(brokers_of_group(ns)) == 3)
    m = master()
    for i in range(30):
        assert put(cluster, broker_for(cluster.servers[m]), msg(body=b"before-%d" % i)).ok
    extras = {**cluster.configs["n0"].extras, "rocketmq.storeHost": addr["n3"]}
    address = cluster.add_member("n3", extras=extras)
    b3 = broker_for(cluster.servers["n3"])
    port = BrokerPort(b3, "tcp:0")
    serve_sync(port, b3)
    net.servers[addr["n3"]] = port.factory
    cluster.change(Change(Op.ADD, "n3", address, learner=True))  # stays a learner until promoted
    run(cluster, net, lambda: False, 10.0)
    assert addr["n3"] not in brokers_of_group(ns).values()  # a learner is never in the route
    assert "learner" in registration_for(cluster.servers["n3"]).gate.__self__.reason
    for i in range(20):
        assert put(cluster, broker_for(cluster.servers[m]), msg(body=b"while-learner-%d" % i)).ok
    cluster.change(Change(Op.PROMOTE, "n3"))
    assert run(cluster, net, lambda: brokers_of_group(ns).get(4) == addr["n3"], 10)
    # when it registered, everything committed before its promotion was in its queues
    assert len(queue_units(b3, "T", 0)) >= 50

    slave = next(x for x in ("n0", "n1", "n2") if x != m)
    cluster.change(Change(Op.REMOVE, slave))
    assert run(cluster, net, lambda: addr[slave] not in brokers_of_group(ns).values(), 10)
    cluster.crash(slave)

    if master() != "n3":  # hand the master role to n3 by removing the master (it hands over to a voter)
        old = master()
        cluster.change(Change(Op.REMOVE, old))
        assert run(cluster, net, lambda: master() is not None and master() != old, 30)
        if master() != "n3":
            from dledger.messages import LeadershipTransferRequest
            s = cluster.servers[master()]
            s.handle_leadership_transfer(LeadershipTransferRequest(group=s.config.group, term=s.state.curr_term,
                                                                   transfer_id=s.self_id, transferee_id="n3"))
        assert run(cluster, net, lambda: master() == "n3", 30)
        assert run(cluster, net, lambda: addr[old] not in brokers_of_group(ns).values(), 10)
    assert run(cluster, net, lambda: brokers_of_group(ns).get(0) == addr["n3"], 10)
    r = put(cluster, b3, msg(body=b"after"))
    assert r.ok and run(cluster, net, lambda: len(queue_units(b3, "T", 0)) == 51, 5)
    got = b3.get_messages("g", "T", 0, 0, 100)
    bodies = [decode_record(rec).body for rec in got.records]
    assert bodies == [b"before-%d" % i for i in range(30)] + [b"while-learner-%d" % i for i in range(20)] + [b"after"]


def brokers_of_group(ns) -> dict:
    data = ns.table.brokers.get("RaftNode00")
    return dict(data["brokerAddrs"]) if data else {}


def test_status_page_shows_the_registration_decision(tmp_path, monkeypatch):
    """The broker's status section says whether the member registered, waits (and why) or withdrew."""
    from dledger_rocketmq.broker import status

    membership = FakeMembership(_config("n0", "n1", "n3?", index=7))
    b = joining_member(tmp_path, task.Clock(), membership)
    gate = MemberRegistration(b)
    gate.allows()
    monkeypatch.setattr(status, "read_view", lambda broker, port: status.BrokerView(
        broker_name="g", cluster_name="C", role="SLAVE", dispatch_lag_bytes=0, dispatched_index=-1))
    provider = status.status_provider(b.server, b, lambda: None, lambda: gate)
    summary = dict(provider()[0]["summary"])
    assert summary["name-server registration"].startswith("wait (a learner")
    assert "name-server registration" not in dict(status.status_provider(b.server, b, lambda: None)()[0]["summary"])
