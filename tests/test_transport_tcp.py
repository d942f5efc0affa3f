"""The TCP transport, driven by a MemoryReactorClock and iosim pumps (deterministic, no sockets)."""

import random
from pathlib import Path

import pytest
from twisted.internet.defer import CancelledError, Deferred, fail, succeed
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure
from twisted.test.iosim import ConnectionCompleter
from zope.interface import implementer
from zope.interface.verify import verifyObject

from dledger import messages, plugins
from dledger.codes import PushType, ResponseCode
from dledger.config import make_config
from dledger.entry import HEADER_SIZE, Entry
from dledger.errors import DLedgerError
from dledger.interfaces import (
    ANSWER_LATER,
    IAnsweringRequestHandler,
    IBatchRequestHandler,
    IRequestHandler,
    ITransport,
)
from dledger.transport import base as transport_base
from dledger.transport import remoting
from dledger.transport.client import Backoff, client_endpoint_description
from dledger.transport.protocol import BinaryBodyRefused, RemotingProtocol, RemotingServerFactory
from dledger.transport.tcp import TcpTransport, listen_endpoint_description

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"
GOLDEN = Path(__file__).parent / "golden" / "java-dledger-0.3.2"


def config(self_id="n0", **kw):
    return make_config(group="g0", self_id=self_id, peers=PEERS, **kw)


# -- handlers ---------------------------------------------------------------------------------

@implementer(IRequestHandler)
class Echo:
    """Answers every request at once with its response type, copying the request's base fields."""

    def __init__(self):
        self.seen = []

    def handle_request(self, request):
        self.seen.append(request)
        return succeed(request.base_reply(messages.RESPONSE_TYPES[type(request)]))


@implementer(IRequestHandler)
class Manual:
    """Keeps every request with its Deferred; the test answers them in any order (or never)."""

    def __init__(self):
        self.calls = []

    def handle_request(self, request):
        d = Deferred()
        self.calls.append((request, d))
        return d

    def answer(self, i):
        request, d = self.calls[i]
        d.callback(request.base_reply(messages.RESPONSE_TYPES[type(request)]))


@implementer(IRequestHandler)
class Raising:
    def __init__(self, error):
        self.error = error

    def handle_request(self, request):
        return fail(self.error)


class Events(list):
    def __call__(self, event):
        self.append(event)

    def at_least(self, level):
        return [e for e in self if e["log_level"] >= level]


@pytest.fixture
def events(monkeypatch):
    """Log events of the protocol (requests served and sent)."""
    collected = Events()
    monkeypatch.setattr(RemotingProtocol, "log", Logger(observer=collected))
    monkeypatch.setattr(transport_base, "log", Logger(observer=collected))
    return collected


class FixedRandom:
    """An RNG stub for the backoff: always the same draw."""

    def __init__(self, value):
        self.value = value

    def random(self):
        return self.value


def result_of(d):
    """The result of a fired Deferred (a Failure's value is raised)."""
    out = []
    d.addBoth(out.append)
    assert out, "Deferred has not fired"
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def failure_of(d, kind=DLedgerError):
    out = []
    d.addBoth(out.append)
    assert out, "Deferred has not fired"
    assert hasattr(out[0], "check") and out[0].check(kind), out[0]
    return out[0].value


class Net:
    """A server transport (n0) and a client transport (n1) on one MemoryReactorClock."""

    def __init__(self, handler, **client_kw):
        self.reactor = MemoryReactorClock()
        self.server = TcpTransport(config("n0"), self.reactor)
        result_of(self.server.start(handler))
        client_kw.setdefault("backoff", Backoff(rng=FixedRandom(0.0)))
        self.client = TcpTransport(config("n1"), self.reactor, **client_kw)
        self.completer = ConnectionCompleter(self.reactor)
        self.pump = None

    def connect(self):
        self.pump = self.completer.succeedOnce()
        assert self.pump is not None, "no connection attempt to complete"
        return self.pump

    def flush(self):
        self.pump.flush(advanceClock=False)


# -- interface, plugin, endpoints ----------------------------------------------------------------

def test_tcp_transport_provides_itransport():
    """TcpTransport implements ITransport (verifyObject)."""
    assert verifyObject(ITransport, TcpTransport(config(), MemoryReactorClock()))


def test_tcp_transport_is_a_registered_builtin_plugin():
    """The 'tcp' transport type is found through the plugin manager and builds a TcpTransport."""
    pm = plugins.make_plugin_manager()
    transport_type = plugins.get_transport_type("tcp", pm)
    made = transport_type.make_transport(config(), MemoryReactorClock(), binary_push=False)
    assert isinstance(made, TcpTransport) and made.binary_push is False
    assert plugins.BUILTIN_PLUGINS["tcp"] == "dledger.transport.tcp"


def test_default_listen_endpoint_is_own_port_on_own_host():
    """Without config.listen a member listens on its own port and host; config.listen overrides."""
    reactor = MemoryReactorClock()
    result_of(TcpTransport(config("n1"), reactor).start(Echo()))
    port, _, _, interface = reactor.tcpServers[0]
    assert (port, interface) == (20912, "127.0.0.1")
    other = MemoryReactorClock()
    result_of(TcpTransport(config("n1", listen="tcp:31000"), other).start(Echo()))
    assert other.tcpServers[0][0] == 31000


def test_endpoint_strings():
    """Peer addresses map to tcp client endpoints (tcp6 for IPv6); endpoint strings pass through."""
    assert client_endpoint_description("127.0.0.1:20911") == "tcp:host=127.0.0.1:port=20911:timeout=3"
    assert client_endpoint_description("[::1]:20911", 5).startswith("tcp6:host=\\:\\:1:port=20911")
    assert client_endpoint_description("unix:path=/tmp/s") == "unix:path=/tmp/s"
    from dledger.config import Peer
    assert listen_endpoint_description(Peer("n0", "127.0.0.1", 20911)) == "tcp:20911:interface=127.0.0.1"


def test_unknown_peer_fails_at_once():
    """send() to an id outside peers is an already-failed Deferred with UNKNOWN_MEMBER; nothing connects."""
    reactor = MemoryReactorClock()
    transport = TcpTransport(config(), reactor)
    error = failure_of(transport.send("n9", messages.HeartBeatRequest(group="g0")))
    assert error.code == ResponseCode.UNKNOWN_MEMBER and "'n9'" in str(error)
    assert reactor.tcpClients == []


def test_address_override_for_unknown_member_is_refused():
    """An address override must name a member."""
    with pytest.raises(ValueError, match="unknown members"):
        TcpTransport(config(), MemoryReactorClock(), addresses={"n7": "127.0.0.1:1"})


# -- request/response ----------------------------------------------------------------------------

def test_request_round_trip_copies_opaque_and_decodes_the_reply():
    """A request reaches the handler decoded; its reply comes back as the response type."""
    handler = Echo()
    net = Net(handler)
    d = net.client.send("n0", messages.VoteRequest(group="g0", term=4, leader_id="n1", remote_id="n0"))
    net.connect()
    reply = result_of(d)
    assert isinstance(reply, messages.VoteResponse) and reply.term == 4 and reply.remote_id == "n0"
    assert handler.seen == [messages.VoteRequest(group="g0", term=4, leader_id="n1", remote_id="n0")]


def test_pipelined_requests_answered_in_reverse_order_are_matched_by_opaque():
    """Many requests share one connection; replies in reverse order reach the right callers."""
    handler = Manual()
    net = Net(handler)
    ds = [net.client.send("n0", messages.HeartBeatRequest(group="g0", term=t)) for t in range(8)]
    net.connect()
    assert len(handler.calls) == 8 and net.reactor.tcpClients == []  # one connection, all delivered
    for i in reversed(range(8)):
        handler.answer(i)
    net.flush()
    assert [result_of(d).term for d in ds] == list(range(8))
    more = net.client.send("n0", messages.HeartBeatRequest(group="g0", term=99))
    net.flush()
    handler.answer(8)
    net.flush()
    assert result_of(more).term == 99 and net.reactor.tcpClients == []


def test_request_timeout_then_late_reply_is_dropped_quietly(events):
    """No reply within the timeout -> TIMEOUT; the reply arriving later is dropped without an error."""
    handler = Manual()
    net = Net(handler)
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0"), timeout=1.5)
    net.connect()
    net.reactor.advance(1.49)
    assert not d.called
    net.reactor.advance(0.01)
    assert failure_of(d).code == ResponseCode.TIMEOUT
    handler.answer(0)
    net.flush()
    assert events.at_least(LogLevel.warn) == []
    assert any("dropping reply" in e["log_format"] for e in events)


def test_timeout_while_connecting():
    """A request waiting for its connection times out with TIMEOUT as well."""
    net = Net(Echo())
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0"), timeout=2)
    net.reactor.advance(2)
    assert failure_of(d).code == ResponseCode.TIMEOUT


def test_connection_loss_fails_outstanding_requests_promptly():
    """When the connection drops, every request waiting for a reply fails with NETWORK_ERROR at once."""
    handler = Manual()
    net = Net(handler)
    ds = [net.client.send("n0", messages.HeartBeatRequest(group="g0"), timeout=60) for _ in range(3)]
    pump = net.connect()
    pump.server.transport.loseConnection()
    net.flush()
    for d in ds:
        error = failure_of(d)
        assert error.code == ResponseCode.NETWORK_ERROR and "lost" in str(error)
    assert net.reactor.seconds() == 0  # no timer had to fire


def test_cancelled_request_is_forgotten():
    """Cancelling a send's Deferred removes it from the connection; a reply for it is ignored."""
    handler = Manual()
    net = Net(handler)
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0"))
    net.connect()
    connection = net.client.client.link("127.0.0.1:20911").protocol
    assert connection.pending == 1
    d.cancel()
    failure_of(d, CancelledError)
    assert connection.pending == 0
    handler.answer(0)
    net.flush()


def test_oversized_request_is_refused_before_sending():
    """A request whose frame exceeds maxFrameSize fails with UNEXPECTED_ARGUMENT and is not written."""
    reactor = MemoryReactorClock()
    proto = RemotingProtocol(reactor, max_frame_size=1024)
    transport = StringTransport()
    proto.makeConnection(transport)
    d = proto.send_request(messages.AppendEntryRequest(group="g0", body=b"x" * 2000), 3.0)
    assert failure_of(d).code == ResponseCode.UNEXPECTED_ARGUMENT
    assert transport.value() == b""


# -- reconnect backoff -------------------------------------------------------------------------------

def test_backoff_is_exponential_capped_and_jittered():
    """Delays double from `initial`, never exceed `maximum`, and jitter only shortens them."""
    assert Backoff(initial=0.1, maximum=2.0, rng=FixedRandom(0.0)).delay(3) == pytest.approx(0.4)
    assert Backoff(initial=0.1, maximum=2.0, rng=FixedRandom(0.0)).delay(30) == pytest.approx(2.0)
    assert Backoff(initial=0.1, maximum=2.0, jitter=0.5, rng=FixedRandom(1.0)).delay(3) == pytest.approx(0.2)
    seeded = Backoff(initial=0.1, maximum=2.0, jitter=0.5, rng=random.Random(42))
    delays = [seeded.delay(n) for n in range(1, 40)]
    assert all(d <= 2.0 for d in delays)
    assert all(0.5 * min(2.0, 0.1 * 2 ** (n - 1)) <= d for n, d in enumerate(delays, 1))
    assert len({round(d, 6) for d in delays[10:]}) > 1  # jittered at the cap, not lockstep
    with pytest.raises(ValueError):
        Backoff(initial=3, maximum=2)


def test_failed_connects_back_off_and_never_pile_up():
    """After refused connects, sends fail fast until the (growing) delay has passed; one attempt at a time."""
    net = Net(Echo(), backoff=Backoff(initial=0.1, maximum=0.25, rng=FixedRandom(0.0)))
    request = messages.HeartBeatRequest(group="g0")
    waiting = [net.client.send("n0", request) for _ in range(5)]
    assert len(net.reactor.tcpClients) == 1  # five sends, one attempt
    net.completer.failOnce()
    for d in waiting:
        assert failure_of(d).code == ResponseCode.NETWORK_ERROR
    for window in [0.1, 0.2, 0.25, 0.25]:  # initial 0.1, doubling, capped at 0.25 (jitter draw 0)
        net.reactor.advance(window - 0.002)
        assert "next connection attempt in" in str(failure_of(net.client.send("n0", request)))
        assert net.reactor.tcpClients == []
        net.reactor.advance(0.004)
        d = net.client.send("n0", request)
        assert len(net.reactor.tcpClients) == 1
        net.completer.failOnce()
        assert failure_of(d).code == ResponseCode.NETWORK_ERROR


def test_successful_reply_resets_the_backoff():
    """A connection that answers resets the failure count, so the next loss waits only the initial delay."""
    net = Net(Echo(), backoff=Backoff(initial=0.1, maximum=5, rng=FixedRandom(0.0)))
    link = net.client.client.link("127.0.0.1:20911")
    link.failures = 6
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0"))
    pump = net.connect()
    result_of(d)
    assert link.failures == 0
    pump.client.transport.disconnectReason = ConnectionLost("reset by peer")  # a loss, not a clean close
    pump.server.transport.loseConnection()
    net.flush()
    assert link.failures == 1 and link.backing_off
    net.reactor.advance(0.1)
    assert not link.backing_off


def test_clean_close_of_an_idle_connection_does_not_back_off():
    """A server closing a connection no request waits on (its idle timeout) costs no backoff: the next send connects."""
    net = Net(Echo())
    link = net.client.client.link("127.0.0.1:20911")
    first = net.client.send("n0", messages.HeartBeatRequest(group="g0"))
    net.connect()
    result_of(first)
    net.pump.server.transport.loseConnection()
    net.flush()
    assert link.protocol is None and not link.backing_off and link.failures == 0
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0", term=7))
    net.connect()
    assert result_of(d).term == 7


def test_reconnects_after_a_lost_connection():
    """After a loss and the backoff delay, the next send opens a new connection and succeeds."""
    net = Net(Echo())
    first = net.client.send("n0", messages.HeartBeatRequest(group="g0"))
    net.connect()
    result_of(first)
    net.pump.server.transport.loseConnection()
    net.flush()
    net.reactor.advance(1)
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0", term=5))
    net.connect()
    assert result_of(d).term == 5


# -- server side: handler errors and hostile input ------------------------------------------------------

def serving(handler, **kw):
    """A serving protocol on a StringTransport (bytes in by hand, replies read back)."""
    proto = RemotingServerFactory(MemoryReactorClock(), handler, **kw).buildProtocol(None)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport


def replies(transport):
    return [(f.header, f.body) for f in remoting.split_frames(transport.value())]


@implementer(IBatchRequestHandler)
class Together(Echo):
    """Records how requests were handed over: one list per handle_requests call."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def handle_requests(self, requests):
        self.calls.append(list(requests))
        results = [self.handle_request(r) for r in requests[:-1]]
        return results + [Failure(DLedgerError(ResponseCode.LEADER_PENDING_FULL, "full"))]


def test_requests_of_one_read_reach_a_batch_handler_together():
    """The frames of one read go to handle_requests in one call, in order; each gets its own reply by opaque."""
    handler = Together()
    proto, transport = serving(handler)
    requests = [messages.AppendEntryRequest(group="g0", body=b"%d" % i) for i in range(3)]
    data = b"".join(remoting.encode_request(r, 10 + i, binary=i == 1) for i, r in enumerate(requests))
    proto.dataReceived(data + remoting.encode_request(requests[0], 20)[:9])
    assert handler.calls == [requests]
    answers = {h.opaque: remoting.decode_body(messages.AppendEntryResponse, b).code for h, b in replies(transport)}
    assert answers == {10: ResponseCode.SUCCESS, 11: ResponseCode.SUCCESS, 12: ResponseCode.LEADER_PENDING_FULL}
    proto.dataReceived(remoting.encode_request(requests[0], 20)[9:])
    assert len(handler.calls) == 1 and handler.seen[-1] == requests[0], "a lone request: handle_request"


@pytest.mark.parametrize("error", [DLedgerError(ResponseCode.NOT_LEADER, "no", leader_id="n2"),
                                   DLedgerError(ResponseCode.UNKNOWN_GROUP, "not g9")])
def test_dledger_error_becomes_error_response_copying_the_request(error):
    """A DLedgerError from the handler is answered as Java does: its code, the request's base fields, leaderId."""
    proto, transport = serving(Raising(error))
    request = messages.GetEntriesRequest(group="g9", remote_id="n1", begin_index=3)
    proto.dataReceived(remoting.encode_request(request, 41))
    (header, body), = replies(transport)
    assert (header.opaque, header.flag, header.code) == (41, 1, 200)
    reply = remoting.decode_body(messages.GetEntriesResponse, body)
    assert reply == messages.GetEntriesResponse(group="g9", remote_id="n1", code=error.code,
                                                leader_id=error.leader_id)


def test_not_leader_reply_is_byte_identical_to_java():
    """Given the recorded GET on a follower, NOT_LEADER(leader n0) produces exactly the reply Java sent."""
    frames = GOLDEN / "frames"
    proto, transport = serving(Raising(DLedgerError(ResponseCode.NOT_LEADER, leader_id="n0")))
    proto.dataReceived((frames / "050002-get-notleader-request.bin").read_bytes())
    assert transport.value() == (frames / "050002-get-notleader-response.bin").read_bytes()


@pytest.mark.parametrize("name", sorted({p.name.rsplit("-", 1)[0] for p in (GOLDEN / "frames").glob("*.bin")}))
def test_served_replies_are_byte_identical_to_java(name):
    """Fed a recorded request, a handler answering the recorded response makes the server write Java's exact bytes."""
    request_bytes = (GOLDEN / "frames" / f"{name}-request.bin").read_bytes()
    response_bytes = (GOLDEN / "frames" / f"{name}-response.bin").read_bytes()

    @implementer(IRequestHandler)
    class Recorded:
        def handle_request(self, request):
            cls = messages.RESPONSE_TYPES[type(request)]
            return succeed(remoting.decode_response(remoting.decode_frame(response_bytes), cls))

    proto, transport = serving(Recorded())
    proto.dataReceived(request_bytes)
    assert transport.value() == response_bytes


def test_unexpected_handler_exception_is_internal_error_and_logged(events):
    """Any other exception becomes an INTERNAL_ERROR reply plus a logged failure; the connection stays."""
    proto, transport = serving(Raising(RuntimeError("bug")))
    proto.dataReceived(remoting.encode_request(messages.HeartBeatRequest(group="g0"), 5))
    (header, body), = replies(transport)
    assert remoting.decode_body(messages.HeartBeatResponse, body).code == ResponseCode.INTERNAL_ERROR
    assert any(e.get("log_failure") is not None and e["log_failure"].check(RuntimeError) for e in events)
    assert not transport.disconnecting


def test_handler_returning_garbage_gets_internal_error():
    """A handler that returns something that is not a message still produces a reply (INTERNAL_ERROR)."""
    @implementer(IRequestHandler)
    class Bad:
        def handle_request(self, request):
            return succeed(object())

    proto, transport = serving(Bad())
    proto.dataReceived(remoting.encode_request(messages.HeartBeatRequest(group="g0"), 6))
    (header, body), = replies(transport)
    assert header.opaque == 6 and remoting.decode_body(messages.HeartBeatResponse, body).code == 500


def test_unknown_request_code_gets_unsupported(events):
    """A readable header with an unknown request code is answered UNSUPPORTED (303) and logged."""
    proto, transport = serving(Echo())
    header = remoting.Header(12345, 17)
    proto.dataReceived(remoting.encode_frame(header, b"{}"))
    (reply_header, body), = replies(transport)
    assert reply_header.opaque == 17 and remoting.decode_body(messages.RequestOrResponse, body).code == 303
    assert events.at_least(LogLevel.warn)
    assert not transport.disconnecting


def test_unparsable_body_gets_unexpected_argument():
    """A body that does not parse as the request is answered UNEXPECTED_ARGUMENT (411); the handler is not called."""
    handler = Echo()
    proto, transport = serving(handler)
    proto.dataReceived(remoting.encode_frame(remoting.Header(51001, 3), b'{"term":"x"}'))
    (header, body), = replies(transport)
    assert remoting.decode_body(messages.VoteResponse, body).code == 411 and handler.seen == []


@pytest.mark.parametrize("data", [
    b"\x00\x00\x00\x02abcdef",  # length below 4
    b"\x7f\xff\xff\xff",  # over the frame size limit
    b"\x00\x00\x00\x0c\x00\x00\x00\x09" + b"x" * 8,  # header longer than the frame
    b"\x00\x00\x00\x06\x00\x00\x00\x02{]",  # header not JSON
    b"\x00\x00\x00\x06\x01\x00\x00\x02{}",  # ROCKETMQ serialize type
])
def test_unreadable_frames_close_the_connection_with_a_log_line(data, events):
    """Bad lengths, oversize frames and unreadable headers close the connection and log a warning."""
    proto, transport = serving(Echo(), max_frame_size=4096)
    proto.dataReceived(data)
    assert transport.disconnecting and transport.value() == b""
    assert [e for e in events if e["log_level"] == LogLevel.warn]
    proto.dataReceived(remoting.encode_request(messages.HeartBeatRequest(group="g0"), 1))
    assert transport.value() == b""  # nothing more is read from a closing connection


def test_requests_are_handled_concurrently_and_replies_leave_out_of_order():
    """The server hands every request to the handler without waiting; replies go out as answers come."""
    handler = Manual()
    proto, transport = serving(handler)
    proto.dataReceived(b"".join(remoting.encode_request(messages.HeartBeatRequest(group="g0", term=t), 100 + t)
                                for t in range(3)))
    assert len(handler.calls) == 3
    handler.answer(2)
    handler.answer(0)
    handler.answer(1)
    assert [h.opaque for h, _ in replies(transport)] == [102, 100, 101]


def test_too_many_requests_in_flight_pause_reading():
    """Beyond max_in_flight unanswered requests the server stops reading (back-pressure) until answers go out."""
    handler = Manual()
    proto, transport = serving(handler, max_in_flight=4)
    proto.dataReceived(b"".join(remoting.encode_request(messages.HeartBeatRequest(group="g0"), i)
                                for i in range(4)))
    assert transport.producerState == "paused"
    for i in range(3):
        handler.answer(i)
    assert transport.producerState == "producing"


def test_oneway_request_gets_no_reply():
    """A request with the oneway flag is handled but not answered."""
    handler = Echo()
    proto, transport = serving(handler)
    proto.dataReceived(remoting.encode_request(messages.HeartBeatRequest(group="g0"), 9, oneway=True))
    assert len(handler.seen) == 1 and transport.value() == b""


def test_reply_after_connection_closed_is_dropped():
    """An answer that comes after the client went away is dropped without error."""
    handler = Manual()
    proto, transport = serving(handler)
    proto.dataReceived(remoting.encode_request(messages.HeartBeatRequest(group="g0"), 9))
    proto.connectionLost(None)
    handler.answer(0)
    assert transport.value() == b""


# -- binary PUSH through the transport -------------------------------------------------------------------

def batch(n=256, size=1024):
    entries, pos = [], 0
    for i in range(n):
        entries.append(Entry(bytes([i % 256]) * size, 1000 + i, 7, pos).sealed())
        pos += HEADER_SIZE + size
    return messages.PushEntryRequest(group="g0", remote_id="n0", local_id="n1", leader_id="n1", term=7,
                                     commit_index=999, type=PushType.APPEND, batch_entry=entries,
                                     total_size=pos)


def test_binary_push_of_256_entries_between_members():
    """A 256 x 1 KiB PUSH travels as a binary body between dledger members and arrives intact."""
    handler = Echo()
    net = Net(handler)
    request = batch()
    d = net.client.send("n0", request)
    pump = net.completer.succeedOnce(greet=False)
    sent = pump.clientIO.getOutBuffer()
    frame = remoting.decode_frame(sent)
    assert frame.header.ext_fields == {"dledger.body": "bin"}
    pump.serverIO.bufferReceived(sent)
    pump.flush(advanceClock=False)
    assert handler.seen == [request]
    assert result_of(d).term == 7


def test_push_is_json_when_binary_is_off_and_to_raw_addresses():
    """binary_push=False and send_to_address() both send Java's JSON form."""
    for use_address in (False, True):
        net = Net(Echo(), binary_push=use_address)
        request = batch(n=2, size=8)
        if use_address:
            net.client.send_to_address("127.0.0.1:20911", request)
        else:
            net.client.send("n0", request)
        pump = net.completer.succeedOnce(greet=False)
        assert remoting.decode_frame(pump.clientIO.getOutBuffer()).header.ext_fields is None


def test_corrupted_binary_entry_is_refused_by_the_server(events):
    """A binary PUSH damaged in transit is answered UNEXPECTED_ARGUMENT and never reaches the handler."""
    handler = Echo()
    proto, transport = serving(handler)
    data = bytearray(remoting.encode_request(batch(n=3, size=64), 12, binary=True))
    data[-10] ^= 0x20
    proto.dataReceived(bytes(data))
    (header, body), = replies(transport)
    assert header.opaque == 12 and remoting.decode_body(messages.PushEntryResponse, body).code == 411
    assert handler.seen == []
    assert any("crc32c" in str(e.get("error")) for e in events)


def test_peer_that_cannot_read_binary_gets_json_afterwards():
    """A remoting-level error reply to a binary PUSH (what Java sends) switches that peer to JSON."""
    net = Net(Echo())
    d = net.client.send("n0", batch(n=1, size=8))
    pump = net.completer.succeedOnce(greet=False)
    request_frame = remoting.decode_frame(pump.clientIO.getOutBuffer())
    java_error = remoting.encode_frame(remoting.Header(1, request_frame.header.opaque, 1,
                                                       remark="JSONException: syntax error"))
    pump.clientIO.bufferReceived(java_error)
    error = failure_of(d, BinaryBodyRefused)
    assert error.code == ResponseCode.UNSUPPORTED and "n0" in net.client.binary_refused
    net.client.send("n0", batch(n=1, size=8))
    assert remoting.decode_frame(pump.clientIO.getOutBuffer()).header.ext_fields is None


def test_client_appends_travel_binary_and_fall_back_to_json_for_java():
    """RemoteTransport sends APPENDs raw; a remoting error (Java) gets the request again in JSON, then JSON only."""
    from dledger.client import RemoteTransport

    net = Net(Echo())  # n0 listens; its answers never get out (the pump is not flushed), a Java error does
    client = RemoteTransport(net.reactor, {"n0": "127.0.0.1:20911"})
    completer = net.completer
    request = messages.AppendEntryRequest(group="g0", remote_id="n0", body=b"\x00raw\xff")
    d = client.send("n0", request)
    pump = completer.succeedOnce(greet=False)
    sent = remoting.decode_frame(pump.clientIO.getOutBuffer())
    assert sent.header.body_encoding == "bin" and remoting.decode_request(sent) == request
    pump.clientIO.bufferReceived(remoting.encode_frame(remoting.Header(1, sent.header.opaque, 1,
                                                                       remark="JSONException: syntax error")))
    again = remoting.decode_frame(pump.clientIO.getOutBuffer())
    assert again.header.ext_fields is None and remoting.decode_request(again) == request
    pump.clientIO.bufferReceived(remoting.encode_response(messages.AppendEntryResponse(index=7), again.header.opaque))
    assert result_of(d).index == 7 and client.binary_refused == {"127.0.0.1:20911"}
    client.send("n0", request)
    assert remoting.decode_frame(pump.clientIO.getOutBuffer()).header.ext_fields is None


def test_server_answers_a_binary_append():
    """A member's transport decodes a binary APPEND and hands the handler the same request as the JSON form would."""
    handler = Echo()
    proto, transport = serving(handler)
    request = messages.AppendEntryRequest(group="g0", remote_id="n0", batch_msgs=[b"a", b"\x00" * 3])
    proto.dataReceived(remoting.encode_request(request, 5, binary=True))
    (header, body), = replies(transport)
    assert header.opaque == 5 and remoting.decode_body(messages.AppendEntryResponse, body).code == ResponseCode.SUCCESS
    assert handler.seen == [request]


# -- stop ------------------------------------------------------------------------------------------------

def test_stop_fails_outstanding_requests_and_closes_connections():
    """stop() fails waiting requests with NETWORK_ERROR at once and fires once connections are closed."""
    handler = Manual()
    net = Net(handler)
    d = net.client.send("n0", messages.HeartBeatRequest(group="g0"), timeout=60)
    net.connect()
    stopped_client = net.client.stop()
    assert failure_of(d).code == ResponseCode.NETWORK_ERROR
    stopped_server = net.server.stop()
    net.flush()
    assert result_of(stopped_client) is None and result_of(stopped_server) is None
    assert failure_of(net.client.send("n0", messages.HeartBeatRequest(group="g0"))).code == ResponseCode.NETWORK_ERROR
    handler.answer(0)  # the late answer goes nowhere


# -- client side: odd replies ------------------------------------------------------------------------------

def client_protocol():
    reactor = MemoryReactorClock()
    proto = RemotingProtocol(reactor)
    transport = StringTransport()
    proto.makeConnection(transport)
    return proto, transport, reactor


def sent_opaque(transport):
    frame, = remoting.split_frames(transport.value())
    transport.clear()
    return frame.header.opaque


def test_undecodable_reply_fails_only_that_request():
    """A reply whose body is not the expected response fails that request (NETWORK_ERROR); the connection stays."""
    proto, transport, _ = client_protocol()
    d = proto.send_request(messages.HeartBeatRequest(group="g0"), 3.0)
    opaque = sent_opaque(transport)
    proto.dataReceived(remoting.encode_frame(remoting.Header(200, opaque, 1), b'{"term":"x"}'))
    assert failure_of(d).code == ResponseCode.NETWORK_ERROR
    assert proto.is_open and not transport.disconnecting


@pytest.mark.parametrize("remoting_code,expected", [(2, ResponseCode.NETWORK_ERROR), (3, ResponseCode.UNSUPPORTED),
                                                    (1, ResponseCode.INTERNAL_ERROR)])
def test_java_remoting_errors_map_to_dledger_codes(remoting_code, expected):
    """Java remoting's own reply codes (SYSTEM_ERROR, SYSTEM_BUSY, REQUEST_CODE_NOT_SUPPORTED) become DLedgerErrors."""
    proto, transport, _ = client_protocol()
    d = proto.send_request(messages.HeartBeatRequest(group="g0"), 3.0)
    opaque = sent_opaque(transport)
    proto.dataReceived(remoting.encode_frame(remoting.Header(remoting_code, opaque, 1, remark="busy")))
    error = failure_of(d)
    assert error.code == expected and "busy" in str(error)


def test_garbage_from_the_server_closes_and_fails_pending_requests():
    """An unreadable frame on a client connection closes it; its requests fail with NETWORK_ERROR."""
    proto, transport, _ = client_protocol()
    d = proto.send_request(messages.HeartBeatRequest(group="g0"), 3.0)
    proto.dataReceived(b"\x00\x00\x00\x01garbage")
    assert transport.disconnecting
    proto.connectionLost(None)
    assert failure_of(d).code == ResponseCode.NETWORK_ERROR


def test_set_members_reaches_new_members_and_the_guard_knows_exactly_them():
    """A configuration change (issue #23): a new member's address is used, and only configured ids are members."""
    from dledger.security.guard import ServerGuard

    t = TcpTransport(config("n0"), MemoryReactorClock())
    t.guard = ServerGuard("secret", "g0", frozenset({"n0", "n1", "n2"}))  # the port's guard, as authMode sets it
    t.set_members({"n0": "127.0.0.1:20911", "n1": "127.0.0.1:20912", "n9": "127.0.0.1:29999"})
    assert t.guard.members == frozenset({"n0", "n1", "n9"})  # n2 removed: a connection claiming it is refused
    assert t.addresses["n9"] == "127.0.0.1:29999" and t.client.expected_peers["127.0.0.1:29999"] == "n9"
    failure = []
    t.send("n8", messages.MetadataRequest(group="g0")).addErrback(failure.append)
    assert failure and failure[0].value.code is ResponseCode.UNKNOWN_MEMBER


@implementer(IAnsweringRequestHandler)
class AnswersLater(Echo):
    """Answers the first and last request of a batch later through the connection's ``answer``; fails the middle."""

    def __init__(self):
        super().__init__()
        self.answer, self.tokens = None, None

    def handle_requests(self, requests):  # pragma: no cover - the connection must take the answering path
        raise AssertionError("handle_requests called on an IAnsweringRequestHandler")

    def handle_requests_answering(self, requests, answer, tokens):
        self.answer, self.tokens = answer, tokens
        return [ANSWER_LATER, Failure(DLedgerError(ResponseCode.LEADER_PENDING_FULL, "full")), ANSWER_LATER]


def test_an_answering_handler_replies_when_it_answers_not_before():
    """Requests answered later get their reply when the handler calls answer(token, response), by their opaque."""
    handler = AnswersLater()
    proto, transport = serving(handler)
    requests = [messages.AppendEntryRequest(group="g0", body=b"%d" % i) for i in range(3)]
    proto.dataReceived(b"".join(remoting.encode_request(r, 10 + i, binary=True) for i, r in enumerate(requests)))
    assert [h.opaque for h in handler.tokens] == [10, 11, 12]
    assert [h.opaque for h, _ in replies(transport)] == [11], "only the refused request is answered at once"
    transport.clear()
    handler.answer(handler.tokens[2], messages.AppendEntryResponse(group="g0", index=7, code=ResponseCode.SUCCESS))
    handler.answer(handler.tokens[0], messages.AppendEntryResponse(group="g0", index=6,
                                                                    code=ResponseCode.WAIT_QUORUM_ACK_TIMEOUT))
    answers = [(h.opaque, remoting.decode_body(messages.AppendEntryResponse, b)) for h, b in replies(transport)]
    assert [(o, r.code, r.index) for o, r in answers] == [(12, ResponseCode.SUCCESS, 7),
                                                          (10, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, 6)]
    assert proto._in_flight == 0, "every request answered once"


@implementer(IAnsweringRequestHandler)
class ParksThenRaises(Echo):
    """Parks the first request (answer later), then raises: a bug in the handler, half way through a batch."""

    def __init__(self):
        super().__init__()
        self.answer, self.tokens = None, None

    def handle_requests_answering(self, requests, answer, tokens):
        self.answer, self.tokens = answer, tokens
        raise RuntimeError("handler bug")


def test_a_request_answered_with_the_handlers_exception_gets_no_second_reply():
    """When the handler raises, every request of the batch is answered INTERNAL_ERROR once; a later answer to
    one it had parked writes nothing (one reply per request, the in-flight count back to 0)."""
    handler = ParksThenRaises()
    proto, transport = serving(handler)
    requests = [messages.AppendEntryRequest(group="g0", body=b"%d" % i) for i in range(2)]
    proto.dataReceived(b"".join(remoting.encode_request(r, 30 + i, binary=True) for i, r in enumerate(requests)))
    first = [(h.opaque, remoting.decode_body(messages.AppendEntryResponse, b).code) for h, b in replies(transport)]
    assert first == [(30, ResponseCode.INTERNAL_ERROR), (31, ResponseCode.INTERNAL_ERROR)]
    transport.clear()
    handler.answer(handler.tokens[0], messages.AppendEntryResponse(group="g0", index=3, code=ResponseCode.SUCCESS))
    assert transport.value() == b"" and proto._in_flight == 0
