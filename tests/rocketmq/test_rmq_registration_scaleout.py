"""Scale-out (#11 item 5): two broker groups under one cluster in one name server, and the route-aware client."""

from __future__ import annotations

import dataclasses

import pytest
from dledger_rocketmq.broker.port import BrokerPort
from dledger_rocketmq.client.client import RouteClient, message_queues, route_masters
from dledger_rocketmq.namesrv import registration
from dledger_rocketmq.namesrv.namesrv import NameServer
from dledger_rocketmq.plugin import broker_for
from test_rmq_registration import Net

from dledger import plugins
from dledger.testing import Cluster
from dledger.testing.clock import SimClock

ROUTE = {"brokerDatas": [{"brokerAddrs": {"0": "a:1", "1": "a:2"}, "brokerName": "broker-a", "cluster": "C"},
                         {"brokerAddrs": {"1": "b:2"}, "brokerName": "broker-b", "cluster": "C"},
                         {"brokerAddrs": {"0": "c:1"}, "brokerName": "broker-c", "cluster": "C"}],
         "filterServerTable": {},
         "queueDatas": [{"brokerName": "broker-c", "perm": 4, "readQueueNums": 2, "topicSysFlag": 0,
                         "writeQueueNums": 2},
                        {"brokerName": "broker-a", "perm": 6, "readQueueNums": 3, "topicSysFlag": 0,
                         "writeQueueNums": 2},
                        {"brokerName": "broker-b", "perm": 6, "readQueueNums": 4, "topicSysFlag": 0,
                         "writeQueueNums": 4}]}


def test_route_masters_and_message_queues():
    """Queues come from groups with a master, by permission: write queues to send, read queues to pull."""
    assert route_masters(ROUTE) == {"broker-a": "a:1", "broker-c": "c:1"}
    assert message_queues(ROUTE) == [("broker-a", 0), ("broker-a", 1)]  # b: no master; c: read-only
    assert message_queues(ROUTE, write=False) == [("broker-a", 0), ("broker-a", 1), ("broker-a", 2),
                                                  ("broker-c", 0), ("broker-c", 1)]
    assert message_queues(ROUTE, write=False, max_queues=1) == [("broker-a", 0), ("broker-c", 0)]


def two_groups(tmp_path, net):
    """broker-a and broker-b (3 members each, one SimClock) registering with one name server on ``net``."""
    clock = SimClock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    groups = {}
    for g, name in enumerate(["broker-a", "broker-b"]):
        opts = {"rocketmq.enabled": True, "rocketmq.mappedFileSizeConsumeQueue": 1000,
                "rocketmq.namesrvAddr": "127.0.0.1:9876", "rocketmq.brokerName": name,
                "rocketmq.brokerClusterName": "DemoCluster"}
        cluster = Cluster(3, seed=11 + g, clock=clock, group=name, plugin_manager=plugins.make_plugin_manager(),
                          store_base_dir=str(tmp_path / name), extras=opts)
        for k, mid in enumerate(cluster.ids):
            cfg = cluster.configs[mid]
            cluster.configs[mid] = dataclasses.replace(
                cfg, extras={**cfg.extras, "rocketmq.storeHost": f"127.0.0.1:{30911 + 1000 * g + k}"})
        cluster.start()
        for k, mid in enumerate(cluster.ids):
            net.servers[f"127.0.0.1:{30911 + 1000 * g + k}"] = BrokerPort(broker_for(cluster.servers[mid]),
                                                                          "tcp:0").factory
        groups[name] = cluster
    return clock, ns, groups


def wait(clock, net, d_or_pred, timeout=30.0):
    """Run the shared clock (moving bytes) until a Deferred fires or a predicate holds; the result."""
    out = []
    if callable(d_or_pred):
        pred = d_or_pred
    else:
        d_or_pred.addBoth(out.append)
        pred = lambda: bool(out)

    def check():
        net.pump()
        return pred()
    assert clock.run_until(clock.seconds() + timeout, stop=check), "timed out"
    if out and hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0] if out else None


@pytest.fixture
def net(monkeypatch):
    n = Net()
    monkeypatch.setattr(registration, "connect_client", n.connect)
    return n


def test_two_groups_one_cluster_route_client_spreads_and_survives_failover(tmp_path, net):
    """Two groups in one cluster: sends spread over both groups' queues, pulls find them; a master kill is survived."""
    clock, ns, groups = two_groups(tmp_path, net)
    wait(clock, net, lambda: sorted(ns.table.clusters.get("DemoCluster", {})) == ["broker-a", "broker-b"]
         and all(ns.table.masters(n) for n in groups))
    rc = RouteClient(clock, "127.0.0.1:9876", connect_fn=net.connect, timeout=5.0)
    first = [wait(clock, net, rc.send("ScaleTopic", b"m0", broker_name="broker-a")),
             wait(clock, net, rc.send("ScaleTopic", b"m1", broker_name="broker-b"))]  # created on both groups
    assert [r.broker_name for r in first] == ["broker-a", "broker-b"]
    wait(clock, net, lambda: ns.table.route("ScaleTopic") is not None
         and len(ns.table.route("ScaleTopic")["queueDatas"]) == 2, 5)
    rc.route("ScaleTopic", fresh=True)
    sent = first + [wait(clock, net, rc.send("ScaleTopic", f"m{i}".encode())) for i in range(2, 18)]
    spread = {name: sum(r.broker_name == name for r in sent[2:]) for name in groups}
    assert spread == {"broker-a": 8, "broker-b": 8}  # round-robin over both groups' 8 queues, twice
    route = wait(clock, net, rc.route("ScaleTopic", fresh=True))
    assert sorted(route_masters(route)) == ["broker-a", "broker-b"]
    wait(clock, net, lambda: all(broker_for(s).lag() == 0 for g in groups.values() for s in g.servers.values()), 5)
    got = set()
    for name, queue_id in message_queues(route, write=False):
        p = wait(clock, net, rc.pull("cg", "ScaleTopic", name, queue_id, 0))
        got |= {m.body for m in p.messages}
    assert got == {f"m{i}".encode() for i in range(18)}
    # failover of broker-a: the route switches to its new master, sends keep working on both groups
    a = groups["broker-a"]
    old = next(mid for mid, s in a.servers.items() if broker_for(s).role == "MASTER")
    old_addr = ns.table.masters("broker-a")[0]
    a.crash(old)
    wait(clock, net, lambda: ns.table.masters("broker-a") not in ([], [old_addr]), 30)
    after = [wait(clock, net, rc.send("ScaleTopic", f"n{i}".encode())) for i in range(8)]
    assert {r.broker_name for r in after} == {"broker-a", "broker-b"}
    for g in groups.values():
        g.stop()
    rc.close()
