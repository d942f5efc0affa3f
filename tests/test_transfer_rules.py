"""The leadership-transfer rules of SPEC §3 ("Leadership transfer", preferredLeaderIds), one row per rule."""

import pytest

from dledger.codes import ResponseCode
from dledger.election.transfer import (
    preferred_transferee,
    take_leadership_refusal,
    takes_preferred_check,
    transfer_failure_resumes,
    transfer_refusal,
    within_transfer_wait,
)

C = ResponseCode
MEMBERS = frozenset({"n0", "n1", "n2"})


WITHIN_TRANSFER_WAIT = [
    # (rule, leader end, member's mark, maxLeadershipTransferWaitIndex, expected)
    ("caught_up_member_qualifies", 100, 100, 10, True),
    ("lagging_less_than_the_limit_qualifies", 100, 91, 10, True),
    ("lagging_by_the_limit_does_not", 100, 90, 10, False),
    ("unknown_progress_does_not", 100, -1, 10, False),
    ("empty_log_member_of_an_empty_leader_qualifies", -1, -1, 1, True),
]


@pytest.mark.parametrize("rule, end, mark, limit, expected", WITHIN_TRANSFER_WAIT,
                         ids=[r[0] for r in WITHIN_TRANSFER_WAIT])
def test_within_transfer_wait(rule, end, mark, limit, expected):
    """A transferee may lag the leader's end by fewer than maxLeadershipTransferWaitIndex entries."""
    assert within_transfer_wait(end, mark, limit) is expected


# -- the leader side: may a transfer start (checked in this order) ---------------------------------

TRANSFER_REFUSALS = [
    # (rule, changes to a valid request/state, expected code or None)
    ("caught_up_member_of_the_group_is_asked", {}, None),
    ("any_term_request_uses_the_current_term", {"request_term": -1}, None),
    ("unknown_target_is_refused", {"target": "n9"}, C.UNKNOWN_MEMBER),
    ("transfer_to_myself_is_refused", {"target": "n0"}, C.UNKNOWN_MEMBER),
    ("only_the_leader_transfers", {"leads": False}, C.NOT_LEADER),
    ("another_term_is_refused", {"request_term": 4}, C.INCONSISTENT_TERM),
    ("one_transfer_at_a_time", {"transferee": "n2"}, C.LEADER_TRANSFERRING),
    ("target_too_far_behind_is_refused", {"target_mark": 90}, C.FALL_BEHIND_TOO_MUCH),
    ("target_of_unknown_progress_is_refused", {"target_mark": -1}, C.FALL_BEHIND_TOO_MUCH),
    ("target_checked_before_leadership", {"target": "n9", "leads": False}, C.UNKNOWN_MEMBER),
    ("leadership_checked_before_term", {"leads": False, "request_term": 4}, C.NOT_LEADER),
    ("term_checked_before_a_transfer_in_progress", {"request_term": 4, "transferee": "n2"}, C.INCONSISTENT_TERM),
    ("transfer_in_progress_checked_before_lag", {"transferee": "n2", "target_mark": -1}, C.LEADER_TRANSFERRING),
]


@pytest.mark.parametrize("rule, changes, expected", TRANSFER_REFUSALS, ids=[r[0] for r in TRANSFER_REFUSALS])
def test_transfer_refusal(rule, changes, expected):
    """The leader starts a transfer only to another member, in its term, one at a time, to a caught-up target."""
    args = dict(target="n1", self_id="n0", members=MEMBERS, leads=True, request_term=5, curr_term=5,
                transferee=None, leader_end=100, target_mark=95, max_behind=10)
    args.update(changes)
    refusal = transfer_refusal(**args)
    assert (refusal[0] if refusal else None) is expected
    if refusal is not None:
        assert refusal[1] and "\n" not in refusal[1]


TRANSFER_FAILURE = [
    # (rule, transferee now, current term, expected)
    ("failed_transfer_resumes_appends", "n1", 5, True),
    ("a_new_term_already_ended_it", "n1", 6, False),
    ("a_transfer_to_another_member_is_not_ended", "n2", 5, False),
    ("nothing_in_progress_nothing_to_end", None, 5, False),
]


@pytest.mark.parametrize("rule, transferee, curr_term, expected", TRANSFER_FAILURE,
                         ids=[r[0] for r in TRANSFER_FAILURE])
def test_transfer_failure_resumes(rule, transferee, curr_term, expected):
    """A failed transfer (to n1, begun in term 5) ends only itself: appends resume ("times out back to normal")."""
    assert transfer_failure_resumes(transferee, "n1", curr_term, 5) is expected


# -- preferredLeaderIds ---------------------------------------------------------------------------

PREFERRED_CHECK = [
    # (rule, self id, preferred, expected)
    ("no_preferred_members_no_check", "n0", (), False),
    ("member_not_preferred_checks", "n0", ("n2",), True),
    ("preferred_member_keeps_leadership", "n2", ("n1", "n2"), False),
]


@pytest.mark.parametrize("rule, self_id, preferred, expected", PREFERRED_CHECK, ids=[r[0] for r in PREFERRED_CHECK])
def test_takes_preferred_check(rule, self_id, preferred, expected):
    """Only a member that is not preferred looks for a preferred leader to hand over to."""
    assert takes_preferred_check(self_id, preferred) is expected


PREFERRED_TRANSFEREE = [
    # (rule, changes to a leader n0 with preferred ("n1", "n2"), both live and caught up, expected)
    ("first_preferred_in_order_is_chosen", {}, "n1"),
    ("a_member_not_leading_hands_nothing_over", {"leads": False}, None),
    ("no_second_transfer_while_one_is_in_progress", {"transferring": True}, None),
    ("a_dead_preferred_member_is_skipped", {"live": {"n1": False, "n2": True}}, "n2"),
    ("a_preferred_member_not_seen_yet_is_skipped", {"live": {"n2": True}}, "n2"),
    ("a_preferred_member_too_far_behind_is_skipped", {"marks": {"n1": 90, "n2": 100}}, "n2"),
    ("a_preferred_member_of_unknown_progress_is_skipped", {"marks": {"n2": 100}}, "n2"),
    ("nobody_qualifies_keep_leading", {"live": {"n1": False, "n2": False}}, None),
    ("myself_in_the_list_is_skipped", {"preferred": ("n0", "n2")}, "n2"),
]


@pytest.mark.parametrize("rule, changes, expected", PREFERRED_TRANSFEREE, ids=[r[0] for r in PREFERRED_TRANSFEREE])
def test_preferred_transferee(rule, changes, expected):
    """A leader hands over to the first preferred member that is live and within the transfer wait of its end."""
    args = dict(self_id="n0", preferred=("n1", "n2"), leads=True, transferring=False,
                live={"n1": True, "n2": True}, leader_end=100, marks={"n1": 99, "n2": 100}, max_behind=10)
    args.update(changes)
    assert preferred_transferee(**args) == expected


# -- the transferee side --------------------------------------------------------------------------

TAKE_REFUSALS = [
    # (rule, changes to a valid request/state, expected code or None)
    ("from_our_leader_in_our_term_caught_up_takes_it", {}, None),
    ("another_term_is_refused", {"request_term": 4}, C.INCONSISTENT_TERM),
    ("not_our_leader_is_refused", {"transfer_id": "n2"}, C.INCONSISTENT_LEADER),
    ("behind_the_required_index_is_refused", {"ledger_end_index": 9}, C.FALL_BEHIND_TOO_MUCH),
    ("already_taking_is_refused", {"already_taking": True}, C.LEADER_TRANSFERRING),
    ("damaged_store_never_stands", {"damaged": "crc"}, C.TAKE_LEADERSHIP_FAILED),
    ("term_is_checked_first", {"request_term": 4, "transfer_id": "n2", "damaged": "crc"}, C.INCONSISTENT_TERM),
]


@pytest.mark.parametrize("rule, changes, expected", TAKE_REFUSALS, ids=[r[0] for r in TAKE_REFUSALS])
def test_take_leadership_refusal(rule, changes, expected):
    """The transferee takes leadership only when asked by its leader in its term and caught up (SPEC §3)."""
    args = dict(request_term=5, curr_term=5, transfer_id="n1", leader_id="n1", ledger_end_index=10,
                required_index=10, already_taking=False, damaged=None)
    args.update(changes)
    refusal = take_leadership_refusal(**args)
    assert (refusal[0] if refusal else None) is expected
