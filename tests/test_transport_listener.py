"""The connection guard every listener shares (issue #21 item 4): decisions as tables, then the guard on a
``task.Clock`` with string transports (caps, the descriptor budget, handshake/read/idle timeouts, HTTP bodies)."""

import pytest
from twisted.internet import task
from twisted.internet.address import IPv4Address
from twisted.internet.protocol import Factory, Protocol
from twisted.internet.testing import StringTransport
from twisted.logger import LogLevel, globalLogPublisher
from twisted.web.resource import Resource

from dledger.config import make_config
from dledger.transport import listener as L
from dledger.transport.bounded_http import BoundedSite
from dledger.transport.listener import ConnectionClock, FdBudget, ListenerGuard, ListenerLimits

LIMITS = ListenerLimits(max_connections=4, max_connections_per_address=2, idle_timeout=60.0, handshake_timeout=5.0,
                        read_timeout=3.0, max_body=1000)


# -- decisions -------------------------------------------------------------------------------------------------

VERDICTS = [  # (now, clock fields, expected (why, next look))
    (1.0, dict(opened=0, last_activity=0), (None, 60.0)),
    (60.0, dict(opened=0, last_activity=0), ("idle", None)),
    (60.0, dict(opened=0, last_activity=30), (None, 90.0)),
    (2.0, dict(opened=0, last_activity=1, tls=True), (None, 5.0)),
    (5.0, dict(opened=0, last_activity=1, tls=True), ("handshake", None)),
    (5.0, dict(opened=0, last_activity=1, tls=True, handshake_done=True), (None, 61.0)),
    (2.0, dict(opened=0, last_activity=2, reading_since=1.0, expected=10), (None, 4.0 + 10 / L.MIN_READ_RATE)),
    (4.5, dict(opened=0, last_activity=4.4, reading_since=1.0, expected=10), ("slow", None)),
    # a 16 MiB frame gets 16 s more; a connection mid-request is not idle
    (100.0, dict(opened=0, last_activity=99, reading_since=90.0, expected=16 * L.MiB), (None, 109.0)),
    (109.0, dict(opened=0, last_activity=108, reading_since=90.0, expected=16 * L.MiB), ("slow", None)),
]


@pytest.mark.parametrize("now,fields,expected", VERDICTS)
def test_connection_verdict_table(now, fields, expected):
    """Handshake, read (slow loris) and idle deadlines: close now with the reason, or when to look again."""
    assert L.connection_verdict(now, ConnectionClock(**fields), LIMITS) == expected


def test_timeouts_of_zero_are_off():
    """A limit of 0 turns its timeout off: a connection without deadlines is never looked at again."""
    off = ListenerLimits(idle_timeout=0, handshake_timeout=0, read_timeout=0)
    assert L.connection_verdict(1e9, ConnectionClock(0, 0, tls=True, reading_since=0.0), off) == (None, None)


@pytest.mark.parametrize("soft,open_fds,reserve,refused", [
    (400, 100, 64, False), (400, 336, 64, False), (400, 337, 64, True), (None, 10 ** 6, 64, False),
    (1024, None, 64, False),
    # a low limit keeps a quarter (at least 16): ulimit -n 200 -> 50, 64 -> 16
    (200, 150, 64, False), (200, 151, 64, True), (64, 48, 64, False), (64, 49, 64, True), (40, 24, 64, False),
    (40, 25, 64, True),
])
def test_fd_refusal_table(soft, open_fds, reserve, refused):
    """A connection keeps its descriptor only while ``fdReserve`` stay free under ``ulimit -n``."""
    why = L.fd_refusal(soft, open_fds, reserve)
    assert (why is not None) is refused
    if refused:
        assert "ulimit -n" in why and "fdReserve" in why


@pytest.mark.parametrize("verify,error,reason", [
    (10, "certificate verify failed", "expired"),
    (9, "certificate verify failed", "not valid yet"),
    (20, "certificate verify failed", "unknown CA"),
    (7, "certificate verify failed", "unknown CA"),
    (19, "", "unknown CA"),
    (None, "tlsv1 alert unknown ca", "unknown CA"),
    (None, "sslv3 alert certificate expired", "expired"),
    (None, "wrong version number", "not TLS"),
    (None, "http request", "not TLS"),
    (None, "record layer failure", "not TLS"),
    (None, "unsupported protocol", "too old"),
    (None, "something new", "something new"),
])
def test_tls_failure_reasons(verify, error, reason):
    """A failed handshake is explained in an operator's words: expired, unknown CA, not TLS at all."""
    assert reason in L.tls_failure_reason(verify, error)


@pytest.mark.parametrize("data,hello", [
    (b"\x16\x03\x01\x02\x00\x01", True), (b"\x16\x03\x03", True), (b"\x16\x03\x09", False),
    (b"\x00\x00\x00\x1e", False), (b"GET / HTTP/1.1", False), (b"\x16", False),
])
def test_tls_hello_table(data, hello):
    """A plaintext port recognises a TLS ClientHello (and says so instead of "frame too large")."""
    assert L.tls_hello(data) is hello


def test_limits_from_config_and_for_http():
    """The member's options set every listener's limits; a metrics/status port keeps only a few connections."""
    cfg = make_config(group="g0", self_id="n0", peers="n0-127.0.0.1:1", maxConnections=500,
                      requestReadTimeoutMs=2500, connectionHandshakeTimeoutMs=4000, maxHttpBodyBytes=100)
    limits = ListenerLimits.from_config(cfg)
    assert (limits.max_connections, limits.read_timeout, limits.handshake_timeout, limits.max_body) == (
        500, 2.5, 4.0, 100)
    assert limits.for_http().max_connections == L.HTTP_MAX_CONNECTIONS
    assert ListenerLimits.from_config(cfg, max_connections=7).max_connections == 7


@pytest.mark.parametrize("option", ["requestReadTimeoutMs", "connectionHandshakeTimeoutMs", "maxHttpBodyBytes",
                                    "fdReserve"])
def test_guard_options_must_be_positive(option):
    """A zero or negative guard option is a one-line config error naming it."""
    from dledger.errors import ConfigError

    with pytest.raises(ConfigError, match=option):
        make_config(group="g0", self_id="n0", peers="n0-127.0.0.1:1", **{option: 0})


# -- the descriptor budget -------------------------------------------------------------------------------------

class Fds:
    """A process's open descriptors, as the budget counts them."""

    def __init__(self, n):
        self.n, self.counts = n, 0

    def __call__(self):
        self.counts += 1
        return self.n


def test_fd_budget_is_shared_and_keeps_the_reserve(clock):
    """Connections of every listener come out of one budget; the reserve stays free; a closed one frees its fd."""
    fds = Fds(40)
    budget = FdBudget(400, reserve=64, clock=clock, count_open=fds)
    taken = 0
    while True:
        fds.n += 1  # the accepted socket
        if budget.admit() is not None:
            fds.n -= 1  # closed at once
            break
        taken += 1
    assert taken == 400 - 64 - 40 and fds.n + budget.reserve == 400
    assert budget.refused == 1
    budget.release()
    fds.n -= 1
    fds.n += 1
    assert budget.admit() is None  # the freed descriptor is taken again


def test_fd_budget_sees_what_the_store_opened(clock):
    """Descriptors opened elsewhere (a store rolling files) are counted: near the limit the budget recounts."""
    fds = Fds(40)
    budget = FdBudget(400, reserve=64, clock=clock, count_open=fds)
    fds.n += 1
    assert budget.admit() is None
    fds.n += 300  # the store opened 300 files
    clock.advance(L.FD_RECOUNT_INTERVAL)
    fds.n += 1
    assert budget.admit() is not None  # 342 open + 64 reserved > 400: refused
    near = FdBudget(400, reserve=64, clock=clock, count_open=fds)
    fds.n = 300  # within FD_RECOUNT_SLACK of the budget: every admission counts exactly
    before = fds.counts
    for _ in range(3):
        fds.n += 1
        assert near.admit() is None
    assert fds.counts - before == 3
    counts = fds.counts
    budget2 = FdBudget(100_000, reserve=64, clock=clock, count_open=fds)
    for _ in range(100):
        fds.n += 1
        assert budget2.admit() is None
    assert fds.counts - counts == 1  # far from the limit: counted once, then estimated (no listdir per accept)
    clock.advance(L.FD_RECOUNT_INTERVAL)
    fds.n += 1
    budget2.admit()
    assert fds.counts - counts == 2  # and recounted once a second


# -- the guard on a fake clock -----------------------------------------------------------------------------------

class Recorder(Protocol):
    """An inner protocol that says it has an unfinished request while the last byte was not a newline."""

    def __init__(self):
        self.data, self.lost, self.paused = b"", None, False

    def dataReceived(self, data):
        self.data += data

    def unfinished_request(self):
        if self.paused or not self.data or self.data.endswith(b"\n"):
            return 0
        return len(self.data.rsplit(b"\n", 1)[-1])

    def connectionLost(self, reason=None):
        self.lost = reason


class FakeTLS(StringTransport):
    """A transport that looks like TLS to the guard (so the handshake timeout applies)."""

    def getPeerCertificate(self):
        return None

    def getHandle(self):
        return None


@pytest.fixture
def lines():
    events = []

    def observer(event):
        if event.get("log_level") in (LogLevel.warn, LogLevel.error, LogLevel.critical):
            events.append(event)

    globalLogPublisher.addObserver(observer)
    yield events
    globalLogPublisher.removeObserver(observer)


def text(event):
    from twisted.logger import formatEvent

    return formatEvent(event)


def connect(factory, host="10.0.0.1", transport_cls=StringTransport, port=1000):
    proto = factory.buildProtocol(IPv4Address("TCP", host, port))
    if proto is None:
        return None, None
    t = transport_cls(peerAddress=IPv4Address("TCP", host, port))
    proto.makeConnection(t)
    return proto, t


def guarded(clock, limits=LIMITS, budget=None, name="test port"):
    guard = ListenerGuard(name, limits, clock, budget or FdBudget(None, clock=clock))
    return guard, guard.wrap(Factory.forProtocol(Recorder))


def test_caps_per_listener_and_per_address_with_one_line_per_address(clock, lines):
    """Beyond maxConnectionsPerAddress / maxConnections a connection is refused; one line per address, not per try."""
    guard, factory = guarded(clock)
    got = [connect(factory, "10.0.0.1")[0] for _ in range(5)]
    assert [p is not None for p in got] == [True, True, False, False, False]
    assert [connect(factory, "10.0.0.2")[0] is not None for _ in range(2)] == [True, True]
    assert connect(factory, "10.0.0.3")[0] is None  # the listener is full (4)
    assert guard.refused == 4 and len(guard.connections) == 4
    refusals = [text(e) for e in lines if "refusing a connection" in text(e)]
    assert len(refusals) == 2 and all(r.startswith("test port: ") for r in refusals), refusals
    got[0].transport.loseConnection()
    got[0].connectionLost(None)
    assert connect(factory, "10.0.0.1")[0] is not None  # a closed connection frees its place


def test_one_budget_across_listeners(clock):
    """Two listeners share the process's descriptor budget: a flood on one leaves nothing for the other."""
    fds = Fds(40)
    budget = FdBudget(200, reserve=50, clock=clock, count_open=fds)
    wide = ListenerLimits(max_connections=1000, max_connections_per_address=1000)
    a, fa = guarded(clock, wide, budget, "metrics port")
    b, fb = guarded(clock, wide, budget, "member port")
    n = 0
    while True:
        fds.n += 1
        p, _ = connect(fa)
        if p is None:
            fds.n -= 1
            break
        n += 1
    assert n == 200 - 50 - 40
    fds.n += 1
    assert connect(fb)[0] is None and b.refused == 1  # the member port is protected by the same budget


def test_slow_loris_is_closed_after_the_read_timeout(clock, lines):
    """A request trickling in a byte at a time is aborted read_timeout after its first byte, with one line."""
    guard, factory = guarded(clock)
    proto, t = connect(factory)
    proto.dataReceived(b"GET /\n")  # a complete request: nothing unfinished
    clock.advance(10)
    for _ in range(3):
        proto.dataReceived(b"x")  # an unfinished one, a byte a second
        clock.advance(1)
    assert not t.disconnecting
    proto.dataReceived(b"x")
    clock.advance(1)
    assert t.disconnecting
    assert guard.stats.closed == {"slow": 1}
    assert [text(e) for e in lines if "not complete" in text(e)]


def test_a_request_we_stopped_reading_is_not_slow(clock):
    """While the protocol itself stops reading (back-pressure), its unfinished request is not timed against the peer."""
    guard, factory = guarded(clock)
    proto, t = connect(factory)
    proto.dataReceived(b"half a request")
    proto.wrappedProtocol.paused = True  # back-pressure: the protocol reports nothing unfinished
    clock.advance(LIMITS.read_timeout * 3)
    assert not t.disconnecting and guard.stats.closed == {}


def test_a_fast_client_is_never_closed_and_idle_ones_are(clock):
    """Requests completing within the read timeout keep a connection open; silence for idle_timeout closes it."""
    guard, factory = guarded(clock)
    proto, t = connect(factory)
    for _ in range(200):
        proto.dataReceived(b"part")
        clock.advance(1)
        proto.dataReceived(b"rest\n")
    assert not t.disconnecting
    clock.advance(LIMITS.idle_timeout)
    assert t.disconnecting and guard.stats.closed == {"idle": 1}


def test_writes_keep_a_connection_from_being_idle(clock):
    """Bytes going out (a long-poll answered, a status stream) count as activity."""
    guard, factory = guarded(clock)
    proto, t = connect(factory)
    for _ in range(5):
        clock.advance(LIMITS.idle_timeout / 2)
        proto.wrappedProtocol.transport.write(b"tick")
    assert not t.disconnecting


def test_tls_handshake_must_finish_in_time(clock, lines):
    """A TLS connection whose handshake is not done within handshake_timeout is aborted with one line."""
    guard, factory = guarded(clock)
    done, t1 = connect(factory, transport_cls=FakeTLS)
    done.handshakeCompleted()
    stuck, t2 = connect(factory, transport_cls=FakeTLS)
    clock.advance(LIMITS.handshake_timeout)
    assert t2.disconnecting and not t1.disconnecting
    assert guard.stats.closed == {"handshake": 1}
    assert any("TLS handshake from 10.0.0.1 not done" in text(e) for e in lines)


def test_failed_handshakes_are_one_line_per_peer_and_reason(clock, lines):
    """A handshake failure is logged with the peer and the reason, rate-limited (1,000 failures: one line)."""
    from OpenSSL.SSL import Error
    from twisted.python.failure import Failure

    guard, factory = guarded(clock)
    for _ in range(1000):
        proto, _ = connect(factory, transport_cls=FakeTLS)
        proto.connectionLost(Failure(Error([("SSL routines", "", "tlsv1 alert unknown ca")])))
    failed = [text(e) for e in lines if "TLS handshake from" in text(e)]
    assert len(failed) == 1 and "10.0.0.1" in failed[0] and "unknown CA" in failed[0], failed
    assert guard.stats.tls_failures == 1000


def test_warn_peer_is_rate_limited_per_listener_and_address(clock, lines):
    """Protocols log hostile input through warn_peer: 2,000 bad frames from one host are one line per 10 s."""
    guard, factory = guarded(clock)
    for _ in range(2000):
        proto, _ = connect(factory)
        L.warn_peer(proto.wrappedProtocol, "bad frame", "closing connection from {peer}: bad", peer="10.0.0.1")
        proto.connectionLost(None)
    assert len([e for e in lines if "bad" in text(e)]) == 1


# -- HTTP -------------------------------------------------------------------------------------------------------

class Page(Resource):
    isLeaf = True

    def __init__(self):
        super().__init__()
        self.bodies = []

    def render_GET(self, request):
        return b"ok\n"

    def render_POST(self, request):
        self.bodies.append(request.content.read())
        return b"posted\n"


def http(clock, page, data):
    guard = ListenerGuard("metrics port", LIMITS, clock, FdBudget(None, clock=clock))
    factory = guard.wrap(BoundedSite(page, max_body=LIMITS.max_body))
    proto, t = connect(factory)
    proto.dataReceived(data)
    return proto, t


def test_http_body_over_the_limit_is_refused_before_it_is_buffered(clock, lines):
    """Content-Length 99999999999: 413 at once, connection closed, no request reaches the resource."""
    page = Page()
    head = b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n"
    proto, t = http(clock, page, head + b"x" * 100)
    assert t.value().startswith(b"HTTP/1.1 413 ")
    assert t.disconnecting and page.bodies == []
    assert proto.wrappedProtocol.requests == [] or proto.wrappedProtocol.requests[-1].content is None
    assert any("maxHttpBodyBytes" in text(e) for e in lines)


def test_chunked_body_over_the_limit_is_refused(clock):
    """A chunked body is counted as it arrives and refused past the limit."""
    page = Page()
    chunk = b"400\r\n" + b"y" * 1024 + b"\r\n"
    proto, t = http(clock, page, b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 200)
    assert b"413" in t.value().split(b"\r\n", 1)[0] and t.disconnecting and page.bodies == []


def test_small_http_requests_are_served(clock):
    """GET and a small POST are answered as before."""
    page = Page()
    _, t = http(clock, page, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
    assert b"posted" in t.value() and page.bodies == [b"hello"]
    _, t = http(clock, page, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert t.value().startswith(b"HTTP/1.1 200") and b"ok" in t.value()


def test_http_headers_trickling_in_are_closed(clock):
    """An HTTP request whose headers never end (slow loris) is closed after the read timeout."""
    page = Page()
    proto, t = http(clock, page, b"GET / HTTP/1.1\r\n")
    for _ in range(10):
        proto.dataReceived(b"X-a: b\r\n")
        clock.advance(0.5)
    assert t.disconnecting


def test_remoting_frames_report_their_announced_size():
    """The remoting splitter tells the guard how large the frame now arriving will be (its length field)."""
    from dledger.transport.remoting import FrameSplitter

    s = FrameSplitter(64 * L.MiB)
    assert s.unfinished == 0
    list(s.feed(b"\x00\x00"))
    assert s.unfinished == 2
    list(s.feed(b"\x00\x10" + b"\x00" * 5))
    assert s.unfinished == 4 + 16
    big = FrameSplitter(64 * L.MiB)
    list(big.feed((8 * L.MiB).to_bytes(4, "big") + b"\x00\x00\x00\x02" + b"{}" + b"x" * 10))
    assert big.unfinished == 4 + 8 * L.MiB


def test_clock_fixture_is_a_task_clock(clock):
    """(The tests above run on task.Clock: no real time passes.)"""
    assert isinstance(clock, task.Clock)


NEW_REQUEST = [  # (rule, reading before, buffered before, bytes read, buffered after, a new request began)
    ("nothing_was_unfinished", False, None, 10, 4, True),
    ("the_same_request_grew_by_the_read", True, 100, 50, 150, False),
    ("it_completed_and_another_began", True, 100, 50, 20, True),
    ("it_completed_and_another_of_the_same_length_began", True, 100, 1538, 100, True),
    ("protocol_does_not_count_keeps_the_clock", True, None, 50, None, False),
]


@pytest.mark.parametrize("rule, reading, had, received, has, expected", NEW_REQUEST, ids=[r[0] for r in NEW_REQUEST])
def test_new_request_began(rule, reading, had, received, has, expected):
    """A request's read clock starts with its own first byte, not with an earlier request's."""
    assert L.new_request_began(reading, had, received, has) is expected


class Counting(Recorder):
    """A Recorder that also says how many bytes of its unfinished request it holds (as RemotingProtocol does)."""

    @property
    def buffered(self):
        return self.unfinished_request()


def test_a_client_streaming_longer_than_the_read_timeout_is_not_slow(clock):
    """Issue #28: reads that each complete one request and start the next (a pipelined client) for many read
    timeouts keep the connection open; a request that itself trickles is still closed."""
    guard = ListenerGuard("test port", LIMITS, clock, FdBudget(None, clock=clock))
    factory = guard.wrap(Factory.forProtocol(Counting))
    proto, t = connect(factory)
    proto.dataReceived(b"part")
    for _ in range(int(LIMITS.read_timeout * 20)):
        clock.advance(0.5)
        proto.dataReceived(b"rest\npart")  # every read ends in the middle of a request
    assert not t.disconnecting and guard.stats.closed == {}
    for _ in range(int(LIMITS.read_timeout) + 2):
        clock.advance(1)
        proto.dataReceived(b"x")  # now one request trickles
    assert t.disconnecting and guard.stats.closed == {"slow": 1}
