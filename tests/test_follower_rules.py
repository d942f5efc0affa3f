"""The follower's replication rules of SPEC §4 "Entry handler" (dledger.replication.follower_rules)."""

import pytest

from dledger.replication.follower_rules import (
    AppendKind,
    MatchedPrefix,
    classify_append,
    commit_needs_compare,
    commit_to_adopt,
    leader_log_changed,
    overdue_push,
    stale_truncate,
)

ADOPT = [
    # (rule, leader commit, matched prefix, durable end, expected)
    ("adopts_the_leader_commit_when_everything_matches", 8, 10, 10, 8),
    ("never_past_the_prefix_known_to_match_the_leader", 8, 5, 10, 5),
    ("never_past_what_is_durable_here", 8, 10, 6, 6),
    ("nothing_verified_adopts_nothing", 8, -1, 10, -1),
]


@pytest.mark.parametrize("rule, commit, matched, durable, expected", ADOPT, ids=[r[0] for r in ADOPT])
def test_commit_to_adopt(rule, commit, matched, durable, expected):
    """After each append/truncate the follower adopts min(leaderCommit, matched prefix, durable end)."""
    assert commit_to_adopt(commit, matched, durable) == expected


COMMIT_COMPARE = [
    # (rule, leader commit, matched, end, expected)
    ("in_sync_follower_answers_success", 8, 10, 10, False),
    ("committed_entries_we_lack_ask_for_a_compare", 12, 10, 10, True),
    ("commit_past_an_unverified_tail_asks_for_a_compare", 8, 5, 10, True),
    ("commit_within_the_verified_prefix_is_fine", 5, 5, 10, False),
    ("fully_verified_log_commit_below_end", 7, 10, 10, False),
]


@pytest.mark.parametrize("rule, commit, matched, end, expected", COMMIT_COMPARE, ids=[r[0] for r in COMMIT_COMPARE])
def test_commit_needs_compare(rule, commit, matched, end, expected):
    """A COMMIT over entries we lack or have not verified is answered INCONSISTENT_STATE so the leader compares."""
    assert commit_needs_compare(commit, matched, end) is expected


STALE_TRUNCATE = [
    # (rule, truncate index, matched prefix of that leadership, expected)
    ("truncate_below_the_verified_prefix_is_stale", 4, 9, True),
    ("truncate_at_the_verified_prefix_is_obeyed", 9, 9, False),
    ("truncate_above_the_verified_prefix_is_obeyed", 12, 9, False),
    ("nothing_verified_with_this_leader_obeys", 0, -1, False),
]


@pytest.mark.parametrize("rule, index, matched, expected", STALE_TRUNCATE, ids=[r[0] for r in STALE_TRUNCATE])
def test_stale_truncate(rule, index, matched, expected):
    """Within one leadership the log only grows: a TRUNCATE below what was verified is a reordered old one."""
    assert stale_truncate(index, matched) is expected


LEADER_LOG_CHANGED = [
    # (rule, index of the leader's entry, it equals ours, matched prefix of that (term, leader), expected)
    ("different_entry_inside_the_verified_prefix_is_a_new_incarnation", 4, False, 9, True),
    ("different_entry_at_the_prefix_end_is_a_new_incarnation", 9, False, 9, True),
    ("different_entry_past_the_prefix_is_ordinary_repair", 10, False, 9, False),
    ("equal_entry_inside_the_prefix_changes_nothing", 4, True, 9, False),
    ("nothing_verified_nothing_to_forget", 0, False, -1, False),
]


@pytest.mark.parametrize("rule, index, same, matched, expected", LEADER_LOG_CHANGED,
                         ids=[r[0] for r in LEADER_LOG_CHANGED])
def test_leader_log_changed(rule, index, same, matched, expected):
    """A verified entry that the same (term, leader) now contradicts proves another leader incarnation (#29)."""
    assert leader_log_changed(index, same, matched) is expected


APPEND_KIND = [
    # (rule, first, last, follower end, expected)
    ("entries_after_the_end_wait_their_turn", 11, 14, 10, AppendKind.NEW),
    ("a_gap_still_waits", 15, 18, 10, AppendKind.NEW),
    ("retry_overlapping_the_end_keeps_the_new_part", 9, 14, 10, AppendKind.OVERLAP),
    ("everything_held_is_a_duplicate", 5, 10, 10, AppendKind.DUPLICATE),
]


@pytest.mark.parametrize("rule, first, last, end, expected", APPEND_KIND, ids=[r[0] for r in APPEND_KIND])
def test_classify_append(rule, first, last, end, expected):
    """APPENDs are applied at ledgerEndIndex + 1; held entries must agree before they are acked again."""
    assert classify_append(first, last, end) is expected


OVERDUE = [
    # (rule, waiting {first: arrived}, now, timeout, expected)
    ("nothing_waits", {}, 10.0, 1.0, None),
    ("young_pushes_keep_waiting", {15: 9.5}, 10.0, 1.0, None),
    ("push_that_waited_the_timeout_is_answered", {15: 9.0}, 10.0, 1.0, 15),
    ("timer_firing_an_ulp_early_still_counts", {15: 9.0}, 10.0 - 1e-9, 1.0, 15),
    ("earliest_index_first", {19: 8.0, 15: 8.5}, 10.0, 1.0, 15),
]


@pytest.mark.parametrize("rule, waiting, now, timeout, expected", OVERDUE, ids=[r[0] for r in OVERDUE])
def test_overdue_push(rule, waiting, now, timeout, expected):
    """Waiting APPENDs are answered INCONSISTENT_STATE after maxPushTimeOutMs (the fast-forward check)."""
    assert overdue_push(waiting, now, timeout) == expected


def test_matched_prefix_is_per_leadership():
    """What was verified against one leader counts for nothing with the next one."""
    m = MatchedPrefix()
    m.match((3, "n1"), 9)
    assert (m.of((3, "n1")), m.of((4, "n2")), m.known((4, "n2"))) == (9, -1, False)
    m.match((4, "n2"), 5)
    assert (m.of((4, "n2")), m.of((3, "n1"))) == (5, -1)


def test_matched_prefix_only_grows_within_a_leadership():
    """A later, lower confirmation does not shrink the verified prefix."""
    m = MatchedPrefix()
    m.match((3, "n1"), 9)
    m.match((3, "n1"), 4)
    assert m.of((3, "n1")) == 9
    m.reset()
    assert m.of((3, "n1")) == -1
