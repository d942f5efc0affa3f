"""The elector's request rounds: one vote round of a candidate, one heartbeat round of a leader.

Collaborators of :class:`dledger.election.elector.LeaderElector` (kept out of it so the elector stays
its timers and the decisions it applies): each function builds the requests, sends them through the
transport, counts the answers in a tally from :mod:`dledger.election.rules`, and hands the tally back to
the elector once it is certain.  A :class:`RoundGuard` numbers the rounds so a reply that arrives after
its round ended (a role change, a newer round, a stop) is ignored.
"""

from __future__ import annotations

from dledger.codes import ResponseCode, VoteResult
from dledger.election.rules import HeartbeatTally, VoteTally
from dledger.messages import HeartBeatRequest, VoteRequest


class RoundGuard:
    """The number of the round in flight, and whether one is: a reply counts only in its own round."""

    def __init__(self) -> None:
        self.number = 0
        self.busy = False

    def begin(self) -> int:
        """A vote or heartbeat round starts: no other round starts until it ends."""
        self.busy = True
        self.number += 1
        return self.number

    def end(self) -> None:
        """The round ended (its outcome applied, or a role change): its late replies are ignored."""
        self.number += 1
        self.busy = False

    def invalidate(self) -> None:
        """Stopped or paused: replies in flight are ignored (whether a round was busy stays as it was)."""
        self.number += 1

    def current(self, number: int) -> bool:
        return number == self.number


def vote_round(el, term: int) -> None:
    """Ask every voter for its vote in ``term``, our own vote included once it is on disk."""
    st = el.state
    el.vote_rounds += 1
    rounds = el.rounds
    round_id = rounds.begin()
    tally = VoteTally(term=term, members=len(st.voters))
    end_term, end_index = el.store.ledger_end_term, el.store.ledger_end_index

    def request(remote: str) -> VoteRequest:
        return VoteRequest(group=st.group, term=term, ledger_end_term=end_term, ledger_end_index=end_index,
                           leader_id=st.self_id, local_id=st.self_id, remote_id=remote)

    def counted(result: VoteResult, reply_term: int) -> None:
        if not rounds.current(round_id):
            return
        tally.add(result, reply_term)
        if tally.certain():
            el.vote_round_done(term, tally)

    def send(_) -> None:
        if not rounds.current(round_id):
            return
        for remote in st.voter_peers:
            d = el.transport.send(remote, request(remote), timeout=el.vote_timeout)
            d.addCallbacks(lambda resp: counted(resp.vote_result, resp.term),
                           lambda _f: counted(VoteResult.UNKNOWN, -1))
        if rounds.current(round_id):
            # Our own vote counts only once it is on disk, like anyone else's.
            el.handle_vote(request(st.self_id), is_self=True).addCallbacks(
                lambda own: counted(own.vote_result, own.term), lambda _f: counted(VoteResult.UNKNOWN, -1))

    def unwritten(_failure) -> None:
        # MemberState logged why; try again after a vote interval, in a new term.
        if not rounds.current(round_id):
            return
        rounds.end()
        el.retry_vote_later()

    # Persist before send: no vote request of a term leaves before that term is on disk.
    st.persisted().addCallbacks(send, unwritten)


def heartbeat_round(el) -> None:
    """Send one heartbeat to every member (learners too); count the voters' answers."""
    st = el.state
    rounds = el.rounds
    round_id = rounds.begin()
    term = st.curr_term
    sent_at = el.clock.seconds()
    tally = heartbeat_tally(st, term)

    def counted(peer: str, code: ResponseCode | None, reply_term: int) -> None:
        if not rounds.current(round_id):
            return
        tally.add(peer, code, reply_term)
        if tally.certain():
            el.heartbeats_done(term, tally, sent_at)

    for peer in st.peers:
        req = HeartBeatRequest(group=st.group, term=term, leader_id=st.self_id, local_id=st.self_id,
                               remote_id=peer)
        d = el.transport.send(peer, req, timeout=el.heartbeat)
        d.addCallbacks(lambda resp, p=peer: counted(p, resp.response_code, resp.term),
                       lambda _f, p=peer: counted(p, None, -1))
    if tally.certain():
        el.heartbeats_done(term, tally, sent_at)


def heartbeat_tally(st, term: int) -> HeartbeatTally:
    """Heartbeats go to every member, learners too; only the voters' answers count (issue #23)."""
    if st.voter_set == st.member_set and st.votes:
        return HeartbeatTally(term=term, members=len(st.members))  # every member votes: as it always was
    return HeartbeatTally.of_voters(term, st.self_id, st.voter_set)
