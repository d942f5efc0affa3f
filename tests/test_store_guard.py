"""The core's write guard (dledger.store.guard): role/term/leader rules as a table, hooks once, stores are storage."""

from __future__ import annotations

import pytest
from zope.interface import implementer
from zope.interface.verify import verifyObject

from dledger.codes import EntryType, ResponseCode, Role
from dledger.entry import HEADER_SIZE, Entry, body_crc, encode_entry
from dledger.errors import AppendHookError, BatchAppendError, DLedgerError
from dledger.interfaces import IBatchLogStore, ILogStore, IPlainLogStore
from dledger.store.guard import LogGuard, check_follower, check_leader, seal_leader_entry, seal_leader_entry_into
from dledger.store.memory import MemoryLogStore
from dledger.testing.store_contract import FakeMemberState, StampPos, bodies, fired, open_small_store

# -- the rules, one row per SPEC §4 sentence ---------------------------------------------------------------

OK = None


@pytest.mark.parametrize("role, leader_id, expected", [
    pytest.param(Role.LEADER, "n0", OK, id="a leader appends"),
    pytest.param(Role.FOLLOWER, "n2", ResponseCode.NOT_LEADER, id="a follower refuses leader appends"),
    pytest.param(Role.CANDIDATE, None, ResponseCode.NOT_LEADER, id="a candidate refuses leader appends"),
])
def test_check_leader(role, leader_id, expected):
    """Only the leader appends as leader; NOT_LEADER names the leader this member knows."""
    state = FakeMemberState(role=role, leader_id=leader_id)
    if expected is OK:
        check_leader(state)
        return
    with pytest.raises(DLedgerError) as info:
        check_leader(state)
    assert info.value.code is expected and info.value.leader_id == leader_id


@pytest.mark.parametrize("role, term, known_leader, leader_term, leader_id, expected", [
    pytest.param(Role.FOLLOWER, 3, "n1", 3, "n1", OK, id="the known leader in the current term"),
    pytest.param(Role.LEADER, 3, "n0", 3, "n0", ResponseCode.NOT_FOLLOWER, id="a leader takes no pushes"),
    pytest.param(Role.CANDIDATE, 3, None, 3, "n1", ResponseCode.NOT_FOLLOWER, id="a candidate takes no pushes"),
    pytest.param(Role.FOLLOWER, 3, "n1", 2, "n1", ResponseCode.INCONSISTENT_TERM, id="a stale leader term"),
    pytest.param(Role.FOLLOWER, 3, "n1", 4, "n1", ResponseCode.INCONSISTENT_TERM, id="a newer leader term"),
    pytest.param(Role.FOLLOWER, 3, "n1", 3, "n2", ResponseCode.INCONSISTENT_LEADER, id="another leader"),
    pytest.param(Role.FOLLOWER, 3, None, 3, "n1", ResponseCode.INCONSISTENT_LEADER, id="no known leader yet"),
    pytest.param(Role.LEADER, 3, "n0", 2, "n2", ResponseCode.NOT_FOLLOWER, id="role is checked first"),
    pytest.param(Role.FOLLOWER, 3, "n1", 2, "n2", ResponseCode.INCONSISTENT_TERM, id="term before leader"),
])
def test_check_follower(role, term, known_leader, leader_term, leader_id, expected):
    """A follower stores or truncates only for the leader it knows, in its term; checks in Java's order."""
    state = FakeMemberState(role=role, curr_term=term, leader_id=known_leader)
    if expected is OK:
        check_follower(state, leader_term, leader_id)
        return
    with pytest.raises(DLedgerError) as info:
        check_follower(state, leader_term, leader_id)
    assert info.value.code is expected


def test_seal_without_hooks_only_places_and_seals_the_crc():
    """With no hook (or for a NOOP) the stored entry is the body at index/pos with its crc32c."""
    body = b"payload"
    for magic, hooks in ((EntryType.NORMAL, ()), (EntryType.NOOP, (StampPos(),))):
        e = seal_leader_entry(hooks, Entry(body=body, term=4, magic=magic), 7, 4096)
        assert (e.index, e.term, e.pos, e.magic, e.body, e.body_crc) == (7, 4, 4096, magic, body, body_crc(body))
        assert all(not h.seen for h in hooks)


def test_seal_runs_hooks_in_order_then_seals():
    """Hooks run in registration order on the encoded entry; the CRC covers what the last one left."""
    calls = []

    class Tag:
        def __init__(self, tag):
            self.tag = tag

        def before_append(self, entry, buffer, body_offset):
            calls.append((self.tag, bytes(buffer[body_offset:body_offset + 2])))
            buffer[body_offset:body_offset + 2] = self.tag

    e = seal_leader_entry([Tag(b"AA"), Tag(b"BB")], Entry(body=b"..rest", term=1), 0, 0)
    assert calls == [(b"AA", b".."), (b"BB", b"AA")]
    assert e.body == b"BBrest" and e.body_crc == body_crc(b"BBrest")


class _Tag:
    """A hook that writes its tag over the first body bytes and checks its header is where the contract says."""

    def __init__(self, tag):
        self.tag = tag

    def before_append(self, entry, buffer, body_offset):
        assert bytes(buffer[body_offset - HEADER_SIZE:body_offset]) == encode_entry(
            Entry(entry.body, entry.index, entry.term, entry.pos, entry.magic))[:HEADER_SIZE]
        buffer[body_offset:body_offset + len(self.tag)] = self.tag


class _Bad:
    def __init__(self, how):
        self.how = how

    def before_append(self, entry, buffer, body_offset):
        buffer[body_offset:body_offset + 1] = b"!"  # a change made before failing must not survive either
        if self.how == "raise":
            raise ValueError("no")
        buffer += b"grown"


@pytest.mark.parametrize("hooks, magic, body", [
    pytest.param((), EntryType.NORMAL, b"payload", id="no hook"),
    pytest.param((_Tag(b"AA"),), EntryType.NOOP, b"", id="a NOOP skips the hooks"),
    pytest.param((_Tag(b"AA"),), EntryType.NORMAL, b"..rest", id="one hook"),
    pytest.param((_Tag(b"AA"), _Tag(b"B")), EntryType.NORMAL, b"..rest", id="hooks in order"),
    pytest.param((StampPos(),), EntryType.NORMAL, b"\0" * 8 + b"body", id="the contract suite's pos stamp"),
])
@pytest.mark.parametrize("prefix", [b"", b"earlier entries"])
def test_seal_into_writes_what_seal_gives(hooks, magic, body, prefix):
    """seal.into writes exactly the encoding of seal's entry at its place in the store's buffer, leaving the bytes
    before it alone, and returns an equal entry."""
    entry = Entry(body=body, term=3, magic=magic)
    expected = seal_leader_entry(hooks, entry, 9, 4096)
    buf = bytearray(prefix + bytes(HEADER_SIZE + len(body)))
    got = seal_leader_entry_into(hooks, entry, 9, 4096, memoryview(buf), len(prefix))
    assert got == expected and bytes(buf) == prefix + encode_entry(expected)


@pytest.mark.parametrize("how, message", [("raise", "ValueError: no"), ("grow", "TypeError")])
@pytest.mark.parametrize("into", [False, True], ids=["own buffer", "into"])
def test_a_hook_that_raises_or_grows_its_buffer_fails_its_entry(how, message, into):
    """A hook that raises, or tries to change the entry's length (its buffer is a memoryview of exactly the entry,
    which cannot grow), fails its entry with AppendHookError; the bytes before the entry stay as they were."""
    buf = bytearray(b"earlier" + bytes(HEADER_SIZE + 4))
    with pytest.raises(AppendHookError, match=message):
        if into:
            seal_leader_entry_into([_Bad(how)], Entry(body=b"body", term=1), 0, 0, memoryview(buf), 7)
        else:
            seal_leader_entry([_Bad(how)], Entry(body=b"body", term=1), 0, 0)
    assert bytes(buf[:7]) == b"earlier"


def test_the_guards_seal_offers_the_into_form():
    """The seal a plain store gets also carries ``into`` with the same hooks (stores that write runs use it)."""
    state = FakeMemberState()
    guard = LogGuard(MemoryLogStore(state), state)
    guard.add_append_hook(_Tag(b"Z"))
    buf = bytearray(HEADER_SIZE + 2)
    e = guard.seal.into(Entry(body=b"ab", term=1), 0, 0, memoryview(buf), 0)
    assert e.body == b"Zb" and bytes(buf) == encode_entry(e)


# -- the guard over every store of the project ----------------------------------------------------------------

FILE = 1024


@pytest.fixture(params=["memory", "mmap", "lmdb"])
def plain(request, tmp_path):
    state = FakeMemberState()
    store = open_small_store(request.param, tmp_path, state, FILE)
    yield store, state
    fired(store.shutdown())


def test_project_stores_are_plain(plain):
    """memory, mmap and lmdb declare IPlainLogStore (storage only) and take the core's seal."""
    store, _ = plain
    assert verifyObject(IPlainLogStore, store) and not hasattr(store, "add_append_hook")


def test_a_plain_store_leaves_roles_to_the_guard(plain):
    """A store stores whatever the member's role; the guard refuses: the rule lives in one place."""
    store, state = plain
    state.follow(1, "n2")
    assert store.append_as_leader(Entry(body=b"x", term=1)).index == 0
    guard = LogGuard(store, state)
    with pytest.raises(DLedgerError) as info:
        guard.append_as_leader(Entry(body=b"y", term=1))
    assert info.value.code is ResponseCode.NOT_LEADER and store.ledger_end_index == 0
    state.lead(1)
    follower_entry = Entry(body=b"z", index=1, term=1, pos=store.get(0).pos + store.get(0).size).sealed()
    assert store.append_as_follower(follower_entry, 9, "nobody") == follower_entry
    with pytest.raises(BatchAppendError) as batch:
        guard.append_batch_as_follower([follower_entry], 1, "n1")
    assert batch.value.code is ResponseCode.NOT_FOLLOWER and batch.value.stored == []


def test_guard_seals_through_the_store_placement(plain):
    """Hooks see each entry at the position the store chose (across file rollovers), once, and nothing else."""
    store, state = plain
    guard = LogGuard(store, state)
    hook = StampPos()
    guard.add_append_hook(hook)
    stored = guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b, term=1) for b in bodies(12, size=200)])
    stored.append(guard.append_as_leader(Entry(body=b"\0" * 8 + b"one", term=1)))
    stored.append(guard.append_as_leader(Entry(body=b"", term=1, magic=EntryType.NOOP)))
    assert hook.seen == [(e.index, e.pos) for e in stored[:-1]]
    assert len({e.pos // FILE for e in stored}) > 2, "the batch should roll data files"
    for e in stored[:-1]:
        got = store.get(e.index)
        assert got.body[:8] == e.pos.to_bytes(8, "big") and got.body_crc == body_crc(got.body)


def test_guard_passes_no_seal_until_a_hook_is_added():
    """Without hooks a plain store seals the CRC itself (no call per entry); with one it gets the guard's seal."""
    seen = []

    @implementer(IPlainLogStore, IBatchLogStore)
    class Spy(MemoryLogStore):
        def append_batch_as_leader(self, entries, seal=None):
            seen.append(seal)
            return super().append_batch_as_leader(entries, seal)

    state = FakeMemberState()
    guard = LogGuard(Spy(state), state)
    guard.append_batch_as_leader([Entry(body=b"a", term=1)])
    guard.add_append_hook(StampPos())
    guard.append_batch_as_leader([Entry(body=b"\0" * 8, term=1)])
    assert seen == [None, guard.seal]


# -- a store written before the guard (third-party) keeps working ---------------------------------------------

@implementer(ILogStore)
class OldStyleStore:
    """A store of the old contract: checks roles itself, keeps its own hooks, no seal parameter, no batches."""

    def __init__(self, state):
        self.state = state
        self.inner = MemoryLogStore(state, data_file_size=FILE, max_entry_size=FILE - 8)
        self.hooks: list = []
        self.checks = 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def add_append_hook(self, hook):
        self.hooks.append(hook)

    def append_as_leader(self, entry):
        self.checks += 1
        check_leader(self.state)
        return self.inner.append_as_leader(entry, lambda e, i, p: seal_leader_entry(self.hooks, e, i, p))

    def append_as_follower(self, entry, leader_term, leader_id):
        self.checks += 1
        check_follower(self.state, leader_term, leader_id)
        return self.inner.append_as_follower(entry, leader_term, leader_id)

    def truncate(self, entry, leader_term, leader_id):
        self.checks += 1
        check_follower(self.state, leader_term, leader_id)
        return self.inner.truncate(entry, leader_term, leader_id)


def test_old_style_store_gets_the_hooks_and_batches():
    """A store without IPlainLogStore runs the hooks itself (registered once), and gets one-entry batches."""
    state = FakeMemberState()
    old = OldStyleStore(state)
    guard = LogGuard(old, state)
    hook = StampPos()
    guard.add_append_hook(hook)
    assert old.hooks == [hook] and guard.hooks == [hook]
    stored = guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b, term=1) for b in bodies(5)])
    assert hook.seen == [(e.index, e.pos) for e in stored] and old.checks == 5
    assert stored[2].body[:8] == stored[2].pos.to_bytes(8, "big")
    state.follow(1, "n2")
    with pytest.raises(BatchAppendError) as info:
        guard.append_batch_as_leader([Entry(body=b"x", term=1)])
    assert info.value.code is ResponseCode.NOT_LEADER and old.checks == 5, "refused before the store is called"


def test_old_style_store_follower_path():
    """Follower batches and truncate reach an old-style store after the guard's checks, which refuse first."""
    state = FakeMemberState()
    leader = LogGuard(MemoryLogStore(state, data_file_size=FILE, max_entry_size=FILE - 8), state)
    entries = leader.append_batch_as_leader([Entry(body=b, term=1) for b in bodies(6)])
    state.follow(1, "n1")
    old = OldStyleStore(state)
    guard = LogGuard(old, state)
    assert guard.append_batch_as_follower(entries, 1, "n1") == entries
    assert guard.truncate(entries[3], 1, "n1") == 3 and old.ledger_end_index == 3
    calls = old.checks
    with pytest.raises(DLedgerError) as info:
        guard.truncate(entries[2], 2, "n1")
    assert info.value.code is ResponseCode.INCONSISTENT_TERM and old.checks == calls


def test_hook_failure_keeps_earlier_entries_of_the_batch(plain):
    """A hook raising on the third entry: two entries stored, BatchAppendError carries the AppendHookError."""
    store, state = plain
    guard = LogGuard(store, state)

    class BoomOnThird:
        def before_append(self, entry, buffer, body_offset):
            if entry.index == 2:
                raise RuntimeError("boom")

    guard.add_append_hook(BoomOnThird())
    with pytest.raises(BatchAppendError) as info:
        guard.append_batch_as_leader([Entry(body=b, term=1) for b in bodies(4)])
    assert isinstance(info.value.cause, AppendHookError) and "RuntimeError: boom" in str(info.value.cause)
    assert [e.index for e in info.value.stored] == [0, 1] and store.ledger_end_index == 1
    assert store.get(1).body == bodies(2)[1]


def test_member_writes_go_through_its_guard():
    """A member's hooks are its guard's; client appends and the term's NOOP pass the guard into the store."""
    from dledger.testing import Cluster

    hook = StampPos()
    cluster = Cluster(1, handlers=lambda mid, server: server.add_append_hook(hook))
    cluster.start()
    server = cluster.servers["n0"]
    assert server.guard.hooks == [hook] and server.guard.store is server.store
    try:
        cluster.wait_for_leader()
        d = cluster.client().append(b"\0" * 8 + b"hello")
        assert cluster.run_until(lambda: d.called, 5)
        noop = server.store.get(server.replicator.term_start_index)
        assert noop.is_noop and hook.seen == [(noop.index + 1, server.store.get(noop.index + 1).pos)]
    finally:
        cluster.stop()


def test_the_mmap_store_seals_into_its_run_buffer(tmp_path):
    """The mmap store takes seal.into (the hooks rewrite the bytes it writes) and stores what seal would."""
    state = FakeMemberState()
    store = open_small_store("mmap", tmp_path, state, FILE)
    guard = LogGuard(store, state)
    guard.add_append_hook(StampPos())
    calls = []
    real = guard.seal.into
    guard.seal.into = lambda *a: calls.append(a[1]) or real(*a)
    stored = guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b, term=1) for b in bodies(12, size=200)])
    assert calls == [e.index for e in stored] and len({e.pos // FILE for e in stored}) > 2
    fired(store.shutdown())
    reopened = open_small_store("mmap", tmp_path, state, FILE)
    assert [reopened.get(e.index) for e in stored] == stored
    assert all(e.body[:8] == e.pos.to_bytes(8, "big") for e in stored)
    fired(reopened.shutdown())


class _KeepsViews(StampPos):
    """A hook that keeps a view of every buffer it is handed (harmless while each entry had its own buffer)."""

    def __init__(self, fail_at: int = -1):
        super().__init__()
        self.views: list[memoryview] = []
        self.fail_at = fail_at

    def before_append(self, entry, buffer, body_offset):
        self.views.append(memoryview(buffer))
        if entry.index == self.fail_at:
            raise ValueError("no")
        super().before_append(entry, buffer, body_offset)


def test_a_hook_keeping_views_of_its_buffer_breaks_no_append(plain):
    """A store writing runs from one buffer still stores every entry when a hook pins that buffer (BufferError)."""
    store, state = plain
    guard = LogGuard(store, state)
    hook = _KeepsViews()
    guard.add_append_hook(hook)
    for batch in range(3):
        stored = guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b, term=1) for b in bodies(7, size=200)])
        assert [e.index for e in stored] == list(range(batch * 7, batch * 7 + 7))
    assert store.ledger_end_index == 20 and len(hook.views) >= 21
    for e in stored:
        got = store.get(e.index)
        assert got == e and got.body[:8] == got.pos.to_bytes(8, "big")


def test_a_failing_hook_keeping_views_fails_only_its_entry(plain):
    """Pinned buffer and a failing hook together: the batch rule still holds (earlier entries stored, clear error)."""
    store, state = plain
    guard = LogGuard(store, state)
    hook = _KeepsViews(fail_at=3)
    guard.add_append_hook(hook)
    with pytest.raises(BatchAppendError) as info:
        guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b, term=1) for b in bodies(6, size=100)])
    assert isinstance(info.value.cause, AppendHookError) and "ValueError: no" in str(info.value.cause)
    assert [e.index for e in info.value.stored] == [0, 1, 2] and store.ledger_end_index == 2
    assert [store.get(i) for i in range(3)] == info.value.stored
    hook.fail_at = -1
    more = guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b"after", term=1)])
    assert more[0].index == 3 and store.get(3).body[8:] == b"after"
