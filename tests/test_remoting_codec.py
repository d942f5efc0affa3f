"""The frame codec's validation rules and the binary PUSH body."""

import json
import struct

import pytest

from dledger import messages
from dledger.codes import PushType, RequestCode, ResponseCode
from dledger.entry import HEADER_SIZE, Entry, body_crc
from dledger.transport import remoting
from dledger.transport.remoting import (
    BinaryBodyError,
    BodyError,
    FrameLengthError,
    FrameSplitter,
    FrameTooLargeError,
    Header,
    HeaderError,
    UnknownRequestCodeError,
    UnsupportedSerializeTypeError,
)

GOOD_HEADER = b'{"code":51002,"flag":0,"language":"JAVA","opaque":7,"serializeTypeCurrentRPC":"JSON","version":0}'


def frame(header: bytes, body: bytes = b"{}", serialize_type: int = 0, total_delta: int = 0) -> bytes:
    """A frame assembled by hand, so that tests do not rely on the encoder under test."""
    word = (serialize_type << 24) | len(header)
    return struct.pack(">iI", 4 + len(header) + len(body) + total_delta, word) + header + body


def entries(n: int, size: int = 1024, start: int = 0, term: int = 3) -> list[Entry]:
    out, pos = [], 0
    for i in range(n):
        body = bytes([(start + i) % 251]) * size
        out.append(Entry(body, start + i, term, pos).sealed())
        pos += HEADER_SIZE + size
    return out


def push(batch: list[Entry], **kw) -> messages.PushEntryRequest:
    return messages.PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=3,
                                     commit_index=5, type=PushType.APPEND, batch_entry=batch,
                                     total_size=sum(e.size for e in batch), **kw)


# -- framing -------------------------------------------------------------------------

def test_several_frames_in_one_chunk_and_one_frame_in_many():
    """The splitter yields every complete frame of a chunk and waits for the rest of a partial one."""
    a, b = frame(GOOD_HEADER, b'{"term":1}'), frame(GOOD_HEADER, b'{"term":2}')
    splitter = FrameSplitter()
    got = list(splitter.feed(a + b[:5]))
    assert [f.body for f in got] == [b'{"term":1}']
    assert splitter.buffered == 5
    got = [f for byte in b[5:] for f in splitter.feed(bytes([byte]))]
    assert [f.body for f in got] == [b'{"term":2}'] and splitter.buffered == 0


@pytest.mark.parametrize("seed", range(6))
def test_large_frames_are_collected_in_chunks_and_split_as_any_other(seed):
    """Frames missing 64 KiB or more are collected chunk by chunk and joined once: the frames, their order and
    ``buffered`` are those of feeding every chunk to the buffer (frames around and inside the chunks too)."""
    import random

    rng = random.Random(seed)
    bodies = [rng.randbytes(rng.choice([0, 10, 70_000, 300_000, 1 << 20])) for _ in range(12)]
    stream = b"".join(frame(GOOD_HEADER, b) for b in bodies)
    cuts = sorted(rng.sample(range(1, len(stream)), 60))
    chunks = [stream[a:b] for a, b in zip([0, *cuts], [*cuts, len(stream)])]
    splitter, got, fed, collected = FrameSplitter(), [], 0, 0
    for chunk in chunks:
        got += [f.body for f in splitter.feed(chunk)]
        collected += splitter.collecting
        fed += len(chunk)
        assert splitter.buffered == fed - sum(len(frame(GOOD_HEADER, b)) for b in got)
    assert got == bodies and splitter.buffered == 0 and not splitter.collecting
    assert collected > 5, "the large frames took the collecting path"


@pytest.mark.parametrize("seed", range(4))
def test_reads_cut_anywhere_give_the_frames_and_buffered_bytes_of_the_whole_stream(seed):
    """Reads that start inside a frame (the buffered frame completed from the read's head, the read's other
    frames cut from it in place) give every frame, in order, and ``buffered`` counts exactly what is left."""
    import random

    rng = random.Random(seed)
    bodies = [rng.randbytes(rng.choice([0, 3, 1100, 5000])) for _ in range(200)]
    stream = b"".join(frame(GOOD_HEADER, b) for b in bodies)
    cuts = sorted(rng.sample(range(1, len(stream)), 40))
    splitter, got, fed = FrameSplitter(), [], 0
    for a, b in zip([0, *cuts], [*cuts, len(stream)]):
        got += [f.body for f in splitter.feed(stream[a:b] if a % 2 else bytearray(stream[a:b]))]
        fed = b
        assert splitter.buffered == fed - sum(len(frame(GOOD_HEADER, body)) for body in got)
    assert got == bodies and splitter.buffered == 0


def test_a_read_left_unfinished_is_kept_for_the_next_one():
    """A consumer that stops iterating (a connection closing, a header error) loses nothing of the read: the
    frames it did not take come out of the next feed, after the buffered ones, with ``buffered`` right between."""
    frames = [frame(GOOD_HEADER, b'{"term":%d}' % i) for i in range(6)]
    stream, cut = b"".join(frames), len(frames[0]) + 10
    splitter = FrameSplitter()
    assert [f.body for f in splitter.feed(stream[:cut])] == [b'{"term":0}'] and splitter.buffered == 10
    it = splitter.feed(stream[cut:len(stream) - 2])  # completes frame 1, carries 2-4 and all but 2 bytes of 5
    assert next(it).body == b'{"term":1}'
    assert splitter.buffered == sum(map(len, frames[2:])) - 2
    assert next(it).body == b'{"term":2}'  # cut from the read in place
    assert splitter.buffered == sum(map(len, frames[3:])) - 2
    got = [f.body for f in splitter.feed(stream[-2:])]
    assert got == [b'{"term":%d}' % i for i in (3, 4, 5)] and splitter.buffered == 0
    assert [f.body for f in splitter.feed(stream[:cut])] == [b'{"term":0}']
    it = splitter.feed(stream[cut:])
    assert next(it).body == b'{"term":1}'  # stopped before the read put aside is reached
    assert splitter.buffered == sum(map(len, frames[2:]))
    assert [f.body for f in splitter.feed(b"")] == [b'{"term":%d}' % i for i in range(2, 6)]
    assert splitter.buffered == 0


def test_a_large_frame_trickled_byte_by_byte_is_held_in_few_buffers():
    """A peer sending a large frame a byte per read: the splitter holds about the frame's bytes, not an object per
    byte (which would be ~40 times the frame), and still yields the frame."""
    import tracemalloc

    body = bytes(range(256)) * 1200  # 300 KiB
    data = frame(GOOD_HEADER, body)
    splitter = FrameSplitter()
    got = list(splitter.feed(data[:100]))
    tracemalloc.start()
    try:
        for i in range(100, len(data) - 1):
            got += splitter.feed(data[i:i + 1])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert splitter.collecting and splitter.buffered == len(data) - 1
    got += splitter.feed(data[-1:])
    assert [f.body for f in got] == [body] and not splitter.collecting
    assert peak < 2 * len(data), f"{peak} bytes held for a {len(data)}-byte frame"


def test_frame_over_the_size_limit_is_refused_from_its_length_field():
    """A frame announcing more than max_frame_size is refused before its bytes are buffered."""
    splitter = FrameSplitter(max_frame_size=1000)
    with pytest.raises(FrameTooLargeError, match="exceeds the limit of 1000 bytes"):
        list(splitter.feed(struct.pack(">i", 997)))
    with pytest.raises(FrameTooLargeError):  # the stream stays refused
        list(splitter.feed(b"more"))


def test_frame_exactly_at_the_size_limit_is_accepted():
    """max_frame_size counts the whole frame, length field included."""
    data = frame(GOOD_HEADER)
    assert len(list(FrameSplitter(max_frame_size=len(data)).feed(data))) == 1


@pytest.mark.parametrize("total", [-1, 0, 3, -(2 ** 31)])
def test_impossible_total_length_is_a_length_error(total):
    """A length field below 4 (negative included) cannot be a frame."""
    with pytest.raises(FrameLengthError, match="below the minimum 4"):
        list(FrameSplitter().feed(struct.pack(">i", total) + b"\0" * 8))


def test_header_longer_than_frame_is_a_length_error():
    """headerLen must fit in totalLen - 4."""
    data = struct.pack(">iI", 10, 7)
    with pytest.raises(FrameLengthError, match="header length 7 exceeds the 6 bytes"):
        list(FrameSplitter().feed(data))


def test_rocketmq_serialize_type_is_refused_clearly():
    """serializeType 1 (ROCKETMQ binary header) raises its own error, naming the type."""
    with pytest.raises(UnsupportedSerializeTypeError, match="serializeType 1 .*ROCKETMQ"):
        list(FrameSplitter().feed(frame(GOOD_HEADER, serialize_type=1)))


def test_header_error_consumes_the_frame_and_keeps_the_stream_in_sync():
    """After a frame with an unreadable header, the next frame still decodes."""
    splitter = FrameSplitter()
    it = splitter.feed(frame(b"not json") + frame(GOOD_HEADER))
    with pytest.raises(HeaderError):
        next(it)
    assert [f.header.opaque for f in splitter.feed(b"")] == [7]


@pytest.mark.parametrize("raw,message", [
    (b"\xff\xfe{}", "invalid UTF-8"),
    (b"{", "invalid JSON"),
    (b"[1,2]", "expected a JSON object"),
    (b'{"code":1,"flag":0,"opaque":NaN}', "unacceptable JSON"),
    (b'{"flag":0,"opaque":1}', "missing key 'code'"),
    (b'{"code":51002,"flag":0}', "missing key 'opaque'"),
    (b'{"code":51002,"opaque":1}', "missing key 'flag'"),
    (b'{"code":"51002","flag":0,"opaque":1}', "'code' must be an integer"),
    (b'{"code":51002,"flag":true,"opaque":1}', "'flag' must be an integer"),
    (b'{"code":51002,"flag":0,"opaque":4294967296}', "does not fit a Java int"),
    (b'{"code":51002,"flag":0,"opaque":1,"language":5}', "'language' must be a string"),
    (b'{"code":51002,"flag":0,"opaque":1,"extFields":{"a":1}}', "'extFields' must be an object of strings"),
    (b"[" * 100000 + b"]" * 100000, "unacceptable JSON|expected a JSON object"),
])
def test_bad_headers_raise_header_error(raw, message):
    """Invalid UTF-8/JSON and missing or mistyped header keys raise HeaderError with a clear message."""
    with pytest.raises(HeaderError, match=message):
        list(FrameSplitter().feed(frame(raw)))


def test_header_keeps_remark_and_ext_fields_in_java_key_order():
    """remark and extFields are written only when set, in sorted-key position."""
    header = Header(51004, 5, ext_fields={"dledger.body": "bin"}, remark="r")
    text = header.to_json()
    assert list(json.loads(text)) == sorted(json.loads(text))
    assert Header.from_json(text) == header


# -- messages ---------------------------------------------------------------------------

def test_unknown_request_code_is_reported_with_the_header():
    """A request code with no message class raises UnknownRequestCodeError that carries the header (to reply)."""
    f = remoting.decode_frame(frame(b'{"code":12345,"flag":0,"opaque":9}'))
    with pytest.raises(UnknownRequestCodeError) as info:
        remoting.decode_request(f)
    assert info.value.header.opaque == 9


@pytest.mark.parametrize("body,message", [
    (b"\xc3\x28", "invalid UTF-8"),
    (b'{"term":', "invalid JSON"),
    (b'"just a string"', "expected a JSON object"),
    (b'{"term":"one"}', "term"),
    (b'{"group":["g0"]}', "group"),
])
def test_bad_bodies_raise_body_error_with_the_header(body, message):
    """A body that is not the message raises BodyError carrying the header, so a reply is possible."""
    f = remoting.decode_frame(frame(GOOD_HEADER, body))
    with pytest.raises(BodyError, match=message) as info:
        remoting.decode_request(f)
    assert info.value.header.opaque == 7


def test_reply_with_remoting_error_code_is_not_decoded_as_a_message():
    """A reply whose header code is not 200 (Java remoting SYSTEM_ERROR etc.) is a BodyError, not a message."""
    f = remoting.decode_frame(frame(b'{"code":1,"flag":1,"opaque":3,"remark":"boom"}', b""))
    with pytest.raises(BodyError, match="remoting error 1: boom"):
        remoting.decode_response(f, messages.HeartBeatResponse)


def test_error_body_uses_the_response_class_defaults():
    """An error reply to an undecodable request is that request's response type with only the code set."""
    push_header = Header(int(RequestCode.PUSH), 1)
    body = json.loads(remoting.error_body(push_header, ResponseCode.UNEXPECTED_ARGUMENT))
    assert body["code"] == 411 and body["beginIndex"] == -1
    assert json.loads(remoting.error_body(Header(99, 1), ResponseCode.UNSUPPORTED)) == {"code": 303, "term": -1}


@pytest.mark.parametrize("msg", [
    messages.AppendEntryResponse(group="g0", term=3, index=12, pos=2 ** 40, leader_id="n0", code=200),
    messages.AppendEntryResponse(group='g"0\\', remote_id="ñ-✓", local_id="\x01\n", term=-1, code=-5),
    messages.AppendEntryResponse(code=ResponseCode.NOT_LEADER, leader_id="n2"),  # an enum: the general path
    # the APPEND reply's template: '%' in its strings, every string None, negative ints, an odd int type
    messages.AppendEntryResponse(group="g%d%s%%", leader_id="%", term=7, index=-1, pos=0, code=0),
    messages.AppendEntryResponse(group=None, term=0, index=0, pos=-1, code=0),
    messages.AppendEntryResponse(group="g0", remote_id="n1", local_id="n2", leader_id="n0", term=1, index=5, code=0),
    messages.AppendEntryResponse(group="g0", term=1, index=True, pos=3, code=0),
    messages.AppendEntryResponse(group="g0", term=None, index=1, pos=3, code=0),
    messages.PushEntryResponse(group="g0", term=2, index=None, begin_index=0, end_index=99, count=3, code=200),
    messages.PushEntryResponse(group="g0", index=7, count=True),  # a bool: the general path
    messages.HeartBeatRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=4),
    messages.VoteRequest(group="g0", ledger_end_index=10, ledger_end_term=2, term=3),
    messages.LeadershipTransferResponse(),
])
def test_flat_messages_are_written_exactly_as_the_generic_encoder_writes_them(msg):
    """The fast writer of int/str-only messages produces the generic encoder's bytes, escapes included."""
    generic = json.dumps(messages.to_wire(msg), separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode()
    assert remoting.encode_body(msg) == generic
    assert remoting.encode_body(msg) == generic, "again, from the caches"


def test_append_replies_past_the_template_cache_are_still_written_exactly():
    """More (group, member id) shapes than the APPEND reply templates keep: the rest take the general path."""
    assert remoting._APPEND_REPLY_TEMPLATED, "AppendEntryResponse's wire fields changed: update the template"
    for i in range(100):
        msg = messages.AppendEntryResponse(group=f"g{i}", leader_id="n0", term=2, index=i, pos=i * 10, code=0)
        generic = json.dumps(messages.to_wire(msg), separators=(",", ":"), sort_keys=True,
                             ensure_ascii=False).encode()
        assert remoting.encode_body(msg) == generic
    assert len(remoting._APPEND_REPLY_TEMPLATES) <= 64


@pytest.mark.parametrize("header, fast", [
    (Header(51004, 7, 0, ext_fields={"dledger.body": "bin"}), True),
    (Header(200, -(2 ** 31), 1), True),
    (Header(999_999_999, 2 ** 31 - 1, 2, version=-999_999_999), True),
    (Header(2 ** 31 - 1, 1, 0), False),  # 10 digits in a field without a range check: the long way
    (Header(1, 1, 0, ext_fields={"dledger.reply": "bin"}), False),
    (Header(1, 1, 0, remark="x"), False),
])
def test_one_pattern_reads_both_header_shapes_and_leaves_the_rest_to_the_parser(header, fast):
    """The fast pattern matches the plain and the binary-marked header with fields that fit a Java int; every
    other header is parsed by json, to the same value."""
    text = header.to_json()
    assert (remoting._FAST_HEADER(text) is not None) == fast
    assert Header.from_json(text) == header


def test_binary_marked_headers_take_the_fast_path_both_ways():
    """A header with the binary marker is written and read by the templates exactly as the generic JSON path does."""
    header = Header(51004, 2 ** 31 - 1, 2, ext_fields={"dledger.body": "bin"})
    generic = json.dumps({"code": 51004, "extFields": {"dledger.body": "bin"}, "flag": 2, "language": "JAVA",
                          "opaque": 2 ** 31 - 1, "serializeTypeCurrentRPC": "JSON", "version": 0},
                         separators=(",", ":"), sort_keys=True).encode()
    assert header.to_json() == generic
    parsed = Header.from_json(generic)
    assert parsed == header and parsed.ext_fields is not remoting.BINARY_EXT_FIELDS
    with pytest.raises(HeaderError):
        Header.from_json(generic.replace(b"2147483647", b"2147483648"))


# -- binary PUSH --------------------------------------------------------------------------

def test_binary_push_round_trip_256_entries():
    """A 256 x 1 KiB batch survives the binary body unchanged, entries and every other field."""
    request = push(entries(256))
    data = remoting.encode_request(request, 42, binary=True)
    decoded = remoting.decode_request(remoting.decode_frame(data))
    assert decoded == request
    assert decoded.batch and decoded.count == 256
    json_size = len(remoting.encode_request(request, 42))
    assert len(data) < 0.8 * json_size  # no Base64 inflation


@pytest.mark.parametrize("given", [False, True], ids=["encoded here", "encoding given"])
def test_a_push_of_an_entry_list_is_the_same_frame_as_of_a_plain_list(given):
    """An EntryList's push frame (its section joined with the other parts) is byte for byte the frame of the same
    entries as a plain list (encoded into a buffer), also when the list was handed its encoding as a view."""
    from dledger.entry import EntryList

    batch = entries(40, size=300)
    listed = EntryList(batch)
    if given:
        listed = EntryList(batch, encoded=memoryview(EntryList(batch).section()[0]))
    plain = remoting.encode_request(push(list(batch)), 9, binary=True)
    assert remoting.encode_request(push(listed), 9, binary=True) == plain
    assert remoting.decode_request(remoting.decode_frame(plain)).batch_entry == batch


@pytest.mark.parametrize("kind", ["commit", "single", "compare", "batch-of-one"])
def test_binary_push_keeps_entry_versus_batch_entry(kind):
    """COMMIT (no entries), a single ``entry`` and a one-entry batch keep their exact shape."""
    one = entries(1)[0]
    request = {
        "commit": messages.PushEntryRequest(group="g0", type=PushType.COMMIT, commit_index=4),
        "single": messages.PushEntryRequest(group="g0", type=PushType.APPEND, entry=one),
        "compare": messages.PushEntryRequest(group="g0", type=PushType.COMPARE, entry=one),
        "batch-of-one": push([one]),
    }[kind]
    decoded = remoting.decode_push_binary(remoting.encode_push_binary(request))
    assert decoded == request
    assert messages.to_wire(decoded) == messages.to_wire(request)


def test_binary_push_accepts_java_entries_with_zero_crc():
    """Entries written by Java carry bodyCrc 0; the section CRC still guards them in transit."""
    e = Entry(b"golden-00", 0, 1, 0)
    assert remoting.decode_push_binary(remoting.encode_push_binary(push([e]))).batch_entry == [e]


def test_corrupted_entry_in_transit_is_detected():
    """Flipping any byte of the entries section (body or header) is caught by the crc32c check."""
    data = bytearray(remoting.encode_push_binary(push(entries(3, size=10))))
    start = len(data) - 3 * (HEADER_SIZE + 10)
    for offset in (start + 8, start + HEADER_SIZE + 2, len(data) - 1):
        bad = bytearray(data)
        bad[offset] ^= 0x01
        with pytest.raises(BinaryBodyError, match="crc32c"):
            remoting.decode_push_binary(bytes(bad))


def test_entry_with_wrong_body_crc_is_detected_even_with_a_valid_section_crc():
    """An entry whose own bodyCrc does not match its body is refused (a sender bug, not only transit)."""
    e = entries(1)[0]
    e.body_crc = body_crc(b"something else")
    with pytest.raises(BinaryBodyError, match="entry #0: body crc32c mismatch"):
        remoting.decode_push_binary(remoting.encode_push_binary(push([e])))


@pytest.mark.parametrize("mutate,message", [
    (lambda b: b[:5], "shorter than its"),
    (lambda b: b"\x02" + b[1:], "version 2"),
    (lambda b: b[:1] + b"\x80" + b[2:], "unknown flags"),
    (lambda b: b[:2] + struct.pack(">I", 10 ** 6) + b[6:], "runs past"),
    (lambda b: b[:6] + struct.pack(">I", 10 ** 6) + b[10:], "announces 1000000 entries"),
    (lambda b: b + b"x", "crc32c"),
])
def test_malformed_binary_bodies_are_refused(mutate, message):
    """Truncation, unknown versions/flags and impossible lengths raise BinaryBodyError."""
    good = remoting.encode_push_binary(push(entries(2, size=8)))
    with pytest.raises(BinaryBodyError, match=message):
        remoting.decode_push_binary(mutate(good))


# -- binary APPEND --------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["single", "batch", "batch-of-one", "empty-body"])
def test_binary_append_round_trip(kind):
    """APPEND bodies travel raw and come back as the same request: body versus batchMsgs kept, bytes exact."""
    raw = bytes(range(256)) * 4
    request = {
        "single": messages.AppendEntryRequest(group="g0", remote_id="n1", body=raw),
        "batch": messages.AppendEntryRequest(group="g0", remote_id="n1", batch_msgs=[raw, b"", b"\xff" * 7] * 50),
        "batch-of-one": messages.AppendEntryRequest(group="g0", batch_msgs=[raw]),
        "empty-body": messages.AppendEntryRequest(group="g0", remote_id="n1", term=3, body=b""),
    }[kind]
    data = remoting.encode_request(request, 9, binary=True)
    frame_ = remoting.decode_frame(data)
    assert frame_.header.body_encoding == "bin" and frame_.header.code == RequestCode.APPEND
    assert remoting.decode_request(frame_) == request
    assert remoting.decode_request(remoting.decode_frame(data)) == request, "a second decode (cached meta) too"
    assert len(data) < 0.9 * len(remoting.encode_request(request, 9)) or kind == "empty-body", "no Base64"


def test_binary_append_damage_is_detected():
    """Any flipped byte among the bodies fails the section CRC; a cut or padded body is refused."""
    good = remoting.encode_append_binary(messages.AppendEntryRequest(group="g0", batch_msgs=[b"abc", b"defgh"]))
    for offset in (len(good) - 1, len(good) - 9, len(good) - 12):
        bad = bytearray(good)
        bad[offset] ^= 0x01
        with pytest.raises(BinaryBodyError, match="crc32c"):
            remoting.decode_append_binary(bytes(bad))
    with pytest.raises(BinaryBodyError, match="crc32c"):
        remoting.decode_append_binary(good[:-1])


@pytest.mark.parametrize("request_,message", [
    (messages.AppendEntryRequest(group="g0", batch_msgs=[b"a", b"b"]), "not marked batch"),
    (messages.AppendEntryRequest(group="g0", body=b"a"), "runs past the frame"),
    (messages.AppendEntryRequest(group="g0", body=b"a"), "after its 1 bodies"),
    (messages.AppendEntryRequest(group="g0", body=b"a"), "cut short"),
])
def test_malformed_binary_appends_are_refused(request_, message):
    """Counts and lengths that disagree with the bodies raise BinaryBodyError (with a valid section CRC)."""
    import crc32c

    good = remoting.encode_append_binary(request_)
    version, flags, meta_len, count, _ = struct.unpack_from(">BBIII", good)
    start = 14 + meta_len
    section = good[start:]
    if message == "not marked batch":
        flags = 0
    elif message == "runs past the frame":
        section = struct.pack(">I", 99) + section[4:]
    elif message == "cut short":
        section = section[:3]
    else:
        section += b"extra"
    prefix = struct.pack(">BBIII", version, flags, meta_len, count, crc32c.crc32c(section))
    with pytest.raises(BinaryBodyError, match=message):
        remoting.decode_append_binary(prefix + good[14:start] + section)


def test_binary_append_meta_cannot_carry_bodies():
    """A binary APPEND whose JSON meta also holds a body is refused rather than guessed at."""
    import crc32c

    meta = b'{"body":"AAAA","group":"g0"}'
    section = struct.pack(">I", 1) + b"x"
    data = struct.pack(">BBIII", 1, 0, len(meta), 1, crc32c.crc32c(section)) + meta + section
    with pytest.raises(BinaryBodyError, match="without bodies"):
        remoting.decode_append_binary(data)


def test_binary_body_only_for_push_and_append():
    """The binary marker on another request code is a BodyError; encoding one is a TypeError."""
    with pytest.raises(TypeError):
        remoting.encode_request(messages.HeartBeatRequest(group="g0"), 1, binary=True)
    f = remoting.decode_frame(frame(b'{"code":51002,"extFields":{"dledger.body":"bin"},"flag":0,"opaque":1}'))
    with pytest.raises(BodyError, match="only defined for PUSH, APPEND and INSTALL_SNAPSHOT"):
        remoting.decode_request(f)
    f = remoting.decode_frame(frame(b'{"code":51004,"extFields":{"dledger.body":"zstd"},"flag":0,"opaque":1}'))
    with pytest.raises(BodyError, match="'zstd' is not supported"):
        remoting.decode_request(f)


def test_java_peer_sees_a_marked_binary_body():
    """The binary form is flagged in the header's extFields, so it can never pass for a JSON body."""
    data = remoting.encode_request(push(entries(1)), 3, binary=True)
    _, header_len = struct.unpack_from(">iI", data)
    header = json.loads(data[8:8 + header_len])
    assert header["extFields"] == {"dledger.body": "bin"} and header["code"] == 51004
    with pytest.raises(ValueError):
        json.loads(data[8 + header_len:])


@pytest.mark.parametrize("opaque,remark", [(0, None), (2 ** 31 - 1, None), (7, "why ✓")])
def test_reply_frames_from_the_template_equal_the_generic_frames(opaque, remark):
    """encode_reply writes exactly the frame a reply Header and encode_frame would."""
    body = b'{"code":200}'
    generic = remoting.encode_frame(Header(200, opaque, 1, remark=remark), body)
    assert remoting.encode_reply(opaque, body, remark) == generic
