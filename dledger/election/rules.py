"""Election decisions as pure functions (SPEC §3): state and a message in, a decision out.

Nothing here touches a clock, a disk or a socket, so every rule row is one
table-driven test.  :mod:`dledger.election.elector` applies the decisions:
it persists before it answers and it owns the timers.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dledger.codes import ResponseCode, VoteParseResult, VoteResult
from dledger.quorum import is_quorum

__all__ = ["is_quorum"]  # re-exported: the one majority rule lives in dledger.quorum


def next_term(curr_term: int, known_max_term: int) -> int:
    """The term a candidate moves to: the largest term seen in the group if larger, else one more."""
    return known_max_term if known_max_term > curr_term else curr_term + 1


@dataclass(frozen=True)
class VoterView:
    """What a member knows when it answers a vote or a heartbeat."""

    self_id: str
    members: frozenset[str]
    curr_term: int
    vote_for: str | None
    leader_id: str | None
    ledger_end_term: int
    ledger_end_index: int
    taking_leadership: bool = False
    #: The member known to have led ``curr_term`` (still set after it stopped leading; None when unknown).
    term_leader: str | None = None


class Action(enum.Enum):
    """What the caller must do after a decision, before replying."""

    NONE = "none"
    RECORD_VOTE = "record_vote"  # persist vote_for = candidate, then reply
    BECOME_CANDIDATE = "become_candidate"  # candidate at the request's term, increase term immediately
    REFRESH_LEADER = "refresh_leader"  # heartbeat from our leader: reset the follower timer
    BECOME_FOLLOWER = "become_follower"  # follow the heartbeat's leader in the current term


@dataclass(frozen=True)
class Decision:
    """The answer to a request and the state change it needs (``term`` = new candidate term)."""

    action: Action
    vote_result: VoteResult | None = None
    code: ResponseCode = ResponseCode.SUCCESS
    term: int = -1


def decide_vote(view: VoterView, candidate: str, term: int, ledger_end_term: int,
                ledger_end_index: int, is_self: bool) -> Decision:
    """``handleVote`` in SPEC §3's exact order."""
    R = VoteResult
    if candidate not in view.members:
        return Decision(Action.NONE, R.REJECT_UNKNOWN_LEADER)
    if not is_self and candidate == view.self_id:
        return Decision(Action.NONE, R.REJECT_UNEXPECTED_LEADER)
    if ledger_end_term < view.ledger_end_term:
        return Decision(Action.NONE, R.REJECT_EXPIRED_LEDGER_TERM)
    if ledger_end_term == view.ledger_end_term and ledger_end_index < view.ledger_end_index:
        return Decision(Action.NONE, R.REJECT_SMALL_LEDGER_END_INDEX)
    if term < view.curr_term:
        return Decision(Action.NONE, R.REJECT_EXPIRED_VOTE_TERM)
    if term == view.curr_term:
        if view.vote_for is not None and view.vote_for != candidate:
            if view.leader_id is not None:
                return Decision(Action.NONE, R.REJECT_ALREADY_HAS_LEADER)
            return Decision(Action.NONE, R.REJECT_ALREADY_VOTED)
        if not is_self and candidate == view.term_leader:
            # Not in Java DLedger (issue #29): the candidate already led this term, so our vote was spent on
            # that leadership.  A member that restarted after a machine crash may have lost the tail it
            # wrote as that leader; leading the same term again would write other entries under the same
            # (index, term) its followers hold.  dledger candidates never ask twice (rules.bumps_term);
            # this refusal makes a Java or older member move to a new term (WAIT_TO_VOTE_NEXT) instead.
            return Decision(Action.NONE, R.REJECT_ALREADY_VOTED)
    else:
        return Decision(Action.BECOME_CANDIDATE, R.REJECT_TERM_NOT_READY, term=term)
    if term < view.ledger_end_term:
        return Decision(Action.NONE, R.REJECT_TERM_SMALL_THAN_LEDGER)
    if (not is_self and view.taking_leadership and ledger_end_term == view.ledger_end_term
            and view.ledger_end_index >= ledger_end_index):
        return Decision(Action.NONE, R.REJECT_TAKING_LEADERSHIP)
    return Decision(Action.RECORD_VOTE, R.ACCEPT)


def may_ask_for_votes(voters: frozenset[str], candidate: str, candidate_end_term: int, candidate_end_index: int,
                      end_term: int, end_index: int) -> frozenset[str]:
    """Who :func:`decide_vote` hears as a candidate: our configuration's voters, plus one whose log is more up
    to date than ours (issue #23).

    A candidate outside the configuration we hold is refused before its term is looked at (it cannot move
    our term), unless its log is more up to date: then its log holds entries ours lacks -- entries that may
    have made it a voter (an equal last term and index means an equal log, so the same configuration,
    where it is no voter) -- and Raft's vote rule, which never consults the
    configuration, is safe for it (single-server changes: a majority of its configuration overlaps the
    majority that stored any later change, which refuses it by log).  Refusing it could deadlock the group:
    a lagging voter, still on the bootstrap configuration, refused the only electable member for good
    (seed 2079 of the membership simulator, found by mem-sim).  A removed member with an older log -- the
    usual case: it lacks its removal -- is still refused without a term change.
    """
    if candidate in voters:
        return voters
    if (candidate_end_term, candidate_end_index) > (end_term, end_index):
        return voters | {candidate}
    return voters


def vote_reply_term(view: VoterView, result: VoteResult) -> int:
    """The term a vote reply carries: the ledger's end term for REJECT_TERM_SMALL_THAN_LEDGER, else ours."""
    return view.ledger_end_term if result is VoteResult.REJECT_TERM_SMALL_THAN_LEDGER else view.curr_term


def decide_heartbeat(view: VoterView, leader: str, term: int) -> Decision:
    """``handleHeartBeat`` in SPEC §3's order."""
    C = ResponseCode
    if leader not in view.members:
        return Decision(Action.NONE, code=C.UNKNOWN_MEMBER)
    if leader == view.self_id:
        return Decision(Action.NONE, code=C.UNEXPECTED_MEMBER)
    if term < view.curr_term:
        return Decision(Action.NONE, code=C.EXPIRED_TERM)
    if term == view.curr_term:
        if view.leader_id == leader:
            return Decision(Action.REFRESH_LEADER)
        if view.leader_id is None:
            return Decision(Action.BECOME_FOLLOWER)
        return Decision(Action.NONE, code=C.INCONSISTENT_LEADER)
    return Decision(Action.BECOME_CANDIDATE, code=C.TERM_NOT_READY, term=term)


def bumps_term(last_parse: VoteParseResult, need_increase_term_immediately: bool,
               may_have_led_term: bool = False, first_round_after_change: bool = False) -> bool:
    """A candidate's next round moves to the next term (SPEC §3): after WAIT_TO_VOTE_NEXT, when told to,
    and -- unlike Java DLedger -- when it may have led its current term before it (re)started (issue #29).

    Every other outcome (WAIT_TO_REVOTE, REVOTE_IMMEDIATELY) asks again in the same term.  A member that
    restarted with its vote for itself in term T may have led T, and a machine crash may have taken the
    tail it wrote there (a leader pushes before its own flush completes).  Leading T again it could write
    other entries under an (index, term) a follower already holds: Raft's Log Matching property, and with
    it every later vote and commit, would break.  So it stands in T + 1 (see :func:`may_have_led`).

    A leader that merely stepped down, without a restart, may still ask again in its term as Java's does:
    its log is intact and only grew in that term, so a second leadership extends the same log (and voters
    that knew it as that term's leader refuse it anyway, :func:`decide_vote`).

    ``first_round_after_change`` (issue #23): the voters have changed (the configuration in force came from
    the log) and this is the first round of a candidacy (at start, or after following or leading).  Then it
    stands in a new term, as in Raft.  Asking in a term one already knew (as a follower, or as a candidate that
    lost it) is safe only while every vote of the term was cast among the same voters: a majority that never
    voted in it (members that followed its leader without a vote, members added since) could otherwise elect
    a second leader of it -- found by ``python -m tools.simulate replication --membership`` (two leaders in
    one term).  The later rounds of the candidacy (REVOTE_IMMEDIATELY after TERM_NOT_READY) stay in the term
    it moved to: the voters it woke need that term to answer.
    """
    return (last_parse is VoteParseResult.WAIT_TO_VOTE_NEXT or need_increase_term_immediately
            or may_have_led_term or first_round_after_change)


def may_have_led(curr_term: int, vote_for: str | None, self_id: str) -> int:
    """The highest term a member starting from its persisted ``(curr_term, vote_for)`` may have led; -1: none.

    A member leads a term only after voting for itself in it, and that vote is on disk before any vote
    request leaves; so a restarted member whose vote in ``curr_term`` is its own may have led it.
    """
    return curr_term if vote_for == self_id else -1


class NextVote(enum.Enum):
    """When the next vote round starts, relative to the randomized vote interval (SPEC §3 table)."""

    RANDOM = "random"
    RANDOM_PLUS_LEAK = "random + heartbeat x maxHeartBeatLeak"
    RANDOM_PLUS_MAX = "random + maxVoteInterval"
    NOW = "now"
    NONE = "none"


@dataclass
class VoteTally:
    """Counts one round of vote replies (the candidate's own vote included)."""

    term: int
    members: int
    valid: int = 0
    accepted: int = 0
    not_ready: int = 0
    bigger_ledger: int = 0
    already_has_leader: bool = False
    known_max_term: int = -1
    replies: int = 0
    results: list[VoteResult] = field(default_factory=list)

    def add(self, result: VoteResult, reply_term: int) -> None:
        """Count one reply; a lost or failed request counts as UNKNOWN."""
        R = VoteResult
        self.replies += 1
        self.results.append(result)
        if result is not R.UNKNOWN:
            self.valid += 1
        if result is R.ACCEPT:
            self.accepted += 1
        elif result is R.REJECT_ALREADY_HAS_LEADER:
            self.already_has_leader = True
        elif result in (R.REJECT_TERM_SMALL_THAN_LEDGER, R.REJECT_EXPIRED_VOTE_TERM):
            self.known_max_term = max(self.known_max_term, reply_term)
        elif result in (R.REJECT_EXPIRED_LEDGER_TERM, R.REJECT_SMALL_LEDGER_END_INDEX):
            self.bigger_ledger += 1
        elif result is R.REJECT_TERM_NOT_READY:
            self.not_ready += 1

    def certain(self) -> bool:
        """No more replies can change the outcome: stop waiting."""
        return (self.replies >= self.members or self.already_has_leader
                or is_quorum(self.accepted, self.members)
                or is_quorum(self.accepted + self.not_ready, self.members))

    def parse(self) -> tuple[VoteParseResult, NextVote]:
        """The SPEC §3 table, rows in order."""
        P, n = VoteParseResult, self.members
        if self.known_max_term > self.term:
            return P.WAIT_TO_VOTE_NEXT, NextVote.RANDOM
        if self.already_has_leader:
            return P.WAIT_TO_REVOTE, NextVote.RANDOM_PLUS_LEAK
        if not is_quorum(self.valid, n):
            return P.WAIT_TO_REVOTE, NextVote.RANDOM
        if not is_quorum(self.valid - self.bigger_ledger, n):
            return P.WAIT_TO_REVOTE, NextVote.RANDOM_PLUS_MAX
        if is_quorum(self.accepted, n):
            return P.PASSED, NextVote.NONE
        if is_quorum(self.accepted + self.not_ready, n):
            return P.REVOTE_IMMEDIATELY, NextVote.NOW
        return P.WAIT_TO_VOTE_NEXT, NextVote.RANDOM


def next_vote_delay(when: NextVote, interval: float, leak: float, max_vote: float) -> float:
    """Seconds until the next vote round for a :class:`NextVote` row; ``interval`` is the randomized interval."""
    return {
        NextVote.NOW: 0.0,
        NextVote.RANDOM: interval,
        NextVote.RANDOM_PLUS_LEAK: interval + leak,
        NextVote.RANDOM_PLUS_MAX: interval + max_vote,
    }[when]


class HeartbeatOutcome(enum.Enum):
    """What a leader does after a round of heartbeats."""

    STEP_DOWN_NEWER_TERM = "a larger term was seen: candidate at that term"
    OK = "a quorum answered SUCCESS"
    RESEND_NOW = "a quorum answered SUCCESS or TERM_NOT_READY: heartbeat again at once"
    STEP_DOWN_INCONSISTENT = "another leader in this term: candidate"
    STEP_DOWN_NO_QUORUM = "no quorum for maxHeartBeatLeak heartbeats: candidate (check-quorum)"
    KEEP = "no quorum yet, within the leak budget"


@dataclass
class HeartbeatTally:
    """Counts one round of heartbeat replies; the leader counts itself as a success."""

    term: int
    members: int
    success: int = 1
    not_ready: int = 0
    max_term: int = -1
    inconsistent_leader: bool = False
    replies: int = 1
    live: dict[str, bool] = field(default_factory=dict)
    #: The voters (issue #23): a learner's reply says it is live but counts toward nothing.  None: every
    #: peer votes.  A leader that is not a voter (it is removing itself) starts with ``success = replies = 0``.
    voters: frozenset[str] | None = None

    @classmethod
    def of_voters(cls, term: int, self_id: str, voters: frozenset[str]) -> HeartbeatTally:
        """A tally over ``voters``: the leader counts itself only if it is one of them."""
        own = 1 if self_id in voters else 0
        return cls(term=term, members=len(voters), success=own, replies=own, voters=voters)

    def add(self, peer: str, code: ResponseCode | None, reply_term: int = -1) -> None:
        """Count one reply; ``code`` None means the heartbeat failed (lost, refused, timed out)."""
        C = ResponseCode
        self.live[peer] = code is not None
        if self.voters is not None and peer not in self.voters:
            if code is C.EXPIRED_TERM:  # a newer term is a newer term, whoever reports it
                self.max_term = max(self.max_term, reply_term)
            return
        self.replies += 1
        if code is C.SUCCESS:
            self.success += 1
        elif code is C.EXPIRED_TERM:
            self.max_term = max(self.max_term, reply_term)
        elif code is C.INCONSISTENT_LEADER:
            self.inconsistent_leader = True
        elif code is C.TERM_NOT_READY:
            self.not_ready += 1

    def certain(self) -> bool:
        return self.replies >= self.members

    def leadership_confirmed(self) -> bool | None:
        """The ReadIndex check: True once a quorum answered SUCCESS, False once every reply is in without one.

        None: not decided yet, wait for more replies.
        """
        if is_quorum(self.success, self.members):
            return True
        return False if self.certain() else None

    def outcome(self, elapsed_since_quorum_ms: float, leak_ms: float) -> HeartbeatOutcome:
        """SPEC §3 "Leader", in order: a larger term first, then quorum, resend, inconsistency, check-quorum."""
        Out, n = HeartbeatOutcome, self.members
        if self.max_term > self.term:
            return Out.STEP_DOWN_NEWER_TERM
        if is_quorum(self.success, n):
            return Out.OK
        if is_quorum(self.success + self.not_ready, n):
            return Out.RESEND_NOW
        if self.inconsistent_leader:
            return Out.STEP_DOWN_INCONSISTENT
        if elapsed_since_quorum_ms > leak_ms:
            return Out.STEP_DOWN_NO_QUORUM
        return Out.KEEP
