"""The leader elector: DLedger's election (SPEC §3) on reactor timers.

Java runs a state-maintainer thread that polls every 10 ms; here each role
arms exactly one timer for its next action instead:

* candidate -- the next vote round (``nextTimeToRequestVote``),
* follower  -- the heartbeat deadline (``maxHeartBeatLeak x heartbeat``),
* leader    -- the next heartbeat round.

Decisions come from :mod:`dledger.election.rules`; this module applies
them and owns the timers.  Term and vote changes are written by
:class:`MemberState` through a BlockingIO (off the reactor thread for a
running member); nothing that depends on one -- a vote reply, a heartbeat
reply, a vote request of the new term, our own vote -- is sent or counted
before :meth:`MemberState.persisted` fires.
Requests to peers go through the injected transport and never block.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from dledger.codes import ResponseCode, Role, VoteParseResult
from dledger.election.confirm import confirm_leadership
from dledger.election.notifier import RoleChangeNotifier
from dledger.election.rounds import RoundGuard, heartbeat_round, heartbeat_tally, vote_round
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
    may_ask_for_votes,
    next_vote_delay,
    vote_reply_term,
)
from dledger.election.take import TakeLeadership
from dledger.messages import (
    HeartBeatRequest,
    HeartBeatResponse,
    LeadershipTransferRequest,
    VoteRequest,
    VoteResponse,
)
from dledger.ratelog import RateLimitedLog
from dledger.timing import due

log = Logger()

class LeaderElector:
    """Drives one member's role.

    Role changes are observed one way: :meth:`observe` registers a callback ``(term, role)`` (optionally
    only for some roles), called synchronously, in registration order, on every role change; it returns
    the call that deregisters it (hashicorp/raft's ``RegisterObserver``/``DeregisterObserver``).  The
    member's own reactions (the server's replicator, stats, simulation checkers) are observers; after
    them, :attr:`notifier` delivers the change to plugin ``IRoleChangeHandler`` objects asynchronously, one
    at a time, so a slow handler never holds the elector up.
    """

    def __init__(self, config, state, store, transport, clock, rng: random.Random | None = None):
        self.config = config
        self.state = state
        self.store = store
        self.transport = transport
        self.clock = clock
        self.rng = rng or random.Random()
        self.notifier = RoleChangeNotifier(state.self_id)
        #: The registered observers, in order (use :meth:`observe`; appending here is the same without a filter).
        self.observers: list[Callable[[int, Role], None]] = []
        ms = 1 / 1000.0
        self.heartbeat = config.heart_beat_time_interval_ms * ms
        self.leak = config.max_heart_beat_leak * self.heartbeat
        self.min_vote = config.min_vote_interval_ms * ms
        self.max_vote = config.max_vote_interval_ms * ms
        self.min_take = config.min_take_leadership_vote_interval_ms * ms
        self.max_take = config.max_take_leadership_vote_interval_ms * ms
        self.vote_timeout = self.heartbeat + self.max_vote
        self.last_parse_result = VoteParseResult.WAIT_TO_REVOTE
        self.need_increase_term_immediately = False
        #: The next round is the first of a candidacy (at start, or after following or leading): once the voters
        #: changed it moves to a new term (rules.bumps_term, issue #23).
        self._first_round = True
        self.next_time_to_request_vote = 0.0
        self.last_leader_heartbeat = 0.0
        self.last_succ_heartbeat = 0.0
        self._timer = None
        self.rounds = RoundGuard()  # the vote/heartbeat round in flight: stale replies are ignored
        #: Vote rounds this member started (it asked for votes): tests and monitoring read it.
        self.vote_rounds = 0
        self._take = TakeLeadership(self)  # the transferee side of a leadership transfer (:mod:`.take`)
        self.running = False
        #: Set (to the reason) when this member's store is found damaged: it then never asks for votes
        #: nor takes leadership, until a restart after the operator repaired the store (issue #9).
        self.store_damaged: str | None = None
        self._damage_log = RateLimitedLog(log, clock, interval=60.0)
        self._not_voter_logged: str | None = None  # the last "not standing: learner/removed" reason logged

    def not_standing(self) -> str | None:
        """Why this member does not stand for election now (None: it may): a damaged store, or not a voter.

        A learner and a member the configuration in force no longer holds never time out into a
        candidate that asks for votes (:func:`dledger.membership.rules.may_stand`); they follow whoever wins.
        """
        if self.store_damaged is not None:
            return self.store_damaged
        st = self.state
        if not st.votes:
            return ("a learner of the configuration in force (it receives the log; the leader promotes it)"
                    if st.self_id in st.member_set else "not a member of the configuration in force")
        return None

    # -- observers ------------------------------------------------------------
    def observe(self, callback: Callable[[int, Role], None], *,
                roles: Iterable[Role] | None = None) -> Callable[[], None]:
        """Call ``callback(term, role)`` on every role change (to one of ``roles``, if given); returns deregister.

        Observers run synchronously, in registration order, before plugin role-change handlers are told;
        they must not block.  Deregistering twice is harmless.
        """
        wanted = None if roles is None else frozenset(roles)
        if wanted is None:
            observer = callback
        else:
            def observer(term: int, role: Role) -> None:
                if role in wanted:
                    callback(term, role)

        self.observers.append(observer)

        def deregister() -> None:
            if observer in self.observers:
                self.observers.remove(observer)

        return deregister

    # -- lifecycle ------------------------------------------------------------
    def start(self) -> None:
        """Begin as a candidate (SPEC §2); the first vote round starts at once."""
        self.running = True
        if not self.config.enable_leader_elector:
            return
        self.next_time_to_request_vote = self.clock.seconds()
        self._arm(0)

    def stop(self) -> None:
        """Cancel every timer; replies still in flight are ignored."""
        self.running = False
        self.rounds.invalidate()
        self._cancel()
        self.notifier.stop()
        self._take.finish(ResponseCode.TAKE_LEADERSHIP_FAILED, "member stopped")

    def pause(self) -> None:
        """Freeze the role as a stopped process would (SIGSTOP): no timer fires, replies in flight are ignored.

        Unlike :meth:`stop`, nothing is answered or notified: the member keeps believing what it believed
        (a paused leader still thinks it leads), which is what tests of a deposed-but-unaware leader need.
        """
        self.running = False
        self.rounds.invalidate()
        self._cancel()

    # -- timers ----------------------------------------------------------------
    def _cancel(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _arm(self, delay: float) -> None:
        self._cancel()
        if self.running:
            self._timer = self.clock.callLater(max(0.0, delay), self._wake)

    def _wake(self) -> None:
        self._timer = None
        if not self.running or self.rounds.busy:
            return
        role = self.state.role
        if role is Role.CANDIDATE:
            self._maintain_as_candidate()
        elif role is Role.FOLLOWER:
            self._maintain_as_follower()
        else:
            heartbeat_round(self)

    def _vote_interval(self) -> float:
        if self.state.taking_leadership:
            return self.min_take + self.rng.random() * (self.max_take - self.min_take)
        return self.min_vote + self.rng.random() * (self.max_vote - self.min_vote)

    # -- role changes ------------------------------------------------------------
    def _role_changed(self, role: Role) -> None:
        term = self.state.curr_term
        self.rounds.end()
        log.info("{id}: now {role} in term {term} (leader {leader})", id=self.state.self_id, role=role.name,
                 term=term, leader=self.state.leader_id)
        for observer in list(self.observers):
            observer(term, role)
        self.notifier.notify(term, role)
        if role is Role.LEADER:
            self._take.finish(ResponseCode.SUCCESS)

    def change_to_candidate(self, term: int) -> None:
        """Become candidate knowing ``term`` (the elector's ``changeRoleToCandidate``)."""
        was = self.state.role, self.state.curr_term
        if not self.state.change_to_candidate(term):
            return
        if was[0] is not Role.CANDIDATE:
            self._first_round = True
        if was != (Role.CANDIDATE, self.state.curr_term):
            self._role_changed(Role.CANDIDATE)
        self._arm(max(0.0, self.next_time_to_request_vote - self.clock.seconds()))

    def _change_to_follower(self, term: int, leader_id: str) -> None:
        self.state.change_to_follower(term, leader_id)
        self.last_parse_result = VoteParseResult.WAIT_TO_REVOTE
        self.last_leader_heartbeat = self.clock.seconds()
        self._role_changed(Role.FOLLOWER)
        self._arm(self.leak)

    def _change_to_leader(self, term: int) -> None:
        self.state.change_to_leader(term)
        self.last_parse_result = VoteParseResult.WAIT_TO_REVOTE
        self.last_succ_heartbeat = self.clock.seconds()
        self._role_changed(Role.LEADER)
        self._arm(0)

    # -- follower ----------------------------------------------------------------
    def _maintain_as_follower(self) -> None:
        now = self.clock.seconds()
        elapsed = now - self.last_leader_heartbeat
        if due(self.last_leader_heartbeat + self.leak, now):
            log.info("{id}: no heartbeat from {leader} for {s:.3f}s: {what} in term {term}",
                     id=self.state.self_id, leader=self.state.leader_id, s=elapsed, term=self.state.curr_term,
                     what="standing for election" if self.not_standing() is None
                     else "waiting for a new leader (not standing)")
            self.next_time_to_request_vote = self.clock.seconds()
            self.change_to_candidate(self.state.curr_term)
        else:
            self._arm(self.leak - elapsed)

    # -- candidate ---------------------------------------------------------------
    def _maintain_as_candidate(self) -> None:
        now = self.clock.seconds()
        why = self.not_standing()
        if why is not None:
            # Still a follower of whoever wins; never a candidate asking for votes.  It adopts a higher
            # term others already use (so their heartbeats and votes reach it), never a new one.
            if self.store_damaged is not None:
                self._damage_log.warn("not-standing", "{id}: not standing for election: {why}; repair the store "
                                      "and restart this member", id=self.state.self_id, why=why)
            elif why != self._not_voter_logged:
                self._not_voter_logged = why
                log.info("{id}: not standing for election: {why}", id=self.state.self_id, why=why)
            if self.state.known_max_term > self.state.curr_term:
                self.state.next_term()
            self.need_increase_term_immediately = False
            self.next_time_to_request_vote = now + self._vote_interval()
            self._arm(self.next_time_to_request_vote - now)
            return
        if not due(self.next_time_to_request_vote, now) and not self.need_increase_term_immediately:
            self._arm(self.next_time_to_request_vote - now)
            return
        st = self.state
        config = st.configuration
        first_after_change = self._first_round and config is not None and config.index > 0  # issue #23
        self._first_round = False
        if bumps_term(self.last_parse_result, self.need_increase_term_immediately, st.led_current_term,
                      first_after_change):
            prev, led = st.curr_term, st.led_current_term
            term = st.next_term()
            log.info("{id}: candidate moves from term {prev} to {term}{why}", id=st.self_id, prev=prev, term=term,
                     why=f" (its vote in term {prev} was its own before it started: it may have led it, and "
                     "never leads a term twice)" if led else "")
            self.last_parse_result = VoteParseResult.WAIT_TO_REVOTE
        else:
            term = st.curr_term
        if self.need_increase_term_immediately:
            self.need_increase_term_immediately = False
            self.next_time_to_request_vote = now + self._vote_interval()
            self._arm(self.next_time_to_request_vote - now)
            return
        vote_round(self, term)

    def retry_vote_later(self) -> None:
        """A vote round could not start (its term was not written): try again after a vote interval."""
        self.next_time_to_request_vote = self.clock.seconds() + self._vote_interval()
        self._arm(self.next_time_to_request_vote - self.clock.seconds())

    def vote_round_done(self, term: int, tally: VoteTally) -> None:
        """The vote round of ``term`` is decided: lead, or wait for the next round (rules.next_vote_delay)."""
        self.rounds.end()
        parse, when = tally.parse()
        now = self.clock.seconds()
        self.last_parse_result = parse
        log.debug("{id}: vote round term {term}: {parse} (valid={v} accepted={a} notReady={n} biggerLedger={b} "
                  "hasLeader={h} maxTerm={m})", id=self.state.self_id, term=term, parse=parse.name, v=tally.valid,
                  a=tally.accepted, n=tally.not_ready, b=tally.bigger_ledger, h=tally.already_has_leader,
                  m=tally.known_max_term)
        if self.state.role is not Role.CANDIDATE or self.state.curr_term != term:
            self._arm(0)
            return
        if parse is VoteParseResult.PASSED:
            self._change_to_leader(term)
            return
        # One randomized interval is drawn per row whatever the row, as always: seeded schedules replay unchanged.
        draws = {row: self._vote_interval() for row in (NextVote.RANDOM, NextVote.RANDOM_PLUS_LEAK,
                                                         NextVote.RANDOM_PLUS_MAX)}
        delay = next_vote_delay(when, draws.get(when, 0.0), self.leak, self.max_vote)
        self.next_time_to_request_vote = now + delay
        if tally.known_max_term > term:
            self.change_to_candidate(tally.known_max_term)
        self._arm(delay)

    # -- leader ------------------------------------------------------------------
    def heartbeats_done(self, term: int, tally: HeartbeatTally, sent_at: float) -> None:
        """A heartbeat round is decided: stay leader and arm the next one, resend at once, or step down."""
        self.rounds.end()
        st = self.state
        now = self.clock.seconds()
        st.peers_live.update(tally.live)
        if st.role is not Role.LEADER or st.curr_term != term:
            return
        outcome = tally.outcome((now - self.last_succ_heartbeat) * 1000, self.leak * 1000)
        Out = HeartbeatOutcome
        if outcome is Out.OK:
            self.last_succ_heartbeat = now
        elif outcome is Out.RESEND_NOW:
            self._arm(0)
            return
        elif outcome in (Out.STEP_DOWN_NEWER_TERM, Out.STEP_DOWN_INCONSISTENT, Out.STEP_DOWN_NO_QUORUM):
            log.info("{id}: leader of term {term} steps down: {why}", id=st.self_id, term=term, why=outcome.value)
            self.next_time_to_request_vote = now + self._vote_interval()
            self.change_to_candidate(max(tally.max_term, term))
            return
        self._arm(max(0.0, sent_at + self.heartbeat - now))

    # -- request handlers ----------------------------------------------------------
    def view(self, members=None) -> VoterView:
        """What this member knows; ``members`` is who may ask (the voters for votes, every member by default)."""
        st = self.state
        return VoterView(st.self_id, st.member_set if members is None else members, st.curr_term, st.vote_for,
                         st.leader_id,
                         self.store.ledger_end_term, self.store.ledger_end_index, st.taking_leadership,
                         st.term_leader)

    def handle_vote(self, request: VoteRequest, is_self: bool = False) -> Deferred:
        """Answer a vote (SPEC §3): a Deferred of the reply, fired only once a granted vote is on disk.

        The vote is recorded in memory at once (a second candidate of this term is refused from now on)
        and written through the member's BlockingIO; the reply waits for that write, and for any
        term/vote write still in flight, so it never promises what the disk does not hold.
        """
        # Only a voter of our configuration, or a candidate whose log is ahead of ours, may be voted for
        # (issue #23, rules.may_ask_for_votes): a removed member with an older log cannot disrupt us.
        view = self.view(may_ask_for_votes(self.state.voter_set, request.leader_id, request.ledger_end_term,
                                           request.ledger_end_index, self.store.ledger_end_term,
                                           self.store.ledger_end_index))
        decision = decide_vote(view, request.leader_id, request.term, request.ledger_end_term,
                               request.ledger_end_index, is_self)
        if decision.action is Action.RECORD_VOTE:
            written = self.state.record_vote(request.leader_id)
        else:
            if decision.action is Action.BECOME_CANDIDATE:
                self.change_to_candidate(decision.term)
                self.need_increase_term_immediately = True
                self.arm_if_idle()
            written = self.state.persisted()
        # Java copies the request's base fields (localId/remoteId unswapped) into the reply.
        reply = request.base_reply(VoteResponse, vote_result=decision.vote_result,
                                   term=vote_reply_term(view, decision.vote_result))
        return written.addCallback(lambda _: reply)

    def handle_heartbeat(self, request: HeartBeatRequest) -> HeartBeatResponse | Deferred:
        """Answer a heartbeat (SPEC §3); held (a Deferred) while a term/vote write is in flight."""
        st = self.state
        # A leader outside the configuration this member holds is heard too (issue #23; Java answers
        # UNKNOWN_MEMBER): entries this member's log does not hold yet may have added it (a member that was
        # away while the group changed, a learner whose --peers lack today's leader), or it is removing
        # itself until that change commits.  Either way it won its term's votes from the voters -- a member
        # outside a configuration never does, voters refuse it -- and this member learns the configuration
        # from its log.  (Without authentication the id check proved nothing; with it, the connection's
        # guard admits only the configuration's members.)
        members = st.member_set | {request.leader_id}
        view = self.view(members)
        decision = decide_heartbeat(view, request.leader_id, request.term)
        if decision.action is Action.REFRESH_LEADER:
            self.last_leader_heartbeat = self.clock.seconds()
        elif decision.action is Action.BECOME_FOLLOWER:
            self._change_to_follower(request.term, request.leader_id)
        elif decision.action is Action.BECOME_CANDIDATE:
            self.change_to_candidate(decision.term)
            self.need_increase_term_immediately = True
            self.arm_if_idle()
        # Only EXPIRED_TERM tells the leader our term; Java leaves it -1 otherwise.
        term = view.curr_term if decision.code is ResponseCode.EXPIRED_TERM else -1
        return self.state.after_persisted(HeartBeatResponse(code=int(decision.code), term=term))

    def arm_if_idle(self) -> None:
        if not self.rounds.busy:
            self._arm(0)

    # -- leadership transfer (transferee side) ---------------------------------------
    def take_leadership(self, request: LeadershipTransferRequest) -> Deferred:
        """Stand for election at ``term + 1`` at once because the leader asked us to (SPEC §3).

        Fires with SUCCESS and the new term once this member leads, or
        TAKE_LEADERSHIP_FAILED after ``leadershipTransferWaitTimeout`` (:mod:`.take`).
        """
        return self._take.start(request)

    def confirm_leadership(self) -> Deferred:
        """Fires True once a quorum answers a heartbeat of our current term (Raft's ReadIndex check).

        A leader answering "not committed yet" must first make sure no newer
        leader exists, or a deposed leader would serve stale reads.  Fires
        False if leadership or the term changes, or no quorum answers within
        a heartbeat interval (:mod:`.confirm`).
        """
        if self.state.role is not Role.LEADER:
            return succeed(False)
        return confirm_leadership(self.state, self.transport, heartbeat_tally(self.state, self.state.curr_term),
                                  self.heartbeat)

    def idle(self):
        """Deferred that fires when queued role-change notifications are delivered."""
        return self.notifier.idle() if self.notifier else succeed(None)
