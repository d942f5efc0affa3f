"""The election rules of SPEC §3, one table row per rule, each test named after its rule."""

import pytest

from dledger.codes import ResponseCode, VoteParseResult, VoteResult
from dledger.election.rules import (
    Action,
    HeartbeatOutcome,
    HeartbeatTally,
    NextVote,
    VoterView,
    VoteTally,
    bumps_term,
    decide_heartbeat,
    decide_vote,
    is_quorum,
    may_have_led,
    next_term,
    next_vote_delay,
)
from dledger.quorum import majority

R = VoteResult
MEMBERS = frozenset({"n0", "n1", "n2"})


def view(**kw):
    base = dict(self_id="n0", members=MEMBERS, curr_term=5, vote_for=None, leader_id=None,
                ledger_end_term=4, ledger_end_index=10, taking_leadership=False)
    base.update(kw)
    return VoterView(**base)


def vote(v, candidate="n1", term=5, end_term=4, end_index=10, is_self=False):
    return decide_vote(v, candidate, term, end_term, end_index, is_self)


# -- handleVote, in SPEC order ----------------------------------------------------

VOTE_RULES = [
    # (rule name, view changes, request changes, expected result, expected action)
    ("unknown_candidate_is_rejected", {}, {"candidate": "n9"}, R.REJECT_UNKNOWN_LEADER, Action.NONE),
    ("remote_claiming_my_id_is_rejected", {}, {"candidate": "n0"}, R.REJECT_UNEXPECTED_LEADER, Action.NONE),
    ("my_own_vote_is_not_unexpected", {}, {"candidate": "n0", "is_self": True}, R.ACCEPT, Action.RECORD_VOTE),
    ("smaller_ledger_end_term_is_rejected", {}, {"end_term": 3, "end_index": 99}, R.REJECT_EXPIRED_LEDGER_TERM,
     Action.NONE),
    ("equal_ledger_term_smaller_index_is_rejected", {}, {"end_index": 9}, R.REJECT_SMALL_LEDGER_END_INDEX,
     Action.NONE),
    ("ledger_check_comes_before_term_check", {}, {"term": 9, "end_term": 3}, R.REJECT_EXPIRED_LEDGER_TERM,
     Action.NONE),
    ("smaller_request_term_is_rejected", {}, {"term": 4}, R.REJECT_EXPIRED_VOTE_TERM, Action.NONE),
    ("already_voted_with_known_leader", {"vote_for": "n2", "leader_id": "n2"}, {}, R.REJECT_ALREADY_HAS_LEADER,
     Action.NONE),
    ("already_voted_without_leader", {"vote_for": "n2"}, {}, R.REJECT_ALREADY_VOTED, Action.NONE),
    ("repeated_vote_for_same_candidate_is_granted", {"vote_for": "n1"}, {}, R.ACCEPT, Action.RECORD_VOTE),
    # Issue #29 (not in Java): a candidate known to have led this term already spent our vote on that leadership.
    ("candidate_that_led_this_term_is_refused", {"vote_for": "n1", "term_leader": "n1"}, {},
     R.REJECT_ALREADY_VOTED, Action.NONE),
    ("another_term_leader_does_not_refuse_this_candidate", {"vote_for": "n1", "term_leader": "n2"}, {}, R.ACCEPT,
     Action.RECORD_VOTE),
    ("term_leader_of_an_older_term_does_not_count", {"vote_for": "n1", "term_leader": "n1"}, {"term": 6},
     R.REJECT_TERM_NOT_READY, Action.BECOME_CANDIDATE),
    ("my_own_vote_is_granted_though_i_led", {"vote_for": "n0", "term_leader": "n0"},
     {"candidate": "n0", "is_self": True}, R.ACCEPT, Action.RECORD_VOTE),
    ("larger_request_term_makes_me_candidate_not_ready", {"vote_for": "n2", "leader_id": "n2"}, {"term": 7},
     R.REJECT_TERM_NOT_READY, Action.BECOME_CANDIDATE),
    ("request_term_below_my_ledger_term_is_rejected", {"curr_term": 3, "ledger_end_term": 4},
     {"term": 3, "end_term": 4}, R.REJECT_TERM_SMALL_THAN_LEDGER, Action.NONE),
    ("taking_leadership_rejects_logs_not_newer", {"taking_leadership": True}, {}, R.REJECT_TAKING_LEADERSHIP,
     Action.NONE),
    ("taking_leadership_accepts_a_newer_log", {"taking_leadership": True}, {"end_index": 11}, R.ACCEPT,
     Action.RECORD_VOTE),
    ("otherwise_accept_and_record", {}, {}, R.ACCEPT, Action.RECORD_VOTE),
    ("newer_ledger_term_is_accepted", {}, {"end_term": 5, "end_index": 0}, R.ACCEPT, Action.RECORD_VOTE),
]


@pytest.mark.parametrize("name, vchanges, rchanges, result, action", VOTE_RULES, ids=[r[0] for r in VOTE_RULES])
def test_handle_vote_rule(name, vchanges, rchanges, result, action):
    """Each handleVote rule of SPEC §3 gives its result and state change."""
    decision = vote(view(**vchanges), **rchanges)
    assert (decision.vote_result, decision.action) == (result, action)
    if action is Action.BECOME_CANDIDATE:
        assert decision.term == rchanges["term"]


# -- vote tally (SPEC §3 table, rows in order) -----------------------------------------

def tally(results, term=5, members=3, known=None):
    t = VoteTally(term=term, members=members)
    for r in results:
        t.add(r, known if known is not None else term)
    return t


TALLY_RULES = [
    ("known_max_term_bigger_waits_to_vote_next", [R.ACCEPT, R.REJECT_EXPIRED_VOTE_TERM, R.ACCEPT], 9,
     VoteParseResult.WAIT_TO_VOTE_NEXT, NextVote.RANDOM),
    ("already_has_leader_waits_long", [R.ACCEPT, R.REJECT_ALREADY_HAS_LEADER, R.ACCEPT], None,
     VoteParseResult.WAIT_TO_REVOTE, NextVote.RANDOM_PLUS_LEAK),
    ("no_quorum_of_valid_replies_revotes_same_term", [R.ACCEPT, R.UNKNOWN, R.UNKNOWN], None,
     VoteParseResult.WAIT_TO_REVOTE, NextVote.RANDOM),
    ("bigger_ledgers_make_a_quorum_impossible", [R.ACCEPT, R.REJECT_EXPIRED_LEDGER_TERM,
                                                 R.REJECT_SMALL_LEDGER_END_INDEX], None,
     VoteParseResult.WAIT_TO_REVOTE, NextVote.RANDOM_PLUS_MAX),
    ("quorum_of_accepts_passes", [R.ACCEPT, R.ACCEPT, R.REJECT_ALREADY_VOTED], None,
     VoteParseResult.PASSED, NextVote.NONE),
    ("quorum_with_not_ready_revotes_now", [R.ACCEPT, R.REJECT_TERM_NOT_READY, R.UNKNOWN], None,
     VoteParseResult.REVOTE_IMMEDIATELY, NextVote.NOW),
    ("otherwise_wait_to_vote_next_term", [R.REJECT_ALREADY_VOTED, R.REJECT_ALREADY_VOTED, R.ACCEPT], None,
     VoteParseResult.WAIT_TO_VOTE_NEXT, NextVote.RANDOM),
]


@pytest.mark.parametrize("name, results, known, parse, when", TALLY_RULES, ids=[r[0] for r in TALLY_RULES])
def test_vote_tally_rule(name, results, known, parse, when):
    """Each row of the vote-parse table maps the counts to its result and next-vote time."""
    assert tally(results, known=known).parse() == (parse, when)


def test_tally_rows_are_checked_in_order():
    """A bigger known term wins over a quorum of accepts (row 1 before row 5)."""
    t = tally([R.ACCEPT, R.ACCEPT, R.REJECT_TERM_SMALL_THAN_LEDGER], known=8)
    assert t.parse()[0] is VoteParseResult.WAIT_TO_VOTE_NEXT


def test_tally_is_certain_early():
    """Waiting stops once a quorum accepted, a leader is known or everyone replied."""
    t = VoteTally(term=1, members=5)
    for _ in range(3):
        assert not t.certain()
        t.add(R.ACCEPT, 1)
    assert t.certain()
    t = VoteTally(term=1, members=5)
    t.add(R.REJECT_ALREADY_HAS_LEADER, 1)
    assert t.certain()


# -- heartbeats -------------------------------------------------------------------------

C = ResponseCode
HEARTBEAT_RULES = [
    ("unknown_leader_is_unknown_member", {}, "n9", 5, C.UNKNOWN_MEMBER, Action.NONE),
    ("remote_claiming_my_id_is_unexpected", {}, "n0", 5, C.UNEXPECTED_MEMBER, Action.NONE),
    ("smaller_term_is_expired", {}, "n1", 4, C.EXPIRED_TERM, Action.NONE),
    ("same_term_same_leader_refreshes", {"leader_id": "n1"}, "n1", 5, C.SUCCESS, Action.REFRESH_LEADER),
    ("same_term_no_leader_becomes_follower", {}, "n1", 5, C.SUCCESS, Action.BECOME_FOLLOWER),
    ("same_term_other_leader_is_inconsistent", {"leader_id": "n2"}, "n1", 5, C.INCONSISTENT_LEADER, Action.NONE),
    ("larger_term_makes_me_candidate_not_ready", {"leader_id": "n2"}, "n1", 6, C.TERM_NOT_READY,
     Action.BECOME_CANDIDATE),
]


@pytest.mark.parametrize("name, vchanges, leader, term, code, action", HEARTBEAT_RULES,
                         ids=[r[0] for r in HEARTBEAT_RULES])
def test_handle_heartbeat_rule(name, vchanges, leader, term, code, action):
    """Each handleHeartBeat rule of SPEC §3 gives its code and state change."""
    d = decide_heartbeat(view(**vchanges), leader, term)
    assert (d.code, d.action) == (code, action)


def hb(codes, term=5, members=3):
    t = HeartbeatTally(term=term, members=members)
    for i, (code, rterm) in enumerate(codes):
        t.add(f"n{i + 1}", code, rterm)
    return t


HB_OUTCOMES = [
    ("larger_term_steps_down_first", [(C.SUCCESS, -1), (C.EXPIRED_TERM, 9)], 0, HeartbeatOutcome.STEP_DOWN_NEWER_TERM),
    ("quorum_of_success_is_ok", [(C.SUCCESS, -1), (None, -1)], 0, HeartbeatOutcome.OK),
    ("success_plus_not_ready_resends_now", [(C.TERM_NOT_READY, -1), (None, -1)], 0, HeartbeatOutcome.RESEND_NOW),
    ("inconsistent_leader_steps_down", [(C.INCONSISTENT_LEADER, -1), (None, -1)], 0,
     HeartbeatOutcome.STEP_DOWN_INCONSISTENT),
    ("no_quorum_past_leak_steps_down", [(None, -1), (None, -1)], 6001, HeartbeatOutcome.STEP_DOWN_NO_QUORUM),
    ("no_quorum_within_leak_keeps_leading", [(None, -1), (None, -1)], 5999, HeartbeatOutcome.KEEP),
]


@pytest.mark.parametrize("name, codes, elapsed, outcome", HB_OUTCOMES, ids=[r[0] for r in HB_OUTCOMES])
def test_heartbeat_outcome_rule(name, codes, elapsed, outcome):
    """Each leader rule after a heartbeat round (SPEC §3 "Leader") in order, with check-quorum."""
    t = hb(codes)
    assert t.outcome(elapsed, 6000) is outcome


def test_heartbeat_tally_marks_live_peers():
    """Peers that answered are live, failed ones are not."""
    t = hb([(C.SUCCESS, -1), (None, -1)])
    assert t.live == {"n1": True, "n2": False}


# -- helpers ------------------------------------------------------------------------------

@pytest.mark.parametrize("n, members, expected", [(1, 1, True), (1, 2, False), (2, 3, True), (1, 3, False),
                                                   (3, 5, True), (2, 5, False), (2, 4, False), (3, 4, True)])
def test_is_quorum(n, members, expected):
    """isQuorum(n) is n >= members // 2 + 1."""
    assert is_quorum(n, members) is expected


@pytest.mark.parametrize("curr, known, expected", [(3, 3, 4), (3, 1, 4), (3, 7, 7)])
def test_next_term(curr, known, expected):
    """nextTerm jumps to the largest known term if larger, else adds one."""
    assert next_term(curr, known) == expected


@pytest.mark.parametrize("members, expected", [(1, 1), (2, 2), (3, 2), (4, 3), (5, 3), (6, 4)])
def test_majority(members, expected):
    """A majority of n members is n // 2 + 1."""
    assert majority(members) == expected


BUMPS_TERM = [
    # (rule, last parse result, need increase term immediately, may have led the term before a restart, expected)
    ("wait_to_vote_next_moves_to_the_next_term", VoteParseResult.WAIT_TO_VOTE_NEXT, False, False, True),
    ("told_to_increase_the_term_moves_on", VoteParseResult.WAIT_TO_REVOTE, True, False, True),
    ("wait_to_revote_asks_again_in_the_same_term", VoteParseResult.WAIT_TO_REVOTE, False, False, False),
    ("revote_immediately_asks_again_in_the_same_term", VoteParseResult.REVOTE_IMMEDIATELY, False, False, False),
    # Issue #29 (Raft, not Java): never lead a term twice, even right after a start in WAIT_TO_REVOTE.
    ("restarted_with_own_vote_moves_to_the_next_term", VoteParseResult.WAIT_TO_REVOTE, False, True, True),
    ("restarted_with_own_vote_moves_on_after_revote_too", VoteParseResult.REVOTE_IMMEDIATELY, False, True, True),
]


@pytest.mark.parametrize("rule, parse, need, led, expected", BUMPS_TERM, ids=[r[0] for r in BUMPS_TERM])
def test_bumps_term(rule, parse, need, led, expected):
    """A candidate moves to the next term after WAIT_TO_VOTE_NEXT, when told to, or when it may have led its term."""
    assert bumps_term(parse, need, led) is expected


@pytest.mark.parametrize("parse", [VoteParseResult.WAIT_TO_REVOTE, VoteParseResult.REVOTE_IMMEDIATELY])
def test_bumps_term_once_the_voters_changed(parse):
    """Issue #23: once the configuration came from the log, the first round of a candidacy is in a new term
    (Raft's rule): a majority that never voted in the current term -- members added
    since, members that followed its leader without a vote -- must not elect a second leader of it
    (tests/test_membership_sim.py, the simulator's seed 99)."""
    assert bumps_term(parse, False, False) is False
    assert bumps_term(parse, False, False, first_round_after_change=True) is True


MAY_HAVE_LED = [
    # (rule, persisted term, persisted vote, self id, expected)
    ("own_vote_in_the_term_means_it_may_have_led_it", 7, "n0", "n0", 7),
    ("vote_for_another_never_led", 7, "n1", "n0", -1),
    ("no_vote_never_led", 7, None, "n0", -1),
    ("fresh_member_never_led", 0, None, "n0", -1),
]


@pytest.mark.parametrize("rule, term, vote, me, expected", MAY_HAVE_LED, ids=[r[0] for r in MAY_HAVE_LED])
def test_may_have_led(rule, term, vote, me, expected):
    """A member leads a term only after its own vote there is on disk: that vote is the evidence."""
    assert may_have_led(term, vote, me) == expected


NEXT_VOTE_DELAY = [
    # (rule, row, expected delay with interval 0.4, leak 6.0, max vote 1.0)
    ("now_is_immediate", NextVote.NOW, 0.0),
    ("random_waits_the_randomized_interval", NextVote.RANDOM, 0.4),
    ("known_leader_waits_the_heartbeat_leak_too", NextVote.RANDOM_PLUS_LEAK, 6.4),
    ("bigger_ledgers_wait_max_vote_interval_too", NextVote.RANDOM_PLUS_MAX, 1.4),
]


@pytest.mark.parametrize("rule, when, expected", NEXT_VOTE_DELAY, ids=[r[0] for r in NEXT_VOTE_DELAY])
def test_next_vote_delay(rule, when, expected):
    """The next vote round starts after the delay of its SPEC §3 table row."""
    assert next_vote_delay(when, 0.4, 6.0, 1.0) == pytest.approx(expected)


READ_INDEX = [
    # (rule, replies, expected)
    ("quorum_of_successes_confirms", [(C.SUCCESS, -1)], True),
    ("all_replies_in_without_quorum_refuses", [(C.EXPIRED_TERM, 9), (None, -1)], False),
    ("undecided_waits", [(None, -1)], None),
]


@pytest.mark.parametrize("rule, replies, expected", READ_INDEX, ids=[r[0] for r in READ_INDEX])
def test_leadership_confirmed(rule, replies, expected):
    """ReadIndex: a leader serves a read only once a quorum (itself included) answered a heartbeat of its term."""
    t = HeartbeatTally(term=5, members=3)
    for i, (code, term) in enumerate(replies):
        t.add(f"n{i + 1}", code, term)
    assert t.leadership_confirmed() is expected


MAY_ASK = [
    # (rule, voters, candidate, candidate's (end term, end index), ours, heard)
    ("a_voter_is_heard", {"a", "b", "c"}, "b", (1, 5), (2, 9), True),
    ("an_outsider_behind_us_is_refused_unheard", {"a", "b", "c"}, "x", (2, 8), (2, 9), False),
    ("an_outsider_with_an_older_last_term_is_refused", {"a", "b", "c"}, "x", (1, 50), (2, 9), False),
    ("an_outsider_with_our_log_holds_our_configuration", {"a", "b", "c"}, "x", (2, 9), (2, 9), False),
    ("an_outsider_ahead_may_hold_its_promotion", {"a", "b", "c"}, "x", (3, 1), (2, 9), True),
]


@pytest.mark.parametrize("rule, voters, candidate, theirs, ours, heard", MAY_ASK, ids=[r[0] for r in MAY_ASK])
def test_may_ask_for_votes(rule, voters, candidate, theirs, ours, heard):
    """Issue #23: a candidate outside our configuration is heard only with a log ahead of ours (it may hold the
    entry that made it a voter); otherwise it is refused before its term moves ours."""
    from dledger.election.rules import may_ask_for_votes

    members = may_ask_for_votes(frozenset(voters), candidate, *theirs, *ours)
    assert (candidate in members) is heard and frozenset(voters) <= members


def test_round_guard_ignores_replies_of_ended_rounds():
    """A reply counts only in its own round: a role change, a newer round or a stop makes it stale."""
    from dledger.election.rounds import RoundGuard

    g = RoundGuard()
    first = g.begin()
    assert g.busy and g.current(first)
    g.end()
    assert not g.busy and not g.current(first)
    second = g.begin()
    assert second != first and g.current(second)
    g.invalidate()  # stopped mid-round: still busy (no new round starts), the old replies are stale
    assert g.busy and not g.current(second)
