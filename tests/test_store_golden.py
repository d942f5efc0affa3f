"""Java DLedger 0.3.2 store directories: they open, verify and serve, and our files have the same layout."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from dledger.codes import ResponseCode
from dledger.entry import BODY_CRC_OFFSET, Entry
from dledger.errors import DLedgerError, StoreError
from dledger.store.mmapfile import MmapLogStore
from dledger.store.termvote import FileTermVoteStore
from dledger.testing.store_contract import FakeMemberState, fired

GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"
MEMBERS = ["n0", "n1", "n2"]
BODIES = [f"golden-{i:02d}".encode() for i in range(10)] + [b"abc" * 1000] + \
    [f"golden-{i:02d}".encode() for i in range(10, 20)]
POSITIONS = [57 * i for i in range(10)] + [3056] + [6112 + 57 * i for i in range(10)]


def copy_member(tmp_path: Path, member: str, tree: str = "store") -> Path:
    """Copy a read-only golden member directory into tmp_path and return its dledger-<id> dir."""
    src = GOLDEN / tree / member
    dst = tmp_path / tree / member
    shutil.copytree(src, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst / f"dledger-{member}"


def digests(root: Path) -> dict[str, str]:
    """Checksums of the store's files; the lock file a store takes while open (its pid, no data) is left out."""
    return {str(p.relative_to(root)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != "lock"}


def open_golden(member_dir: Path, *, data=3056, index=512, accept=True, state=None) -> MmapLogStore:
    store = MmapLogStore(member_dir, state or FakeMemberState(), data_file_size=data, index_file_size=index,
                         accept_zero_crc=accept)
    store.startup()
    return store


@pytest.mark.parametrize("member", MEMBERS)
def test_java_store_opens_and_serves(tmp_path, member):
    """Each member's Java store opens with 21 entries, begin 0, end 20, committed 20, bodies as recorded."""
    member_dir = copy_member(tmp_path, member)
    store = open_golden(member_dir)
    assert (store.ledger_begin_index, store.ledger_end_index, store.ledger_end_term) == (0, 20, 1)
    assert store.committed_index == 20
    assert not store.recovered.cut and not store.recovered.changed
    for i, (body, pos) in enumerate(zip(BODIES, POSITIONS)):
        e = store.get(i)
        assert (e.index, e.term, e.pos, e.body, e.body_crc, e.magic) == (i, 1, pos, body, 0, 1)
    assert [e.body for e in store.get_range(8, 5, 1 << 20)] == BODIES[8:13]
    assert store.get_first_log_of_target_term(1, 20) == 0
    fired(store.shutdown())


@pytest.mark.parametrize("member", MEMBERS)
def test_java_store_is_not_modified_by_open_and_close(tmp_path, member):
    """Opening and shutting down a Java store leaves its data, index and checkpoint bytes as they were."""
    member_dir = copy_member(tmp_path, member)
    before = digests(member_dir)
    store = open_golden(member_dir)
    fired(store.shutdown())
    after = digests(member_dir)
    assert {k: v for k, v in after.items() if k != "checkpoint.bak"} == \
        {k: v for k, v in before.items() if k != "checkpoint.bak"}


def test_java_store_without_zero_crc_option_is_refused_not_cut(tmp_path):
    """Without acceptJavaZeroCrc a Java store is refused with a clear error, and nothing is cut."""
    member_dir = copy_member(tmp_path, "n1")
    before = digests(member_dir)
    with pytest.raises(StoreError, match="acceptJavaZeroCrc"):
        open_golden(member_dir, accept=False)
    assert digests(member_dir) == before


def test_java_store_accepts_appends(tmp_path):
    """A Java store keeps growing under our store: the next entry goes after entry 20 with a real CRC."""
    store = open_golden(copy_member(tmp_path, "n1"))
    e = store.append_as_leader(Entry(body=b"golden-20", term=1))
    assert (e.index, e.pos) == (21, 6682) and e.body_crc != 0
    fired(store.flush())
    fired(store.shutdown())
    again = open_golden(tmp_path / "store" / "n1" / "dledger-n1")
    assert again.get(21) == e and again.get(20).body == b"golden-19"
    fired(again.shutdown())


def test_java_store_with_wrong_file_size_is_refused(tmp_path):
    """Opening a Java store with a different data file size fails, naming the file and both sizes."""
    member_dir = copy_member(tmp_path, "n0")
    with pytest.raises(StoreError, match=r"00000000000000000000 is 3056 bytes but the configured data file size "
                                         r"is 4096"):
        open_golden(member_dir, data=4096)


def write_like_java(member_dir: Path) -> MmapLogStore:
    store = MmapLogStore(member_dir, FakeMemberState(), data_file_size=3056, index_file_size=512)
    store.startup()
    for body in BODIES:
        store.append_as_leader(Entry(body=body, term=1))
    store.update_committed_index(1, 20)
    fired(store.flush())
    fired(store.shutdown())
    return store


def masked(data: bytes, file_start: int) -> bytes:
    """The file's bytes with the bodyCrc field of every entry zeroed (Java writes 0 there)."""
    out = bytearray(data)
    for pos in POSITIONS:
        rel = pos - file_start
        if 0 <= rel < len(out):
            out[rel + BODY_CRC_OFFSET:rel + BODY_CRC_OFFSET + 4] = bytes(4)
    return bytes(out)


@pytest.mark.parametrize("member", MEMBERS)
def test_our_layout_equals_java_layout(tmp_path, member):
    """Our store writing the same 21 bodies produces the golden files: names, sizes, blanks, index, checkpoint."""
    golden = GOLDEN / "store" / member / f"dledger-{member}"
    ours = tmp_path / "ours" / "dledger-n1"
    write_like_java(ours)
    for sub in ("data", "index"):
        names = sorted(p.name for p in (golden / sub).iterdir())
        assert sorted(p.name for p in (ours / sub).iterdir()) == names
        for name in names:
            g, o = (golden / sub / name).read_bytes(), (ours / sub / name).read_bytes()
            assert len(o) == len(g)
            if sub == "data":
                assert masked(o, int(name)) == masked(g, int(name)), f"data file {name} differs"
            else:
                assert o == g, f"index file {name} differs"
    assert (ours / "checkpoint").read_bytes() == (golden / "checkpoint").read_bytes() == \
        b"committedIndex=20\nendIndex=20\n"


def test_our_crc_is_real_and_the_only_difference(tmp_path):
    """Masking bodyCrc is needed only because we write crc32c: every one of our entries carries a non-zero CRC."""
    store = MmapLogStore(tmp_path / "x", FakeMemberState(), data_file_size=3056, index_file_size=512)
    store.startup()
    entries = [store.append_as_leader(Entry(body=b, term=1)) for b in BODIES]
    assert all(e.body_crc != 0 for e in entries)
    fired(store.shutdown())


def test_oversize_store_with_blank_only_file(tmp_path):
    """store-oversize-2048 (a file holding only a blank marker) opens with entries 0 and 1 where Java put them."""
    member_dir = copy_member(tmp_path, "n0", tree="store-oversize-2048")
    store = open_golden(member_dir, data=2048, index=512)
    assert (store.ledger_begin_index, store.ledger_end_index, store.committed_index) == (0, 1, 1)
    assert not store.recovered.cut
    a, b = store.get(0), store.get(1)
    assert (a.body, a.pos, a.term) == (b"small-1", 0, 0)
    assert (b.body, b.pos, b.term) == (b"small-2", 4096, 0)
    nxt = store.append_as_leader(Entry(body=b"small-3", term=0))
    assert (nxt.index, nxt.pos) == (2, 4096 + 55)
    fired(store.shutdown())


def test_oversized_entry_refused_before_anything_is_written(tmp_path):
    """Where Java wrote a blank-only file and answered 414, we refuse the entry and write nothing."""
    member_dir = copy_member(tmp_path, "n0", tree="store-oversize-2048")
    store = open_golden(member_dir, data=2048, index=512)
    before = digests(member_dir / "data")
    with pytest.raises(DLedgerError) as info:
        store.append_as_leader(Entry(body=b"abc" * 1000, term=0))
    assert info.value.code == ResponseCode.UNEXPECTED_ARGUMENT
    assert digests(member_dir / "data") == before
    assert store.ledger_end_index == 1
    fired(store.shutdown())


@pytest.mark.parametrize("member, expected", [("n0", (1, "n1")), ("n1", (1, "n1")), ("n2", (1, "n1"))])
def test_java_currterm_files_load(tmp_path, member, expected):
    """FileTermVoteStore reads each member's Java currterm file (voteLeader first)."""
    member_dir = copy_member(tmp_path, member)
    assert FileTermVoteStore(member_dir).load() == expected


def test_java_currterm_bak_without_vote_reads_as_no_vote(tmp_path):
    """Java's 'voteLeader=' (empty) means no vote in the term."""
    member_dir = copy_member(tmp_path, "n0")
    bak = (member_dir / "currterm.bak").read_bytes()
    assert bak == b"voteLeader=\ncurrTerm=1\n"
    (member_dir / "currterm").write_bytes(bak)
    assert FileTermVoteStore(member_dir).load() == (1, None)


def test_we_write_currterm_as_java_does(tmp_path):
    """save() writes Java's bytes and keeps the previous content in currterm.bak."""
    member_dir = copy_member(tmp_path, "n1")
    golden = (member_dir / "currterm").read_bytes()
    store = FileTermVoteStore(tmp_path / "ours")
    store.save(1, None)
    store.save(1, "n1")
    assert (tmp_path / "ours" / "currterm").read_bytes() == golden == b"voteLeader=n1\ncurrTerm=1\n"
    assert (tmp_path / "ours" / "currterm.bak").read_bytes() == b"voteLeader=\ncurrTerm=1\n"
