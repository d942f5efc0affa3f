"""SnapshotStore: the files of a snapshot, written atomically, read back checked, received resumably, pruned."""

import json
import random

import pytest
from twisted.internet.task import Clock

from dledger.snapshot.manifest import FileInfo, Manifest, ManifestError, Section
from dledger.snapshot.store import SnapshotDamaged, SnapshotError, SnapshotStore
from dledger.testing.simdisk import SimulatedIO


def result_of(d, clock=None):
    out = []
    d.addBoth(out.append)
    if clock is not None:
        for _ in range(10000):
            if out:
                break
            clock.advance(0.01)
    assert out, "Deferred never fired"
    return out[0]


def value(d, clock=None):
    r = result_of(d, clock)
    if hasattr(r, "raiseException"):
        r.raiseException()
    return r


def make(store, index=10, term=2, sections=None, clock=None):
    sections = sections if sections is not None else {"kv": [b"a" * 5000, b"b" * 7000], "x": [b"hello"]}
    b = store.create(index, term, 1234, ["n0-127.0.0.1:1"])
    for name, parts in sections.items():
        w = b.section(name)
        for p in parts:
            value(w.write(p), clock)
    return value(b.finish(), clock)


def read_all(store, manifest, name, clock=None, size=3000):
    r = store.open_section(manifest, name)
    out = b""
    while True:
        chunk = value(r.read(size), clock)
        if not chunk:
            return out
        out += chunk


def test_create_cuts_files_and_reads_back(tmp_path):
    """Sections are cut into files of at most snapshotFileSize with a CRC each; reads give the bytes back."""
    store = SnapshotStore(tmp_path, reserved=3, file_size=4096)
    m = make(store)
    assert [f.size for f in m.section("kv").files] == [4096, 4096, 3808]
    assert read_all(store, m, "kv") == b"a" * 5000 + b"b" * 7000
    assert read_all(store, m, "x") == b"hello"
    assert read_all(store, m, "missing") == b""
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10-2"]
    assert json.loads((tmp_path / "10-2" / "manifest.json").read_text())["nextPos"] == 1234
    assert value(store.verify(m)) is True


def test_out_of_order_io_keeps_the_order_of_writes(tmp_path):
    """An I/O whose jobs finish out of order (SimulatedIO with random latency) still writes bytes in order."""
    clock = Clock()
    io = SimulatedIO(clock, (0.001, 0.05), random.Random(7))
    store = SnapshotStore(tmp_path, io, file_size=4096)
    parts = [bytes([65 + k]) * (700 + k * 37) for k in range(20)]
    m = make(store, sections={"kv": parts}, clock=clock)
    assert read_all(store, m, "kv", clock) == b"".join(parts)


def test_load_skips_damaged_and_clears_leftovers(tmp_path):
    """load(): newest first; a bad manifest or short file is reported and skipped; .tmp- dirs are removed."""
    store = SnapshotStore(tmp_path, file_size=4096)
    old, mid, new = make(store, 10, 1), make(store, 20, 1), make(store, 30, 2)
    (tmp_path / "30-2" / "manifest.json").write_text("{")
    with open(tmp_path / "20-1" / mid.files[0].path, "ab") as f:
        f.write(b"extra")
    (tmp_path / ".tmp-40-2").mkdir()
    again = SnapshotStore(tmp_path)
    assert value(again.load()) == [old]
    assert [n for n, _ in again.damaged] == ["30-2", "20-1"] or [n for n, _ in again.damaged] == ["20-1", "30-2"]
    assert all("\n" not in why for _, why in again.damaged)
    assert not (tmp_path / ".tmp-40-2").exists()
    assert new.index == 30


def test_verify_finds_a_flipped_bit(tmp_path):
    """verify() checks every CRC; the reader refuses the damaged file too."""
    store = SnapshotStore(tmp_path, file_size=4096)
    m = make(store)
    f = tmp_path / m.dirname / m.files[1].path
    raw = bytearray(f.read_bytes())
    raw[100] ^= 1
    f.write_bytes(bytes(raw))
    with pytest.raises(SnapshotDamaged, match="CRC32C"):
        read_all(store, m, "kv")
    assert value(store.verify(m)) is False
    assert store.newest() is None


def test_abort_leaves_nothing(tmp_path):
    """An aborted snapshot leaves no directory and no manifest."""
    store = SnapshotStore(tmp_path)
    b = store.create(5, 1, 0, [])
    value(b.section("kv").write(b"x" * 100))
    value(b.abort())
    assert list(tmp_path.iterdir()) == []
    assert store.newest() is None


def test_read_file_and_receive_resume_after_restart(tmp_path):
    """The leader reads chunks; the follower's receiver resumes from what it has after a restart, then finishes."""
    leader = SnapshotStore(tmp_path / "leader", file_size=4096)
    m = make(leader)
    follower_dir = tmp_path / "follower"
    rx = SnapshotStore(follower_dir).receive(m)
    assert rx.resume_point() == ("kv/000000", 0)
    first = value(leader.read_file(m, "kv/000000", 0, 3000))
    value(rx.write("kv/000000", 0, first))
    # restart: a new store and receiver over the same directory
    rx = SnapshotStore(follower_dir).receive(m)
    assert rx.resume_point() == ("kv/000000", 3000)
    with pytest.raises(SnapshotError, match="cannot write"):
        value(rx.write("kv/000000", 3500, b"zz"))  # a gap
    while True:
        path, offset = rx.resume_point()
        if path is None:
            break
        value(rx.write(path, offset, value(leader.read_file(m, path, offset, 1000))))
    store = rx.store
    got = value(rx.finish())
    assert got.index == m.index and store.newest() == got
    assert read_all(store, got, "kv") == read_all(leader, m, "kv")
    assert sorted(p.name for p in follower_dir.iterdir()) == ["10-2"]


def test_receive_refetches_a_damaged_file(tmp_path):
    """finish() with a file that does not match its CRC empties it and fails; resume_point asks for it again."""
    leader = SnapshotStore(tmp_path / "leader", file_size=4096)
    m = make(leader, sections={"kv": [b"q" * 5000]})
    rx = SnapshotStore(tmp_path / "f").receive(m)
    for f in m.files:
        value(rx.write(f.path, 0, b"\0" * f.size))
    with pytest.raises(SnapshotDamaged, match="fetching again"):
        value(rx.finish())
    assert rx.resume_point() == ("kv/000000", 0)


def test_prune_keeps_the_newest_and_those_in_use(tmp_path):
    """prune() keeps maxSnapshotReservedNum snapshots, and one being sent."""
    store = SnapshotStore(tmp_path, reserved=2)
    ms = [make(store, i, 1) for i in (10, 20, 30, 40)]
    store.hold(ms[0])
    assert value(store.prune()) == ["20-1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["10-1", "30-1", "40-1"]
    store.release(ms[0])
    assert value(store.prune()) == ["10-1"]


@pytest.mark.parametrize("text, problem", [
    (b"{", "not JSON"),
    (b"[]", "expected a JSON object"),
    (b'{"format": 2, "index": 1, "term": 1, "nextPos": 0, "sections": []}', "format 2"),
    (b'{"format": 1, "index": -1, "term": 1, "nextPos": 0, "sections": []}', ">= 0"),
    (b'{"format": 1, "index": 1, "term": 1, "nextPos": 0}', "'sections' must be a list"),
    (b'{"format": 1, "index": 1, "term": 1, "nextPos": 0, "sections": [{"name": "kv", "files": '
     b'[{"path": "../x", "size": 1, "crc32c": 0}]}]}', "bad file path"),
    (b'{"format": 1, "index": 1, "term": 1, "nextPos": 0, "sections": [{"name": "KV", "files": []}]}', "bad name"),
    (b"\xff", "not UTF-8"),
])
def test_bad_manifests_are_one_line_errors(text, problem):
    """Every manifest problem is one line naming the file."""
    with pytest.raises(ManifestError) as info:
        Manifest.from_bytes(text, "x/manifest.json")
    assert problem in str(info.value) and str(info.value).startswith("x/manifest.json") and "\n" not in str(info.value)


def test_manifest_round_trip():
    """to_bytes/from_bytes keep every field (the docs' example shape)."""
    m = Manifest(120000, 7, 123456789, ("n0-127.0.0.1:20911",),
                 (Section("kv", (FileInfo("kv/000000", 1048576, 305419896),)),), 1795000000.0)
    assert Manifest.from_bytes(m.to_bytes()) == m
