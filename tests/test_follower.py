"""The follower's entry handler against reordered and duplicated pushes (found by the seeded simulator)."""

from twisted.internet import task

from dledger.codes import PushType, ResponseCode
from dledger.messages import PushEntryRequest
from dledger.replication.durability import Flusher
from dledger.replication.follower import EntryHandler
from dledger.store.memory import MemoryLogStore
from dledger.testing.simdisk import make_entries
from dledger.testing.store_contract import FakeMemberState, fired


def handler():
    state = FakeMemberState(self_id="n1")
    state.follow(1, "n0")
    store = MemoryLogStore(state)
    clock = task.Clock()
    return EntryHandler(state, store, Flusher(store, clock), clock, push_timeout=1.0), store, clock


def push(type_, *, entry=None, batch=None, commit=-1):
    return PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=1,
                            commit_index=commit, type=type_, entry=entry, batch_entry=batch or [])


def reply(h, clock, req):
    d = h.handle_push(req)
    clock.advance(0)
    return fired(d)


def test_stale_truncate_does_not_drop_acknowledged_entries():
    """A duplicated TRUNCATE arriving after later appends were acknowledged is refused, not obeyed.

    Simulator seed 6657: the copy of TRUNCATE(0) arrived after APPEND(1) was
    acknowledged and counted toward a commit; obeying it lost a committed entry.
    """
    h, store, clock = handler()
    log = make_entries([1, 1, 1])
    assert reply(h, clock, push(PushType.TRUNCATE, entry=log[0])).code == ResponseCode.SUCCESS
    assert reply(h, clock, push(PushType.APPEND, batch=log[1:])).code == ResponseCode.SUCCESS
    late = reply(h, clock, push(PushType.TRUNCATE, entry=log[0]))
    assert late.code == ResponseCode.INCONSISTENT_STATE
    assert store.ledger_end_index == 2 and store.get(2) == log[2]


def test_truncate_from_a_new_leader_still_applies():
    """The stale-truncate guard is per leader and term: a new leader may truncate unverified entries."""
    h, store, clock = handler()
    log = make_entries([1, 1, 1])
    reply(h, clock, push(PushType.TRUNCATE, entry=log[0]))
    reply(h, clock, push(PushType.APPEND, batch=log[1:]))
    h.state.follow(2, "n2")
    h.reset()
    req = push(PushType.TRUNCATE, entry=log[0])
    req.term, req.leader_id = 2, "n2"
    assert reply(h, clock, req).code == ResponseCode.SUCCESS
    assert store.ledger_end_index == 0


def test_duplicate_append_is_acknowledged_once_held():
    """A duplicated APPEND for entries we already hold (equal) is answered SUCCESS, a different one INCONSISTENT."""
    h, store, clock = handler()
    log = make_entries([1, 1])
    reply(h, clock, push(PushType.TRUNCATE, entry=log[0]))
    assert reply(h, clock, push(PushType.APPEND, entry=log[1])).code == ResponseCode.SUCCESS
    assert reply(h, clock, push(PushType.APPEND, entry=log[1])).code == ResponseCode.SUCCESS
    other = make_entries([1, 1], prefix=b"x")[1]
    assert reply(h, clock, push(PushType.APPEND, entry=other)).code == ResponseCode.INCONSISTENT_STATE
    assert store.get(1) == log[1]


def test_out_of_order_appends_wait_for_the_gap():
    """Pushes arriving out of order are applied in index order; a gap that never fills is answered after the timeout."""
    h, store, clock = handler()
    log = make_entries([1] * 5)
    reply(h, clock, push(PushType.TRUNCATE, entry=log[0]))
    later = h.handle_push(push(PushType.APPEND, batch=log[3:5]))
    assert not later.called and store.ledger_end_index == 0
    assert reply(h, clock, push(PushType.APPEND, batch=log[1:3])).code == ResponseCode.SUCCESS
    clock.advance(0)
    assert fired(later).code == ResponseCode.SUCCESS and store.ledger_end_index == 4
    gap = h.handle_push(push(PushType.APPEND, entry=make_entries([1] * 8)[7]))
    clock.advance(1.0)
    assert fired(gap).code == ResponseCode.INCONSISTENT_STATE
