"""INSTALL_SNAPSHOT (51006) on the wire: the Java-style JSON body and dledger's binary body."""

import json

import pytest

from dledger.codes import RequestCode
from dledger.messages import InstallSnapshotRequest, InstallSnapshotResponse
from dledger.transport import remoting
from dledger.transport.remoting import BinaryBodyError, BodyError

REQ = InstallSnapshotRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=7, snapshot_index=1200,
                             snapshot_term=6, manifest='{"format":1}', path="kv/000001", offset=262144,
                             data=bytes(range(256)) * 3)


@pytest.mark.parametrize("binary", [False, True])
def test_request_round_trip(binary):
    """A chunk request decodes to the same request from either body; its header carries code 51006."""
    frame = remoting.decode_frame(remoting.encode_request(REQ, 5, binary=binary))
    assert frame.header.code == RequestCode.INSTALL_SNAPSHOT
    assert (frame.header.body_encoding == remoting.BODY_BINARY) is binary
    assert remoting.decode_request(frame) == REQ


def test_json_body_has_java_field_names_and_base64_data():
    """The JSON form is what fastjson would write: camelCase keys, byte[] as Base64."""
    body = json.loads(remoting.decode_frame(remoting.encode_request(REQ, 5)).body)
    assert body["snapshotIndex"] == 1200 and body["snapshotTerm"] == 6 and body["offset"] == 262144
    assert body["path"] == "kv/000001" and isinstance(body["data"], str)


def test_binary_body_carries_the_data_raw():
    """The binary body holds the chunk's bytes as they are (no Base64): it is barely bigger than the data."""
    frame = remoting.decode_frame(remoting.encode_request(REQ, 5, binary=True))
    assert bytes(REQ.data) in frame.body and len(frame.body) < len(REQ.data) + 400


def test_status_request_without_data_round_trips():
    """A request without a chunk (where do you stand?) has no data, in both forms."""
    req = InstallSnapshotRequest(group="g0", term=7, leader_id="n0", snapshot_index=5, snapshot_term=1, manifest="{}")
    for binary in (False, True):
        got = remoting.decode_request(remoting.decode_frame(remoting.encode_request(req, 1, binary=binary)))
        assert got.data is None and got.path is None and got == req


def test_damaged_binary_chunk_is_refused():
    """A chunk whose bytes changed in transit fails its CRC: BinaryBodyError, nothing reaches the member."""
    data = bytearray(remoting.encode_request(REQ, 5, binary=True))
    data[-10] ^= 0xFF
    with pytest.raises(BinaryBodyError, match="crc32c"):
        remoting.decode_request(remoting.decode_frame(bytes(data)))


def test_binary_meta_must_not_carry_data():
    """Data in the binary meta (as well as in the section) is malformed."""
    meta = json.dumps({"group": "g0", "data": "AAAA"}).encode()
    body = remoting._BIN_PREFIX.pack(1, 0, len(meta), 0, 0) + meta
    header = remoting.Header(int(RequestCode.INSTALL_SNAPSHOT), 1, 0, ext_fields=dict(remoting.BINARY_EXT_FIELDS))
    with pytest.raises(BinaryBodyError, match="without data"):
        remoting.decode_request(remoting.decode_frame(remoting.encode_frame(header, body)))


def test_out_of_range_snapshot_index_is_refused():
    """Every integer is bounded when decoded: an index that does not fit 64 bits never reaches the member."""
    header = remoting.Header(int(RequestCode.INSTALL_SNAPSHOT), 1, 0)
    body = json.dumps({"group": "g0", "snapshotIndex": 2 ** 70}).encode()
    with pytest.raises(BodyError, match="snapshotIndex"):
        remoting.decode_request(remoting.decode_frame(remoting.encode_frame(header, body)))


def test_response_round_trip():
    """The reply names the next place wanted, or installing / installed."""
    resp = InstallSnapshotResponse(group="g0", term=7, snapshot_index=1200, snapshot_term=6, next_path="kv/000002",
                                   next_offset=0, begin_index=0, end_index=-1)
    frame = remoting.decode_frame(remoting.encode_response(resp, 5))
    assert remoting.decode_response(frame, InstallSnapshotResponse) == resp
