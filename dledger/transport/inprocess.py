"""An in-process network with fault injection, for tests, simulations and embedded groups.

Members in one process exchange messages through the reactor (or a
``task.Clock``), never by direct synchronous calls, so re-entrancy is the
same as on a real network.  The network can partition members (symmetric and
one-way), crash and restart them, and drop, delay, duplicate and reorder
messages.  Every random choice comes from one seeded ``random.Random``, so a
failing run replays exactly from its seed.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass

from twisted.internet.defer import Deferred, fail, succeed
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.hookspecs import hookimpl
from dledger.interfaces import ITransport
from dledger.plugin_types import TransportType
from dledger.transport.base import answer

DEFAULT_TIMEOUT = 3.0


@dataclass
class FaultSettings:
    """Message-level faults; delays are seconds, probabilities per message."""

    min_delay: float = 0.0002
    max_delay: float = 0.001
    loss: float = 0.0
    duplicate: float = 0.0


@dataclass
class NetworkStats:
    sent: int = 0
    delivered: int = 0
    dropped: int = 0
    duplicated: int = 0


class InProcessNetwork:
    """The wires between in-process members."""

    def __init__(self, clock, seed: int = 0, faults: FaultSettings | None = None,
                 default_timeout: float = DEFAULT_TIMEOUT):
        self.clock = clock
        self.rng = random.Random(seed)
        self.faults = faults or FaultSettings()
        self.default_timeout = default_timeout
        self.stats = NetworkStats()
        self._handlers: dict[str, object] = {}
        self._incarnation: dict[str, int] = {}
        self._blocked: set[tuple[str, str]] = set()
        self._drops: list = []  # predicates (src, dst, request) -> bool: matching messages are lost
        self._timers: set = set()  # request timeouts still armed, cancelled by close()

    # -- membership -------------------------------------------------------------
    def transport(self, member_id: str) -> InProcessTransport:
        """The transport member ``member_id`` uses on this network."""
        self._incarnation.setdefault(member_id, 0)
        return InProcessTransport(self, member_id)

    def _attach(self, member_id: str, handler) -> None:
        self._handlers[member_id] = handler

    def _detach(self, member_id: str) -> None:
        self._handlers.pop(member_id, None)
        self._incarnation[member_id] = self._incarnation.get(member_id, 0) + 1

    def is_up(self, member_id: str) -> bool:
        return member_id in self._handlers

    # -- faults -------------------------------------------------------------------
    def crash(self, member_id: str) -> None:
        """Cut a member off: messages in flight to or from it are lost (its server must be stopped too)."""
        self._detach(member_id)

    def block(self, src: str, dst: str) -> None:
        """Drop every message from ``src`` to ``dst`` (one-way partition)."""
        self._blocked.add((src, dst))

    def unblock(self, src: str, dst: str) -> None:
        self._blocked.discard((src, dst))

    def drop_matching(self, predicate) -> Callable[[], None]:
        """Lose every message for which ``predicate(src, dst, request)`` holds; returns the call that stops it.

        For scenarios that need one kind of message lost (a COMMIT push, say) while the rest flows.
        """
        self._drops.append(predicate)
        return lambda: predicate in self._drops and self._drops.remove(predicate)

    def partition(self, *groups) -> None:
        """Split members into groups that cannot reach each other (members not named form one more group)."""
        everyone = set(self._incarnation)
        named = [set(g) for g in groups]
        rest = everyone - set().union(*named)
        if rest:
            named.append(rest)
        for a in named:
            for b in named:
                if a is not b:
                    for x in a:
                        for y in b:
                            self._blocked.add((x, y))

    def isolate(self, member_id: str) -> None:
        """Cut one member off from everyone else, both ways."""
        self.partition([member_id])

    def heal(self) -> None:
        """Remove every partition and block (crashed members stay down)."""
        self._blocked.clear()

    def can_reach(self, src: str, dst: str) -> bool:
        return (src, dst) not in self._blocked and dst in self._handlers

    # -- delivery -------------------------------------------------------------------
    def _delay(self) -> float:
        f = self.faults
        return f.min_delay + self.rng.random() * (f.max_delay - f.min_delay)

    def _lost(self) -> bool:
        return self.faults.loss > 0 and self.rng.random() < self.faults.loss

    def send(self, src: str, dst: str, request, timeout: float | None) -> Deferred:
        if dst not in self._incarnation:
            return fail(DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"no member {dst!r} on this network"))
        self.stats.sent += 1
        d: Deferred = Deferred()
        timeout = self.default_timeout if timeout is None else timeout
        timer = self.clock.callLater(timeout, self._expire, d, src, dst)
        self._timers.add(timer)
        d.addBoth(self._settled, timer)
        epoch = (self._incarnation.get(src, 0), self._incarnation[dst])
        if dst not in self._handlers:
            # Connection refused: fail fast, like a closed port.
            self.clock.callLater(self._delay(), self._refuse, d, timer, dst)
            return d
        copies = 1
        if self.faults.duplicate > 0 and self.rng.random() < self.faults.duplicate:
            copies = 2
            self.stats.duplicated += 1
        for _ in range(copies):
            if (src, dst) in self._blocked or self._lost() or any(p(src, dst, request) for p in self._drops):
                self.stats.dropped += 1
                continue
            self.clock.callLater(self._delay(), self._deliver, d, timer, src, dst, request, epoch)
        return d

    def _settled(self, result, timer):
        self._timers.discard(timer)
        return result

    def close(self) -> None:
        """Cancel every pending request timeout (the network is being thrown away)."""
        for timer in list(self._timers):
            if timer.active():
                timer.cancel()
        self._timers.clear()

    def _current(self, src: str, dst: str, epoch: tuple[int, int]) -> bool:
        return (self._incarnation.get(src, 0), self._incarnation.get(dst, 0)) == epoch

    def _expire(self, d: Deferred, src: str, dst: str) -> None:
        if not d.called:
            d.errback(DLedgerError(ResponseCode.TIMEOUT, f"{src} -> {dst}: no reply"))

    def _refuse(self, d: Deferred, timer, dst: str) -> None:
        if not d.called:
            if timer.active():  # close() may have cancelled it already (the network was thrown away)
                timer.cancel()
            d.errback(DLedgerError(ResponseCode.NETWORK_ERROR, f"{dst} is down"))

    def _deliver(self, d, timer, src, dst, request, epoch) -> None:
        handler = self._handlers.get(dst)
        if handler is None or not self._current(src, dst, epoch) or (src, dst) in self._blocked:
            self.stats.dropped += 1
            return
        self.stats.delivered += 1
        answer(handler, copy.copy(request), refusals=True).addCallback(self._reply, d, timer, src, dst, epoch)

    def _reply(self, response, d, timer, src, dst, epoch) -> None:
        if not self._current(src, dst, epoch) or (dst, src) in self._blocked or self._lost():
            self.stats.dropped += 1
            return
        self.clock.callLater(self._delay(), self._arrive, response, d, timer, src, dst, epoch)

    def _arrive(self, response, d, timer, src, dst, epoch) -> None:
        if d.called or not self._current(src, dst, epoch):
            return
        if timer.active():  # close() may have cancelled it already
            timer.cancel()
        if isinstance(response, DLedgerError):  # a plugin's refusal, with its reason (base.answer)
            d.errback(response)
            return
        d.callback(copy.copy(response))


@implementer(ITransport)
class InProcessTransport:
    """One member's end of an :class:`InProcessNetwork`."""

    def __init__(self, network: InProcessNetwork, member_id: str):
        self.network = network
        self.member_id = member_id
        self.handler = None

    def start(self, handler):
        self.handler = handler
        self.network._attach(self.member_id, handler)
        return succeed(None)

    def stop(self):
        if self.network._handlers.get(self.member_id) is self.handler:
            self.network._detach(self.member_id)
        return succeed(None)

    def send(self, peer_id: str, request, timeout: float | None = None) -> Deferred:
        return self.network.send(self.member_id, peer_id, request, timeout)


def make_inprocess_transport(config, reactor, network: InProcessNetwork | None = None, **_kw):
    """Factory for the ``inprocess`` transport type; members of one group must share ``network``."""
    if network is None:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "the inprocess transport needs a shared network=")
    return network.transport(config.self_id)


@hookimpl
def dledger_transport_types():
    return [TransportType("inprocess", make_inprocess_transport,
                          "members in one process on a simulated, fault-injecting network")]
