"""The frame codec against bytes recorded from a real Java DLedger 0.3.2 group (tests/golden)."""

import json
import random
import re
from collections import defaultdict
from pathlib import Path

import pytest

from dledger import messages
from dledger.codes import RequestCode
from dledger.transport import remoting
from dledger.transport.remoting import FrameSplitter, Header

GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"
FRAMES = sorted((GOLDEN / "frames").glob("*.bin"))
STREAMS = sorted((GOLDEN / "streams").glob("*/*.bin"))
PAIRS = sorted({p.name.rsplit("-", 1)[0] for p in FRAMES})


def java_json(obj):
    return json.dumps(obj, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8")


def raw_parts(data: bytes):
    """Split one frame by hand (independently of the codec): (serializeType, header bytes, body bytes)."""
    total = int.from_bytes(data[:4], "big")
    word = int.from_bytes(data[4:8], "big")
    header_len = word & 0xFFFFFF
    assert total + 4 == len(data)
    return word >> 24, data[8:8 + header_len], data[8 + header_len:]


def split_in_chunks(data: bytes, rng: random.Random, max_chunk: int):
    splitter = FrameSplitter()
    frames, pos = [], 0
    while pos < len(data):
        n = rng.randint(1, max_chunk)
        frames.extend(splitter.feed(data[pos:pos + n]))
        pos += n
    assert splitter.buffered == 0
    return frames


def pair_files(name):
    return GOLDEN / "frames" / f"{name}-request.bin", GOLDEN / "frames" / f"{name}-response.bin"


def test_golden_data_is_present():
    """The recorded data set is complete: 54 frames (27 pairs) and the stream files."""
    assert len(FRAMES) == 54
    assert len(PAIRS) == 27
    assert len(STREAMS) == 2 * len(list((GOLDEN / "streams").glob("*/*.c2s.bin")))


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streams_split_into_1025_frames_with_random_chunks(seed):
    """Every recorded TCP stream splits into frames whatever the chunking; 1,025 frames in all."""
    rng = random.Random(seed)
    total = 0
    for path in STREAMS:
        data = path.read_bytes()
        frames = split_in_chunks(data, rng, max_chunk=rng.choice([1, 7, 64, 1500, 70000]))
        assert sum(4 + len(f.header.to_json()) + 4 + len(f.body) for f in frames) == len(data)
        total += len(frames)
    assert total == 1025


def test_streams_split_at_the_recorded_tcp_read_boundaries():
    """Feeding each stream in the chunks recorded in events.log (real TCP reads) yields the same frames."""
    checked = 0
    for run in sorted((GOLDEN / "streams").iterdir()):
        chunks = defaultdict(list)
        for line in (run / "events.log").read_text().splitlines():
            parts = line.split()
            if len(parts) == 6 and parts[3] in ("c2s", "s2c"):
                chunks[f"{parts[1]}.{parts[2]}.{parts[3]}.bin"].append((int(parts[4]), int(parts[5])))
        for name, spans in chunks.items():
            data = (run / name).read_bytes()
            splitter = FrameSplitter()
            got = []
            for offset, length in spans:
                got.extend(splitter.feed(data[offset:offset + length]))
            assert splitter.buffered == 0
            assert got == remoting.split_frames(data)
            checked += 1
    assert checked == len(STREAMS)


def test_every_stream_frame_decodes_and_every_reply_matches_a_request_by_opaque():
    """Requests decode by request code, replies (flag 1, header code 200) by the class of their request."""
    replies = requests = 0
    for c2s in sorted((GOLDEN / "streams").glob("*/*.c2s.bin")):
        s2c = c2s.with_name(c2s.name.replace(".c2s.", ".s2c."))
        sent = {}
        for frame in remoting.split_frames(c2s.read_bytes()):
            assert not frame.header.is_response
            request = remoting.decode_request(frame)
            assert int(messages.request_code(request)) == frame.header.code
            sent[frame.header.opaque] = request
            requests += 1
        order = []
        for frame in remoting.split_frames(s2c.read_bytes()):
            assert frame.header.is_response and frame.header.code == 200
            assert frame.header.opaque in sent, f"{s2c.name}: reply {frame.header.opaque} has no request"
            request = sent[frame.header.opaque]
            response = remoting.decode_response(frame, messages.RESPONSE_TYPES[type(request)])
            assert java_json(messages.to_wire(response)) == frame.body
            order.append(frame.header.opaque)
            replies += 1
        assert len(set(order)) == len(order)
    assert requests + replies == 1025
    assert replies == 512


def test_replies_are_not_fifo_in_the_recording():
    """The recording shows out-of-order replies (runF n0-n2.11), which is why replies are matched by opaque."""
    data = (GOLDEN / "streams" / "runF" / "n0-n2.11.s2c.bin").read_bytes()
    opaques = [f.header.opaque for f in remoting.split_frames(data)]
    assert opaques != sorted(opaques)


@pytest.mark.parametrize("path", FRAMES, ids=lambda p: p.name)
def test_golden_frame_header_and_body_reencode_byte_for_byte(path):
    """Each recorded frame's header and body re-encode to exactly the recorded bytes."""
    data = path.read_bytes()
    serialize_type, raw_header, raw_body = raw_parts(data)
    assert serialize_type == 0
    frame = remoting.decode_frame(data)
    assert frame.header.to_json() == raw_header
    assert frame.body == raw_body
    assert remoting.encode_frame(frame.header, frame.body) == data


@pytest.mark.parametrize("name", PAIRS)
def test_golden_pair_messages_reencode_byte_for_byte(name):
    """Request and response decode into message objects whose encoded frames equal the recording."""
    req_path, resp_path = pair_files(name)
    req_frame = remoting.decode_frame(req_path.read_bytes())
    resp_frame = remoting.decode_frame(resp_path.read_bytes())
    assert req_frame.header.opaque == resp_frame.header.opaque
    request = remoting.decode_request(req_frame)
    response = remoting.decode_response(resp_frame, messages.RESPONSE_TYPES[type(request)])
    assert remoting.encode_request(request, req_frame.header.opaque) == req_path.read_bytes()
    assert remoting.encode_response(response, resp_frame.header.opaque) == resp_path.read_bytes()


@pytest.mark.parametrize("path", FRAMES, ids=lambda p: p.name)
def test_golden_body_round_trips_through_messages(path):
    """json.dumps(to_wire(from_wire(cls, json.loads(body)))) is the recorded body, byte for byte."""
    _, raw_header, raw_body = raw_parts(path.read_bytes())
    header = json.loads(raw_header)
    code = header["code"] if header["flag"] == 0 else json.loads(raw_parts(
        path.with_name(path.name.replace("-response", "-request")).read_bytes())[1])["code"]
    request_cls, response_cls = messages.RPCS[RequestCode(code)]
    cls = response_cls if header["flag"] & 1 else request_cls
    assert java_json(messages.to_wire(messages.from_wire(cls, json.loads(raw_body)))) == raw_body


@pytest.mark.parametrize("name", [p for p in PAIRS if p.startswith("051004-")])
def test_binary_push_carries_the_same_request_as_the_golden_json(name):
    """Every recorded PUSH, re-sent in the binary form, decodes to the same request object."""
    req_path, _ = pair_files(name)
    frame = remoting.decode_frame(req_path.read_bytes())
    assert frame.header.code == RequestCode.PUSH
    request = remoting.decode_request(frame)
    binary = remoting.decode_frame(remoting.encode_request(request, frame.header.opaque, binary=True))
    assert binary.header.ext_fields == {"dledger.body": "bin"}
    assert remoting.decode_request(binary) == request
    assert remoting.encode_request(remoting.decode_request(binary), frame.header.opaque) == req_path.read_bytes()


# -- replay: the client's requests, built by hand, encode to the recorded bytes ---------------

def _hand_built(name):
    """The message objects the Java CLI sent, written from frames/INDEX.md (not decoded by our codec)."""
    return {
        "050000-metadata": messages.MetadataRequest(group="g0", remote_id="n0"),
        "050000-metadata-from-follower": messages.MetadataRequest(group="g0", remote_id="n1"),
        "050001-append": messages.AppendEntryRequest(group="g0", remote_id="n0", body=b"Hello World"),
        "050002-get": messages.GetEntriesRequest(group="g0", remote_id="n0", begin_index=0),
        "050002-get-notleader": messages.GetEntriesRequest(group="g0", remote_id="n1", begin_index=0),
    }[name]


@pytest.mark.parametrize("name", [p for p in PAIRS if re.match(r"05000[012]-", p)])
def test_replay_client_requests_byte_for_byte(name):
    """METADATA, APPEND and GET requests built by hand encode to the recorded bytes given the recorded opaque."""
    data = pair_files(name)[0].read_bytes()
    opaque = json.loads(raw_parts(data)[1])["opaque"]
    assert remoting.encode_request(_hand_built(name), opaque) == data


def test_header_is_written_as_java_writes_it():
    """A reply header built by hand (code 200, flag 1, opaque 309) is the recorded Java header."""
    _, raw_header, _ = raw_parts((GOLDEN / "frames" / "051004-push-batch-append-3000b-response.bin").read_bytes())
    assert Header(200, 309, 1).to_json() == raw_header
