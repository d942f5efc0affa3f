"""The plugin's optional C speedups give the pure-Python reference's answers (dledger_rocketmq/common/native.py).

Each C function is run beside its Python reference on the same inputs: golden records, generated records, and
records damaged field by field and byte by byte.  Skipped where the extension is not built (an install without
a compiler) or refused (``DLEDGER_PURE=1``): the reference is then what runs.
"""

from __future__ import annotations

import random
import re
import struct

import pytest
from conftest import STORE, golden_entries
from dledger_rocketmq.common import batch as b
from dledger_rocketmq.common import message as m
from dledger_rocketmq.common import native
from dledger_rocketmq.common.errors import CodecError
from dledger_rocketmq.common.message import Address, MessageRecord, encode_record
from dledger_rocketmq.store import dispatch
from hypothesis import given
from hypothesis import strategies as st

ext = native.speedups
needs_ext = pytest.mark.skipif(ext is None, reason="the C extension is not built here, or DLEDGER_PURE=1")


def test_dledger_pure_refuses_the_extension_and_its_absence_is_no_error():
    """DLEDGER_PURE=1 is the one switch to pure Python; without it the built module is used."""
    assert native.load_speedups({"DLEDGER_PURE": "1"}) is None
    if ext is not None:
        assert native.load_speedups({}) is ext and native.load_speedups({"DLEDGER_PURE": "0"}) is ext
    expected = dispatch.quick_unit if ext is None else ext.quick_unit
    assert dispatch.fast_quick_unit is expected


def _both(body):
    """The C answer and the Python one, for the same body."""
    return ext.quick_unit(body), dispatch.quick_unit(body)


@needs_ext
def test_quick_unit_in_c_on_every_golden_record():
    """Every record of the recorded deployment: the same answer (and most of them answered)."""
    answered = 0
    for entry in golden_entries(STORE / "dledger-n1" / "data"):
        c, py = _both(bytes(entry.body))
        assert c == py
        answered += c is not None
    assert answered > 100


def _record(props: bytes, body: bytes = b"m", **kw) -> bytes:
    return encode_record(MessageRecord(topic=kw.pop("topic", "T"), body=body, properties=props, queue_id=3,
                                       queue_offset=7, physical_offset=4096, **kw))


def _with(raw: bytes, at: int, fmt: str, value: int) -> bytes:
    """``raw`` with one header field overwritten (MAGIC at 4, TOTALSIZE at 0, BODYLEN at 84)."""
    out = bytearray(raw)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


_CASES = [
    _record(b"TAGS\x01TagA"), _record(b""), _record(b"KEYS\x01k\x02TAGS\x01B\x02UNIQ_KEY\x01u"),
    _record(b"XTAGS\x01x"), _record(b"TAGS\x01a\x02TAGS\x01b"), _record(b"TAGS\x01"), _record(b"TAGS\x01\x02x"),
    _record(b"a\x02TAGS\x01b"), _record(b"TAGS\x01TAGS\x01"), _record(b"KEYS\x01TAGS\x01x"),
    _record(b"", topic="SCHEDULE_TOPIC_XXXX"), _record(b"", topic="SCHEDULE_TOPIC_XXX"),
    _record(b"", sys_flag=0x4), _record(b"", sys_flag=0x8), _record(b"", sys_flag=0xC), _record(b"", sys_flag=0x3),
    _record(b"", sys_flag=0x10, born_host=Address("::1", 1)), _record(b"TAGS\x01\xc3\xa9"),
    b"", b"\0" * 88, b"\xff" * 200,
    *(_with(_record(b"TAGS\x01A"), at, fmt, value) for at, fmt, value in [
        (4, ">i", 0), (4, ">i", -875286124), (0, ">i", 0), (84, ">i", -1), (84, ">i", 2**31 - 1), (84, ">i", 2)]),
]


@needs_ext
@pytest.mark.parametrize("body", _CASES, ids=[str(i) for i in range(len(_CASES))])
def test_quick_unit_in_c_on_the_special_cases(body):
    """Tags in every position, schedule topic, transactions, IPv6 hosts, empty and junk bodies."""
    c, py = _both(body)
    assert c == py


@needs_ext
def test_quick_unit_in_c_hands_other_buffers_to_python():
    """A body that is not exactly bytes gets the Python function's answer, in its types."""
    body = bytearray(_record(b"TAGS\x01A"))
    assert ext.quick_unit(body) == dispatch.quick_unit(body)
    assert type(ext.quick_unit(body)[0]) is type(dispatch.quick_unit(body)[0])


#: Offsets of the header fields quick_unit reads (TOTALSIZE, MAGIC, QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, SYSFLAG,
#: BODYLEN): damage aimed there, and anywhere.
_FIELDS = [0, 3, 4, 7, 12, 15, 20, 27, 28, 35, 36, 39, 84, 85, 87]


@needs_ext
@given(props=st.lists(st.tuples(st.sampled_from([b"TAGS", b"KEYS", b"XTAGS", b"TAG", b""]),
                                st.binary(max_size=4)), max_size=4),
       body=st.binary(max_size=30), topic=st.sampled_from(["T", "SCHEDULE_TOPIC_XXXX", "t" * 127]),
       sys_flag=st.sampled_from([0, 0x4, 0x8, 0xC, 0x1, 0x2]),
       damage=st.lists(st.tuples(st.sampled_from(_FIELDS) | st.integers(0, 400), st.integers(0, 255)), max_size=3),
       cut=st.integers(-3, 3))
def test_quick_unit_in_c_on_damaged_records(props, body, topic, sys_flag, damage, cut):
    """Generated records, then bytes overwritten (header fields, lengths, properties), cut or extended."""
    raw_props = b"\x02".join(k + b"\x01" + v for k, v in props)
    raw = bytearray(_record(raw_props, body, topic=topic, sys_flag=sys_flag))
    for at, value in damage:
        if at < len(raw):
            raw[at] = value
    raw = raw[:len(raw) + cut] if cut < 0 else raw + b"\x02" * cut
    c, py = _both(bytes(raw))
    assert c == py


@needs_ext
@given(st.integers(-(2**31), 2**31 - 1), st.integers(-(2**63), 2**63 - 1), st.integers(-(2**31), 2**31 - 1))
def test_quick_unit_in_c_on_extreme_field_values(qid, qoff, body_len):
    """Queue ids and offsets over their whole signed range; BODYLEN anything (negative, past the end)."""
    raw = bytearray(_record(b"TAGS\x01x", b"0123"))
    struct.pack_into(">i", raw, 12, qid)
    struct.pack_into(">q", raw, 20, qoff)
    struct.pack_into(">q", raw, 28, qoff ^ 0x5555)
    c, py = _both(bytes(raw))
    assert c == py and c is not None
    struct.pack_into(">i", raw, 84, body_len)
    c, py = _both(bytes(raw))
    assert c == py


# -- encode_batch: encode_batch_records' loop -------------------------------------------------------------------

def _pure_encode(template, items, **kw):
    """encode_batch_records with the C part switched off (its module's ``speedups`` None): the reference."""
    saved, m.speedups = m.speedups, None
    try:
        return m.encode_batch_records(template, items, **kw)
    finally:
        m.speedups = saved


def _same_as_pure(template, items, **kw):
    """The records (or the CodecError) of encode_batch_records with the C part and without it are the same."""
    try:
        want = _pure_encode(template, items, **kw)
    except CodecError as exc:
        with pytest.raises(type(exc), match=re.escape(str(exc))):
            m.encode_batch_records(template, items, **kw)
        return None
    got = m.encode_batch_records(template, items, **kw)
    assert got == want and all(type(r) is bytes for r in got)
    return got


_HOSTS = st.sampled_from([Address("127.0.0.1", 10911), Address("::1", 10911), Address("10.1.2.3", 1)])
_ITEM = st.tuples(st.binary(max_size=40), st.binary(max_size=30),
                  st.integers(-(2**31), 2**31 - 1) | st.sampled_from([2**31, -(2**31) - 1]))


@needs_ext
@given(items=st.lists(_ITEM, min_size=1, max_size=6), views=st.booleans(), topic=st.sampled_from(["T", "x" * 127]),
       born=_HOSTS, store=_HOSTS, sys_flag=st.sampled_from([0, 0x4, 0xC, 0x1]),
       first=st.integers(0, 2**40) | st.sampled_from([2**63 - 2, 2**63 - 1, 2**63, -1]),
       step=st.sampled_from([0, 1]), max_size=st.sampled_from([150, 200, 4096]),
       born_ts=st.sampled_from([77, 2**63 - 1, 2**63]), prepared=st.sampled_from([0, -1, 2**63]))
def test_encode_batch_in_c_equals_the_python_loop(items, views, topic, born, store, sys_flag, first, step, max_size,
                                                  born_ts, prepared):
    """Tuples with bytes or memoryview bodies (batch_views' shape): the same bytes or the same CodecError, with
    limits, flags, queue offsets and fields at and past their ranges."""
    if views:
        items = [(memoryview(b), p, f) for b, p, f in items]
    template = MessageRecord(topic=topic, body=b"", queue_id=2, sys_flag=sys_flag, born_timestamp=born_ts,
                             born_host=born, reconsume_times=1, prepared_transaction_offset=prepared)
    _same_as_pure(template, items, first_queue_offset=first, queue_offset_step=step, store_host=store,
                  max_size=max_size)


@needs_ext
def test_encode_batch_in_c_does_the_leading_items_and_python_the_rest():
    """The C part stops at an item it does not take (a BatchItem, a bytearray, a flag out of range, a
    view of ints) and the loop continues there: the whole batch is the Python loop's."""
    template = MessageRecord(topic="T", body=b"", queue_id=1)
    host = Address("127.0.0.1", 1)
    odd = [b.BatchItem(b"x", b"p", 1), (bytearray(b"y"), b"", 0), (b"z", bytearray(b"q"), 0),
           (b"w", b"", 2**31), (memoryview(b"\0" * 8).cast("i"), b"", 0)]
    for k, item in enumerate(odd):
        items = [(b"a" * 10, b"KEYS\x01k", 0)] * 3 + [item] + [(b"b", b"", 5)] * 2
        partial = ext.encode_batch(items, 91 + 1, m.MESSAGE_MAGIC, 1, 0, 0, b"\0" * 24, 0, 0, b"\x01T", 0, 1, 4096,
                                   m.MAX_PROPERTIES_LENGTH)
        assert len(partial) == 3, k
        _same_as_pure(template, items, first_queue_offset=5, queue_offset_step=1, store_host=host)


@needs_ext
@pytest.mark.parametrize("case", ["stock batch", "properties too long", "queue offsets run out", "ipv6 hosts",
                                  "message too large"])
def test_encode_batch_in_c_on_a_stock_batch_and_at_the_limits(case):
    """A stock producer's batch (random 1 KiB bodies, batch_views of its body) and each limit met mid-batch."""
    rng = random.Random(7)
    items = [b.BatchItem(rng.randbytes(1024), b"UNIQ_KEY\x01%04d\x02WAIT\x01true" % i, rng.choice([0, 1]))
             for i in range(40)]
    host, first, max_size, born = Address("10.0.0.9", 10911), 1000, m.DEFAULT_MAX_MESSAGE_SIZE, Address("10.1.1.1", 5)
    if case == "properties too long":
        pass  # below
    elif case == "queue offsets run out":
        first = 2**63 - 25
    elif case == "ipv6 hosts":
        host, born = Address("::1", 10911), Address("fe80::1", 5)
    elif case == "message too large":
        max_size = 1100
        items[30] = b.BatchItem(b"y" * 1050, b"")
    views = b.batch_views(b.encode_batch(items))
    if case == "properties too long":  # no batch body can carry it: the put's items as batch_views makes them
        views[17] = (memoryview(b"x"), b"k\x01" + b"v" * 32766, 0)
    template = MessageRecord(topic="BenchTopic", body=b"", queue_id=3, sys_flag=0, born_timestamp=1764258000000,
                             born_host=born, store_timestamp=1764258000123)
    got = _same_as_pure(template, views, first_queue_offset=first, queue_offset_step=1, store_host=host,
                        max_size=max_size)
    assert (got is not None) is (case in ("stock batch", "ipv6 hosts"))
