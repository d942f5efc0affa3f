"""The leader's side of a membership change, and what a removed member does (issue #23).

:class:`MembershipChanges` (``server.membership.changes``):

* :meth:`propose` -- the leader checks a change (:func:`dledger.membership.rules.refusal`: a Java
  member, a change in flight, no entry of its own term committed yet, an invalid change, no live
  quorum of the new voters), appends the CONFIG_CHANGE entry through the member's leader append path
  and fires once it is committed; a refusal is a :class:`DLedgerError` of code CONFIG_CHANGE_REFUSED
  (432) whose message is the one-line reason.
* automatic promotion -- once a heartbeat, the leader promotes the first learner marked for it that is
  within ``learnerPromoteLag`` entries of its end (:func:`~dledger.membership.rules.next_promotion`).
* a removed leader keeps leading (not counting itself) until its removal commits, then hands
  leadership to the most caught-up voter (the existing transfer, :mod:`dledger.election.handover`),
  stepping down outright if that does not succeed.
* a member the committed configuration no longer holds refuses client requests with one line
  (:meth:`check_serving`) and logs it once.
* :meth:`handle_request` serves ``MEMBERS`` (50101): ``list`` anywhere, changes on the leader.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger

from dledger.codes import EntryType, ResponseCode, Role
from dledger.entry import Entry
from dledger.errors import BatchAppendError, DLedgerError
from dledger.membership import rules
from dledger.membership.rules import Change, LeaderView, Op
from dledger.messages import AppendEntryRequest, GetEntriesRequest, MembersRequest, MembersResponse

log = Logger(namespace="dledger.membership")

#: Heartbeats a removed leader waits for its handover before it simply steps down.
STEP_DOWN_TRIES = 3
_CLIENT_REQUESTS = (AppendEntryRequest, GetEntriesRequest)


class MembershipChanges:
    """Proposing changes on the leader; promotion; a removed member's conduct (see the module docstring)."""

    def __init__(self, server, membership):
        self.server = server
        self.membership = membership
        self._waiting: list[tuple[int, int, Deferred]] = []  # (entry index, term, fired when committed)
        self._timer = None
        self._promoting: str | None = None  # the learner whose promotion was logged last
        self._stepping_down = 0  # heartbeats since a removed leader's removal committed
        self._removed_logged = False
        self._asking: list[tuple[Change, Deferred]] | None = None  # changes waiting for the peers' kinds
        self.running = False

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> None:
        """Follow the role: the heartbeat check (promotion, a removed leader's handover) runs while it leads."""
        self.running = True
        self.server.elector.observe(self._role_changed)

    def stop(self) -> None:
        self.running = False
        self._cancel()
        self._fail_waiting("member stopped")

    def _cancel(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _arm(self) -> None:
        if self.running and self._timer is None:
            self._timer = self.server.clock.callLater(self.server.elector.heartbeat, self._tick)

    def _role_changed(self, term: int, role: Role) -> None:
        self._stepping_down = 0
        if role is Role.LEADER:
            self._arm()
        else:
            self._cancel()
            self._fail_waiting(f"leadership lost (now {role.name} in term {term})")

    def _fail_waiting(self, why: str) -> None:
        waiting, self._waiting = self._waiting, []
        for _index, _term, d in waiting:
            d.errback(DLedgerError(ResponseCode.TERM_CHANGED, f"configuration change not known to commit: {why}",
                                   leader_id=self.server.state.leader_id))

    # -- the leader's view ---------------------------------------------------------------------------
    def view(self) -> LeaderView:
        """What the leader knows now (:class:`dledger.membership.rules.LeaderView`)."""
        server = self.server
        replicator = server.replicator
        config = self.membership.configuration
        start = replicator.term_start_index
        own_term = start >= 0 and server.store.committed_index >= start
        live = replicator.live_peers(server.elector.leak) | {server.self_id}
        java = server.peer_kinds.java_members() & frozenset(config.ids)
        return LeaderView(server.self_id, config, server.store.committed_index, own_term, live, java)

    def propose(self, change: Change) -> Deferred:
        """A Deferred of the new configuration once ``change`` is committed (IMembership.propose).

        Members whose kind (dledger or Java DLedger) is not known yet are asked first (METADATA with
        detail, :meth:`PeerKinds.probe`): a group with a Java member refuses every change.
        """
        server = self.server
        if not server.leads():
            return fail(server.not_leader())
        kinds = server.peer_kinds
        unknown = [p for p in self.membership.configuration.ids
                   if p != server.self_id and kinds.kind(p).value == "unknown"]
        if not unknown and self._asking is None:
            return self._propose(change)
        d: Deferred = Deferred()
        first = self._asking is None
        if first:  # changes asked meanwhile wait for the same answers, and go in order
            self._asking = []
        self._asking.append((change, d))
        if first:
            kinds.probe(unknown).addBoth(self._kinds_known)
        return d

    def _kinds_known(self, _result) -> None:
        asked, self._asking = self._asking or [], None
        for change, d in asked:
            self._propose(change).chainDeferred(d)

    def _propose(self, change: Change) -> Deferred:
        server = self.server
        if not server.leads():
            return fail(server.not_leader())
        why, new = rules.refusal(self.view(), change)
        if why is not None:
            return fail(DLedgerError(ResponseCode.CONFIG_CHANGE_REFUSED, why, leader_id=server.self_id))
        term = server.state.curr_term
        try:
            (stored,) = server.guard.append_batch_as_leader(
                [Entry(body=new.encode(), term=term, magic=EntryType.CONFIG_CHANGE)])
        except BatchAppendError as exc:
            return fail(DLedgerError(exc.code, f"refused: the configuration entry could not be appended: "
                                     f"{exc.message}", leader_id=server.state.leader_id))
        log.info("{id}: proposing {change} as entry {index} (term {term}): {members}", id=server.self_id,
                 change=change.describe(), index=stored.index, term=term, members=new.describe())
        d: Deferred = Deferred()
        self._waiting.append((stored.index, term, d))
        replicator = server.replicator
        if replicator.keeps_recent:
            replicator.recent.add(stored)
        replicator.entries_appended(stored.index)
        self.committed_advanced()
        return d

    # -- the committed index moved (server.committed_advanced) --------------------------------------------
    def committed_advanced(self) -> None:
        committed = self.server.store.committed_index
        if self.membership.retain is not None and self.membership.history:
            self.membership.retain()
        if self._waiting:
            done = [w for w in self._waiting if w[0] <= committed]
            self._waiting = [w for w in self._waiting if w[0] > committed]
            for index, _term, d in done:
                config = self.membership.configuration
                log.info("{id}: configuration entry {index} committed: {members}", id=self.server.self_id,
                         index=index, members=config.describe())
                d.callback(config)
        self._check_removed()

    def _check_removed(self) -> None:
        server = self.server
        config = self.membership.configuration
        if server.leads() and rules.leader_steps_down(config, server.store.committed_index, server.self_id):
            self._hand_over(config)
        if not self._removed_logged and self.membership.removed_committed():
            self._removed_logged = True
            log.warn("{id}: removed from the group by configuration entry {index} (committed): this member no "
                     "longer serves; members now: {members}", id=server.self_id, index=config.index,
                     members=config.describe())

    def _hand_over(self, config) -> None:
        """A leader whose own removal committed hands over to the most caught-up voter, or steps down."""
        server = self.server
        st = server.state
        if st.transferee is not None:
            return
        self._stepping_down += 1
        if self._stepping_down > STEP_DOWN_TRIES:
            log.info("{id}: removed leader steps down (no handover succeeded)", id=server.self_id)
            server.elector.next_time_to_request_vote = server.clock.seconds() + server.elector.leak
            server.elector.change_to_candidate(st.curr_term)
            return
        marks = {v: server.replicator.peer_watermark(v) for v in config.voters if v != server.self_id}
        if not marks:
            return
        target = max(marks, key=lambda v: (marks[v], -config.voters.index(v)))
        log.info("{id}: removed from the group (entry {index} committed): handing leadership to {to}",
                 id=server.self_id, index=config.index, to=target)
        server.handover.hand_to(target)

    # -- once a heartbeat ---------------------------------------------------------------------------------
    def _tick(self) -> None:
        self._timer = None
        if self.server.state.role is not Role.LEADER:
            return
        try:
            if self.server.leads():
                self._promote_due()
                self._check_removed()
        finally:
            self._arm()

    def _promote_due(self) -> None:
        server = self.server
        config = self.membership.configuration
        if not config.learners or not self.membership.committed() or self._waiting:
            return
        replicator = server.replicator
        matches = {m: replicator.peer_watermark(m) for m in config.learners}
        learner = rules.next_promotion(config, matches, server.store.ledger_end_index,
                                       server.config.learner_promote_lag)
        if learner is None:
            return
        if learner != self._promoting:
            self._promoting = learner
            log.info("{id}: learner {learner} has caught up (holds {match} of {end}, promote lag {lag}): "
                     "promoting it to voter", id=server.self_id, learner=learner, match=matches[learner],
                     end=server.store.ledger_end_index, lag=server.config.learner_promote_lag)
        self.propose(Change(Op.PROMOTE, learner)).addErrback(
            lambda f: log.debug("{id}: promotion of {learner} not proposed: {why}", id=server.self_id,
                                learner=learner, why=f.getErrorMessage()))

    # -- requests -------------------------------------------------------------------------------------------
    def check_serving(self, request) -> None:
        """A member the committed configuration no longer holds refuses client appends and reads (one line)."""
        if isinstance(request, _CLIENT_REQUESTS) and self.membership.removed_committed():
            config = self.membership.configuration
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER,
                               f"{self.server.self_id} was removed from group {self.server.config.group} "
                               f"(configuration entry {config.index}); ask a member: {', '.join(config.ids)}",
                               leader_id=self.server.state.leader_id)

    def response(self, request: MembersRequest, code: ResponseCode = ResponseCode.SUCCESS,
                 error: str | None = None) -> MembersResponse:
        config = self.membership.configuration
        return MembersResponse(group=request.group, code=int(code), leader_id=self.server.state.leader_id,
                               term=self.server.state.curr_term, configuration=config.to_json(),
                               config_index=config.index, committed_index=self.server.store.committed_index,
                               error=error)

    def handle_request(self, request: MembersRequest):
        """MEMBERS: ``list`` on any member; add/promote/remove on the leader, answered once committed."""
        if request.op == "list":
            return self.response(request)
        try:
            op = Op(request.op)
        except ValueError:
            return self.response(request, ResponseCode.UNEXPECTED_ARGUMENT,
                                 f"unknown members operation {request.op!r} (list, add, promote, remove)")
        change = Change(op, request.member_id or "", request.address or "", bool(request.learner))
        d = self.propose(change)
        d.addCallback(lambda _config: self.response(request))

        def refused(f):
            exc = f.value
            if not isinstance(exc, DLedgerError):
                return f
            return self.response(request, exc.code, exc.message)

        return d.addErrback(refused)
