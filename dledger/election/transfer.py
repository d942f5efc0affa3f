"""Leadership transfer decisions as pure functions (SPEC §3 "Leadership transfer", Java's preferredLeaderIds).

Both sides of a transfer decide here; the Twisted classes only move bytes and time:
:meth:`dledger.server.DLedgerServer.handle_leadership_transfer` (the leader side: may it start, does a
failure end it) and ``_check_preferred_leader`` (which preferred member to hand over to), and
:meth:`dledger.election.elector.LeaderElector.take_leadership` (the transferee side).  Each function has
a table test in ``tests/test_transfer_rules.py``, one row per rule; a damaged leader's hand-over
(:func:`damaged_leader_action`) has its table in ``tests/test_damaged_leader.py``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from dledger.codes import ResponseCode

#: A refusal: the code the request is answered with and a one-line reason.
Refusal = tuple[ResponseCode, str]


def within_transfer_wait(leader_end: int, mark: int, max_behind: int) -> bool:
    """A member holding entries up to ``mark`` is close enough to take over from a leader ending at ``leader_end``.

    ``maxLeadershipTransferWaitIndex`` bounds how long a transfer waits for the transferee to catch up
    (appends stop meanwhile): it may lag by fewer than ``max_behind`` entries.  The one place this bound
    is written: a requested transfer, the preferred-leader choice and a damaged leader's hand-over all
    use it.
    """
    return leader_end - mark < max_behind


def transfer_refusal(target: str, self_id: str, members: Collection[str], leads: bool, request_term: int,
                     curr_term: int, transferee: str | None, leader_end: int, target_mark: int,
                     max_behind: int) -> Refusal | None:
    """Why the leader refuses to start a transfer to ``target`` (SPEC §3 "Leadership transfer"), in order; None: start.

    The target must be another member of the group; only the leader transfers; the request's term, if
    given (-1: whatever term is current), must be ours; one transfer at a time (appends are already
    stopped for it); and the target must be within :func:`within_transfer_wait` of our end
    (``target_mark``: the highest index it is known to hold), or the wait would stall appends too long.
    """
    C = ResponseCode
    if target not in members or target == self_id:
        return C.UNKNOWN_MEMBER, f"cannot transfer leadership to {target!r}"
    if not leads:
        return C.NOT_LEADER, f"{self_id} does not lead"
    if request_term != -1 and request_term != curr_term:
        return C.INCONSISTENT_TERM, f"term {request_term} != {curr_term}"
    if transferee is not None:
        return C.LEADER_TRANSFERRING, f"already transferring to {transferee}"
    if not within_transfer_wait(leader_end, target_mark, max_behind):
        return C.FALL_BEHIND_TOO_MUCH, f"{target} is {leader_end - target_mark} entries behind (limit {max_behind})"
    return None


def transfer_failure_resumes(transferee: str | None, target: str, curr_term: int, term: int) -> bool:
    """A failed transfer to ``target`` (begun in ``term``) lets the leader append again ("times out back to normal").

    Only if it is still the transfer in progress: a role change since (a new term) already cleared it,
    and a later transfer to another member is not this one's to end.
    """
    return transferee == target and curr_term == term


def takes_preferred_check(self_id: str, preferred: Sequence[str]) -> bool:
    """This member looks for a preferred leader to hand over to: preferred members exist and it is not one.

    A preferred member leading keeps leadership (Java's ``preferredLeaderIds``): preferred members never
    hand over among themselves, so leadership does not bounce between them.
    """
    return bool(preferred) and self_id not in preferred


def preferred_transferee(self_id: str, preferred: Sequence[str], leads: bool, transferring: bool,
                         live: Mapping[str, bool], leader_end: int, marks: Mapping[str, int],
                         max_behind: int) -> str | None:
    """The preferred member a leader hands over to now: the first in configured order that qualifies; None: none.

    Only a leader not already transferring hands over; a candidate must be another member, seen live
    in the last heartbeat round (``live``), and within :func:`within_transfer_wait` of the leader's end
    (``marks``: highest index known held, -1 when unknown).  Asked again every heartbeat interval.
    """
    if not leads or transferring:
        return None
    for pid in preferred:
        if pid == self_id or not live.get(pid):
            continue
        if within_transfer_wait(leader_end, marks.get(pid, -1), max_behind):
            return pid
    return None


def take_leadership_refusal(request_term: int, curr_term: int, transfer_id: str | None, leader_id: str | None,
                            ledger_end_index: int, required_index: int, already_taking: bool,
                            damaged: str | None) -> Refusal | None:
    """Why the transferee refuses to take leadership (SPEC §3 "Leadership transfer"), in Java's order; None: take it.

    The transfer must come from our leader in our term, we must hold the index the leader asks for, we
    must not already be taking leadership, and a damaged store never stands for election.
    """
    C = ResponseCode
    if request_term != curr_term:
        return C.INCONSISTENT_TERM, f"transfer term {request_term} != {curr_term}"
    if transfer_id != leader_id:
        return C.INCONSISTENT_LEADER, f"transfer from {transfer_id} but our leader is {leader_id}"
    if ledger_end_index < required_index:
        return C.FALL_BEHIND_TOO_MUCH, f"our end index {ledger_end_index} < {required_index} required"
    if already_taking:
        return C.LEADER_TRANSFERRING, "already taking leadership"
    if damaged is not None:
        return C.TAKE_LEADERSHIP_FAILED, f"store damaged: {damaged}"
    return None


@dataclass(frozen=True)
class DamageAction:
    """What a leader that cannot read an entry it must replicate does next (see :func:`damaged_leader_action`).

    ``transfer_to`` names the member to hand leadership to; None means keep leading for now (nobody
    else can serve the entry yet) and decide again at the next heartbeat.
    """

    transfer_to: str | None
    why: str


def damaged_leader_action(damaged_index: int, leader_end: int, known: dict[str, int],
                          max_behind: int) -> DamageAction:
    """Where leadership goes when the leader's copy of entry ``damaged_index`` is unreadable (issue #9).

    ``known`` maps each peer to the highest index it is known to hold (-1: unknown or unreachable).
    A leader that cannot read a committed entry can never repair a follower that lacks it, so it
    hands leadership to a member that holds that entry -- the one holding the most, so the transfer
    waits least -- provided it is within ``max_behind`` entries (``maxLeadershipTransferWaitIndex``)
    of the leader's end, as a transfer requires.  If no member qualifies yet, stepping down would
    only stall the group in elections, so the leader keeps serving and asks again later.
    Ties go to the smaller id, so the choice is deterministic.
    """
    holders = [(mark, peer) for peer, mark in known.items()
               if mark >= damaged_index and within_transfer_wait(leader_end, mark, max_behind)]
    if not holders:
        return DamageAction(None, f"no member is known to hold entry {damaged_index} within {max_behind} "
                                  f"entries of the end ({leader_end})")
    mark, peer = min(holders, key=lambda h: (-h[0], h[1]))
    return DamageAction(peer, f"{peer} holds entries up to {mark} (entry {damaged_index} included)")
