"""The stock producer's send header read by one pattern (``fast_send_header``) gives the same Header, the same
extFields (values, order) and the same send arguments as the general rules, and every header the pattern does
not take is read, or refused with the same error, by the general rules (issue #28, Round 2f)."""

from __future__ import annotations

import random
import struct

import pytest
from conftest import GOLDEN
from dledger_rocketmq.broker.port import (
    SEND_BATCH_MESSAGE,
    SEND_MESSAGE_V2,
    ArgumentError,
    SendFields,
    decode_header,
    decode_json_header,
    fast_send_header,
    general_json_header,
    send_args,
)
from dledger_rocketmq.tools.bench_send import JAVA_HEADER

from dledger.transport.remoting import HeaderError

FRAMES = GOLDEN / "frames"


def _json_header(path) -> bytes:
    data = path.read_bytes()
    _, kind = struct.unpack_from(">iI", data)
    return data[8:8 + (kind & 0xFFFFFF)]


#: Every JSON send header the stock 4.9.8 producer wrote in the golden recordings (ali-ons' has another shape).
STOCK = sorted(p for p in FRAMES.glob("3[12]0-*-request.bin") if "alions" not in p.name and _json_header(p)[:1] == b"{")


def _view(header) -> tuple:
    """Everything a Header carries, extFields as their items in order (a SendFields compares as a plain dict)."""
    ext = header.ext_fields
    return (header.code, header.opaque, header.flag, header.language, header.version, header.remark,
            header.serialize_type, None if ext is None else list(ext.items()))


def _outcome(fn, *args):
    try:
        return fn(*args)
    except (HeaderError, ArgumentError) as exc:
        return (type(exc).__name__, str(exc))


def _general(data: bytes):
    """What the general rules make of ``data``: the header, or the error (bytes that are not UTF-8: the error
    the port has always given them)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return ("HeaderError", f"header: invalid JSON: {str(exc)[:120]}")
    return _outcome(general_json_header, text)


def _same_as_general(data: bytes) -> bool:
    """Assert ``decode_json_header(data)`` reads (or refuses) ``data`` as the general rules do, send arguments
    included; True if the fast path took it."""
    got, want = _outcome(decode_json_header, data), _general(data)
    if isinstance(want, tuple):
        assert got == want
        return False
    assert _view(got) == _view(want)
    assert all(type(v) is str for v in (got.ext_fields or {}).values())
    fast = type(got.ext_fields) is SendFields
    if got.code in (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE) and want.ext_fields is not None:
        assert _outcome(send_args, got.code, got.ext_fields) == _outcome(send_args, want.code, dict(want.ext_fields))
    return fast


def test_the_golden_recordings_hold_the_stock_producers_send_headers():
    assert len(STOCK) >= 5 and any(p.name.startswith("320-") for p in STOCK)


@pytest.mark.parametrize("path", STOCK, ids=lambda p: p.stem)
def test_every_stock_send_header_takes_the_fast_path_and_reads_as_the_general_rules(path):
    """The fast path must take what the stock producer sends (else it buys nothing), and give what the general
    rules give: the same Header, extFields in the same order, the same send arguments."""
    data = _json_header(path)
    assert _same_as_general(data) is True
    header = decode_header(0, data)
    assert type(header.ext_fields) is SendFields
    assert header.ext_fields.args == send_args(header.code, dict(header.ext_fields))


def _stock(**changes: bytes) -> bytes:
    """The bench's stock header with extFields values (or top-level fields, prefixed ``top_``) replaced."""
    data = JAVA_HEADER
    for key, value in changes.items():
        if key.startswith("top_"):
            name = key[4:].encode()
            start = data.index(b'"%s":' % name) + len(name) + 3
            end = min(i for i in (data.find(b",", start), data.find(b"}", start)) if i >= 0)
            data = data[:start] + value + data[end:]
        else:
            start = data.index(b'"%s":"' % key.encode()) + len(key) + 4
            data = data[:start] + value + data[data.index(b'"', start):]
    return data


@pytest.mark.parametrize("data, fast", [
    (JAVA_HEADER, True),
    (_stock(i=b""), True),                                       # no properties
    (_stock(i=b"KEYS\\u0001a b\\u0002"), True),                  # a trailing separator
    (_stock(i=b"\\\\u0001"), False),                             # an escaped backslash, then "u0001": not a separator
    (_stock(i=b"A\\\\\\u0001"), False),                          # a backslash, then a separator
    (_stock(i=b"A\\u0003B"), False),                             # another control character
    (_stock(i=b"A\\nB"), False),
    (_stock(i=b"A\\\"B"), False),                                # an escaped quote
    (_stock(i=b"A\\u000"), False),                               # a truncated escape
    (_stock(i="Tägë\\u0001日本".encode()), True),                 # UTF-8 text
    (_stock(b="Tøpic".encode()), True),
    (_stock(b=b"T\\u00f8pic"), False),                           # an escaped character in a plain field
    (_stock(b=b"T\x7fopic"), True),                              # DEL is not a JSON control character
    (_stock(b=b"T\x01opic"), False),                             # a raw control character: JSON refuses it
    (_stock(b=b"T\xffopic"), False),                             # invalid UTF-8
    (_stock(b=b""), True),                                       # an empty topic: the send's checks refuse it
    (_stock(a=b""), True),
    (_stock(m=b"true"), True), (_stock(m=b"TRUE"), True), (_stock(k=b"yes"), True),
    (_stock(d=b""), False), (_stock(e=b""), False),              # empty numbers: defaults, or the field's error
    (_stock(e=b"-1"), True), (_stock(e=b"007"), True), (_stock(e=b"-0"), True),
    (_stock(e=b"+1"), False), (_stock(e=b" 1"), False), (_stock(e=b"1_0"), False), (_stock(e=b"x"), False),
    (_stock(e=b"999999999"), True), (_stock(e=b"2147483647"), False), (_stock(e=b"2147483648"), False),
    (_stock(f=b"-2147483649"), False), (_stock(h=b"12345678901"), False), (_stock(j=b"1e3"), False),
    (_stock(g=b"999999999999999999"), True), (_stock(g=b"9223372036854775807"), False),
    (_stock(g=b"9223372036854775808"), False), (_stock(g=b"-9223372036854775809"), False),
    (_stock(top_opaque=b"2147483647"), True), (_stock(top_opaque=b"-2147483648"), True),
    (_stock(top_opaque=b"2147483648"), False), (_stock(top_opaque=b"-2147483649"), False),
    (_stock(top_opaque=b"99999999999"), False), (_stock(top_opaque=b"01"), False),
    (_stock(top_flag=b"2"), True), (_stock(top_flag=b"-0"), True), (_stock(top_flag=b"1.0"), False),
    (_stock(top_version=b"1000000000"), False), (_stock(top_code=b"10"), False), (_stock(top_code=b"311"), False),
    (_stock(top_code=b"320"), True),
    (JAVA_HEADER.replace(b',"n":"RaftNode00"', b""), True),             # no brokerName (an old client)
    (JAVA_HEADER.replace(b'"m":', b'"l":"16","m":'), True),             # maxReconsumeTimes (a retry)
    (JAVA_HEADER.replace(b'"m":', b'"l":"x","m":').replace(b',"n":"RaftNode00"', b""), True),
    (JAVA_HEADER.replace(b'"c":"TBW102",', b""), False),                # a field missing: its default
    (JAVA_HEADER.replace(b'"b":"BenchTopic",', b""), False),            # the topic missing: the error
    (JAVA_HEADER.replace(b'"a"', b'"A"'), False),
    (JAVA_HEADER.replace(b'"k":"false",', b'"k":false,'), False),      # ali-ons' booleans
    (JAVA_HEADER.replace(b'"d":"8"', b'"d":8'), False),                # ali-ons' numbers
    (JAVA_HEADER.replace(b',"flag"', b', "flag"'), False),             # whitespace
    (JAVA_HEADER + b" ", False), (b" " + JAVA_HEADER, False), (JAVA_HEADER + b"{}", False),
    (JAVA_HEADER[:-1], False),
    (JAVA_HEADER.replace(b'"language":"JAVA"', b'"language":"CPP"'), False),
    (JAVA_HEADER.replace(b'"version":399}', b'"version":399,"remark":"r"}'), False),
    (JAVA_HEADER.replace(b'"flag":0,', b'"flag":0,"flag":1,'), False),  # a duplicate key: the last one counts
])
def test_a_header_reads_as_the_general_rules_whichever_path_takes_it(data, fast):
    """Each case gives what the general rules give (the header, the send arguments, or the same error); ``fast``
    says which path took it, so a pattern that stops taking the stock shape, or takes too much, shows."""
    assert _same_as_general(data) is fast


def test_random_damage_to_a_stock_header_reads_as_the_general_rules():
    """Bytes of a stock header changed, dropped or repeated at random (fixed seed): each result or error is the
    general rules'."""
    rnd = random.Random(28)
    alphabet = b'"\\{}:,u0123456789-+ .aeETbnx\x00\x01\x7f\xc3\xa9'
    took = 0
    for _ in range(3000):
        data = bytearray(JAVA_HEADER)
        for _ in range(rnd.randint(1, 3)):
            pos = rnd.randrange(len(data))
            what = rnd.random()
            if what < 0.5:
                data[pos] = rnd.choice(alphabet)
            elif what < 0.75:
                del data[pos]
            else:
                data[pos:pos] = data[pos:pos + rnd.randint(1, 6)]
        took += _same_as_general(bytes(data))
    assert 0 < took < 3000  # both paths were exercised


def test_fast_send_header_declines_other_shapes():
    """None, not an error, for what it does not take: the general rules give the answer."""
    for text in ("", "{}", '{"code":11,"opaque":1}', JAVA_HEADER.decode()[:-1], "[310]"):
        assert fast_send_header(text) is None


def test_send_args_of_fast_fields_is_the_decoded_arguments_for_their_code_only():
    """The arguments read with the header are returned for its code; another code reads the fields again."""
    ext = decode_json_header(JAVA_HEADER).ext_fields
    assert send_args(SEND_MESSAGE_V2, ext) is ext.args
    batch = send_args(SEND_BATCH_MESSAGE, ext)
    assert batch is not ext.args and batch.batch is True and ext.args.batch is False
