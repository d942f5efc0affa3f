"""dledger.testing.Cluster as an application test author uses it (issue 30, item 5).

The raising wait, appends kept in order, the applied/converged barriers, NOOPs in committed_entries and the
two forms of ``commit_listeners=``.
"""

from __future__ import annotations

import itertools

import pytest
from twisted.internet.task import deferLater
from zope.interface import implementer

from dledger.entry import Entry
from dledger.interfaces import ICommitListener
from dledger.testing import Cluster, isolated_plugin_manager
from dledger.transport.inprocess import FaultSettings


@implementer(ICommitListener)
class SlowCounter:
    """A replicated counter whose every batch takes ``delay`` virtual seconds to apply (say, an fsync of its own)."""

    def __init__(self, clock, delay: float = 0.5):
        self.clock, self.delay = clock, delay
        self.applied: list[bytes] = []

    def start_index(self) -> int:
        return 0  # keeps its state in memory: rebuilds it from the whole log after a restart

    def entries_committed(self, entries):
        def apply():
            self.applied.extend(e.body for e in entries)
        return deferLater(self.clock, self.delay, apply)


def make_cluster(**kw):
    return Cluster(3, seed=kw.pop("seed", 3), plugin_manager=isolated_plugin_manager(), **kw)


def test_wait_until_raises_naming_what_never_happened():
    """run_until only returns False; wait_until fails the test, naming the condition and the members' state."""
    cluster = make_cluster()
    cluster.start()
    assert cluster.run_until(lambda: False, 1.0) is False
    with pytest.raises(AssertionError, match=r"the impossible not within 2s \(virtual time\); members: n0 "):
        cluster.wait_until(lambda: False, 2.0, "the impossible")
    assert cluster.wait_until(lambda: cluster.stable_leader(), 30, "a leader") == cluster.stable_leader()


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_append_committed_keeps_the_order_given(seed):
    """On a network that delays (and so reorders) messages, the log holds the bodies in the order given.

    (The client is at-least-once: a retry after a lost answer may store a body twice, next to itself.)
    """
    cluster = make_cluster(seed=seed, faults=FaultSettings(min_delay=0.001, max_delay=0.05))
    cluster.start()
    bodies = [b"body-%d" % i for i in range(12)]
    cluster.append_committed(bodies)
    for mid in cluster.ids:
        stored = [e.body for e in cluster.committed_entries(mid, noops=False)]
        assert [body for body, _ in itertools.groupby(stored)] == bodies


def test_append_committed_returns_once_every_listener_applied_everything():
    """Slow commit listeners on every member have applied every body when append_committed returns."""
    counters = {}

    def listeners(mid, server):
        counters[mid] = SlowCounter(server.clock)
        return [counters[mid]]

    cluster = make_cluster(commit_listeners=listeners)
    cluster.start()
    bodies = [b"a", b"b", b"c"]
    cluster.append_committed(bodies)
    assert {mid: c.applied for mid, c in counters.items()} == {mid: bodies for mid in cluster.ids}


def test_wait_applied_covers_a_restarted_members_replay():
    """A member restarted after missing appends catches up, replays into a new listener, and the barrier waits."""
    counters = {}

    def listeners(mid):  # the one-argument form
        counters[mid] = SlowCounter(cluster.clock, delay=2.0)
        return [counters[mid]]

    cluster = make_cluster(commit_listeners=listeners)
    cluster.start()
    leader = cluster.append_committed([b"one"])
    follower = next(mid for mid in cluster.ids if mid != leader)
    cluster.crash(follower)
    cluster.append_committed([b"two", b"three"])
    cluster.restart(follower)
    index = cluster.wait_applied()
    assert index == cluster.servers[leader].store.committed_index
    assert counters[follower].applied == [b"one", b"two", b"three"]


def test_converged_returns_the_common_log_and_names_a_difference(monkeypatch):
    """converged() gives the committed log without NOOPs; a member whose log differs is named with the index."""
    cluster = make_cluster()
    cluster.start()
    cluster.append_committed([b"x", b"y"])
    log = cluster.converged()
    assert [e.body for e in log] == [b"x", b"y"]
    noops = [e for e in cluster.committed_entries("n0") if e.is_noop]
    assert noops and len(cluster.committed_entries("n0")) == len(log) + len(noops)
    store = cluster.servers["n2"].store
    read = store.get
    tampered = Entry(body=b"tampered", index=log[0].index, term=log[0].term)
    # n2 answers another body at that index: what converged() is there to catch (a safety bug, in real life).
    monkeypatch.setattr(store, "get", lambda i: tampered if i == log[0].index else read(i))
    with pytest.raises(AssertionError, match=rf"n0 and n2 differ at index {log[0].index}: .*b'tampered'"):
        cluster.converged()
