"""Appends waiting on the leader for their entry to commit.

Deadlines are ``maxWaitAckTimeMs`` after the append, so they are ordered
like the indexes: a deque and one timer for the oldest replace a timer per
append.  The queue is bounded (``maxPendingRequestsNum``): past it appends
are refused with LEADER_PENDING_FULL instead of growing without bound.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.timing import due

log = Logger()


def _settle(waiter: tuple, code: int) -> None:
    """Answer one waiter with ``code``.

    An answer that raises is logged and goes no further: it is called from the commit path and the
    timers, and one bad answer (a plugin's, a closed connection's) must not stop the waiters after it.
    """
    _, _, answer, token, response = waiter
    response.code = code
    try:
        answer(token, response)
    except Exception:
        log.failure("answering the append waiting for index {index} failed", index=waiter[0])


class PendingAppends:
    """Waiters keyed by the index they wait for, resolved in index order."""

    def __init__(self, clock, wait_ack_timeout: float, limit: int):
        self.clock = clock
        self.timeout = wait_ack_timeout
        self.limit = limit
        #: (index, deadline, answer, token, response): ``answer(token, response)`` once resolved.
        self._queue: deque[tuple[int, float, Callable[[Any, Any], Any], Any, Any]] = deque()
        self._timer = None

    def __len__(self) -> int:
        return len(self._queue)

    def add(self, index: int, response) -> Deferred:
        """Deferred firing with ``response`` (code SUCCESS) once ``index`` commits, or with an error code."""
        d: Deferred = Deferred()
        self.add_answer(index, response, Deferred.callback, d)
        return d

    def add_answer(self, index: int, response, answer: Callable[[Any, Any], Any], token: Any) -> None:
        """As :meth:`add`, but ``answer(token, response)`` is called instead of firing a Deferred.

        One plain call per request where a Deferred cost its creation and its
        callback chain (see :class:`~dledger.interfaces.IAnsweringRequestHandler`).
        """
        if self._queue and index < self._queue[-1][0]:
            raise AssertionError(f"pending index {index} after {self._queue[-1][0]}")
        self._queue.append((index, self.clock.seconds() + self.timeout, answer, token, response))
        if self._timer is None:
            self._timer = self.clock.callLater(self.timeout, self._expire)

    def resolve_upto(self, committed: int) -> int:
        """Succeed every waiter at or below ``committed``; returns how many."""
        n = 0
        q = self._queue
        success = int(ResponseCode.SUCCESS)
        while q and q[0][0] <= committed:
            _settle(q.popleft(), success)
            n += 1
        return n

    def _expire(self) -> None:
        self._timer = None
        now = self.clock.seconds()
        q = self._queue
        timeout = int(ResponseCode.WAIT_QUORUM_ACK_TIMEOUT)
        while q and due(q[0][1], now):
            _settle(q.popleft(), timeout)
        if q:
            self._timer = self.clock.callLater(max(0.0, q[0][1] - now), self._expire)

    def fail_all(self, code: ResponseCode) -> None:
        """Answer every waiter with ``code`` (TERM_CHANGED when leadership is lost)."""
        q, self._queue = self._queue, deque()
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        for waiter in q:
            _settle(waiter, int(code))
