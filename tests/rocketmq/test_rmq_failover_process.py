"""Real processes: 3 ``twistd dledger`` members with the broker plugin; the master is SIGKILLed twice under load.

A producer sends one message at a time to whichever member is master and a
consumer pulls and commits offsets, both through the broker ports, while the
master's process is killed (and restarted) twice.  Afterwards every member is
read back through its own broker port (a slave serves committed pulls):

* no acknowledged message is lost, and each keeps the queue offset and
  physical offset (msgId) its send was acknowledged with, on every member;
* the consumer never skipped a queue offset, and an offset committed (and
  acknowledged) before a kill is what the new master answers -- the
  duplicates this costs are counted and printed (target 0: offsets go
  through the dledger log, not RocketMQ's 10 s slave sync);
* every "became master" line shows the log end, committed index and
  dispatched index equal: the switch waited for catch-up.
"""

from __future__ import annotations

import re

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import RocketMQError, connect
from dledger_rocketmq.common.message import message_id
from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from dledger.launcher import LocalGroup, durable_store, free_ports

STORE = durable_store()
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
]

TOPIC = "FailoverTopic"
GROUP = "failover_cg"
QUEUES = 2
KILLS = 2
#: Acknowledged sends to wait for before each kill and after each new master (keeps the test short but loaded).
SENDS_PER_PHASE = 150
COMMIT_EVERY = 20
RETRY = 0.02  # seconds between attempts of a loop that found no master (bounded by the phase deadlines)


class Brokers:
    """The group's broker ports: one cached client per member, the master found by asking."""

    def __init__(self, reactor, group: LocalGroup, ports: dict[str, int]):
        self.reactor, self.group, self.ports = reactor, group, ports
        self.clients: dict[str, object] = {}

    async def client(self, mid: str):
        c = self.clients.get(mid)
        if c is not None and c.protocol is not None:
            return c
        c = await connect(self.reactor, "127.0.0.1", self.ports[mid], timeout=2.0, producer_group="failover_pg")
        self.clients[mid] = c
        return c

    def drop(self, mid: str) -> None:
        c = self.clients.pop(mid, None)
        if c is not None:
            c.close()

    def close(self) -> None:
        for mid in list(self.clients):
            self.drop(mid)


class Load:
    """Producer and consumer loops; the producer finds each new master (by sending to the dledger leader until
    its broker takes the send), the consumer follows it; both stop when told and done."""

    def __init__(self, reactor, brokers: Brokers, live: set[str], consumer_brokers: Brokers, leader):
        # Producer and consumer have their own connections (as separate client instances would): one failing
        # request must not close the other's connection.
        self.reactor, self.brokers, self.live = reactor, brokers, live
        self.consumer_brokers = consumer_brokers
        self.leader = leader  # async () -> the dledger leader's id, or None
        self.master: str | None = None
        self.acked: dict[bytes, tuple[int, int, str]] = {}  # body -> (queue id, queue offset, msgId)
        self.ack_times: list[float] = []
        self.received: dict[int, list[tuple[int, bytes]]] = {q: [] for q in range(QUEUES)}
        self.committed: dict[int, int] = dict.fromkeys(range(QUEUES), 0)  # last offset commit acknowledged
        self.requeried_behind = 0  # messages an acknowledged commit should have spared
        self.stop_producing = False
        self.stop_consuming = False
        self.errors: list[str] = []
        self.pulls: list[tuple] = []  # (member, queue, offset, code, offsets got, next begin, min, max)

    async def produce(self) -> None:
        i = 0
        while not self.stop_producing:
            body = b"failover-%06d" % i
            queue_id = i % QUEUES
            mid = self.master
            if mid is None:
                mid = await self.leader()
                if mid is None or mid not in self.live:
                    await deferLater(self.reactor, RETRY, lambda: None)
                    continue
            try:
                c = await self.brokers.client(mid)
                r = await c.send(TOPIC, body, queue_id=queue_id, tags="TagA")
            except RocketMQError as exc:
                if exc.code != 14:  # SERVICE_NOT_AVAILABLE: a slave, or a leader not yet master
                    self.brokers.drop(mid)
                self.master = None
                await deferLater(self.reactor, RETRY, lambda: None)
                continue
            except Exception:
                self.brokers.drop(mid)
                self.master = None
                continue
            self.master = mid
            self.acked[body] = (r.queue_id, r.queue_offset, r.msg_id)
            self.ack_times.append(self.reactor.seconds())
            i += 1

    async def consume(self) -> None:
        offsets: dict[int, int] | None = None
        since_commit = 0
        while True:
            mid = self.master
            if mid is None:
                if self.stop_consuming:
                    return
                await deferLater(self.reactor, RETRY, lambda: None)
                continue
            try:
                c = await self.consumer_brokers.client(mid)
                if offsets is None:  # (re)started: resume from what the master says the group committed
                    offsets = {}
                    for q in range(QUEUES):
                        stored = await c.query_offset(GROUP, TOPIC, q)
                        self.pulls.append((mid, q, "query", stored, self.committed[q]))
                        offsets[q] = stored
                        self.requeried_behind += max(0, self.committed[q] - stored)
                progressed = False
                for q in range(QUEUES):
                    try:
                        r = await c.pull(GROUP, TOPIC, q, offsets[q], 32)
                    except RocketMQError as exc:
                        if exc.code == 17:  # TOPIC_NOT_EXIST: no message sent yet (its creation is in the log)
                            continue
                        raise
                    self.pulls.append((mid, q, offsets[q], r.code, [m.queue_offset for m in r.messages],
                                       r.next_begin_offset, r.min_offset, r.max_offset))
                    if r.code == 0:
                        expected = offsets[q]
                        for m in r.messages:
                            if m.queue_offset != expected:
                                self.errors.append(f"queue {q}: got offset {m.queue_offset}, expected {expected}")
                            self.received[q].append((m.queue_offset, m.body))
                            expected = m.queue_offset + 1
                        if r.next_begin_offset != expected:  # every message matches "*": nothing may be skipped
                            self.errors.append(f"{mid} queue {q}: next begin {r.next_begin_offset} after "
                                               f"offsets {offsets[q]}..{expected - 1}")
                        offsets[q] = r.next_begin_offset
                        since_commit += len(r.messages)
                        progressed = True
                    elif r.code == 20 and r.next_begin_offset != offsets[q]:
                        self.errors.append(f"{mid} queue {q}: no match at {offsets[q]}, next {r.next_begin_offset}")
                        offsets[q] = r.next_begin_offset
                    elif r.code == 21:
                        self.errors.append(f"queue {q}: offset {offsets[q]} moved to {r.next_begin_offset}")
                        offsets[q] = r.next_begin_offset
                if since_commit >= COMMIT_EVERY or not progressed:
                    for q in range(QUEUES):
                        if offsets[q] != self.committed[q]:
                            await c.commit_offset(GROUP, TOPIC, q, offsets[q])
                            self.committed[q] = offsets[q]
                    since_commit = 0
                if not progressed:
                    if self.stop_consuming:
                        return
                    await deferLater(self.reactor, RETRY, lambda: None)
            except Exception:
                # The master died or stepped down: forget the local positions, as a push consumer whose
                # broker changed does, and resume from the new master's stored offsets.
                self.consumer_brokers.drop(mid)
                if self.master == mid:
                    self.master = None
                offsets = None


async def current_master(group: LocalGroup, admin, load: Load, ports, timeout: float) -> str:
    """Wait until the dledger leader's broker accepts a send as master; set ``load.master``."""
    load.master = await wait_for_master(group, admin, ports, topic=TOPIC + "Probe", timeout=timeout,
                                        live=load.live)
    return load.master


async def wait_sends(group: LocalGroup, load: Load, n: int, timeout: float, what: str) -> None:
    target = len(load.acked) + n
    await group.wait_for(lambda: len(load.acked) >= target, timeout, what)


@pytest_twisted.ensureDeferred
async def test_master_killed_twice_under_load_loses_and_skips_nothing(tmp_path, reactor, capsys):
    """SIGKILL of the master twice while producing and consuming: nothing lost, skipped, moved or re-sent."""
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    member_args = broker_port_args(ports)
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=member_args,
                       options={"plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0})
    admin = group.client(request_timeout=0.3)
    brokers = Brokers(reactor, group, ports)
    consumer_brokers = Brokers(reactor, group, ports)

    async def leader():
        try:
            return (await group.wait_for_leader(admin, 0.5)).leader_id
        except Exception:
            return None
    load = Load(reactor, brokers, set(group.ids), consumer_brokers, leader)
    try:
        await group.start_and_wait(30)
        await current_master(group, admin, load, ports, 20)
        running = [Deferred.fromCoroutine(load.produce()), Deferred.fromCoroutine(load.consume())]
        outages = []
        for k in range(KILLS):
            await wait_sends(group, load, SENDS_PER_PHASE, 30, f"{SENDS_PER_PHASE} sends before kill {k + 1}")
            victim = load.master
            acked_before = len(load.acked)
            load.live.discard(victim)
            killed_at = reactor.seconds()
            group.kill(victim)
            await group.wait_exit(victim, 10)
            brokers.drop(victim)
            consumer_brokers.drop(victim)
            load.master = None
            new = await current_master(group, admin, load, ports, 30)
            assert new != victim
            await wait_sends(group, load, 1, 30, f"a send after kill {k + 1}")
            first_ack = next(t for t in load.ack_times[acked_before:] if t >= killed_at)
            outages.append(first_ack - killed_at)
            await wait_sends(group, load, SENDS_PER_PHASE, 30, f"{SENDS_PER_PHASE} sends after kill {k + 1}")
            group.start(victim)
            load.live.add(victim)
            await group.wait_ready(admin, victim, 30)

        load.stop_producing = True
        await running[0]
        total = len(load.acked)
        # Every queue offset up to the last acknowledged one (a count would not do: sends whose answer was lost
        # in a kill may be stored too, without being acknowledged).
        ends = {q: max(o for _, o, _ in (v for v in load.acked.values() if v[0] == q)) + 1 for q in range(QUEUES)}

        def consumed_all():
            return all(set(range(ends[q])) <= {o for o, _ in load.received[q]} for q in range(QUEUES))
        try:
            await group.wait_for(consumed_all, 30, "the consumer to receive every acknowledged message")
        except TimeoutError:
            pass  # the assertions below say what was skipped
        load.stop_consuming = True
        await running[1]

        # -- every member, read through its own broker port once it holds the whole log ----------------------

        async def max_offsets(mid):
            try:
                c = await brokers.client(mid)
                return [await c.max_offset(TOPIC, q) for q in range(QUEUES)]
            except Exception:
                brokers.drop(mid)
                return None

        async def settled():
            """Every member's queues end at the same offsets, past every acknowledged message: the ends to compare.

            Sends whose answer was lost in a kill may still commit after the producer stopped, so a member
            read while its tail is dispatching would differ from the others past the acknowledged end without
            anything being wrong; once they agree, every message up to those ends is compared.
            """
            seen = [await max_offsets(mid) for mid in group.ids]
            if seen[0] is None or any(s != seen[0] for s in seen) or any(seen[0][q] < ends[q] for q in range(QUEUES)):
                return None
            return seen[0]
        agreed = await group.wait_for(settled, 30, "every member to dispatch the same queues, holding every "
                                      "acknowledged message")
        views = {}
        for mid in group.ids:
            c = await brokers.client(mid)
            view = {}
            for q in range(QUEUES):
                offset = 0
                while offset < agreed[q]:
                    r = await c.pull(GROUP + "_check", TOPIC, q, offset, 32)
                    assert r.code == 0, f"{mid} queue {q} offset {offset}: {r.status}"
                    for m in r.messages:
                        if m.queue_offset < agreed[q]:
                            view[m.body] = (q, m.queue_offset, message_id(m.store_host, m.physical_offset))
                    offset = r.next_begin_offset
            views[mid] = view

        lost = [b for b in load.acked if b not in views[group.ids[0]]]
        moved = {mid: [b for b, v in load.acked.items() if view.get(b) != v] for mid, view in views.items()}
        skipped = {q: sorted(set(range(ends[q])) - {o for o, _ in load.received[q]}) for q in range(QUEUES)}
        bodies = [b for q in range(QUEUES) for _, b in load.received[q]]
        duplicates = len(bodies) - len(set(bodies))
        switches = [line for mid in group.ids for line in group.log_lines(mid, "became master")]
        with capsys.disabled():
            print(f"\nrocketmq failover (process): {total} acknowledged sends, {KILLS} master kills, "
                  f"send outages {', '.join(f'{o:.2f}s' for o in outages)}, {duplicates} duplicate deliveries, "
                  f"{load.requeried_behind} re-deliveries below an acknowledged commit")
        assert load.errors == []
        assert lost == []
        assert all(not m for m in moved.values()), {mid: m[:3] for mid, m in moved.items()}
        first = views[group.ids[0]]
        assert all(views[mid] == first for mid in group.ids), {  # the first differences: body -> each view's
            mid: sorted((k, first.get(k), v.get(k)) for k in set(first) | set(v) if first.get(k) != v.get(k))[:5]
            for mid, v in views.items() if v != first}
        assert all(not s for s in skipped.values()), (skipped, [p for p in load.pulls if p[1] in skipped and (
            p[2] == "query" or any(p[2] - 3 <= o <= p[5] for o in skipped[p[1]]))])
        # (member, queue, "query", offset answered, last acknowledged commit): the queries behind a commit
        assert load.requeried_behind == 0, [p for p in load.pulls if p[2] == "query" and p[3] < p[4]]
        assert len(switches) >= KILLS + 1
        for line in switches:
            m = re.search(r"log end (\d+), committed (\d+), dispatch caught up: (\w+)", line)
            assert m and m.group(1) == m.group(2) and m.group(3) == "True", line
    finally:
        load.stop_producing = load.stop_consuming = True
        brokers.close()
        consumer_brokers.close()
        await group.stop_all()
        group.close()
