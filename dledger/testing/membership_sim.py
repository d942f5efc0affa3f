"""The simulator's membership mode (issue #23): random changes proposed through the leader, and their checks.

:class:`Changer` is the schedule: from its own random stream (so the other modes' schedules do not
move), at exponentially distributed intervals, it asks the leader of the moment to add a member (a
new store that joins as a learner, promoted by the leader once caught up, or kept a learner until a
later ``promote``), promote a learner, remove a follower, remove the leader, or replace a member (add
the new one, then remove the old one once the new one votes) -- interleaved with the fault schedule
and the clients.  It proposes whether or not a change is in flight: the refusals are part of the test.

:class:`MembershipProbe` feeds :class:`dledger.testing.configcheck.MembershipChecker` from the
running members: each member's configurations read from its own log, every commit decision a leader
makes (who held the index it commits), every election won (who voted for the winner), every vote
cast, every configuration entry committed.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass, field

from dledger.codes import Role
from dledger.membership.configuration import Configuration, bootstrap
from dledger.membership.rules import Change, Op
from dledger.testing.configcheck import Decision, LogConfigs, MembershipChecker
from dledger.testing.election_sim import CheckedTermStore, ElectionChecker


class MembershipProbe:
    """Hooks on a :class:`~dledger.testing.cluster.Cluster` that report every quorum decision to ``checker``.

    Install it after the cluster's other ``build`` wrappers (it wraps what they return).
    """

    def __init__(self, cluster, election: ElectionChecker, checker: MembershipChecker):
        self.cluster = cluster
        self.election = election
        self.checker = checker
        #: member -> the configurations of its running incarnation's log
        self.logs: dict[str, LogConfigs] = {}
        election.vote_listeners.append(self._voted)
        original = cluster.build

        def make(mid):
            if not isinstance(cluster.term_stores.get(mid), CheckedTermStore):  # a member added during the run
                cluster.term_stores[mid] = CheckedTermStore(mid, election)
            server = original(mid)
            self._watch(mid, server)
            return server

        cluster.build = make

    @staticmethod
    def base(server) -> Configuration:
        return MembershipProbe.base_of(server.config)

    @staticmethod
    def base_of(cfg) -> Configuration:
        """A member's bootstrap configuration (its ``--peers``, a learner of it if it joins a running group)."""
        return bootstrap(cfg.members, cfg.self_id, join_existing=getattr(cfg, "join_existing", False))

    def configs(self, mid: str) -> tuple[Configuration, ...]:
        return self.logs[mid].refresh()

    def _watch(self, mid: str, server) -> None:
        store = server.store
        logs = self.logs[mid] = LogConfigs(store, self.base(server))
        checker, clock = self.checker, self.cluster.clock
        update = store.update_committed_index

        def watched(term, index, update=update):
            before = store.committed_index
            replicator = getattr(server, "replicator", None)
            deciding = server.state.role is Role.LEADER and replicator is not None and replicator.term == term
            acks = self._acks(server, replicator, index) if deciding else frozenset()
            update(term, index)
            after = store.committed_index
            if after <= before:
                return
            configs = logs.refresh()
            if deciding:
                checker.decided(Decision("commit", mid, term, after, acks, configs, since=before,
                                         time=clock.seconds(), term_start=replicator.term_start_index))
            for c in configs[1:]:
                if before < c.index <= after:
                    checker.config_committed(mid, c)

        store.update_committed_index = watched
        server.elector.observe(lambda term, role: self._role(mid, server, term, role))

    @staticmethod
    def _acks(server, replicator, index: int) -> frozenset[str]:
        """Who holds ``index`` as the leader counts it: itself (its durable end) and each follower's watermark."""
        own = replicator.watermarks()[0]
        held = {peer for peer, d in replicator.dispatchers.items() if d.watermark >= index}
        if own >= index:
            held.add(server.self_id)
        return frozenset(held)

    def _role(self, mid: str, server, term: int, role: Role) -> None:
        if role is not Role.LEADER or self.cluster.servers.get(mid) is not server:
            return
        voters = frozenset(m for (m, t), cand in self.election.votes.items() if t == term and cand == mid)
        self.checker.decided(Decision("vote", mid, term, server.store.ledger_end_index, voters, self.configs(mid),
                                      time=self.cluster.clock.seconds()))

    def _voted(self, member: str, term: int, vote_for: str) -> None:
        if member in self.cluster.servers and member in self.logs:
            self.checker.vote_cast(member, term, vote_for, self.configs(member)[-1])


@dataclass
class ChangeStats:
    """What the schedule asked for and what became of it."""

    proposed: collections.Counter = field(default_factory=collections.Counter)  # op -> proposals
    committed: collections.Counter = field(default_factory=collections.Counter)  # op -> committed
    refused: collections.Counter = field(default_factory=collections.Counter)  # first words of the refusal
    failed: int = 0  # a proposal that failed otherwise (leader lost, timed out)
    members_added: int = 0  # new stores started to join

    def total(self, counter: str) -> int:
        return sum(getattr(self, counter).values())


@dataclass
class _Intent:
    """A change the schedule still wants made: ``change`` once ``ready(config)``; dropped after ``tries``."""

    change: Change
    tries: int = 12
    after: str | None = None  # REMOVE of a replaced member: only once this member votes


#: Relative weights of the changes the schedule asks for.
CHANGE_MIX = (("add", 3.0), ("add_learner", 1.0), ("promote", 2.0), ("remove_follower", 2.0),
              ("remove_leader", 1.0), ("replace", 2.0))


class Changer:
    """Proposes membership changes at random through the leader (see the module docstring)."""

    def __init__(self, cluster, rng: random.Random, stats: ChangeStats, *, mean_interval: float = 0.6,
                 min_voters: int = 3, max_members: int = 6, mix=CHANGE_MIX):
        self.cluster = cluster
        self.rng = rng
        self.stats = stats
        self.mean_interval = mean_interval
        self.min_voters = min_voters
        self.max_members = max_members
        self.kinds = [k for k, _ in mix]
        self.weights = [w for _, w in mix]
        self.intents: list[_Intent] = []
        self.active = False
        self._next_id = 0

    def start(self, first_after: float) -> None:
        self.active = True
        self.cluster.clock.callLater(first_after, self._tick)

    def calm(self) -> None:
        self.active = False

    # -- the schedule -------------------------------------------------------------------------------
    def _tick(self) -> None:
        if not self.active:
            return
        leader = self.cluster.leader()
        if leader is not None:
            server = self.cluster.servers[leader]
            config = server.membership.configuration
            if self.intents and self.rng.random() < 0.7:
                self._retry(server, config)
            else:
                self._new(server, config)
        self.cluster.clock.callLater(self.rng.expovariate(1 / self.mean_interval), self._tick)

    def _new(self, server, config: Configuration) -> None:
        """A new change, of a kind drawn among those this configuration allows."""
        voters = [v for v in config.voters if v != server.self_id]
        room = len(config.members) < self.max_members
        removable = len(config.voters) > self.min_voters
        possible = {"add": room, "add_learner": room, "promote": bool(config.learners),
                    "remove_follower": removable and bool(voters), "remove_leader": removable, "replace": room}
        kinds = [(k, w) for k, w in zip(self.kinds, self.weights) if possible[k]]
        if not kinds:
            return
        kind = self.rng.choices([k for k, _ in kinds], [w for _, w in kinds])[0]
        if kind in ("add", "add_learner"):
            self._propose(server, self._add(learner=kind == "add_learner"), kind)
        elif kind == "promote":
            self._propose(server, Change(Op.PROMOTE, self.rng.choice(config.learners)), kind)
        elif kind == "remove_follower":
            self._propose(server, Change(Op.REMOVE, self.rng.choice(voters + list(config.learners))), kind)
        elif kind == "remove_leader":
            self._propose(server, Change(Op.REMOVE, server.self_id), kind)
        else:  # replace: add the new member (promoted once caught up), then remove the old one once it votes
            old = self.rng.choice(config.voters)
            add = self._add(learner=False)
            self.intents.append(_Intent(Change(Op.REMOVE, old), after=add.member_id))
            self._propose(server, add, kind)

    def _add(self, learner: bool) -> Change:
        """A new member started to join (a new store) and the change that adds it."""
        mid = f"j{self._next_id}"
        self._next_id += 1
        address = self.cluster.add_member(mid, join=True)
        self.stats.members_added += 1
        return Change(Op.ADD, mid, address, learner=learner)

    def _retry(self, server, config: Configuration) -> None:
        intent = self.intents[0]
        change = intent.change
        done = (config.get(change.member_id) is None if change.op is Op.REMOVE
                else config.is_voter(change.member_id) if change.op is Op.PROMOTE
                else config.get(change.member_id) is not None)
        if done and server.membership.committed():
            self.intents.pop(0)
            return
        if intent.after is not None and not config.is_voter(intent.after):
            if config.get(intent.after) is None and server.membership.committed():
                intent.tries -= 1  # the new member was never added: give the removal a few more chances
            if intent.tries <= 0:
                self.intents.pop(0)
            return
        intent.tries -= 1
        if intent.tries <= 0:
            self.intents.pop(0)
        if not done:
            self._propose(server, change, "replace" if intent.after else change.op.value)

    def _propose(self, server, change: Change, kind: str) -> None:
        stats = self.stats
        stats.proposed[kind] += 1
        d = server.membership.propose(change)

        def committed(_config) -> None:
            stats.committed[kind] += 1

        def failed(failure) -> None:
            message = getattr(failure.value, "message", None) or str(failure.value)
            if message.startswith("refused"):
                stats.refused[" ".join(message.split(":", 1)[-1].split()[:3])] += 1
                if change.op is Op.ADD and not any(i.change == change for i in self.intents):
                    self.intents.append(_Intent(change))
            else:
                stats.failed += 1

        d.addCallbacks(committed, failed)


# -- the end of a run ---------------------------------------------------------------------------------------

def final_members(cluster) -> tuple[str, ...]:
    """The members of the configuration in force on the leader (else the newest any running member holds)."""
    leader = cluster.servers.get(cluster.leader() or "")
    if leader is not None:
        return leader.membership.configuration.ids
    configs = [s.membership.configuration for s in cluster.servers.values()]
    return max(configs, key=lambda c: c.index).ids if configs else ()


def membership_converged(cluster) -> bool:
    """A voter leads a committed configuration whose every member runs and has committed the leader's whole log."""
    leader_id = cluster.leader()
    if leader_id is None:
        return False
    leader = cluster.servers[leader_id]
    config, store = leader.membership.configuration, leader.store
    if not config.is_voter(leader_id) or not leader.membership.committed() \
            or store.committed_index < store.ledger_end_index:
        return False
    return all(mid in cluster.servers and cluster.servers[mid].store.committed_index == store.committed_index
               for mid in config.ids)
