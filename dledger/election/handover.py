"""Leadership handover, the I/O side: a requested transfer, the preferred leader's check, a damaged store's.

The decisions (may a transfer start, does a failure end it, which preferred member takes over) are
:mod:`dledger.election.transfer`'s and :func:`dledger.election.transfer.damaged_leader_action`'s, pure and
table-tested; this module waits for the transferee to catch up, asks it to take over and runs the
preferred-leader timer.  Kept out of :class:`dledger.server.DLedgerServer` so the server stays wiring.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.election import transfer
from dledger.election.transfer import damaged_leader_action
from dledger.errors import DLedgerError
from dledger.messages import LeadershipTransferRequest, LeadershipTransferResponse
from dledger.ratelog import RateLimitedLog

log = Logger(namespace="dledger.server")


class Handover:
    """Leadership transfers of one member (``server.handover``)."""

    def __init__(self, server):
        self.server = server
        self._preferred_timer = None
        self._damage_log = RateLimitedLog(log, server.clock, interval=60.0)

    def start(self) -> None:
        server = self.server
        if transfer.takes_preferred_check(server.self_id, server.config.preferred_leaders):
            self._preferred_timer = server.clock.callLater(server.elector.heartbeat, self.check_preferred_leader)

    def stop(self) -> None:
        if self._preferred_timer is not None and self._preferred_timer.active():
            self._preferred_timer.cancel()
        self._preferred_timer = None

    def handle(self, request: LeadershipTransferRequest) -> Deferred:
        """Transfer leadership (leader side) or take it (transferee side), as Java DLedger does."""
        server = self.server
        if request.transfer_id == server.self_id:
            return self.transfer_from_here(request)
        if request.transferee_id == server.self_id:
            return server.elector.take_leadership(request)
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"transfer {request.transfer_id} -> {request.transferee_id} does not involve "
                           f"{server.self_id}")

    def hand_to(self, target: str) -> None:
        """Start a transfer to ``target`` on this member's own initiative (failures are logged by the transfer)."""
        server = self.server
        req = LeadershipTransferRequest(group=server.config.group, term=server.state.curr_term,
                                        transfer_id=server.self_id, transferee_id=target)
        maybeDeferred(self.handle, req).addErrback(lambda f: None)

    def transfer_from_here(self, request: LeadershipTransferRequest) -> Deferred:
        """The leader side: stop appends, wait until ``target`` holds our end, ask it to take over (SPEC §3)."""
        server = self.server
        st = server.state
        config = server.config
        target = request.transferee_id
        leads = server.leads()
        refusal = transfer.transfer_refusal(target, server.self_id, st.voter_set, leads, request.term, st.curr_term,
                                            st.transferee, server.store.ledger_end_index,
                                            server.replicator.peer_watermark(target) if leads else -1,
                                            config.max_leadership_transfer_wait_index)
        if refusal is not None:
            if refusal[0] is ResponseCode.NOT_LEADER:
                raise server.not_leader()
            raise DLedgerError(*refusal)
        term = st.curr_term
        st.transferee = target
        replicator = server.replicator
        end = server.store.ledger_end_index
        log.info("{id}: transferring leadership to {to} (term {term}, end index {end})", id=server.self_id,
                 to=target, term=term, end=end)
        timeout = server.clock.callLater(config.leadership_transfer_wait_timeout / 1000.0,
                                         lambda: caught.called or caught.errback(
                                             DLedgerError(ResponseCode.TAKE_LEADERSHIP_FAILED,
                                                          f"{target} did not catch up in time")))
        caught = replicator.wait_peer(target, end)

        def ask(_):
            if timeout.active():
                timeout.cancel()
            take = LeadershipTransferRequest(group=config.group, term=term, leader_id=server.self_id,
                                             local_id=server.self_id, remote_id=target, transfer_id=server.self_id,
                                             transferee_id=target, take_leadership_ledger_index=end)
            return server.transport.send(target, take, timeout=config.leadership_transfer_wait_timeout / 1000.0
                                         + server.elector.vote_timeout)

        def done(result):
            if timeout.active():
                timeout.cancel()
            if isinstance(result, LeadershipTransferResponse) and result.response_code is ResponseCode.SUCCESS:
                return result
            if transfer.transfer_failure_resumes(st.transferee, target, st.curr_term, term):
                st.transferee = None
            if isinstance(result, LeadershipTransferResponse):
                return result
            code = result.value.code if isinstance(result.value, DLedgerError) else ResponseCode.INTERNAL_ERROR
            return LeadershipTransferResponse(code=int(code), term=st.curr_term)

        caught.addCallback(ask)
        caught.addBoth(done)
        return caught

    def check_preferred_leader(self) -> None:
        """As leader, hand leadership to a live, caught-up preferred member (Java's preferredLeaderIds)."""
        self._preferred_timer = None
        server = self.server
        if not server.running:
            return
        st = server.state
        replicator = server.replicator
        preferred = server.config.preferred_leaders
        leads = server.leads()
        marks = {pid: replicator.peer_watermark(pid) for pid in preferred} if leads else {}
        pid = transfer.preferred_transferee(server.self_id, preferred, leads, st.transferee is not None,
                                            st.peers_live, server.store.ledger_end_index, marks,
                                            server.config.max_leadership_transfer_wait_index)
        if pid is not None:
            log.info("{id}: preferred leader {pid} is live and caught up: transferring", id=server.self_id, pid=pid)
            self.hand_to(pid)
        self._preferred_timer = server.clock.callLater(server.elector.heartbeat, self.check_preferred_leader)

    def away_from_damage(self, index: int) -> None:
        """This leader cannot read entry ``index``: hand leadership to a member that holds it, if one does.

        Decided by :func:`damaged_leader_action`; asked again at every failed read (about once a
        heartbeat) until a transfer succeeds.  Nothing to do unless this member leads and no transfer runs.
        """
        server = self.server
        st = server.state
        if not server.leads() or st.transferee is not None:
            return
        known = {peer: server.replicator.peer_known(peer) for peer in st.voter_peers}  # only a voter can take over
        action = damaged_leader_action(index, server.store.ledger_end_index, known,
                                       server.config.max_leadership_transfer_wait_index)
        if action.transfer_to is None:
            self._damage_log.warn("no-transfer", "{id}: store damaged but leadership cannot be handed over yet: "
                                  "{why}", id=server.self_id, why=action.why)
            return
        log.info("{id}: store damaged: transferring leadership to {to} ({why})", id=server.self_id,
                 to=action.transfer_to, why=action.why)
        self.hand_to(action.transfer_to)
