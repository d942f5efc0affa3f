"""The simulator's membership mode (issue #23 item 7): random changes under faults, and broken builds caught.

``make test`` runs a few dozen seeds; the long run is
``python -m tools.simulate replication --membership --seeds 10000`` (figures in docs/testing.md).
The two mutations of :mod:`dledger.testing.mutations` are each shown caught twice: by a deterministic
scenario on an in-process group (the Ongaro 2015 scenario for the own-term rule), and by seeds of the
random search.
"""

import os

import pytest

from dledger.codes import Role
from dledger.membership.rules import Change, Op
from dledger.testing.checker import CommittedLog
from dledger.testing.cluster import Cluster
from dledger.testing.configcheck import MembershipChecker
from dledger.testing.election_sim import ElectionChecker, checked_cluster
from dledger.testing.membership_sim import MembershipProbe
from dledger.testing.mutations import mutation
from dledger.testing.replication_sim import _watch_commits, run_replication_seed

pytestmark = pytest.mark.skipif(not hasattr(Cluster, "add_member"),
                                reason="needs the membership implementation (Cluster.add_member, issue #23)")

#: A bounded number in ``make test`` (about 0.3 s each).
MEMBERSHIP_SIM_SEEDS = int(os.environ.get("DLEDGER_MEMBERSHIP_SIM_SEEDS", "20"))


def test_membership_schedules_are_safe():
    """Seeded schedules with random changes under faults: nothing lost, every decision a proper quorum."""
    results = [run_replication_seed(seed, membership=True, duration=3.0) for seed in range(MEMBERSHIP_SIM_SEEDS)]
    bad = [r for r in results if not r.ok]
    assert not bad, (f"replay with: python -m tools.simulate replication --membership --duration 3 --seed "
                     f"{bad[0].seed}\n" + "\n".join(bad[0].problems()[:10]))
    # the paths were taken: changes of every kind committed, configurations and decisions checked
    committed = sum((r.changes.committed for r in results), start=type(results[0].changes.committed)())
    assert {"add", "promote", "remove_follower", "replace"} <= set(committed), committed
    assert sum(r.config_commits for r in results) >= MEMBERSHIP_SIM_SEEDS
    assert sum(r.decisions for r in results) > 40 * MEMBERSHIP_SIM_SEEDS
    assert sum(r.acked for r in results) > 20 * MEMBERSHIP_SIM_SEEDS


def test_membership_seed_replays_exactly():
    """A membership-mode seed is deterministic: the same figures twice."""
    a, b = (run_replication_seed(7, membership=True, duration=4.0) for _ in range(2))
    assert (a.acked, a.faults, a.config_commits, a.decisions, dict(a.changes.proposed)) == \
           (b.acked, b.faults, b.config_commits, b.decisions, dict(b.changes.proposed))
    assert a.changes.total("proposed") > 0


# -- the mutations, by scenario ------------------------------------------------------------------------------

class Scenario:
    """An in-process group with the membership probe and a committed-log observer on every member."""

    def __init__(self, ids, seed=3):
        self.election = ElectionChecker()
        self.checker = MembershipChecker()
        self.cluster = checked_cluster(len(ids), seed, self.election, ids=list(ids))
        self.committed = CommittedLog()
        _watch_commits(self.cluster, self.committed, {}, self.committed.divergences)
        self.probe = MembershipProbe(self.cluster, self.election, self.checker)

    def propose(self, leader, change):
        out = []
        self.cluster.servers[leader].membership.propose(change).addBoth(out.append)
        return out

    def problems(self):
        return self.election.violations + self.checker.problems + self.committed.divergences

    def consequences(self):
        """The problems other than a broken rule seen in a leader's log: what the broken rule led to."""
        return [p for p in self.problems() if not p.startswith("rule:")]


def _add_learner(s: Scenario, leader: str, mid: str) -> None:
    address = s.cluster.add_member(mid, join=True)
    done = s.propose(leader, Change(Op.ADD, mid, address, learner=True))
    s.cluster.wait_until(lambda: done, 30, f"adding {mid}")
    assert not hasattr(done[0], "getErrorMessage"), done[0]
    s.cluster.wait_until(lambda: all(srv.store.committed_index >= s.cluster.configuration(leader).index
                                     for srv in s.cluster.servers.values()), 30, f"{mid} known everywhere")


def ongaro_2015(mutated: bool):
    """Four voters; the leader ``a`` promotes a fifth member ``e`` but only ``e`` hears of it; the other three
    elect ``b``, which at once removes ``a`` and commits that with ``c`` alone ({b, c} of {b, c, d}) while
    ``d``, which voted for it, is cut off from it; ``a`` then wins with ``d`` and ``e`` (3 of its 5 voters).

    Returns (scenario, the refusal or None).  Only with the own-term rule off (``mutated``) can ``b``
    propose before it committed an entry of its own term -- which needs ``d``.
    """
    s = Scenario(["a", "b", "c", "d"])
    cluster = s.cluster
    cluster.start()
    a = cluster.append_committed([b"before"])  # the leader has committed an entry of its term
    others = [m for m in cluster.ids if m != a]
    _add_learner(s, a, "e")
    cluster.partition([a, "e"], others)
    s.propose(a, Change(Op.PROMOTE, "e"))
    cluster.wait_until(lambda: s.probe.configs("e")[-1].is_voter("e"), 10, "e holds its promotion")
    won = []

    def cut(mid):
        def observer(term, role):
            if role is Role.LEADER and not won:
                won.append(mid)
                d = [m for m in others if m != mid][0]
                cluster.heal()  # partitions add up: the new one replaces the old one
                cluster.partition([a, "e", d], [m for m in others if m != d])
        return observer

    for m in others:
        cluster.servers[m].elector.observe(cut(m))
    cluster.wait_until(lambda: won, 30, "a leader among the other three")
    b = won[0]
    cluster.wait_until(lambda: cluster.servers[b].replicator is not None, 5, f"{b} leading")
    with mutation("own-term" if mutated else None):
        refusal = _propose_once_live(s, b, Change(Op.REMOVE, a))
        cluster.run_until(lambda: s.consequences(), 20)
    return s, refusal


def _propose_once_live(s: Scenario, leader: str, change: Change):
    """Propose ``change`` on ``leader`` once it has heard from enough members (a new leader has not at first).

    Returns the refusal (one line) or None when the change was accepted (committed, pending, or lost with
    the leadership afterwards).
    """
    for _ in range(50):
        answer = s.propose(leader, change)
        s.cluster.run_until(lambda answer=answer: answer, 2)  # a refusal may wait for the peer-kind probes
        failure = answer[0].getErrorMessage() if answer and hasattr(answer[0], "getErrorMessage") else ""
        refusal = failure if "refused" in failure else None  # (accepted, maybe lost with the leadership later)
        if refusal is None or "no quorum" not in refusal:
            return refusal
        s.cluster.run(0.1)
    return refusal


def test_ongaro_2015_scenario_caught_with_the_own_term_rule_off():
    s, refusal = ongaro_2015(mutated=True)
    assert refusal is None
    assert any("own-term rule" in p for p in s.problems()), s.problems()
    # and what it leads to: the old leader's election by itself, e and the cut-off voter after its removal was
    # committed by the other two -- a quorum of the old configuration, or even a second leader of the term
    assert any("old configuration" in p or "two leaders" in p for p in s.consequences()), s.problems()


def test_ongaro_2015_scenario_refused_and_safe_with_the_rule():
    s, refusal = ongaro_2015(mutated=False)
    assert refusal is not None and "own term" in refusal
    s.cluster.heal()
    s.cluster.run(10)
    assert s.problems() == []
    assert s.checker.wins >= 2 and s.checker.commits > 0  # the decisions were observed and checked


def two_in_flight(mutated: bool):
    """Voters {a, b, c} and learners e, f; a, cut off with e and f, promotes e and (only if mutated) f while
    e's promotion is in flight: {a, e, f} is then a majority of the five voters, and {b, c} of the old three."""
    s = Scenario(["a", "b", "c"])
    cluster = s.cluster
    cluster.start()
    a = cluster.append_committed([b"before"])  # the leader has committed an entry of its term
    others = [m for m in cluster.ids if m != a]
    _add_learner(s, a, "e")
    _add_learner(s, a, "f")
    cluster.partition([a, "e", "f"], others)
    with mutation("two-in-flight" if mutated else None):
        s.propose(a, Change(Op.PROMOTE, "e"))
        cluster.run(0.05)
        second = s.propose(a, Change(Op.PROMOTE, "f"))
        cluster.run_until(lambda: s.consequences(), 20)
    refusal = second[0].getErrorMessage() if second and hasattr(second[0], "getErrorMessage") else None
    return s, refusal


def test_two_changes_in_flight_caught():
    s, refusal = two_in_flight(mutated=True)
    assert refusal is None
    assert any("two changes in flight" in p for p in s.problems()), s.problems()
    assert s.consequences(), s.problems()  # the two disjoint quorums: an old-configuration quorum, a divergence


def test_two_changes_in_flight_refused_and_safe_with_the_rule():
    s, refusal = two_in_flight(mutated=False)
    assert refusal is not None and "not committed yet" in refusal
    s.cluster.heal()
    s.cluster.run(10)
    assert s.problems() == []


# -- the mutations, by random search -----------------------------------------------------------------------

#: Seeds of the random search (``--membership --mutation NAME --duration 4``) the checks fail on while the
#: unbroken build passes them: the first three of seeds 0-99 (``tools.simulate ... --seeds 100``).  In these
#: short runs the broken rule itself is what is caught (the leader's log shows the change proposed too early);
#: its consequences need the unlucky partitions of the scenarios above.  Any change of the core's timing moves
#: the schedules: re-find them then (about 1 seed in 20 catches own-term, 1 in 5 two-in-flight).
CATCHING_SEEDS = {"own-term": (7, 12, 75), "two-in-flight": (3, 10, 22)}


@pytest.mark.parametrize("name", sorted(CATCHING_SEEDS))
def test_random_search_catches_mutation(name):
    seeds = CATCHING_SEEDS[name]
    for seed in seeds:
        with mutation(name):
            r = run_replication_seed(seed, membership=True, duration=4.0)
        assert any(p.startswith("rule:") for p in r.membership), f"seed {seed} no longer catches {name}"
        assert run_replication_seed(seed, membership=True, duration=4.0).ok  # and the unbroken build passes it


# -- anomalies the simulator found in the implementation (issue #23): reproduced at the lowest level ---------------

def _group_elected_by_two(seed=5):
    """Members a, b, c where the leader of the first term was elected without c's vote (c started after)."""
    election = ElectionChecker()
    cluster = checked_cluster(3, seed, election, ids=["a", "b", "c"])
    cluster.start("a", "b")
    leader = cluster.wait_for_leader()
    cluster.start("c")
    cluster.append_committed([b"x"])
    if cluster.servers["c"].state.vote_for is not None:  # c stood in the first term after all: not this seed
        return None
    return cluster, election, leader


def test_one_leader_per_term_across_a_change():
    """Seeds 99 and 5056 of ``--membership`` on 699e040: two leaders in one term (fixed: election.rules.bumps_term).

    The leader L of term T was elected by {L, b}; c followed it without voting.  d is added and promoted, b is
    removed: the voters are {L, c, d}, and neither c nor d voted in T.  c loses L (d does not); c times out and,
    as a Java DLedger candidate does, asks for votes in T itself, first: d grants (it never voted in T), c has
    its own -- 2 of 3, a second leader of term T while L still leads it.
    """
    runs = [_second_leader_of_a_term(seed) for seed in range(8)]
    assert sum(r is not None for r in runs) >= 3  # the scenario was set up in enough seeds
    violations = [v for r in runs if r for v in r]
    assert violations == [], violations


def _second_leader_of_a_term(seed):
    group = _group_elected_by_two(seed)
    if group is None:
        return None
    cluster, election, leader = group
    term = cluster.servers[leader].state.curr_term
    other = "b" if leader != "b" else "a"  # the one that voted for the leader (besides itself)
    address = cluster.add_member("d", join=True)
    cluster.change(Change(Op.ADD, "d", address))
    cluster.wait_until(lambda: cluster.configuration().is_voter("d")
                       and cluster.servers[cluster.leader()].membership.committed(), 30, "d promoted")
    cluster.change(Change(Op.REMOVE, other))
    cluster.wait_until(lambda: all(s.store.committed_index >= cluster.configuration().index
                                   for m, s in cluster.servers.items() if m != other), 30, "the removal known")
    assert cluster.servers[leader].state.curr_term == term
    cluster.crash(other)
    cluster.network.block(leader, "c")  # c alone loses the leader; d still hears it (and so never stands)
    cluster.network.block("c", leader)
    cluster.run(5)
    return election.violations


def test_a_lagging_member_catches_up_with_a_leader_added_after_it_fell_behind():
    """Most stuck seeds of ``--membership`` on 699e040 (e.g. 7, 19, 53, 61, 74): a member whose log predates the
    addition of the leader answered its heartbeats UNKNOWN_MEMBER and stayed a candidate of an old term for good
    (fixed: the elector hears any leader).

    c is cut off; d is added and promoted, then leadership moves to d; c comes back: it must catch up with d
    (Raft dissertation §4.2.3: a server accepts AppendEntries from a leader that is not in its latest
    configuration).
    """
    cluster, _election, _leader = next(g for g in map(_group_elected_by_two, range(5, 20)) if g is not None)
    cluster.partition(["c"], [m for m in cluster.ids if m != "c"])
    address = cluster.add_member("d", join=True)
    cluster.change(Change(Op.ADD, "d", address))
    cluster.wait_until(lambda: cluster.configuration().is_voter("d")
                       and cluster.servers[cluster.leader()].membership.committed(), 30, "d promoted")
    moved = []
    cluster.client().transfer("d").addBoth(moved.append)  # leadership to the member c has never heard of
    cluster.wait_until(lambda: moved and cluster.leader() == "d", 30, "d leading")
    new = "d"
    cluster.heal()
    end = cluster.servers[new].store.ledger_end_index
    assert cluster.run_until(lambda: cluster.servers["c"].store.committed_index >= end, 20), cluster.describe()


@pytest.mark.parametrize("seed, duration", [(10, 4.0)])
def test_seed_regressions(seed, duration):
    """Seeds that failed: 10 had two leaders in term 2 while the new-term rule looked at the candidate's vote
    (n0 lost term 2, followed n1 in it, then stood in term 2 again with a voter that never voted in it)."""
    r = run_replication_seed(seed, membership=True, duration=duration)
    assert r.ok, "\n".join(r.problems()[:10])
    assert r.changes.total("committed") > 0
