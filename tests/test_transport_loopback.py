"""The TCP transport over real sockets on 127.0.0.1 (ports chosen by the OS, every wait bounded)."""

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, DeferredList, succeed
from zope.interface import implementer

from dledger import messages
from dledger.codes import PushType, ResponseCode
from dledger.config import make_config
from dledger.entry import HEADER_SIZE, Entry
from dledger.errors import DLedgerError
from dledger.interfaces import IRequestHandler
from dledger.transport.client import Backoff, RemotingClient
from dledger.transport.tcp import TcpTransport

pytestmark = pytest.mark.network

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912"
TIMEOUT = 5.0  # every request in this module gives up by itself after this


def config(self_id):
    return make_config(group="g0", self_id=self_id, peers=PEERS, listen="tcp:0:interface=127.0.0.1")


@implementer(IRequestHandler)
class Reverse:
    """Holds requests until ``n`` arrived, then answers them newest first (replies out of order)."""

    def __init__(self, n):
        self.n = n
        self.pending = []

    def handle_request(self, request):
        d = Deferred()
        self.pending.append((request, d))
        if len(self.pending) == self.n:
            for req, waiting in reversed(self.pending):
                waiting.callback(req.base_reply(messages.RESPONSE_TYPES[type(req)]))
        return d


@implementer(IRequestHandler)
class Echo:
    def __init__(self):
        self.seen = []

    def handle_request(self, request):
        self.seen.append(request)
        return succeed(request.base_reply(messages.RESPONSE_TYPES[type(request)]))


async def pair(reactor, handler0, handler1):
    t0, t1 = TcpTransport(config("n0"), reactor), TcpTransport(config("n1"), reactor)
    p0 = await t0.start(handler0)
    p1 = await t1.start(handler1)
    t0.set_address("n1", f"127.0.0.1:{p1.getHost().port}")
    t1.set_address("n0", f"127.0.0.1:{p0.getHost().port}")
    return t0, t1


@pytest_twisted.ensureDeferred
async def test_two_transports_talk_over_real_sockets(reactor):
    """n0 and n1 listen on OS-chosen ports and exchange pipelined requests answered out of order."""
    t0, t1 = await pair(reactor, Reverse(10), Echo())
    try:
        ds = [t1.send("n0", messages.HeartBeatRequest(group="g0", term=t), timeout=TIMEOUT) for t in range(10)]
        results = await DeferredList(ds, fireOnOneErrback=True, consumeErrors=True)
        assert [r.term for _, r in results] == list(range(10))
        vote = await t0.send("n1", messages.VoteRequest(group="g0", term=2, leader_id="n0"), timeout=TIMEOUT)
        assert isinstance(vote, messages.VoteResponse) and vote.term == 2
    finally:
        await t1.stop()
        await t0.stop()


@pytest_twisted.ensureDeferred
async def test_binary_push_batch_over_real_sockets(reactor):
    """A 256 x 1 KiB binary PUSH crosses a real socket and arrives equal to what was sent."""
    echo = Echo()
    t0, t1 = await pair(reactor, echo, Echo())
    entries, pos = [], 0
    for i in range(256):
        entries.append(Entry(bytes([i]) * 1024, i, 1, pos).sealed())
        pos += HEADER_SIZE + 1024
    request = messages.PushEntryRequest(group="g0", term=1, leader_id="n1", type=PushType.APPEND,
                                        batch_entry=entries, total_size=pos)
    try:
        reply = await t1.send("n0", request, timeout=TIMEOUT)
        assert reply.code == ResponseCode.SUCCESS and echo.seen == [request]
    finally:
        await t1.stop()
        await t0.stop()


@pytest_twisted.ensureDeferred
async def test_remoting_client_sends_to_an_address(reactor):
    """A RemotingClient that only knows an address gets the member's METADATA answer."""
    t0 = TcpTransport(config("n0"), reactor)
    port = await t0.start(Echo())
    client = RemotingClient(reactor, timeout=TIMEOUT)
    try:
        reply = await client.send(f"127.0.0.1:{port.getHost().port}", messages.MetadataRequest(group="g0"))
        assert isinstance(reply, messages.MetadataResponse) and reply.group == "g0"
    finally:
        await client.close()
        await t0.stop()


@pytest_twisted.ensureDeferred
async def test_connection_refused_fails_with_network_error(reactor):
    """Sending to a port nobody listens on fails with NETWORK_ERROR, then fails fast while backing off."""
    t0 = TcpTransport(config("n0"), reactor)
    port = await t0.start(Echo())
    address = f"127.0.0.1:{port.getHost().port}"
    await t0.stop()  # the port is free again: connecting is refused
    client = RemotingClient(reactor, timeout=TIMEOUT, backoff=Backoff(initial=10, maximum=10))
    try:
        with pytest.raises(DLedgerError) as first:
            await client.send(address, messages.MetadataRequest(group="g0"))
        assert first.value.code == ResponseCode.NETWORK_ERROR
        with pytest.raises(DLedgerError, match="next connection attempt in"):
            await client.send(address, messages.MetadataRequest(group="g0"))
        assert client.link(address).attempts == 1
    finally:
        await client.close()


@pytest_twisted.ensureDeferred
async def test_stopping_the_server_fails_the_clients_requests(reactor):
    """When the serving member stops, requests waiting on it fail with NETWORK_ERROR well before their timeout."""

    @implementer(IRequestHandler)
    class Never:
        def handle_request(self, request):
            return Deferred()

    t0, t1 = await pair(reactor, Never(), Echo())
    started = reactor.seconds()
    d = t1.send("n0", messages.HeartBeatRequest(group="g0"), timeout=TIMEOUT)
    with pytest.raises(DLedgerError) as held:  # the server holds requests: proves the connection is up
        await t1.send_to_address(t1.addresses["n0"], messages.HeartBeatRequest(group="g0"), timeout=0.2)
    assert held.value.code == ResponseCode.TIMEOUT
    await t0.stop()
    with pytest.raises(DLedgerError) as lost:
        await d
    assert lost.value.code == ResponseCode.NETWORK_ERROR
    assert reactor.seconds() - started < TIMEOUT
    await t1.stop()
