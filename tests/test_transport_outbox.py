"""Bytes written during a stretch of work leave at its end, not after the reactor's next poll (issue #28 2c).

The decisions (which transport may be sent early, when a connection's ``doWrite`` may be called) are table
tests; the flush points are checked on real TCP connections over 127.0.0.1 whose reactor is a recorder of
``addWriter``/``removeWriter`` that never polls: whatever the peer socket can read right after the work
returned was sent by the work itself, so each of these tests fails when its flush point is removed.
"""

from __future__ import annotations

import select
import socket
import threading

import pytest
from twisted.internet import tcp
from twisted.internet.defer import succeed
from twisted.internet.protocol import Protocol
from twisted.internet.testing import StringTransport
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.protocols.tls import TLSMemoryBIOProtocol
from zope.interface import implementer

from dledger import messages
from dledger.diskio import BlockingIO
from dledger.interfaces import IRequestHandler
from dledger.transport import outbox, remoting
from dledger.transport.outbox import Outbox, may_send, send_buffered, send_written, sendable_connection
from dledger.transport.protocol import RemotingProtocol

# -- which transport may be sent early ---------------------------------------------------------------


def _conn(tls: bool = False) -> tcp.Connection:
    c = object.__new__(tcp.Server)
    if tls:
        c.TLS = True  # what startTLS sets on the connection it wraps
    return c


def _wrapper(inner, cls=ProtocolWrapper):
    w = object.__new__(cls)
    w.transport = inner
    return w


PLAIN = _conn()
SENDABLE_TABLE = [
    ("plain TCP connection", PLAIN, PLAIN),
    ("the connection guard's wrapper over plain TCP", _wrapper(PLAIN), PLAIN),
    ("two wrappers over plain TCP", _wrapper(_wrapper(PLAIN)), PLAIN),
    ("a connection that started TLS", _conn(tls=True), None),
    ("TLS layer over TCP", _wrapper(PLAIN, TLSMemoryBIOProtocol), None),
    ("guard over TLS over TCP (an ssl: listener)", _wrapper(_wrapper(PLAIN, TLSMemoryBIOProtocol)), None),
    ("a test fake", StringTransport(), None),
    ("no transport", None, None),
    ("a wrapper over nothing", _wrapper(None), None),
    ("deeper than the project builds", _wrapper(_wrapper(_wrapper(_wrapper(PLAIN)))), None),
]


@pytest.mark.parametrize("transport, expected", [row[1:] for row in SENDABLE_TABLE],
                         ids=[row[0] for row in SENDABLE_TABLE])
def test_sendable_connection_table(transport, expected):
    assert sendable_connection(transport) is expected


MAY_SEND_TABLE = [
    # connected, disconnecting, write_disconnecting, buffered -> send now?
    (True, False, False, 10, True),
    (True, False, False, 0, False),     # nothing buffered: no empty send
    (False, False, False, 10, False),   # not connected (lost, or not yet)
    (True, True, False, 10, False),     # loseConnection asked: the reactor must see doWrite's close result
    (True, False, True, 10, False),     # loseWriteConnection asked: the same for the half-close
]


@pytest.mark.parametrize("connected, disconnecting, write_disconnecting, buffered, expected", MAY_SEND_TABLE)
def test_may_send_table(connected, disconnecting, write_disconnecting, buffered, expected):
    assert may_send(connected, disconnecting, write_disconnecting, buffered) is expected


def test_outbox_sends_each_written_connection_once_and_forgets_it():
    sent = []
    box = Outbox()
    box.wrote(None)  # a TLS or fake transport: nothing to remember
    assert box.send() == 0
    real = outbox.send_buffered
    try:
        outbox.send_buffered = lambda c: sent.append(c) or True
        a, b = _conn(), _conn()
        box.wrote(a), box.wrote(b), box.wrote(a)
        assert box.send() == 2
        assert sent == [a, b]
        assert box.send() == 0  # sent once: the next stretch of work starts empty
    finally:
        outbox.send_buffered = real


# -- real connections, a reactor that never polls ----------------------------------------------------


def attach(sock, protocol, reactor):
    """``protocol`` on a real Twisted TCP connection over ``sock`` (as an accepted connection is)."""
    conn = tcp.Connection(sock, protocol, reactor)
    conn.connected = 1
    protocol.makeConnection(conn)
    return conn


def remoting_on_wire(wire, reactor) -> tuple[RemotingProtocol, socket.socket]:
    """A RemotingProtocol on our end of ``wire`` (on ``reactor``), and the peer's socket."""
    ours, peer = wire
    proto = RemotingProtocol(reactor)
    attach(ours, proto, reactor)
    return proto, peer


def received(peer) -> bytes:
    try:
        return peer.recv(1 << 20)
    except BlockingIOError:
        return b""


@implementer(IRequestHandler)
class Echo:
    def handle_request(self, request):
        return succeed(request.base_reply(messages.RESPONSE_TYPES[type(request)]))


def _request_frame(opaque: int = 7) -> bytes:
    return remoting.encode_request(messages.MetadataRequest(group="g0", remote_id="n0"), opaque)


@pytest.mark.network
def test_a_reply_leaves_when_the_read_that_asked_for_it_was_handled(wire, never_polls):
    ours, peer = wire
    reactor = never_polls
    proto = RemotingProtocol(reactor, Echo())
    conn = attach(ours, proto, reactor)
    proto.dataReceived(_request_frame(7))
    frame = remoting.decode_frame(received(peer))
    assert frame.header.opaque == 7 and frame.header.is_response
    assert conn not in reactor.writers  # all sent: nothing left for the poll


@pytest.mark.network
def test_a_reply_through_the_guard_wrapper_leaves_too(wire, never_polls):
    ours, peer = wire
    reactor = never_polls
    proto = RemotingProtocol(reactor, Echo())
    guard = ProtocolWrapper(WrappingFactory(None), proto)
    attach(ours, guard, reactor)
    guard.dataReceived(_request_frame(8))
    assert remoting.decode_frame(received(peer)).header.opaque == 8


@pytest.mark.network
def test_a_write_outside_a_stretch_of_work_waits_for_the_poll_as_before(wire, never_polls):
    """Sending early is an optimisation: a call made from a timer or a user's code stays with Twisted."""
    ours, peer = wire
    reactor = never_polls
    proto = RemotingProtocol(reactor)
    conn = attach(ours, proto, reactor)
    proto.send_request(messages.MetadataRequest(group="g0", remote_id="n1"), timeout=5)
    assert received(peer) == b"" and conn in reactor.writers
    send_written()  # the end of the next stretch of work sends it
    assert remoting.decode_frame(received(peer)).header.is_response is False
    assert conn not in reactor.writers


@pytest.mark.network
def test_what_the_socket_does_not_take_stays_with_twisted(wire, never_polls):
    ours, peer = wire
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
    reactor = never_polls
    conn = attach(ours, Protocol(), reactor)
    conn.write(b"x" * (8 << 20))  # far more than the socket's buffers hold
    assert send_buffered(conn) is True
    assert 0 < outbox.buffered_bytes(conn) < 8 << 20
    assert conn in reactor.writers  # the poll sends the rest


@pytest.mark.network
def test_a_push_larger_than_one_twisted_send_leaves_whole(wire, never_polls):
    """doWrite sends at most SEND_LIMIT (128 KiB) a call: a batched push (~260 KiB) needs more than one."""
    ours, peer = wire
    reactor = never_polls
    conn = attach(ours, Protocol(), reactor)
    size = 2 * conn.SEND_LIMIT + 1000
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 * size)
    conn.write(b"p" * size)
    assert send_buffered(conn) is True
    assert outbox.buffered_bytes(conn) == 0 and conn not in reactor.writers
    got = 0
    for _ in range(1000):  # the peer reads it all (bounded; each wait ends as soon as bytes are there)
        if got == size or not select.select([peer], [], [], 5.0)[0]:
            break
        got += len(received(peer))
    assert got == size


@pytest.mark.network
def test_a_closing_connection_is_left_to_the_reactor(wire, never_polls):
    ours, peer = wire
    reactor = never_polls
    conn = attach(ours, Protocol(), reactor)
    conn.write(b"last words")
    conn.loseConnection()
    assert send_buffered(conn) is False
    assert received(peer) == b"" and conn in reactor.writers  # the reactor's doWrite sends and closes


@pytest.mark.network
def test_a_disk_jobs_results_send_what_their_callbacks_wrote(wire, never_polls):
    """A follower's reply once its flush is durable: written in the job's callback, sent after the delivery."""
    proto, peer = remoting_on_wire(wire, never_polls)
    calls, handed = [], threading.Event()

    class ThreadReactor:
        """callFromThread queues the worker's hand-over for the test (the reactor thread) to run."""

        def addSystemEventTrigger(self, *a):
            return 1

        def removeSystemEventTrigger(self, trigger):
            pass

        def callFromThread(self, f, *a):
            calls.append((f, a))
            handed.set()

    bio = BlockingIO(ThreadReactor(), threaded=True, after_results=send_written)
    done = bio.run(lambda: 1)
    done.addCallback(lambda _: proto.send_request(messages.MetadataRequest(group="g0", remote_id="n1"),
                                                  timeout=5))
    try:
        assert handed.wait(10.0), "the worker did not hand its result over"
        f, a = calls.pop()
        f(*a)
        assert remoting.decode_frame(received(peer)).header.is_response is False
    finally:
        bio.stop()


def test_a_blocking_io_without_the_hook_delivers_as_before():
    bio = BlockingIO()
    assert bio.after_results is None
    assert bio.run(lambda: 3).result == 3


@pytest.mark.network
def test_a_leaders_pump_sends_its_pushes(wire, never_polls):
    from dledger.replication.leader import LeaderReplicator

    proto, peer = remoting_on_wire(wire, never_polls)

    class Dispatcher:
        def pump(self):
            proto.send_request(messages.MetadataRequest(group="g0", remote_id="n1"), timeout=5)

    leader = object.__new__(LeaderReplicator)
    leader._pump_scheduled, leader.dispatchers, leader.leaving = object(), {"n1": Dispatcher()}, {}
    leader._pump_all()
    assert remoting.decode_frame(received(peer)).header.is_response is False


@pytest.mark.network
def test_the_load_generators_open_loop_sends_each_ticks_requests(wire, never_polls):
    """The latency phase's requests leave in the tick that issued them, not after the generator's next poll."""
    from twisted.internet.defer import ensureDeferred

    from dledger.bench.load import Loader, RawAppends

    ours, peer = wire
    reactor = never_polls
    loader = object.__new__(Loader)
    loader.reactor, loader.raw = reactor, RawAppends("g0", "n0", b"x" * 16)
    attach(ours, loader.raw, reactor)
    done = ensureDeferred(loader.open_loop(rate=1000, duration=0.005, warmup=0))
    reactor.advance(0.0021)  # two requests due
    splitter = remoting.FrameSplitter(1 << 20)
    assert [f.header.opaque for f in splitter.feed(received(peer))] == [1, 2]
    loader.raw.connectionLost()  # answers the rest None: the loop ends
    reactor.advance(0.01)
    assert done.called


@pytest.mark.network
def test_another_threads_stretch_of_work_never_sends_this_threads_connections(wire, never_polls):
    """A process may run several reactors, each in its own thread (``dledger.blocking``: a BlockingClient's
    private reactor beside the program's own, or two clients): Twisted connections are not thread-safe, so
    what one reactor's thread wrote is sent only by that thread's own stretches of work, never by another
    reactor's ``send_written`` from its thread (which would call ``doWrite`` on a connection its reactor
    thread may be writing to at that moment)."""
    proto, peer = remoting_on_wire(wire, never_polls)
    proto.send_request(messages.MetadataRequest(group="g0", remote_id="n1"), timeout=5)  # registered here
    sent_elsewhere = []
    other = threading.Thread(target=lambda: sent_elsewhere.append(send_written()))
    other.start()
    other.join(10.0)
    assert not other.is_alive() and sent_elsewhere == [0]
    assert received(peer) == b""  # the other thread's work did not touch this connection
    assert send_written() == 1  # this thread's next stretch of work sends it
    assert remoting.decode_frame(received(peer)).header.is_response is False
