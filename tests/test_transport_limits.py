"""Resource limits of the TCP transport (issue #9, item 14): connections, idle time, buffered bytes, EMFILE."""

import errno
import socket
import struct

import pytest
import pytest_twisted
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import deferLater
from twisted.internet.testing import StringTransport
from twisted.logger import Logger, LogLevel
from zope.interface import implementer

from dledger import messages
from dledger.config import ConfigError, make_config
from dledger.interfaces import IRequestHandler
from dledger.transport import limits as L
from dledger.transport import remoting
from dledger.transport.limits import AcceptGuard, ConnectionLimits
from dledger.transport.protocol import RemotingProtocol, RemotingServerFactory
from dledger.transport.tcp import TcpTransport

MiB = 1024 * 1024
SMALL = ConnectionLimits(max_connections=4, max_connections_per_address=2, idle_timeout=10.0,
                         max_buffered_per_connection=3 * MiB, max_buffered_total=4 * MiB)


# -- pure decisions --------------------------------------------------------------------------------------

@pytest.mark.parametrize("open_, from_address, refused", [
    (0, 0, None), (3, 1, None), (4, 0, "maxConnections 4"), (3, 2, "maxConnectionsPerAddress 2"),
])
def test_admission_table(open_, from_address, refused):
    """A connection is refused at the member-wide or the per-address limit, with the option named."""
    why = L.admission_refusal(open_, from_address, SMALL)
    assert why is None if refused is None else refused in why


@pytest.mark.parametrize("buffered, closed", [(0, False), (3 * MiB, False), (3 * MiB + 1, True)])
def test_per_connection_cap_table(buffered, closed):
    """More unfinished-frame bytes than maxBufferedBytesPerConnection closes the connection."""
    assert (L.over_connection_cap(buffered, SMALL) is not None) == closed


@pytest.mark.parametrize("buffered, total, pause", [
    (2 * MiB, 4 * MiB, False),        # at the cap: keep reading
    (2 * MiB, 4 * MiB + 1, True),     # over it with a large unfinished frame: pause
    (L.SMALL_FRAME, 5 * MiB, False),  # small frames (heartbeats, pushes) keep flowing
])
def test_pause_table(buffered, total, pause):
    """Over the total cap only connections holding a large unfinished frame stop reading."""
    assert L.should_pause(buffered, total, SMALL) == pause


@pytest.mark.parametrize("total, resume", [(3 * MiB, True), (3 * MiB + 1, False)])
def test_resume_table(total, resume):
    """Reading resumes at three quarters of the cap (no flapping around it)."""
    assert L.may_resume(total, SMALL) == resume


@pytest.mark.parametrize("last, serving, now, expect", [
    (0.0, 0, 5.0, 10.0), (0.0, 0, 10.0, None), (0.0, 1, 10.0, 20.0), (8.0, 0, 10.0, 18.0),
])
def test_idle_deadline_table(last, serving, now, expect):
    """Idle means no complete frame for the timeout and no request being served."""
    assert L.idle_deadline(last, serving, now, 10.0) == expect


@pytest.mark.parametrize("max_conn, soft, open_fds, expect", [
    (1024, None, 10, 1024), (1024, 1 << 20, 10, 1024), (1024, 128, 20, 128 - 20 - L.FD_RESERVE),
    (1024, 40, 20, 1), (10, 128, 20, 10), (1024, 128, None, 1024),
])
def test_fd_connection_cap_table(max_conn, soft, open_fds, expect):
    """Incoming connections never take the descriptors the store and peers need (ulimit -n minus a reserve)."""
    assert L.fd_connection_cap(max_conn, soft, open_fds) == expect


def test_limits_within_fds_lower_both_connection_limits():
    """A low descriptor limit lowers maxConnections and, if needed, maxConnectionsPerAddress."""
    capped = ConnectionLimits().within_fds(128, 16)
    assert capped.max_connections == 128 - 16 - L.FD_RESERVE == capped.max_connections_per_address
    assert ConnectionLimits().within_fds(None, None) == ConnectionLimits()


# -- config -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    ({"maxConnections": 0}, "maxConnections: must be > 0"),
    ({"connectionIdleTimeoutMs": -1}, "connectionIdleTimeoutMs"),
    ({"maxConnections": 10, "maxConnectionsPerAddress": 11}, "must not exceed maxConnections"),
    ({"maxBufferedBytesPerConnection": 1024}, "at least maxFrameSize"),
    ({"maxBufferedBytesTotal": 20 * MiB, "maxBufferedBytesPerConnection": 30 * MiB}, "at least maxBufferedBytesPer"),
])
def test_limit_options_are_validated(options, message):
    """Bad limits are refused with the option name and what is expected."""
    with pytest.raises(ConfigError, match=message):
        make_config(**options)


def test_default_limits_come_from_config():
    """The defaults leave room for the largest frame and Java's 120 s idle close."""
    limits = ConnectionLimits.from_config(make_config())
    assert limits == ConnectionLimits()
    assert limits.max_buffered_per_connection >= make_config().max_frame_size


# -- the factory and protocol under a fake clock ---------------------------------------------------------------

@implementer(IRequestHandler)
class Echo:
    def handle_request(self, request):
        return succeed(request.base_reply(messages.RESPONSE_TYPES[type(request)]))


@implementer(IRequestHandler)
class Never:
    def handle_request(self, request):
        return Deferred()


class Events(list):
    def __call__(self, event):
        self.append(event)


def factory(limits=SMALL, handler=None, clock=None):
    return RemotingServerFactory(clock or task.Clock(), handler or Echo(), limits=limits)


def connect(f, host="10.0.0.1", port=5000):
    proto = f.buildProtocol(IPv4Address("TCP", host, port))
    if proto is not None:
        proto.makeConnection(StringTransport(peerAddress=IPv4Address("TCP", host, port)))
    return proto


def heartbeat(opaque=1):
    return remoting.encode_request(messages.HeartBeatRequest(group="g0"), opaque)


def announce(size):
    """The first bytes of a frame announcing ``size`` bytes (which never all arrive)."""
    return struct.pack(">iI", size - 4, 2) + b"{}"


def test_connections_beyond_the_limits_are_refused_and_counted_back(monkeypatch):
    """maxConnectionsPerAddress, then maxConnections; a closed connection frees its slot."""
    events = Events()
    monkeypatch.setattr(RemotingProtocol, "log", Logger(observer=events))
    f = factory()
    a1 = connect(f, "10.0.0.1")
    assert connect(f, "10.0.0.1") is not None
    assert connect(f, "10.0.0.1") is None  # per address
    assert connect(f, "10.0.0.2") is not None and connect(f, "10.0.0.3") is not None
    assert connect(f, "10.0.0.4") is None  # member-wide
    assert f.refused == 2 and len(f.connections) == 4
    a1.transport.loseConnection()
    a1.connectionLost(None)
    assert connect(f, "10.0.0.1") is not None
    warnings = [e for e in events if e["log_level"] == LogLevel.warn]
    assert len(warnings) == 2 and all("refusing a connection" in e["log_format"] for e in warnings)


def test_idle_connection_is_closed_after_the_timeout():
    """A connection that never completes a frame is closed after connectionIdleTimeoutMs."""
    clock = task.Clock()
    proto = connect(factory(clock=clock))
    clock.advance(9.9)
    assert not proto.transport.disconnecting
    clock.advance(0.2)
    assert proto.transport.disconnecting


def test_connection_completing_frames_is_not_idle():
    """Every complete frame restarts the idle clock."""
    clock = task.Clock()
    proto = connect(factory(clock=clock))
    for _ in range(5):
        clock.advance(6)
        proto.dataReceived(heartbeat())
    assert not proto.transport.disconnecting
    clock.advance(10)
    assert proto.transport.disconnecting


def test_unfinished_frame_is_aborted_after_the_timeout(monkeypatch):
    """A slow sender that never finishes its frame is cut off (aborted) with one warning."""
    events = Events()
    monkeypatch.setattr(RemotingProtocol, "log", Logger(observer=events))
    clock = task.Clock()
    proto = connect(factory(clock=clock))
    for _ in range(20):
        proto.dataReceived(announce(1000)[:8] if _ == 0 else b"x")
        clock.advance(0.5)
    assert proto.transport.disconnecting
    assert [e for e in events if e["log_level"] == LogLevel.warn and "unfinished frame" in e["log_format"]]


def test_connection_waiting_for_an_answer_is_not_idle():
    """A request still being served (an append waiting for its commit) keeps the connection open."""
    clock = task.Clock()
    proto = connect(factory(clock=clock, handler=Never()))
    proto.dataReceived(heartbeat())
    clock.advance(35)
    assert not proto.transport.disconnecting


def test_connection_over_its_buffer_cap_is_closed():
    """Buffering more than maxBufferedBytesPerConnection of an unfinished frame closes the connection."""
    limits = ConnectionLimits(max_buffered_per_connection=64 * 1024, max_buffered_total=MiB)
    proto = RemotingServerFactory(task.Clock(), Echo(), max_frame_size=MiB, limits=limits).buildProtocol(None)
    proto.makeConnection(StringTransport())
    proto.dataReceived(announce(MiB - 100))
    proto.dataReceived(b"x" * 60000)
    assert not proto.transport.disconnecting
    proto.dataReceived(b"x" * 10000)
    assert proto.transport.disconnecting


def test_frame_announcing_more_than_max_frame_size_is_closed_at_once():
    """The length field alone closes the connection: nothing of such a frame is buffered."""
    proto = connect(factory())
    proto.dataReceived(announce(17 * MiB))
    assert proto.transport.disconnecting


def test_reading_pauses_over_the_total_and_resumes_when_it_falls():
    """Over maxBufferedBytesTotal the connection holding a large unfinished frame pauses; it resumes once freed."""
    f = factory(limits=ConnectionLimits(max_buffered_per_connection=3 * MiB, max_buffered_total=4 * MiB))
    a, b = connect(f, "10.0.0.1"), connect(f, "10.0.0.2")
    a.dataReceived(announce(3 * MiB) + b"x" * (2 * MiB + 512 * 1024))
    assert a.transport.producerState == "producing"
    b.dataReceived(announce(3 * MiB) + b"y" * (2 * MiB))
    assert f.budget.total > 4 * MiB
    assert b.transport.producerState == "paused"
    small = connect(f, "10.0.0.3")
    small.dataReceived(heartbeat()[:20])  # a small unfinished frame still reads
    assert small.transport.producerState == "producing"
    a.transport.loseConnection()
    a.connectionLost(None)
    assert f.budget.total <= 3 * MiB and b.transport.producerState == "producing"


def test_twenty_large_unfinished_frames_stay_within_the_total_cap():
    """The issue's attack (20 x 16 MiB announced, data streaming in): buffered bytes stay near the cap."""
    f = RemotingServerFactory(task.Clock(), Echo(), limits=ConnectionLimits())
    conns = [connect(f, f"10.0.1.{i}") for i in range(20)]
    for _ in range(300):  # 64 KiB reads, round robin, until every connection is paused or closed
        for c in conns:
            if c.transport.producerState == "producing" and not c.transport.disconnecting:
                c.dataReceived((announce(16 * MiB) if not c.buffered else b"") + b"z" * 65536)
    assert f.budget.total <= ConnectionLimits().max_buffered_total + 20 * 65536 + 20 * 16
    assert sum(c.transport.producerState == "paused" for c in conns) >= 15


def test_protocol_warnings_are_rate_limited(monkeypatch):
    """A flood of undecodable requests from one host gives one warning per interval, each still answered."""
    events = Events()
    monkeypatch.setattr(RemotingProtocol, "log", Logger(observer=events))
    clock = task.Clock()
    proto = connect(factory(clock=clock))
    bad = remoting.encode_frame(remoting.Header(51002, 3), b"{not json")
    for _ in range(100):
        proto.dataReceived(bad)
    assert len(remoting.split_frames(proto.transport.value())) == 100
    assert len([e for e in events if e["log_level"] == LogLevel.warn]) == 1


# -- EMFILE on accept --------------------------------------------------------------------------------------------

class FakeListener:
    def __init__(self, outcomes):
        self.outcomes = list(outcomes)

    def accept(self):
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def getsockname(self):
        return ("127.0.0.1", 1)

    def fileno(self):
        return 99


class FakePort:
    def __init__(self):
        self.reading = True
        self.connected = True
        self.disconnecting = False

    def stopReading(self):
        self.reading = False

    def startReading(self):
        self.reading = True


def test_emfile_on_accept_pauses_accepting_with_one_line(monkeypatch):
    """EMFILE becomes 'nothing to accept', pauses the port briefly and logs one line per interval."""
    events = Events()
    monkeypatch.setattr(AcceptGuard, "log", Logger(observer=events))
    clock = task.Clock()
    port = FakePort()
    emfile = OSError(errno.EMFILE, "Too many open files")
    guard = AcceptGuard(FakeListener([emfile] * 50 + [("sock", "addr")]), port, clock)
    for _ in range(50):
        with pytest.raises(BlockingIOError):
            guard.accept()
        assert not port.reading
        clock.advance(L.ACCEPT_PAUSE)
        assert port.reading
    assert guard.accept() == ("sock", "addr")
    assert guard.fileno() == 99  # everything else is the socket's
    lines = [e for e in events if e["log_level"] >= LogLevel.warn]
    assert len(lines) == 3 and not [e for e in events if e.get("log_failure")]  # 25 s: one line per 10 s


def test_other_accept_errors_are_not_swallowed():
    """Only out-of-resources errors are turned into a pause."""
    guard = AcceptGuard(FakeListener([OSError(errno.EBADF, "bad")]), FakePort(), task.Clock())
    with pytest.raises(OSError) as info:
        guard.accept()
    assert info.value.errno == errno.EBADF


# -- real sockets on 127.0.0.1 ----------------------------------------------------------------------------------

async def wait_until(reactor, condition, timeout=5.0):
    deadline = reactor.seconds() + timeout
    while not condition():
        assert reactor.seconds() < deadline, "condition not reached in time"
        await deferLater(reactor, 0.02, lambda: None)


def closed_by_peer(sock):
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.network
@pytest_twisted.ensureDeferred
async def test_limits_on_a_real_port(reactor):
    """127.0.0.1: extra connections are closed, idle and unfinished ones time out, a client keeps being served."""
    cfg = make_config(group="g0", self_id="n0", peers="n0-127.0.0.1:20911", listen="tcp:0:interface=127.0.0.1",
                      maxConnections=6, maxConnectionsPerAddress=6, connectionIdleTimeoutMs=400)
    server = TcpTransport(cfg, reactor)
    port = await server.start(Echo())
    address = ("127.0.0.1", port.getHost().port)
    assert isinstance(port.socket, AcceptGuard)
    socks = []
    client, fresh = TcpTransport(cfg, reactor), TcpTransport(cfg, reactor)
    target = f"127.0.0.1:{address[1]}"
    try:
        first = await client.send_to_address(target, messages.MetadataRequest(group="g0"), timeout=2)
        assert first.group == "g0"  # the client's connection is established before the flood
        for _ in range(7):
            s = socket.create_connection(address, timeout=2)
            s.setblocking(False)
            socks.append(s)
        await wait_until(reactor, lambda: server.listener_guard.refused == 2
                         and len(server.server_factory.connections) == 6)
        await wait_until(reactor, lambda: sum(closed_by_peer(s) for s in socks) == 2)
        socks[0].send(announce(1000) + b"partial")  # an unfinished frame
        during = await client.send_to_address(target, messages.MetadataRequest(group="g0"), timeout=2)
        assert during.group == "g0"  # the established connection keeps working
        await wait_until(reactor, lambda: all(closed_by_peer(s) for s in socks))  # idle and unfinished: closed
        assert server.server_factory.budget.total == 0
        # A new connection once the flood is gone.  Not the first client's: idle since ``during``, it meets the
        # same 400 ms idle timeout just after the flood's sockets (a fresh-clone CI run on a slow machine sent
        # ``after`` on it as the server closed it: NETWORK_ERROR, outcome unknown).
        after = await fresh.send_to_address(target, messages.MetadataRequest(group="g0"), timeout=2)
        assert after.group == "g0"
    finally:
        for s in socks:
            s.close()
        await client.stop()
        await fresh.stop()
        await server.stop()
