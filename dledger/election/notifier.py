"""Delivers role changes to application handlers one at a time, in order, off the elector's path."""

from __future__ import annotations

from collections import deque

from twisted.internet.defer import Deferred, inlineCallbacks, maybeDeferred, succeed
from twisted.logger import Logger

from dledger.codes import Role

log = Logger()


class RoleChangeNotifier:
    """Queues ``(term, role)`` transitions and calls every handler for each, serially.

    A handler may return a Deferred; later handlers and later transitions
    wait for it, but the elector never does: ``notify`` only enqueues.
    A failing handler is logged and does not stop the others.
    """

    def __init__(self, member_id: str = "?"):
        self.member_id = member_id
        self.handlers: list = []
        self._queue: deque[tuple[int, Role]] = deque()
        self._running: Deferred | None = None
        self._stopped = False

    def add(self, handler) -> None:
        self.handlers.append(handler)

    def notify(self, term: int, role: Role) -> None:
        if self._stopped or not self.handlers:
            return
        self._queue.append((term, role))
        if self._running is None:
            running = self._drain()
            # A drain whose handlers all answered at once has already finished (its ``finally`` ran before
            # this assignment): keeping its fired Deferred would make every later notify() only enqueue.
            self._running = None if running.called else running

    @inlineCallbacks
    def _drain(self):
        try:
            while self._queue and not self._stopped:
                term, role = self._queue.popleft()
                for handler in list(self.handlers):
                    try:
                        yield maybeDeferred(handler.role_changed, term, role)
                    except Exception:
                        log.failure("{id}: role-change handler {h!r} failed for {role} in term {term}",
                                    id=self.member_id, h=handler, role=role.name, term=term)
        finally:
            self._running = None

    def idle(self) -> Deferred:
        """Fires when every queued transition has been delivered."""
        if self._running is None:
            return succeed(None)
        d = Deferred()
        self._running.addBoth(lambda r: (d.callback(None), r)[1])
        return d

    def stop(self) -> None:
        """Drop transitions not yet delivered (the member is shutting down)."""
        self._stopped = True
        self._queue.clear()
