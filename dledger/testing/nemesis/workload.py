"""What the log and kv workloads share: their clients, their stop, and how their outcomes are tallied.

A workload runs ``clients`` loops against the group, each recording operations in a history and a
``(invoked, completed, outcome)`` span per operation; the summary table counts the spans under the faults
they overlapped (:func:`dledger.testing.nemesis.tally.attribute`).
"""

from __future__ import annotations

import random
from typing import Any

from twisted.internet.defer import Deferred, gatherResults

from dledger.testing.nemesis.tally import attribute


class ClientWorkload:
    """Base of a workload driving dledger clients (subclasses give ``history`` and the per-client loop)."""

    #: Whether the clients may resend an append whose outcome is unknown (the log workload: never).
    at_least_once = True

    def __init__(self, run: Any, peers: str, rng: random.Random, clients: int, history: Any):
        self.run, self.peers, self.rng, self.n = run, peers, rng, clients
        self.reactor = run.reactor
        self.history = history
        self.running = False
        self.spans: list[tuple[float, float | None, str]] = []
        self.done: Deferred | None = None
        self.clients: list = []

    def connect(self) -> list:
        """One client per loop, with the short timeouts and bounded retries a nemesis run needs."""
        from dledger.client import connect

        self.running = True
        self.clients = [connect(self.peers, "g0", reactor=self.reactor, request_timeout=2.0, connect_timeout=1.0,
                                max_attempts=4, retry_delay=0.05, at_least_once=self.at_least_once)
                        for _ in range(self.n)]
        return self.clients

    async def stop(self) -> None:
        self.running = False
        if self.done is not None:
            await self.done
        await gatherResults([c.close() for c in self.clients])

    def tally(self, result: Any, ok: int, timeouts: int) -> None:
        """Fill ``result``'s counts from the history (``ok`` and ``timeouts`` counted by the subclass)."""
        result.ops = len(self.history.ops)
        result.ok = ok
        result.timeouts = timeouts
        result.failed = result.ops - ok
        attribute(result, self.spans)
        self.run.workload_result = self.history
