"""The optional C batch loops (dledger._native_c, issue #28 Round 2g) against the pure-Python reference.

Each test runs the same inputs through both implementations (the pure code with ``NATIVE`` set to None in
the modules that dispatch) and compares everything observable: the entries, offsets, ``largest``, the
exceptions with their messages and entry numbers, and the bytes of the data and index files.  Skipped where
the extension is not built (an install without a compiler runs the pure code only).
"""

from __future__ import annotations

import random
from pathlib import Path

import crc32c
import pytest

import dledger.entry as entry_mod
import dledger.store.mmapwriter as writer_mod
from dledger import _native
from dledger.codes import EntryType
from dledger.entry import INDEX_RECORD, CodecError, Entry, EntryList, body_crc, decode_entries
from dledger.errors import BatchAppendError
from dledger.messages import decoded_entries_in_bounds
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.store_contract import FakeMemberState, fired

NATIVE = entry_mod.NATIVE
pytestmark = pytest.mark.skipif(NATIVE is None, reason="dledger._native_c is not built (or DLEDGER_PURE=1)")


def pure_and_native(monkeypatch, run):
    """``run()`` with the pure code, then with the C code: both results."""
    results = []
    for native in (None, NATIVE):
        monkeypatch.setattr(entry_mod, "NATIVE", native)
        monkeypatch.setattr(writer_mod, "NATIVE", native)
        results.append(run())
    return results


def decoded(buf, offset, end, count, accept_zero_crc):
    """What decode_entries gives, or raises, as comparable values."""
    try:
        out, off = decode_entries(buf, offset, end, count, accept_zero_crc=accept_zero_crc)
    except CodecError as exc:
        return "error", type(exc), str(exc), exc.number
    except Exception as exc:
        return "raised", type(exc), str(exc)
    return "ok", list(out), off, out.largest, type(out), decoded_entries_in_bounds(out)


def section_of(entries: list[Entry]) -> bytes:
    return EntryList(entries).section()[0]


def run_of(n: int, first_index=7, first_pos=4096, seed=1) -> list[Entry]:
    rnd = random.Random(seed)
    out, pos = [], first_pos
    for i in range(n):
        body = rnd.randbytes(rnd.randrange(0, 200))
        out.append(Entry(body, first_index + i, 3, pos, EntryType.NORMAL, 0, 0, body_crc(body)))
        pos += out[-1].size
    return out


def test_the_dispatch_obeys_dledger_pure():
    assert _native.load(Entry, entry_mod.VALID_MAGICS, {"DLEDGER_PURE": "1"}) is None
    assert _native.load(Entry, entry_mod.VALID_MAGICS, {}) is NATIVE


def test_crc32c_is_the_packages():
    data = random.Random(2).randbytes(3000)
    view = memoryview(data)
    for start in range(0, 9):
        for n in (0, 1, 7, 8, 9, 31, 32, 33, 1024, 2991):
            assert NATIVE.crc32c(view[start:start + n]) == crc32c.crc32c(view[start:start + n])


def plain_run_cases():
    run = run_of(40)
    gap = run_of(5) + run_of(5, first_index=12, first_pos=9)  # valid entries, not one run
    zero = [Entry(b"java", 0, 1, 0, 1, 0, 0, 0)] + run_of(3, 1, 52)  # a zero CRC first: no run vouched for
    reserved = run_of(4)
    reserved[2] = Entry(reserved[2].body, reserved[2].index, 3, reserved[2].pos, 1, 5, 0, reserved[2].body_crc)
    noop = run_of(3)
    noop[1] = Entry(b"", noop[1].index, 3, noop[1].pos, int(EntryType.NOOP), 0, 0, 0)
    top = run_of(5)  # a term past the bounds (2**63 - 1 has no room for +1): out of bounds, in a run or not
    top[3] = Entry(top[3].body, top[3].index, 2**63 - 1, top[3].pos, 1, 0, 0, top[3].body_crc)
    return {"run": run, "gap": gap, "zero crc": zero, "reserved": reserved, "empty noop": noop, "none": [],
            "top term": top, "top term, not a run": top[:2] + top[3:]}


@pytest.mark.parametrize("case", list(plain_run_cases()))
@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_gives_the_pure_decoders_entries(monkeypatch, case, kind):
    entries = plain_run_cases()[case]
    buf = b"pre" + section_of(entries) + b"post"
    for accept in (True, False):
        pure, native = pure_and_native(
            monkeypatch, lambda: decoded(kind(buf), 3, len(buf) - 4, len(entries), accept))  # noqa: B023
        assert pure == native
    if case == "run":
        assert pure[0] == "ok" and pure[3] > 0
        out, _ = decode_entries(buf, 3, len(buf) - 4, len(entries), accept_zero_crc=True)
        assert out.irecs == b"".join(INDEX_RECORD.pack(e.magic, e.pos, e.size, e.index, e.term) for e in entries)


def test_decode_of_damaged_pushes_fails_as_the_pure_decoder_does(monkeypatch):
    """Random bytes flipped, counts and ends off by some: the same entries, or the same error at the same entry."""
    rnd = random.Random(3)
    good = section_of(run_of(24, seed=4))
    outcomes = set()
    for trial in range(1500):
        buf = bytearray(good)
        for _ in range(rnd.randrange(0, 3)):
            buf[rnd.randrange(len(buf))] ^= 1 << rnd.randrange(8)
        count = rnd.choice([24, 24, 23, 25, 0, 1 << 40])  # a hostile count: the pure decoder's error, no MemoryError
        end = rnd.choice([len(buf), len(buf), len(buf) - 1, rnd.randrange(len(buf) + 1), len(buf) + 10])
        data = bytes(buf) if trial % 2 else buf
        accept = bool(trial % 3)
        pure, native = pure_and_native(monkeypatch, lambda: decoded(data, 0, end, count, accept))  # noqa: B023
        assert pure == native, trial
        outcomes.add(pure[0])
    assert outcomes == {"ok", "error"}


def store_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
            and "checkpoint" not in p.name}


@pytest.mark.parametrize("case", ["plain", "file ends", "reserved field", "too large", "odd entries"])
def test_leader_encode_stores_the_pure_loops_bytes(monkeypatch, tmp_path, case):
    """A leader's plain batches: the same entries, errors, data files and index files byte for byte."""
    data_file_size = 2048 if case == "file ends" else 1 << 16
    batches = [[Entry(body=bytes([b * 16 + i]) * (30 + 41 * i), term=1) for i in range(8)] for b in range(4)]
    if case == "reserved field":
        batches[1][5].chain_crc = 9
    elif case == "too large":
        batches[2][3] = Entry(body=b"x" * 5000, term=1)
    elif case == "odd entries":  # not an Entry, a bytearray body, a plain int magic, a negative term
        batches[0][2] = type("Sub", (Entry,), {"__slots__": ()})(body=b"sub", term=1)
        batches[1][1] = Entry(body=bytearray(b"mutable"), term=1)
        batches[2][0] = Entry(body=b"int magic", term=1, magic=1)
        batches[3][4] = Entry(body=b"negative", term=-5)
    dirs = iter(["pure", "native"])

    def run():
        root = tmp_path / next(dirs)
        store = MmapLogStore(root, FakeMemberState(), data_file_size=data_file_size, index_file_size=512,
                             max_entry_size=4000)
        store.startup()
        got = []
        for batch in batches:
            try:
                got.append(("stored", store.append_batch_as_leader(batch)))
            except BatchAppendError as exc:
                got.append((exc.cause.code, exc.stored))
        fired(store.shutdown())
        return got, store_bytes(root)

    pure, native = pure_and_native(monkeypatch, run)
    assert pure == native


def test_follower_stores_a_decoded_push_with_the_pure_loops_index_records(monkeypatch, tmp_path):
    """A push decoded by the C code carries its index records; the follower's files are the pure path's."""
    entries = run_of(30, first_index=0, first_pos=0)
    pushes = [section_of(entries[:10]), section_of(entries[10:])]  # the first opens the files: entry by entry
    dirs = iter(["pure", "native"])

    def run():
        root = tmp_path / next(dirs)
        state = FakeMemberState()
        state.follow(1, "n0")
        store = MmapLogStore(root, state, data_file_size=1 << 16, index_file_size=4096)  # one file: irecs used
        store.startup()
        stored, irec_counts = [], []
        real_write_run = store._write_run

        def write_run(run, into):
            irec_counts.append(run.irec_count)
            real_write_run(run, into)

        monkeypatch.setattr(store, "_write_run", write_run)
        for section, count in zip(pushes, (10, 20)):
            got, _ = decode_entries(section, 0, len(section), count, accept_zero_crc=True)
            pushed = EntryList(got, (section, crc32c.crc32c(section)), crc_checked=True, largest=got.largest,
                               irecs=got.irecs)
            stored += store.append_batch_as_follower(pushed, 1, "n0")
        fired(store.shutdown())
        return stored, store_bytes(root), irec_counts[-1]

    pure, native = pure_and_native(monkeypatch, run)
    assert pure[:2] == native[:2]
    assert (pure[2], native[2]) == (0, 20)  # the C decoder's records written in one slice


def test_decode_never_reads_past_the_buffer(monkeypatch):
    """An ``end`` past the buffer's end (a caller's mistake): the C code steps aside, as it must not read there;
    the last entry's zero CRC (accepted) would not catch bytes read from beyond the buffer."""
    entries = run_of(3) + [Entry(b"z" * 64, 10, 3, run_of(3)[-1].pos + run_of(3)[-1].size, 1, 0, 0, 0)]
    buf = section_of(entries)[:-40]
    pure, native = pure_and_native(monkeypatch, lambda: decoded(buf, 0, len(buf) + 40, 4, True))
    assert pure == native


def test_an_entry_struct_refuses_leaves_the_pure_loops_earlier_entries_whole(monkeypatch, tmp_path):
    """An entry whose term does not fit the header: the pure loop raises inside its loop (the run's end not
    yet moved), the C loop stops before it and the general loop raises; either way the entries before it
    are stored whole, their data and index records byte for byte the same (a doubt raised in Round 2g)."""
    batch = [Entry(body=b"a" * 40, term=1), Entry(body=b"b" * 40, term=1), Entry(body=b"c" * 40, term=1 << 63)]
    dirs = iter(["pure", "native"])

    def run():
        root = tmp_path / next(dirs)
        store = MmapLogStore(root, FakeMemberState(), data_file_size=1 << 16, index_file_size=512)
        store.startup()
        with pytest.raises(Exception) as failed:
            store.append_batch_as_leader(batch)
        stored = [(e.index, e.body) for e in getattr(failed.value, "stored", None) or ()]
        back = [(e.index, e.body) for e in (store.get(i) for i in range(store.ledger_end_index + 1))]
        fired(store.shutdown())
        return stored, back, store_bytes(root)

    pure, native = pure_and_native(monkeypatch, run)
    assert pure[1] == native[1] == [(0, b"a" * 40), (1, b"b" * 40)]
    assert pure == native
