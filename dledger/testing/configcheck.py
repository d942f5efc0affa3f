"""The membership checks of the simulator (issue #23): configurations, quorums and who may lead.

A single-server change is safe only if every quorum decision -- a leader counting acknowledgements
to commit, a candidate counting votes to win -- is a majority of a configuration that is the newest
committed one or descends from it.  The classic bug (Ongaro, raft-dev, July 2015: a new leader
proposing a change before it committed an entry of its own term) breaks exactly that: a leader
still holding an older, never-committed configuration wins and commits with a quorum that no
longer overlaps the one the group committed meanwhile.  So the simulation records each decision as
a :class:`Decision` and :class:`MembershipChecker` flags

* a decision whose quorum is not a majority of the configuration in force in the decider's own log
  (and says so when it is a majority only of an older one);
* a decision made after a configuration was committed (in log order at or before the decision's
  index; for an election, committed by a leader of an earlier term) by a member whose log does not
  hold that configuration: its quorum is one of an old configuration;
* a winner that is not a voter of its own configuration (a learner or a removed member leading);

(a learner's vote never counts: the quorum check counts only the voters of the winner's
configuration.  A member whose own log does not make it a voter yet may still grant a vote -- the
dissertation's §4.2.3 rule, needed when the candidate's log already holds its promotion -- so such
votes are counted, ``votes_by_non_voters``, not flagged)

and, after the run, :func:`sequence_problems` checks that the committed configurations form one
sequence every member agrees on, each differing from its predecessor by exactly one member.

The configurations a member's log holds are read from the log itself (:class:`LogConfigs`), never
from the implementation's tracker: the checker must not share the code it checks.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from dledger.codes import EntryType
from dledger.membership.configuration import Configuration, ConfigurationError, decode
from dledger.membership.rules import quorum_reached

_CONFIG = int(EntryType.CONFIG_CHANGE)


@dataclass(frozen=True)
class Decision:
    """One quorum decision: a leader committing ``(since, index]``, or a candidate winning ``term``.

    ``quorum`` is who acknowledged ``index`` (commit) or granted a vote in ``term`` (vote);
    ``configs`` the decider's configurations at the moment, its base first (bootstrap or snapshot),
    then every configuration entry of its log in index order: the last one is in force.
    """

    kind: str  # "commit" | "vote"
    member: str
    term: int
    index: int
    quorum: frozenset[str]
    configs: tuple[Configuration, ...]
    since: int = -1
    time: float = 0.0
    #: commit: the index of the leader's term-start entry (-1: unknown), for the own-term rule
    term_start: int = -1

    @property
    def in_force(self) -> Configuration:
        return self.configs[-1]

    def describe(self) -> str:
        what = f"committed up to {self.index}" if self.kind == "commit" else f"won term {self.term}"
        return (f"{self.member} (term {self.term}) {what} at {self.time:.3f}s with "
                f"{'acknowledgements' if self.kind == 'commit' else 'votes'} of {{{', '.join(sorted(self.quorum))}}}")


def _same_entry(a: Configuration, b: Configuration) -> bool:
    return a.index == b.index and a.term == b.term and a.same_members(b)


@dataclass
class MembershipChecker:
    """Records committed configurations and checks every quorum decision as it is made."""

    #: index -> the configuration first seen committed there
    committed: dict[int, Configuration] = field(default_factory=dict)
    #: index of a committed configuration entry -> the lowest term of a leader that decided its commit
    commit_term: dict[int, int] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    commits: int = 0
    wins: int = 0
    votes: int = 0
    votes_by_non_voters: int = 0

    # -- observations ------------------------------------------------------------------------------
    def config_committed(self, member: str, config: Configuration) -> None:
        """``member`` committed the configuration entry ``config`` (any member, leader or follower)."""
        seen = self.committed.setdefault(config.index, config)
        if not _same_entry(seen, config):
            self.problems.append(f"{member} committed configuration [{config.describe()}] (term {config.term}) "
                                 f"at {config.index}, where [{seen.describe()}] (term {seen.term}) was committed")

    def decided(self, d: Decision) -> None:
        """Check one decision, then record what a commit decision committed."""
        self.check(d)
        if d.kind == "commit":
            self.commits += 1
            for c in d.configs:
                if d.since < c.index <= d.index:
                    self.commit_term[c.index] = min(self.commit_term.get(c.index, d.term), d.term)
        else:
            self.wins += 1

    def vote_cast(self, member: str, term: int, candidate: str, config: Configuration) -> None:
        """``member`` persisted a vote for ``candidate`` in ``term`` while ``config`` was in force on it.

        Voting for itself is standing for election: only a voter of its own configuration may.  A vote for
        another member is counted when the voter is not a voter of its own configuration (see the module
        docstring), and never flagged.
        """
        self.votes += 1
        if config.is_voter(member):
            return
        what = "a learner" if config.get(member) is not None else "not a member"
        if candidate == member:
            self.problems.append(f"{member} stood for election in term {term} although it is {what} of its "
                                 f"configuration [{config.describe()}] (entry {config.index})")
        else:
            self.votes_by_non_voters += 1

    # -- the checks ------------------------------------------------------------------------------------
    def latest_committed(self, d: Decision) -> Configuration | None:
        """The newest configuration committed before ``d`` that the decider must hold.

        For a commit, any committed configuration at or below the index it commits (log order); for an
        election, one whose commit a leader of an earlier term decided (Leader Completeness).
        """
        if d.kind == "commit":
            eligible = [i for i in self.committed if i <= d.index]
        else:
            eligible = [i for i, t in self.commit_term.items() if t < d.term and i in self.committed]
        return self.committed[max(eligible)] if eligible else None

    def check(self, d: Decision) -> list[str]:
        found = decision_problems(d, self.latest_committed(d))
        self.problems.extend(found)
        return found


def decision_problems(d: Decision, latest: Configuration | None) -> list[str]:
    """What is wrong with decision ``d`` given ``latest``, the newest committed configuration it must respect."""
    out = []
    cfg = d.in_force
    if d.kind == "vote" and not cfg.is_voter(d.member):
        what = "a learner" if cfg.get(d.member) is not None else "not a member"
        out.append(f"{d.describe()} but is {what} of its configuration [{cfg.describe()}] (entry {cfg.index})")
    if not quorum_reached(cfg, d.quorum):
        older = [c for c in d.configs[:-1] if quorum_reached(c, d.quorum)]
        why = (f": a quorum only of the older configuration [{older[-1].describe()}] (entry {older[-1].index})"
               if older else "")
        out.append(f"{d.describe()}: not a majority of the configuration in force [{cfg.describe()}] "
                   f"(entry {cfg.index}){why}")
    if d.kind == "commit":
        out += rule_problems(d)
    if latest is not None and not any(_same_entry(c, latest) for c in d.configs):
        out.append(f"{d.describe()}: a quorum of the old configuration [{cfg.describe()}] (entry {cfg.index}, "
                   f"term {cfg.term}) after [{latest.describe()}] (entry {latest.index}, term {latest.term}) "
                   f"was committed, which its log does not hold")
    return out


def rule_problems(d: Decision) -> list[str]:
    """The two rules of :func:`dledger.membership.rules.refusal`, as a leader's log shows them at a commit.

    Before this decision the leader had committed up to ``d.since``: two configuration entries above it,
    the newer of the leader's own term, mean it proposed while a change was in flight; a configuration
    entry of its own term above it while its term-start entry is too means it proposed before it had
    committed an entry of its own term.
    """
    out = []
    uncommitted = [c for c in d.configs[1:] if c.index > d.since]
    if len(uncommitted) >= 2 and uncommitted[-1].term == d.term:
        out.append(f"rule: {d.member} (term {d.term}) proposed [{uncommitted[-1].describe()}] (entry "
                   f"{uncommitted[-1].index}) while entry {uncommitted[-2].index} was not committed: two changes "
                   f"in flight")
    own = [c for c in uncommitted if c.term == d.term]
    if own and d.since < d.term_start < own[0].index:
        out.append(f"rule: {d.member} (term {d.term}) proposed [{own[0].describe()}] (entry {own[0].index}) "
                   f"before its term-start entry {d.term_start} was committed (the leader's own-term rule)")
    return out


# -- after the run ------------------------------------------------------------------------------------------

def differing_members(a: Configuration, b: Configuration) -> list[str]:
    """Ids added, removed or whose role (or promotion mark) changed from ``a`` to ``b``."""
    ids = dict.fromkeys(a.ids + b.ids)
    return [m for m in ids if a.get(m) != b.get(m)]


def sequence_problems(logs: Mapping[str, Iterable], base: Configuration) -> list[str]:
    """The committed configurations of every member (``logs``: member -> committed entries) form one sequence.

    Members agree on the configuration entry at each index (and none has one where another has
    something else), and each configuration differs from the one before it (``base`` first) by
    exactly one member.
    """
    out: list[str] = []
    by_index: dict[int, tuple[str, Configuration]] = {}
    entries_at: dict[int, tuple[str, int, int]] = {}  # index -> (member, magic, term) for disagreement
    for mid, entries in logs.items():
        for e in entries:
            first = entries_at.setdefault(e.index, (mid, e.magic, e.term))
            if (e.magic == _CONFIG) != (first[1] == _CONFIG) or (e.magic == _CONFIG and e.term != first[2]):
                out.append(f"{mid} committed a {'configuration' if e.magic == _CONFIG else 'non-configuration'} "
                           f"entry (term {e.term}) at {e.index}, {first[0]} one of magic {first[1]} (term {first[2]})")
                continue
            if e.magic != _CONFIG:
                continue
            try:
                config = decode(e.body, e.index, e.term)
            except ConfigurationError as exc:
                out.append(f"{mid}: committed entry {e.index} is not a readable configuration ({exc})")
                continue
            seen = by_index.setdefault(e.index, (mid, config))
            if not _same_entry(seen[1], config):
                out.append(f"{mid} and {seen[0]} committed different configurations at {e.index}: "
                           f"[{config.describe()}] and [{seen[1].describe()}]")
    previous = base
    for index in sorted(by_index):
        config = by_index[index][1]
        changed = differing_members(previous, config)
        if len(changed) != 1:
            out.append(f"configuration entry {index} [{config.describe()}] differs from the one before it "
                       f"[{previous.describe()}] by {len(changed)} members ({', '.join(changed) or 'none'}), "
                       f"not exactly one")
        previous = config
    return out


def committed_sequence(logs: Mapping[str, Iterable]) -> list[Configuration]:
    """The committed configuration entries of ``logs``, in index order (one per index)."""
    seen: dict[int, Configuration] = {}
    for entries in logs.values():
        for e in entries:
            if e.magic == _CONFIG and e.index not in seen:
                seen[e.index] = decode(e.body, e.index, e.term)
    return [seen[i] for i in sorted(seen)]


class LogConfigs:
    """The configuration entries of one member's log, read from the log (entries scanned once each).

    A truncation is noticed when the last entry scanned is gone or has another term; the scan then
    starts again from the configurations still below the new end.
    """

    def __init__(self, store, base: Configuration):
        self.store = store
        self.base = base
        self.entries: list[Configuration] = []
        self.scanned = -1
        self.scanned_term = -1

    def refresh(self) -> tuple[Configuration, ...]:
        """``(base, *entries)`` as the log holds them now."""
        store = self.store
        end, begin = store.ledger_end_index, max(store.ledger_begin_index, 0)
        if self.scanned > end or (self.scanned >= begin and store.get(self.scanned).term != self.scanned_term):
            self._rescan(begin, end)
        for i in range(max(self.scanned + 1, begin), end + 1):
            e = store.get(i)
            if e.magic == _CONFIG:
                try:
                    self.entries.append(decode(e.body, e.index, e.term))
                except ConfigurationError:
                    pass  # reported by sequence_problems if it is ever committed
            self.scanned, self.scanned_term = i, e.term
        return (self.base, *self.entries)

    def _rescan(self, begin: int, end: int) -> None:
        """The log was cut back (and maybe rewritten): keep the configurations still there, scan again after them."""
        kept = []
        for c in self.entries:
            if c.index > end or c.index < begin or self.store.get(c.index).term != c.term:
                break
            kept.append(c)
        self.entries = kept
        self.scanned = kept[-1].index if kept else begin - 1
        self.scanned_term = kept[-1].term if kept else -1

    def in_force(self) -> Configuration:
        return self.refresh()[-1]
