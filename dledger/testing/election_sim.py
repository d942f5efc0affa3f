"""Seeded election soak: random partitions, loss, duplication, delay and crash/restart, with safety checks.

Checked continuously, on every member and across restarts:

* election safety -- at most one leader per term, and that leader leads it in one incarnation only
  (never again after a restart: issue #29, a restart may have lost the tail it wrote);
* terms never decrease (in memory and in the term/vote store);
* no member grants two different votes in one term, including when it
  crashes right after persisting a vote.

Run it longer by hand: ``python -m tools.simulate election --seeds 100000``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from dledger.codes import Role
from dledger.store.memory import MemoryTermVoteStore
from dledger.testing.chaos import Chaos, ChaosMix
from dledger.testing.cluster import Cluster
from dledger.testing.simdisk import DEFAULT_FLUSH_LATENCY
from dledger.transport.inprocess import FaultSettings


class SafetyViolation(AssertionError):
    pass


class CheckedTermStore(MemoryTermVoteStore):
    """A term/vote store that checks every save against what this member promised before."""

    def __init__(self, member: str, checker: ElectionChecker):
        super().__init__()
        self.member = member
        self.checker = checker

    def save(self, term, vote_for):
        self.checker.saved(self.member, term, vote_for)
        super().save(term, vote_for)
        self.checker.after_save(self.member, term, vote_for)


@dataclass
class ElectionChecker:
    """Records terms, votes and leaders and raises SafetyViolation on the first breach."""

    leaders: dict[int, str] = field(default_factory=dict)
    #: term -> the incarnation (start count) of its leader
    leader_incarnations: dict[int, int] = field(default_factory=dict)
    starts: dict[str, int] = field(default_factory=dict)
    votes: dict[tuple[str, int], str] = field(default_factory=dict)
    last_term: dict[str, int] = field(default_factory=dict)
    elections: int = 0
    on_vote_saved: object = None
    #: ``listener(member, term, vote_for)`` after each vote saved (the membership checks: who may vote)
    vote_listeners: list = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def fail(self, message: str) -> None:
        """Record a violation (exceptions can be swallowed by Deferred chains) and raise."""
        self.violations.append(message)
        raise SafetyViolation(message)

    def saved(self, member: str, term: int, vote_for) -> None:
        last = self.last_term.get(member, 0)
        if term < last:
            self.fail(f"{member} persisted term {term} after term {last}")
        self.last_term[member] = term
        if vote_for is not None:
            prev = self.votes.setdefault((member, term), vote_for)
            if prev != vote_for:
                self.fail(f"{member} voted for {prev} and then {vote_for} in term {term}")

    def after_save(self, member: str, term: int, vote_for) -> None:
        if vote_for is not None and self.on_vote_saved is not None:
            self.on_vote_saved(member)
        if vote_for is not None:
            for listener in self.vote_listeners:
                listener(member, term, vote_for)

    def started(self, member: str) -> int:
        """``member`` (re)starts: its new incarnation number."""
        self.starts[member] = self.starts.get(member, 0) + 1
        return self.starts[member]

    def role_changed(self, member: str, term: int, role: Role, incarnation: int = 0) -> None:
        last = self.last_term.get(member, 0)
        if term < last:
            self.fail(f"{member} is in term {term} after term {last}")
        if role is Role.LEADER:
            self.elections += 1
            holder = self.leaders.setdefault(term, member)
            if holder != member:
                self.fail(f"two leaders in term {term}: {holder} and {member}")
            first = self.leader_incarnations.setdefault(term, incarnation)
            if first != incarnation:
                self.fail(f"{member} leads term {term} again after a restart (incarnation {incarnation}, "
                          f"first led it in incarnation {first})")


@dataclass
class RunResult:
    seed: int
    members: int
    elections: int
    faults: int
    max_term: int
    violation: str | None = None
    recovered: bool = True
    quick_restarts: int = 0


def checked_cluster(n: int, seed: int, checker: ElectionChecker, **kw) -> Cluster:
    """A cluster whose term stores and elector observers feed ``checker``."""
    cluster = Cluster(n, seed=seed, **kw)
    for mid in cluster.ids:
        cluster.term_stores[mid] = CheckedTermStore(mid, checker)
    original = cluster.build

    def make(mid):
        server = original(mid)
        incarnation = checker.started(mid)
        server.elector.observe(lambda term, role, m=mid, k=incarnation: checker.role_changed(m, term, role, k))
        return server

    cluster.build = make
    return cluster


#: The election soak's fault mix: the defaults plus quick leader restarts (issue #29).
ELECTION_MIX = ChaosMix(crash_leader_quick=0.15)


def run_election_seed(seed: int, duration: float = 20.0, members: int | None = None, *,
                      mix: ChaosMix | None = None, flush_latency=DEFAULT_FLUSH_LATENCY,
                      tear: bool = True, term_write_latency=0.0) -> RunResult:
    """One seeded run with a random fault schedule; ``violation`` is set if a safety rule broke.

    ``mix`` replaces the fault mix, ``flush_latency`` the simulated disks' (0: durable at once), ``tear``
    False makes a crash lose every unflushed entry instead of a random part, ``term_write_latency`` makes
    term/vote writes take virtual time (a crash may interrupt them).
    """
    rng = random.Random(seed)
    n = members or rng.choice([3, 3, 5])
    checker = ElectionChecker()
    faults = FaultSettings(min_delay=0.0005, max_delay=rng.choice([0.002, 0.02, 0.08]),
                           loss=rng.choice([0.0, 0.05, 0.2]), duplicate=rng.choice([0.0, 0.05, 0.2]))
    cluster = checked_cluster(n, seed, checker, faults=faults, flush_latency=flush_latency, tear_on_crash=tear,
                              term_write_latency=term_write_latency)
    crash_after_vote = rng.random() < 0.3
    chaos = Chaos(cluster, rng, mix or ELECTION_MIX)

    def maybe_crash_after_vote(member):
        if chaos.active and crash_after_vote and rng.random() < 0.2:
            cluster.clock.callLater(0, chaos.crash, member)

    checker.on_vote_saved = maybe_crash_after_vote
    recovered = False
    try:
        cluster.start()
        chaos.start(rng.uniform(0, 1))
        cluster.run(duration)
        chaos.calm()  # a leader must emerge again once everything heals
        recovered = cluster.run_until(lambda: cluster.stable_leader() is not None, 30)
    except SafetyViolation:
        pass
    finally:
        for s in list(cluster.servers.values()):
            s.crash()
    violation = checker.violations[0] if checker.violations else None
    return RunResult(seed, n, checker.elections, chaos.faults, max(checker.last_term.values(), default=0),
                     violation, recovered, chaos.quick_restarts)
