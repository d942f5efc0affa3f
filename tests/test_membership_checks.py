"""The simulator's membership checks (issue #23): table tests of dledger.testing.configcheck.

Each check must be able to fail: every row that should be flagged is, with the reason named, and the
classic single-server-change bug (Ongaro, raft-dev, July 2015) written out as the decisions it makes
is caught.
"""

from dataclasses import dataclass

import pytest

from dledger.codes import EntryType
from dledger.membership.configuration import Configuration, MemberInfo, MemberRole
from dledger.testing.configcheck import (
    Decision,
    LogConfigs,
    MembershipChecker,
    decision_problems,
    differing_members,
    sequence_problems,
)

V, L = MemberRole.VOTER, MemberRole.LEARNER


def cfg(spec: str, index: int = 0, term: int = 0) -> Configuration:
    """``"a b c e:l"``: members a, b, c voters and e a learner."""
    members = []
    for k, word in enumerate(spec.split()):
        mid, _, role = word.partition(":")
        members.append(MemberInfo(mid, f"127.0.0.1:{20000 + ord(mid[0]) * 10 + len(mid) + k}",
                                  L if role == "l" else V))
    return Configuration(tuple(members), index, term)


ABCD = cfg("a b c d")
# Stable addresses per id (the table needs the same MemberInfo for the same member in two configurations).
ADDR = {m.id: m.address for m in cfg("a b c d e f").members}


def conf(spec: str, index: int = 0, term: int = 0) -> Configuration:
    members = []
    for word in spec.split():
        mid, _, role = word.partition(":")
        members.append(MemberInfo(mid, ADDR[mid], L if role == "l" else V))
    return Configuration(tuple(members), index, term)


def commit(member, term, index, acks, *configs, since=-1):
    return Decision("commit", member, term, index, frozenset(acks), tuple(configs), since=since)


def win(member, term, voters, *configs):
    return Decision("vote", member, term, 0, frozenset(voters), tuple(configs))


BASE = conf("a b c d")
WITH_E = conf("a b c d e", 5, 1)  # a adds e (promoted at once, for brevity)
NO_A = conf("b c d", 6, 2)  # b removes a


@pytest.mark.parametrize("decision, latest, flagged", [
    # a majority of the configuration in force: fine
    (commit("a", 1, 3, "abc", BASE), None, None),
    (commit("a", 1, 6, "ace", BASE, WITH_E), None, None),
    # 2 of 4 is no majority; a learner's acknowledgement never counts
    (commit("a", 1, 3, "ab", BASE), None, "not a majority of the configuration in force"),
    (commit("a", 1, 6, "abe", BASE, conf("a b c d e:l", 5, 1)), None, "not a majority"),
    # d removed: its acknowledgement no longer counts; d demoted to a learner likewise
    (commit("a", 2, 7, "ad", BASE, conf("a b c", 6, 2)), None, "not a majority"),
    (commit("a", 2, 7, "abd", BASE, conf("a b d:l c", 6, 2)), None, None),
    # counting with the old configuration after appending the new one: 2 of {a,b,c} but not of {a,b,c,d}
    (commit("a", 2, 7, "ab", conf("a b c"), conf("a b c d", 6, 2)), None,
     "a quorum only of the older configuration"),
    # the decider lacks the committed configuration at or below the index it commits
    (commit("a", 3, 9, "ace", BASE, WITH_E), NO_A, "which its log does not hold"),
    (commit("b", 2, 9, "bc", BASE, NO_A), NO_A, None),
    # elections: the winner must vote in its configuration, and hold what earlier terms committed
    (win("a", 3, "ade", BASE, WITH_E), None, None),
    (win("a", 3, "ade", BASE, WITH_E), NO_A, "which its log does not hold"),
    (win("e", 3, "bce", BASE, conf("a b c d e:l", 5, 1)), None, "is a learner of its configuration"),
    (win("a", 3, "bcd", BASE, NO_A), None, "is not a member of its configuration"),
    (win("b", 3, "b", BASE), None, "not a majority"),
])
def test_decision_table(decision, latest, flagged):
    problems = decision_problems(decision, latest)
    if flagged is None:
        assert problems == []
    else:
        assert any(flagged in p for p in problems), problems


def test_latest_committed_is_by_log_order_for_commits_and_by_term_for_elections():
    """A commit respects configurations committed at or below its index; an election those of earlier terms."""
    checker = MembershipChecker()
    checker.decided(commit("b", 2, 6, "bcd", BASE, NO_A, since=4))
    checker.config_committed("b", NO_A)
    assert checker.commit_term == {6: 2} and checker.problems == []
    # a stale leader of term 1 committing index 5 (below the removal) is no old-configuration quorum
    assert checker.check(commit("a", 1, 5, "abc", BASE, WITH_E)) == []
    # an election of term 2 itself need not hold what term 2 committed; term 3 must
    assert checker.check(win("a", 2, "ade", BASE, WITH_E)) == []
    assert checker.check(win("a", 3, "ade", BASE, WITH_E))


def test_ongaro_2015_scenario_is_caught():
    """The classic bug as decisions: b commits a's removal in term 2 without an entry of its own term first,
    then a (holding its uncommitted addition of e from term 1) wins term 3 with {a, d, e}."""
    checker = MembershipChecker()
    checker.decided(win("a", 1, "abc", BASE))
    checker.decided(commit("a", 1, 4, "abc", BASE, since=-1))  # entries 0..4 of term 1, all committed
    checker.decided(win("b", 2, "bcd", BASE))  # a's entry 5 (add e) reached only e
    removal = conf("b c d", 5, 2)  # b proposes at once -- no entry of term 2 committed before
    checker.decided(commit("b", 2, 5, "bc", BASE, removal, since=4))
    checker.config_committed("b", removal)
    assert checker.problems == []
    checker.decided(win("a", 3, "ade", BASE, WITH_E))  # a majority of {a..e}: no overlap with {b, c}
    assert any("a quorum of the old configuration" in p and "which its log does not hold" in p
               for p in checker.problems), checker.problems
    checker.config_committed("a", WITH_E)  # a then overwrites index 5 and commits its own configuration
    assert any("where [b=" in p for p in checker.problems)


def test_learners_and_removed_members_never_stand_and_their_votes_are_counted():
    checker = MembershipChecker()
    checker.vote_cast("e", 3, "a", conf("a b c d e:l", 5, 1))  # not a voter in its own log yet: allowed
    checker.vote_cast("a", 3, "b", NO_A)
    checker.vote_cast("b", 3, "b", NO_A)
    assert checker.problems == [] and checker.votes == 3 and checker.votes_by_non_voters == 2
    checker.vote_cast("e", 4, "e", conf("a b c d e:l", 5, 1))
    checker.vote_cast("a", 4, "a", NO_A)
    assert len(checker.problems) == 2 and "e stood for election in term 4 although it is a learner" in \
        checker.problems[0] and "not a member" in checker.problems[1]


@dataclass
class E:
    index: int
    term: int
    magic: int
    body: bytes = b""


def config_entry(c: Configuration) -> E:
    return E(c.index, c.term, int(EntryType.CONFIG_CHANGE), c.encode())


def log_of(*entries) -> list:
    out = []
    for k, e in enumerate(entries):
        out.append(e if isinstance(e, E) else E(k, e, int(EntryType.NORMAL)))
    return out


def test_sequence_single_server_and_agreement():
    add_e = conf("a b c d e:l", 2, 1)
    promote_e = conf("a b c d e", 3, 1)
    good = log_of(1, 1, config_entry(add_e), config_entry(promote_e), 1)
    assert sequence_problems({"a": good, "b": good[:4]}, BASE) == []
    two_at_once = conf("a b c d e f", 3, 1)
    problems = sequence_problems({"a": log_of(1, 1, config_entry(add_e), config_entry(two_at_once))}, BASE)
    assert len(problems) == 1 and "by 1 members" not in problems[0] and "e, f" in problems[0]
    other = log_of(1, 1, config_entry(conf("a b c", 2, 2)))
    problems = sequence_problems({"a": good, "b": other}, BASE)
    assert any("term 2" in p and "at 2" in p for p in problems)
    same_again = log_of(1, config_entry(conf("a b c d", 1, 1)))  # a "change" that changes nothing
    assert differing_members(BASE, BASE) == [] and "by 0 members" in sequence_problems({"a": same_again}, BASE)[0]


class FakeStore:
    def __init__(self, entries):
        self.entries = list(entries)
        self.ledger_begin_index = 0
        self.reads = 0

    @property
    def ledger_end_index(self):
        return len(self.entries) - 1

    def get(self, i):
        self.reads += 1
        return self.entries[i]


def test_log_configs_follows_appends_and_truncations():
    add_e = conf("a b c d e:l", 2, 1)
    store = FakeStore(log_of(1, 1, config_entry(add_e), 1))
    logs = LogConfigs(store, BASE)
    assert logs.in_force() == add_e
    reads = store.reads
    store.entries.append(E(4, 1, int(EntryType.NORMAL)))
    assert logs.in_force() == add_e and store.reads - reads == 2  # the last scanned entry, then the new one
    del store.entries[2:]  # a follower's truncation, then another leader's entries
    assert logs.in_force() == BASE
    other = conf("b c d", 3, 2)
    store.entries += [E(2, 2, int(EntryType.NORMAL)), config_entry(other)]
    assert logs.refresh() == (BASE, other)
    store.entries[3] = config_entry(conf("b c d a:l", 3, 3))  # same length, rewritten
    assert logs.in_force().term == 3


def test_rules_seen_in_a_leaders_log():
    """Two changes in flight, and a change before the term-start entry committed, are named as broken rules."""
    promote_e = conf("a b c d e", 5, 2)
    promote_f = conf("a b c d e f", 6, 2)
    two = commit("a", 2, 6, "abcef", conf("a b c d e:l f:l"), promote_e, promote_f, since=4)
    assert any("two changes in flight" in p for p in decision_problems(two, None))
    one = commit("a", 2, 5, "abce", BASE, promote_e, since=4)
    assert decision_problems(one, None) == []
    early = Decision("commit", "b", 2, 5, frozenset("bc"), (BASE, conf("b c d", 5, 2)), since=3, term_start=4)
    assert any("own-term rule" in p for p in decision_problems(early, None))
    after_noop = Decision("commit", "b", 2, 5, frozenset("bc"), (BASE, conf("b c d", 5, 2)), since=4, term_start=4)
    assert decision_problems(after_noop, None) == []
    # a new leader proposing on top of an uncommitted change of an earlier term breaks the rule as well
    older_term = commit("a", 3, 6, "abcde", BASE, promote_e, conf("a b c d", 6, 3), since=4)
    assert any("two changes in flight" in p for p in decision_problems(older_term, None))
