"""A deterministic clock for simulations: ``task.Clock`` semantics on a heap.

``twisted.internet.task.Clock`` re-sorts its list on every ``callLater`` and
runs everything due in one ``advance`` with ``seconds()`` already at the end
of the step.  Simulations schedule tens of thousands of calls (a timeout per
message), so :class:`SimClock` keeps them in a heap and runs each call at
its own time: ``seconds()`` inside a call is the time it was scheduled for.
"""

from __future__ import annotations

import heapq
import itertools

from twisted.internet.base import DelayedCall
from twisted.internet.interfaces import IReactorTime
from zope.interface import implementer


@implementer(IReactorTime)
class SimClock:
    """Virtual time. ``advance(dt)`` runs every call due within ``dt``, in time order, then stops."""

    def __init__(self, start: float = 0.0):
        self.rightNow = start
        self._heap: list[tuple[float, int, DelayedCall]] = []
        self._seq = itertools.count()
        self.calls_run = 0

    def seconds(self) -> float:
        return self.rightNow

    def callLater(self, delay, callable, *args, **kw) -> DelayedCall:
        dc = DelayedCall(self.rightNow + delay, callable, args, kw, self._cancelled, self._moved,
                         seconds=self.seconds)
        heapq.heappush(self._heap, (dc.time, next(self._seq), dc))
        return dc

    def _cancelled(self, dc: DelayedCall) -> None:
        pass  # skipped lazily when popped

    def _moved(self, dc: DelayedCall) -> None:
        heapq.heappush(self._heap, (dc.time, next(self._seq), dc))

    def getDelayedCalls(self):
        return [dc for _, _, dc in self._heap if dc.active()]

    def _next(self) -> DelayedCall | None:
        heap = self._heap
        while heap:
            time, _, dc = heap[0]
            if dc.cancelled or dc.called or dc.time != time:
                heapq.heappop(heap)
                continue
            if dc.delayed_time:
                heapq.heappop(heap)
                dc.activate_delay()
                heapq.heappush(heap, (dc.time, next(self._seq), dc))
                continue
            return dc
        return None

    def next_time(self) -> float | None:
        """When the next call is due, or None if nothing is scheduled."""
        dc = self._next()
        return None if dc is None else dc.time

    def advance(self, amount: float) -> None:
        self.run_until(self.rightNow + amount)

    def run_until(self, when: float, stop=None) -> bool:
        """Run calls due up to ``when`` (or until ``stop()`` is true); returns whether ``stop`` fired."""
        heap = self._heap
        while True:
            if stop is not None and stop():
                return True
            dc = self._next()
            if dc is None or dc.time > when:
                break
            heapq.heappop(heap)
            self.rightNow = max(self.rightNow, dc.time)
            dc.called = 1
            self.calls_run += 1
            dc.func(*dc.args, **dc.kw)
        self.rightNow = max(self.rightNow, when)
        return stop is not None and stop()

    def pump(self, timings) -> None:
        for amount in timings:
            self.advance(amount)
