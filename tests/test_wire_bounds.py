"""Hostile integers and impossible pushes from the wire (issue #9, item 13): refused when decoded or before
the follower touches its store; nothing out of range is ever persisted."""

import json
import struct

import pytest
from twisted.internet import task
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from dledger import messages
from dledger.codes import PushType, ResponseCode, Role
from dledger.election.state import MemberState
from dledger.entry import HEADER, Entry, encode_entry
from dledger.errors import DLedgerError
from dledger.messages import INT64_MAX, MAX_INDEX, MAX_TERM, PushEntryRequest
from dledger.replication import pushcheck
from dledger.replication.durability import Flusher
from dledger.replication.follower import EntryHandler
from dledger.store.memory import MemoryLogStore
from dledger.testing.simdisk import make_entries
from dledger.testing.store_contract import FakeMemberState
from dledger.transport import remoting
from dledger.transport.protocol import RemotingServerFactory

HUGE = 10 ** 30


# -- pure bounds ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, value, ok", [
    ("term", -1, True), ("term", 0, True), ("term", MAX_TERM, True), ("term", INT64_MAX, False),
    ("term", HUGE, False), ("term", -2, False),
    ("commit_index", -1, True), ("commit_index", MAX_INDEX, True), ("commit_index", INT64_MAX, False),
    ("index", -(2 ** 63), False), ("pos", INT64_MAX, True), ("pos", INT64_MAX + 1, False),
    ("total_size", 0, True), ("total_size", 2 ** 31 - 1, True), ("total_size", 2 ** 31, False),
    ("total_size", -1, False), ("code", -(2 ** 31), True), ("code", 2 ** 31, False),
])
def test_field_bounds_table(name, value, ok):
    """Each field accepts exactly its on-disk width (terms and indexes keep room for +1)."""
    error = messages.bounds_error(name, value, messages.FIELD_BOUNDS[name])
    assert (error is None) == ok
    if not ok:
        assert name in error and "out of range" in error


def test_bounds_error_shortens_absurd_values():
    """A 10**30 term is named without printing thousands of digits."""
    error = messages.bounds_error("term", 10 ** 4000, messages.TERM)
    assert "4001 digits" in error and len(error) < 200


@pytest.mark.parametrize("cls, key, value", [
    (messages.VoteRequest, "term", HUGE), (messages.VoteRequest, "term", INT64_MAX),
    (messages.VoteRequest, "ledgerEndTerm", HUGE), (messages.VoteRequest, "ledgerEndIndex", -5),
    (messages.HeartBeatRequest, "term", HUGE), (messages.VoteResponse, "term", INT64_MAX),
    (messages.HeartBeatResponse, "term", HUGE), (messages.PushEntryRequest, "commitIndex", HUGE),
    (messages.PushEntryResponse, "endIndex", HUGE), (messages.PushEntryResponse, "beginIndex", -7),
    (messages.GetEntriesRequest, "beginIndex", INT64_MAX), (messages.GetEntriesRequest, "indexList", [1, HUGE]),
    (messages.LeadershipTransferRequest, "takeLeadershipLedgerIndex", HUGE),
    (messages.PushEntryRequest, "totalSize", 2 ** 31), (messages.MetadataResponse, "committedIndex", HUGE),
])
def test_json_bodies_with_out_of_range_integers_are_refused(cls, key, value):
    """Requests and the responses a member acts on are refused with the field named, at decode time."""
    body = json.dumps({"group": "g0", key: value}).encode()
    with pytest.raises(remoting.BodyError, match="out of range"):
        remoting.decode_body(cls, body)


@pytest.mark.parametrize("field, value", [("term", INT64_MAX), ("term", HUGE), ("index", HUGE), ("index", -1),
                                          ("pos", -3), ("index", "5"), ("term", 1.5), ("magic", 2 ** 40)])
def test_json_entries_with_bad_integers_are_refused(field, value):
    """A JSON entry's integers must be JSON integers within the entry header's fields (no int("5"), no floats)."""
    entry = messages.entry_to_wire(Entry(b"x", 3, 1, 0).sealed())
    entry[field] = value
    body = json.dumps({"group": "g0", "type": "TRUNCATE", "entry": entry}).encode()
    with pytest.raises(remoting.BodyError):
        remoting.decode_body(PushEntryRequest, body)


def test_binary_push_entry_with_a_term_that_cannot_be_incremented_is_refused():
    """A binary PUSH entry whose term is 2**63-1 fits the header but not a member: refused, never stored."""
    entry = Entry(b"abc", 0, INT64_MAX, 0).sealed()
    request = PushEntryRequest(group="g0", type=PushType.APPEND, term=1, leader_id="n0", entry=entry)
    frame = remoting.decode_frame(remoting.encode_request(request, 5, binary=True))
    with pytest.raises(remoting.BinaryBodyError, match="out of range"):
        remoting.decode_request(frame)


def test_in_range_values_still_decode():
    """The largest accepted term and index decode unchanged (the bounds are not off by one)."""
    body = json.dumps({"group": "g0", "term": MAX_TERM, "ledgerEndIndex": MAX_INDEX, "ledgerEndTerm": -1}).encode()
    msg = remoting.decode_body(messages.VoteRequest, body)
    assert (msg.term, msg.ledger_end_index) == (MAX_TERM, MAX_INDEX)


def test_message_bounds_error_checks_fields_and_entries():
    """The whole-message check (used after binary decoding) finds a bad field or entry, and passes a good one."""
    good = PushEntryRequest(group="g0", term=3, commit_index=2, batch_entry=make_entries([1, 1]))
    assert messages.message_bounds_error(good) is None
    assert "term" in messages.message_bounds_error(PushEntryRequest(term=HUGE))
    bad = PushEntryRequest(term=1, batch_entry=[Entry(b"", 0, INT64_MAX, 0)])
    assert "entry #0.term" in messages.message_bounds_error(bad)


# -- the protocol answers 411 and never calls the handler -------------------------------------------------

class Recording:
    def __init__(self):
        self.seen = []

    def handle_request(self, request):
        self.seen.append(request)
        return request.base_reply(messages.RESPONSE_TYPES[type(request)])


def test_vote_with_absurd_term_gets_unexpected_argument_and_never_reaches_the_member():
    """A VOTE with term 10**30 is answered UNEXPECTED_ARGUMENT with a remark; the handler never sees it."""
    handler = Recording()
    proto = RemotingServerFactory(MemoryReactorClock(), handler).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    body = json.dumps({"group": "g0", "leaderId": "n1", "term": HUGE, "ledgerEndIndex": -1,
                       "ledgerEndTerm": -1}).encode()
    proto.dataReceived(remoting.encode_frame(remoting.Header(51001, 9), body))
    (frame,) = remoting.split_frames(transport.value())
    reply = remoting.decode_body(messages.VoteResponse, frame.body)
    assert reply.code == ResponseCode.UNEXPECTED_ARGUMENT and "out of range" in frame.header.remark
    assert handler.seen == []


# -- member state: nothing out of range is persisted ---------------------------------------------------------

class TermStore:
    def __init__(self, term=0):
        self.saved = [(term, None)]

    def load(self):
        return self.saved[-1]

    def save(self, term, vote):
        struct.pack(">q", term)  # what the real store's field would do
        self.saved.append((term, vote))


def test_member_state_refuses_candidate_terms_beyond_the_largest():
    """A term past MAX_TERM (from any path) never becomes the next persisted term."""
    store = TermStore(5)
    state = MemberState("n0", ["n0", "n1", "n2"], store)
    assert state.change_to_candidate(HUGE) is False
    assert state.known_max_term == 5
    assert state.next_term() == 6 and store.saved[-1] == (6, None)


def test_member_state_never_hands_an_unstorable_term_to_the_store():
    """At the top of the term space, moving on is a clear DLedgerError, not struct.error from the store."""
    store = TermStore(INT64_MAX)
    state = MemberState("n0", ["n0", "n1", "n2"], store)
    with pytest.raises(DLedgerError, match="64-bit"):
        state.next_term()
    assert store.saved == [(INT64_MAX, None)]


def test_member_state_refuses_a_persisted_term_beyond_64_bits():
    """A currterm bricked by the old bug (term 10**30) is a clear start-up error, not struct.error on every append."""
    with pytest.raises(ValueError, match="beyond the signed 64-bit"):
        MemberState("n0", ["n0", "n1", "n2"], TermStore(HUGE))


def test_member_state_accepts_max_term_and_one_increment():
    """MAX_TERM from the wire still leaves one +1 that fits the field."""
    store = TermStore(1)
    state = MemberState("n0", ["n0", "n1", "n2"], store)
    assert state.change_to_candidate(MAX_TERM)
    assert state.next_term() == MAX_TERM
    state.role = Role.CANDIDATE
    assert state.next_term() == INT64_MAX


# -- pure push decisions -------------------------------------------------------------------------------

@pytest.mark.parametrize("index, begin, end, compared, ok", [
    (5, 0, 9, None, True),       # inside the log: routine
    (10, 0, 9, None, True),      # right after the end: routine
    (0, 0, 9, None, True),       # at the begin
    (5009, 0, 9, None, False),   # far past the end, no COMPARE: the forged frame of issue #9
    (11, 0, 9, None, False),     # just past end + 1 without a COMPARE
    (5009, 0, 9, 5009, True),    # after a COMPARE at that index: the leader's disjoint-range reset
    (5009, 0, 9, 6000, True),    # the COMPARE was at the leader's end, above its begin
    (5009, 0, 9, 100, False),    # a COMPARE below the truncate index does not justify it
    (2, 5, 9, None, False),      # below our begin, no COMPARE
    (2, 5, 9, 3, True),          # below our begin after a COMPARE above it
    (7, 0, -1, None, True),      # empty log: nothing to lose
])
def test_check_truncate_table(index, begin, end, compared, ok):
    """A reset (past end + 1 or below begin) of a non-empty log needs a COMPARE at or above its index."""
    error = pushcheck.check_truncate(index, begin, end, compared)
    assert (error is None) == ok
    if not ok:
        assert f"TRUNCATE at index {index}" in error


@pytest.mark.parametrize("indexes, end, window, ok", [
    ([10, 11, 12], 9, 100, True), ([50], 9, 100, True), ([110], 9, 100, True), ([111], 9, 100, False),
    ([10, 12], 9, 100, False), ([10, 10], 9, 100, False), ([3, 4], 9, 100, True), ([], 9, 100, True),
    ([10 ** 18], -1, 5_000_000, False),
])
def test_check_append_table(indexes, end, window, ok):
    """APPENDs must be consecutive and start within what a leader can have in flight."""
    assert (pushcheck.check_append(indexes, end, window) is None) == ok


@pytest.mark.parametrize("first, waiting, ok", [(10, 5, True), (11, 4, True), (11, 5, False), (10, 99, True)])
def test_check_append_bounds_the_waiting_table(first, waiting, ok):
    """A push that would wait for a gap is refused once maxPendingSize pushes wait; the next in order never is."""
    assert (pushcheck.check_append([first], 9, 100, waiting, 5) is None) == ok


def test_far_appends_cannot_fill_the_waiting_table():
    """Forged APPENDs within the window but past the end stop being parked at maxPendingSize."""
    h, store, clock, _ = handler()
    h.max_waiting = 3
    codes = []
    for i in range(5):
        d = h.handle_push(push(PushType.APPEND, entry=Entry(b"x", 20 + i, 1, 0).sealed()))
        d.addErrback(lambda f: codes.append(f.value.code))
    assert h.parked == 3 and codes == [ResponseCode.UNEXPECTED_ARGUMENT] * 2
    clock.advance(2)  # the parked ones time out (INCONSISTENT_STATE) and free the table
    assert h.parked == 0 and store.ledger_end_index == 9


def test_append_window_covers_the_leaders_pipeline():
    """1000 pushes of 1 MiB (the default config) of 48-byte entries."""
    assert pushcheck.append_window(1000, 1 << 20) == 1000 * ((1 << 20) // 48 + 1)
    assert pushcheck.append_window(0, 10) == 1


# -- the follower's handler ----------------------------------------------------------------------------------

def handler(entries=10, committed=5):
    state = FakeMemberState(self_id="n1")
    state.follow(1, "n0")
    store = MemoryLogStore(state)
    log = make_entries([1] * entries)
    for e in log:
        store.append_as_follower(e, 1, "n0")
    store.update_committed_index(1, committed)
    clock = task.Clock()
    h = EntryHandler(state, store, Flusher(store, clock), clock, push_timeout=1.0, append_window=100)
    return h, store, clock, log


def push(type_, *, entry=None, batch=None, commit=-1):
    return PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=1,
                            commit_index=commit, type=type_, entry=entry, batch_entry=batch or [])


def outcome(h, clock, req):
    results = []
    h.handle_push(req).addBoth(results.append)
    clock.advance(0)
    assert results
    return results[0]


def snapshot(store):
    return store.ledger_begin_index, store.ledger_end_index, store.committed_index, \
        [store.get(i) for i in range(store.ledger_begin_index, store.ledger_end_index + 1)]


def test_forged_truncate_far_past_the_end_is_refused_and_changes_nothing():
    """TRUNCATE 5,000 past the end claiming the current leader and term: UNEXPECTED_ARGUMENT, the log intact."""
    h, store, clock, _ = handler()
    before = snapshot(store)
    far = Entry(b"evil", 5009, 1, 10 ** 6).sealed()
    result = outcome(h, clock, push(PushType.TRUNCATE, entry=far))
    assert isinstance(result, Failure) and result.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert "past our end 9" in result.value.message
    assert snapshot(store) == before


def test_reset_after_a_compare_from_the_leader_still_applies():
    """The leader's own disjoint-range reset (COMPARE, then TRUNCATE at its begin) still works."""
    h, store, clock, log = handler(committed=-1)
    leader_first = Entry(b"kept", 300, 1, 5000).sealed()
    compare = outcome(h, clock, push(PushType.COMPARE, entry=Entry(b"end", 999, 1, 90000).sealed()))
    assert compare.code == ResponseCode.INCONSISTENT_STATE
    result = outcome(h, clock, push(PushType.TRUNCATE, entry=leader_first))
    assert result.code == ResponseCode.SUCCESS
    assert (store.ledger_begin_index, store.ledger_end_index) == (300, 300)


def test_far_past_end_append_is_refused_not_parked():
    """An APPEND far beyond what a leader can have in flight is refused at once and nothing waits."""
    h, store, clock, _ = handler()
    before = snapshot(store)
    result = outcome(h, clock, push(PushType.APPEND, entry=Entry(b"x", 10 ** 12, 1, 0).sealed()))
    assert isinstance(result, Failure) and result.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert h.parked == 0 and snapshot(store) == before


def test_non_consecutive_append_batch_is_refused():
    """A batch whose indexes skip is a protocol error, answered before anything is stored."""
    h, store, clock, _ = handler()
    batch = [Entry(b"a", 10, 1, 0).sealed(), Entry(b"b", 12, 1, 0).sealed()]
    result = outcome(h, clock, push(PushType.APPEND, batch=batch))
    assert isinstance(result, Failure) and "not consecutive" in result.value.message
    assert store.ledger_end_index == 9


def test_commit_index_past_the_end_commits_nothing_unverified():
    """A COMMIT claiming MAX_INDEX commits nothing this member has not verified against that leader."""
    h, store, clock, _ = handler()
    outcome(h, clock, push(PushType.COMMIT, commit=MAX_INDEX))
    assert store.committed_index == 5


def test_refusals_are_rate_limited(monkeypatch):
    """A flood of forged TRUNCATEs leaves one log line per interval, not one per frame."""
    h, store, clock, _ = handler()
    lines = []
    monkeypatch.setattr(h.refusals.logger, "emit", lambda level, fmt, **kw: lines.append(fmt))
    for _ in range(50):
        outcome(h, clock, push(PushType.TRUNCATE, entry=Entry(b"evil", 5009, 1, 0).sealed()))
    assert len(lines) == 1
    clock.advance(11)
    outcome(h, clock, push(PushType.TRUNCATE, entry=Entry(b"evil", 5009, 1, 0).sealed()))
    assert len(lines) == 2 and "suppressed" in lines[1]


def test_entry_codec_header_is_what_the_bounds_protect():
    """The entry header really is signed 64-bit for index/term/pos: MAX values encode, one more does not."""
    encode_entry(Entry(b"", MAX_INDEX, INT64_MAX, INT64_MAX))
    with pytest.raises(struct.error):
        HEADER.pack(1, 48, INT64_MAX + 1, 0, 0, 0, 0, 0, 0)


class Raising:
    def __init__(self, error):
        self.error = error

    def handle_request(self, request):
        raise self.error


@pytest.mark.parametrize("error, remark", [
    (DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "TRUNCATE at index 5009 is past our end 9"),
     "TRUNCATE at index 5009 is past our end 9"),
    (DLedgerError(ResponseCode.NOT_LEADER, "n1 is FOLLOWER", leader_id="n0"), None),
])
def test_unexpected_argument_replies_say_what_was_wrong(error, remark):
    """A 411 carries its reason in the header remark; other error replies stay byte-identical to Java's (none)."""
    proto = RemotingServerFactory(MemoryReactorClock(), Raising(error)).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    proto.dataReceived(remoting.encode_request(PushEntryRequest(group="g0", type=PushType.COMMIT), 4))
    (frame,) = remoting.split_frames(transport.value())
    assert frame.header.remark == remark
    assert remoting.decode_body(messages.PushEntryResponse, frame.body).code == error.code


def test_decoded_entry_bounds_are_those_the_codec_cannot_keep():
    """Only index, term and pos can be out of bounds after decoding: every other field's codec integer fits."""
    from dledger.messages import DECODED_ENTRY_BOUNDS, ENTRY_BOUNDS
    assert sorted(DECODED_ENTRY_BOUNDS) == ["index", "pos", "term"]
    assert all(ENTRY_BOUNDS[name] == bounds for name, bounds in DECODED_ENTRY_BOUNDS.items())


@pytest.mark.parametrize("field, value, fails", [
    ("index", 2**63 - 1, True), ("index", 2**63 - 2, False), ("term", 2**63 - 1, True), ("pos", 2**63 - 1, False),
])
def test_decoded_entry_bounds_error_agrees_with_the_full_check(field, value, fails):
    """For an entry the codec decoded, the short check finds exactly what entry_bounds_error finds."""
    from dledger.entry import Entry
    from dledger.messages import decoded_entry_bounds_error, entry_bounds_error
    e = Entry(body=b"b", index=1, term=1, pos=0)
    setattr(e, field, value)
    assert (decoded_entry_bounds_error(e) is not None) is fails
    assert decoded_entry_bounds_error(e) == entry_bounds_error(e)


@pytest.mark.parametrize("field, value, at", [
    ("index", 2**63 - 1, 0), ("index", 2**63 - 1, 3), ("term", 2**63 - 1, 2), ("pos", -1, 1), ("term", -5, 3),
    ("pos", 2**63 - 1, None), ("index", 2**63 - 2, None), (None, None, None),
])
def test_decoded_entries_in_bounds_agrees_with_each_entry(field, value, at):
    """The all-entries check is False exactly when some entry has a decoded_entry_bounds_error."""
    from dledger.entry import Entry
    from dledger.messages import decoded_entries_in_bounds, decoded_entry_bounds_error
    entries = [Entry(body=b"b", index=i, term=1, pos=i * 49) for i in range(4)]
    if field is not None:
        setattr(entries[3 if at is None else at], field, value)
    assert decoded_entries_in_bounds(entries) is all(decoded_entry_bounds_error(e) is None for e in entries)
    assert decoded_entries_in_bounds(entries) is (at is None)
    assert decoded_entries_in_bounds([])


@pytest.mark.parametrize("first_index, first_pos, term_at, ok", [
    (0, 0, None, True),
    (2**63 - 5, 0, None, True),  # the last index is 2**63 - 2: the greatest a decoded entry may have
    (2**63 - 4, 0, None, False),  # the last entry's index is 2**63 - 1
    (5, 2**63 - 1 - 3 * 49, None, True),  # the last entry starts at 2**63 - 1
    (5, 0, 2, False),  # a term the codec keeps but a message may not, inside the run
    (5, 0, 0, False),
])
def test_a_plain_runs_bounds_are_each_entrys(first_index, first_pos, term_at, ok):
    """Entries decoded as one plain run (index and pos checked at its ends only) are in bounds exactly when
    each entry is (the per-entry oracle), wherever the entry out of bounds is."""
    from dledger.entry import Entry, EntryList, decode_entries, encode_entry
    from dledger.messages import decoded_entries_in_bounds, decoded_entry_bounds_error
    batch = [Entry(body=b"b", index=first_index + i, term=1, pos=first_pos + i * 49).sealed() for i in range(4)]
    if term_at is not None:
        batch[term_at].term = 2**63 - 1
    raw = b"".join(encode_entry(e) for e in batch)
    entries, _ = decode_entries(raw, 0, len(raw), 4)
    assert type(entries) is EntryList and entries.largest > 0  # decoded as one plain run
    assert decoded_entries_in_bounds(entries) is all(decoded_entry_bounds_error(e) is None for e in entries)
    assert decoded_entries_in_bounds(entries) is ok
    assert decoded_entries_in_bounds(list(entries)) is ok  # the same without the run's shortcut


def test_a_push_names_its_first_entry_out_of_bounds():
    """A binary PUSH with an entry whose index the codec cannot keep is refused naming that entry."""
    from dledger.entry import Entry, encode_entry
    from dledger.transport import remoting
    good = Entry(body=b"a", index=5, term=1, pos=0).sealed()
    bad = Entry(body=b"b", index=2**63 - 1, term=1, pos=49).sealed()
    push = remoting.encode_push_binary(PushEntryRequest(group="g0", term=1, leader_id="n0",
                                                        batch_entry=[good, bad]))
    assert encode_entry(bad) in push
    with pytest.raises(remoting.BinaryBodyError, match=r"entry #1\.index"):
        remoting.decode_push_binary(push)
