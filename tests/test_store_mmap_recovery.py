"""Crash recovery of the mmap store: torn tails, holes, bit flips, damaged index files and checkpoints.

Every case starts from a copy of one log written by the store (a few hundred
entries over many small files), damages the copy the way a crash or a bad
disk would, reopens it and checks the three promises: the store serves a
valid prefix of the original log, never a damaged or partial entry, and
loses no entry whose bytes were untouched before the damage.  The expected
end is computed from the original layout: the entry before the first entry
(or blank marker on the way to it) with a changed byte.  Where that prefix is
not the whole story -- damage at or below the checkpoint's committed index,
or untouched entries after the damage -- the default start must refuse
(DamagedStoreError, nothing changed on disk) and only ``truncate_damaged``
cuts there.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

from dledger.codes import ResponseCode
from dledger.entry import Entry
from dledger.errors import DamagedStoreError, DLedgerError
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.store_contract import FakeMemberState, fired

DATA, INDEX = 2048, 512  # ~22 data files and ~19 index files for 300 entries
N = 300


@dataclass
class Original:
    """The pristine log: its entries and the bytes of every file."""

    root: Path
    entries: list[Entry]
    data: dict[int, bytes]  # data file start -> bytes

    @property
    def end(self) -> int:
        return len(self.entries) - 1

    def end_of(self, i: int) -> int:
        return self.entries[i].pos + self.entries[i].size

    def last_before(self, pos: int) -> int:
        """Index of the last entry lying wholly before ``pos`` (-1 if none)."""
        last = -1
        for e in self.entries:
            if e.pos + e.size <= pos:
                last = e.index
        return last


def open_store(member_dir: Path, **kwargs) -> MmapLogStore:
    kwargs.setdefault("data_file_size", DATA)
    kwargs.setdefault("index_file_size", INDEX)
    store = MmapLogStore(member_dir, FakeMemberState(), **kwargs)
    store.startup()
    return store


def write_log(member_dir: Path, n: int = N, seed: int = 7) -> list[Entry]:
    rng = random.Random(seed)
    state = FakeMemberState()
    store = MmapLogStore(member_dir, state, data_file_size=DATA, index_file_size=INDEX)
    store.startup()
    entries = []
    for i in range(n):
        if i and i % 70 == 0:
            state.lead(state.curr_term + 1)
        size = rng.choice([0, 1, 9, 40, 100, 200, 333, rng.randrange(0, 600)])
        entries.append(store.append_as_leader(Entry(body=rng.randbytes(size), term=state.curr_term)))
    store.update_committed_index(state.curr_term, n - 1)
    fired(store.flush())
    fired(store.shutdown())
    return entries


@pytest.fixture(scope="module")
def original(tmp_path_factory) -> Original:
    root = tmp_path_factory.mktemp("original") / "dledger-n0"
    entries = write_log(root)
    data = {int(p.name): p.read_bytes() for p in (root / "data").iterdir()}
    assert len(data) > 15 and len(list((root / "index").iterdir())) > 10
    return Original(root, entries, data)


@pytest.fixture
def copy(tmp_path, original):
    def make() -> Path:
        dst = tmp_path / f"case{len(list(tmp_path.iterdir()))}" / "dledger-n0"
        shutil.copytree(original.root, dst)
        return dst
    return make


# -- damage --------------------------------------------------------------------------
def data_file(member_dir: Path, start: int) -> Path:
    return member_dir / "data" / f"{start:020d}"


def patch_data(member_dir: Path, pos: int, new: bytes) -> None:
    """Overwrite bytes at absolute data position ``pos`` (may span files)."""
    while new:
        start = pos - pos % DATA
        path = data_file(member_dir, start)
        n = min(len(new), start + DATA - pos)
        if path.exists():
            with open(path, "r+b") as fh:
                fh.seek(pos - start)
                fh.write(new[:n])
        pos, new = pos + n, new[n:]


def set_checkpoint(member_dir: Path, kind: str, original: Original, flushed: int) -> None:
    ck = member_dir / "checkpoint"
    if kind == "missing":
        ck.unlink()
        (member_dir / "checkpoint.bak").unlink(missing_ok=True)
        return
    end = {"newer": original.end, "exact": flushed, "older": flushed // 2}[kind]
    committed = min(end, flushed)  # our checkpoints never claim a commit past the flushed end
    ck.write_bytes(f"committedIndex={committed}\nendIndex={end}\n".encode())


def expected_end(original: Original, member_dir: Path) -> int:
    """The last entry reachable from the start over unchanged bytes (entries and the blank markers between them)."""
    now = {}
    for start in original.data:
        p = data_file(member_dir, start)
        now[start] = p.read_bytes() if p.exists() else None

    def changed(a: int, b: int) -> bool:
        while a < b:
            start = a - a % DATA
            n = min(b, start + DATA) - a
            cur = now.get(start)
            if cur is None or cur[a - start:a - start + n] != original.data[start][a - start:a - start + n]:
                return True
            a += n
        return False

    for k, e in enumerate(original.entries):
        if k:
            prev_end = original.end_of(k - 1)
            if prev_end != e.pos and changed(prev_end, prev_end + 8):
                return k - 1
        if changed(e.pos, e.pos + e.size):
            return k - 1
    return original.end


def verified_after(original: Original, member_dir: Path, expected: int) -> bool:
    """Whether an untouched entry follows the damage (then the damage is no tail and recovery must refuse)."""
    now = {s: (p.read_bytes() if (p := data_file(member_dir, s)).exists() else None) for s in original.data}
    for e in original.entries[expected + 1:]:
        start = e.pos - e.pos % DATA
        cur = now[start]
        if cur is not None and cur[e.pos - start:e.pos - start + e.size] == \
                original.data[start][e.pos - start:e.pos - start + e.size]:
            return True
    return False


def snapshot(member_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(member_dir)): p.read_bytes() for p in sorted(member_dir.rglob("*")) if p.is_file()}


def open_judged(member_dir: Path, refuse: bool, **kwargs) -> MmapLogStore:
    """Open the store; where ``refuse`` the default start must raise DamagedStoreError and change no data
    file, and then the operator's ``truncate_damaged`` cut is used."""
    if not refuse:
        return open_store(member_dir, **kwargs)
    before = {k: v for k, v in snapshot(member_dir).items() if k.startswith("data")}
    with pytest.raises(DamagedStoreError):
        open_store(member_dir, **kwargs)
    assert {k: v for k, v in snapshot(member_dir).items() if k.startswith("data")} == before
    return open_store(member_dir, truncate_damaged=True, **kwargs)


def committed_in(member_dir: Path) -> int:
    ck = member_dir / "checkpoint"
    if not ck.exists():
        return -1
    return int(dict(line.split("=") for line in ck.read_text().split())["committedIndex"])


def check_prefix(store: MmapLogStore, original: Original, expected: int | None = None) -> None:
    """The store serves exactly entries[0..end] of the original, and nothing after."""
    end = store.ledger_end_index
    if expected is not None:
        assert end == expected, store.recovered.summary()
    assert store.ledger_begin_index == (0 if end >= 0 else -1)
    assert store.committed_index <= end
    for i in range(end + 1):
        assert store.get(i) == original.entries[i], f"entry {i}"
    if end >= 0:
        assert store.ledger_end_term == original.entries[end].term
    with pytest.raises(DLedgerError):
        store.get(end + 1)


def check_clean_tail(store: MmapLogStore, member_dir: Path) -> None:
    """After recovery nothing follows the log: zeros to the end of the last data file, no later file, no stale index."""
    end = store.ledger_end_index
    files = sorted((member_dir / "data").iterdir())
    if end < 0:
        assert files == []
        return
    last = store.get(end)
    wp = last.pos + last.size
    assert int(files[-1].name) == wp - wp % DATA
    assert files[-1].read_bytes()[wp % DATA:].count(0) == DATA - wp % DATA
    idx = sorted((member_dir / "index").iterdir())
    off = (end + 1) * 32
    assert int(idx[-1].name) <= off
    tail = idx[-1].read_bytes()[off - int(idx[-1].name):]
    assert tail.count(0) == len(tail)


def append_and_reopen(store: MmapLogStore, member_dir: Path, original: Original) -> None:
    """After recovery the log grows at the right place and a reopen neither loses nor resurrects anything."""
    end = store.ledger_end_index
    e = store.append_as_leader(Entry(body=b"after-recovery", term=original.entries[-1].term))
    expected_pos = 0 if end < 0 else original.end_of(end)
    if expected_pos % DATA + e.size + 8 > DATA:
        expected_pos += DATA - expected_pos % DATA
    assert (e.index, e.pos) == (end + 1, expected_pos)
    fired(store.flush())
    fired(store.shutdown())
    again = open_store(member_dir)
    assert again.ledger_end_index == end + 1 and again.get(end + 1) == e
    assert not again.recovered.cut and not again.recovered.changed, again.recovered.summary()
    fired(again.shutdown())


# -- cuts ----------------------------------------------------------------------------
def cut_positions(original: Original, count: int) -> list[int]:
    """Positions in headers, bodies, blank markers, file starts and ends, spread over the whole log."""
    spots = set()
    for e in original.entries:
        spots.update({e.pos, e.pos + 1, e.pos + 4, e.pos + 8, e.pos + 47, e.pos + 48, e.pos + e.size - 1,
                      e.pos + e.size, e.pos + e.size // 2})
    for start in original.data:
        spots.update({start, start + DATA - 8, start + DATA - 4, start + DATA - 1})
    ordered = sorted(p for p in spots if 0 <= p < original.end_of(original.end))
    step = max(1, len(ordered) // count)
    return ordered[::step][:count]


CUT_KINDS = ["truncate", "zero_later", "hole"]
CK_KINDS = ["newer", "exact", "missing", "older"]


def damage_cut(member_dir: Path, original: Original, pos: int, kind: str) -> None:
    """A crash at ``pos``: the rest of that file is zeros, later files gone or zero; or a one-page hole."""
    start = pos - pos % DATA
    if kind == "hole":
        patch_data(member_dir, pos, bytes(min(256, start + DATA - pos)))
        return
    patch_data(member_dir, pos, bytes(start + DATA - pos))
    for s in original.data:
        if s > start:
            if kind == "truncate":
                data_file(member_dir, s).unlink()
            else:
                data_file(member_dir, s).write_bytes(bytes(DATA))


def run_cuts(original: Original, copy, positions: list[int]) -> int:
    cases = 0
    for n, pos in enumerate(positions):
        kind = CUT_KINDS[n % len(CUT_KINDS)]
        ck = CK_KINDS[(n // len(CUT_KINDS)) % len(CK_KINDS)]
        if kind == "hole" and ck == "newer":
            ck = "exact"  # a hole before a durable checkpoint end is not a crash (see test_hole_before_checkpoint)
        member_dir = copy()
        damage_cut(member_dir, original, pos, kind)
        set_checkpoint(member_dir, ck, original, original.last_before(pos))
        if n % 5 == 4:
            shutil.rmtree(member_dir / "index")
        expected = expected_end(original, member_dir)
        assert expected >= original.last_before(pos)
        refuse = verified_after(original, member_dir, expected) or expected < committed_in(member_dir)
        store = open_judged(member_dir, refuse)
        check_prefix(store, original, expected)
        check_clean_tail(store, member_dir)
        if n % 10 == 0:
            append_and_reopen(store, member_dir, original)
        else:
            fired(store.shutdown())
        cases += 1
    return cases


def test_cut_data_at_200_positions(original, copy):
    """Torn at >= 200 byte positions (headers, bodies, markers, file edges): exactly the untouched prefix survives."""
    assert run_cuts(original, copy, cut_positions(original, 210)) >= 200


@pytest.mark.slow
def test_cut_data_at_every_interesting_position(original, copy):
    """The same at up to DLEDGER_SOAK_SEEDS (default 600; ~2700 is all) header, body and file-edge positions."""
    run_cuts(original, copy, cut_positions(original, int(os.environ.get("DLEDGER_SOAK_SEEDS", "600"))))


def test_stale_entries_after_a_hole_are_not_resurrected(original, copy):
    """Entries after a zeroed header are wiped, so a later entry of the same size cannot stitch them back."""
    member_dir = copy()
    victim = original.entries[150]
    patch_data(member_dir, victim.pos, bytes(48))
    set_checkpoint(member_dir, "exact", original, 149)
    store = open_judged(member_dir, refuse=True)
    check_prefix(store, original, 149)
    assert store.recovered.cut
    replacement = store.append_as_leader(Entry(body=bytes(len(victim.body)), term=victim.term))
    assert (replacement.pos, replacement.size) == (victim.pos, victim.size)
    fired(store.flush())
    store.abandon()  # crash: no shutdown, no checkpoint
    again = open_store(member_dir)
    assert again.ledger_end_index == 150 and again.get(150) == replacement
    fired(again.shutdown())


def test_hole_before_checkpoint_is_never_served(original, copy):
    """A damaged entry before the checkpoint's end (not a crash: bad media) is never served; full_verify cuts there."""
    victim = original.entries[120]
    member_dir = copy()
    patch_data(member_dir, victim.pos + 60, b"\xff")
    store = open_store(member_dir)
    assert store.ledger_end_index == original.end
    for i in range(original.end + 1):
        if i == 120:
            with pytest.raises(DLedgerError) as info:
                store.get(i)
            assert info.value.code == ResponseCode.DISK_ERROR
        else:
            assert store.get(i) == original.entries[i]
    fired(store.shutdown())
    store = open_judged(member_dir, refuse=True, full_verify=True)
    check_prefix(store, original, 119)
    fired(store.shutdown())


# -- bit flips -------------------------------------------------------------------------
def flip(member_dir: Path, pos: int, bit: int) -> None:
    path = data_file(member_dir, pos - pos % DATA)
    with open(path, "r+b") as fh:
        fh.seek(pos % DATA)
        b = fh.read(1)[0]
        fh.seek(pos % DATA)
        fh.write(bytes([b ^ (1 << bit)]))


def test_bit_flips_after_the_flushed_point(original, copy):
    """200 seeded runs: 1-3 bits flipped after the last flushed entry: flushed entries survive, nothing bad served."""
    total = max(original.data) + DATA
    for seed in range(200):
        rng = random.Random(seed)
        flushed = rng.randrange(-1, original.end + 1)
        lo = original.end_of(flushed) if flushed >= 0 else 0
        member_dir = copy()
        for _ in range(rng.randint(1, 3)):
            flip(member_dir, rng.randrange(lo, total), rng.randrange(8))
        set_checkpoint(member_dir, "exact", original, flushed)
        expected = expected_end(original, member_dir)
        assert expected >= flushed
        store = open_judged(member_dir, verified_after(original, member_dir, expected))
        check_prefix(store, original, expected)
        fired(store.shutdown())


def test_bit_rot_anywhere_with_full_verify(original, copy):
    """100 seeded runs: bits flipped anywhere; a full verification serves exactly the prefix before the damage."""
    total = max(original.data) + DATA
    for seed in range(100):
        rng = random.Random(1000 + seed)
        member_dir = copy()
        for _ in range(rng.randint(1, 2)):
            flip(member_dir, rng.randrange(0, total), rng.randrange(8))
        expected = expected_end(original, member_dir)
        store = open_judged(member_dir, expected < original.end, full_verify=True)
        check_prefix(store, original, expected)
        fired(store.shutdown())


def test_bit_rot_anywhere_is_never_served(original, copy):
    """100 seeded runs: bits flipped anywhere, default recovery: every read is the original entry or DISK_ERROR."""
    total = max(original.data) + DATA
    for seed in range(100):
        rng = random.Random(2000 + seed)
        member_dir = copy()
        flipped = [rng.randrange(0, total) for _ in range(rng.randint(1, 2))]
        for pos in flipped:
            flip(member_dir, pos, rng.randrange(8))
        damaged = {e.index for e in original.entries for p in flipped if e.pos <= p < e.pos + e.size}
        try:
            store = open_store(member_dir)
        except DamagedStoreError:  # the flip is after the checkpoint's anchor, below its committed index
            store = open_store(member_dir, truncate_damaged=True)
        assert store.ledger_end_index >= min([original.end, *(d - 1 for d in damaged)])
        for i in range(store.ledger_end_index + 1):
            try:
                assert store.get(i) == original.entries[i]
            except DLedgerError as exc:
                assert exc.code == ResponseCode.DISK_ERROR and i in damaged, (i, exc)
        fired(store.shutdown())


def test_bit_flips_in_index_files(original, copy):
    """100 seeded runs: bits flipped in index records are rebuilt or refused, never turned into a wrong entry."""
    index_files = sorted((original.root / "index").iterdir())
    for seed in range(100):
        rng = random.Random(3000 + seed)
        member_dir = copy()
        touched = []
        for _ in range(rng.randint(1, 3)):
            path = member_dir / "index" / rng.choice(index_files).name
            raw = bytearray(path.read_bytes())
            off = rng.randrange(len(raw))
            raw[off] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(raw))
            touched.append((int(path.name) + off) // 32)
        try:
            store = open_store(member_dir)
        except DamagedStoreError as exc:  # a record contradicting its entry's header: which one is right?
            assert "its index record says" in str(exc)
            store = open_store(member_dir, truncate_damaged=True)
        assert store.ledger_end_index >= min([original.end, *(t - 1 for t in touched)])
        for i in range(store.ledger_end_index + 1):
            try:
                assert store.get(i) == original.entries[i]
            except DLedgerError as exc:
                assert exc.code == ResponseCode.DISK_ERROR and i in touched, (i, exc)
        fired(store.shutdown())


# -- index and checkpoint damage ---------------------------------------------------------
INDEX_DAMAGE = ["delete_all", "delete_first", "delete_middle", "delete_last", "zero_file", "garbage_file",
                "wrong_size", "extra_file_beyond", "stale_records_beyond"]


@pytest.mark.parametrize("damage", INDEX_DAMAGE)
def test_damaged_index_is_rebuilt(original, copy, damage):
    """Deleted, zeroed, garbage, wrong-sized or stale index files are rebuilt from the data; nothing is lost."""
    member_dir = copy()
    idx = sorted((member_dir / "index").iterdir())
    middle = idx[len(idx) // 2]
    if damage == "delete_all":
        shutil.rmtree(member_dir / "index")
    elif damage == "delete_first":
        idx[0].unlink()
    elif damage == "delete_middle":
        middle.unlink()
    elif damage == "delete_last":
        idx[-1].unlink()
    elif damage == "zero_file":
        middle.write_bytes(bytes(INDEX))
    elif damage == "garbage_file":
        middle.write_bytes(random.Random(5).randbytes(INDEX))
    elif damage == "wrong_size":
        middle.write_bytes(middle.read_bytes()[:100])
    elif damage == "extra_file_beyond":
        (member_dir / "index" / f"{int(idx[-1].name) + 3 * INDEX:020d}").write_bytes(bytes(INDEX))
    else:
        with open(idx[-1], "r+b") as fh:
            fh.seek((original.end + 1) * 32 - int(idx[-1].name))
            fh.write(bytes([0, 0, 0, 1]) + bytes(28))
    store = open_store(member_dir)
    check_prefix(store, original, original.end)
    assert store.recovered.changed, store.recovered.summary()
    fired(store.shutdown())
    again = open_store(member_dir)
    assert not again.recovered.changed, again.recovered.summary()
    fired(again.shutdown())


def test_index_damaged_after_start_is_repaired_on_read(original, copy):
    """An index record damaged while the store runs is rewritten from the data when that entry is read."""
    member_dir = copy()
    store = open_store(member_dir)
    f = store._index.file_for(37 * 32)
    f.mm[37 * 32 - f.start:38 * 32 - f.start] = bytes(32)
    assert store.get(37) == original.entries[37]
    assert store.get(38) == original.entries[38]
    fired(store.shutdown())


@pytest.mark.parametrize("kind", ["missing", "garbage_with_backup", "garbage_both", "newer", "older", "negative"])
def test_checkpoint_damage_costs_time_not_data(original, copy, kind):
    """A missing, unreadable, newer or older checkpoint never loses entries nor claims commits past the end."""
    member_dir = copy()
    ck, bak = member_dir / "checkpoint", member_dir / "checkpoint.bak"
    if kind == "missing":
        ck.unlink()
        bak.unlink(missing_ok=True)
    elif kind == "garbage_with_backup":
        ck.write_bytes(b"\x00\xffnot a checkpoint")
        bak.write_bytes(b"committedIndex=100\nendIndex=100\n")
    elif kind == "garbage_both":
        ck.write_bytes(b"endIndex=abc\n")
        bak.write_bytes(b"committedIndex=1\n")
    elif kind == "newer":
        ck.write_bytes(b"committedIndex=5000\nendIndex=5000\n")
    elif kind == "older":
        ck.write_bytes(b"committedIndex=3\nendIndex=10\n")
    else:
        ck.write_bytes(b"committedIndex=-5\nendIndex=-7\n")
    store = open_judged(member_dir, refuse=kind == "newer")  # claims 5000 committed: entries are missing
    check_prefix(store, original, original.end)
    expected_committed = {"missing": -1, "garbage_with_backup": 100, "garbage_both": -1, "newer": original.end,
                          "older": 3, "negative": -1}[kind]
    assert store.committed_index == expected_committed
    fired(store.shutdown())


def test_recovery_starts_at_the_checkpoint(tmp_path):
    """A cleanly closed large log is verified from the checkpoint's end, not from the first entry."""
    member_dir = tmp_path / "dledger-n0"
    entries = write_log(member_dir, n=2000)
    store = open_store(member_dir)
    rec = store.recovered
    assert not rec.full_scan and rec.anchor == 1999 and rec.verified == 1
    assert store.get(1234) == entries[1234]
    fired(store.shutdown())
    (member_dir / "checkpoint").unlink()
    (member_dir / "checkpoint.bak").unlink()
    store = open_store(member_dir)
    assert store.recovered.full_scan and store.recovered.verified == 2000
    fired(store.shutdown())


def test_checkpoint_newer_than_data_steps_back(original, copy):
    """With the data torn near the end and the checkpoint at the old end, recovery steps back a few entries only."""
    member_dir = copy()
    damage_cut(member_dir, original, original.entries[290].pos + 10, "truncate")
    (member_dir / "checkpoint").write_bytes(b"committedIndex=280\nendIndex=299\n")
    store = open_store(member_dir)
    rec = store.recovered
    assert not rec.full_scan and 280 <= rec.anchor <= 289 and rec.cut
    check_prefix(store, original, 289)
    fired(store.shutdown())


# -- crash shapes ------------------------------------------------------------------------
def test_crash_between_blank_and_entry(tmp_path):
    """A blank marker and a new empty file without the entry that caused them are removed quietly."""
    member_dir = tmp_path / "dledger-n0"
    entries = write_log(member_dir, n=5)
    last = entries[-1]
    wp = last.pos + last.size
    patch_data(member_dir, wp, (-1).to_bytes(4, "big", signed=True) + (DATA - wp).to_bytes(4, "big"))
    (member_dir / "data" / f"{DATA:020d}").write_bytes(bytes(DATA))
    store = open_store(member_dir)
    assert store.ledger_end_index == 4 and not store.recovered.cut
    assert [p.name for p in store.data_files] == [f"{0:020d}"]
    nxt = store.append_as_leader(Entry(body=b"x", term=1))
    assert nxt.pos == wp
    fired(store.shutdown())


def test_interrupted_file_creation_is_ignored(tmp_path):
    """A leftover .tmp file and a short empty last file (an interrupted creation) do not stop the store."""
    member_dir = tmp_path / "dledger-n0"
    write_log(member_dir, n=5)
    (member_dir / "data" / f"{DATA:020d}.tmp").write_bytes(b"")
    (member_dir / "data" / f"{DATA:020d}").write_bytes(b"")
    store = open_store(member_dir)
    assert store.ledger_end_index == 4
    assert not (member_dir / "data" / f"{DATA:020d}.tmp").exists()
    fired(store.shutdown())


def test_unflushed_appends_survive_a_process_crash(tmp_path):
    """A process killed without flush or shutdown loses nothing: the page cache still has every mapped write."""
    member_dir = tmp_path / "dledger-n0"
    script = textwrap.dedent(f"""
        import os, sys
        sys.path.insert(0, {str(Path(__file__).parent.parent)!r})
        from dledger.entry import Entry
        from dledger.store.mmapfile import MmapLogStore
        from dledger.testing.store_contract import FakeMemberState, fired
        store = MmapLogStore({str(member_dir)!r}, FakeMemberState(), data_file_size={DATA}, index_file_size={INDEX})
        store.startup()
        for i in range(50):
            store.append_as_leader(Entry(body=b"body-%d" % i, term=1))
        fired(store.flush())
        for i in range(50, 80):
            store.append_as_leader(Entry(body=b"body-%d" % i, term=1))
        os._exit(0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    store = open_store(member_dir)
    assert store.ledger_end_index == 79
    assert [store.get(i).body for i in (0, 49, 79)] == [b"body-0", b"body-49", b"body-79"]
    fired(store.shutdown())


def test_reset_interrupted_before_flush(tmp_path):
    """A follower reset whose entry never reached the disk reopens as an empty log, ready to be reset again."""
    member_dir = tmp_path / "dledger-n0"
    write_log(member_dir, n=20)
    state = FakeMemberState()
    state.follow(1)
    store = MmapLogStore(member_dir, state, data_file_size=DATA, index_file_size=INDEX)
    store.startup()
    entry = Entry(body=b"restart", index=500, term=1, pos=40 * DATA + 100).sealed()
    store.truncate(entry, 1, "n1")
    f = store._data.files[0]
    f.mm[100:100 + entry.size] = bytes(entry.size)  # as if the page never reached the disk
    store.abandon()
    again = open_store(member_dir)
    assert (again.ledger_begin_index, again.ledger_end_index) == (-1, -1)
    assert again.data_files == [] and again.index_files == []
    fired(again.shutdown())


def test_data_file_gap_is_refused(original, copy):
    """A missing data file in the middle stops the store with a message naming it, and nothing is deleted."""
    member_dir = copy()
    victim = sorted((member_dir / "data").iterdir())[5]
    victim.unlink()
    before = sorted(p.name for p in (member_dir / "data").iterdir())
    with pytest.raises(Exception, match=f"{victim.name} is missing"):
        open_store(member_dir)
    assert sorted(p.name for p in (member_dir / "data").iterdir()) == before
    assert os.path.exists(member_dir / "checkpoint")


def test_recovery_logs_one_line_with_what_it_cut(original, copy):
    """Start-up logs one warning naming the cut position, the entries kept and what was zeroed or removed."""
    from twisted.logger import formatEvent, globalLogPublisher

    member_dir = copy()
    damage_cut(member_dir, original, original.entries[200].pos + 60, "truncate")
    (member_dir / "checkpoint").write_bytes(b"committedIndex=150\nendIndex=299\n")
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        store = open_store(member_dir)
    finally:
        globalLogPublisher.removeObserver(events.append)
    mine = [e for e in events if "mmap store" in formatEvent(e)]
    assert len(mine) == 1 and mine[0]["log_level"].name == "warn"
    text = formatEvent(mine[0])
    assert "entries [0, 199]" in text and f"CUT at {original.entries[200].pos}" in text
    assert "removed" in text and "data files" in text
    fired(store.shutdown())
