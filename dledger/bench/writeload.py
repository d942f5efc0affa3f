"""A steady write load on a group, and what it shows afterwards: outages and lost or doubled entries.

Used by the membership process tests and ``dledger bench members`` (issue #23): ``writers`` loops
append one unique body at a time through their own client, each attempt a new body and a single try
(``max_attempts=1``, ``at_least_once=False``): so an acknowledged body must be in the log exactly once,
and a body whose attempt failed (refused, timed out, connection lost) at most once -- no retry can
store one twice.  The acknowledgement times give the longest stretch without one: the write outage.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from dledger.errors import DLedgerError

PREFIX = b"wl:"


@dataclass
class Outage:
    """The longest stretch between two acknowledged appends within a window, in seconds."""

    seconds: float
    start: float
    end: float


@dataclass
class LogCheck:
    """What the log read back says about the load's bodies."""

    acknowledged: int
    present: int
    missing: list[bytes] = field(default_factory=list)  # acknowledged, not in the log: lost
    doubled: list[bytes] = field(default_factory=list)  # in the log more than once
    unexpected: list[bytes] = field(default_factory=list)  # in the log, never sent

    @property
    def ok(self) -> bool:
        return not (self.missing or self.doubled or self.unexpected)

    def describe(self) -> str:
        return (f"{self.acknowledged} acknowledged, {self.present} load entries in the log, "
                f"{len(self.missing)} lost, {len(self.doubled)} doubled, {len(self.unexpected)} never sent"
                + (f" (first lost: {self.missing[:3]!r})" if self.missing else ""))


class WriteLoad:
    """``writers`` append loops on ``make_client()`` clients; :meth:`stop` ends them and closes the clients."""

    def __init__(self, reactor: Any, make_client, *, writers: int = 4, body_size: int = 64, pause: float = 0.02):
        self.reactor = reactor
        self.make_client = make_client
        self.writers = writers
        self.body_size = body_size
        self.pause = pause
        self.sent: set[bytes] = set()
        #: body -> reactor time of its acknowledgement
        self.acked: dict[bytes, float] = {}
        self.failed: Counter = Counter()
        self.running = False
        self._loops: list[Deferred] = []
        self._clients: list[Any] = []
        self.started_at = 0.0

    def start(self) -> None:
        self.running = True
        self.started_at = self.reactor.seconds()
        for w in range(self.writers):
            client = self.make_client()
            self._clients.append(client)
            self._loops.append(Deferred.fromCoroutine(self._loop(w, client)))

    async def _loop(self, w: int, client: Any) -> None:
        n = 0
        while self.running:
            body = (PREFIX + b"%d:%d:" % (w, n)).ljust(self.body_size, b".")
            n += 1
            self.sent.add(body)
            try:
                await client.append(body)
            except DLedgerError as exc:
                self.failed[exc.code.name] += 1
                await deferLater(self.reactor, self.pause, lambda: None)
                continue
            except Exception as exc:  # a connection torn down mid-request: unknown, counted, never fatal
                self.failed[type(exc).__name__] += 1
                await deferLater(self.reactor, self.pause, lambda: None)
                continue
            self.acked[body] = self.reactor.seconds()

    async def stop(self) -> None:
        self.running = False
        for d in self._loops:
            await d
        for c in self._clients:
            await c.close()

    def learn(self, configuration: Any) -> None:
        """Let every writer's client reach the members of ``configuration`` (new ones may lead next)."""
        for c in self._clients:
            c.learn(configuration)

    async def resumed(self, after: float, timeout: float = 60.0) -> float:
        """The time of the first acknowledgement later than ``after`` (waiting for it, up to ``timeout``).

        A window that is to hold a whole outage ends there: cut at the change's answer, it would miss
        the part of the outage that comes after (a removed leader handing over).
        """
        deadline = self.reactor.seconds() + timeout
        while True:
            later = [t for t in self.acked.values() if t > after]
            if later:
                return min(later)
            if self.reactor.seconds() >= deadline:
                raise TimeoutError(f"no acknowledged append within {timeout:g}s after the change")
            await deferLater(self.reactor, 0.01, lambda: None)

    def acks_between(self, start: float, end: float) -> int:
        return sum(1 for t in self.acked.values() if start <= t <= end)

    def longest_gap(self, start: float | None = None, end: float | None = None) -> Outage:
        """The longest time without an acknowledgement within ``[start, end]`` (window edges count as acks)."""
        start = self.started_at if start is None else start
        end = self.reactor.seconds() if end is None else end
        times = sorted(t for t in self.acked.values() if start <= t <= end)
        marks = [start, *times, end]
        best = Outage(0.0, start, start)
        for a, b in zip(marks, marks[1:], strict=False):
            if b - a > best.seconds:
                best = Outage(b - a, a, b)
        return best

    def check(self, bodies: Iterable[bytes]) -> LogCheck:
        """Compare the log's bodies (every entry, any kind) with what was sent and acknowledged."""
        counts = Counter(b for b in (bytes(x) for x in bodies) if b.startswith(PREFIX))
        return LogCheck(acknowledged=len(self.acked), present=len(counts),
                        missing=sorted(b for b in self.acked if counts[b] == 0),
                        doubled=sorted(b for b, n in counts.items() if n > 1),
                        unexpected=sorted(b for b in counts if b not in self.sent))


def load_client(group: Any, *, request_timeout: float = 1.0) -> Any:
    """A writer's client of a :class:`dledger.launcher.LocalGroup`: one try per body, no ambiguous retry."""
    return group.client(request_timeout=request_timeout, max_attempts=1, at_least_once=False)
