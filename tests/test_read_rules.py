"""How a GET is answered (committed reads, ReadIndex, follower reads; dledger.reads), one row per rule."""

import pytest

from dledger.codes import ResponseCode
from dledger.reads import CONFIRM, SERVE, ReadAction, ReadDecision, confirmed_read_decision, read_decision

C = ResponseCode

READ_DECISION = [
    # (rule, leads, followerRead, begin, ledger begin, committed, expected action or refusal code)
    ("leader_serves_a_committed_index_at_once", True, False, 5, 0, 10, ReadAction.SERVE),
    ("leader_serves_its_committed_index_itself", True, False, 10, 0, 10, ReadAction.SERVE),
    ("leader_confirms_before_answering_past_its_commit", True, False, 11, 0, 10, ReadAction.CONFIRM),
    ("leader_confirms_when_nothing_is_committed", True, False, 0, 0, -1, ReadAction.CONFIRM),
    ("leader_refuses_below_its_begin_index", True, False, 3, 4, 10, C.INDEX_LESS_THAN_LOCAL_BEGIN),
    ("leader_ignores_the_follower_read_mark", True, True, 11, 0, 10, ReadAction.CONFIRM),
    ("follower_without_follower_read_redirects", False, False, 5, 0, 10, C.NOT_LEADER),
    ("follower_without_follower_read_redirects_first", False, False, 3, 4, 10, C.NOT_LEADER),
    ("follower_read_serves_the_committed_prefix", False, True, 5, 0, 10, ReadAction.SERVE),
    ("follower_read_serves_its_committed_index_itself", False, True, 10, 0, 10, ReadAction.SERVE),
    ("follower_read_never_answers_past_its_commit", False, True, 11, 0, 10, C.INDEX_OUT_OF_RANGE),
    ("follower_read_with_nothing_committed", False, True, 0, 0, -1, C.INDEX_OUT_OF_RANGE),
    ("follower_read_below_its_begin_index", False, True, 3, 4, 10, C.INDEX_LESS_THAN_LOCAL_BEGIN),
]


def _outcome(decision: ReadDecision):
    if decision.action is ReadAction.REFUSE:
        assert decision.code is not None and decision.why and "\n" not in decision.why
        return decision.code
    assert decision.code is None
    return decision.action


@pytest.mark.parametrize("rule, leads, follower_read, begin, ledger_begin, committed, expected", READ_DECISION,
                         ids=[r[0] for r in READ_DECISION])
def test_read_decision(rule, leads, follower_read, begin, ledger_begin, committed, expected):
    """A GET is served at once up to the member's committed index; past it the leader confirms, a follower refuses."""
    assert _outcome(read_decision(leads, follower_read, begin, ledger_begin, committed, "n1")) is expected


CONFIRMED_READ = [
    # (rule, quorum confirmed, same leadership, begin, committed, term start index, expected)
    ("confirmed_leader_says_not_committed_yet", True, True, 11, 10, 8, C.INDEX_OUT_OF_RANGE),
    ("confirmed_leader_serves_what_committed_meanwhile", True, True, 11, 12, 8, ReadAction.SERVE),
    ("no_quorum_no_answer_but_not_leader", False, True, 11, 10, 8, C.NOT_LEADER),
    ("leadership_lost_meanwhile_not_leader", True, False, 11, 10, 8, C.NOT_LEADER),
    ("own_term_not_committed_yet_leader_not_ready", True, True, 11, 10, 11, C.LEADER_NOT_READY),
    ("own_term_start_committed_is_ready", True, True, 12, 11, 11, C.INDEX_OUT_OF_RANGE),
    ("leadership_checked_before_readiness", False, True, 11, 10, 11, C.NOT_LEADER),
    ("readiness_checked_before_serving", True, True, 9, 10, 11, C.LEADER_NOT_READY),
]


@pytest.mark.parametrize("rule, confirmed, same, begin, committed, term_start, expected", CONFIRMED_READ,
                         ids=[r[0] for r in CONFIRMED_READ])
def test_confirmed_read_decision(rule, confirmed, same, begin, committed, term_start, expected):
    """ReadIndex: past its committed index the leader answers only once a quorum confirmed it and its term is ready."""
    assert _outcome(confirmed_read_decision(confirmed, same, begin, committed, term_start, "n0")) is expected


def test_refusal_names_the_leader_to_redirect_to():
    """A refused read becomes the one-line error the client gets, carrying the leader id it may redirect to."""
    decision = read_decision(False, True, 11, 0, 10, "n1")
    error = decision.error("n0")
    assert (error.code, error.leader_id) == (C.INDEX_OUT_OF_RANGE, "n0")
    assert "11" in error.message and "10" in error.message
    assert (SERVE.action, CONFIRM.action) == (ReadAction.SERVE, ReadAction.CONFIRM)
