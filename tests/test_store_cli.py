"""``dledger store verify`` / ``dump`` and ``dledger bench store``, run through ``dledger.cli.main``."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.cli import main
from dledger.entry import Entry
from dledger.store.lmdbstore import LmdbLogStore, LmdbTermVoteStore
from dledger.store.mmapfile import MmapLogStore
from dledger.store.termvote import FileTermVoteStore
from dledger.testing.store_contract import FakeMemberState, bodies, fired

GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"


def digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def mmap_store(tmp_path) -> Path:
    """A base dir holding one member with 40 entries over several small files."""
    member = tmp_path / "base" / "dledger-n0"
    store = MmapLogStore(member, FakeMemberState(), data_file_size=1024, index_file_size=256)
    store.startup()
    for b in bodies(38):
        store.append_as_leader(Entry(body=b, term=1))
    store.append_as_leader(Entry(body=b"\x00\xffbinary", term=1))
    store.append_as_leader(Entry(body="unicodé ✓".encode(), term=1))
    store.update_committed_index(1, 35)
    fired(store.shutdown())
    FileTermVoteStore(member).save(1, "n0")
    return tmp_path / "base"


@pytest.fixture
def lmdb_store(tmp_path) -> Path:
    member = tmp_path / "lbase" / "dledger-n3"
    store = LmdbLogStore(member / "lmdb", FakeMemberState(), data_file_size=1024, map_size=1 << 20)
    store.startup()
    for b in bodies(12):
        store.append_as_leader(Entry(body=b, term=1))
    store.update_committed_index(1, 10)
    fired(store.flush())
    fired(store.shutdown())
    term_store = LmdbTermVoteStore(member / "lmdb", map_size=1 << 20)
    term_store.save(1, "n3")
    term_store.close()
    return member


def run(capsys, *argv) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_verify_good_mmap_store(capsys, mmap_store):
    """verify on a sound store (given its base dir) prints the summary and exits 0, changing nothing."""
    before = digests(mmap_store)
    code, out, _ = run(capsys, "store", "verify", str(mmap_store))
    assert code == 0, out
    assert "store:     mmap at" in out and "dledger-n0" in out
    assert "entries:   40 (begin 0, end 39, end term 1)" in out
    assert "committed: 35 (checkpoint)" in out
    assert "status:    OK" in out
    assert "files of 1024 bytes" in out
    assert digests(mmap_store) == before


def test_verify_reports_first_problem_with_offset(capsys, mmap_store):
    """A flipped body byte makes verify exit 1 naming the entry, its file and offset, without repairing it."""
    member = mmap_store / "dledger-n0"
    store = MmapLogStore(member, FakeMemberState(), data_file_size=1024, index_file_size=256)
    store.startup()
    victim = store.get(17)
    fired(store.shutdown())
    path = member / "data" / f"{victim.pos - victim.pos % 1024:020d}"
    raw = bytearray(path.read_bytes())
    raw[victim.pos % 1024 + 50] ^= 0x10
    path.write_bytes(bytes(raw))
    before = digests(mmap_store)
    code, out, _ = run(capsys, "store", "verify", str(member))
    assert code == 1
    assert "status:    CORRUPT: damaged store" in out and "entry 17 at" in out and "crc32c mismatch" in out
    assert "entry 18 at" in out and "after it verifies" in out  # the same line start-up recovery refuses with
    assert f"file {path.name} offset {victim.pos % 1024}" in out
    assert "entries:   17 (begin 0, end 16" in out
    assert digests(mmap_store) == before, "verify must not repair"


def test_verify_reports_stale_index_and_json(capsys, mmap_store):
    """A missing index file is a problem; --json prints one machine-readable report."""
    member = mmap_store / "dledger-n0"
    sorted((member / "index").iterdir())[2].unlink()
    code, out, _ = run(capsys, "store", "verify", str(member), "--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False and report["entries"] == 40
    assert "00000000000000000768 follows a gap" in report["problems"][0]
    assert any(p.startswith("index record 16 missing") for p in report["problems"])
    assert not any("index record 15" in p for p in report["problems"])


def test_verify_java_golden_store(capsys):
    """The Java store verifies by default (zero CRCs count as unverified, as on members); --strict-crc refuses it."""
    member = GOLDEN / "store" / "n1" / "dledger-n1"
    for extra in ([], ["--java-compat"]):
        code, out, _ = run(capsys, "store", "verify", str(member), *extra)
        assert code == 0, out
        assert "entries:   21 (begin 0, end 20, end term 1)" in out and "committed: 20 (checkpoint)" in out
        assert "currterm: term 1, voted for n1" in out
    code, out, _ = run(capsys, "store", "verify", str(GOLDEN / "store" / "n1"), "--strict-crc")
    assert code == 1 and "bodyCrc 0" in out and "--strict-crc" in out


def test_verify_java_oversize_store(capsys):
    """The store with a blank-only data file verifies (entries 0 and 1)."""
    code, out, _ = run(capsys, "store", "verify", str(GOLDEN / "store-oversize-2048" / "n0"), "--java-compat")
    assert code == 0, out
    assert "entries:   2 (begin 0, end 1, end term 0)" in out


def test_verify_lmdb_store(capsys, lmdb_store):
    """verify detects an LMDB store from the member dir and reports its range and committed index."""
    code, out, _ = run(capsys, "store", "verify", str(lmdb_store))
    assert code == 0, out
    assert "store:     lmdb at" in out and "entries:   12 (begin 0, end 11" in out
    assert "committed: 10 (meta)" in out


def test_verify_damaged_lmdb_store(capsys, lmdb_store):
    """A damaged LMDB value makes verify exit 1 with the key."""
    from dledger.store.lmdbstore import SharedEnv, key
    shared = SharedEnv.acquire(lmdb_store / "lmdb")
    with shared.env.begin(write=True) as txn:
        value = bytearray(txn.get(key(5), db=shared.entries))
        value[-1] ^= 1
        txn.put(key(5), bytes(value), db=shared.entries)
    shared.release()
    code, out, _ = run(capsys, "store", "verify", str(lmdb_store))
    assert code == 1 and "entry under key 5" in out and "[key 5]" in out


def test_verify_errors(capsys, tmp_path):
    """A directory without a store, or with several members, is an error (exit 2) that says so."""
    code, _, err = run(capsys, "store", "verify", str(tmp_path))
    assert code == 2 and "no dledger store" in err
    (tmp_path / "dledger-a" / "data").mkdir(parents=True)
    (tmp_path / "dledger-b" / "data").mkdir(parents=True)
    code, _, err = run(capsys, "store", "verify", str(tmp_path))
    assert code == 2 and "several members" in err


def test_dump_text_and_range(capsys, mmap_store):
    """dump --from/--to prints one line per entry with index, term, pos and the body."""
    code, out, _ = run(capsys, "store", "dump", str(mmap_store), "--from", "3", "--to", "5")
    assert code == 0
    lines = out.splitlines()
    assert len(lines) == 3 and lines[0].split()[0] == "3" and "'entry-00003-" in lines[0]
    assert "term=1" in lines[1] and "pos=" in lines[1]


def test_dump_json_lines(capsys, mmap_store):
    """dump --json prints JSON lines with base64 bodies, and text only for printable bodies."""
    code, out, _ = run(capsys, "store", "dump", str(mmap_store), "--from", "37", "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [r["index"] for r in records] == [37, 38, 39]
    assert base64.b64decode(records[1]["body"]) == b"\x00\xffbinary" and "text" not in records[1]
    assert records[2]["text"] == "unicodé ✓"
    assert {"index", "term", "pos", "magic", "size", "body"} <= set(records[0])


def test_dump_streams_a_long_log_in_chunks(capsys, tmp_path):
    """dump walks a log longer than one chunk without missing or repeating entries."""
    from dledger.store import offline
    member = tmp_path / "dledger-n0"
    store = MmapLogStore(member, FakeMemberState(), data_file_size=4096, index_file_size=512)
    store.startup()
    for b in bodies(250, size=5):
        store.append_as_leader(Entry(body=b, term=1))
    fired(store.shutdown())
    assert [e.index for e in offline.iter_mmap(member, None, None, chunk=7)] == list(range(250))
    assert [e.index for e in offline.iter_mmap(member, 100, 120, chunk=7)] == list(range(100, 121))


def test_dump_java_golden_and_lmdb(capsys, lmdb_store):
    """dump reads the Java store (with --java-compat) and an LMDB store."""
    code, out, _ = run(capsys, "store", "dump", str(GOLDEN / "store" / "n0"), "--java-compat", "--from", "10",
                       "--to", "11", "--json")
    records = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and records[0]["text"] == "abc" * 1000 and records[1]["text"] == "golden-10"
    assert records[0]["pos"] == 3056 and records[1]["pos"] == 6112
    code, out, _ = run(capsys, "store", "dump", str(lmdb_store), "--to", "1")
    assert code == 0 and len(out.splitlines()) == 2


def test_dump_stops_at_damage_with_exit_1(capsys, mmap_store):
    """dump prints the good entries, then reports the damaged one on stderr and exits 1."""
    member = mmap_store / "dledger-n0"
    data = sorted((member / "data").iterdir())[1]
    raw = bytearray(data.read_bytes())
    raw[60] ^= 0xFF
    data.write_bytes(bytes(raw))
    code, out, err = run(capsys, "store", "dump", str(member))
    assert code == 1 and "damaged store" in err and len(out.splitlines()) >= 1


@pytest.mark.parametrize("store", ["memory", "mmap", "lmdb"])
@pytest.mark.parametrize("flush", ["sync", "async"])
def test_bench_store_runs(capsys, tmp_path, store, flush):
    """dledger bench store runs a tiny workload and reports throughput, flush percentiles and RSS."""
    code, out, _ = run(capsys, "bench", "store", "--store", store, "--count", "300", "--batch", "50",
                       "--size", "100", "--flush", flush, "--dir", str(tmp_path / "b"),
                       "--data-file-size", "65536", "--index-file-size", "4096", "--json")
    result = json.loads(out)
    assert code == 0 and result["entries_per_s"] > 0 and result["mb_per_s"] > 0
    assert result["options"]["count"] == 300
    if store != "memory" and flush == "sync":
        assert result["flush"]["rounds"] >= 6 and "latency_p99_ms" in result["flush"]
    assert not any((tmp_path / "b").iterdir()), "the store is removed afterwards"


def test_bench_store_text_output(capsys):
    """The text report names entries/s, MB/s, CPU per entry, flush latency and reactor-blocked percentiles."""
    code, out, _ = run(capsys, "bench", "store", "--count", "500", "--batch", "100", "--data-file-size", "65536",
                       "--index-file-size", "4096")
    assert code == 0
    assert "entries/s" in out and "MB/s" in out and "latency p50" in out and "blocked per flush" in out
    assert "us per entry" in out and "us per flush round" in out


def test_bench_store_threaded_in_a_process(tmp_path):
    """--io thread runs under the real reactor with fsync on a threaded BlockingIO, and reports the CPU it took."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parent.parent)}
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "store", "--io", "thread", "--pipeline",
                          "--count", "2000", "--batch", "100", "--data-file-size", "65536", "--index-file-size",
                          "4096", "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["options"]["io"] == "thread" and result["flush"]["rounds"] > 0
    assert 0 < result["cpu_seconds"] < 120


def test_golden_tree_is_untouched():
    """The golden directories are read-only inputs: verify and dump leave nothing behind there."""
    names = {p.name for p in (GOLDEN / "store" / "n0" / "dledger-n0").iterdir()}
    assert names == {"checkpoint", "checkpoint.bak", "currterm", "currterm.bak", "data", "index"}
    assert sorted(p.name for p in (GOLDEN / "store" / "n0" / "dledger-n0" / "data").iterdir()) == \
        ["00000000000000000000", "00000000000000003056", "00000000000000006112"]


# -- term/vote and identity (issue #9 items 3 and 5) ---------------------------------------------------
@pytest.mark.parametrize("damage", ["missing", "garbage"])
def test_verify_reports_a_lost_or_damaged_currterm(capsys, mmap_store, damage):
    """A missing or garbage currterm under a log is a problem naming reset-vote, not status OK."""
    member = mmap_store / "dledger-n0"
    (member / "currterm.bak").unlink(missing_ok=True)
    if damage == "missing":
        (member / "currterm").unlink()
    else:
        (member / "currterm").write_bytes(b"currTerm=banana\n")
    code, out, _ = run(capsys, "store", "verify", str(member))
    assert code == 1, out
    assert "status:    CORRUPT: " in out and "status:    OK" not in out
    assert f"currterm is {damage if damage == 'missing' else 'damaged'}" in out
    assert f"dledger store reset-vote {member} --term 2" in out
    code, out, _ = run(capsys, "store", "verify", str(member), "--json")
    assert code == 1 and "reset-vote" in json.loads(out)["problems"][0]


def test_verify_new_empty_store_without_currterm_is_ok(capsys, tmp_path):
    """An empty store nobody started yet has no currterm and that is fine."""
    member = tmp_path / "dledger-n0"
    store = MmapLogStore(member, FakeMemberState(), data_file_size=1024, index_file_size=256)
    store.startup()
    fired(store.shutdown())
    code, out, _ = run(capsys, "store", "verify", str(member))
    assert code == 0 and "status:    OK" in out and "no term/vote record yet" in out


def test_reset_vote_refuses_a_small_term_then_repairs(capsys, mmap_store):
    """reset-vote refuses N below last log term + 1 (exit 2), then writes N with no vote; verify is OK again."""
    member = mmap_store / "dledger-n0"
    for name in ("currterm", "currterm.bak"):
        (member / name).unlink(missing_ok=True)
    code, _, err = run(capsys, "store", "reset-vote", str(member), "--term", "1")
    assert code == 2 and "--term 1 is too small: it must be at least 2 (last log term 1)" in err
    assert not (member / "currterm").exists()
    code, out, _ = run(capsys, "store", "reset-vote", str(mmap_store), "--term", "5")
    assert code == 0 and "term 5, no vote" in out
    assert (member / "currterm").read_bytes() == b"voteLeader=\ncurrTerm=5\n"
    code, out, _ = run(capsys, "store", "verify", str(member))
    assert code == 0 and "currterm: term 5, voted for nobody" in out
    code, _, err = run(capsys, "store", "reset-vote", str(member), "--term", "5")
    assert code == 2 and "at least 6" in err, "never back or sideways from a readable term"


def test_reset_vote_refuses_a_store_in_use(capsys, mmap_store):
    """reset-vote takes the lock: on a running member's store it fails with 'in use by pid N'."""
    from dledger.store import ownership
    member = mmap_store / "dledger-n0"
    fd = ownership.lock_dir(member)
    try:
        before = (member / "currterm").read_bytes()
        code, _, err = run(capsys, "store", "reset-vote", str(member), "--term", "9")
        assert code == 2 and f"store dir {member} is in use by pid {os.getpid()}" in err
        assert (member / "currterm").read_bytes() == before
        code, out, _ = run(capsys, "store", "verify", str(member))
        assert code == 0 and f"in use by pid {os.getpid()}" in out, "verify reads a locked store, noting it"
    finally:
        os.close(fd)


def test_reset_vote_lmdb(capsys, lmdb_store):
    """The LMDB term/vote record: verify reports it missing, reset-vote restores it above the last term."""
    from dledger.store.lmdbstore import SharedEnv
    shared = SharedEnv.acquire(lmdb_store / "lmdb")
    with shared.env.begin(write=True) as txn:
        txn.drop(shared.termvote, delete=False)
    shared.release()
    code, out, _ = run(capsys, "store", "verify", str(lmdb_store))
    assert code == 1 and "term/vote record of LMDB store" in out and "--term 2" in out
    code, _, err = run(capsys, "store", "reset-vote", str(lmdb_store), "--term", "0")
    assert code == 2 and "at least 2" in err
    code, out, _ = run(capsys, "store", "reset-vote", str(lmdb_store), "--term", "3")
    assert code == 0
    code, out, _ = run(capsys, "store", "verify", str(lmdb_store))
    assert code == 0 and "term 3, voted for nobody" in out


def test_verify_and_dump_show_the_identity(capsys, tmp_path):
    """verify prints the identity record (and it is in --json); dump names it on stderr."""
    from dledger.config import make_config
    from dledger.plugins import get_store_type
    cfg = make_config(store_base_dir=str(tmp_path), store_type="mmap", group="g7", self_id="n0",
                      mapped_file_size_for_entry_data=4096, mapped_file_size_for_entry_index=512)
    ts = get_store_type("mmap").make_term_store(cfg)
    ts.load()
    ts.close()
    code, out, _ = run(capsys, "store", "verify", str(cfg.member_dir))
    assert code == 0 and "identity:  group g7, member n0, store id " in out
    code, out, _ = run(capsys, "store", "verify", str(cfg.member_dir), "--json")
    assert json.loads(out)["identity"]["group"] == "g7"
    code, out, err = run(capsys, "store", "dump", str(cfg.member_dir))
    assert code == 0 and "identity: group g7, member n0" in err and out == ""
    code, out, _ = run(capsys, "store", "verify", str(GOLDEN / "store" / "n1" / "dledger-n1"), "--java-compat")
    assert "identity:  none (a Java DLedger or older store" in out
