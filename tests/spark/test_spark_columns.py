"""A binary GET reply decoded straight into columns (dledger_spark.columns): the same entries and the same
refusals as the entry codec's decode of the reply, and the read loop on columns (no Spark session)."""

import struct

import pytest

from dledger.codes import ResponseCode
from dledger.entry import Entry, EntryType
from dledger.errors import DLedgerError
from dledger.messages import GetEntriesRawResponse, GetEntriesResponse
from dledger.transport import remoting
from dledger.transport.remoting import BinaryBodyError, Frame, Header

pytest.importorskip("dledger_spark", reason="dledger-spark is not installed (pip install -e spark)")

from dledger_spark import columns
from dledger_spark.reader import Partition, fetch_columns, read_entries, read_partition

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"


def entries_of(sizes, first=5, zero_crc=()):
    out, pos = [], 1000
    for i, size in enumerate(sizes):
        e = Entry(bytes((first + i + k) % 256 for k in range(size)), first + i, 3, pos)
        out.append(e if i in zero_crc else e.sealed())
        pos += e.size
    return out


def reply_body(entries):
    return remoting.encode_get_reply_binary(GetEntriesResponse(entries=entries))


def decoded(entries):
    return columns.from_reply(remoting.decode_get_reply_raw(reply_body(entries)))


@pytest.mark.parametrize("sizes, zero_crc", [
    ([1024] * 7, ()),  # one stride
    ([0, 3, 1024, 1, 5000], ()),  # walked header by header
    ([10] * 4, (2,)),  # a Java entry without a body CRC
    ([], ()),
], ids=["same-size", "mixed-sizes", "zero-crc", "empty"])
def test_columns_hold_what_the_entry_codec_decodes(sizes, zero_crc):
    """index, term, pos and body of every entry equal decode_get_reply_binary's Entry objects."""
    entries = entries_of(sizes, zero_crc=zero_crc)
    want = remoting.decode_get_reply_binary(reply_body(entries)).entries
    cols = decoded(entries)
    assert len(cols) == len(want) == len(sizes)
    assert cols.index.tolist() == [e.index for e in want]
    assert cols.term.tolist() == [e.term for e in want]
    assert cols.pos.tolist() == [e.pos for e in want]
    assert cols.body.to_pylist() == [e.body for e in want]


def _damage(body, at, value, fmt=">i"):
    """``body`` with ``value`` written at ``at`` bytes into its entry section (section CRC recomputed: the
    damage is in what the member sent, not in transit)."""
    import crc32c

    buf = bytearray(body)
    meta_len = struct.unpack_from(">I", buf, 2)[0]
    start = 14 + meta_len
    struct.pack_into(fmt, buf, start + at, value)
    struct.pack_into(">I", buf, 10, crc32c.crc32c(bytes(buf[start:])))
    return bytes(buf)


@pytest.mark.parametrize("sizes, at, value, fmt, reason", [
    ([64] * 3, 0, 7777, ">i", "unknown magic"),
    ([64] * 3, 112 + 0, 7777, ">i", "entry #1 .*unknown magic"),  # the second entry (48 + 64 bytes in)
    ([64, 10, 64], 112 + 44, 11, ">i", "size != header"),  # bodySize disagrees with size
    ([64] * 3, 8, -4, ">q", "negative index"),
    ([64] * 3, 16, 2 ** 63 - 1, ">q", "term past"),
    ([64] * 3, 48 + 5, 0x41, ">B", "crc32c mismatch"),  # a body byte
    ([64] * 3, 112 + 4, 113, ">i", "size"),  # the second entry's size runs into the third
    ([64, 10, 64], 112 + 4, 4000, ">i", "does not fit"),  # past the section
], ids=["magic", "magic-2nd", "body-size", "negative", "term-bound", "crc", "overlap", "past-end"])
def test_columns_refuse_what_the_entry_codec_refuses(sizes, at, value, fmt, reason):
    """Each damaged reply: decode_get_reply_binary refuses it, and so does the column decoder, naming why."""
    body = _damage(reply_body(entries_of(sizes)), at, value, fmt)
    with pytest.raises(BinaryBodyError):
        remoting.decode_get_reply_binary(body)
    with pytest.raises(columns.CorruptReplyError, match=reason):
        columns.from_reply(remoting.decode_get_reply_raw(body))


def test_trailing_bytes_and_transit_damage_are_refused():
    """Bytes after the announced entries are refused by the decoder; a section damaged in transit (its CRC)
    already by decode_get_reply_raw."""
    entries = entries_of([64] * 2)
    with pytest.raises(columns.CorruptReplyError, match="bytes after"):
        columns.decode_section(reply_body(entries)[-(2 * 112):] + b"\0" * 60, 2)
    body = bytearray(reply_body(entries))
    body[-1] ^= 1
    with pytest.raises(BinaryBodyError, match="crc32c"):
        remoting.decode_get_reply_raw(bytes(body))


def test_below_cuts_at_the_end_index():
    cols = decoded(entries_of([20] * 6, first=10))
    assert cols.below(13).index.tolist() == [10, 11, 12] and cols.below(13).body.to_pylist() == \
        [e.body for e in entries_of([20] * 3, first=10)]
    assert cols.below(100) is cols and len(cols.below(10)) == 0


def test_a_json_reply_becomes_the_raw_form_with_its_entries():
    """A member answering the GET in JSON: the raw response carries its decoded entries and no section."""
    entries = entries_of([5, 6])
    body = remoting.encode_body(GetEntriesResponse(entries=entries))
    frame = Frame(Header(remoting.REMOTING_SUCCESS, 1, remoting.FLAG_RESPONSE), body)
    resp = remoting.decode_response(frame, GetEntriesRawResponse)
    assert isinstance(resp, GetEntriesRawResponse) and resp.section is None and resp.entries == entries
    assert columns.from_reply(resp).index.tolist() == [5, 6]


class RawClient:
    """Serves get_raw from a list of entries as binary replies of 3 entries, scripted replies first."""

    def __init__(self, entries, scripted=()):
        self.entries = {e.index: e for e in entries}
        self.scripted = list(scripted)
        self.calls = []

    def get_raw(self, index, count=1, member=None):
        self.calls.append((index, member))
        if self.scripted:
            return remoting.decode_get_reply_raw(self.scripted.pop(0))
        got = [self.entries[i] for i in range(index, min(index + 3, max(self.entries) + 1)) if i in self.entries]
        return remoting.decode_get_reply_raw(reply_body(got))


def test_read_loop_on_columns_reads_the_range_once_and_retries_a_damaged_reply():
    """fetch_columns: every index of [start, end) once (NOOP gaps skipped, the member's extra cut off); a
    reply failing its entry checks is asked for again, as the plain client's undecodable reply is."""
    entries = [e for e in entries_of([30] * 12, first=0) if e.index not in (4, 5)]
    bad = _damage(reply_body(entries[2:5]), 48 + 1, 0x41, ">B")
    client = RawClient(entries, scripted=[reply_body(entries[:2]), bad])
    got = read_entries(Partition("g", PEERS, 0, 10), client, clock=iter(range(10 ** 6)).__next__,
                       fetch=fetch_columns)
    assert [i for cols in got for i in cols.index.tolist()] == [0, 1, 2, 3, 6, 7, 8, 9]
    assert [i for i, _ in client.calls] == [0, 2, 2, 4, 7]  # 0-1, the bad one, again 2-3, 6 (4, 5 NOOPs), 7-9


def test_fetch_columns_names_a_damaged_reply_as_a_network_error():
    bad = _damage(reply_body(entries_of([30] * 2)), 0, 99, ">i")
    with pytest.raises(DLedgerError, match="undecodable GET reply") as err:
        fetch_columns(RawClient([], scripted=[bad]), Partition("g", PEERS, 0, 2), 0, 2, None)
    assert err.value.code is ResponseCode.NETWORK_ERROR


def test_read_partition_gives_the_raw_formats_batches():
    """read_partition on columns: the raw schema's record batches, same rows as the Entry path would give."""
    from dledger_spark.schema import arrow_batch

    entries = entries_of([40] * 7, first=0) + [Entry(b"", 7, 3, 9999, int(EntryType.NORMAL)).sealed()]
    batches = list(read_partition(Partition("g", PEERS, 0, 8), RawClient(entries)))
    assert [b.num_rows for b in batches] == [3, 3, 2]
    want = arrow_batch("raw", "g", entries, 0.0)
    for name in ("group", "index", "term", "pos", "body"):
        assert sum((b.column(name).to_pylist() for b in batches), []) == want.column(name).to_pylist()
    assert batches[0].schema == want.schema
