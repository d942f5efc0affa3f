"""The leader's per-follower Progress (SPEC §4 "Dispatcher per follower"), one table row per rule."""

import pytest

from dledger.replication.progress import Progress
from dledger.replication.rules import Step


def progress(step=Step.APPEND, index=11, watermark=10, in_flight=None, outstanding=False, told=-1):
    p = Progress()
    p.become(step, index)
    p.watermark = watermark
    p.in_flight.update(in_flight or {})
    p.outstanding = outstanding
    p.told_commit = told
    return p


# -- stale replies: the generation --------------------------------------------------------------

def test_reply_of_the_current_generation_is_accepted():
    """A reply to a request sent in the current state may change it."""
    p = progress()
    assert p.accepts(p.gen)


def test_reply_from_before_a_state_change_is_refused():
    """Every change of step bumps the generation: replies to requests sent before it are stale."""
    p = progress()
    gen = p.gen
    p.become(Step.COMPARE, -1)
    assert not p.accepts(gen)


def test_reply_after_stop_is_refused():
    """Once leadership ended, no reply changes anything, not even one of the current generation."""
    p = progress()
    gen = p.gen
    p.stop()
    assert not p.accepts(gen) and not p.accepts(p.gen)


def test_state_change_forgets_what_was_in_flight():
    """Entering a step drops the pushes in flight and the outstanding request: their replies no longer count."""
    p = progress(in_flight={11: 12}, outstanding=True)
    p.become(Step.COMPARE, 7)
    assert (p.in_flight, p.outstanding, p.compare_index) == ({}, False, 7)


# -- the watermark (etcd's MaybeUpdate) ---------------------------------------------------------

WATERMARK = [
    # (rule, watermark, action, argument, expected watermark, expected result)
    ("append_ack_above_the_watermark_raises_it", 10, "append_acked", (11, 14), 14, True),
    ("late_append_ack_below_the_watermark_changes_nothing", 14, "append_acked", (11, 12), 14, False),
    ("compare_match_above_the_watermark_raises_it", 3, "matched", (8,), 8, True),
    ("compare_match_below_the_watermark_changes_nothing", 9, "matched", (8,), 9, False),
    ("follower_ending_below_the_watermark_lowers_it", 14, "shrunk_to", (6,), 6, True),
    ("follower_ending_above_the_watermark_changes_nothing", 14, "shrunk_to", (20,), 14, False),
]


@pytest.mark.parametrize("rule, mark, action, args, expected_mark, expected", WATERMARK, ids=[r[0] for r in WATERMARK])
def test_watermark(rule, mark, action, args, expected_mark, expected):
    """The watermark only moves forward on acks; only a follower saying it holds less brings it down."""
    p = progress(watermark=mark, in_flight={11: 14})
    assert getattr(p, action)(*args) is expected
    assert p.watermark == expected_mark


def test_append_ack_leaves_the_pipeline():
    """An acked APPEND is no longer in flight, whatever it did to the watermark."""
    p = progress(watermark=20, in_flight={11: 14, 15: 16})
    p.append_acked(11, 14)
    assert p.in_flight == {15: 16}


def test_truncate_sets_the_watermark_and_appends_after_it():
    """After a TRUNCATE at i the follower ends at i: the watermark is i and APPENDs start at i + 1."""
    p = progress(step=Step.TRUNCATE, index=5, watermark=9)
    p.truncated(5)
    assert (p.watermark, p.step, p.write_index) == (5, Step.APPEND, 6)


# -- the pipeline and COMMIT ---------------------------------------------------------------------

MAY_APPEND = [
    # (rule, write index, in flight, leader end, max in flight, expected)
    ("entries_left_and_room_sends", 11, {}, 20, 4, True),
    ("nothing_left_to_send_waits", 21, {}, 20, 4, False),
    ("pipeline_full_waits_for_acks", 15, {11: 11, 12: 12, 13: 13, 14: 14}, 20, 4, False),
    ("pipeline_with_room_sends_more", 14, {11: 11, 12: 12, 13: 13}, 20, 4, True),
]


@pytest.mark.parametrize("rule, write, flight, end, limit, expected", MAY_APPEND, ids=[r[0] for r in MAY_APPEND])
def test_may_append(rule, write, flight, end, limit, expected):
    """APPENDs are pipelined up to maxPendingSize in flight, in order from writeIndex (SPEC §4 "APPEND")."""
    p = progress(index=write, in_flight=flight)
    assert p.may_append(end, limit) is expected


MAY_APPEND_BYTES = [
    # (rule, pushes sent as (first, last, bytes), max bytes, expected)
    ("below_the_byte_budget_sends", [(11, 11, 100)], 1000, True),
    ("at_the_byte_budget_waits", [(11, 11, 600), (12, 12, 400)], 1000, False),
    ("one_push_larger_than_the_budget_still_goes_alone", [], 10, True),
    ("no_byte_budget_counts_pushes_only", [(11, 11, 10 ** 9)], None, True),
]


@pytest.mark.parametrize("rule, sent, budget, expected", MAY_APPEND_BYTES, ids=[r[0] for r in MAY_APPEND_BYTES])
def test_may_append_bytes(rule, sent, budget, expected):
    """Bytes in flight are bounded too (etcd's MaxInflightBytes): a far-behind follower is fed a window at a time."""
    p = progress(index=11)
    for first, last, n in sent:
        p.sent_append(first, last, n)
    assert p.may_append(100, 1000, budget) is expected


def test_acks_and_state_changes_release_the_bytes():
    """An acknowledged APPEND frees its bytes; a change of step forgets every push in flight."""
    p = progress(index=11)
    p.sent_append(11, 12, 700)
    p.sent_append(13, 13, 300)
    p.append_acked(11, 12)
    assert p.in_flight_bytes == 300 and p.in_flight == {13: 13}
    p.settled(13)
    assert p.in_flight_bytes == 0
    p.sent_append(14, 14, 50)
    p.become(Step.COMPARE, -1)
    assert p.in_flight_bytes == 0 and not p.in_flight


def test_sent_append_advances_the_write_index():
    """After sending first..last the next APPEND starts at last + 1 and first..last awaits its reply."""
    p = progress(index=11)
    p.sent_append(11, 15)
    assert (p.write_index, p.in_flight) == (16, {11: 15})


NEEDS_COMMIT = [
    # (rule, step, in flight, outstanding, told, committed, expected)
    ("caught_up_follower_is_told_a_new_commit", Step.APPEND, {}, False, 5, 8, True),
    ("already_told_this_commit", Step.APPEND, {}, False, 8, 8, False),
    ("appends_in_flight_carry_the_commit", Step.APPEND, {11: 12}, False, 5, 8, False),
    ("a_request_awaits_its_reply", Step.APPEND, {}, True, 5, 8, False),
    ("not_while_comparing", Step.COMPARE, {}, False, 5, 8, False),
]


@pytest.mark.parametrize("rule, step, flight, outstanding, told, committed, expected", NEEDS_COMMIT,
                         ids=[r[0] for r in NEEDS_COMMIT])
def test_needs_commit(rule, step, flight, outstanding, told, committed, expected):
    """When caught up, the dispatcher sends COMMIT with the leader's committedIndex (SPEC §4 "APPEND")."""
    p = progress(step=step, in_flight=flight, outstanding=outstanding, told=told)
    assert p.needs_commit(committed) is expected


def test_lost_commit_is_told_again():
    """A COMMIT without an answer is sent again: nothing is outstanding and the told commit is forgotten."""
    p = progress(outstanding=True, told=8)
    p.commit_lost()
    assert (p.outstanding, p.needs_commit(8)) == (False, True)


REPEATED = [
    # (rule, in flight, watermark, first, last, expected)
    ("another_copy_was_acked", {11: 14}, 14, 11, 14, True),
    ("no_copy_was_acked", {11: 14}, 12, 11, 14, False),
    ("already_answered_nothing_to_do", {}, 14, 11, 14, None),
]


@pytest.mark.parametrize("rule, flight, mark, first, last, expected", REPEATED, ids=[r[0] for r in REPEATED])
def test_repeated_settled(rule, flight, mark, first, last, expected):
    """After REPEATED_PUSH the push is settled if another copy's ack covered it, else the dispatcher re-compares."""
    p = progress(watermark=mark, in_flight=flight)
    assert p.repeated_settled(first, last) is expected


def test_known_index_is_unknown_while_the_follower_does_not_answer():
    """What a follower holds is known only while it answers (a restarted one may come back wiped)."""
    p = progress(watermark=14)
    p.in_contact = False
    assert p.known_index() == -1
    p.in_contact = True
    assert p.known_index() == 14
