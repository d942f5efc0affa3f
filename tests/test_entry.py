"""The entry codec: round trips, corruption detection and Java DLedger 0.3.2's real files."""

import re
import struct
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger import entry as codec
from dledger.codes import EntryType
from dledger.entry import (
    BODY_OFFSET,
    CodecError,
    CorruptEntryError,
    Entry,
    OversizedEntryError,
    TruncatedEntryError,
    decode_blank,
    decode_entry,
    decode_index,
    encode_blank,
    encode_entry,
    encode_index,
    place_entry,
)

GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"

i32 = st.integers(-(2**31), 2**31 - 1)
i64 = st.integers(0, 2**63 - 1)
entries = st.builds(
    lambda body, index, term, pos, magic, channel, chain: Entry(
        body=body, index=index, term=term, pos=pos, magic=magic, channel=channel, chain_crc=chain).sealed(),
    st.binary(max_size=2048), i64, i64, i64, st.sampled_from([1, 2, 3]), i32, i32)


@given(entries)
def test_round_trip(entry):
    """Any entry encodes to 48 + body bytes and decodes to an equal entry."""
    data = encode_entry(entry)
    assert len(data) == BODY_OFFSET + len(entry.body) == entry.size
    assert decode_entry(data, exact=True) == entry


@given(entries, st.data())
@settings(max_examples=300)
def test_every_single_byte_change_is_detected_or_distinguishable(entry, data):
    """A changed byte either raises CodecError or yields a valid entry different from the original."""
    raw = bytearray(encode_entry(entry))
    offset = data.draw(st.integers(0, len(raw) - 1))
    new = data.draw(st.integers(0, 255).filter(lambda b: b != raw[offset]))
    raw[offset] = new
    try:
        decoded = decode_entry(bytes(raw), exact=True)
    except CodecError:
        return
    assert decoded != entry


def test_every_byte_of_one_entry_exhaustively():
    """For one entry, flipping each bit of each byte is detected or distinguishable."""
    entry = Entry(body=b"hello world, this is dledger", index=7, term=3, pos=4096).sealed()
    raw = encode_entry(entry)
    for offset in range(len(raw)):
        for bit in range(8):
            mutated = bytearray(raw)
            mutated[offset] ^= 1 << bit
            try:
                assert decode_entry(bytes(mutated), exact=True) != entry
            except CodecError:
                pass


@pytest.mark.parametrize("cut", [0, 1, 8, 47, 48, 49, 60])
def test_truncated_input_raises(cut):
    """Input that ends inside the header or body raises TruncatedEntryError."""
    raw = encode_entry(Entry(body=b"x" * 20, index=1, term=1, pos=0).sealed())
    with pytest.raises(TruncatedEntryError):
        decode_entry(raw[:cut])


def test_corrupt_body_raises_crc_error():
    """A changed body byte is a CRC mismatch."""
    raw = bytearray(encode_entry(Entry(body=b"payload", index=1, term=1, pos=0).sealed()))
    raw[-1] ^= 0x40
    with pytest.raises(CorruptEntryError, match="crc32c"):
        decode_entry(bytes(raw))


def test_oversized_header_raises():
    """A header claiming more than max_size raises OversizedEntryError before reading the body."""
    raw = encode_entry(Entry(body=b"x" * 100, index=1, term=1, pos=0).sealed())
    with pytest.raises(OversizedEntryError):
        decode_entry(raw, max_size=64)


def test_blank_marker_is_not_an_entry():
    """A blank marker decodes as a blank and is refused as an entry."""
    blank = encode_blank(2486) + b"\0" * 40
    assert decode_blank(blank) == codec.Blank(2486)
    with pytest.raises(CorruptEntryError, match="blank"):
        decode_entry(blank)
    with pytest.raises(ValueError):
        encode_blank(4)


def test_zero_crc_needs_compat_mode():
    """bodyCrc 0 (Java 0.3.2) is refused by default and accepted unverified in compatibility mode."""
    raw = encode_entry(Entry(body=b"golden", index=0, term=1, pos=0, body_crc=0))
    with pytest.raises(CorruptEntryError):
        decode_entry(raw)
    assert decode_entry(raw, accept_zero_crc=True).body == b"golden"
    bad = bytearray(encode_entry(Entry(body=b"golden", index=0, term=1, pos=0).sealed()))
    bad[-1] ^= 1
    with pytest.raises(CorruptEntryError):
        decode_entry(bytes(bad), accept_zero_crc=True)


@given(entries)
def test_index_record_round_trip(entry):
    """Index records are 32 bytes and decode to the entry's magic/pos/size/index/term."""
    rec = encode_index(entry)
    assert len(rec) == 32
    assert decode_index(rec) == (entry.magic, entry.pos, entry.size, entry.index, entry.term)


def test_corrupt_index_record_raises():
    """An index record with a bad magic or short input raises CodecError."""
    rec = bytearray(encode_index(Entry(body=b"a", index=1, term=1, pos=0)))
    with pytest.raises(TruncatedEntryError):
        decode_index(bytes(rec[:31]))
    rec[3] = 9
    with pytest.raises(CorruptEntryError):
        decode_index(bytes(rec))


@given(st.integers(0, 10**9), st.integers(48, 5000), st.integers(5100, 20000))
def test_place_entry_never_straddles(write_pos, size, file_size):
    """Entries never straddle files and always leave room for an 8-byte blank."""
    pos, blank = place_entry(write_pos, size, file_size)
    assert pos == write_pos + blank
    assert pos // file_size == (pos + size + 7) // file_size
    assert blank == 0 or blank == file_size - write_pos % file_size


def test_place_entry_refuses_entries_larger_than_a_file():
    """An entry that cannot fit a data file (plus the 8-byte blank) is refused."""
    with pytest.raises(OversizedEntryError):
        place_entry(0, 3049, 3056)
    assert place_entry(0, 3048, 3056) == (0, 0)


# -- real data from Java DLedger 0.3.2 ---------------------------------------

def _golden_listing(member: str):
    """Decoded entries of a member as listed in store/INDEX.md (written independently of this codec)."""
    text = (GOLDEN / "store" / "INDEX.md").read_text()
    section = text.split(f"## member {member}")[1].split("## member")[0]
    section = section.split("### decoded data entries")[1].split("### decoded index")[0]
    rows = re.findall(r"^\| (\d{20}) \| (\d+) \| (\d+) \| (-?\d+)(?: \(BLANK\))? \| (\d+) \| ?(\d*) ?\|", section, re.M)
    return [(int(f), int(rel), int(pos), int(magic), int(size), int(idx) if idx else None)
            for f, rel, pos, magic, size, idx in rows]


@pytest.mark.parametrize("member", ["n0", "n1", "n2"])
def test_decodes_every_java_entry_byte_for_byte(member):
    """Every entry Java wrote decodes (compat mode), matches INDEX.md and re-encodes byte for byte."""
    data_dir = GOLDEN / "store" / member / f"dledger-{member}" / "data"
    files = sorted(data_dir.iterdir())
    listing = _golden_listing(member)
    assert len(listing) == 24, "INDEX.md lists 21 entries, 2 blanks and the unused tail"
    seen = 0
    for path in files:
        start = int(path.name)
        raw = path.read_bytes()
        for f, rel, pos, magic, size, idx in listing:
            if f != start or magic == 0:
                continue
            if magic == -1:
                assert decode_blank(raw, rel).remaining == size
                continue
            entry = decode_entry(raw, rel, accept_zero_crc=True)
            assert (entry.pos, entry.magic, entry.size, entry.index) == (pos, magic, size, idx)
            assert entry.body_crc == 0
            assert encode_entry(entry) == raw[rel:rel + size]
            seen += 1
    assert seen == 21
    index = b"".join(p.read_bytes() for p in sorted((data_dir.parent / "index").iterdir()))
    for i in range(21):
        rec = decode_index(index, i * 32)
        assert rec.index == i and rec.term == 1


def test_java_bodies_are_the_documented_ones():
    """Entry 10 is 'abc' x 1000 and the others 'golden-NN', as the recording script wrote them."""
    data_dir = GOLDEN / "store" / "n1" / "dledger-n1" / "data"
    raw = b"".join(p.read_bytes() for p in sorted(data_dir.iterdir()))
    e10 = decode_entry(raw, 3056, accept_zero_crc=True)
    assert e10.body == b"abc" * 1000
    e11 = decode_entry(raw, 6112, accept_zero_crc=True)
    assert e11.body == b"golden-10"
    assert struct.unpack(">ii", raw[6104:6112]) == (-1, 8)


def _one_at_a_time(buf, offset, end, count, accept_zero_crc):
    """decode_entry of each entry in turn: what decode_entries must give (or the error it must raise)."""
    out, off = [], offset
    for k in range(count):
        try:
            e = decode_entry(buf, off, accept_zero_crc=accept_zero_crc, max_size=end - off)
        except CodecError as exc:
            return ("error", type(exc), str(exc), k)
        out.append(e)
        off += e.size
    return out, off


@given(st.lists(entries, min_size=1, max_size=5), st.data(), st.booleans())
@settings(max_examples=300)
def test_decode_entries_is_decode_entry_of_each(batch, data, accept_zero_crc):
    """Entries decoded together equal decode_entry of each, and a damaged one raises decode_entry's error."""
    raw = bytearray(b"".join(encode_entry(e) for e in batch))
    starts = [sum(e.size for e in batch[:k]) for k in range(len(batch))]
    for _ in range(data.draw(st.integers(0, 2))):  # headers hold the rules: damage them most
        offset = data.draw(st.one_of(st.integers(0, len(raw) - 1),
                                     st.builds(lambda s, k: s + k, st.sampled_from(starts), st.integers(0, 47))))
        raw[offset] = data.draw(st.integers(0, 255))
    end = data.draw(st.integers(0, len(raw)))
    count = data.draw(st.integers(0, len(batch) + 1))
    buf = bytes(raw) if data.draw(st.booleans()) else memoryview(bytes(raw))
    want = _one_at_a_time(buf, 0, end, count, accept_zero_crc)
    try:
        got = codec.decode_entries(buf, 0, end, count, accept_zero_crc=accept_zero_crc)
    except CodecError as exc:
        assert want == ("error", type(exc), str(exc), exc.number)
        return
    assert got == want


@pytest.mark.parametrize("kind", [bytes, bytearray, memoryview])
def test_decode_entries_bodies_are_bytes_of_their_own(kind):
    """Every body is a ``bytes`` of its own whatever buffer it was cut from: never a view or a bytearray that
    the buffer's owner could change later (the bytes case slices once, the others copy)."""
    batch = [Entry(body=b"z" * 10, index=i, term=1, pos=58 * i).sealed() for i in range(3)]
    raw = bytearray(b"".join(encode_entry(e) for e in batch))
    buf = kind(bytes(raw)) if kind is not bytearray else raw
    got, _ = codec.decode_entries(buf, 0, len(raw), 3)
    assert [type(e.body) for e in got] == [bytes] * 3
    assert got == batch
    if kind is bytearray:
        raw[BODY_OFFSET] ^= 1  # the buffer changes afterwards: the decoded entry does not
        assert got[0].body == b"z" * 10


def test_decode_entries_names_the_damaged_entry():
    """The error of a batch says which entry (its number) and why, as decode_entry does for that entry alone."""
    batch = [Entry(body=b"x" * 10, index=i, term=1, pos=58 * i).sealed() for i in range(3)]
    raw = bytearray(b"".join(encode_entry(e) for e in batch))
    raw[2 * 58 + BODY_OFFSET] ^= 1  # the third entry's body
    with pytest.raises(CorruptEntryError, match="body crc32c mismatch") as info:
        codec.decode_entries(bytes(raw), 0, len(raw), 3)
    assert info.value.number == 2


@pytest.mark.parametrize("field, value", [
    ("magic", 99), ("magic", -1), ("size", 47), ("size", 10_000), ("body_size", -1), ("index", -1), ("term", -1),
    ("pos", -1), ("body_crc", 0), ("body_crc", 12345),
])
@pytest.mark.parametrize("accept_zero_crc", [False, True])
def test_decode_entries_applies_each_rule_of_decode_entry(field, value, accept_zero_crc):
    """One header field made invalid in the second of three entries: decode_entries does what decode_entry does."""
    batch = [Entry(body=b"y" * 10, index=i, term=1, pos=58 * i).sealed() for i in range(3)]
    raw = bytearray(b"".join(encode_entry(e) for e in batch))
    names = codec.HEADER_FIELDS
    fields = list(codec.HEADER.unpack_from(raw, 58))
    fields[names.index(field)] = value
    codec.HEADER.pack_into(raw, 58, *fields)
    want = _one_at_a_time(bytes(raw), 0, len(raw), 3, accept_zero_crc)
    try:
        got = codec.decode_entries(bytes(raw), 0, len(raw), 3, accept_zero_crc=accept_zero_crc)
    except CodecError as exc:
        got = ("error", type(exc), str(exc), exc.number)
    assert got == want


@pytest.mark.parametrize("magics", [
    [],
    [EntryType.NORMAL] * 3,
    [EntryType.NOOP],
    [EntryType.NOOP, EntryType.NORMAL, EntryType.NORMAL],
    [EntryType.NORMAL, EntryType.NOOP, EntryType.NORMAL, EntryType.NOOP],
    [EntryType.NORMAL, EntryType.NORMAL, EntryType.NOOP],
])
def test_without_noops_keeps_every_other_entry_in_order_in_a_new_list(magics):
    """The commit feed's filter: NOOPs out, the rest in order, always a new list (listeners may keep it)."""
    from dledger.entry import EntryList, without_noops

    entries = EntryList([Entry(b"%d" % i, i, 1, 0, magic) for i, magic in enumerate(magics)])
    got = without_noops(entries)
    assert got == [e for e in entries if e.magic != EntryType.NOOP]
    assert type(got) is list and got is not entries
