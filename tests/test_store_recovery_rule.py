"""What mmap recovery may cut on its own: a torn tail, never committed or verified entries (issue #9, item 6).

The rule is :func:`dledger.store.recovery.judge` (a table test below); the
rest checks it on real files: a data file zeroed, truncated or missing in
the first, a middle or the last position, with the damage below or above
the checkpoint's committed index.  Refusals are one line naming the file and
offset, change nothing on disk, and ``dledger store verify`` reports the
same line; ``truncate_damaged`` cuts there, logs at error level and clamps
the committed index it claims.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from twisted.logger import formatEvent, globalLogPublisher

from dledger.entry import Entry
from dledger.errors import DamagedStoreError
from dledger.store import offline
from dledger.store.mmapfile import MmapLogStore
from dledger.store.recovery import Damage, Verdict, judge
from dledger.testing.store_contract import FakeMemberState, fired

DATA, INDEX = 1024, 4096
N = 30  # 200-byte bodies: 4 entries per data file, 8 files


# -- the rule ------------------------------------------------------------------------------
def _damage(index, followed=False):
    return Damage(pos=2048, at="pos 2048 (file 00000000000000002048 offset 0)", what="zero header",
                  index=index, followed_by="entry 12 at pos 3072" if followed else None)


JUDGE_TABLE = [
    # damage index, verified entry after it, committed, truncate_damaged -> verdict
    ("no damage", None, False, 5, False, Verdict.CLEAN),
    ("torn tail above committed", 8, False, 5, False, Verdict.CUT_TAIL),
    ("tail just above committed", 6, False, 5, False, Verdict.CUT_TAIL),
    ("tail at the committed index", 5, False, 5, False, Verdict.REFUSE),
    ("damage below committed", 3, False, 5, False, Verdict.REFUSE),
    ("damage below committed, cut asked", 3, False, 5, True, Verdict.CUT_FORCED),
    ("above committed but verified entries follow", 8, True, 5, False, Verdict.REFUSE),
    ("verified entries follow, cut asked", 8, True, 5, True, Verdict.CUT_FORCED),
    ("nothing committed, nothing after", 0, False, -1, False, Verdict.CUT_TAIL),
    ("unknown index, nothing committed", "?", False, -1, False, Verdict.CUT_TAIL),
    ("unknown index, something committed", "?", False, 0, False, Verdict.REFUSE),
    ("unknown index, verified entries follow", "?", True, -1, False, Verdict.REFUSE),
    ("tail above committed, cut asked: still a plain tail cut", 8, False, 5, True, Verdict.CUT_TAIL),
]


@pytest.mark.parametrize("name,index,followed,committed,forced,verdict", JUDGE_TABLE, ids=[r[0] for r in JUDGE_TABLE])
def test_judge_table(name, index, followed, committed, forced, verdict):
    """judge(): cut only a tail above the committed index on its own; otherwise refuse unless asked."""
    damage = None if index is None else _damage(None if index == "?" else index, followed)
    assert judge(damage, committed, forced) is verdict


# -- the files -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """A log of N entries over 8 data files, all committed and cleanly closed; returns (dir, entries)."""
    root = tmp_path_factory.mktemp("pristine") / "dledger-n0"
    state = FakeMemberState()
    store = MmapLogStore(root, state, data_file_size=DATA, index_file_size=INDEX)
    store.startup()
    entries = [store.append_as_leader(Entry(body=bytes([i]) * 200, term=state.curr_term)) for i in range(N)]
    store.update_committed_index(state.curr_term, N - 1)
    fired(store.flush())
    fired(store.shutdown())
    files = sorted((root / "data").iterdir())
    assert len(files) == 8
    return root, entries


def open_store(member_dir: Path, **kwargs) -> MmapLogStore:
    store = MmapLogStore(member_dir, FakeMemberState(), data_file_size=DATA, index_file_size=INDEX, **kwargs)
    store.startup()
    return store


def data_snapshot(member_dir: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((member_dir / "data").iterdir())}


POSITIONS = {"first": 0, "middle": 3, "last": 7}
KINDS = ["zeroed", "truncated", "missing"]


def damage(member_dir: Path, kind: str, k: int) -> Path:
    path = sorted((member_dir / "data").iterdir())[k]
    if kind == "zeroed":
        path.write_bytes(bytes(DATA))
    elif kind == "truncated":
        path.write_bytes(path.read_bytes()[:DATA // 2 - 100])
    else:
        path.unlink()
    return path


def first_in_file(entries, k: int) -> int:
    return min(e.index for e in entries if e.pos // DATA == k)


def last_before_file(entries, k: int) -> int:
    return max([-1] + [e.index for e in entries if e.pos // DATA < k])


def expected(kind: str, where: str, committed: str) -> str:
    """What start-up must do: "refuse", "cut" (a tail, on its own) or "open" (nothing to cut)."""
    if kind == "missing" and where == "first":
        return "open"  # indistinguishable from retention, which deletes the oldest files: nothing is cut
    if where != "last" or committed == "below":
        return "refuse"  # verified files follow, or committed entries are gone
    return "cut" if kind == "truncated" else "open"


CASES = [(k, w, c) for k in KINDS for w in POSITIONS for c in ("below", "above")]


@pytest.mark.parametrize("kind,where,committed", CASES, ids=["-".join(c) for c in CASES])
def test_damaged_data_file(pristine, tmp_path, kind, where, committed):
    """A zeroed, truncated or missing data file in any position: refused (one line, nothing changed) unless a tail."""
    root, entries = pristine
    member_dir = tmp_path / "dledger-n0"
    shutil.copytree(root, member_dir)
    k = POSITIONS[where]
    ck = N - 1 if committed == "below" else last_before_file(entries, k)
    (member_dir / "checkpoint").write_bytes(f"committedIndex={ck}\nendIndex={N - 1}\n".encode())
    victim = damage(member_dir, kind, k)
    before = data_snapshot(member_dir)
    outcome = expected(kind, where, committed)
    if outcome == "refuse":
        with pytest.raises(DamagedStoreError) as info:
            open_store(member_dir)
        line = str(info.value)
        assert "\n" not in line and victim.name in line and "offset" in line, line
        if kind == "truncated":
            assert f"is truncated: {DATA // 2 - 100} of {DATA} bytes" in line
        assert data_snapshot(member_dir) == before
        report = offline.verify_mmap(member_dir)
        assert not report.ok and report.problems[0] == line
        return
    store = open_store(member_dir)
    try:
        if kind == "missing" and where == "first":
            assert store.ledger_begin_index == first_in_file(entries, 1)
        else:
            assert store.ledger_begin_index == 0
        end = store.ledger_end_index
        if outcome == "cut":
            assert store.recovered.cut and not store.recovered.forced
            assert end == max(e.index for e in entries if e.pos + e.size <= k * DATA + DATA // 2 - 100)
        else:
            assert end == last_before_file(entries, k) if where == "last" else end == N - 1
        assert end >= ck
        for i in range(store.ledger_begin_index, end + 1):
            assert store.get(i) == entries[i]
        assert all(p.stat().st_size == DATA for p in (member_dir / "data").iterdir())
    finally:
        fired(store.shutdown())


@pytest.mark.parametrize("where", ["first", "middle"])
def test_truncate_damaged_cuts_at_the_damage_and_clamps_committed(pristine, tmp_path, where):
    """--truncate-damaged: cut at the first damage, log it at error level, never claim a commit it lost."""
    root, entries = pristine
    member_dir = tmp_path / "dledger-n0"
    shutil.copytree(root, member_dir)
    k = POSITIONS[where]
    damage(member_dir, "zeroed", k)
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        store = open_store(member_dir, truncate_damaged=True)
    finally:
        globalLogPublisher.removeObserver(events.append)
    end = last_before_file(entries, k)
    assert store.ledger_end_index == end and store.committed_index == end
    assert store.recovered.forced
    lines = [e for e in events if "mmap store" in formatEvent(e)]
    assert len(lines) == 1 and lines[0]["log_level"].name == "error", [formatEvent(e) for e in lines]
    assert "--truncate-damaged" in formatEvent(lines[0])
    # The checkpoint is clamped at once: a crash now must not leave a claim the log cannot back.
    assert (member_dir / "checkpoint").read_text() == f"committedIndex={end}\nendIndex={end}\n"
    store.abandon()
    again = open_store(member_dir)
    assert again.ledger_end_index == end and not again.recovered.cut
    fired(again.shutdown())


def test_zeroed_first_file_keeps_the_committed_entries_after_it(pristine, tmp_path):
    """The reported case: the first data file zeroed no longer makes recovery remove the intact later files."""
    root, _entries = pristine
    member_dir = tmp_path / "dledger-n0"
    shutil.copytree(root, member_dir)
    (member_dir / "checkpoint").unlink()
    (member_dir / "checkpoint.bak").unlink(missing_ok=True)  # not even a checkpoint: the later files prove it
    damage(member_dir, "zeroed", 0)
    before = data_snapshot(member_dir)
    with pytest.raises(DamagedStoreError, match="holds nothing but .* holds data.*entry 4 at pos 1024"):
        open_store(member_dir)
    assert data_snapshot(member_dir) == before and len(before) == 8


def test_reset_leaves_no_stale_committed_claim(pristine, tmp_path):
    """A follower reset rewrites the checkpoint first, so a crash before the new entry is durable is no refusal."""
    root, _entries = pristine
    member_dir = tmp_path / "dledger-n0"
    shutil.copytree(root, member_dir)
    state = FakeMemberState()
    state.follow(1)
    store = MmapLogStore(member_dir, state, data_file_size=DATA, index_file_size=INDEX)
    store.startup()
    entry = Entry(body=b"restart", index=500, term=1, pos=40 * DATA + 100).sealed()
    store.truncate(entry, 1, "n1")
    assert (member_dir / "checkpoint").read_text() == "committedIndex=-1\nendIndex=-1\n"
    store.abandon()
    (member_dir / "data" / f"{40 * DATA:020d}").write_bytes(bytes(DATA))  # the entry never reached the disk
    again = open_store(member_dir)
    assert again.ledger_end_index == -1
    fired(again.shutdown())


# -- the operator's switch ------------------------------------------------------------------------
def test_truncate_damaged_option_and_config(tmp_path):
    """--truncate-damaged and truncateDamaged = true reach the config and the mmap store (off by default)."""
    from dledger import tap
    from dledger.config import make_config

    peers = "n0-127.0.0.1:20911"
    options = tap.Options()
    options.parseOptions(["--id", "n0", "--peers", peers, "--truncate-damaged"])
    assert options.config.truncate_damaged is True
    options = tap.Options()
    options.parseOptions(["--id", "n0", "--peers", peers])
    assert options.config.truncate_damaged is False
    f = tmp_path / "m.toml"
    f.write_text(f'selfId = "n0"\npeers = "{peers}"\ntruncateDamaged = true\nstoreBaseDir = "{tmp_path}"\n')
    config = make_config(file=str(f))
    assert config.truncate_damaged is True
    assert MmapLogStore.from_config(config, FakeMemberState(), clock=None).options.truncate_damaged is True


# -- a member that cut its log re-fetches it from the leader -------------------------------------------
def test_member_cut_by_truncate_damaged_refetches_from_the_leader(tmp_path):
    """After a forced cut a follower's shorter log is refilled by the leader's COMPARE/TRUNCATE path."""
    from dledger.testing.cluster import Cluster

    clock_box = [None]
    forced = set()

    def factory(mid, config, state):
        return MmapLogStore(tmp_path / f"dledger-{mid}", state, data_file_size=DATA, index_file_size=INDEX,
                            clock=clock_box[0], disk_usage=lambda: 0.1, truncate_damaged=mid in forced)

    cluster = Cluster(3, seed=5, store_factory=factory)
    clock_box[0] = cluster.clock
    cluster.start()
    leader = cluster.wait_for_leader()
    client = cluster.client()
    results = [client.append(bytes([i]) * 200) for i in range(40)]
    assert cluster.run_until(lambda: all(d.called for d in results), timeout=120)
    cluster.run(3)
    victim = next(m for m in cluster.ids if m != leader)
    end = cluster.servers[leader].store.ledger_end_index
    assert cluster.servers[victim].store.ledger_end_index == end
    cluster.crash(victim)
    data = sorted((tmp_path / f"dledger-{victim}" / "data").iterdir())
    data[2].write_bytes(bytes(DATA))  # committed entries after it survive in later files
    with pytest.raises(DamagedStoreError):
        open_store(tmp_path / f"dledger-{victim}")
    forced.add(victim)
    cluster.restart(victim)
    store = cluster.servers[victim].store
    assert store.recovered.forced and store.ledger_end_index < end and store.committed_index <= store.ledger_end_index
    more = [client.append(b"after-cut") for _ in range(3)]
    assert cluster.run_until(lambda: all(d.called for d in more), timeout=60)
    lead = cluster.servers[cluster.leader()].store
    assert cluster.run_until(lambda: store.ledger_end_index == lead.ledger_end_index, timeout=60)
    assert [store.get(i) for i in range(end + 1)] == [lead.get(i) for i in range(end + 1)]
    cluster.stop()
    cluster.run(1)


# -- the same rule on LMDB ---------------------------------------------------------------------------
def test_lmdb_refuses_to_start_below_its_committed_index(tmp_path):
    """LMDB never cuts, but a last key below the recorded committed index is refused too (unless asked)."""
    pytest.importorskip("lmdb")
    from dledger.store.lmdbstore import LmdbLogStore, key

    def open_lmdb(**kw):
        store = LmdbLogStore(tmp_path / "lmdb", state, data_file_size=1024, max_entry_size=1016,
                             map_size=1 << 20, **kw)
        store.startup()
        return store

    state = FakeMemberState()
    store = open_lmdb()
    for i in range(5):
        store.append_as_leader(Entry(body=bytes([i]) * 10, term=state.curr_term))
    store.update_committed_index(state.curr_term, 4)
    fired(store.flush())
    with store._shared.env.begin(write=True) as txn:  # damage: the last two entries vanish
        txn.delete(key(3), db=store._shared.entries)
        txn.delete(key(4), db=store._shared.entries)
    fired(store.shutdown())
    with pytest.raises(DamagedStoreError, match="last entry is 2 but the metadata says entries up to 4"):
        open_lmdb()
    again = open_lmdb(truncate_damaged=True)
    assert (again.ledger_end_index, again.committed_index) == (2, 2)
    fired(again.shutdown())


def test_index_record_contradicting_an_entry_is_not_a_reason_to_drop_the_entries_after_it(pristine, tmp_path):
    """An index record whose term contradicts its entry's header stops the walk; the verified rest is kept (refused)."""
    root, entries = pristine
    member_dir = tmp_path / "dledger-n0"
    shutil.copytree(root, member_dir)
    (member_dir / "checkpoint").unlink()  # a full walk, which compares every record with its entry
    (member_dir / "checkpoint.bak").unlink(missing_ok=True)
    with open(member_dir / "index" / f"{0:020d}", "r+b") as fh:
        fh.seek(10 * 32 + 24)
        fh.write((entries[10].term + 7).to_bytes(8, "big"))
    before = data_snapshot(member_dir)
    with pytest.raises(DamagedStoreError, match=r"entry 10 .* its index record says term .*entry 11 at"):
        open_store(member_dir)
    assert data_snapshot(member_dir) == before
    store = open_store(member_dir, truncate_damaged=True)
    assert store.ledger_end_index == 9
    fired(store.shutdown())


def test_truncate_damaged_cuts_at_damage_before_the_checkpoint(pristine, tmp_path):
    """With --truncate-damaged the cut is at the first damage, also one the checkpoint anchor would skip."""
    root, entries = pristine
    member_dir = tmp_path / "dledger-n0"
    shutil.copytree(root, member_dir)
    victim = entries[9]
    path = member_dir / "data" / f"{victim.pos - victim.pos % DATA:020d}"
    raw = bytearray(path.read_bytes())
    raw[victim.pos % DATA + 60] ^= 0x01  # a body byte: bad media, before the checkpoint's end
    path.write_bytes(bytes(raw))
    store = open_store(member_dir)  # the default start trusts what the checkpoint says was durable
    assert store.ledger_end_index == N - 1
    store.abandon()
    assert "entry 9 at" in offline.verify_mmap(member_dir).problems[0]
    store = open_store(member_dir, truncate_damaged=True)
    assert store.ledger_end_index == 8 and store.committed_index == 8
    fired(store.shutdown())
