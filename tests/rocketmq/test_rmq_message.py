"""CommitLog records: every record of the golden RocketMQ 4.9.8 stores byte for byte, ids, properties, limits."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import MIGRATION, STORE, golden_entries, index_rows
from dledger_rocketmq.common import message as m
from dledger_rocketmq.common.errors import CodecError, CorruptRecordError, RecordTooLargeError, TruncatedRecordError
from hypothesis import given
from hypothesis import strategies as st

ENTRIES = list(golden_entries(STORE / "dledger-n1" / "data"))
ROWS = {int(r["index"]): r for heading in ("### `dledger-n1/data/00000000000000000000`",
                                           "### `dledger-n1/data/00000000000000065536`")
        for r in index_rows(STORE / "INDEX.md", heading) if r["index"]}
OLD_FILE = (MIGRATION / "phase2-dledger" / "commitlog" / "00000000000000000000").read_bytes()


def test_golden_store_has_every_entry_of_its_index():
    """The golden n1 store holds the 177 entries its INDEX.md lists (guards the tests below)."""
    assert len(ENTRIES) == 177 and sorted(ROWS) == list(range(177))


@pytest.mark.parametrize("entry", ENTRIES, ids=lambda e: f"entry{e.index}")
def test_golden_record_round_trips_byte_for_byte(entry):
    """Each DLedger entry body decodes as a record that re-encodes to the same bytes, as INDEX.md describes."""
    record = m.decode_record(entry.body)
    assert m.encode_record(record) == entry.body
    row = ROWS[entry.index]
    assert record.size == len(entry.body) == int(row["record TOTALSIZE"])
    assert record.physical_offset == entry.pos + 48 == int(row["PHYSICALOFFSET (= pos+48?)"].split()[0])
    assert (record.topic, record.queue_id, record.queue_offset, record.sys_flag) == (
        row["topic"], int(row["q"]), int(row["qoffset"]), int(row["sysFlag"]))
    assert (record.tags or "") == row["tags"] and " ".join(record.keys) == row["keys"]
    assert record.body_crc == m.body_crc(record.body)
    assert record.message_id == "7F00000100007CA7" + f"{record.physical_offset:016X}"


def test_patching_offsets_in_place_gives_the_stored_record():
    """A record encoded with offsets 0 becomes the stored bytes once its physical and queue offsets are patched."""
    for entry in ENTRIES[:20]:
        stored = m.decode_record(entry.body)
        buf = bytearray(b"HDR" + m.encode_record(dataclasses.replace(stored, physical_offset=0, queue_offset=0)))
        m.patch_physical_offset(buf, 3, entry.pos + 48)
        m.patch_queue_offset(buf, 3, stored.queue_offset)
        assert bytes(buf[3:]) == entry.body


def test_golden_first_record_fields():
    """Entry 0's fields are those INDEX.md decodes (a table test of every field)."""
    r = m.decode_record(ENTRIES[0].body)
    assert r == m.MessageRecord(
        topic="GoldenTopic", body=b"Hello RocketMQ golden #1",
        properties=(b"color\x01red\x02KEYS\x01key-A1\x02UNIQ_KEY\x01FD000000000000000000000000000002792B5FFD2B2773622FC30000"
                    b"\x02CLUSTER\x01RaftCluster\x02TAGS\x01TagA\x02seq\x011"),
        queue_id=1, flag=0, queue_offset=0, physical_offset=48, sys_flag=0, born_timestamp=1795427014598,
        born_host=m.Address("127.0.0.1", 34518), store_timestamp=1795427014623,
        store_host=m.Address("127.0.0.1", 31911), reconsume_times=0, prepared_transaction_offset=0,
        body_crc=2096693289)
    assert r.message_id == "7F00000100007CA70000000000000030"
    assert r.property_map["seq"] == "1" and r.transaction_type == m.TRANSACTION_NOT_TYPE


def test_golden_compressed_record_inflates():
    """The 5000-byte body stored as 289 zlib bytes with sysFlag 0x301 inflates to the original text."""
    r = m.decode_record(ENTRIES[4].body)
    assert r.sys_flag == 0x301 and len(r.body) == 289
    body = m.uncompressed_body(r)
    assert len(body) == 5000 and body.startswith(b"line 0000: the quick brown fox")
    assert m.uncompressed_body(m.decode_record(ENTRIES[0].body)) == b"Hello RocketMQ golden #1"


def test_golden_retry_record_keeps_reconsume_times_and_origin_id():
    """A send-back into %RETRY% stores reconsume times 1 and the original message's offsetMsgId."""
    r = m.decode_record(ENTRIES[174].body)
    assert r.topic == "%RETRY%golden_pull_cg" and r.reconsume_times == 1
    assert r.property_map["ORIGIN_MESSAGE_ID"] == m.decode_record(ENTRIES[1].body).message_id


def test_golden_old_commitlog_records_and_blank():
    """The migrated store's old CommitLog: 5 records of 262 bytes at 0..1048, then a blank of 64226 bytes."""
    steps = list(m.scan_records(OLD_FILE + bytes(65536 - len(OLD_FILE))))
    assert [(s.position, s.size) for s in steps] == [(0, 262), (262, 262), (524, 262), (786, 262), (1048, 262),
                                                    (1310, 64226)]
    assert steps[-1].record is None
    for s in steps[:-1]:
        assert m.encode_record(s.record) == OLD_FILE[s.position:s.position + s.size]
        assert s.record.physical_offset == s.position
    assert m.encode_blank_record(64226) == OLD_FILE[1310:1318]
    assert m.decode_blank_record(OLD_FILE, 1310) == 64226
    assert steps[0].record.message_id == "7F000001000084770000000000000000"


def test_scan_stops_at_unwritten_bytes_and_buffer_end():
    """Zero TOTALSIZE (never written) and the end of the buffer end the data; neither is an error."""
    rec = m.encode_record(m.MessageRecord("T", b"x"))
    assert [(s.position, s.size, s.record is None) for s in m.scan_records(rec + bytes(100))] == [
        (0, len(rec), False), (len(rec), 0, True)]
    assert [(s.position, s.record is None) for s in m.scan_records(rec + b"\0\0")] == [(0, False), (len(rec), True)]


# -- message ids ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("host, offset, expected", [
    (m.Address("127.0.0.1", 31911), 48, "7F00000100007CA70000000000000030"),
    (m.Address("127.0.0.1", 33911), 0, "7F000001000084770000000000000000"),
    (m.Address("192.0.2.2", 10911), 2**40, "C000020200002A9F0000010000000000"),
    (m.Address("fd00::2", 10911), 65584, "FD000000000000000000000000000002" "00002A9F" "0000000000010030"),
])
def test_message_id(host, offset, expected):
    """offsetMsgId = uppercase hex of store IP + port + physical offset (32 chars IPv4, 56 chars IPv6)."""
    assert m.message_id(host, offset) == expected
    assert m.parse_message_id(expected) == (host, offset)
    assert m.parse_message_id(expected.lower()) == (host, offset)


@pytest.mark.parametrize("bad, error", [("XYZ", "not hex"), ("7F000001", "8 hex digits"), ("", "0 hex digits")])
def test_bad_message_ids(bad, error):
    """A string that is not an offsetMsgId is a one-line CodecError."""
    with pytest.raises(CodecError, match=error):
        m.parse_message_id(bad)


# -- properties -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("raw, parsed", [
    (b"", {}),
    (b"TAGS\x01TagA", {"TAGS": "TagA"}),
    (b"TAGS\x01TagA\x02", {"TAGS": "TagA"}),  # ali-ons ends with a separator
    (b"A\x011\x02B\x012\x02A\x013", {"A": "3", "B": "2"}),  # last value wins
    (b"noval\x02\x01x\x02K\x01\x02", {}),  # items without a separator, a name or a value are skipped
    (b"K\x01v\x01w\x02\x02L\x01x", {"K": "v\x01w", "L": "x"}),  # the first \x01 separates
    ("KEYS\x01k1 k2 \u00e9".encode(), {"KEYS": "k1 k2 \u00e9"}),
])
def test_parse_properties(raw, parsed):
    """The property map view follows RocketMQ: name\\x01value\\x02..., tolerant of a trailing separator."""
    assert m.parse_properties(raw) == parsed


def test_encode_properties_keeps_order_without_trailing_separator():
    """Encoded properties keep the given order and end without \\x02, as Java clients send them."""
    assert m.encode_properties({"KEYS": "k", "TAGS": "T"}) == b"KEYS\x01k\x02TAGS\x01T"
    assert m.encode_properties([("b", "2"), ("a", "1")]) == b"b\x012\x02a\x011"
    assert m.encode_properties({}) == b""


@pytest.mark.parametrize("props, error", [
    ({"a\x01": "1"}, "separator"), ({"a": "x\x02y"}, "separator"), ({"": "v"}, "empty name"),
    ({"k": ""}, "'k' has an empty value"),
    ({"k": "v" * 40000}, "exceed 32767"),
])
def test_encode_properties_refuses_what_would_not_read_back(props, error):
    """Separators inside names/values, empty names and over-long strings are refused with a one-line error."""
    with pytest.raises(CodecError, match=error):
        m.encode_properties(props)


# -- hosts and sysFlag bits -------------------------------------------------------------------------------

def test_ipv6_hosts_set_the_sysflag_bits_and_round_trip():
    """IPv6 born/store hosts take 16+4 bytes and the 0x10/0x20 sysFlag bits; the record round-trips."""
    born, store = m.Address("fd00::2", 40000), m.Address("::1", 10911)
    flag = m.host_flags(m.COMPRESSED_FLAG, born, store)
    assert flag == m.COMPRESSED_FLAG | m.BORNHOST_V6_FLAG | m.STOREHOST_V6_FLAG
    rec = m.MessageRecord("T", b"body", sys_flag=flag, born_host=born, store_host=store, physical_offset=7)
    data = m.encode_record(rec)
    assert len(data) == 91 + 24 + 4 + 1 == rec.size
    back = m.decode_record(data)
    assert back == dataclasses.replace(rec, body_crc=m.body_crc(b"body"))
    assert back.message_id == "00000000000000000000000000000001" "00002A9F" "0000000000000007"
    assert m.host_flags(flag, m.Address("1.2.3.4", 1), store) == m.COMPRESSED_FLAG | m.STOREHOST_V6_FLAG


def test_host_family_must_match_sysflag():
    """A v6 host without its sysFlag bit (or the reverse) is refused: it would be decoded with the wrong length."""
    with pytest.raises(CodecError, match="bornHost .* does not match sysFlag"):
        m.encode_record(m.MessageRecord("T", b"", born_host=m.Address("::1", 1)))
    with pytest.raises(CodecError, match="storeHost .* does not match sysFlag"):
        m.encode_record(m.MessageRecord("T", b"", sys_flag=m.STOREHOST_V6_FLAG))


@pytest.mark.parametrize("born, store", [
    (m.Address("127.0.0.1", 5555), m.Address("10.0.0.1", 10911)),
    (m.Address("fd00::2", 40000), m.Address("10.0.0.1", 10911)),
    (m.Address("127.0.0.1", 5555), m.Address("::1", 10911)),
    (m.Address("fd00::2", 40000), m.Address("::1", 10911)),
])
def test_encode_overrides_equal_encoding_the_replaced_record(born, store):
    """encode_record's queue/physical offset and store-host overrides give the bytes of the replaced record."""
    rec = m.MessageRecord("T", b"body", b"TAGS\x01A", queue_id=3, sys_flag=m.host_flags(0, born, born),
                          born_host=born, born_timestamp=17)
    replaced = dataclasses.replace(rec, queue_offset=9, physical_offset=123, store_host=store,
                                   sys_flag=m.host_flags(rec.sys_flag, born, store))
    assert m.encode_record(rec, queue_offset=9, physical_offset=123, store_host=store) == m.encode_record(replaced)


def test_encode_override_out_of_range_names_the_field():
    """An override that does not fit its field is refused with the field's name, like a record's own value."""
    with pytest.raises(CodecError, match="queueOffset .* does not fit an int64"):
        m.encode_record(m.MessageRecord("T", b""), queue_offset=2**63)


# -- limits and bad bytes ---------------------------------------------------------------------------------

GOOD = m.encode_record(m.MessageRecord("Topic", b"hello", b"TAGS\x01A"))  # 107 bytes; BODYLEN at 84, TOPICLEN at 93


@pytest.mark.parametrize("record, kwargs, error, kind", [
    (m.MessageRecord("", b""), {}, "topic is empty", CodecError),
    (m.MessageRecord("t" * 128, b""), {}, "topic of 128 bytes exceeds 127", RecordTooLargeError),
    (m.MessageRecord("T", b"", b"x" * 32768), {}, "properties of 32768 bytes exceed 32767", RecordTooLargeError),
    (m.MessageRecord("T", b"x" * 100), {"max_size": 150}, "192 bytes exceeds the maximum message size 150",
     RecordTooLargeError),
    (m.MessageRecord("T", b"", queue_id=2**31), {}, "queueId 2147483648 does not fit an int32", CodecError),
    (m.MessageRecord("T", b"", queue_offset=-2**63 - 1), {}, "queueOffset .* does not fit an int64", CodecError),
    (m.MessageRecord("T", b"", born_host=m.Address("localhost", 1)), {}, "not an IP address", CodecError),
    (m.MessageRecord("T", b"", store_host=m.Address("1.2.3.4", -1)), {}, "port -1 out of range", CodecError),
])
def test_encode_limits(record, kwargs, error, kind):
    """What a RocketMQ record cannot hold is refused with a one-line error of the right class."""
    with pytest.raises(kind, match=error) as info:
        m.encode_record(record, **kwargs)
    assert "\n" not in str(info.value)


def _patched(data: bytes, pos: int, raw: bytes) -> bytes:
    return data[:pos] + raw + data[pos + len(raw):]


@pytest.mark.parametrize("data, kwargs, error, kind", [
    (GOOD[:6], {}, "need 8 bytes", TruncatedRecordError),
    (GOOD[:-1], {}, f"only {len(GOOD) - 1} available", TruncatedRecordError),
    (_patched(GOOD, 4, b"\0\0\0\0"), {}, "bad magic 0x00000000", CorruptRecordError),
    (m.encode_blank_record(500), {}, "blank record", CorruptRecordError),
    (_patched(GOOD, 0, (60).to_bytes(4, "big")), {}, "smaller than a record's fixed fields", CorruptRecordError),
    (GOOD, {"max_size": 100}, f"{len(GOOD)} bytes exceeds the maximum message size 100", RecordTooLargeError),
    (_patched(GOOD, 8, b"\0\0\0\1"), {}, "BODYCRC mismatch", CorruptRecordError),
    (_patched(GOOD, 84, b"\0\0\0\6"), {}, "add up to|run past", CorruptRecordError),
    (_patched(GOOD, 84, b"\xff\xff\xff\xff"), {}, "negative BODYLEN", CorruptRecordError),
    (_patched(GOOD, 93, b"\x80"), {}, "TOPICLEN 128", CorruptRecordError),
    (_patched(GOOD, 94, b"\xff"), {}, "not UTF-8", CorruptRecordError),
    (_patched(GOOD + b"\0", 0, (len(GOOD) + 1).to_bytes(4, "big")), {},
     f"add up to {len(GOOD)}, TOTALSIZE says {len(GOOD) + 1}", CorruptRecordError),
])
def test_decode_rejects_bad_bytes(data, kwargs, error, kind):
    """Torn, foreign or inconsistent bytes are a one-line CodecError naming what is wrong, never a bad record."""
    with pytest.raises(kind, match=error) as info:
        m.decode_record(data, **kwargs)
    assert "\n" not in str(info.value) and isinstance(info.value, CodecError)


def test_decode_without_crc_check_and_at_an_offset():
    """verify_crc=False reads a record whose CRC is wrong; offsets inside a bigger buffer work."""
    bad = _patched(GOOD, 8, b"\0\0\0\1")
    assert m.decode_record(bad, verify_crc=False).body_crc == 1
    assert m.decode_record(b"pad" + GOOD, 3).topic == "Topic"


def test_blank_record_limits():
    """A blank record needs 8 bytes; anything else at its place is not a blank."""
    with pytest.raises(CodecError, match="at least 8"):
        m.encode_blank_record(7)
    with pytest.raises(CorruptRecordError, match="not a blank record"):
        m.decode_blank_record(GOOD)


def test_unsupported_compression_is_refused():
    """Only ZLIB bodies can be inflated; LZ4/ZSTD and broken zlib are clear errors."""
    with pytest.raises(CodecError, match="compression type 1"):
        m.uncompressed_body(m.MessageRecord("T", b"x", sys_flag=m.COMPRESSED_FLAG | 0x100))
    with pytest.raises(CorruptRecordError, match="does not inflate"):
        m.uncompressed_body(m.MessageRecord("T", b"not zlib", sys_flag=m.COMPRESSED_FLAG))


# -- round trip -------------------------------------------------------------------------------------------

_ip4 = st.ip_addresses(v=4).map(str)
_ip6 = st.ip_addresses(v=6).map(str)
_hosts = st.builds(m.Address, st.one_of(_ip4, _ip6), st.integers(0, 65535))
_i32 = st.integers(-(2**31), 2**31 - 1)
_i64 = st.integers(-(2**63), 2**63 - 1)
_text = st.text(st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)), max_size=20)


@st.composite
def records(draw):
    born, store = draw(_hosts), draw(_hosts)
    props = draw(st.dictionaries(_text.filter(bool), _text.filter(bool), max_size=5))
    return m.MessageRecord(
        topic=draw(st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)),
        body=draw(st.binary(max_size=300)), properties=m.encode_properties(props),
        queue_id=draw(_i32), flag=draw(_i32), queue_offset=draw(_i64), physical_offset=draw(_i64),
        sys_flag=m.host_flags(draw(_i32), born, store), born_timestamp=draw(_i64), born_host=born,
        store_timestamp=draw(_i64), store_host=store, reconsume_times=draw(_i32),
        prepared_transaction_offset=draw(_i64))


@given(records())
def test_round_trip(record):
    """Any storable record decodes to itself (with its computed CRC) and its properties parse back."""
    data = m.encode_record(record)
    back = m.decode_record(data)
    assert back == dataclasses.replace(record, body_crc=m.body_crc(record.body))
    assert len(data) == record.size and m.encode_record(back) == data
    assert m.parse_properties(back.properties) == m.parse_properties(record.properties)


@given(st.dictionaries(_text.filter(bool), _text.filter(bool), max_size=8))
def test_properties_round_trip(props):
    """Encoded properties parse back to the same map."""
    assert m.parse_properties(m.encode_properties(props)) == props


_prop_bytes = st.lists(st.sampled_from([b"TAGS", b"\x01", b"\x02", b"A", b"xTAGS", b"\xff", b"\xc3", b"KEYS", b""]),
                       max_size=12).map(b"".join)


@given(_prop_bytes)
def test_property_value_agrees_with_parse_properties(raw):
    """property_value reads one property exactly as parse_properties does, on any bytes (repeats, junk, UTF-8)."""
    assert m.property_value(raw, "TAGS") == m.parse_properties(raw).get("TAGS")


@pytest.mark.parametrize("raw, value", [
    (b"TAGS\x01A", "A"), (b"KEYS\x01k\x02TAGS\x01B\x02", "B"), (b"xTAGS\x01A", None), (b"TAGS\x01\x02TAGS\x01C", "C"),
    (b"TAGS\x01A\x02TAGS\x01", "A"), (b"TAGS\x01A\x01B", "A\x01B"), (b"", None), (b"TAGS", None),
])
def test_property_value_table(raw, value):
    """Only an item starting with ``TAGS\\x01`` and a non-empty value counts; the last one wins."""
    assert m.property_value(raw, "TAGS") == value
