"""The master's lean answer path for single sends (issue #28 1c/1d): no Deferred per send, one statistics update
per read's answer batch, the replies of one commit in one write; every send still answered exactly once."""

from __future__ import annotations

import dataclasses

import pytest
from conftest import GOLDEN
from dledger_rocketmq.broker.brokerstats import BROKER_PUT_NUMS, TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BrokerStatsManager
from dledger_rocketmq.broker.port import SUCCESS, BrokerPort, decode_header, encode_command
from dledger_rocketmq.store import commitlog
from dledger_rocketmq.store.commitlog import PutResult, PutStatus
from rmq_cluster_util import broker_cluster, master
from twisted.internet import tcp
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from dledger.transport.outbox import send_written
from dledger.transport.remoting import FrameSplitter

FRAMES = GOLDEN / "frames"


class WritesTransport(StringTransport):
    """A StringTransport that also keeps each write apart."""

    def __init__(self):
        super().__init__()
        self.writes: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.writes.append(data)
        super().write(data)


def _send_frames(n: int, first_opaque: int = 100) -> bytes:
    """``n`` SEND_MESSAGE_V2 frames (the golden request) with opaques first_opaque.. in order."""
    [golden] = list(FrameSplitter(header_decoder=decode_header).feed((FRAMES / "310-send-message-v2-request.bin")
                                                                       .read_bytes()))
    return b"".join(encode_command(dataclasses.replace(golden.header, opaque=first_opaque + k), golden.body)
                    for k in range(n))


def _replies(data: bytes) -> list:
    return list(FrameSplitter(header_decoder=decode_header).feed(data))


def _port_with_topic(tmp_path):
    """A master's port after one send (the golden send's topic exists from then on), and its cluster."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    port = BrokerPort(b, "tcp:0")
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(1, first_opaque=1))
    assert cluster.run_until(lambda: bool(tr.value()), 10)
    assert [r.header.code for r in _replies(tr.value())] == [SUCCESS]
    return cluster, b, port


def _connect(port):
    proto = port.factory.buildProtocol(None)
    tr = WritesTransport()
    proto.makeConnection(tr)
    return proto, tr


def test_the_replies_of_one_read_are_written_together_in_request_order(tmp_path):
    """Four single sends in one read: once committed, their four SUCCESS replies (opaques in request order,
    consecutive queue offsets) go out in ONE transport write, not one each."""
    cluster, _b, port = _port_with_topic(tmp_path)
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(4))
    assert cluster.run_until(lambda: len(_replies(tr.value())) == 4, 10)
    cluster.run(1.0)
    replies = _replies(tr.value())
    assert [r.header.opaque for r in replies] == [100, 101, 102, 103]
    assert [r.header.code for r in replies] == [SUCCESS] * 4
    offsets = [int(r.header.ext_fields["queueOffset"]) for r in replies]
    assert offsets == list(range(offsets[0], offsets[0] + 4))
    assert len(tr.writes) == 1


def test_every_lean_send_is_counted_in_the_statistics(tmp_path):
    """Reads of 3 and 2 single sends: the broker statistics count 5 sends of 5 messages more (one update per
    read, the same totals as one per send)."""
    cluster, b, port = _port_with_topic(tmp_path)
    stats = port.broker_stats
    [topic] = stats.store.put_times
    before = (stats.store.put_times[topic], stats.item(TOPIC_PUT_NUMS, topic).times,
              stats.item(TOPIC_PUT_NUMS, topic).value, sum(stats.store.distribute))
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(3))
    proto.dataReceived(_send_frames(2, first_opaque=200))
    assert cluster.run_until(lambda: len(_replies(tr.value())) == 5, 10)
    after = (stats.store.put_times[topic], stats.item(TOPIC_PUT_NUMS, topic).times,
             stats.item(TOPIC_PUT_NUMS, topic).value, sum(stats.store.distribute))
    assert [a - w for a, w in zip(after, before, strict=True)] == [5, 5, 5, 5]
    assert stats.store.put_failed == 0


def test_sends_refused_at_the_flush_are_each_answered_once_together(tmp_path):
    """The master stops taking puts (roles switching): a read's three sends are answered at once, each with
    an error, in one write, and counted as failed puts."""
    cluster, b, port = _port_with_topic(tmp_path)
    b.commitlog.writable = lambda: False
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(3))
    replies = _replies(tr.value())
    assert [r.header.opaque for r in replies] == [100, 101, 102]
    assert all(r.header.code != SUCCESS for r in replies)
    assert len(tr.writes) == 1
    assert port.broker_stats.store.put_failed == 3
    cluster.run(5.0)
    assert len(_replies(tr.value())) == 3  # nothing more


def test_sends_of_a_master_that_loses_its_quorum_are_each_answered_once(tmp_path):
    """The master is cut off after taking a read's three sends: each is answered exactly once, with an error
    (never SUCCESS: no quorum holds them), and never again."""
    cluster, b, port = _port_with_topic(tmp_path)
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(3))
    cluster.isolate(b.server.self_id)
    assert cluster.run_until(lambda: len(_replies(tr.value())) >= 3, 60)
    cluster.run(20.0)
    replies = _replies(tr.value())
    assert sorted(r.header.opaque for r in replies) == [100, 101, 102]
    assert all(r.header.code != SUCCESS for r in replies)


def test_a_connection_closed_before_the_commit_gets_no_write_but_its_sends_are_counted(tmp_path):
    """The client goes away while its sends wait for the commit: nothing is written to the closed connection
    and the three stored sends are still counted."""
    cluster, b, port = _port_with_topic(tmp_path)
    stats = port.broker_stats
    [topic] = stats.store.put_times
    before = stats.store.put_times[topic]
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(3))
    proto.connectionLost(None)
    assert cluster.run_until(lambda: stats.store.put_times[topic] == before + 3, 10)
    assert tr.writes == []


def test_a_failing_statistics_update_still_answers_every_send(tmp_path):
    """A bug in the statistics (raising) must not leave the sends unanswered: their replies are written, and
    SUCCESS (they are stored: before the lean path, such a send was answered SYSTEM_ERROR)."""
    cluster, b, port = _port_with_topic(tmp_path)

    def broken(*_a, **_k):
        raise RuntimeError("stats bug")
    port.broker_stats.on_puts = port.broker_stats.on_put = broken
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(2))
    assert cluster.run_until(lambda: len(_replies(tr.value())) == 2, 10)
    assert [r.header.code for r in _replies(tr.value())] == [SUCCESS, SUCCESS]


@pytest.mark.parametrize("ok", [True, False])
def test_on_puts_counts_what_as_many_on_put_calls_count(ok):
    """One update for n sends alike == n updates of one: every counter, the latency distribution, the items."""
    one, many = BrokerStatsManager(0), BrokerStatsManager(0)
    for _ in range(3):
        one.on_put("T", 1, 100, 7, ok)
    many.on_puts("T", 3, 3, 300, 7, ok)
    one.on_put("T", 1, 50, 0, ok)
    many.on_puts("T", 1, 1, 50, 0, ok)
    assert dataclasses.asdict(one.store) == dataclasses.asdict(many.store)
    for name in (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, BROKER_PUT_NUMS):
        assert {k: (i.value, i.times) for k, i in one.sets[name].items()} == \
               {k: (i.value, i.times) for k, i in many.sets[name].items()}


class _Sink:
    def __init__(self, fail_on=None):
        self.answered, self.done, self.fail_on = [], 0, fail_on

    def put_answered(self, token, result):
        if token == self.fail_on:
            raise RuntimeError("a bad answer")
        self.answered.append((token, result.status))

    def answers_done(self):
        self.done += 1


def test_a_raising_answer_does_not_stop_the_others_of_the_read():
    """One put's answer raising (a bug, logged) leaves the others answered, and each sink's batch finished once."""
    a, b = _Sink(fail_on=1), _Sink()
    ok = PutResult(PutStatus.PUT_OK, count=1)
    commitlog.answer_puts([(a, 0, ok), (a, 1, ok), (b, 2, ok), (a, 3, ok)], None)
    assert a.answered == [(0, PutStatus.PUT_OK), (3, PutStatus.PUT_OK)]
    assert b.answered == [(2, PutStatus.PUT_OK)]
    assert (a.done, b.done) == (1, 1)
    failed = PutResult(PutStatus.FLUSH_SLAVE_TIMEOUT)
    commitlog.answer_puts([(b, 4, ok)], failed)  # one result for all: the refusal's
    assert b.answered[-1] == (4, PutStatus.FLUSH_SLAVE_TIMEOUT)


def test_a_commit_answered_before_the_puts_are_listed_waits_for_them():
    """A member may answer the read's append inside the append (a group of one commits at once): the answer
    waits until the puts are listed, then answers each once."""
    from dledger.codes import ResponseCode
    from dledger.messages import AppendEntryResponse

    sink = _Sink()
    puts = commitlog._ReadPuts()
    commitlog._answer_committed(puts, AppendEntryResponse(code=int(ResponseCode.SUCCESS)))
    assert sink.answered == []
    puts.answers.append((sink, 7, PutResult(PutStatus.PUT_OK, count=1)))
    puts.listed_all()
    assert sink.answered == [(7, PutStatus.PUT_OK)] and sink.done == 1


_ID = "7F00000100002A9F00000000000004D2"


@pytest.mark.parametrize("result", [
    PutResult(PutStatus.PUT_OK, msg_id=_ID, queue_id=3, queue_offset=12, physical_offset=1234, msg_ids=(_ID,),
              count=1),
    PutResult(PutStatus.PUT_OK, msg_id=_ID, queue_id=0, queue_offset=0, msg_ids=(_ID, _ID), count=2),
    PutResult(PutStatus.PUT_OK, msg_id=_ID, queue_id=7, queue_offset=2 ** 40),  # msg_ids empty: msg_id
    PutResult(PutStatus.PUT_OK, msg_id="not \"hex\"", queue_id=1, queue_offset=1),  # escaped by JSON: general path
    PutResult(PutStatus.PUT_OK),  # no id at all
    PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error="n1 is not the master"),
    PutResult(PutStatus.MESSAGE_ILLEGAL, error="bad"),
])
@pytest.mark.parametrize("serialize_type", ["JSON", "ROCKETMQ"])
@pytest.mark.parametrize("opaque", [0, 77, -5, 2 ** 31 - 1])
def test_send_ok_frame_is_the_reply_frame_of_send_reply(result, serialize_type, opaque):
    """The lean path's reply frame is byte for byte what the general path writes for the same put result."""
    from dledger_rocketmq.broker.port import reply_frame, send_ok_frame, send_reply

    from dledger.transport.remoting import Header
    header = Header(310, opaque, 0, "JAVA", 399, None, {}, serialize_type)
    assert send_ok_frame(header, result) == reply_frame(header, send_reply(result))


def test_lean_sends_are_answered_while_the_members_statistics_are_on(tmp_path):
    """With dledger's statistics on, the member answers the read's append through a Deferred (they watch it):
    the lean sends are still each answered once, SUCCESS, in one write."""
    cluster, b, port = _port_with_topic(tmp_path)
    b.server.enable_stats()
    proto, tr = _connect(port)
    proto.dataReceived(_send_frames(3))
    assert cluster.run_until(lambda: len(_replies(tr.value())) == 3, 10)
    cluster.run(1.0)
    assert [r.header.code for r in _replies(tr.value())] == [SUCCESS] * 3
    assert len(tr.writes) == 1


# -- the replies leave at the end of the work that wrote them (dledger.transport.outbox) -------------------------


class _Accepted(tcp.Connection):
    """A TCP connection over an accepted socket, with the peer address the port reads at connection."""

    def getPeer(self):
        return IPv4Address("TCP", *self.socket.getpeername())


def _on_real_socket(port, sock, reactor):
    proto = port.factory.buildProtocol(None)
    conn = _Accepted(sock, proto, reactor)
    conn.connected = 1
    proto.makeConnection(conn)
    return proto, conn, reactor


def _peer_reads(peer) -> bytes:
    try:
        return peer.recv(1 << 20)
    except BlockingIOError:
        return b""


@pytest.mark.network
def test_a_commits_answers_leave_at_the_end_of_the_work_that_wrote_them(tmp_path, wire, never_polls):
    """The lean answers of a commit are registered with the outbox: the end of the work that committed (a
    follower's reply read, a disk job's results: each calls ``send_written``) sends them, no poll needed; and a
    reply written while a read is handled leaves at the end of that read."""
    ours, peer = wire
    cluster, _b, port = _port_with_topic(tmp_path)
    proto, conn, reactor = _on_real_socket(port, ours, never_polls)
    proto.dataReceived(_send_frames(3))
    assert cluster.run_until(lambda: conn in reactor.writers, 10)  # committed and answered: buffered
    assert _peer_reads(peer) == b""
    send_written()  # what the commit's stretch of work ends with
    replies = _replies(_peer_reads(peer))
    assert [r.header.opaque for r in replies] == [100, 101, 102]
    assert [r.header.code for r in replies] == [SUCCESS] * 3
    assert conn not in reactor.writers

    # A request answered in its read (here a malformed batch): the read's end sends the reply.
    [golden] = _replies(_send_frames(1))
    bad = dataclasses.replace(golden.header, code=320, opaque=900)
    proto.dataReceived(encode_command(bad, b"\x00\x00"))
    [reply] = _replies(_peer_reads(peer))
    assert reply.header.opaque == 900 and reply.header.code != SUCCESS
