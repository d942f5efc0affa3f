"""Outgoing remoting connections: one pipelined connection per address, reconnected with backoff.

:class:`RemotingClient` is what anything that only knows an address uses (the ``dledger`` CLI
client, a DLedger-compatible client library, the TCP transport itself).  Connections are opened
on demand.  After a failed attempt or a lost connection the next attempt waits a capped,
jittered exponential delay; sends during that wait fail at once with NETWORK_ERROR instead of
queueing, and there is never more than one attempt in flight per address.
"""

from __future__ import annotations

import errno
import random
import re
from dataclasses import dataclass, field
from typing import Any

from twisted.internet.defer import Deferred, fail, gatherResults, succeed
from twisted.internet.endpoints import clientFromString, quoteStringArgument
from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall, IStreamClientEndpoint
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import RequestOrResponse
from dledger.ratelog import RateLimitedLog
from dledger.transport import remoting
from dledger.transport.protocol import DEFAULT_MAX_IN_FLIGHT, RemotingProtocol

#: Java DLedger's RPC timeout (``invokeAsync(addr, request, 3000, ...)``) and connect timeout.
DEFAULT_TIMEOUT = 3.0
DEFAULT_CONNECT_TIMEOUT = 3.0

_HOST_PORT = re.compile(r"^(?:\[(?P<ipv6>[^\[\]]+)\]|(?P<host>[^:=\[\]\s]+)):(?P<port>\d{1,5})$")


def client_endpoint_description(address: str, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> str:
    """``host:port`` (as in a ``peers`` string; ``[v6]:port`` too) to a client endpoint string.

    Anything else is taken to be an endpoint string already (``tcp:host=...:port=...``, ``unix:path=...``).
    """
    m = _HOST_PORT.match(address.strip())
    if m is None:
        return address
    timeout = max(1, round(connect_timeout))
    if m["ipv6"]:
        return f"tcp6:host={quoteStringArgument(m['ipv6'])}:port={m['port']}:timeout={timeout}"
    return f"tcp:host={quoteStringArgument(m['host'])}:port={m['port']}:timeout={timeout}"


@dataclass
class Backoff:
    """Capped exponential backoff with jitter.

    The n-th consecutive failure waits ``min(maximum, initial * factor**(n-1))`` scaled by a random
    factor in ``[1 - jitter, 1]`` (from the injectable ``rng``), so the delay never exceeds
    ``maximum`` and members that lost the same peer do not reconnect in lockstep.
    """

    initial: float = 0.1
    maximum: float = 2.0
    factor: float = 2.0
    jitter: float = 0.5
    rng: random.Random = field(default_factory=random.Random)

    def __post_init__(self) -> None:
        if not (0 < self.initial <= self.maximum and self.factor >= 1 and 0 <= self.jitter < 1):
            raise ValueError(f"bad backoff parameters: {self}")

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` consecutive failures (>= 1)."""
        exponent = min(max(failures, 1) - 1, 64)
        base = min(self.maximum, self.initial * self.factor ** exponent)
        return base * (1.0 - self.jitter * self.rng.random())


def _out_of_descriptors(failure: Failure) -> bool:
    """The connect failed because this process (or the system) has no file descriptor left."""
    exc = failure.value
    code = getattr(exc, "errno", None)
    os_error = getattr(exc, "osError", None)  # twisted.internet.error.ConnectError(osError, string)
    if code is None and os_error is not None:
        code = os_error if isinstance(os_error, int) else getattr(os_error, "errno", None)
    return code in (errno.EMFILE, errno.ENFILE)


class _ClientFactory(Factory):
    """Builds the protocol of one outgoing connection (it does not serve requests)."""

    noisy = False  # no "Starting factory <... object at 0x...>" line per (re)connection

    def __init__(self, client: RemotingClient, expected_peer: str | None = None):
        self.client = client
        self.expected_peer = expected_peer

    def buildProtocol(self, addr: Any) -> RemotingProtocol:
        return RemotingProtocol(self.client.reactor, None, max_frame_size=self.client.max_frame_size,
                                max_in_flight=self.client.max_in_flight, credentials=self.client.credentials,
                                expected_peer=self.expected_peer)


@dataclass(eq=False)
class _Waiting:
    """A request waiting for its connection to open."""

    request: RequestOrResponse
    timeout: float
    binary: bool
    deadline: float
    deferred: Deferred | None = None  # set right after creation (its canceller needs this object)
    timer: IDelayedCall | None = None
    inner: Deferred | None = None


class Link:
    """The connection to one address: connects on demand, backs off after failures."""

    log = Logger()

    def __init__(self, client: RemotingClient, address: str, endpoint: IStreamClientEndpoint):
        self.client = client
        self.address = address
        self.endpoint = endpoint
        self.protocol: RemotingProtocol | None = None
        self.failures = 0
        self.attempts = 0
        self.last_error = ""
        self._connecting: Deferred | None = None
        self._waiting: list[_Waiting] = []
        self._retry_call: IDelayedCall | None = None
        self._closed = False

    @property
    def backing_off(self) -> bool:
        """True while the next connection attempt must wait."""
        return self._retry_call is not None

    @property
    def connecting(self) -> bool:
        return self._connecting is not None

    def send(self, request: RequestOrResponse, timeout: float, binary: bool) -> Deferred:
        if self._closed:
            return fail(DLedgerError(ResponseCode.NETWORK_ERROR, "client is closed"))
        if self.protocol is not None:
            return self.protocol.send_request(request, timeout, binary=binary)
        if self._retry_call is not None:
            wait = self._retry_call.getTime() - self.client.reactor.seconds()
            return fail(DLedgerError(ResponseCode.NETWORK_ERROR,
                                     f"{self.address} unreachable ({self.last_error}); "
                                     f"next connection attempt in {max(wait, 0):.2f}s"))
        w = _Waiting(request, timeout, binary, self.client.reactor.seconds() + timeout)
        w.deferred = Deferred(lambda _d: self._cancel_waiting(w))
        w.timer = self.client.reactor.callLater(timeout, self._waiting_timed_out, w)
        self._waiting.append(w)
        if self._connecting is None:
            self._connect()
        return w.deferred

    def _connect(self) -> None:
        self.attempts += 1
        try:
            d = self.endpoint.connect(_ClientFactory(self.client, self.client.expected_peers.get(self.address)))
        except Exception as exc:  # a bad endpoint string raises synchronously
            d = fail(exc)
        self._connecting = d
        d.addCallbacks(self._connected, self._connect_failed)

    def _connected(self, protocol: RemotingProtocol) -> None:
        ready = protocol.when_ready()
        if not ready.called:  # credentials to present first (TLS handshake, secret-mode login): sends wait
            self._connecting = ready
            ready.addCallbacks(lambda _: self._ready(protocol), self._not_ready, errbackArgs=(protocol,))
            return
        ready.addErrback(lambda f: None)
        if protocol.ready_error is not None:
            self._not_ready(Failure(protocol.ready_error), protocol)
            return
        self._ready(protocol)

    def _not_ready(self, failure: Failure, protocol: RemotingProtocol) -> None:
        """The peer did not accept our credentials (or we not its certificate): a failed connection attempt."""
        protocol.close()
        self._connect_failed(failure)

    def _ready(self, protocol: RemotingProtocol) -> None:
        self._connecting = None
        if self._closed:
            protocol.close()
            return
        self.protocol = protocol
        protocol.on_lost = self._lost
        protocol.on_reply = self._healthy
        waiting, self._waiting = self._waiting, []
        now = self.client.reactor.seconds()
        for w in waiting:
            if w.timer is not None and w.timer.active():
                w.timer.cancel()
            w.inner = protocol.send_request(w.request, max(w.deadline - now, 0.0), binary=w.binary)
            w.inner.chainDeferred(w.deferred)

    def _connect_failed(self, failure: Failure) -> None:
        self._connecting = None
        if self._closed:
            return
        self.last_error = failure.getErrorMessage() or failure.type.__name__
        delay = self._back_off()
        # One line per address and error per interval: a peer that stays down, or a process out of file
        # descriptors, must not write a line per attempt (issue #9: 8,914 lines from one EMFILE condition).
        key = (self.address, self.last_error)
        if _out_of_descriptors(failure):
            self.client.connect_log.warn(key, "cannot connect to {address}: out of file descriptors ({error}); raise "
                                         "the limit (ulimit -n) or lower maxConnections; next attempt in "
                                         "{delay:.2f}s", address=self.address, error=self.last_error, delay=delay)
        else:
            self.client.connect_log.info(key, "cannot connect to {address}: {error}; next attempt in {delay:.2f}s",
                                         address=self.address, error=self.last_error, delay=delay)
        self._fail_waiting(f"cannot connect to {self.address}: {self.last_error}")

    def _lost(self, protocol: RemotingProtocol, reason: Failure) -> None:
        if protocol is not self.protocol:
            return
        self.protocol = None
        if not self._closed:
            if protocol.pending == 0 and reason is not None and reason.check(ConnectionDone):
                # The server closed a connection we were not waiting on (its connectionIdleTimeoutMs, as Java's
                # remoting server does after 120 s): nothing failed, so the next send connects at once.
                return
            self.last_error = f"connection lost: {reason.getErrorMessage() if reason else 'closed'}"
            self._back_off()

    def _healthy(self) -> None:
        self.failures = 0

    def _back_off(self) -> float:
        self.failures += 1
        delay = self.client.backoff.delay(self.failures)
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = self.client.reactor.callLater(delay, self._retry_allowed)
        return delay

    def _retry_allowed(self) -> None:
        self._retry_call = None

    def _waiting_timed_out(self, w: _Waiting) -> None:
        w.timer = None
        if w in self._waiting:
            self._waiting.remove(w)
            w.deferred.errback(DLedgerError(ResponseCode.TIMEOUT,
                                            f"could not connect to {self.address} within {w.timeout:g}s"))

    def _cancel_waiting(self, w: _Waiting) -> None:
        if w.inner is not None:
            w.inner.cancel()
            return
        if w in self._waiting:
            self._waiting.remove(w)
        if w.timer is not None and w.timer.active():
            w.timer.cancel()

    def _fail_waiting(self, message: str) -> None:
        waiting, self._waiting = self._waiting, []
        for w in waiting:
            if w.timer is not None and w.timer.active():
                w.timer.cancel()
            w.deferred.errback(DLedgerError(ResponseCode.NETWORK_ERROR, message))

    def close(self) -> Deferred:
        """Fail what waits, stop connecting, close the connection; fires when it is closed."""
        self._closed = True
        if self._retry_call is not None and self._retry_call.active():
            self._retry_call.cancel()
        self._retry_call = None
        if self._connecting is not None:
            connecting, self._connecting = self._connecting, None
            connecting.cancel()
        self._fail_waiting(f"client closed; request to {self.address} abandoned")
        protocol, self.protocol = self.protocol, None
        if protocol is None:
            return succeed(None)
        protocol.fail_pending(f"client closed; request to {self.address} abandoned")
        return protocol.close()


class RemotingClient:
    """Sends requests to addresses over pooled, pipelined remoting connections.

    ``send("127.0.0.1:20911", MetadataRequest(group="g0"))`` returns a Deferred of the
    response object; failures are DLedgerError(NETWORK_ERROR / TIMEOUT / UNEXPECTED_ARGUMENT).
    ``reactor`` provides ``callLater``/``seconds`` and is what endpoint strings are built on.
    """

    def __init__(self, reactor: Any, *, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 max_frame_size: int = remoting.DEFAULT_MAX_FRAME_SIZE,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, backoff: Backoff | None = None,
                 credentials: Any = None):
        self.reactor = reactor
        #: What connections present (:class:`dledger.security.guard.ClientCredentials`; None: plain, anonymous).
        self.credentials = credentials
        #: address -> the member id expected there (its certificate must name it)
        self.expected_peers: dict[str, str] = {}
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_frame_size = max_frame_size
        self.max_in_flight = max_in_flight
        self.backoff = backoff if backoff is not None else Backoff()
        #: Connect failures, one line per address and error per interval (shared by this client's links).
        self.connect_log = RateLimitedLog(Link.log, reactor)
        self.links: dict[str, Link] = {}
        self._closed = False

    def link(self, address: str) -> Link:
        """The link to ``address`` (created on first use; not connected until a send)."""
        link = self.links.get(address)
        if link is None:
            endpoint = clientFromString(self.reactor, client_endpoint_description(address, self.connect_timeout))
            if self.credentials is not None and self.credentials.tls_options is not None:
                from dledger.security.tls import wrap_client_endpoint

                endpoint = wrap_client_endpoint(self.credentials.tls_options, endpoint, clock=self.reactor)
            link = self.links[address] = Link(self, address, endpoint)
        return link

    def send(self, address: str, request: RequestOrResponse, timeout: float | None = None, *,
             binary: bool = False) -> Deferred:
        """Send ``request`` to ``address`` (``host:port`` or a client endpoint string)."""
        if self._closed:
            return fail(DLedgerError(ResponseCode.NETWORK_ERROR, "client is closed"))
        try:
            link = self.link(address)
        except (ValueError, KeyError, TypeError) as exc:  # unparsable endpoint string
            return fail(DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"bad address {address!r}: {exc}"))
        return link.send(request, self.timeout if timeout is None else timeout, binary)

    def close(self) -> Deferred:
        """Fail outstanding requests and close every connection; fires when all are closed."""
        self._closed = True
        links, self.links = list(self.links.values()), {}
        return gatherResults([link.close() for link in links]).addCallback(lambda _: None)
