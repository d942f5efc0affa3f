"""A leader's ReadIndex check (Raft §6.4): one heartbeat round a quorum of voters must answer in our term.

Separate from :class:`dledger.election.elector.LeaderElector`'s periodic heartbeats: a read asks for it
when it needs it, and the answer counts only the voters' replies (:class:`HeartbeatTally`).
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from dledger.codes import Role
from dledger.messages import HeartBeatRequest


def confirm_leadership(state, transport, tally, timeout: float) -> Deferred:
    """Fires True once ``tally`` (a :class:`dledger.election.rules.HeartbeatTally` of the current term)
    confirms leadership; False if leadership or the term changes or the replies say no."""
    term = state.curr_term
    d: Deferred = Deferred()

    def settle():
        if d.called:
            return
        if state.role is not Role.LEADER or state.curr_term != term:
            d.callback(False)
            return
        confirmed = tally.leadership_confirmed()
        if confirmed is not None:
            d.callback(confirmed)

    for peer in state.peers:
        req = HeartBeatRequest(group=state.group, term=term, leader_id=state.self_id, local_id=state.self_id,
                               remote_id=peer)
        sent = transport.send(peer, req, timeout=timeout)
        sent.addCallbacks(lambda resp, p=peer: (tally.add(p, resp.response_code, resp.term), settle()),
                          lambda _f, p=peer: (tally.add(p, None, -1), settle()))
    settle()
    return d
