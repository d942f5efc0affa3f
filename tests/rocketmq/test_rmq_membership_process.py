"""Real processes: a broker group replaces a slave, then its master, while a producer runs (issue #23 item 6).

Three ``twistd dledger`` members with the broker plugin register with a name server (run in this
process on 127.0.0.1); a producer sends one message at a time to the master's broker port.  Then:

1. **a slave is replaced**: a new member starts with ``--join``, ``add_member`` makes it a learner, the
   leader promotes it once caught up, and its broker registers with the name server as a slave (broker id
   ``k + 1`` for ``n<k>``) -- never while it is still a learner; ``remove_member`` removes the old slave,
   whose broker unregisters (the name server's cluster info no longer lists it);
2. **the master is replaced**: a second new member joins the same way, then the master is removed: the
   leader steps down and hands over, a new master takes sends, and the old one unregisters.

Afterwards every acknowledged message is read back from the new master at the queue offset its send
was acknowledged with, the queues have no gap, and the name server's cluster info (``mqadmin
clusterList``'s data) shows exactly the final member set: the new master as broker id 0 and the slaves
with their ids.  About 40 s; the ``slow`` variant (DLEDGER_SLOW=1 or ``-m slow``) sends more between steps.
"""

from __future__ import annotations

import os

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import RocketMQError, connect
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.namesrv.namesrv import NameServer
from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from dledger.client import DLedgerClient
from dledger.config import make_config
from dledger.launcher import LocalGroup, durable_store, free_ports
from dledger.server import DLedgerServer

STORE = durable_store()


def _has_membership() -> bool:
    probe = DLedgerServer.build(make_config(preset="fast", group="g0", self_id="n0",
                                            peers="n0-127.0.0.1:1;n1-127.0.0.1:2"))
    return getattr(probe, "membership", None) is not None


MEMBERSHIP = _has_membership()
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
    pytest.mark.skipif(not hasattr(DLedgerClient, "add_member"), reason="the client has no add_member yet"),
    pytest.mark.skipif(not MEMBERSHIP, reason="this dledger has no membership change yet (issue #23's core)"),
]

TOPIC = "MembersTopic"
QUEUES = 2
BROKER = "RaftNode00"
SLOW = bool(os.environ.get("DLEDGER_SLOW"))
SENDS = 400 if SLOW else 60  # acknowledged sends to wait for between the steps
RETRY = 0.02


class Producer:
    """Sends to whichever member's broker is master (found by asking); records every acknowledgement."""

    def __init__(self, reactor, ports: dict[str, int], master: str):
        self.reactor, self.ports, self.master = reactor, ports, master
        self.live = set(ports)
        self.acked: dict[bytes, tuple[int, int]] = {}  # body -> (queue id, queue offset)
        self.stop = False
        self.clients: dict[str, object] = {}
        self.candidates: list[str] = []

    async def client(self, mid: str):
        c = self.clients.get(mid)
        if c is None or c.protocol is None:
            c = self.clients[mid] = await connect(self.reactor, "127.0.0.1", self.ports[mid], timeout=2.0,
                                                  producer_group="members_pg")
        return c

    def drop(self, mid: str) -> None:
        c = self.clients.pop(mid, None)
        if c is not None:
            c.close()

    async def run(self) -> None:
        i = 0
        while not self.stop:
            body = b"member-%06d" % i
            mid = self.master
            if mid is None:  # try every live member: the one whose broker is master takes the send
                if not self.candidates:
                    self.candidates = sorted(self.live)
                    await deferLater(self.reactor, RETRY, lambda: None)
                mid = self.candidates.pop()
            try:
                c = await self.client(mid)
                r = await c.send(TOPIC, body, queue_id=i % QUEUES)
            except (RocketMQError, Exception):
                self.drop(mid)
                self.master = None
                continue
            self.master = mid
            self.acked[body] = (r.queue_id, r.queue_offset)
            i += 1

    def close(self) -> None:
        for mid in list(self.clients):
            self.drop(mid)


def join(group: LocalGroup, mid: str, broker_port: int) -> str:
    """Start member ``mid`` joining ``group`` (``--join``, the running members and itself as --peers)."""
    group.member_args[mid] = broker_port_args({mid: broker_port})[mid]
    group.new_member(mid)
    group.start(mid)
    return group.address(mid)


def brokers(ns: NameServer) -> dict[int, str]:
    data = ns.table.brokers.get(BROKER)
    return dict(data["brokerAddrs"]) if data else {}


@pytest_twisted.ensureDeferred
async def test_replace_a_slave_then_the_master_under_load(tmp_path, reactor, capsys):
    ns = NameServer("tcp:0:interface=127.0.0.1", reactor=reactor)
    ns.startService()
    ns_port = (await ns.listening).getHost().port
    ports = dict(zip(["n0", "n1", "n2", "n3", "n4"], free_ports(5), strict=True))
    addr = {mid: f"127.0.0.1:{p}" for mid, p in ports.items()}
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast",
                       member_args=broker_port_args({m: ports[m] for m in ("n0", "n1", "n2")}),
                       options={"plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0,
                                "plugins.rocketmq.namesrvAddr": f"127.0.0.1:{ns_port}",
                                "plugins.rocketmq.brokerName": BROKER, "learnerPromoteLag": 50})
    admin = group.client(request_timeout=2.0)
    producer = None
    running = None
    registered_as_learner = []
    withdrawn: dict[str, list[str]] = {}
    try:
        await group.start_and_wait(30)
        master = await wait_for_master(group, admin, ports, topic=TOPIC + "Probe", timeout=30)
        await group.wait_for(lambda: len(brokers(ns)) == 3, 30, "three brokers registered")
        producer = Producer(reactor, {m: ports[m] for m in group.ids}, master)
        running = Deferred.fromCoroutine(producer.run())

        async def sends(n: int, what: str) -> None:
            target = len(producer.acked) + n
            await group.wait_for(lambda: len(producer.acked) >= target, 60, what)

        async def replace(old: str, new: str) -> None:
            await sends(SENDS, f"{SENDS} sends before {new} joins")
            address = join(group, new, ports[new])
            producer.live.add(new)
            producer.ports[new] = ports[new]

            async def learner_watch():
                view = await admin.members()
                m = view.configuration.get(new)
                if m is not None and not m.voter and addr[new] in brokers(ns).values():
                    registered_as_learner.append(new)  # must never happen
                return m is not None and m.voter
            await admin.add_member(new, address)
            await group.wait_for(learner_watch, 60, f"{new} promoted to voter")
            await group.wait_for(lambda: brokers(ns).get(int(new[1:]) + 1) == addr[new], 30,
                                 f"{new} registered as slave id {int(new[1:]) + 1}")
            await sends(SENDS, f"{SENDS} sends with {new} a slave")
            await admin.remove_member(old)
            await group.wait_for(lambda: addr[old] not in brokers(ns).values() and addr[old] not in ns.table.live,
                                 30, f"{old} unregistered")
            producer.live.discard(old)
            await sends(SENDS, f"{SENDS} sends after {old} left")
            await group.stop(old)
            withdrawn[old] = group.log_lines(old, "registration: withdraw")
            group.retire(old)

        slave = next(m for m in ("n0", "n1", "n2") if m != master)
        await replace(slave, "n3")
        assert producer.master == master  # a slave's replacement does not move the master
        old_master = producer.master
        await replace(old_master, "n4")
        new_master = producer.master
        assert new_master not in (None, old_master)
        await group.wait_for(lambda: brokers(ns).get(0) == addr[new_master], 30, "the new master registered as id 0")

        producer.stop = True
        await running
        running = None
        final = sorted(group.ids)
        expect = {0: addr[new_master], **{int(m[1:]) + 1: addr[m] for m in final if m != new_master}}
        await group.wait_for(lambda: brokers(ns) == expect, 30, f"the route to show exactly {expect}")
        # what mqadmin clusterList reads: GET_BROKER_CLUSTER_INFO over TCP
        c = await connect(reactor, "127.0.0.1", ns_port, timeout=5)
        try:
            header, body = await c.request(106, {})
        finally:
            c.close()
        info = fastjson.loads(body)
        assert header.code == 0
        assert {int(k): v for k, v in info["brokerAddrTable"][BROKER]["brokerAddrs"].items()} == expect

        # every acknowledged message at its offset, no gap, read from the new master
        c = await connect(reactor, "127.0.0.1", ports[new_master], timeout=5)
        seen: dict[bytes, tuple[int, int]] = {}
        try:
            for q in range(QUEUES):
                offset = 0
                end = await c.max_offset(TOPIC, q)
                while offset < end:
                    r = await c.pull("members_check", TOPIC, q, offset, 32)
                    assert r.code == 0, f"queue {q} offset {offset}: {r.status}"
                    for m in r.messages:
                        assert m.queue_offset == offset, f"queue {q}: offset {m.queue_offset} after {offset - 1}"
                        seen[m.body] = (q, m.queue_offset)
                        offset += 1
        finally:
            c.close()
        lost = [b for b in producer.acked if b not in seen]
        moved = [b for b, v in producer.acked.items() if seen.get(b) != v]
        with capsys.disabled():
            print(f"\nrocketmq membership (process): {len(producer.acked)} acknowledged sends; {slave} replaced "
                  f"by n3, master {old_master} replaced by n4, new master {new_master}; route {expect}")
        assert registered_as_learner == []
        for mid in ("n3", "n4"):  # each new member waited as a learner, then for its promotion, then registered
            steps = [line.split("name-server registration: ", 1)[1].split(" (")[0]
                     for line in group.log_lines(mid, "name-server registration:")]
            assert steps[:1] == ["wait"] and "register" in steps, (mid, steps)
            assert any("a learner" in line for line in group.log_lines(mid, "registration: wait")), mid
        assert all(withdrawn.get(mid) for mid in (slave, old_master)), withdrawn
        assert lost == [] and moved == []
    finally:
        if producer is not None:
            producer.stop = True
            if running is not None:
                await running
            producer.close()
        await admin.close()
        await group.stop_all()
        group.close()
        await ns.stopService()
