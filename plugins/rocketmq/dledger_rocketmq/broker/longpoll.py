"""Long polling: pulls that found nothing are held until a message arrives (RocketMQ's PullRequestHoldService).

A PULL_MESSAGE with the SUSPEND flag that would be answered PULL_NOT_FOUND
(the consumer is at the end of its queue) is parked here instead of being
answered.  It is answered by running the pull again (without suspending):

* as soon as the dispatcher adds a unit to its (topic, queue) past the
  pull's offset (the dispatcher's ``arrival_listeners`` call
  :meth:`PullHolds.arrived`; event-driven, no re-check loop: RocketMQ
  re-checks every 5 s, so it answers a timed-out hold up to 5 s late);
* when ``suspendTimeoutMillis`` has passed (then usually PULL_NOT_FOUND,
  as recorded);
* when the broker's role changes or the port stops (:meth:`answer_all`):
  the client gets its answer now and asks again, of the new master if
  routes changed, instead of waiting out its timeout.

A held pull whose connection closes is dropped (:meth:`drop_connection`):
nobody is left to answer.  Slaves hold pulls too: they serve committed
messages, and their queues grow from the same commit feed, so the wake-up
works the same.  A woken pull may still find nothing for its tags: it is
answered PULL_RETRY_IMMEDIATELY with the next offset past the units it
skipped, as RocketMQ does, and the consumer asks again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

log = Logger()

#: RocketMQ's shortPollingTimeMills, used when a pull asks for no (or a negative) suspend time.
SHORT_POLLING_MS = 1000
#: Upper bound on one hold (a hostile suspendTimeoutMillis must not park a request for days).
MAX_SUSPEND_MS = 60_000


def hold_seconds(suspend_timeout_ms: int) -> float:
    """How long a pull is held: its suspendTimeoutMillis, bounded to (0, MAX_SUSPEND_MS]; none -> short polling."""
    ms = suspend_timeout_ms if suspend_timeout_ms > 0 else SHORT_POLLING_MS
    return min(ms, MAX_SUSPEND_MS) / 1000.0


def should_hold(code: int, sys_flag: int, allow_suspend: bool, *, pull_not_found: int = 19,
                suspend_flag: int = 2) -> bool:
    """Hold only a first attempt (not a re-run) with the SUSPEND flag that would be answered PULL_NOT_FOUND."""
    return allow_suspend and code == pull_not_found and bool(sys_flag & suspend_flag)


def wakes(held_offset: int, max_offset: int) -> bool:
    """A message past the held pull's offset has arrived (RocketMQ: newestOffset > pullFromThisOffset)."""
    return max_offset > held_offset


@dataclass(eq=False)
class HeldPull:
    topic: str
    queue_id: int
    offset: int
    conn: Any
    rerun: Callable[[], Any]  # -> Reply (the pull again, not suspending)
    deferred: Deferred = field(default_factory=Deferred)
    timer: Any = None


class PullHolds:
    """The held pulls of one port, by (topic, queue id)."""

    def __init__(self, clock: Any):
        self.clock = clock
        self._held: dict[tuple[str, int], list[HeldPull]] = {}
        self.woken = 0
        self.expired = 0

    def __len__(self) -> int:
        return sum(len(v) for v in self._held.values())

    def hold(self, topic: str, queue_id: int, offset: int, timeout_s: float, conn: Any,
             rerun: Callable[[], Any]) -> Deferred:
        """Park a pull; the Deferred fires with the reply of ``rerun()`` when it is answered."""
        held = HeldPull(topic, queue_id, offset, conn, rerun)
        held.timer = self.clock.callLater(timeout_s, self._timed_out, held)
        self._held.setdefault((topic, queue_id), []).append(held)
        return held.deferred

    def arrived(self, topic: str, queue_id: int, max_offset: int) -> None:
        """Dispatcher listener: units were added to (topic, queue); answer the pulls they are for."""
        waiting = self._held.get((topic, queue_id))
        if not waiting:
            return
        ready = [h for h in waiting if wakes(h.offset, max_offset)]
        if not ready:
            return
        rest = [h for h in waiting if not wakes(h.offset, max_offset)]
        if rest:
            self._held[(topic, queue_id)] = rest
        else:
            del self._held[(topic, queue_id)]
        for held in ready:
            self.woken += 1
            self._answer(held)

    def _timed_out(self, held: HeldPull) -> None:
        held.timer = None
        if self._remove(held):
            self.expired += 1
            self._answer(held)

    def _remove(self, held: HeldPull) -> bool:
        key = (held.topic, held.queue_id)
        waiting = self._held.get(key, [])
        if held not in waiting:
            return False
        waiting.remove(held)
        if not waiting:
            del self._held[key]
        return True

    def _answer(self, held: HeldPull) -> None:
        if held.timer is not None and held.timer.active():
            held.timer.cancel()
        held.timer = None
        if held.deferred.called:
            return
        try:
            reply = held.rerun()
        except Exception as exc:  # the port answers SYSTEM_ERROR and logs, as for any failing handler
            held.deferred.errback(exc)
            return
        held.deferred.callback(reply)

    def drop_connection(self, conn: Any) -> int:
        """The connection closed: forget its held pulls (their replies could go nowhere); how many."""
        dropped = 0
        for key in list(self._held):
            keep = []
            for held in self._held[key]:
                if held.conn is conn:
                    if held.timer is not None and held.timer.active():
                        held.timer.cancel()
                    held.timer = None
                    dropped += 1
                else:
                    keep.append(held)
            if keep:
                self._held[key] = keep
            else:
                del self._held[key]
        return dropped

    def answer_all(self) -> int:
        """Answer every held pull now (role change, port stop); how many."""
        everything = [h for hs in self._held.values() for h in hs]
        self._held.clear()
        for held in everything:
            self._answer(held)
        return len(everything)
