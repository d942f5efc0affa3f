"""Leader ready: this member leads *and* its term's first entry is committed.

A new leader may hold entries of earlier terms that are not known committed
yet; only once an entry of its own term commits (the NOOP it appends at the
start of its term, ``enableFastAdvanceCommitIndex``) is every earlier entry
committed too (Raft §5.4.2).  That is when an application on the leader can
trust its view of the log -- e.g. a broker rebuilding its tables before it
serves as master -- and the moment the ``leader_ready(term)`` event marks.

Detection is one comparison each time the committed index moves
(:meth:`LeaderReady.check`).  Delivery waits until every role change queued
before it has been delivered to the role-change handlers, so a handler sees
``LEADER`` before ``leader_ready``; an event whose leadership ended before it
could be delivered is dropped.  Listeners are called one at a time, in
order; one may return a Deferred, and the next listener (and the next
event) waits for it.
"""

from __future__ import annotations

from collections import deque

from twisted.internet.defer import inlineCallbacks, maybeDeferred
from twisted.logger import Logger

from dledger.codes import Role

log = Logger()


class LeaderReady:
    """Watches one server's leadership and commit index; tells ``ILeaderReadyListener``\\ s once per leadership."""

    def __init__(self, server):
        self.server = server
        self.listeners: list = []
        #: The term in which this member was last found leader-ready (None: never).
        self.ready_term: int | None = None
        # The leadership (its LeaderReplicator) found ready: a member that steps down and leads the same
        # term again (its log intact; only a restart moves it to a new term) is a new leadership and must be
        # announced again -- keying on the term alone left a broker slave forever after such a re-election.
        self._ready_leadership = None
        self._queue: deque[int] = deque()
        self._draining = False
        self._stopped = False

    @property
    def is_ready(self) -> bool:
        """This member leads now and its current term's first entry is committed."""
        st = self.server.state
        return (self._ready_leadership is not None and self._ready_leadership is self.server.replicator
                and st.role is Role.LEADER and st.curr_term == self.ready_term)

    def add(self, listener) -> None:
        """Register a listener; if this member is leader-ready already, it is told at once (through the queue)."""
        self.listeners.append(listener)
        if self.is_ready and not self._stopped:
            self._enqueue(self.ready_term, [listener])

    def check(self) -> None:
        """The committed index moved: is this the moment the current leadership became ready?"""
        server = self.server
        rep = server.replicator
        if rep is None or rep.stopped or rep is self._ready_leadership or rep.term_start_index < 0:
            return
        if server.store.committed_index >= rep.term_start_index and server.state.role is Role.LEADER:
            self.ready_term, self._ready_leadership = rep.term, rep
            log.info("{id}: leader ready in term {term} (first entry {i} committed)", id=server.self_id,
                     term=rep.term, i=rep.term_start_index)
            if self.listeners and not self._stopped:
                self._enqueue(rep.term, None)

    def stop(self) -> None:
        """The member stops: events not delivered yet are dropped."""
        self._stopped = True
        self._queue.clear()

    def _enqueue(self, term: int, only) -> None:
        self._queue.append((term, only))
        if not self._draining:
            self._drain()

    @inlineCallbacks
    def _drain(self):
        self._draining = True
        try:
            while self._queue and not self._stopped:
                # Role changes notified before this event reach their handlers first.
                yield self.server.elector.notifier.idle()
                if not self._queue or self._stopped:
                    break
                term, only = self._queue.popleft()
                for listener in list(only if only is not None else self.listeners):
                    st = self.server.state
                    if st.role is not Role.LEADER or st.curr_term != term:
                        log.info("{id}: leadership of term {term} ended before leader-ready was delivered",
                                 id=self.server.self_id, term=term)
                        break
                    try:
                        yield maybeDeferred(listener.leader_ready, term)
                    except Exception:
                        log.failure("{id}: leader-ready listener {l!r} failed in term {term}",
                                    id=self.server.self_id, l=listener, term=term)
        finally:
            self._draining = False
