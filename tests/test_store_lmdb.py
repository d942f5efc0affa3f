"""The LMDB store: the log-store contract, group commit, crash consistency, map growth and its term store."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import lmdb
import pytest
from twisted.internet import task
from zope.interface.verify import verifyObject

from dledger.config import make_config
from dledger.entry import Entry
from dledger.errors import StoreError
from dledger.interfaces import ITermVoteStore
from dledger.plugins import get_store_type
from dledger.store.lmdbstore import ENTRIES, LmdbLogStore, LmdbTermVoteStore, SharedEnv, key
from dledger.testing.store_contract import FakeMemberState, LogStoreContract, bodies, fired

ROOT = Path(__file__).parent.parent


def open_lmdb(path, state, **kwargs):
    kwargs.setdefault("data_file_size", 1024)
    kwargs.setdefault("max_entry_size", 1024 - 8)
    kwargs.setdefault("map_size", 1 << 20)
    store = LmdbLogStore(path, state, **kwargs)
    store.startup()
    return store


class TestLmdbStoreContract(LogStoreContract):
    persistent = True

    @pytest.fixture
    def open_store(self, tmp_path):
        def open_(member_state):
            return open_lmdb(tmp_path / "lmdb", member_state, data_file_size=self.data_file_size,
                             max_entry_size=self.max_entry_size)
        return open_


@pytest.fixture
def state():
    return FakeMemberState()


def append(store, n, state, start=0, size=0):
    return [store.append_as_leader(Entry(body=b, term=state.curr_term)) for b in bodies(n, start, size)]


def db_keys(path) -> list[int]:
    shared = SharedEnv.acquire(path, readonly=True)
    try:
        with shared.env.begin() as txn:
            return [int.from_bytes(k, "big") for k, _ in txn.cursor(db=shared.entries)]
    finally:
        shared.release()


def test_appends_are_buffered_until_flush(tmp_path, state):
    """Appends are readable at once but reach LMDB only with flush(), all in one transaction."""
    store = open_lmdb(tmp_path / "lmdb", state)
    entries = append(store, 10, state)
    assert store.get(7) == entries[7] and store.flushed_index == -1
    with store._shared.env.begin() as txn:
        assert txn.get(key(0), db=store._shared.entries) is None
    before = store._shared.env.info()["last_txnid"]
    assert fired(store.flush()) == 9
    assert store._shared.env.info()["last_txnid"] == before + 1, "one write transaction per flush"
    fired(store.shutdown())
    assert db_keys(tmp_path / "lmdb") == list(range(10))


def test_truncate_and_reset_are_ranged_deletes(tmp_path, state):
    """A truncate deletes the dropped keys and a reset empties the database, in the next flush's transaction."""
    state.follow(1)
    store = open_lmdb(tmp_path / "lmdb", state)
    entries = LogStoreContract()._leader_entries(30, file_size=1024)
    for e in entries:
        store.append_as_follower(e, 1, "n1")
    fired(store.flush())
    store.truncate(entries[19], 1, "n1")
    fired(store.flush())
    assert db_keys(tmp_path / "lmdb") == list(range(20))
    restart = Entry(body=b"restart", index=100, term=1, pos=50 * 1024).sealed()
    store.truncate(restart, 1, "n1")
    fired(store.flush())
    fired(store.shutdown())
    assert db_keys(tmp_path / "lmdb") == [100]


def test_delete_before_moves_begin(tmp_path, state):
    """delete_before drops committed entries below an index with a ranged delete; begin moves and survives reopen."""
    store = open_lmdb(tmp_path / "lmdb", state)
    entries = append(store, 20, state)
    store.update_committed_index(1, 15)
    with pytest.raises(Exception, match="committed"):
        store.delete_before(18)
    assert store.delete_before(10) == 10
    assert store.ledger_begin_index == 10
    fired(store.flush())
    fired(store.shutdown())
    again = open_lmdb(tmp_path / "lmdb", state)
    assert (again.ledger_begin_index, again.ledger_end_index) == (10, 19)
    assert again.get(10) == entries[10]
    fired(again.shutdown())


def test_map_full_grows_and_retries(tmp_path, state):
    """When a flush does not fit the map, the map is doubled and the same transaction retried."""
    store = open_lmdb(tmp_path / "lmdb", state, map_size=64 * 1024)
    entries = append(store, 200, state, size=900)
    assert fired(store.flush()) == 199
    assert store._shared.env.info()["map_size"] > 64 * 1024
    fired(store.shutdown())
    again = open_lmdb(tmp_path / "lmdb", state, map_size=64 * 1024)
    assert again.get(199) == entries[199]
    fired(again.shutdown())


def test_flush_during_flush_groups(tmp_path, state):
    """Appends and flushes made while a threaded round runs are covered by exactly one next round."""
    from dledger.testing import HandIO
    io = HandIO()
    store = open_lmdb(tmp_path / "lmdb", state, blocking_io=io)
    append(store, 5, state)
    first = store.flush()
    later = append(store, 5, state, start=5)
    assert store.get(2).index == 2 and store.get(7) == later[2], "reads see in-flight and pending entries"
    second, third = store.flush(), store.flush()
    io.step()
    assert fired(first) == 4
    io.step()
    assert fired(second) == fired(third) == 9
    d = store.shutdown()
    io.drain()
    fired(d)


def crash_script(path: Path, body: str) -> str:
    return textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(ROOT)!r})
        from dledger.entry import Entry
        from dledger.store.lmdbstore import LmdbLogStore
        from dledger.testing.store_contract import FakeMemberState, fired
        state = FakeMemberState()
        store = LmdbLogStore({str(path)!r}, state, data_file_size=1024, map_size=1 << 20)
        store.startup()
    """) + textwrap.dedent(body) + "\nos._exit(0)\n"


def test_crash_loses_only_unflushed_appends(tmp_path, state):
    """A process killed between transactions keeps every flushed entry and none of the unflushed ones."""
    script = crash_script(tmp_path / "lmdb", """
        for i in range(40):
            store.append_as_leader(Entry(body=b"body-%d" % i, term=1))
            if i in (9, 24):
                fired(store.flush())
        store.update_committed_index(1, 20)
        fired(store.flush()) if False else None
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    store = open_lmdb(tmp_path / "lmdb", state)
    assert (store.ledger_begin_index, store.ledger_end_index) == (0, 24)
    assert [store.get(i).body for i in (0, 24)] == [b"body-0", b"body-24"]
    assert store.committed_index == -1, "the committed index moved after the last transaction"
    assert store.append_as_leader(Entry(body=b"next", term=1)).index == 25
    fired(store.shutdown())


def test_crash_after_unflushed_truncate_keeps_the_old_log(tmp_path, state):
    """A truncate that never reached a transaction is forgotten whole: the flushed log comes back unchanged."""
    script = crash_script(tmp_path / "lmdb", """
        state.follow(1)
        from dledger.testing.store_contract import LogStoreContract
        entries = LogStoreContract()._leader_entries(30, file_size=1024)
        for e in entries:
            store.append_as_follower(e, 1, "n1")
        fired(store.flush())
        store.truncate(entries[10], 1, "n1")
        store.append_as_follower(entries[11], 1, "n1")
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    store = open_lmdb(tmp_path / "lmdb", state)
    assert store.ledger_end_index == 29
    fired(store.shutdown())


@pytest.mark.parametrize("seed", range(20))
def test_crash_at_random_points(tmp_path, state, seed):
    """20 seeded histories of appends, truncates and flushes killed at a random point reopen at the last flush."""
    import random
    rng = random.Random(seed)
    ops, model, flushed = [], [], []
    for _ in range(rng.randint(5, 25)):
        kind = rng.choice(["append", "append", "flush", "truncate"])
        if kind == "append":
            n = rng.randint(1, 8)
            ops.append(f"add({n})")
            model += [None] * n
        elif kind == "truncate" and len(model) > 2:
            keep = rng.randrange(len(model))
            ops.append(f"cut({keep})")
            del model[keep + 1:]
        elif kind == "flush":
            ops.append("fired(store.flush())")
            flushed = list(model)
    script = crash_script(tmp_path / "lmdb", textwrap.dedent("""
        state.follow(1)
        def add(n):
            for _ in range(n):
                i = store.ledger_end_index + 1
                from dledger.entry import place_entry
                pos = place_entry(0 if i == 0 else store.get(i - 1).pos + store.get(i - 1).size, 68, 1024)[0]
                store.append_as_follower(Entry(body=b"%020d" % i, index=i, term=1, pos=pos).sealed(), 1, "n1")
        def cut(keep):
            store.truncate(store.get(keep), 1, "n1")
    """) + "\n".join(ops))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    store = open_lmdb(tmp_path / "lmdb", state)
    assert store.ledger_end_index == len(flushed) - 1
    for i in range(len(flushed)):
        assert store.get(i).body == b"%020d" % i
    fired(store.shutdown())


def test_damaged_value_is_a_disk_error_not_an_entry(tmp_path, state):
    """A value whose bytes do not decode (or whose CRC fails) is refused on read, never served."""
    store = open_lmdb(tmp_path / "lmdb", state)
    entries = append(store, 3, state)
    fired(store.flush())
    raw = bytearray(entries[1].size)
    from dledger.entry import encode_entry_into
    encode_entry_into(raw, 0, entries[1])
    raw[-1] ^= 1
    with store._shared.env.begin(write=True) as txn:
        txn.put(key(1), bytes(raw), db=store._shared.entries)
    from dledger.codes import ResponseCode
    from dledger.testing.store_contract import expect_code
    expect_code(ResponseCode.DISK_ERROR, store.get, 1)
    assert store.get(2) == entries[2]
    fired(store.shutdown())


def test_damaged_last_entry_stops_startup(tmp_path, state):
    """A store whose last entry is damaged refuses to start with a StoreError saying which entry."""
    store = open_lmdb(tmp_path / "lmdb", state)
    append(store, 3, state)
    fired(store.flush())
    with store._shared.env.begin(write=True) as txn:
        txn.put(key(2), b"garbage", db=store._shared.entries)
    fired(store.shutdown())
    with pytest.raises(StoreError, match="entry 2"):
        open_lmdb(tmp_path / "lmdb", state)


def test_async_policy_flushes_on_the_clock(tmp_path, state, clock):
    """With flushPolicy async the store commits buffered appends every flush_file_interval ms."""
    store = open_lmdb(tmp_path / "lmdb", state, flush_policy="async", flush_interval_ms=10, clock=clock)
    append(store, 4, state)
    assert store.flushed_index == -1
    clock.advance(0.01)
    assert store.flushed_index == 3
    fired(store.shutdown())
    assert not clock.getDelayedCalls()


def test_term_store_shares_the_environment(tmp_path, state):
    """The LMDB term store lives in the log's environment (one handle), is durable per save and round-trips."""
    log_store = open_lmdb(tmp_path / "lmdb", state)
    terms = LmdbTermVoteStore(tmp_path / "lmdb")
    assert verifyObject(ITermVoteStore, terms)
    assert terms.load() == (0, None)
    terms.save(5, "n2")
    assert terms._env() is log_store._shared
    terms.save(6, None)
    terms.close()
    fired(log_store.shutdown())
    assert str((tmp_path / "lmdb").resolve()) not in SharedEnv._open, "closed with its last user"
    again = LmdbTermVoteStore(tmp_path / "lmdb")
    assert again.load() == (6, None)
    again.close()


def test_lmdb_store_type_is_registered(tmp_path):
    """The lmdb store type builds a log store and a term store in <member_dir>/lmdb from a config."""
    config = make_config(store_base_dir=str(tmp_path), store_type="lmdb", lmdb_map_size=1 << 20)
    st = get_store_type("lmdb")
    store = st.make_log_store(config, FakeMemberState(), clock=task.Clock())
    store.startup()
    append(store, 3, FakeMemberState())
    fired(store.shutdown())
    terms = st.make_term_store(config)
    terms.save(2, "n0")
    terms.close()
    assert (tmp_path / "dledger-n0" / "lmdb" / "data.mdb").exists()
    env = lmdb.open(str(tmp_path / "dledger-n0" / "lmdb"), readonly=True, lock=False, max_dbs=4)
    with env.begin() as txn:
        assert txn.stat(env.open_db(ENTRIES, txn=txn, create=False))["entries"] == 3
    env.close()
