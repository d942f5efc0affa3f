"""The log workload: several clients appending and reading concurrently, every operation in a history.

Each client has its own connection (``dledger.client.connect``) with a 2 s request timeout and up to 4
attempts; appends are never retried once their fate is unknown (``at_least_once=False``: a TIMEOUT is an
indeterminate operation in the history, as in Jepsen), so every body is in the log at most once. Reads ask
for an index around the highest one seen so far (a little below: committed reads; a little above: the
leader's ReadIndex path, where a stale leader would answer "not there yet"); half of them go through the
client (which finds the leader), half straight to a random member, as from a client connected to that member
(Jepsen's clients are bound to nodes): so a deposed leader that still believes it leads gets asked. A GET skips
NOOPs, so a read is recorded at the index of the entry it returned.
"""

from __future__ import annotations

import random
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from zope.interface import implementer

from dledger.errors import DLedgerError
from dledger.interfaces import INemesisWorkload
from dledger.testing.checker import History
from dledger.testing.nemesis.workload import ClientWorkload


@implementer(INemesisWorkload)
class LogWorkload(ClientWorkload):
    at_least_once = False  # an append of unknown outcome is never resent: each body is in the log at most once

    def __init__(self, run: Any, peers: str, rng: random.Random, clients: int):
        super().__init__(run, peers, rng, clients, History())
        self.top = 0

    async def start(self) -> None:
        clients = self.connect()
        self.done = gatherResults([Deferred.fromCoroutine(self._loop(k, c)) for k, c in enumerate(clients)])

    async def _loop(self, k: int, client: Any) -> None:
        seq = 0
        name = f"c{k}"
        while self.running:
            now = self.reactor.seconds
            if self.rng.random() < 0.6:
                body = f"nemesis {name} {seq}".encode()
                seq += 1
                op = self.history.invoke("append", name, now(), body=body)
                try:
                    resp = await client.append(body)
                except DLedgerError as exc:
                    History.complete(op, now(), ok=False, error=exc.code.name)
                else:
                    History.complete(op, now(), ok=True, index=resp.index)
                    self.top = max(self.top, resp.index)
            else:
                index = max(0, self.rng.randint(self.top - 3, self.top + 3))
                op = self.history.invoke("get", name, now(), index=index)
                try:
                    if self.rng.random() < 0.5:
                        entries = await client.get(index, 1)
                    else:  # as a client connected to one member: a stale leader answers it itself
                        entries = await self._get_from(client, self.rng.choice(self.run.ids), index)
                except DLedgerError as exc:
                    History.complete(op, now(), ok=False, error=exc.code.name)
                else:
                    if entries:
                        History.complete(op, now(), ok=True, index=entries[0].index, result=entries[0].body)
                        self.top = max(self.top, entries[0].index)
                    else:
                        History.complete(op, now(), ok=False, error="NOOP_OR_SKIPPED")
            self.spans.append((op.invoked, op.completed, "ok" if op.ok else
                               "timeout" if op.error == "TIMEOUT" else "failed"))
            await deferLater(self.reactor, self.rng.uniform(0.002, 0.02), lambda: None)

    async def _get_from(self, client: Any, member: str, index: int) -> list:
        from dledger.codes import ResponseCode
        from dledger.messages import GetEntriesRequest
        req = GetEntriesRequest(group="g0", remote_id=member, begin_index=index, max_size=1)
        resp = await client.transport.send(member, req, timeout=2.0)
        if resp.response_code is not ResponseCode.SUCCESS:
            raise DLedgerError(resp.response_code, f"GET {index} from {member}")
        return resp.entries

    async def finish(self, result: Any) -> None:
        ops = self.history.ops
        self.tally(result, sum(1 for op in ops if op.ok), sum(1 for op in ops if op.error == "TIMEOUT"))
