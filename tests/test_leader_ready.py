"""Leader-ready events are per leadership, not per term (issue #29's audit of "same term => same leadership")."""

from types import SimpleNamespace

from twisted.internet.defer import succeed

from dledger.codes import Role
from dledger.leader_ready import LeaderReady


class Listener:
    def __init__(self):
        self.told: list[int] = []

    def leader_ready(self, term):
        self.told.append(term)


def fake_server(term=5):
    notifier = SimpleNamespace(idle=lambda: succeed(None))
    return SimpleNamespace(self_id="n0", state=SimpleNamespace(role=Role.LEADER, curr_term=term),
                           store=SimpleNamespace(committed_index=-1), replicator=None,
                           elector=SimpleNamespace(notifier=notifier))


def lead(server, start_index):
    """A new leadership (a LeaderReplicator's view) in the server's current term, its NOOP at ``start_index``."""
    server.state.role = Role.LEADER
    server.replicator = SimpleNamespace(term=server.state.curr_term, stopped=False, term_start_index=start_index)
    return server.replicator


def test_a_second_leadership_of_the_same_term_is_announced_again():
    """A leader that stepped down and won its term again (its log intact) is ready again once its NOOP commits.

    Before: keyed on the term, the second leadership was never announced, and a RocketMQ broker that
    demoted itself to slave on the step-down stayed a slave while it led.
    """
    server = fake_server()
    ready, listener = LeaderReady(server), Listener()
    ready.add(listener)
    first = lead(server, 10)
    server.store.committed_index = 10
    ready.check()
    assert listener.told == [5] and ready.is_ready
    first.stopped, server.state.role, server.replicator = True, Role.CANDIDATE, None  # steps down in term 5
    assert not ready.is_ready
    lead(server, 11)
    assert not ready.is_ready, "not ready before the new leadership's NOOP commits"
    ready.check()
    assert listener.told == [5]
    server.store.committed_index = 11
    ready.check()
    assert listener.told == [5, 5] and ready.is_ready
    ready.check()
    assert listener.told == [5, 5], "told once per leadership"
