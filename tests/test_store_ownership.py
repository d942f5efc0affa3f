"""Store ownership (issue #9 items 3-5): the directory lock, the identity record and the term/vote rule."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from dledger.config import make_config
from dledger.entry import Entry
from dledger.errors import StoreError, StoreInUseError, StoreOwnerError, TermVoteLostError
from dledger.plugins import get_store_type
from dledger.server import DLedgerServer
from dledger.store import ownership
from dledger.store.lmdbstore import LmdbLogStore, LmdbTermVoteStore
from dledger.store.mmapfile import MmapLogStore
from dledger.store.ownership import Decision, Owner, TermVote
from dledger.testing.store_contract import FakeMemberState, bodies, fired

GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"
PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"
KINDS = ["mmap", "lmdb"]


def config(tmp_path, kind="mmap", *, group="g0", self_id="n0", **extra):
    return make_config(store_base_dir=str(tmp_path), store_type=kind, group=group, self_id=self_id, peers=PEERS,
                       mapped_file_size_for_entry_data=4096, mapped_file_size_for_entry_index=512,
                       lmdb_map_size=1 << 20, **extra)


def digests(root: Path) -> dict[str, tuple[str, int]]:
    """Checksum and mtime of every file but the lock files (our pid; LMDB's reader table): no data in them."""
    return {str(p.relative_to(root)): (hashlib.md5(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(root.rglob("*")) if p.is_file() and p.name not in (ownership.LOCK_NAME, "lock.mdb")}


def log_store(cfg, kind=None):
    """The member's log store, built as a member builds it (identity checked)."""
    return get_store_type(kind or cfg.store_type).make_log_store(cfg, FakeMemberState(), clock=None)


def term_store(cfg):
    return get_store_type(cfg.store_type).make_term_store(cfg)


def fill(cfg, n=5, term=3):
    """A member's store holding ``n`` entries of ``term`` and a term/vote record (term ``term``, voted n1)."""
    ts = term_store(cfg)
    ts.load()
    ts.save(term, "n1")
    store = log_store(cfg)
    store.member_state = FakeMemberState(curr_term=term)
    store.startup()
    for b in bodies(n):
        store.append_as_leader(Entry(body=b, term=term))
    fired(store.flush())
    fired(store.shutdown())
    ts.close()


def drop_term_record(cfg):
    """Lose the term/vote record the way an operator or a disk does."""
    if cfg.store_type == "mmap":
        for name in ("currterm", "currterm.bak"):
            (cfg.member_dir / name).unlink(missing_ok=True)
    else:
        from dledger.store.lmdbstore import SharedEnv
        shared = SharedEnv.acquire(cfg.member_dir / "lmdb")
        with shared.env.begin(write=True) as txn:
            txn.drop(shared.termvote, delete=False)
        shared.release()


# -- the pure rules -----------------------------------------------------------------------------------
@pytest.mark.parametrize("state, last, had_identity, expected", [
    (TermVote.OK, 7, True, Decision.USE),
    (TermVote.OK, None, False, Decision.USE),
    (TermVote.MISSING, None, False, Decision.FRESH),
    (TermVote.MISSING, 0, False, Decision.REFUSE),
    (TermVote.MISSING, 7, False, Decision.REFUSE),
    (TermVote.MISSING, ownership.UNKNOWN_TERM, False, Decision.REFUSE),
    (TermVote.MISSING, None, True, Decision.REFUSE),
    (TermVote.DAMAGED, None, False, Decision.REFUSE),
    (TermVote.DAMAGED, 7, True, Decision.REFUSE),
])
def test_term_vote_decision_table(state, last, had_identity, expected):
    """A missing record is believed only for a store nobody ran (no log, no identity); damage never."""
    assert ownership.term_vote_decision(state, last, had_identity) is expected


@pytest.mark.parametrize("last, known, expected", [
    (None, (), 0), (7, (), 8), (7, (9,), 10), (7, (3,), 8), (ownership.UNKNOWN_TERM, (), 0),
    (ownership.UNKNOWN_TERM, (4,), 5),
])
def test_minimum_term_table(last, known, expected):
    """A reset goes past the last log term and any term still readable."""
    assert ownership.minimum_term(last, known) == expected


@pytest.mark.parametrize("record, owner, expected", [
    (None, Owner("g0", "n0"), None),
    ({"group": "g0", "member": "n0"}, Owner("g0", "n0"), None),
    ({"group": "g3", "member": "n0"}, Owner("g0", "n0"), "belongs to member n0 of group g3, not member n0 of group g0"),
    ({"group": "g0", "member": "n0"}, Owner("g0", "n1"), "belongs to member n0 of group g0, not member n1 of group g0"),
])
def test_identity_mismatch_table(record, owner, expected):
    """A store of another group or member is named; no record (Java) is no mismatch."""
    assert ownership.identity_mismatch(record, owner) == expected


# -- item 3: term and vote never go back ----------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_lost_term_record_with_a_log_refuses_to_start_naming_reset_vote(tmp_path, kind):
    """A store holding entries of term 3 whose term/vote record is gone refuses, naming reset-vote --term 4."""
    cfg = config(tmp_path, kind)
    fill(cfg, term=3)
    drop_term_record(cfg)
    before = digests(tmp_path)
    with pytest.raises(TermVoteLostError) as err:
        DLedgerServer.build(cfg, clock=None)
    msg = str(err.value)
    assert "\n" not in msg and "is missing but the log holds entries up to term 3" in msg
    assert f"dledger store reset-vote {cfg.member_dir} --term 4" in msg
    assert digests(tmp_path) == before, "nothing is written on the way out"
    assert ownership.holder(cfg.member_dir) is None, "the lock is released after a refusal"


@pytest.mark.parametrize("garbage", [b"voteLeader=n1\ncurrTerm=x\n", b"", b"\xff\xfe", b"currTerm=-4\n"])
def test_damaged_currterm_refuses_to_start(tmp_path, garbage):
    """A garbage or empty currterm is refused with the problem and the repair, never read as term 0."""
    cfg = config(tmp_path)
    fill(cfg, term=2)
    (cfg.member_dir / "currterm").write_bytes(garbage)
    with pytest.raises(TermVoteLostError, match=r"currterm is damaged .*reset-vote .* --term 3"):
        term_store(cfg).load()


def test_lost_term_record_of_a_started_empty_store_is_refused(tmp_path):
    """A member that started on a store before (identity recorded) may have voted: an empty log is no excuse."""
    cfg = config(tmp_path)
    ts = term_store(cfg)
    assert ts.load() == (0, None)
    ts.save(6, "n2")
    ts.close()
    drop_term_record(cfg)
    with pytest.raises(TermVoteLostError, match="this member has started on this store before"):
        term_store(cfg).load()


@pytest.mark.parametrize("kind", KINDS)
def test_new_empty_store_starts_at_term_0_and_records_it(tmp_path, kind):
    """A brand-new store starts at term 0, no vote, with its term record and identity written at once."""
    cfg = config(tmp_path, kind)
    ts = term_store(cfg)
    assert ts.load() == (0, None)
    ts.close()
    assert ownership.read_identity(cfg.member_dir)["member"] == "n0"
    again = term_store(cfg)
    assert again.load() == (0, None), "a restart before any election still starts"
    again.close()


def test_java_store_without_identity_keeps_its_term_and_gets_an_identity(tmp_path):
    """A Java DLedger store (currterm, no identity) starts with its term and vote and gets a record."""
    shutil.copytree(GOLDEN / "store" / "n1", tmp_path / "n1")
    for p in (tmp_path / "n1").rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    cfg = config(tmp_path / "n1", group="default", self_id="n1")
    assert ownership.read_identity(cfg.member_dir) is None
    ts = term_store(cfg)
    assert ts.load() == (1, "n1")
    ts.close()
    record = ownership.read_identity(cfg.member_dir)
    assert (record["group"], record["member"]) == ("default", "n1")
    assert len(record["storeId"]) == 32 and record["createdAt"].endswith("+00:00")


# -- item 4: one process per store directory -------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_locked_store_is_refused_before_anything_is_touched(tmp_path, kind):
    """While another holder has the lock, opening fails with 'in use by pid N' and no file changes."""
    cfg = config(tmp_path, kind)
    fill(cfg)
    if kind == "mmap":  # a torn tail that recovery would cut and zero if it ran
        data = sorted((cfg.member_dir / "data").iterdir())[-1]
        raw = bytearray(data.read_bytes())
        raw[-200:-190] = b"\x07" * 10
        data.write_bytes(bytes(raw))
    before = digests(tmp_path)
    fd = ownership.lock_dir(cfg.member_dir)  # another open file description: as another process holds it
    try:
        for opener in (lambda: DLedgerServer.build(cfg, clock=None), lambda: log_store(cfg).startup()):
            with pytest.raises(StoreInUseError) as err:
                opener()
            assert str(err.value) == f"store dir {cfg.member_dir} is in use by pid {os.getpid()}"
        assert digests(tmp_path) == before
    finally:
        os.close(fd)


@pytest.mark.parametrize("kind", KINDS)
def test_lock_is_released_when_the_store_closes(tmp_path, kind):
    """Shutdown and abandon release the directory; while open it is held (and names this pid)."""
    cfg = config(tmp_path, kind)
    fill(cfg)
    store = log_store(cfg)
    store.startup()
    assert ownership.holder(cfg.member_dir) == str(os.getpid())
    fired(store.shutdown())
    assert ownership.holder(cfg.member_dir) is None
    store = log_store(cfg)
    store.startup()
    store.abandon()
    assert ownership.holder(cfg.member_dir) is None


def test_term_store_and_log_store_of_one_member_share_the_lock(tmp_path):
    """A member's two stores hold one lock; it goes when both closed."""
    cfg = config(tmp_path)
    ts = term_store(cfg)
    ts.load()
    store = log_store(cfg)
    store.startup()
    fired(store.shutdown())
    assert ownership.holder(cfg.member_dir) == str(os.getpid())
    ts.close()
    assert ownership.holder(cfg.member_dir) is None


def test_server_stop_releases_the_lock(tmp_path):
    """A stopped member (its term store closed too) leaves the directory free for the next process."""
    from dledger.testing.clock import SimClock
    from dledger.transport.inprocess import InProcessNetwork

    clock = SimClock()
    cfg = config(tmp_path)
    server = DLedgerServer.build(cfg, clock=clock, transport=InProcessNetwork(clock, seed=1).transport("n0"))
    fired(server.start())
    assert ownership.holder(cfg.member_dir) == str(os.getpid())
    fired(server.stop())
    assert ownership.holder(cfg.member_dir) is None


def test_store_dir_that_is_a_file_is_one_line(tmp_path):
    """A store dir that is a regular file is a StoreError saying so."""
    cfg = config(tmp_path)
    cfg.member_dir.write_text("oops")
    with pytest.raises(StoreError, match="exists but is not a directory"):
        term_store(cfg).load()


# -- item 5: identity ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("other", [{"group": "g3"}, {"self_id": "n1"}])
def test_store_of_another_group_or_member_is_refused(tmp_path, kind, other):
    """Starting as another group or member is refused naming the owner and --adopt-store; nothing changes."""
    fill(config(tmp_path, kind))
    member_dir = tmp_path / "dledger-n0"
    if "self_id" in other:  # a copy of n0's store used as n1's
        shutil.copytree(member_dir, tmp_path / "dledger-n1")
        member_dir = tmp_path / "dledger-n1"
    cfg = config(tmp_path, kind, **other)
    before = digests(tmp_path)
    for opener in (lambda: DLedgerServer.build(cfg, clock=None), lambda: log_store(cfg).startup()):
        with pytest.raises(StoreOwnerError) as err:
            opener()
        msg = str(err.value)
        assert "\n" not in msg
        assert f"store dir {member_dir} belongs to member n0 of group g0, not member {cfg.self_id} of group " \
               f"{cfg.group}" in msg and "--adopt-store" in msg
    assert digests(tmp_path) == before
    assert ownership.holder(member_dir) is None


@pytest.mark.parametrize("kind", KINDS)
def test_adopt_store_rewrites_the_identity(tmp_path, kind):
    """With adoptStore a foreign store is taken over: same store id, new owner, where it came from."""
    fill(config(tmp_path, kind))
    first = ownership.read_identity(tmp_path / "dledger-n0")
    cfg = config(tmp_path, kind, group="g3", adopt_store=True)
    server = DLedgerServer.build(cfg, clock=None)
    assert server.state.curr_term == 3
    server.state.term_store.close()
    record = json.loads((cfg.member_dir / "identity.json").read_text())
    assert (record["group"], record["member"], record["storeId"]) == ("g3", "n0", first["storeId"])
    assert record["adoptedFrom"] == "member n0 of group g0"
    plain = config(tmp_path, kind, group="g3")
    ts = term_store(plain)
    assert ts.load() == (3, "n1"), "once adopted, the store opens without the option"
    ts.close()


def test_damaged_identity_record_is_refused(tmp_path):
    """An identity record that is not JSON is a one-line StoreError, not a traceback or a silent rewrite."""
    cfg = config(tmp_path)
    fill(cfg)
    (cfg.member_dir / "identity.json").write_text("{not json")
    with pytest.raises(StoreError, match="identity.json: not an identity record"):
        term_store(cfg).load()


def test_stores_built_directly_take_the_lock_without_an_identity_check(tmp_path):
    """Tools and tests that build a store without an owner lock the directory but check no identity."""
    member = tmp_path / "dledger-x"
    store = MmapLogStore(member, FakeMemberState(), data_file_size=4096, index_file_size=512)
    store.startup()
    assert ownership.holder(member) == str(os.getpid())
    fired(store.shutdown())
    lstore = LmdbLogStore(tmp_path / "dledger-y" / "lmdb", FakeMemberState(), data_file_size=4096, map_size=1 << 20)
    lstore.startup()
    assert ownership.holder(tmp_path / "dledger-y") == str(os.getpid())
    fired(lstore.shutdown())
    assert not (member / "identity.json").exists()
    ts = LmdbTermVoteStore(tmp_path / "dledger-y" / "lmdb", 1 << 20)
    assert ts.load() == (0, None)
    ts.close()
