"""Votes and terms are written through a BlockingIO, and nothing that depends on them leaves before the write.

Issue #14 item 3: persist before send.  ``HandIO`` is a BlockingIO whose
writes the test completes by hand, so each test can look at what the member
sends while a term/vote write is still in flight, and "crash" it there.
"""

import os
import threading

import pytest
import pytest_twisted
from twisted.internet import task
from twisted.internet.defer import Deferred

from dledger.codes import ResponseCode, Role, VoteResult
from dledger.diskio import BlockingIO
from dledger.election.state import MemberState
from dledger.messages import HeartBeatRequest, VoteRequest
from dledger.store.memory import MemoryTermVoteStore
from dledger.store.termvote import FileTermVoteStore
from dledger.testing.cluster import Cluster
from dledger.testing.handio import HandIO
from dledger.transport.inprocess import InProcessNetwork


def vote_request(candidate: str, term: int, to: str = "n1") -> VoteRequest:
    return VoteRequest(group="g0", term=term, ledger_end_term=9, ledger_end_index=9, leader_id=candidate,
                       local_id=candidate, remote_id=to)


def fired(d):
    """The result of a Deferred that has fired (AssertionError if it has not)."""
    assert d.called, "the Deferred has not fired"
    out = []
    d.addBoth(out.append)
    return out[0]


def voter_in_term(term: int, io: HandIO, store=None):
    """A 3-member MemberState for n1, already in ``term`` (on disk), writing through ``io``."""
    store = store if store is not None else MemoryTermVoteStore(term=term)
    return MemberState("n1", ["n0", "n1", "n2"], store, "g0", blocking_io=io), store


# -- MemberState ------------------------------------------------------------------------------------------

def test_memory_changes_at_once_and_the_disk_after_the_write():
    """record_vote changes memory at once; the store holds the vote only when the write completes."""
    io = HandIO()
    st, store = voter_in_term(4, io)
    d = st.record_vote("n2")
    assert st.vote_for == "n2" and store.load() == (4, None) and not d.called and st.dirty
    io.complete()
    assert store.load() == (4, "n2") and d.called and not st.dirty


def test_one_write_in_flight_and_the_latest_state_written_after_it():
    """A change made while a write runs starts no second write; the next write carries the latest state."""
    io = HandIO()
    st, store = voter_in_term(4, io)
    st.role = Role.CANDIDATE
    assert st.next_term() == 5
    st.record_vote("n1")
    assert len(io.calls) == 1 and io.calls[0][1] == (5, None)
    io.complete()
    assert store.load() == (5, None) and len(io.calls) == 1 and io.calls[0][1] == (5, "n1")
    io.complete()
    assert store.load() == (5, "n1") and not io.calls and not st.dirty


def test_an_earlier_write_finishing_late_never_overwrites_a_later_term():
    """With a pool that would finish writes in any order, the store still ends at the latest term and vote."""
    io = HandIO()
    st, store = voter_in_term(1, io)
    for _ in range(3):
        st.role = Role.CANDIDATE
        st.next_term()
        st.record_vote("n1")
    # Only one write was ever in flight: there is nothing to reorder.
    while io.calls:
        assert len(io.calls) == 1
        io.complete(len(io.calls) - 1)
    assert store.load() == (st.curr_term, "n1") == (4, "n1")


def test_a_failed_write_fails_the_waiters_and_is_retried_when_asked_again():
    """A term/vote write that fails fails what waits on it (no reply is sent); persisted() tries again."""
    io = HandIO()
    st, store = voter_in_term(4, io)
    d = st.record_vote("n2")
    io.fail()
    assert isinstance(fired(d).value, OSError) and st.dirty and store.load() == (4, None)
    again = st.persisted()
    assert not again.called and io.calls[0][1] == (4, "n2")
    io.complete()
    assert again.called and store.load() == (4, "n2")


def test_after_persisted_is_transparent_when_nothing_is_written():
    """after_persisted returns the reply itself when no write is pending (inline I/O: behaviour unchanged)."""
    st, _ = voter_in_term(4, HandIO())
    reply = object()
    assert st.after_persisted(reply) is reply


# -- the elector's replies -----------------------------------------------------------------------------------

def cluster_with_hand_io(n: int = 3):
    cluster = Cluster(n, seed=1, clock=task.Clock())
    cluster.start()
    ios = {}
    for mid, server in cluster.servers.items():
        ios[mid] = server.state.io = HandIO()
    return cluster, ios


def test_vote_reply_is_not_sent_before_the_vote_is_written():
    """A granted vote's reply (through the server, as the transport sees it) fires only after the write."""
    cluster, ios = cluster_with_hand_io()
    server = cluster.servers["n1"]
    term = server.state.curr_term
    req = vote_request("n2", term)
    server.state.role = Role.CANDIDATE  # still a candidate of this term, as after start
    reply = server.handle_request(req)
    assert server.state.vote_for == "n2"
    assert isinstance(reply, Deferred) and not reply.called, "vote reply sent before the vote was written"
    assert cluster.term_stores["n1"].load() == (term, None)
    ios["n1"].complete()
    assert cluster.term_stores["n1"].load() == (term, "n2")
    assert fired(reply).vote_result is VoteResult.ACCEPT


def test_second_candidate_is_refused_while_the_first_vote_is_being_written():
    """Memory first: a second candidate of the same term is refused even before the first vote is on disk."""
    cluster, ios = cluster_with_hand_io()
    elector = cluster.servers["n1"].elector
    term = cluster.servers["n1"].state.curr_term
    first = elector.handle_vote(vote_request("n2", term))
    second = elector.handle_vote(vote_request("n0", term))
    assert not first.called and not second.called
    ios["n1"].complete()
    assert fired(first).vote_result is VoteResult.ACCEPT
    assert fired(second).vote_result is VoteResult.REJECT_ALREADY_VOTED


def test_heartbeat_reply_waits_for_a_term_write_in_flight():
    """A heartbeat reply (it makes this member a follower of the term) is held while that term is written."""
    cluster, ios = cluster_with_hand_io()
    server = cluster.servers["n1"]
    server.state.role = Role.CANDIDATE
    new_term = server.state.next_term()
    hb = HeartBeatRequest(group="g0", term=new_term, leader_id="n2", local_id="n2", remote_id="n1")
    reply = server.handle_request(hb)
    assert isinstance(reply, Deferred) and not reply.called
    ios["n1"].complete()
    assert ResponseCode(fired(reply).code) is ResponseCode.SUCCESS
    assert server.state.role is Role.FOLLOWER


def test_candidate_sends_no_vote_request_before_its_term_is_written():
    """A candidate asks for votes in a new term only once that term is on disk, and counts itself only then."""
    cluster, ios = cluster_with_hand_io()
    server = cluster.servers["n0"]
    sent = []
    real_send = server.transport.send
    server.transport.send = lambda to, req, **kw: (sent.append(req), real_send(to, req, **kw))[1]
    term = server.state.curr_term
    server.elector.last_parse_result = server.elector.last_parse_result.WAIT_TO_VOTE_NEXT  # next round bumps
    server.elector.next_time_to_request_vote = 0.0
    cluster.clock.advance(0)
    assert server.state.curr_term == term + 1 and server.state.dirty
    assert not [r for r in sent if isinstance(r, VoteRequest)], "vote request sent before the term was written"
    ios["n0"].complete()  # (term + 1, None) on disk: the requests go, and the self-vote's write starts
    assert cluster.term_stores["n0"].load() == (term + 1, None)
    assert {r.remote_id for r in sent if isinstance(r, VoteRequest)} == {"n1", "n2"}
    assert ios["n0"].calls and ios["n0"].calls[0][1] == (term + 1, "n0")


# -- crashes ---------------------------------------------------------------------------------------------------

def test_crash_before_the_vote_write_never_yields_two_granted_votes_in_one_term():
    """Crash with the vote write in flight: that vote was never sent, so the restarted member may grant one."""
    io = HandIO()
    store = MemoryTermVoteStore(term=7)
    cluster, ios = cluster_with_hand_io()
    elector = cluster.servers["n1"].elector
    elector.state.io = io
    elector.state.term_store = store
    elector.state.curr_term = elector.state.known_max_term = 7
    elector.state.vote_for = None
    granted = []
    d = elector.handle_vote(vote_request("n2", 7))
    d.addCallback(lambda r: r.vote_result is VoteResult.ACCEPT and granted.append("n2"))
    # crash: the in-flight write never completes, memory is lost; restart from the store
    again = MemberState("n1", ["n0", "n1", "n2"], store, "g0", blocking_io=io)
    assert (again.curr_term, again.vote_for) == (7, None)
    again.record_vote("n0").addCallback(lambda _: granted.append("n0"))
    io.complete(len(io.calls) - 1)
    assert granted == ["n0"]  # n2 never heard a grant: one vote sent in term 7


def test_vote_written_before_a_crash_is_kept_after_the_restart():
    """Crash after the vote write completed (reply sent): the restarted member refuses another candidate."""
    cluster, ios = cluster_with_hand_io()
    server = cluster.servers["n1"]
    term = server.state.curr_term
    d = server.elector.handle_vote(vote_request("n2", term))
    ios["n1"].complete()
    assert fired(d).vote_result is VoteResult.ACCEPT
    cluster.crash("n1")
    cluster.restart("n1")
    server = cluster.servers["n1"]
    assert (server.state.curr_term, server.state.vote_for) == (term, "n2")
    assert fired(server.elector.handle_vote(vote_request("n0", term))).vote_result \
        is VoteResult.REJECT_ALREADY_VOTED


# -- threaded I/O, as twistd runs a member -----------------------------------------------------------------

@pytest_twisted.ensureDeferred
async def test_vote_fsync_runs_off_the_reactor_thread(tmp_path, monkeypatch, reactor):
    """With twistd's threaded BlockingIO the vote's fsync runs on a worker thread, and the reply follows it."""
    from dledger.config import make_config
    from dledger.server import DLedgerServer

    config = make_config(preset="fast", group="g0", self_id="n1",
                         peers="n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913",
                         store_type="memory", transport_type="inprocess")
    term_store = FileTermVoteStore(tmp_path)
    io = BlockingIO(reactor, threaded=True)
    server = DLedgerServer.build(config, clock=reactor, term_store=term_store, blocking_io=io,
                                 network=InProcessNetwork(reactor))
    assert server.state.io.threaded
    fsyncs = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (fsyncs.append(threading.current_thread()), real_fsync(fd))[1])
    try:
        reply = server.elector.handle_vote(vote_request("n2", server.state.curr_term))
        assert not reply.called  # the write is on the pool: the reply cannot exist yet
        result = await reply
    finally:
        io.stop()
        term_store.close()
    assert result.vote_result is VoteResult.ACCEPT
    assert fsyncs and threading.main_thread() not in fsyncs
    assert FileTermVoteStore(tmp_path).load() == (server.state.curr_term, "n2")


@pytest.mark.parametrize("store_type", ["lmdb"])
def test_lmdb_term_store_stays_on_the_reactor_thread(store_type):
    """LMDB's term store grows its map inside save, so it does not ask to run off the reactor thread."""
    from dledger.store.lmdbstore import LmdbTermVoteStore

    assert LmdbTermVoteStore.save_off_reactor is False
    assert FileTermVoteStore.save_off_reactor is True


def test_vote_whose_write_fails_is_never_granted():
    """A vote whose write fails is answered with an error, not ACCEPT; the next request retries the write."""
    cluster, ios = cluster_with_hand_io()
    server = cluster.servers["n1"]
    term = server.state.curr_term
    reply = server.handle_request(vote_request("n2", term))
    ios["n1"].fail()
    assert isinstance(fired(reply).value, OSError)
    again = server.handle_request(vote_request("n2", term))
    assert not again.called and ios["n1"].calls[0][1] == (term, "n2")
    ios["n1"].complete()
    assert fired(again).vote_result is VoteResult.ACCEPT and cluster.term_stores["n1"].load() == (term, "n2")
