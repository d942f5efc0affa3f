"""The leader's replication decisions as pure functions (SPEC §4): the compare step and the committed index.

The per-follower state machine is :mod:`dledger.replication.progress`; the follower's decisions are
:mod:`dledger.replication.follower_rules`.  Each function here has a table test in
``tests/test_replication_rules.py``, one row per SPEC sentence.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

# The damaged leader's hand-over is a transfer decision: it lives in election.transfer (below this layer,
# docs/architecture.md "Layers") and is re-exported here, where it was first written.
from dledger.election.transfer import DamageAction, damaged_leader_action  # noqa: F401
from dledger.membership import rules as membership_rules
from dledger.quorum import majority


class Step(enum.Enum):
    COMPARE = "COMPARE"
    TRUNCATE = "TRUNCATE"
    APPEND = "APPEND"
    INSTALL = "INSTALL"  # streaming a snapshot (dledger.replication.snapshot_send)


@dataclass(frozen=True)
class Next:
    """The dispatcher's next state and the index it works on (compare, truncate or first append index)."""

    step: Step
    index: int


def first_compare_index(compare_index: int, leader_begin: int, leader_end: int) -> int:
    """Where a COMPARE starts: the leader's end unless a previous compare index is still inside the log."""
    if compare_index == -1 or compare_index > leader_end or compare_index < leader_begin:
        return leader_end
    return compare_index


def after_compare(compare_index: int, same: bool, follower_begin: int, follower_end: int,
                  leader_begin: int, leader_end: int) -> Next:
    """The dispatcher's move after a COMPARE reply, in DLedger's order (SPEC §4 "COMPARE").

    ``same`` is True when the follower answered SUCCESS (it holds exactly the compared entry) and False
    for INCONSISTENT_STATE; any other answer is not a compare result, and the dispatcher retries
    instead of asking this function.
    """
    if same:
        if compare_index == follower_end:
            return Next(Step.APPEND, compare_index + 1)
        return Next(Step.TRUNCATE, compare_index)
    if follower_end < leader_begin or follower_begin > leader_end:
        return Next(Step.TRUNCATE, leader_begin)  # disjoint ranges
    if compare_index < follower_begin:
        return Next(Step.TRUNCATE, leader_begin)
    if compare_index > follower_end:
        compare_index = follower_end
    else:
        compare_index -= 1
    if compare_index < leader_begin:
        return Next(Step.TRUNCATE, leader_begin)
    return Next(Step.COMPARE, compare_index)


def quorum_index(watermarks: list[int], members: int) -> int:
    """The highest index stored on a majority: sort descending and take element ``members // 2``.

    Members without a watermark count as -1.
    """
    marks = sorted(watermarks + [-1] * (members - len(watermarks)), reverse=True)
    return marks[majority(members) - 1]


def new_commit_index(current: int, watermarks: list[int], members: int, term_start_index: int) -> int:
    """Committed index after counting replicas, advanced only to an entry of the current term (Raft §5.4.2).

    ``term_start_index`` is the first index the leader wrote in its term
    (every later entry is of that term too), so "the entry at the quorum index
    belongs to the current term" is ``quorum >= term_start_index``.
    """
    q = quorum_index(watermarks, members)
    if q > current and term_start_index >= 0 and q >= term_start_index:
        return q
    return current


def leader_commit_index(current: int, own: int, peer_marks: list[int], members: int, term_start_index: int) -> int:
    """The leader's new committed index: :func:`new_commit_index`, never above what it holds durably itself.

    ``own`` is the leader's own watermark (its flushed index, or its end when flushing is asynchronous).
    A quorum of followers may hold an entry the leader has not flushed yet; claiming it committed would
    let a crash of the leader lose an entry it already reported committed.
    """
    return min(new_commit_index(current, [own] + peer_marks, members, term_start_index), max(own, current))


def voters_commit_index(current: int, own: int, self_id: str, peer_marks: Mapping[str, int], config,
                        term_start_index: int) -> int:
    """:func:`leader_commit_index` over the voters of ``config`` (issue #23): learners never count, and the
    leader counts itself only if it is a voter (:func:`dledger.membership.rules.commit_index`).

    Only an entry of the leader's term commits by counting (``term_start_index``, Raft §5.4.2); the
    leader never claims committed what it does not hold durably itself.
    """
    matches = dict(peer_marks)
    matches[self_id] = own
    q = membership_rules.commit_index(config, matches)
    target = q if q > current and term_start_index >= 0 and q >= term_start_index else current
    return min(target, max(own, current))


def truncate_reason(follower_end: int | None) -> str:
    """Why the leader sends a TRUNCATE, for its log line: a fresh or wiped follower is filled, not repaired.

    A follower whose log is empty (a new group, a wiped store) also starts with a TRUNCATE at the
    leader's first index; saying "truncating" there reads like damage when nothing is wrong.
    """
    if follower_end is not None and follower_end < 0:
        return "its log is empty; sending it our log from index {index}"
    where = f" (it ends at {follower_end})" if follower_end is not None else ""
    return "truncating it at index {index} to repair its log" + where + "; normal after a crash or a long absence"
