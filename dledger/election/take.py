"""The transferee's side of a leadership transfer (SPEC §3): stand at once when the leader asks, report back.

A collaborator of :class:`dledger.election.elector.LeaderElector` (kept out of it so the elector stays the
timers and the vote/heartbeat rounds): it holds the one take-over in progress, its timeout and the
Deferred the leader's LEADERSHIP_TRANSFER request waits on.  The refusals are pure rules
(:func:`dledger.election.transfer.take_leadership_refusal`).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.election.transfer import take_leadership_refusal
from dledger.errors import DLedgerError
from dledger.messages import LeadershipTransferRequest, LeadershipTransferResponse

log = Logger(namespace="dledger.election.elector")


class TakeLeadership:
    """The take-over this member was asked for, if any (at most one at a time)."""

    def __init__(self, elector):
        self.elector = elector
        self._take: tuple[Deferred, object] | None = None

    @property
    def pending(self) -> bool:
        return self._take is not None

    def start(self, request: LeadershipTransferRequest) -> Deferred:
        """Stand for election at ``term + 1`` at once (see :meth:`LeaderElector.take_leadership`)."""
        el = self.elector
        st = el.state
        refusal = take_leadership_refusal(request.term, st.curr_term, request.transfer_id, st.leader_id,
                                          el.store.ledger_end_index, request.take_leadership_ledger_index,
                                          self.pending, el.not_standing())
        if refusal is not None:
            raise DLedgerError(*refusal)
        target = request.term + 1
        d: Deferred = Deferred()
        timeout = el.clock.callLater(el.config.leadership_transfer_wait_timeout / 1000.0,
                                     self.finish, ResponseCode.TAKE_LEADERSHIP_FAILED, "timed out")
        self._take = (d, timeout)
        st.term_to_take_leadership = target
        log.info("{id}: asked by {leader} to take leadership in term {term}", id=st.self_id,
                 leader=request.transfer_id, term=target)
        el.change_to_candidate(target)
        el.need_increase_term_immediately = True
        el.arm_if_idle()
        return d

    def finish(self, code: ResponseCode, why: str = "") -> None:
        """The take-over ended: SUCCESS once this member leads in the term it was given, else FAILED."""
        if self._take is None:
            return
        d, timeout = self._take
        self._take = None
        if timeout.active():
            timeout.cancel()
        st = self.elector.state
        target = st.term_to_take_leadership
        st.term_to_take_leadership = -1
        if code is ResponseCode.SUCCESS and st.curr_term >= target:
            d.callback(LeadershipTransferResponse(code=int(code), term=st.curr_term))
        else:
            log.info("{id}: taking leadership failed: {why}", id=st.self_id, why=why or code.name)
            d.callback(LeadershipTransferResponse(code=int(ResponseCode.TAKE_LEADERSHIP_FAILED), term=st.curr_term))
