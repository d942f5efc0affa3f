"""SEND_BATCH_MESSAGE bodies: the golden batch frame decodes, re-encodes, and becomes the stored records."""

from __future__ import annotations

import dataclasses
import json
import re
import struct

import pytest
from conftest import GOLDEN, STORE, golden_entries
from dledger_rocketmq.common import batch as b
from dledger_rocketmq.common import message as m
from dledger_rocketmq.common.errors import CodecError, CorruptRecordError, RecordTooLargeError, TruncatedRecordError
from hypothesis import given
from hypothesis import strategies as st


def golden_batch_frame() -> tuple[dict, bytes]:
    """Header and body of the recorded SEND_BATCH_MESSAGE (320) request."""
    frame = (GOLDEN / "frames" / "320-send-batch-message-request.bin").read_bytes()
    total, word = struct.unpack_from(">ii", frame)
    header_len = word & 0xFFFFFF
    assert total == len(frame) - 4 and word >> 24 == 0
    return json.loads(frame[8:8 + header_len]), frame[8 + header_len:]


HEADER, BODY = golden_batch_frame()
STORED = [e for e in golden_entries(STORE / "dledger-n1" / "data") if e.index in (5, 6, 7)]


def test_golden_batch_body_decodes_and_re_encodes():
    """The recorded batch body holds 3 messages (magic and CRC 0) and re-encodes to the same 471 bytes."""
    items = b.decode_batch(BODY)
    assert [i.body for i in items] == [b"golden batch message %d" % i for i in range(3)]
    assert all(i.flag == 0 for i in items)
    assert m.parse_properties(items[1].properties)["KEYS"] == "key-batch-1"
    assert b.encode_batch(items) == BODY and len(BODY) == 471


def test_golden_batch_becomes_the_stored_records():
    """Each batch message is stored with its own property string, consecutive queue offsets, the batch's fields."""
    items = b.decode_batch(BODY)
    stored = [m.decode_record(e.body) for e in STORED]
    assert HEADER["extFields"]["b"] == stored[0].topic and int(HEADER["extFields"]["e"]) == stored[0].queue_id
    records = b.batch_records(items, dataclasses.replace(stored[0], physical_offset=0))
    assert [r.queue_offset for r in records] == [1, 2, 3]
    for record, entry, original in zip(records, STORED, stored, strict=True):
        placed = dataclasses.replace(record, physical_offset=entry.pos + 48,
                                     store_timestamp=original.store_timestamp)
        assert m.encode_record(placed) == entry.body


@pytest.mark.parametrize("data, error, kind", [
    (b"\0" * 10, "needs 22 bytes, 10 left", TruncatedRecordError),
    (struct.pack(">iiiii", 10, 0, 0, 0, 0) + b"\0\0", "TOTALSIZE 10 / BODYLEN 0 inconsistent", CorruptRecordError),
    (struct.pack(">iiiii", 30, 0, 0, 0, 5) + b"hello\0\0", "30 bytes, 27 left", TruncatedRecordError),
    (struct.pack(">iiiii", 27, 0, 0, 0, -1) + b"\0" * 7, "BODYLEN -1", CorruptRecordError),
])
def test_decode_batch_rejects_malformed_bodies(data, error, kind):
    """A malformed batch body is a one-line CodecError with its offset, never a partial list."""
    with pytest.raises(kind, match=error):
        b.decode_batch(data)


def test_decode_batch_property_length_mismatch():
    """PROPERTIESLEN that disagrees with TOTALSIZE is corruption."""
    data = struct.pack(">iiiii", 29, 0, 0, 0, 5) + b"hello" + struct.pack(">h", 3) + b"ab"
    with pytest.raises(CorruptRecordError, match="add up to 30, TOTALSIZE says 29"):
        b.decode_batch(data)


def test_batch_limits():
    """Too many messages or over-long properties are refused."""
    one = b.encode_batch([b.BatchItem(b"x")])
    with pytest.raises(RecordTooLargeError, match="more than 2 messages"):
        b.decode_batch(one * 3, max_items=2)
    with pytest.raises(RecordTooLargeError, match="exceed 32767"):
        b.encode_batch([b.BatchItem(b"", b"p" * 32768)])
    with pytest.raises(CodecError, match="does not fit an int32"):
        b.encode_batch([b.BatchItem(b"", b"", 2**31)])
    assert b.decode_batch(b"") == []


@given(st.lists(st.builds(b.BatchItem, st.binary(max_size=50), st.binary(max_size=50),
                          st.integers(-(2**31), 2**31 - 1)), max_size=10))
def test_batch_round_trip(items):
    """Any list of batch messages decodes back to itself."""
    assert b.decode_batch(b.encode_batch(items)) == items


def _one_at_a_time(template, items, first, step, host, max_size=m.DEFAULT_MAX_MESSAGE_SIZE):
    """What the put path stored before batches were encoded together: encode_record of each batch record."""
    return [m.encode_record(r, max_size=max_size, queue_offset=first + i * step, physical_offset=0, store_host=host)
            for i, r in enumerate(b.batch_records(items, template))]


def test_batch_records_encoded_together_equal_the_golden_ones():
    """encode_batch_records of the recorded batch gives the stored records (placed as the hook places them)."""
    items = b.decode_batch(BODY)
    stored = [m.decode_record(e.body) for e in STORED]
    template = dataclasses.replace(stored[0], physical_offset=0)
    bodies = m.encode_batch_records(template, items, first_queue_offset=1, queue_offset_step=1,
                                    store_host=stored[0].store_host)
    for body, entry, original in zip(bodies, STORED, stored, strict=True):
        placed = m.decode_record(body)
        placed = dataclasses.replace(placed, physical_offset=entry.pos + 48, store_timestamp=original.store_timestamp)
        assert m.encode_record(placed) == entry.body


_HOSTS = st.sampled_from([m.Address("127.0.0.1", 10911), m.Address("::1", 10911), m.Address("10.1.2.3", 1)])


@given(items=st.lists(st.builds(b.BatchItem, st.binary(max_size=40), st.binary(max_size=30),
                                st.integers(-(2**31), 2**31 - 1) | st.just(2**31)), min_size=1, max_size=6),
       topic=st.sampled_from(["T", "topic-\u00e9", "x" * 127, "", "y" * 128]),
       born=_HOSTS, store=_HOSTS, sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1]),
       first=st.integers(0, 2**40), step=st.sampled_from([0, 1]), max_size=st.sampled_from([200, 4096]))
def test_batch_records_encoded_together_equal_one_at_a_time(items, topic, born, store, sys_flag, first, step,
                                                            max_size):
    """Byte for byte what encode_record gives for each record, and the same CodecError where that refuses one."""
    template = m.MessageRecord(topic=topic, body=b"", queue_id=2, sys_flag=sys_flag, born_timestamp=77,
                               born_host=born, reconsume_times=1)
    try:
        want = _one_at_a_time(template, items, first, step, store, max_size)
    except CodecError as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            m.encode_batch_records(template, items, first_queue_offset=first, queue_offset_step=step,
                                   store_host=store, max_size=max_size)
        return
    assert m.encode_batch_records(template, items, first_queue_offset=first, queue_offset_step=step,
                                  store_host=store, max_size=max_size) == want


def test_message_ids_are_message_id_of_each_offset():
    """A batch's ids computed together equal message_id of each physical offset (IPv4 and IPv6 store hosts)."""
    for host in (m.Address("127.0.0.1", 10911), m.Address("::1", 7)):
        offsets = [0, 48, 1 << 40, 2**63 - 1]
        assert m.message_ids(host, offsets) == tuple(m.message_id(host, p) for p in offsets)


@given(st.lists(st.builds(b.BatchItem, st.binary(max_size=50), st.binary(max_size=50),
                          st.integers(-(2**31), 2**31 - 1)), max_size=10), st.integers(0, 30))
def test_batch_views_are_decode_batch_without_copies(items, cut):
    """batch_views gives decode_batch's messages (as views) and refuses exactly what it refuses."""
    body = b.encode_batch(items)
    for data in (body, body[:max(len(body) - cut, 0)]):
        try:
            want = b.decode_batch(data)
        except CodecError as exc:
            with pytest.raises(type(exc), match=re.escape(str(exc))):
                b.batch_views(data)
            continue
        assert [(bytes(x), bytes(y), f) for x, y, f in b.batch_views(data)] == [tuple(i) for i in want]


def _views(found):
    return [(bytes(x), y, f) for x, y, f in found]


@given(st.lists(st.builds(b.BatchItem, st.binary(max_size=40), st.binary(max_size=40),
                          st.integers(-(2**31), 2**31 - 1)), max_size=8),
       st.integers(0, 200), st.integers(0, 25), st.binary(min_size=1, max_size=4), st.integers(0, 12))
def test_batch_views_fast_path_equals_the_checked_one(items, at, cut, garbage, max_items):
    """batch_views' one-loop path gives checked_batch_views' items (properties as bytes) and raises exactly its
    errors, for whole bodies, cut ones, bodies with bytes overwritten anywhere (lengths that do not add up,
    a negative or over-long PROPERTIESLEN), and item limits; non-bytes bodies take the checked path."""
    body = b.encode_batch(items)
    at = min(at, len(body))
    spoiled = body[:at] + garbage + body[at + len(garbage):]
    for data in (body, body[:max(len(body) - cut, 0)], spoiled):
        for limit in (1 << 16, max_items):
            try:
                want = b.checked_batch_views(data, max_items=limit)
            except CodecError as exc:
                with pytest.raises(type(exc), match=re.escape(str(exc))):
                    b.batch_views(data, max_items=limit)
                continue
            got = b.batch_views(data, max_items=limit)
            assert _views(got) == _views(want) and all(type(y) is bytes for _, y, _ in got)
            assert _views(b.batch_views(bytearray(data), max_items=limit)) == _views(want)


@pytest.mark.parametrize("props_len_field", [-1, -32768, 0x7FFF + 1 - 65536, 5, 3])
def test_batch_views_refuses_a_properties_length_the_checked_path_refuses(props_len_field):
    """A PROPERTIESLEN that is negative as Java's short (0x8000-0xFFFF read unsigned) or off by any amount is
    refused by the fast path as by the checked one, even when TOTALSIZE was made to match its unsigned value."""
    unsigned = props_len_field & 0xFFFF
    for size in (22 + 2 + 4, 22 + 2 + unsigned):
        data = struct.pack(">iiiii", size, 0, 0, 0, 2) + b"hi" + struct.pack(">h", props_len_field) + b"p" * 4
        data = data.ljust(size, b"p")
        try:
            want = b.checked_batch_views(data)
        except CodecError as exc:
            with pytest.raises(type(exc), match=re.escape(str(exc))):
                b.batch_views(data)
        else:
            assert _views(b.batch_views(data)) == _views(want)


@given(items=st.lists(st.builds(b.BatchItem, st.binary(max_size=40), st.binary(max_size=30)), min_size=1, max_size=6),
       topic=st.sampled_from(["T", "topic-\u00e9", "x" * 127]), props=st.binary(max_size=20),
       sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC]))
def test_stored_batch_size_is_the_sum_over_the_views(items, topic, props, sys_flag):
    """From the lengths alone, the per-message sum the statistics counted: each record the template's fixed part
    (size less body and properties) plus its message's body and properties."""
    body = b.encode_batch(items)
    template = m.MessageRecord(topic=topic, body=body, properties=props, queue_id=1, sys_flag=sys_flag)
    views = b.batch_views(body)
    fixed = template.size - len(template.body) - len(template.properties)
    assert b.stored_batch_size(template, len(views)) == sum(fixed + len(v) + len(p) for v, p, _ in views)


@pytest.mark.parametrize("props, found", [
    ([b"", b"KEYS\x01k"], False), ([b"KEYS\x01k", b"DELAY\x013"], True), ([b"DELAY"], True), ([b"DEL", b"AY"], False),
    ([b"xDELAYx"], True), ([], False), ([b"DELA\x00Y"], False)])
def test_any_properties_contain_views_and_batch_items(props, found):
    """Tuples (batch_views) searched joined, BatchItems one by one: the same answer as a test per message, and a
    needle split over two messages is not found."""
    items = [b.BatchItem(b"body", p) for p in props]
    assert b.any_properties_contain(items, b"DELAY") is found
    assert b.any_properties_contain([tuple(i) for i in items], b"DELAY") is found
