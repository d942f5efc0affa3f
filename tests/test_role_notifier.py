"""RoleChangeNotifier: every transition reaches every handler, whether handlers answer at once or later."""

from __future__ import annotations

from twisted.internet.defer import Deferred

from dledger.codes import Role
from dledger.election.notifier import RoleChangeNotifier


class Recorder:
    def __init__(self, deferreds: list | None = None):
        self.seen = []
        self.deferreds = deferreds

    def role_changed(self, term, role):
        self.seen.append((term, role))
        if self.deferreds is not None:
            d = Deferred()
            self.deferreds.append(d)
            return d
        return None


def test_synchronous_handlers_see_every_transition():
    """Handlers that return at once get the 2nd and later transitions too (a drain that ended inline restarts)."""
    notifier = RoleChangeNotifier("n0")
    handler = Recorder()
    notifier.add(handler)
    for term, role in [(1, Role.CANDIDATE), (1, Role.FOLLOWER), (2, Role.CANDIDATE), (2, Role.LEADER)]:
        notifier.notify(term, role)
    assert handler.seen == [(1, Role.CANDIDATE), (1, Role.FOLLOWER), (2, Role.CANDIDATE), (2, Role.LEADER)]
    assert notifier.idle().called


def test_deferred_handlers_see_transitions_one_at_a_time():
    """A handler's Deferred holds later transitions back until it fires; then they all arrive in order."""
    waits: list[Deferred] = []
    notifier = RoleChangeNotifier("n0")
    handler = Recorder(waits)
    notifier.add(handler)
    notifier.notify(1, Role.CANDIDATE)
    notifier.notify(1, Role.LEADER)
    assert handler.seen == [(1, Role.CANDIDATE)]
    waits[0].callback(None)
    assert handler.seen == [(1, Role.CANDIDATE), (1, Role.LEADER)]
    waits[1].callback(None)
    notifier.notify(2, Role.FOLLOWER)
    assert handler.seen[-1] == (2, Role.FOLLOWER)


# -- LeaderElector.observe: the one registration for the member's own role-change reactions -----------------

def test_observers_run_in_order_with_role_filters_and_can_deregister():
    """observe() calls observers in order (filtered by role), before plugin handlers; deregister stops it."""
    from twisted.internet import task

    from dledger.testing.cluster import Cluster

    cluster = Cluster(1, seed=2, clock=task.Clock())  # a group of one: its first vote round makes it leader
    cluster.start()
    elector = cluster.servers["n0"].elector
    seen = []
    handler = Recorder()
    cluster.servers["n0"].add_role_change_handler(handler)
    first = elector.observe(lambda term, role: seen.append(("all", term, role)))
    elector.observe(lambda term, role: seen.append(("leader-only", term, role)), roles=[Role.LEADER])
    elector.observe(lambda term, role: seen.append(("handler-saw-it-already", len(handler.seen))))
    assert cluster.run_until(lambda: cluster.leader() == "n0", 5)
    term = elector.state.curr_term
    assert seen == [("all", term, Role.LEADER), ("leader-only", term, Role.LEADER), ("handler-saw-it-already", 0)]
    assert handler.seen == [(term, Role.LEADER)]
    first()
    first()  # twice is harmless
    seen.clear()
    elector.change_to_candidate(term)
    assert seen == [("handler-saw-it-already", 1)]
