"""The send path's fast paths give the same bytes and the same errors as the general code they skip."""

import json
import struct
from types import SimpleNamespace

import pytest
from dledger_rocketmq.broker.port import (
    SEND_EXTRA,
    SEND_MESSAGE_V2,
    BrokerPortProtocol,
    Reply,
    Request,
    SendOkFields,
    _ext_text,
    decode_json_header,
    encode_command,
    reply_frame,
    send_args,
    send_reply,
)
from dledger_rocketmq.store.commitlog import PutResult, PutStatus
from twisted.internet.testing import StringTransport

from dledger.transport.remoting import FLAG_RESPONSE, Header, HeaderError

ID = "7F00000100002A9F00000000000004D2"


def general_frame(request: Header, reply: Reply) -> bytes:
    """What reply_frame wrote before its template: the Header encoded (extFields as a plain dict)."""
    ext = dict(reply.ext) if reply.ext is not None else None
    return encode_command(Header(reply.code, request.opaque, FLAG_RESPONSE, "JAVA", 409, reply.remark, ext,
                                 request.serialize_type), reply.body)


@pytest.mark.parametrize("opaque, ids, queue_id, queue_offset", [
    (1, (ID,), 0, 0),
    (-2147483648, (ID,), 7, 2**63 - 1),            # opaque and offsets at their Java limits
    (2147483647, (ID, ID[:-1] + "3"), 3, 12),      # a batch: ids joined with commas
    (99, tuple(f"{ID[:-4]}{i:04X}" for i in range(941)), 5, 123456),
])
def test_a_successful_send_reply_is_byte_identical_to_the_general_encoding(opaque, ids, queue_id, queue_offset):
    reply = send_reply(PutResult(PutStatus.PUT_OK, msg_id=ids[0], queue_id=queue_id, queue_offset=queue_offset,
                                 msg_ids=ids, count=len(ids)))
    assert type(reply.ext) is SendOkFields and reply.ext == {**SEND_EXTRA, "msgId": ",".join(ids),
                                                              "queueId": str(queue_id),
                                                              "queueOffset": str(queue_offset)}
    for serialize_type in ("JSON", "ROCKETMQ"):
        request = Header(SEND_MESSAGE_V2, opaque, 0, "JAVA", 399, None, {}, serialize_type)
        assert reply_frame(request, reply) == general_frame(request, reply)


@pytest.mark.parametrize("msg_id", ['A"B', "A\\B", "Ä1", "", "A\x01B"])
def test_an_id_json_would_escape_takes_the_general_encoding(msg_id):
    """An id the template cannot carry verbatim (a relayed master's answer may hold anything) is JSON-encoded."""
    reply = Reply(0, None, SendOkFields(SEND_EXTRA, msgId=msg_id, queueId="1", queueOffset="2"))
    request = Header(SEND_MESSAGE_V2, 5, 0, "JAVA", 399, None, {}, "JSON")
    frame = reply_frame(request, reply)
    assert frame == general_frame(request, reply)
    assert json.loads(frame[8:])["extFields"]["msgId"] == msg_id


def test_changed_send_fields_take_the_general_encoding():
    """SendOkFields changed after send_reply (a key added, a constant changed) is encoded as it is."""
    request = Header(SEND_MESSAGE_V2, 5, 0, "JAVA", 399, None, {}, "JSON")
    for change in ({"extra": "1"}, {"TRACE_ON": "false"}):
        reply = send_reply(PutResult(PutStatus.PUT_OK, msg_id=ID, queue_id=1, queue_offset=2, msg_ids=(ID,)))
        reply.ext.update(change)
        assert json.loads(reply_frame(request, reply)[8:])["extFields"] == {**SEND_EXTRA, "msgId": ID, "queueId": "1",
                                                                            "queueOffset": "2", **change}


JAVA_HEADER = {"code": 310, "extFields": {"a": "pg", "b": "T", "e": "3", "f": "0", "i": "TAGS\x01A"},
               "flag": 0, "language": "JAVA", "opaque": 12345, "serializeTypeCurrentRPC": "JSON", "version": 399}


@pytest.mark.parametrize("changes", [
    {},
    {"extFields": {"a": 1, "b": True, "c": None, "d": [1, "x"], "e": "s"}},  # ali-ons: values of any JSON type
    {"extFields": None}, {"language": 7}, {"remark": "r"}, {"flag": 1, "opaque": -(2**31), "version": 2**31 - 1},
])
def test_json_header_fast_path_decodes_as_the_general_rules(changes):
    obj = {**JAVA_HEADER, **changes}
    if obj["extFields"] is None:
        del obj["extFields"]
    h = decode_json_header(json.dumps(obj).encode())
    ext = obj.get("extFields")
    assert (h.code, h.opaque, h.flag, h.version) == (obj["code"], obj["opaque"], obj["flag"], obj["version"])
    assert h.language == str(obj["language"]) and h.remark == obj.get("remark")
    assert h.ext_fields == ({k: _ext_text(v) for k, v in ext.items()} if ext is not None else None)
    assert all(type(v) is str for v in (h.ext_fields or {}).values())


@pytest.mark.parametrize("field, value", [("code", True), ("opaque", 2**31), ("flag", "1"), ("version", 1.5),
                                          ("code", None)])
def test_json_header_with_a_bad_int_names_the_field(field, value):
    obj = {**JAVA_HEADER, field: value}
    with pytest.raises(HeaderError, match=f"'{field}' must be a Java int"):
        decode_json_header(json.dumps(obj).encode())


def test_a_request_decodes_its_send_header_once():
    """Every send handler (the transaction check, the send itself) reads the same decoded header."""
    req = Request(SEND_MESSAGE_V2, {"a": "pg", "b": "T", "e": "3", "f": "4"})
    first = req.sending
    assert first is req.sending and first == send_args(SEND_MESSAGE_V2, req.ext)
    assert (first.topic, first.queue_id, first.sys_flag) == ("T", 3, 4)


class _NoDelayTransport(StringTransport):
    no_delay = False

    def setTcpNoDelay(self, enabled):
        self.no_delay = enabled


@pytest.mark.parametrize("text", [
    '{"code":310,"opaque":1}',
    ' {"code":310,"opaque":1} ',                       # whitespace around: json.loads's rules
    '{"code":310,"opaque":1}{"code":11}',              # trailing data after the object
    '{"code":310,"opaque":1',                          # truncated
    '{"code":310,"opaque":1,}',                        # a trailing comma
    '{"code":310,"opaque":NaN}',                       # what json.loads takes, taken
    '[310, 1]',                                        # not an object
    '\ufeff{"code":310,"opaque":1}',                   # a BOM
    '{"code":310,"remark":"\\u0001\\ud800","opaque":1}',  # escapes, a lone surrogate
])
def test_json_header_scanner_accepts_and_refuses_what_json_loads_does(text):
    """The header's direct scanner call (no json.loads wrapper) decodes exactly what json.loads decodes and
    refuses the rest with json.loads's error."""
    from dledger_rocketmq.broker.port import _loads
    try:
        expected = json.loads(text)
    except ValueError as exc:
        with pytest.raises(ValueError) as got:
            _loads(text)
        assert str(got.value) == str(exc)
    else:
        assert repr(_loads(text)) == repr(expected)


def test_a_request_is_a_slotted_object_with_its_send_header_in_a_slot():
    """One Request per frame: no instance dict (slots), the send header cached in its slot, not in a dict."""
    req = Request(SEND_MESSAGE_V2, {"a": "pg", "b": "T", "e": "3"})
    assert not hasattr(req, "__dict__")
    assert req._sending is None
    args = req.sending
    assert req._sending is args and req == Request(SEND_MESSAGE_V2, {"a": "pg", "b": "T", "e": "3"})


def test_the_port_turns_nagle_off_on_every_connection():
    """Replies are small writes: with Nagle on, a synchronous producer waits for its own delayed ACK (RocketMQ's
    server sets TCP_NODELAY too).  A transport without the option (a unix socket) is left alone."""
    port = SimpleNamespace(max_frame_size=1 << 20)
    proto = BrokerPortProtocol(port)
    transport = _NoDelayTransport()
    proto.makeConnection(transport)
    assert transport.no_delay is True
    BrokerPortProtocol(port).makeConnection(StringTransport())  # no setTcpNoDelay: no error


def test_the_send_micro_benchmark_times_each_step():
    """python -m dledger_rocketmq.tools.bench_send keeps working (figures printed, never asserted)."""
    from dledger_rocketmq.tools import bench_send

    out = bench_send.run(calls=10)
    assert set(out) == {"decode_json_header_us", "send_header_us", "send_reply_frame_us", "send_ok_frame_us"}
    assert all(v > 0 for v in out.values())


def test_the_put_path_micro_benchmark_runs_both_ways(capsys):
    """bench_send --puts: a simulated group's single puts one by one and gathered, each answered (a bounded run)."""
    from dledger_rocketmq.tools import bench_send

    bench_send.main(["--calls", "10", "--puts", "4", "--put-rounds", "2"])
    line = capsys.readouterr().out
    assert "put_one_us" in line and "put_gathered_us" in line


def test_the_port_handle_micro_benchmark_answers_its_frame(capsys):
    """bench_send --handle: one producer frame through the simulated master's port, its put answered at once;
    the reply checked SUCCESS (port_handle raises otherwise); a bounded run, the figure printed, never asserted."""
    from dledger_rocketmq.tools import bench_send

    bench_send.main(["--calls", "10", "--handle"])
    assert "port_handle_us" in capsys.readouterr().out


def test_the_port_path_micro_benchmark_answers_every_send():
    """bench_send --port: whole SEND_MESSAGE_V2 frames through a simulated master's port, every one answered
    SUCCESS (port_path raises otherwise); a bounded run, the figure printed, never asserted."""
    from dledger_rocketmq.tools import bench_send

    out = bench_send.port_path(sends=4, rounds=2)
    assert set(out) == {"port_send_us", "port_read_us"} and out["port_send_us"] > out["port_read_us"] > 0


def test_the_batch_path_micro_benchmark_answers_every_request():
    """bench_send --batch: SEND_BATCH_MESSAGE requests through a simulated master's port, alone and together, every
    one answered SUCCESS (batch_path raises otherwise); a bounded run, the figures printed, never asserted."""
    from dledger_rocketmq.tools import bench_send

    out = bench_send.batch_path(size=3, rounds=1)
    assert set(out) == {"batch_alone_us", "batch_together_us"} and min(out.values()) > 0


def test_the_batch_frames_decode_as_the_stock_producers_batch():
    """The benchmark's batch frames are what the port takes from the stock producer: code 320, the V2 short names,
    N messages in the body with their own UNIQ_KEY."""
    from dledger_rocketmq.broker.port import decode_json_header, send_args
    from dledger_rocketmq.common.batch import decode_batch
    from dledger_rocketmq.tools import bench_send

    frames = bench_send.batch_frames(5, requests=2)
    assert len(frames) == 2
    for k, frame in enumerate(frames):
        length, head_len = struct.unpack_from(">iI", frame)
        assert length == len(frame) - 4
        header = decode_json_header(frame[8:8 + head_len])
        assert header.code == 320 and header.opaque == k
        args = send_args(header.code, header.ext_fields)
        assert args.batch and args.topic == bench_send.TOPIC and args.properties == "WAIT\x01true"
        items = decode_batch(frame[8 + head_len:])
        assert [len(i.body) for i in items] == [1024] * 5
        assert len({i.properties for i in items}) == 5
