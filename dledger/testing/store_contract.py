"""The log-store contract suite: point it at your store and it checks every SPEC §5 operation.

Usage (pytest)::

    from dledger.testing.store_contract import LogStoreContract

    class TestMyStore(LogStoreContract):
        persistent = True          # reopening keeps flushed entries

        @pytest.fixture
        def open_store(self, tmp_path):
            def open_(member_state):
                store = MyStore(tmp_path, member_state, data_file_size=self.data_file_size)
                store.startup()
                return store
            return open_

Role, term and leader checks and the append hooks are the core's
(:class:`dledger.store.guard.LogGuard`): the suite checks them through a
guard around your store, so a store that is storage only
(:class:`dledger.interfaces.IPlainLogStore`) and one that still checks
roles itself both pass.

``open_store(member_state)`` must return a started store; calling it again
(after the previous one was shut down) must open the *same* storage.  Use
:attr:`data_file_size` for the data file size so that files roll during the
suite, and run blocking I/O inline (``dledger.diskio.INLINE``) so that
``flush()`` Deferreds have fired when it returns.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from zope.interface.verify import verifyObject

from dledger.codes import ResponseCode, Role
from dledger.entry import BODY_OFFSET, Entry, body_crc, place_entry
from dledger.errors import BatchAppendError, DLedgerError
from dledger.interfaces import IBatchLogStore, ICompactingLogStore, ILogStore, IPositionReader
from dledger.store.guard import LogGuard


@dataclass
class FakeMemberState:
    """A member state a test can flip between roles and terms."""

    self_id: str = "n0"
    role: Role = Role.LEADER
    curr_term: int = 1
    leader_id: str | None = "n0"

    def lead(self, term: int) -> None:
        self.role, self.curr_term, self.leader_id = Role.LEADER, term, self.self_id

    def follow(self, term: int, leader_id: str = "n1") -> None:
        self.role, self.curr_term, self.leader_id = Role.FOLLOWER, term, leader_id


def fired(d):
    """The result of a Deferred that must already have fired (stores in the suite run I/O inline)."""
    results = []
    d.addBoth(results.append)
    assert results, "Deferred has not fired: run the store's blocking I/O inline in the contract suite"
    if hasattr(results[0], "raiseException"):
        results[0].raiseException()
    return results[0]


def expect_code(code: ResponseCode, fn, *args):
    with pytest.raises(DLedgerError) as info:
        fn(*args)
    assert info.value.code == code, f"expected {code.name}, got {info.value.code.name}: {info.value}"
    return info.value


def layout(sizes: list[int], file_size: int, start: int = 0) -> list[int]:
    """Positions a sequence of entries of ``sizes`` must get, computed independently of any store."""
    out, write = [], start
    for size in sizes:
        pos = write
        if size + 8 > file_size - write % file_size:
            pos = write + (file_size - write % file_size)
        out.append(pos)
        write = pos + size
    return out


def bodies(n: int, start: int = 0, size: int = 0) -> list[bytes]:
    return [(f"entry-{i:05d}-".encode() + b"x" * (size or (i * 37) % 300)) for i in range(start, start + n)]


def open_small_store(kind: str, directory, member_state, file_size: int = 1024):
    """A started ``memory``, ``mmap`` or ``lmdb`` log store under ``directory`` with ``file_size``-byte data files.

    Small files make a few entries roll over data files, which is where
    placement (and an append hook that reads ``entry.pos``) is tested.
    """
    from pathlib import Path

    from dledger.store.lmdbstore import LmdbLogStore
    from dledger.store.memory import MemoryLogStore
    from dledger.store.mmapfile import MmapLogStore

    directory = Path(directory)
    if kind == "memory":
        return MemoryLogStore(member_state, data_file_size=file_size, max_entry_size=file_size - 8)
    if kind == "mmap":
        store = MmapLogStore(directory / "dledger-n0", member_state, data_file_size=file_size,
                             index_file_size=32 * 64, max_entry_size=file_size - 8)
    elif kind == "lmdb":
        store = LmdbLogStore(directory / "lmdb", member_state, data_file_size=file_size,
                             max_entry_size=file_size - 8, map_size=1 << 20)
    else:
        raise ValueError(f"unknown store kind {kind!r} (memory, mmap or lmdb)")
    store.startup()
    return store


class StampPos:
    """An append hook that writes the entry's pos into its first 8 body bytes and remembers (index, pos) it saw."""

    def __init__(self):
        self.seen: list[tuple[int, int]] = []

    def before_append(self, entry, buffer, body_offset):
        self.seen.append((entry.index, entry.pos))
        buffer[body_offset:body_offset + 8] = entry.pos.to_bytes(8, "big")


class _CoreContract:
    """The rules every log store follows: appends, follower appends, truncation, reads, committed index, reopen."""

    persistent = False
    data_file_size = 1024
    max_entry_size = 1024 - 8

    @pytest.fixture
    def open_store(self):  # pragma: no cover - subclasses provide it
        raise NotImplementedError("provide an open_store fixture")

    @pytest.fixture
    def state(self):
        return FakeMemberState()

    @pytest.fixture
    def store(self, open_store, state):
        return open_store(state)

    @pytest.fixture
    def guard(self, store, state):
        """The member's writes to ``store``: role/term/leader checks and append hooks, as a server makes them."""
        return LogGuard(store, state)

    def leader_append(self, store, state, payloads, term=None):
        term = state.curr_term if term is None else term
        return [store.append_as_leader(Entry(body=b, term=term)) for b in payloads]

    # -- basics ------------------------------------------------------------
    def test_provides_interface(self, store):
        """The store provides every attribute and method of ILogStore."""
        assert verifyObject(ILogStore, store)

    def test_empty_store(self, store):
        """An empty store reports -1 everywhere and refuses reads."""
        assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term,
                store.committed_index) == (-1, -1, -1, -1)
        expect_code(ResponseCode.INDEX_OUT_OF_RANGE, store.get, 0)

    def test_leader_appends_get_consecutive_indexes(self, store, state):
        """append_as_leader assigns index end+1, keeps the term, seals the CRC and stores what get() returns."""
        payloads = bodies(30)
        stored = self.leader_append(store, state, payloads)
        assert [e.index for e in stored] == list(range(30))
        assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term) == (0, 29, 1)
        for e, body in zip(stored, payloads):
            assert e.body == body and e.term == 1 and e.body_crc == body_crc(body)
            assert store.get(e.index) == e
        expect_code(ResponseCode.INDEX_OUT_OF_RANGE, store.get, 30)

    def test_positions_follow_file_layout(self, store, state):
        """Entries never straddle data files: positions match DLedger's blank-padded layout."""
        payloads = bodies(60)
        stored = self.leader_append(store, state, payloads)
        sizes = [BODY_OFFSET + len(b) for b in payloads]
        assert [e.pos for e in stored] == layout(sizes, self.data_file_size)
        assert stored[-1].pos > 3 * self.data_file_size, "the suite should roll several files"
        assert [place_entry(0, 100, self.data_file_size)] == [(0, 0)]

    def test_append_as_leader_requires_leader(self, store, guard, state):
        """A follower refuses leader appends with NOT_LEADER naming the leader."""
        state.follow(1, "n2")
        err = expect_code(ResponseCode.NOT_LEADER, guard.append_as_leader, Entry(body=b"x", term=1))
        assert err.leader_id == "n2"
        assert store.ledger_end_index == -1

    def test_oversized_entry_is_refused(self, store, state):
        """An entry larger than a data file (or the maximum) is refused and nothing is stored."""
        self.leader_append(store, state, [b"small"])
        with pytest.raises(DLedgerError) as info:
            store.append_as_leader(Entry(body=b"x" * self.data_file_size, term=1))
        assert info.value.code in (ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.DISK_ERROR)
        assert store.ledger_end_index == 0
        assert self.leader_append(store, state, [b"next"])[0].index == 1

    def test_append_hook_rewrites_body_before_crc(self, store, guard, state):
        """Append hooks see the encoded entry and may rewrite body bytes; the CRC covers the result."""
        hook = StampPos()
        guard.add_append_hook(hook)
        stored = self.leader_append(guard, state, [b"\0" * 8 + b"tail", b"\0" * 8 + b"more"])
        assert hook.seen == [(0, stored[0].pos), (1, stored[1].pos)]
        got = store.get(1)
        assert got.body[:8] == stored[1].pos.to_bytes(8, "big") and got.body[8:] == b"more"
        assert got.body_crc == body_crc(got.body)

    # -- follower ----------------------------------------------------------
    def _leader_entries(self, n, term=1, start=0, file_size=None):
        payloads = bodies(n, start)
        sizes = [BODY_OFFSET + len(b) for b in payloads]
        positions = layout(sizes, file_size or self.data_file_size)
        return [Entry(body=b, index=start + i, term=term, pos=p, body_crc=body_crc(b))
                for i, (b, p) in enumerate(zip(payloads, positions))]

    def test_append_as_follower_stores_leader_bytes(self, store, state):
        """A follower stores the leader's entries unchanged and in order."""
        state.follow(2)
        entries = self._leader_entries(40, term=2)
        for e in entries:
            assert store.append_as_follower(e, 2, "n1") == e
        assert [store.get(i) for i in range(40)] == entries
        assert (store.ledger_end_index, store.ledger_end_term) == (39, 2)

    @pytest.mark.parametrize("case", ["not_follower", "index_gap", "index_repeat", "term", "leader", "pos"])
    def test_append_as_follower_checks(self, store, guard, state, case):
        """appendAsFollower refuses wrong role, index, term, leader and position, storing nothing."""
        state.follow(2)
        entries = self._leader_entries(3, term=2)
        store.append_as_follower(entries[0], 2, "n1")
        e, term, leader = entries[1], 2, "n1"
        code = {
            "not_follower": ResponseCode.NOT_FOLLOWER, "index_gap": ResponseCode.INCONSISTENT_INDEX,
            "index_repeat": ResponseCode.INCONSISTENT_INDEX, "term": ResponseCode.INCONSISTENT_TERM,
            "leader": ResponseCode.INCONSISTENT_LEADER, "pos": ResponseCode.DISK_ERROR}[case]
        if case == "not_follower":
            state.lead(2)
        elif case == "index_gap":
            e = entries[2]
        elif case == "index_repeat":
            e = entries[0]
        elif case == "term":
            term = 3
        elif case == "leader":
            leader = "n2"
        else:
            e = Entry(body=e.body, index=e.index, term=e.term, pos=e.pos + 1, body_crc=e.body_crc)
        expect_code(code, guard.append_as_follower, e, term, leader)
        assert store.ledger_end_index == 0
        state.follow(2)
        assert store.append_as_follower(entries[1], 2, "n1") == entries[1]

    # -- truncate ------------------------------------------------------------
    def _follower_with(self, store, state, n, term=1):
        state.follow(term)
        entries = self._leader_entries(n, term=term)
        for e in entries:
            store.append_as_follower(e, term, "n1")
        return entries

    def test_truncate_to_matching_entry_drops_tail(self, store, state):
        """Truncating at an entry we hold drops everything after it."""
        entries = self._follower_with(store, state, 20)
        assert store.truncate(entries[9], 1, "n1") == 9
        assert (store.ledger_end_index, store.ledger_end_term) == (9, 1)
        expect_code(ResponseCode.INDEX_OUT_OF_RANGE, store.get, 10)
        nxt = self._leader_entries(20)[10]
        assert store.append_as_follower(nxt, 1, "n1") == nxt

    def test_truncate_replaces_divergent_entry(self, store, state):
        """Truncating with an entry that differs from ours replaces it and drops the rest."""
        entries = self._follower_with(store, state, 20, term=1)
        state.follow(3)
        other = Entry(body=b"new-term", index=12, term=3, pos=entries[12].pos)
        other = other.sealed()
        assert store.truncate(other, 3, "n1") == 12
        assert store.get(12) == other and store.ledger_end_index == 12 and store.ledger_end_term == 3
        assert store.get(11) == entries[11]

    def test_truncate_at_end_plus_one_appends(self, store, state):
        """Truncating at end+1 appends the entry."""
        entries = self._follower_with(store, state, 5)
        nxt = self._leader_entries(6)[5]
        assert store.truncate(nxt, 1, "n1") == 5
        assert store.get(5) == nxt and store.get(4) == entries[4]

    @pytest.mark.parametrize("where", ["beyond_end", "before_begin", "empty"])
    def test_truncate_outside_range_resets_log(self, store, state, where):
        """A truncate entry outside [begin, end+1] resets the log to start at that entry."""
        n = 0 if where == "empty" else 10
        self._follower_with(store, state, n)
        index = {"beyond_end": 500, "before_begin": 500, "empty": 7}[where]
        entry = Entry(body=b"restart", index=index, term=1, pos=40 * self.data_file_size).sealed()
        assert store.truncate(entry, 1, "n1") == index
        assert (store.ledger_begin_index, store.ledger_end_index) == (index, index)
        assert store.get(index) == entry
        assert store.committed_index <= index
        expect_code(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, store.get, index - 1)
        if where == "before_begin":
            earlier = Entry(body=b"earlier", index=100, term=1, pos=10 * self.data_file_size).sealed()
            assert store.truncate(earlier, 1, "n1") == 100
            assert (store.ledger_begin_index, store.ledger_end_index) == (100, 100)
        nxt_pos = layout([BODY_OFFSET + 4], self.data_file_size, store.get(store.ledger_end_index).pos
                         + store.get(store.ledger_end_index).size)[0]
        nxt = Entry(body=b"next", index=store.ledger_end_index + 1, term=1, pos=nxt_pos).sealed()
        assert store.append_as_follower(nxt, 1, "n1") == nxt

    def test_truncate_checks_role_term_leader(self, store, guard, state):
        """truncate refuses a non-follower, a stale term and an unknown leader."""
        entries = self._follower_with(store, state, 5)
        expect_code(ResponseCode.INCONSISTENT_TERM, guard.truncate, entries[2], 2, "n1")
        expect_code(ResponseCode.INCONSISTENT_LEADER, guard.truncate, entries[2], 1, "n2")
        state.lead(1)
        expect_code(ResponseCode.NOT_FOLLOWER, guard.truncate, entries[2], 1, "n1")
        assert store.ledger_end_index == 4

    def test_truncate_never_drops_committed_entries(self, store, state):
        """A truncate that would remove a committed entry is refused, the log unchanged."""
        entries = self._follower_with(store, state, 10)
        store.update_committed_index(1, 6)
        expect_code(ResponseCode.INCONSISTENT_STATE, store.truncate, entries[3], 1, "n1")
        assert store.ledger_end_index == 9
        assert store.truncate(entries[6], 1, "n1") == 6

    # -- reads -------------------------------------------------------------
    def test_get_range_limits(self, store, state):
        """get_range stops at the count, the byte budget and the end, and returns at least one entry."""
        stored = self.leader_append(store, state, bodies(20, size=52))
        assert store.get_range(3, 5, 1 << 20) == stored[3:8]
        assert store.get_range(15, 100, 1 << 20) == stored[15:20]
        assert store.get_range(0, 100, 250) == stored[0:2]
        assert store.get_range(0, 100, 1) == stored[0:1]
        expect_code(ResponseCode.INDEX_OUT_OF_RANGE, store.get_range, 20, 5, 1000)

    def test_first_log_of_target_term(self, store, state):
        """get_first_log_of_target_term finds the first index of a term at or before end_index."""
        self.leader_append(store, state, bodies(3), term=1)
        state.lead(3)
        self.leader_append(store, state, bodies(4), term=3)
        state.lead(5)
        self.leader_append(store, state, bodies(2), term=5)
        assert store.get_first_log_of_target_term(3, 8) == 3
        assert store.get_first_log_of_target_term(1, 8) == 0
        assert store.get_first_log_of_target_term(5, 8) == 7
        assert store.get_first_log_of_target_term(5, 6) == -1
        assert store.get_first_log_of_target_term(4, 8) == -1

    # -- committed index ---------------------------------------------------
    def test_update_committed_index_rules(self, store, state):
        """committed only moves forward, never past the end, and ignores stale terms."""
        state.lead(2)
        store.update_committed_index(2, 0)
        assert store.committed_index == -1, "empty log: nothing to commit"
        self.leader_append(store, state, bodies(10))
        store.update_committed_index(2, 4)
        assert store.committed_index == 4
        store.update_committed_index(2, 3)
        assert store.committed_index == 4, "never backwards"
        store.update_committed_index(1, 8)
        assert store.committed_index == 4, "stale term ignored"
        store.update_committed_index(2, 50)
        assert store.committed_index == 9, "clamped to the end"

    # -- durability --------------------------------------------------------
    def test_flush_reports_durable_end(self, store, state):
        """flush() fires with the flushed index, which then equals the end index."""
        self.leader_append(store, state, bodies(25))
        assert fired(store.flush()) == 24
        assert store.flushed_index == 24

    def test_reopen_keeps_flushed_entries(self, open_store, store, state):
        """A persistent store reopened after shutdown serves the same entries and indexes."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        stored = self.leader_append(store, state, bodies(50))
        store.update_committed_index(state.curr_term, 40)
        fired(store.flush())
        fired(store.shutdown())
        again = open_store(state)
        assert (again.ledger_begin_index, again.ledger_end_index, again.ledger_end_term) == (0, 49, 1)
        assert again.committed_index == 40
        assert [again.get(i) for i in range(50)] == stored
        assert self.leader_append(again, state, [b"after"])[0].index == 50
        fired(again.shutdown())

    def test_reopen_after_truncate(self, open_store, store, state):
        """A persistent store reopened after a truncate does not resurrect dropped entries."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        entries = self._follower_with(store, state, 30)
        store.truncate(entries[11], 1, "n1")
        fired(store.flush())
        fired(store.shutdown())
        again = open_store(state)
        assert again.ledger_end_index == 11
        assert again.get(11) == entries[11]
        fired(again.shutdown())

    def test_flushed_index_never_passes_end_after_truncate(self, store, state):
        """After a truncate, flushed_index does not claim dropped entries, and a flush covers the new tail."""
        entries = self._follower_with(store, state, 20)
        fired(store.flush())
        store.truncate(entries[7], 1, "n1")
        assert store.flushed_index <= 7
        nxt = self._leader_entries(20)[8]
        store.append_as_follower(nxt, 1, "n1")
        assert fired(store.flush()) == 8 and store.flushed_index == 8

    def test_reopen_empty(self, open_store, store, state):
        """A persistent store reopened without any entry is empty and accepts index 0."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        fired(store.shutdown())
        again = open_store(state)
        assert (again.ledger_begin_index, again.ledger_end_index, again.committed_index) == (-1, -1, -1)
        assert self.leader_append(again, state, [b"first"])[0].index == 0
        fired(again.shutdown())

    def test_reopen_after_replace(self, open_store, store, state):
        """A replaced entry survives a reopen; the entries after it stay dropped."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        entries = self._follower_with(store, state, 20, term=1)
        state.follow(3)
        other = Entry(body=b"new-term", index=12, term=3, pos=entries[12].pos).sealed()
        store.truncate(other, 3, "n1")
        fired(store.flush())
        fired(store.shutdown())
        again = open_store(state)
        assert (again.ledger_end_index, again.ledger_end_term) == (12, 3)
        assert again.get(12) == other and again.get(11) == entries[11]
        fired(again.shutdown())

    @pytest.mark.parametrize("where", ["beyond_end", "empty"])
    def test_reopen_after_reset(self, open_store, store, state, where):
        """A log reset to start at a leader's entry reopens with that begin index, entry and position."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        self._follower_with(store, state, 0 if where == "empty" else 10)
        entry = Entry(body=b"restart", index=500, term=1, pos=40 * self.data_file_size + 100).sealed()
        store.truncate(entry, 1, "n1")
        nxt = Entry(body=b"next", index=501, term=1, pos=entry.pos + entry.size).sealed()
        store.append_as_follower(nxt, 1, "n1")
        store.update_committed_index(1, 500)
        fired(store.flush())
        fired(store.shutdown())
        again = open_store(state)
        assert (again.ledger_begin_index, again.ledger_end_index) == (500, 501)
        assert again.get(500) == entry and again.get(501) == nxt
        assert again.committed_index == 500
        expect_code(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, again.get, 499)
        fired(again.shutdown())


class _CompactionContract:
    """ICompactingLogStore: compaction and snapshot bases (the test methods use the core contract's fixtures)."""

    # -- compaction and snapshot bases (ICompactingLogStore) ------------------
    @pytest.fixture
    def compacting_store(self, store):
        if not ICompactingLogStore.providedBy(store):
            pytest.skip("store does not provide ICompactingLogStore")
        return store

    def crash(self, store) -> None:
        """Drop ``store`` as a killed process would (what was written stays, nothing more is written)."""
        abandon = getattr(store, "abandon", None)
        if abandon is None or not self.persistent:
            pytest.skip("store cannot be crashed and reopened")
        abandon()

    def _committed_log(self, store, state, n=60, committed=45):
        stored = self.leader_append(store, state, bodies(n))
        store.update_committed_index(state.curr_term, committed)
        fired(store.flush())
        return stored

    def test_compact_provides_interface(self, compacting_store):
        """The store provides every attribute and method of ICompactingLogStore."""
        assert verifyObject(ICompactingLogStore, compacting_store)
        assert compacting_store.snapshot_base == (-1, -1)

    def test_compact_drops_only_below_and_never_committed_or_last(self, compacting_store, state):
        """compact(i) keeps every entry >= i (file stores may keep more), never goes past committed + 1."""
        store = compacting_store
        stored = self._committed_log(store, state)
        begin = store.compact(30)
        assert begin == store.ledger_begin_index and 0 <= begin <= 30
        assert [store.get(i) for i in range(begin, 60)] == stored[begin:]
        if begin > 0:
            expect_code(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, store.get, begin - 1)
        begin = store.compact(10 ** 6)
        assert begin <= 46 and store.ledger_end_index == 59 and store.committed_index == 45
        assert store.get(59) == stored[59]
        assert store.compact(0) == begin  # never backwards
        assert self.leader_append(store, state, [b"after"])[0].index == 60

    def test_compact_survives_reopen_and_crash(self, open_store, compacting_store, state):
        """A compacted log reopens (after a shutdown, or a crash) with a begin index between the old and the new."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        store = compacting_store
        stored = self._committed_log(store, state)
        begin = store.compact(40)
        fired(store.flush())
        self.crash(store)
        again = open_store(state)
        assert 0 <= again.ledger_begin_index <= begin and again.ledger_end_index == 59
        assert [again.get(i) for i in range(again.ledger_begin_index, 60)] == stored[again.ledger_begin_index:]
        begin = again.compact(40)
        fired(again.shutdown())
        third = open_store(state)
        assert third.ledger_begin_index == begin and third.get(59) == stored[59]
        fired(third.shutdown())

    def _reset(self, store, state, index=500, term=3):
        next_pos = 40 * self.data_file_size + 100
        state.follow(term)
        store.reset_to_snapshot(index, term, next_pos)
        return next_pos

    def _assert_base(self, store, index=500, term=3):
        assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term,
                store.committed_index) == (index + 1, index, term, index)
        assert store.snapshot_base == (index, term)
        expect_code(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, store.get, index)

    def test_reset_to_snapshot_empties_the_log_with_a_base(self, compacting_store, state):
        """After reset_to_snapshot the log is empty with a base; the next follower entry goes at next_pos."""
        store = compacting_store
        self._committed_log(store, state)
        next_pos = self._reset(store, state)
        self._assert_base(store)
        entry = Entry(body=b"next", index=501, term=3, pos=next_pos).sealed()
        store.append_as_follower(entry, 3, "n1")
        assert store.get(501) == entry and store.ledger_begin_index == 501
        assert fired(store.flush()) == 501
        state.lead(4)
        nxt = self.leader_append(store, state, [b"lead"])[0]
        assert (nxt.index, nxt.pos) == (502, entry.pos + entry.size)

    def test_reset_leader_append_goes_at_next_pos(self, compacting_store, state):
        """A leader's first append after a reset is entry index + 1 at next_pos."""
        store = compacting_store
        next_pos = self._reset(store, state)
        if IPositionReader.providedBy(store):  # nothing committed past the base: both positions are next_pos
            assert store.begin_position() == store.committed_position() == next_pos
        state.lead(4)
        e = self.leader_append(store, state, [b"x"])[0]
        assert (e.index, e.pos) == (501, next_pos)

    @pytest.mark.parametrize("appended", [0, 3])
    @pytest.mark.parametrize("how", ["shutdown", "crash"])
    def test_reset_survives_reopen_and_crash(self, open_store, compacting_store, state, appended, how):
        """The base survives a shutdown or a crash after the flush, with or without entries after it."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        store = compacting_store
        self._committed_log(store, state)
        next_pos = self._reset(store, state)
        entries, pos = [], next_pos
        for k in range(appended):
            e = Entry(body=b"e%d" % k, index=501 + k, term=3, pos=pos).sealed()
            store.append_as_follower(e, 3, "n1")
            entries.append(e)
            pos = e.pos + e.size
        fired(store.flush())
        if how == "crash":
            self.crash(store)
        else:
            fired(store.shutdown())
        again = open_store(state)
        if appended:
            assert (again.ledger_begin_index, again.ledger_end_index) == (501, 500 + appended)
            assert [again.get(i) for i in range(501, 501 + appended)] == entries
            assert again.committed_index >= 500 or again.committed_index == -1
        else:
            self._assert_base(again)
        e = Entry(body=b"later", index=again.ledger_end_index + 1, term=3, pos=pos).sealed()
        again.append_as_follower(e, 3, "n1")
        assert again.get(e.index) == e
        fired(again.shutdown())

    def test_reset_then_crash_before_flush_is_old_or_new(self, open_store, compacting_store, state):
        """A crash right after reset_to_snapshot leaves either the old log or the base, never a mix."""
        if not self.persistent:
            pytest.skip("store is not persistent")
        store = compacting_store
        stored = self._committed_log(store, state)
        self._reset(store, state)
        self.crash(store)
        again = open_store(state)
        if again.ledger_end_index == 500:
            self._assert_base(again)
        else:
            assert again.ledger_end_index == 59
            assert [again.get(i) for i in range(again.ledger_begin_index, 60)] == stored[again.ledger_begin_index:]
        fired(again.shutdown())


class _BatchContract:
    """IBatchLogStore, for the stores that provide it (uses the core contract's fixtures)."""

    # -- batches (IBatchLogStore, for the stores that provide it) ------------
    @pytest.fixture
    def batch_store(self, store):
        if not IBatchLogStore.providedBy(store):
            pytest.skip("store does not provide IBatchLogStore")
        return store

    def expect_batch_error(self, code: ResponseCode, fn, *args) -> BatchAppendError:
        with pytest.raises(BatchAppendError) as info:
            fn(*args)
        assert info.value.code == code, f"expected {code.name}, got {info.value.code.name}: {info.value}"
        return info.value

    def test_batch_provides_interface(self, batch_store):
        """A batch store provides every method of IBatchLogStore."""
        assert verifyObject(IBatchLogStore, batch_store)

    def test_batch_leader_append_matches_one_by_one(self, batch_store, state, open_store):
        """A leader batch across several data files gets the indexes, positions and CRCs of one-by-one appends."""
        payloads = bodies(40)
        first = batch_store.append_batch_as_leader([Entry(body=b, term=1) for b in payloads[:3]])
        rest = batch_store.append_batch_as_leader([Entry(body=b, term=1) for b in payloads[3:]])
        stored = first + rest
        assert [e.index for e in stored] == list(range(40))
        assert [e.pos for e in stored] == layout([BODY_OFFSET + len(b) for b in payloads], self.data_file_size)
        assert stored[-1].pos > 3 * self.data_file_size, "the batch should roll several files"
        for e, body in zip(stored, payloads):
            assert e.body == body and e.term == 1 and e.body_crc == body_crc(body)
            assert batch_store.get(e.index) == e
        assert (batch_store.ledger_end_index, batch_store.ledger_end_term) == (39, 1)
        assert batch_store.append_batch_as_leader([]) == [] and batch_store.ledger_end_index == 39
        if self.persistent:
            fired(batch_store.flush())
            fired(batch_store.shutdown())
            again = open_store(state)
            assert [again.get(i) for i in range(40)] == stored
            fired(again.shutdown())

    def test_batch_leader_runs_hooks_per_entry(self, batch_store, guard, state):
        """Append hooks see each entry of a batch at its own index and pos; each CRC covers the rewritten body."""
        hook = StampPos()
        guard.add_append_hook(hook)
        stored = guard.append_batch_as_leader([Entry(body=b"\0" * 8 + b, term=1) for b in bodies(12)])
        assert hook.seen == [(e.index, e.pos) for e in stored]
        for e in stored:
            got = batch_store.get(e.index)
            assert got == e and got.body[:8] == e.pos.to_bytes(8, "big") and got.body_crc == body_crc(got.body)

    def test_batch_leader_failure_keeps_the_entries_before_it(self, batch_store, state):
        """An oversized entry in a leader batch: the entries before it stay (in every file), the caller learns which."""
        payloads = bodies(7, size=200)
        batch = [Entry(body=b, term=1) for b in payloads[:5]]
        batch += [Entry(body=b"x" * self.data_file_size, term=1), Entry(body=payloads[6], term=1)]
        err = self.expect_batch_error(ResponseCode.UNEXPECTED_ARGUMENT, batch_store.append_batch_as_leader, batch)
        assert [e.index for e in err.stored] == [0, 1, 2, 3, 4]
        assert err.stored[-1].pos >= self.data_file_size, "the kept entries should span two data files"
        assert [batch_store.get(i) for i in range(5)] == err.stored
        assert batch_store.ledger_end_index == 4
        assert batch_store.append_batch_as_leader([Entry(body=payloads[6], term=1)])[0].index == 5

    def test_batch_leader_refused_when_not_leader(self, batch_store, guard, state):
        """A follower refuses a leader batch with NOT_LEADER and stores nothing."""
        state.follow(1, "n2")
        err = self.expect_batch_error(ResponseCode.NOT_LEADER, guard.append_batch_as_leader,
                                      [Entry(body=b"x", term=1)])
        assert err.stored == [] and err.leader_id == "n2" and batch_store.ledger_end_index == -1

    def test_batch_follower_append_stores_leader_bytes(self, batch_store, state):
        """Follower batches of any size store the leader's entries unchanged, across data files."""
        state.follow(2)
        entries = self._leader_entries(40, term=2)
        for lo, hi in ((0, 1), (1, 8), (8, 30), (30, 40)):
            assert batch_store.append_batch_as_follower(entries[lo:hi], 2, "n1") == entries[lo:hi]
        assert [batch_store.get(i) for i in range(40)] == entries
        assert (batch_store.ledger_end_index, batch_store.ledger_end_term) == (39, 2)

    @pytest.mark.parametrize("case", ["oversized", "gap", "pos"])
    def test_batch_follower_failure_keeps_the_entries_before_it(self, batch_store, state, case):
        """A bad entry in a follower batch: the ones before it stay, the caller learns which, the rest can follow."""
        state.follow(1)
        entries = self._leader_entries(12)
        bad = entries[7]
        code = {"oversized": ResponseCode.UNEXPECTED_ARGUMENT, "gap": ResponseCode.INCONSISTENT_INDEX,
                "pos": ResponseCode.DISK_ERROR}[case]
        if case == "oversized":
            bad = Entry(body=b"x" * self.data_file_size, index=bad.index, term=1, pos=bad.pos).sealed()
        elif case == "gap":
            bad = entries[8]
        else:
            bad = Entry(body=bad.body, index=bad.index, term=1, pos=bad.pos + 1, body_crc=bad.body_crc)
        err = self.expect_batch_error(code, batch_store.append_batch_as_follower,
                                      entries[:7] + [bad] + entries[8:], 1, "n1")
        assert err.stored == entries[:7]
        assert batch_store.ledger_end_index == 6 and [batch_store.get(i) for i in range(7)] == entries[:7]
        assert batch_store.append_batch_as_follower(entries[7:], 1, "n1") == entries[7:]

    def test_batch_follower_checks_role_term_leader_first(self, batch_store, guard, state):
        """A follower batch from a stale term or another leader stores nothing."""
        state.follow(2)
        entries = self._leader_entries(3, term=2)
        err = self.expect_batch_error(ResponseCode.INCONSISTENT_TERM, guard.append_batch_as_follower,
                                      entries, 1, "n1")
        assert err.stored == []
        self.expect_batch_error(ResponseCode.INCONSISTENT_LEADER, guard.append_batch_as_follower,
                                entries, 2, "n2")
        state.lead(2)
        self.expect_batch_error(ResponseCode.NOT_FOLLOWER, guard.append_batch_as_follower, entries, 2, "n1")
        assert batch_store.ledger_end_index == -1


class LogStoreContract(_CoreContract, _CompactionContract, _BatchContract):
    """Every rule a log store must follow. Subclass and provide ``open_store``.

    Three parts (each a class of its own, so each stays readable): the core rules, compaction and
    snapshot bases, and batches; a store that lacks an optional interface skips that part's tests.
    """
