"""Membership change in whole in-process groups (issue #23): learners, promotion, removal, refusals, restarts.

Virtual time (dledger.testing.Cluster's SimClock), no sleeps: every wait is bounded and fails with the
members' states.
"""

from __future__ import annotations

import pytest

from dledger.codes import EntryType, ResponseCode, Role, VoteResult
from dledger.membership.rules import Change, Op
from dledger.messages import GetEntriesRequest, MembersRequest, VoteRequest
from dledger.testing import Cluster


def _settled(d):
    """The result of a fired Deferred (a Failure stays a Failure)."""
    out = []
    d.addBoth(out.append)
    assert out, "the Deferred has not fired"
    return out[0]


def _answer(c, d, timeout: float = 10.0):
    """Run until ``d`` fires (a change waits for the kinds of members not asked yet), then its result."""
    c.wait_until(lambda: d.called, timeout, "the answer")
    return _settled(d)


def _grown(seed: int = 1, **options) -> Cluster:
    """Three members with two entries committed, each knowing its peers are dledger members.

    (A leader asks its peers' kinds before its first change -- a Java member refuses every change --
    so the first change of a group waits a round trip; asking here keeps the tests' changes synchronous.)
    """
    c = Cluster(3, seed=seed, **options)
    c.start()
    c.append_committed([b"a", b"b"])
    asked = [s.peer_kinds.probe(s.state.peers) for s in c.servers.values()]
    c.wait_until(lambda: all(d.called for d in asked), 10, "peer kinds known")
    return c


def test_added_member_is_a_learner_until_caught_up_then_promoted_automatically():
    c = _grown()
    address = c.add_member("n3")
    assert c.servers["n3"].membership.configuration.learners == ("n3",)  # joinExisting: a learner of --peers
    config = c.change(Change(Op.ADD, "n3", address))
    assert config.learners == ("n3",) and config.get("n3").promote
    promoted = c.wait_until(lambda: c.configuration().is_voter("n3") and c.configuration(), 30, "promotion")
    assert promoted.voters == ("n0", "n1", "n2", "n3") and promoted.index > config.index
    c.append_committed([b"c"])
    assert [e.body for e in c.converged()] == [b"a", b"b", b"c"]
    assert all(c.configuration(m) == promoted for m in c.servers)
    assert c.servers["n3"].elector.vote_rounds == 0  # it never campaigned


def test_learner_never_votes_stands_or_counts():
    c = _grown(learner_promote_lag=-1)  # promoted only by command
    for mid in ("n3", "n4"):
        c.change(Change(Op.ADD, mid, c.add_member(mid), learner=True))
    c.run(5)
    assert c.configuration().learners == ("n3", "n4")
    lid = c.leader()
    term = c.servers[lid].state.curr_term
    # A learner asking for votes (in a much higher term, with the log it holds) is refused, and moves nobody's
    # term; only a log ahead of ours could hold the promotion we lack (rules.may_ask_for_votes).
    n3 = c.servers["n3"].store
    vote = VoteRequest(group="g0", term=term + 100, ledger_end_term=n3.ledger_end_term,
                       ledger_end_index=n3.ledger_end_index, leader_id="n3", local_id="n3", remote_id=lid)
    reply = _settled(c.servers[lid].handle_request(vote))
    assert reply.vote_result is VoteResult.REJECT_UNKNOWN_LEADER and c.servers[lid].state.curr_term == term
    # Two voters of three gone: the leader and two learners hold the entry, 3 of 5 members but 1 of 3 voters.
    others = [m for m in ("n0", "n1", "n2") if m != lid]
    c.crash(others[0])
    c.crash(others[1])
    before = c.servers[lid].store.committed_index
    d = c.client().append(b"never")
    d.addErrback(lambda f: None)  # never committed: the client gives up in the end
    c.run(10)
    assert c.servers[lid].store.committed_index == before
    assert all(c.servers[m].store.ledger_end_index > before for m in ("n3", "n4"))  # held, yet not committed
    c.crash(lid)
    c.run(30)  # no leader left among the voters: the learners time out but never ask for votes
    assert all(c.servers[m].elector.vote_rounds == 0 for m in ("n3", "n4"))
    assert all(c.servers[m].state.role is not Role.LEADER for m in ("n3", "n4"))
    del d


def test_promote_by_command_and_a_learner_refuses_to_take_leadership():
    c = _grown(learner_promote_lag=-1)
    address = c.add_member("n3")
    c.change(Change(Op.ADD, "n3", address, learner=True))
    c.run(3)
    assert c.configuration().learners == ("n3",)
    config = c.change(Change(Op.PROMOTE, "n3"))
    assert config.voters == ("n0", "n1", "n2", "n3") and config.quorum == 3


def test_remove_a_follower_it_stops_serving_and_the_group_goes_on():
    c = _grown()
    lid = c.leader()
    gone = next(m for m in c.servers if m != lid)
    config = c.change(Change(Op.REMOVE, gone))
    assert gone not in config.ids and config.quorum == 2
    c.append_committed([b"c"])
    removed = c.servers[gone]
    c.wait_until(lambda: removed.membership.removed_committed(), 10, "the removed member learns its removal")
    request = GetEntriesRequest(group="g0", begin_index=0)
    with pytest.raises(Exception) as refused:
        removed.handle_request(request)
    assert refused.value.code is ResponseCode.UNKNOWN_MEMBER and "was removed" in refused.value.message
    c.crash(next(m for m in config.ids if m != c.leader()))  # one of the two voters left: no quorum any more
    assert c.servers[c.leader()].membership.configuration.voters == config.voters


def test_remove_the_leader_it_steps_down_after_commit_and_hands_over():
    c = _grown()
    old = c.leader()
    term = c.servers[old].state.curr_term
    config = c.change(Change(Op.REMOVE, old))
    assert old not in config.ids
    new = c.wait_until(lambda: (c.stable_leader() or old) != old and c.stable_leader(), 30, "a new leader")
    assert new in config.voters and c.servers[new].state.curr_term > term
    c.wait_until(lambda: c.servers[old].state.role is not Role.LEADER, 30, "the removed leader steps down")
    c.append_committed([b"after"])
    assert [e.body for e in c.converged()] == [b"a", b"b", b"after"]
    c.run(20)
    assert c.servers[old].elector.vote_rounds == 0 or c.stable_leader() == new  # it never disrupts


def test_three_to_five_to_three():
    c = _grown(seed=3)
    for mid in ("n3", "n4"):
        c.change(Change(Op.ADD, mid, c.add_member(mid)))
        c.wait_until(lambda m=mid: c.configuration().is_voter(m) and c.servers[c.leader()].membership.committed(),
                     30, f"{mid} promoted")
    assert len(c.configuration().voters) == 5
    c.append_committed([b"five"])
    for mid in ("n0", "n1"):
        c.change(Change(Op.REMOVE, mid))
        c.wait_for_leader(30)
    final = c.configuration()
    assert final.voters == ("n2", "n3", "n4")
    c.append_committed([b"three"])
    assert [e.body for e in c.converged()] == [b"a", b"b", b"five", b"three"]


def test_a_change_is_refused_while_another_is_in_flight_and_without_quorum():
    c = _grown(learner_promote_lag=-1)
    lid = c.wait_for_leader()
    leader = c.servers[lid]
    c.add_member("n3", start=False)
    first = leader.membership.propose(Change(Op.ADD, "n3", c.address("n3"), learner=True))
    second = _answer(c, leader.membership.propose(Change(Op.REMOVE, "n3")))
    assert second.value.code is ResponseCode.CONFIG_CHANGE_REFUSED
    assert "another configuration change" in second.value.message
    c.wait_until(lambda: first.called, 10, "the first change")
    # n3 never started: promoting it needs 3 of 4 voters live, and with one voter down only 2 are.
    c.crash(next(m for m in ("n0", "n1", "n2") if m != lid))
    c.run(5)
    refused = _answer(c, leader.membership.propose(Change(Op.PROMOTE, "n3")))
    assert refused.value.code is ResponseCode.CONFIG_CHANGE_REFUSED and "no quorum" in refused.value.message


def test_a_new_leader_proposes_only_after_committing_an_entry_of_its_term():
    c = _grown()
    lid = c.leader()
    leader = c.servers[lid]
    # Lose every push, so the next leader's term-start NOOP cannot commit.
    c.crash(lid)
    stop = c.network.drop_matching(lambda src, dst, req: type(req).__name__ == "PushEntryRequest")
    new = c.wait_until(lambda: c.leader() not in (None, lid) and c.leader(), 30, "a new leader")
    refused = _settled(c.servers[new].membership.propose(Change(Op.REMOVE, lid)))
    assert refused.value.code is ResponseCode.CONFIG_CHANGE_REFUSED and "own term" in refused.value.message
    stop()
    server = c.servers[new]
    c.wait_until(lambda: server.store.committed_index >= server.replicator.term_start_index, 30, "its NOOP commits")
    assert c.change(Change(Op.REMOVE, lid)).voters == tuple(m for m in ("n0", "n1", "n2") if m != lid)
    del leader


def test_a_removed_member_cannot_disrupt_with_higher_terms():
    c = _grown()
    lid = c.leader()
    gone = next(m for m in c.servers if m != lid)
    c.isolate(gone)  # it never hears of its removal, and stands for election once it hears from the others
    config = c.change(Change(Op.REMOVE, gone))
    c.run(30)
    term = c.servers[lid].state.curr_term
    rounds = c.servers[gone].elector.vote_rounds
    c.heal()
    c.run(30)
    assert c.servers[gone].elector.vote_rounds > rounds  # it asked, in ever higher terms
    assert c.servers[gone].state.curr_term > term
    assert c.stable_leader() == lid and c.servers[lid].state.curr_term == term  # nobody listened
    held = c.servers[gone].store
    vote = VoteRequest(group="g0", term=term + 100, ledger_end_term=held.ledger_end_term,
                       ledger_end_index=held.ledger_end_index, leader_id=gone, local_id=gone, remote_id=lid)
    reply = _settled(c.servers[lid].handle_request(vote))
    assert reply.vote_result is VoteResult.REJECT_UNKNOWN_LEADER and c.servers[lid].state.curr_term == term
    assert gone not in config.ids


def test_restart_rereads_the_configuration_from_the_log():
    c = _grown()
    c.change(Change(Op.ADD, "n3", c.add_member("n3")))
    promoted = c.wait_until(lambda: c.configuration().is_voter("n3") and c.configuration(), 30, "promotion")
    c.wait_applied()
    for mid in list(c.servers):
        c.crash(mid)
    for mid in c.ids:
        c.restart(mid)
    c.wait_for_leader(30)
    assert all(c.configuration(m).index == promoted.index for m in c.servers)
    assert c.servers["n3"].state.voters == promoted.voters


def test_a_configuration_entry_truncated_away_reverts_the_configuration():
    c = _grown(learner_promote_lag=-1)
    old = c.leader()
    before = c.configuration(old)
    c.add_member("n3", start=False)
    c.isolate(old)
    d = c.servers[old].membership.propose(Change(Op.ADD, "n3", c.address("n3"), learner=True))
    assert c.configuration(old).index > before.index  # in force on the old leader, uncommitted
    new = c.wait_until(lambda: c.leader() not in (None, old) and c.stable_leader(), 30, "a new leader")
    c.wait_until(lambda: c.servers[new].store.committed_index >= c.servers[new].replicator.term_start_index,
                 30, "the new leader's term begins")
    c.heal()
    c.wait_until(lambda: c.servers[old].state.leader_id == new and
                 c.servers[old].store.committed_index == c.servers[new].store.committed_index, 30, "rejoins")
    assert c.configuration(old) == before
    assert _settled(d).value.code is ResponseCode.TERM_CHANGED


def test_members_request_list_and_change():
    c = _grown()
    lid = c.leader()
    follower = next(m for m in c.servers if m != lid)
    listed = c.servers[follower].handle_request(MembersRequest(group="g0", op="list"))
    assert listed.response_code is ResponseCode.SUCCESS
    assert [m["id"] for m in listed.configuration["members"]] == ["n0", "n1", "n2"] and listed.config_index == 0
    address = c.add_member("n3")
    elsewhere = _answer(c, c.servers[follower].handle_request(
        MembersRequest(group="g0", op="add", member_id="n3", address=address)))
    assert elsewhere.response_code is ResponseCode.NOT_LEADER and elsewhere.leader_id == lid
    d = c.servers[lid].handle_request(MembersRequest(group="g0", op="add", member_id="n3", address=address))
    done = c.wait_until(lambda: d.called and _settled(d), 30, "MEMBERS add")
    assert done.response_code is ResponseCode.SUCCESS and done.config_index > 0
    bad = _answer(c, c.servers[lid].handle_request(MembersRequest(group="g0", op="add", member_id="n3",
                                                                address=address)))
    assert bad.response_code is ResponseCode.CONFIG_CHANGE_REFUSED and "already a member" in bad.error
    odd = c.servers[lid].handle_request(MembersRequest(group="g0", op="rename"))
    assert odd.response_code is ResponseCode.UNEXPECTED_ARGUMENT and "unknown members operation" in odd.error


def test_configuration_entries_never_reach_commit_listeners_or_reads():
    c = _grown()
    c.change(Change(Op.ADD, "n3", c.add_member("n3")))
    c.wait_until(lambda: c.configuration().is_voter("n3"), 30, "promotion")
    c.append_committed([b"c"])
    lid = c.leader()
    magics = {e.magic for e in c.committed_entries(lid)}
    assert EntryType.CONFIG_CHANGE in magics
    assert [e.body for e in c.converged()] == [b"a", b"b", b"c"]
    got = c.servers[lid].handle_request(GetEntriesRequest(group="g0", begin_index=0, max_size=100))
    assert [e.body for e in got.entries] == [b"a", b"b", b"c"]


def test_the_first_change_asks_the_peers_kinds_first_and_a_java_member_refuses_it():
    c = Cluster(3, seed=4)
    c.start()
    c.append_committed([b"a"])
    lid = c.leader()
    leader = c.servers[lid]
    java = next(m for m in c.servers if m != lid)
    real = c.servers[java].handle_request

    def java_metadata(request):  # Java DLedger answers METADATA without dledger's detail fields
        reply = real(request)
        if type(request).__name__ == "MetadataRequest":
            reply.role = None
        return reply

    c.servers[java].handle_request = java_metadata
    first = leader.membership.propose(Change(Op.ADD, "n3", "127.0.0.1:29999", learner=True))
    second = leader.membership.propose(Change(Op.REMOVE, java))
    assert not first.called  # the peers are asked first
    c.wait_until(lambda: first.called and second.called, 10, "both answered")
    for d in (first, second):
        refused = _settled(d)
        assert refused.value.code is ResponseCode.CONFIG_CHANGE_REFUSED and "Java DLedger" in refused.value.message
    assert leader.membership.configuration.index == 0


def test_a_member_that_was_away_follows_a_leader_its_log_has_not_heard_of():
    """n2 misses n3's addition; n3 then leads: n2 hears n3's heartbeats (Java: UNKNOWN_MEMBER) and catches up."""
    c = _grown(seed=6)
    lid = c.leader()
    away = next(m for m in ("n0", "n1", "n2") if m != lid)
    c.isolate(away)
    c.change(Change(Op.ADD, "n3", c.add_member("n3")))
    c.wait_until(lambda: c.configuration().is_voter("n3") and c.servers[c.leader()].membership.committed(), 30,
                 "n3 promoted")
    c.servers[c.leader()].handover.hand_to("n3")
    c.wait_until(lambda: c.stable_leader() == "n3", 30, "n3 leads")
    assert "n3" not in c.servers[away].membership.configuration.ids
    c.heal()
    c.append_committed([b"c"])  # waits for every member of n3's configuration, the one that was away included
    assert c.servers[away].state.leader_id == "n3" and c.configuration(away) == c.configuration("n3")


@pytest.mark.parametrize("seed", [24, 43, 56, 58])
def test_random_changes_under_crashes_and_partitions_lose_nothing(seed):
    """Adds, removals, crashes, restarts and partitions at random (the seeds that once stalled a member):
    never two leaders in a term, every acknowledged append in the converged log, every member caught up."""
    import random

    rng = random.Random(seed)
    c = Cluster(3, seed=seed)
    c.start()
    c.append_committed([b"init"])
    leaders: dict[int, str] = {}
    acked: list[bytes] = []
    client = c.client()
    for step in range(25):
        for mid, s in c.servers.items():
            if s.state.role is Role.LEADER:
                assert leaders.setdefault(s.state.curr_term, mid) == mid, f"two leaders in term {s.state.curr_term}"
        r, lid = rng.random(), c.leader()
        if r < 0.25:
            mid = f"n{len(c.ids)}"
            address = c.add_member(mid)
            if lid is not None:
                c.servers[lid].membership.propose(Change(Op.ADD, mid, address)).addErrback(lambda f: None)
        elif r < 0.45 and lid is not None:
            config = c.servers[lid].membership.configuration
            if len(config.voters) > 2:
                c.servers[lid].membership.propose(Change(Op.REMOVE, rng.choice(config.ids))).addErrback(
                    lambda f: None)
        elif r < 0.55 and len(c.servers) > 2:
            c.crash(rng.choice(sorted(c.servers)))
        elif r < 0.65 and c.down:
            c.restart(rng.choice(sorted(c.down)))
        elif r < 0.75:
            ids = sorted(c.servers)
            rng.shuffle(ids)
            c.partition(ids[: len(ids) // 2])
        elif r < 0.85:
            c.heal()
        body = b"w%d" % step
        client.append(body).addCallbacks(lambda _r, b=body: acked.append(b), lambda f: None)
        c.run(rng.uniform(0.2, 3))
    c.heal()
    for mid in sorted(c.down):
        c.restart(mid)
    c.wait_for_leader(60)
    bodies = [e.body for e in c.converged(120)]
    assert [b for b in acked if b not in bodies] == []
    assert len(c.configuration().voters) >= 2
