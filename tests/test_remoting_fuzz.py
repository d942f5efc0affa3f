"""Fuzzing the decoder and the protocol: only valid frames or the codec's own errors, never a crash.

Bounded for CI: a few thousand seeded mutations plus a few hundred hypothesis examples (a few seconds).
"""

import json
import random
import struct
from pathlib import Path

import crc32c
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet.defer import succeed
from twisted.internet.task import Clock
from twisted.internet.testing import StringTransport
from twisted.logger import Logger, LogLevel
from zope.interface import implementer

from dledger import messages
from dledger.codes import PushType
from dledger.entry import Entry
from dledger.interfaces import IRequestHandler
from dledger.transport import remoting
from dledger.transport.protocol import RemotingProtocol
from dledger.transport.remoting import FrameSplitter

GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"
GOLDEN_FRAMES = [p.read_bytes() for p in sorted((GOLDEN / "frames").glob("*.bin"))]
MAX_FRAME = 64 * 1024
FUZZ = settings(max_examples=300, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow])


def binary_push_frame() -> bytes:
    batch = [Entry(bytes([i]) * 40, i, 2, i * 88).sealed() for i in range(4)]
    request = messages.PushEntryRequest(group="g0", type=PushType.APPEND, term=2, leader_id="n0",
                                        batch_entry=batch, total_size=sum(e.size for e in batch))
    return remoting.encode_request(request, 77, binary=True)


SEEDS = [*GOLDEN_FRAMES, binary_push_frame()]


def decode_everything(data: bytes, rng: random.Random) -> int:
    """Split ``data`` in random chunks and decode each frame fully; returns frames decoded.

    Every exception must be one of the codec's own; anything else fails the test.
    """
    splitter = FrameSplitter(MAX_FRAME)
    decoded, pos = 0, 0
    try:
        while pos < len(data):
            n = rng.randint(1, 300)
            chunk, pos = data[pos:pos + n], pos + n
            while True:
                try:
                    for frame in splitter.feed(chunk):
                        decode_frame_contents(frame)
                        decoded += 1
                    break
                except (remoting.HeaderError, remoting.UnsupportedSerializeTypeError):
                    chunk = b""  # the frame was consumed; continue with what is buffered
    except remoting.FrameLengthError:
        pass
    return decoded


def decode_frame_contents(frame) -> None:
    """Decode a frame as the protocol would: request by code, reply as every response type."""
    assert isinstance(frame.header.opaque, int) and isinstance(frame.body, bytes)
    if frame.header.is_response:
        for _, response_cls in messages.RPCS.values():
            try:
                msg = remoting.decode_response(frame, response_cls)
                assert isinstance(msg, response_cls)
                remoting.encode_body(msg)
            except remoting.BodyError:
                pass
        return
    try:
        msg = remoting.decode_request(frame)
    except (remoting.BodyError, remoting.UnknownRequestCodeError):
        return
    assert isinstance(msg, messages.RequestOrResponse)
    remoting.encode_body(msg)
    remoting.encode_body(messages.error_response(msg, 500))


def mutate(data: bytes, rng: random.Random) -> bytes:
    b = bytearray(data)
    kind = rng.randrange(6)
    if kind == 0:  # bit flips anywhere
        for _ in range(rng.randint(1, 8)):
            i = rng.randrange(len(b))
            b[i] ^= 1 << rng.randrange(8)
    elif kind == 1:  # truncation
        del b[rng.randrange(len(b)):]
    elif kind == 2:  # total length corruption
        struct.pack_into(">i", b, 0, rng.choice([-1, 0, 3, 4, 7, len(b), len(b) - 5, 2 ** 31 - 1,
                                                 rng.randrange(-2 ** 31, 2 ** 31)]))
    elif kind == 3:  # header length / serialize type corruption
        struct.pack_into(">I", b, 4, rng.choice([0, 1, 0xFFFFFF, 1 << 24, 0xFF << 24, rng.randrange(2 ** 32)]))
    elif kind == 4:  # random bytes over a header or body region
        i = rng.randrange(len(b))
        n = rng.randint(1, 32)
        b[i:i + n] = rng.randbytes(n)
    else:  # splice two frames
        other = rng.choice(SEEDS)
        b = b[:rng.randrange(len(b))] + other[rng.randrange(len(other)):]
    return bytes(b)


def test_seeded_mutations_of_golden_frames_only_raise_codec_errors():
    """5,000 seeded mutations (bit flips, truncation, length corruption, splices) never escape the codec."""
    rng = random.Random(20261122)
    decoded = 0
    for _ in range(5000):
        stream = b"".join(mutate(rng.choice(SEEDS), rng) for _ in range(rng.randint(1, 3)))
        decoded += decode_everything(stream, rng)
    assert decoded > 1000  # many mutants are still frames (flipped bits inside bodies)


def test_unmutated_golden_frames_decode_in_the_fuzz_harness():
    """The harness itself accepts every intact frame (so the mutation test is meaningful)."""
    rng = random.Random(1)
    assert decode_everything(b"".join(SEEDS), rng) == len(SEEDS)


@FUZZ
@given(st.binary(max_size=2048), st.randoms(use_true_random=False))
def test_random_bytes_only_raise_codec_errors(data, rng):
    """Arbitrary bytes are valid frames or raise FrameError subclasses."""
    decode_everything(data, rng)


@FUZZ
@given(header=st.dictionaries(st.sampled_from(["code", "flag", "opaque", "language", "version", "remark",
                                               "extFields", "serializeTypeCurrentRPC"]),
                              st.one_of(st.integers(), st.text(max_size=8), st.booleans(), st.none(),
                                        st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2))),
       body=st.recursive(st.one_of(st.integers(), st.text(max_size=12), st.none(), st.booleans()),
                         lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                 st.dictionaries(st.sampled_from(
                                                     ["term", "group", "entry", "batchEntry", "type", "body",
                                                      "voteResult", "peers", "index", "code", "entries"]),
                                                     inner, max_size=4)),
                         max_leaves=12))
def test_structured_random_headers_and_bodies_only_raise_codec_errors(header, body):
    """JSON-shaped nonsense in header and body decodes or raises the codec's own errors."""
    head = json.dumps(header).encode()
    payload = json.dumps(body).encode()
    data = struct.pack(">iI", 4 + len(head) + len(payload), len(head)) + head + payload
    decode_everything(data, random.Random(0))


@FUZZ
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=1000))
def test_binary_push_decoder_only_raises_its_errors(noise, where):
    """Damaged binary PUSH bodies raise BinaryBodyError, never anything else."""
    body = remoting.decode_frame(binary_push_frame()).body
    damaged = body[:where % (len(body) + 1)] + noise
    try:
        remoting.decode_push_binary(damaged)
    except remoting.BinaryBodyError:
        pass


@FUZZ
@given(st.binary(max_size=400), st.integers(min_value=0, max_value=1000))
def test_binary_append_decoder_only_raises_its_errors(noise, where):
    """Damaged binary APPEND bodies raise BinaryBodyError, never anything else."""
    body = remoting.encode_append_binary(messages.AppendEntryRequest(group="g0", batch_msgs=[b"abc", b"x" * 40]))
    damaged = body[:where % (len(body) + 1)] + noise
    try:
        remoting.decode_append_binary(damaged)
    except remoting.BinaryBodyError:
        pass


# -- the protocol under garbage ---------------------------------------------------------------

@implementer(IRequestHandler)
class Echo:
    def handle_request(self, request):
        return succeed(request.base_reply(messages.RESPONSE_TYPES[type(request)]))


class Events(list):
    def __call__(self, event):
        self.append(event)


def garbage_protocol():
    events = Events()
    proto = RemotingProtocol(Clock(), Echo(), max_frame_size=MAX_FRAME)
    proto.log = Logger(observer=events)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport, events


def test_protocol_fed_mutated_streams_never_raises_and_never_logs_a_failure():
    """dataReceived swallows hostile input: it answers with frames or closes, logging warnings only."""
    rng = random.Random(7)
    closed = answered = 0
    for _ in range(400):
        proto, transport, events = garbage_protocol()
        stream = b"".join(mutate(rng.choice(SEEDS), rng) for _ in range(rng.randint(1, 4)))
        pos = 0
        while pos < len(stream):
            n = rng.randint(1, 500)
            proto.dataReceived(stream[pos:pos + n])
            pos += n
        assert not [e for e in events if e.get("log_failure") is not None or e["log_level"] >= LogLevel.error]
        out = transport.value()
        if out:
            for frame in remoting.split_frames(out):
                assert frame.header.is_response and frame.header.code == 200
            answered += 1
        closed += transport.disconnecting
    assert closed > 50 and answered > 50


@FUZZ
@given(st.binary(max_size=1024))
def test_protocol_fed_random_bytes_never_raises(data):
    """Random bytes either wait for more data, get error replies, or close the connection."""
    proto, transport, events = garbage_protocol()
    proto.dataReceived(data)
    assert not [e for e in events if e.get("log_failure") is not None]
    for frame in remoting.split_frames(transport.value()):
        assert frame.header.is_response


# -- out-of-range integers (issue #9, item 13) ---------------------------------------------------------

_WIRE_INT_KEYS = sorted({messages.camel(name) for name in messages.FIELD_BOUNDS})
_HOSTILE_INTS = st.one_of(st.integers(), st.integers(min_value=2 ** 31 - 2, max_value=2 ** 31 + 2),
                          st.integers(min_value=2 ** 63 - 3, max_value=2 ** 64 + 2),
                          st.integers(min_value=-(2 ** 64), max_value=-2), st.sampled_from([10 ** 30, -10 ** 30]))


def _all_ints_in_bounds(msg) -> bool:
    return messages.message_bounds_error(msg) is None


@FUZZ
@given(code=st.sampled_from([int(c) for c in messages.RPCS]), is_response=st.booleans(),
       ints=st.dictionaries(st.sampled_from(_WIRE_INT_KEYS), _HOSTILE_INTS, min_size=1, max_size=5),
       entry_ints=st.dictionaries(st.sampled_from(["index", "term", "pos", "magic", "bodyCrc"]), _HOSTILE_INTS,
                                  max_size=3))
def test_out_of_range_integers_are_refused_or_decoded_within_bounds(code, is_response, ints, entry_ints):
    """Random (often out-of-range) integers in any field of any request or response: refused, or within bounds."""
    entry = messages.entry_to_wire(Entry(b"e", 1, 1, 0).sealed())
    entry.update(entry_ints)
    body = {"group": "g0", **ints, "entry": entry, "entries": [entry], "batchEntry": [entry]}
    payload = json.dumps(body).encode()
    header = remoting.Header(200, 3, remoting.FLAG_RESPONSE) if is_response else remoting.Header(code, 3)
    frame = remoting.decode_frame(remoting.encode_frame(header, payload))
    cls = messages.RPCS[messages.RequestCode(code)][1 if is_response else 0]
    try:
        msg = remoting.decode_response(frame, cls) if is_response else remoting.decode_request(frame)
    except remoting.BodyError as exc:
        assert "out of range" in str(exc) or "expected" in str(exc)
        return
    assert _all_ints_in_bounds(msg)


@FUZZ
@given(index=_HOSTILE_INTS, term=_HOSTILE_INTS, pos=_HOSTILE_INTS, meta_term=_HOSTILE_INTS,
       commit=_HOSTILE_INTS)
def test_binary_push_with_out_of_range_integers_is_refused_or_within_bounds(index, term, pos, meta_term, commit):
    """Binary PUSH entries and meta carrying random 64-bit (and wider) integers never decode out of bounds."""
    header_fields = [index, term, pos]
    if not all(-(2 ** 63) <= v < 2 ** 63 for v in header_fields):
        index, term, pos = (max(-(2 ** 63), min(v, 2 ** 63 - 1)) for v in header_fields)
    entry = struct.pack(">iiqqqiiii", 1, 49, index, term, pos, 0, 0, 0, 1) + b"z"
    meta = json.dumps({"group": "g0", "term": meta_term, "commitIndex": commit, "type": "APPEND"}).encode()
    body = struct.pack(">BBIII", 1, 0, len(meta), 1, crc32c.crc32c(entry)) + meta + entry
    frame = remoting.decode_frame(remoting.encode_frame(remoting.Header(51004, 1, ext_fields=dict(
        remoting.BINARY_EXT_FIELDS)), body))
    try:
        msg = remoting.decode_request(frame)
    except remoting.BinaryBodyError:
        return
    assert _all_ints_in_bounds(msg)
