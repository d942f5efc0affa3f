"""The leader's replication rules of SPEC §4 (dledger.replication.rules), one table row per SPEC sentence."""

import pytest

from dledger.replication.rules import (
    Next,
    Step,
    after_compare,
    first_compare_index,
    leader_commit_index,
    new_commit_index,
    quorum_index,
)

# -- where a COMPARE starts ---------------------------------------------------------------------

FIRST_COMPARE = [
    # (rule, previous compare index, leader begin, leader end, expected)
    ("new_dispatcher_compares_at_leader_end", -1, 0, 20, 20),
    ("previous_compare_index_inside_log_is_kept", 12, 0, 20, 12),
    ("previous_compare_index_past_leader_end_restarts_at_end", 25, 0, 20, 20),
    ("previous_compare_index_below_leader_begin_restarts_at_end", 3, 5, 20, 20),
]


@pytest.mark.parametrize("rule, prev, begin, end, expected", FIRST_COMPARE, ids=[r[0] for r in FIRST_COMPARE])
def test_first_compare_index(rule, prev, begin, end, expected):
    """COMPARE starts at the leader's end unless an earlier compare index is still inside the leader's log."""
    assert first_compare_index(prev, begin, end) == expected


# -- SPEC §4 "COMPARE": the dispatcher's next step ---------------------------------------------

AFTER_COMPARE = [
    # (rule, compare index, same, follower begin, follower end, leader begin, leader end, expected)
    ("equal_entry_at_follower_end_appends_from_next", 10, True, 0, 10, 0, 20, Next(Step.APPEND, 11)),
    ("equal_entry_below_follower_end_truncates_there", 10, True, 0, 15, 0, 20, Next(Step.TRUNCATE, 10)),
    ("follower_range_below_leader_begin_truncates_at_leader_begin", 4, False, 0, 4, 5, 20,
     Next(Step.TRUNCATE, 5)),
    ("follower_range_above_leader_end_truncates_at_leader_begin", 20, False, 21, 30, 0, 20,
     Next(Step.TRUNCATE, 0)),
    ("compare_index_below_follower_begin_truncates_at_leader_begin", 3, False, 5, 10, 0, 20,
     Next(Step.TRUNCATE, 0)),
    ("compare_index_past_follower_end_moves_to_follower_end", 20, False, 0, 12, 0, 20, Next(Step.COMPARE, 12)),
    ("mismatch_inside_range_steps_back_one", 10, False, 0, 15, 0, 20, Next(Step.COMPARE, 9)),
    ("stepping_below_leader_begin_truncates_at_leader_begin", 5, False, 0, 15, 5, 20, Next(Step.TRUNCATE, 5)),
    ("empty_follower_is_filled_from_leader_begin", 20, False, -1, -1, 0, 20, Next(Step.TRUNCATE, 0)),
]


@pytest.mark.parametrize("rule, index, same, fbegin, fend, lbegin, lend, expected", AFTER_COMPARE,
                         ids=[r[0] for r in AFTER_COMPARE])
def test_after_compare(rule, index, same, fbegin, fend, lbegin, lend, expected):
    """Each COMPARE reply moves the dispatcher as SPEC §4's COMPARE paragraph says."""
    assert after_compare(index, same, fbegin, fend, lbegin, lend) == expected


# -- SPEC §4 "Quorum ack checker" (the table of etcd's majority_commit.txt) ---------------------

QUORUM = [
    # (rule, watermarks, members, expected)
    ("single_member_commits_its_own_end", [7], 1, 7),
    ("three_members_take_the_second_highest", [9, 5, 7], 3, 7),
    ("missing_watermarks_count_as_nothing_stored", [9], 3, -1),
    ("two_of_three_is_a_majority", [9, 8], 3, 8),
    ("four_members_need_three", [9, 8, 2, 1], 4, 2),
    ("five_members_take_the_third_highest", [1, 9, 3, 7, 5], 5, 5),
    ("ties_count_once_each", [4, 4, 4], 3, 4),
]


@pytest.mark.parametrize("rule, marks, members, expected", QUORUM, ids=[r[0] for r in QUORUM])
def test_quorum_index(rule, marks, members, expected):
    """The quorum index is the highest index stored on a majority of the members."""
    assert quorum_index(marks, members) == expected


NEW_COMMIT = [
    # (rule, current, watermarks, members, term start, expected)
    ("advances_to_the_quorum_index_of_the_current_term", 3, [9, 8, 2], 3, 5, 8),
    ("never_commits_an_entry_of_an_older_term_by_counting", 3, [9, 4, 2], 3, 5, 3),
    ("commits_the_term_start_entry_itself", 3, [9, 5, 2], 3, 5, 5),
    ("never_moves_back", 8, [9, 4, 2], 3, 5, 8),
    ("nothing_before_the_term_started", 3, [9, 8, 2], 3, -1, 3),
]


@pytest.mark.parametrize("rule, current, marks, members, start, expected", NEW_COMMIT, ids=[r[0] for r in NEW_COMMIT])
def test_new_commit_index(rule, current, marks, members, start, expected):
    """committedIndex moves to the quorum index only if that entry belongs to the current term (Raft §5.4.2)."""
    assert new_commit_index(current, marks, members, start) == expected


LEADER_COMMIT = [
    # (rule, current, own, peer watermarks, members, term start, expected)
    ("quorum_of_followers_commits_what_the_leader_holds", 3, 9, [8, 2], 3, 5, 8),
    ("never_above_what_the_leader_holds_durably", 3, 6, [8, 8], 3, 5, 6),
    ("never_below_the_current_commit_when_the_leader_lags_its_own_flush", 7, 6, [8, 8], 3, 5, 7),
    ("term_rule_still_applies", 3, 9, [4, 4], 3, 5, 3),
]


@pytest.mark.parametrize("rule, current, own, peers, members, start, expected", LEADER_COMMIT,
                         ids=[r[0] for r in LEADER_COMMIT])
def test_leader_commit_index(rule, current, own, peers, members, start, expected):
    """The leader never claims committed an entry it does not hold durably itself."""
    assert leader_commit_index(current, own, peers, members, start) == expected
