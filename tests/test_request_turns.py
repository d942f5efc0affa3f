"""A request's path loses no reactor turn where nothing is in flight (issue #28 2c).

An append used to reach the followers and the disk only at the reactor's next turn (``callLater(0)``),
after that turn had read and served every ready socket; on a busy member that turn was the largest queue
on a request's path.  Now a follower with no APPEND in flight gets the push, and an idle ``Flusher`` starts
its round, in the call that appended; appends arriving while pushes or a round run still share the next one.
"""

from __future__ import annotations

from twisted.internet import task
from twisted.internet.defer import Deferred, succeed

from dledger.replication.durability import Flusher
from dledger.testing import Cluster


class Rounds:
    """A store whose flushes the test answers (``flush_rounds`` as given)."""

    def __init__(self, rounds: int = 2):
        self.flush_rounds = rounds
        self.flushed_index = -1
        self.asked: list[Deferred] = []

    def flush(self):
        d = Deferred()
        self.asked.append(d)
        return d


def test_an_idle_flusher_starts_the_round_at_once_and_gathers_the_rest_for_the_next_turn():
    store, clock = Rounds(), task.Clock()
    flusher = Flusher(store, clock)
    flusher.wait(0)
    assert len(store.asked) == 1, "an idle member's flush waited for the next reactor turn"
    flusher.wait(1)
    flusher.wait(2)
    assert len(store.asked) == 1  # a round runs: this turn's later waits share the next round...
    clock.advance(0)
    assert len(store.asked) == 2  # ...started a turn later, beside the running one
    store.flushed_index = 2
    store.asked[0].callback(0)
    store.asked[1].callback(2)
    assert flusher.flushes == 2


def test_a_flush_answered_at_once_does_not_recurse():
    """A store that answers ``flush()`` at once without covering a waiter gets the next flush a turn later."""
    clock = task.Clock()

    class Behind:
        flush_rounds = 1
        flushed_index = -1
        calls = 0

        def flush(self):
            self.calls += 1
            if self.calls == 2:
                self.flushed_index = 0  # the second round covers the waiter
            return succeed(self.flushed_index)

    store = Behind()
    flusher = Flusher(store, clock)
    d = flusher.wait(0)
    assert store.calls == 1 and not d.called  # answered at once, not covered: the next round waits a turn
    clock.advance(0)
    assert store.calls == 2 and d.called


def test_an_append_reaches_idle_followers_and_the_disk_in_the_same_call():
    cluster = Cluster(3, seed=3, flush_latency=0.002)
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        cluster.append_committed([b"warm"])
        cluster.run(1.0)
        server = cluster.servers[leader]
        replicator = server.replicator
        assert all(not d.in_flight for d in replicator.dispatchers.values())
        flushes = server.flusher.flushes
        end = server.store.ledger_end_index
        done = server.append(b"now")
        # No clock advance: the push to every follower and the leader's own flush round went at once.
        assert all(d.in_flight and max(d.in_flight.values()) == end + 1 for d in replicator.dispatchers.values()), \
            "the push waited for the reactor's next turn"
        assert server.flusher.flushes == flushes + 1, "the leader's flush waited for the reactor's next turn"
        cluster.run_until(lambda: done.called)
        assert done.called
    finally:
        cluster.stop()
