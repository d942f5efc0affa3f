"""The lean send path's record (``SendRecord``) encoded in one pass (``encode_send``) gives the bytes, or the
error, ``encode_record`` gives for the same record (issue #28, Round 2f), and the gathered put stores the same."""

from __future__ import annotations

import dataclasses

import pytest
from dledger_rocketmq.common.message import (
    BORNHOST_V6_FLAG,
    STOREHOST_V6_FLAG,
    Address,
    MessageRecord,
    SendRecord,
    decode_record,
    encode_record,
    encode_send,
)
from rmq_cluster_util import broker_cluster, master

V4, V4B = Address("10.1.2.3", 40123), Address("127.0.0.1", 10911)
V6 = Address("fd00::1", 40123)
BASE = SendRecord("BenchTopic", bytes(range(256)) * 4, b"TAGS\x01TagA\x02UNIQ_KEY\x01FD00", 3, 0, 0, 1764258000000,
                  V4, 0)
LIMIT = 4 * 1024 * 1024


def _outcome(fn):
    try:
        return fn()
    except Exception as exc:  # the same exception type and message either way
        return (type(exc).__name__, str(exc))


def _both(send: SendRecord, queue_offset: int = 7, store_host: Address = V4B, max_size: int = LIMIT):
    fast = _outcome(lambda: encode_send(send, queue_offset=queue_offset, store_host=store_host, max_size=max_size))
    general = _outcome(lambda: encode_record(send.record(), max_size=max_size, queue_offset=queue_offset,
                                             physical_offset=0, store_host=store_host))
    return fast, general


@pytest.mark.parametrize("send, kw", [
    (BASE, {}),
    (BASE._replace(body=b""), {}),
    (BASE._replace(properties=b""), {}),
    (BASE._replace(topic="Tøpic日本"), {}),
    (BASE._replace(topic="T" * 127), {}),
    (BASE._replace(topic="T" * 128), {}),                            # TOPICLEN is one signed byte
    (BASE._replace(topic=""), {}),
    (BASE._replace(topic="T\ud800"), {}),                           # not encodable: the same UnicodeEncodeError
    (BASE._replace(properties=b"p" * 32767), {}),
    (BASE._replace(properties=b"p" * 32768), {}),
    (BASE._replace(sys_flag=BORNHOST_V6_FLAG | STOREHOST_V6_FLAG | 0x1), {}),  # the v6 bits follow the hosts
    (BASE._replace(sys_flag=-1), {}),
    (BASE._replace(sys_flag=2**31), {}),
    (BASE._replace(queue_id=2**31 - 1, flag=-2**31, reconsume_times=2**31 - 1), {}),
    (BASE._replace(queue_id=2**31), {}),
    (BASE._replace(flag=-2**31 - 1), {}),
    (BASE._replace(reconsume_times=2**31), {}),
    (BASE._replace(born_timestamp=2**63 - 1), {}),
    (BASE._replace(born_timestamp=2**63), {}),
    (BASE, {"queue_offset": 2**63 - 1}),
    (BASE, {"queue_offset": 2**63}),
    (BASE, {"queue_offset": -1}),
    (BASE._replace(born_host=V6), {}),
    (BASE, {"store_host": Address("::1", 10911)}),
    (BASE._replace(born_host=Address("not-an-ip", 1)), {}),
    (BASE._replace(born_host=Address("10.0.0.1", 2**31)), {}),
    (BASE._replace(born_host=Address("10.0.0.1", -1)), {}),
    (BASE, {"max_size": BASE.size}),                                # exactly the record's size
    (BASE, {"max_size": BASE.size - 1}),
])
def test_encode_send_gives_what_encode_record_gives(send, kw):
    fast, general = _both(send, **kw)
    assert fast == general
    if isinstance(general, bytes):
        assert decode_record(general).body == send.body


def test_the_fixed_part_is_the_record_layouts():
    """The one-pass fixed part is 88 bytes: TOTALSIZE..BODYLEN with two IPv4 hosts (91 less TOPICLEN and
    PROPERTIESLEN), so a change of either layout shows."""
    from dledger_rocketmq.common.message import _V4_FIXED

    assert _V4_FIXED.size == 88 and encode_send(BASE, queue_offset=0, store_host=V4B, max_size=LIMIT)[:4] == (
        (91 + 1024 + 10 + 23).to_bytes(4, "big"))


def test_a_send_record_is_a_message_record_by_its_fields():
    """Every field of a SendRecord is a MessageRecord field of the same name and value; size agrees."""
    record = BASE.record()
    assert set(SendRecord._fields) <= {f.name for f in dataclasses.fields(MessageRecord)}
    assert all(getattr(record, name) == getattr(BASE, name) for name in SendRecord._fields)
    assert record.size == BASE.size
    v6 = BASE._replace(sys_flag=BORNHOST_V6_FLAG, born_host=V6)
    assert v6.size == v6.record().size


def test_a_gathered_send_record_is_stored_as_its_message_record(tmp_path):
    """The same send put gathered as a SendRecord and as a MessageRecord: the same stored record, but for its
    offsets and store time."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    answers = []

    class Sink:
        @staticmethod
        def put_answered(token, result):
            answers.append((token, result))

        @staticmethod
        def answers_done():
            pass
    b.commitlog.gather()
    assert b.put_gathered(BASE._replace(topic="T"), Sink, "fast")
    assert b.put_gathered(BASE._replace(topic="T").record(), Sink, "general")
    b.commitlog.flush_gathered()
    assert cluster.run_until(lambda: len(answers) == 2, 10), "gathered puts never answered"
    stored = {}
    for token, result in answers:
        raw = b.get_message(result.physical_offset, BASE._replace(topic="T").size)
        stored[token] = dataclasses.replace(decode_record(raw), queue_offset=0, physical_offset=0)
    assert stored["fast"] == stored["general"] and stored["fast"].body == BASE.body
    assert [r.queue_offset for _, r in answers] == [0, 1]


def test_the_common_send_is_encoded_in_one_pass(monkeypatch):
    """Two IPv4 hosts, fields in range: encode_send does not fall back to encode_record (else it buys nothing)."""
    from dledger_rocketmq.common import message

    expected = encode_record(BASE.record(), max_size=LIMIT, queue_offset=7, physical_offset=0, store_host=V4B)

    def refuse(*args, **kwargs):
        raise AssertionError("encode_record called for the common send")
    monkeypatch.setattr(message, "encode_record", refuse)
    assert encode_send(BASE, queue_offset=7, store_host=V4B, max_size=LIMIT) == expected


def test_the_ports_lean_path_puts_a_send_record_and_a_delayed_send_a_message_record(tmp_path):
    """A stock producer's single send reaches the put as a SendRecord (no MessageRecord made); one with a DELAY
    level as a MessageRecord (the schedule rewrite needs one); both stored and answered SUCCESS."""
    from dledger_rocketmq.broker.port import SUCCESS, BrokerPort, encode_command
    from test_rmq_port_answers import _connect, _replies, _send_frames

    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    port = BrokerPort(b, "tcp:0")
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(1, first_opaque=1))  # creates the golden topic
    assert cluster.run_until(lambda: bool(tr.value()), 10)
    kinds = []
    real = b.commitlog.put_gathered

    def spy(record, sink, token):
        kinds.append(type(record).__name__)
        return real(record, sink, token)
    b.commitlog.put_gathered = spy
    tr.clear()
    [stock] = _replies(_send_frames(1, first_opaque=20))
    ext = {**stock.header.ext_fields, "i": "DELAY\x012\x02" + stock.header.ext_fields["i"]}
    delay = encode_command(dataclasses.replace(stock.header, ext_fields=ext), stock.body)
    assert _replies(delay)[0].header.ext_fields["i"].startswith("DELAY\x012")
    proto.dataReceived(_send_frames(2, first_opaque=10) + delay)
    assert cluster.run_until(lambda: len(_replies(tr.value())) == 3, 10)
    assert [r.header.code for r in _replies(tr.value())] == [SUCCESS] * 3
    assert kinds == ["SendRecord", "SendRecord", "MessageRecord"]
