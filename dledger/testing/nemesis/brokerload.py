"""The broker workload: producers and consumers through the name server, every send, pull, commit and resume
recorded (the rules are :mod:`.brokercheck`'s).

Producers use :class:`dledger_rocketmq.client.client.RouteClient` with ``retries=0`` and resend a body themselves
after a failure, up to 3 attempts, each attempt an event: so a body stored twice is allowed only when it was
sent twice. Consumers of one consumer group pull each queue of the topic from the master the route names,
commit their offset every few messages, and on any error start a new session that resumes from the offset the
broker answers (RocketMQ's at-least-once redelivery). At the end, with the faults healed, every queue is read
back from offset 0.
"""

from __future__ import annotations

import random
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from zope.interface import implementer

from dledger.interfaces import INemesisWorkload

TOPIC = "NemesisTopic"
CGROUP = "nemesis_cg"


@implementer(INemesisWorkload)
class BrokerWorkload:
    """Producers and consumers of one topic through the name server (see the module docstring)."""

    def __init__(self, run: Any, rng: random.Random, clients: int):
        from dledger_rocketmq.client.client import RouteClient
        self.run, self.rng = run, rng
        self.reactor = run.reactor
        self.namesrv = f"{run.net.addrs['namesrv']}:9876"
        self.producers = max(1, clients - 1)
        self.consumers = 1
        self.events: list[dict] = []
        self.spans: list[tuple[float, float | None, str]] = []
        self.running = False
        self.done: Deferred | None = None
        self.session = 0
        self.route_client = RouteClient

    def _rc(self):
        return self.route_client(self.reactor, self.namesrv, timeout=2.0, retries=0, route_ttl=1.0)

    async def start(self) -> None:
        from dledger_rocketmq.client.client import route_masters
        rc = self._rc()

        async def routed():
            try:
                route = await rc.route("TBW102", fresh=True)
            except Exception:
                return None
            return route_masters(route) or None
        await self.run.wait_for(routed, 90, "a master in the name server's route")

        probes = []

        async def created():
            try:
                probes.append(self.reactor.seconds())  # every attempt may store it: each is a send event
                await rc.send(TOPIC, b"nemesis probe")
                route = await rc.route(TOPIC, fresh=True)
            except Exception:
                return None
            return route_masters(route) or None
        await self.run.wait_for(created, 60, f"{TOPIC} on the broker", interval=0.3)
        rc.close()
        self.events += [{"t": "send", "body": "nemesis probe", "attempt": k, "inv": t, "done": t, "ok": False}
                        for k, t in enumerate(probes)]
        self.running = True
        loops = [self._produce(k) for k in range(self.producers)] + [self._consume(k) for k in range(self.consumers)]
        self.done = gatherResults([Deferred.fromCoroutine(c) for c in loops])

    async def _produce(self, k: int) -> None:
        rc = self._rc()
        seq = 0
        try:
            while self.running:
                body = f"nemesis p{k} {seq}"
                seq += 1
                for attempt in range(3):
                    e = {"t": "send", "body": body, "attempt": attempt, "inv": self.reactor.seconds()}
                    self.events.append(e)
                    try:
                        r = await rc.send(TOPIC, body.encode())
                    except Exception as exc:
                        e.update(done=self.reactor.seconds(), ok=False, error=type(exc).__name__ + f" {exc}"[:80])
                        timeout = "imeout" in e["error"]
                        self.spans.append((e["inv"], e["done"], "timeout" if timeout else "failed"))
                        rc.close()
                        rc = self._rc()
                        await deferLater(self.reactor, 0.1, lambda: None)
                        if not self.running:
                            break
                        continue
                    e.update(done=self.reactor.seconds(), ok=True, queue=f"{r.broker_name}/{r.queue_id}",
                             offset=r.queue_offset)
                    self.spans.append((e["inv"], e["done"], "ok"))
                    break
                await deferLater(self.reactor, self.rng.uniform(0.005, 0.03), lambda: None)
        finally:
            rc.close()

    async def _session(self, rc: Any) -> None:
        """Resume every queue from the broker's stored offset, then pull and commit until an error."""
        from dledger_rocketmq.client.client import message_queues, route_masters
        self.session += 1
        session = self.session
        route = await rc.route(TOPIC, fresh=True)
        queues = message_queues(route, write=False)
        masters = route_masters(route)
        offsets: dict[tuple[str, int], int] = {}
        for name, qid in queues:
            c = await rc._client(masters[name])
            inv = self.reactor.seconds()
            stored = await c.query_offset(CGROUP, TOPIC, qid)
            self.events.append({"t": "query", "queue": f"{name}/{qid}", "offset": stored, "inv": inv,
                                "done": self.reactor.seconds()})
            offsets[(name, qid)] = max(stored, 0)
        since = 0
        while self.running:
            got_any = False
            for (name, qid), offset in list(offsets.items()):
                c = await rc._client(masters[name])
                inv = self.reactor.seconds()
                p = await c.pull(CGROUP, TOPIC, qid, offset, 16)
                self.spans.append((inv, self.reactor.seconds(), "ok"))
                if p.messages:
                    got_any = True
                    self.events.append({"t": "pull", "session": session, "queue": f"{name}/{qid}", "from": offset,
                                        "offsets": [m.queue_offset for m in p.messages],
                                        "bodies": [m.body.decode("latin-1") for m in p.messages],
                                        "next": p.next_begin_offset})
                    since += len(p.messages)
                offsets[(name, qid)] = max(offset, p.next_begin_offset) if p.messages else offset
                if since >= 8 and offsets[(name, qid)] != offset:
                    since = 0
                    e = {"t": "commit", "queue": f"{name}/{qid}", "offset": offsets[(name, qid)],
                         "inv": self.reactor.seconds(), "ok": False}
                    self.events.append(e)
                    await c.commit_offset(CGROUP, TOPIC, qid, offsets[(name, qid)])
                    e.update(ok=True, done=self.reactor.seconds())
            await deferLater(self.reactor, 0.01 if got_any else 0.05, lambda: None)

    async def _consume(self, k: int) -> None:
        while self.running:
            rc = self._rc()
            try:
                await self._session(rc)
            except Exception:
                self.spans.append((self.reactor.seconds(), self.reactor.seconds(), "failed"))
                await deferLater(self.reactor, 0.2, lambda: None)
            finally:
                rc.close()

    async def stop(self) -> None:
        self.running = False
        if self.done is not None:
            await self.done

    async def read_back(self) -> dict[str, dict[int, str]]:
        """Every queue of the topic from offset 0 (a consumer group of its own), once a master serves them."""
        from dledger_rocketmq.client.client import message_queues, route_masters
        rc = self._rc()
        try:
            async def read():
                try:
                    route = await rc.route(TOPIC, fresh=True)
                    masters = route_masters(route)
                    out: dict[str, dict[int, str]] = {}
                    for name, qid in message_queues(route, write=False):
                        c = await rc._client(masters[name])
                        held = out.setdefault(f"{name}/{qid}", {})
                        offset, high = 0, await c.max_offset(TOPIC, qid)
                        while offset < high:
                            p = await c.pull("nemesis_final", TOPIC, qid, offset, 32)
                            if not p.messages:
                                break
                            held.update({m.queue_offset: m.body.decode("latin-1") for m in p.messages})
                            offset = p.next_begin_offset
                    return out
                except Exception:
                    rc.close()
                    return None
            return await self.run.wait_for(read, 60, "the queues read back", interval=0.5)
        finally:
            rc.close()

    async def finish(self, result: Any) -> None:
        from dledger.testing.nemesis.tally import attribute
        final = await self.read_back()
        result.ops = len(self.spans)
        result.ok = sum(1 for s in self.spans if s[2] == "ok")
        result.timeouts = sum(1 for s in self.spans if s[2] == "timeout")
        result.failed = result.ops - result.ok
        attribute(result, self.spans)
        self.run.workload_result = (self.events, final)
