"""One connection guard for every listening port of a process: the member port, the broker port, the name
server, the metrics/status port and any plugin service port (issue #21, item 4).

Why: the member port had caps, an idle timeout and rate-limited lines (issue #9); the ports built beside it
had none.  Tried against a member: the metrics port, the broker port and the name server each held 2,000
idle connections; under ``ulimit -n 200`` 260 idle connections to the metrics port made the member's
checkpoint writes fail with a traceback twice a second; a metrics POST with ``Content-Length: 99999999999``
filled a 200 MB temporary file; 2,000 bad frames to the broker port gave 2,024 log lines; a client sending
a byte at a time kept a connection for 120 s on every port.  So every listener goes through the same guard:

* :class:`ListenerGuard` -- one per listening port: at most ``max_connections`` connections and
  ``max_connections_per_address`` from one host (more are closed as soon as accepted, one rate-limited
  line per address), and one process-wide :class:`FdBudget`;
* :class:`FdBudget` -- file descriptors budgeted across *all* listeners from ``RLIMIT_NOFILE``, keeping
  ``fdReserve`` free for the stores, the peer links and the log: a flood on any port, or on all of them
  at once, is refused before a store write can fail with EMFILE;
* :class:`GuardedProtocol` -- wraps each accepted connection's protocol: a TLS handshake must finish within
  ``handshake_timeout``; a request whose first byte arrived must be complete within ``read_timeout`` (plus
  a second per MiB it announces: a slow loris is closed within seconds); a connection without a byte in
  either direction for ``idle_timeout`` is closed; a failed TLS handshake is one rate-limited line naming
  the peer and the reason (expired, unknown CA, not TLS at all);
* :class:`dledger.transport.bounded_http.BoundedSite` -- HTTP listeners: a request body over ``max_body``
  is refused (413) before a byte of it is buffered.

Protocols tell the guard about their requests through two optional methods: ``unfinished_request()``
(bytes the request now arriving will have, 0 when none is unfinished; without it only the idle and
handshake timeouts apply) and they log hostile input through :func:`warn_peer` (rate-limited per listener
and address).  The decisions are the pure functions below; this is dledger's public API for plugins
(``ListenerGuard(...).listen(reactor, endpoint, factory)``), see docs/transport.md.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.interfaces import IHandshakeListener, IProtocolNegotiationFactory
from twisted.logger import Logger
from twisted.protocols.policies import ProtocolWrapper, WrappingFactory
from twisted.python.failure import Failure
from zope.interface import directlyProvides, implementer

from dledger.ratelog import RateLimitedLog
from dledger.timing import due
from dledger.transport.limits import (
    TLS_AT_PLAIN_PORT,
    AcceptGuard,
    admission_refusal,
    fd_usage,
    guard_accept,
    tls_hello,
)

KiB, MiB = 1024, 1024 * 1024
#: A request may take a second longer per this many bytes it announces (a 16 MiB frame on a slow link).
MIN_READ_RATE = 1 * MiB
#: Descriptors kept free of incoming connections by default (``fdReserve``): store files and checkpoints,
#: the peer links, log files, the accept of a connection about to be refused.
DEFAULT_FD_RESERVE = 64
MIN_FD_RESERVE = 16
#: Re-count open descriptors when the estimate comes this close to the budget, or after this many seconds.
FD_RECOUNT_SLACK = 64
FD_RECOUNT_INTERVAL = 1.0
#: Connections of a metrics/status port (Prometheus keeps one; a few humans with curl).
HTTP_MAX_CONNECTIONS = 64
HTTP_MAX_CONNECTIONS_PER_ADDRESS = 16

log = Logger(namespace="dledger.transport.listener")


@dataclass(frozen=True)
class ListenerLimits:
    """What one connection of a listener may cost (seconds and bytes; 0 turns a timeout off)."""

    max_connections: int = 1024
    max_connections_per_address: int = 256
    idle_timeout: float = 120.0
    handshake_timeout: float = 10.0
    read_timeout: float = 10.0
    #: HTTP listeners: the largest request body (Content-Length or chunked) accepted.
    max_body: int = 64 * KiB

    @classmethod
    def from_config(cls, config: Any, **overrides: Any) -> ListenerLimits:
        """The limits a member's configuration asks for (``maxConnections``, ``requestReadTimeoutMs`` ...)."""
        limits = cls(max_connections=config.max_connections,
                     max_connections_per_address=config.max_connections_per_address,
                     idle_timeout=config.connection_idle_timeout_ms / 1000.0,
                     handshake_timeout=config.connection_handshake_timeout_ms / 1000.0,
                     read_timeout=config.request_read_timeout_ms / 1000.0,
                     max_body=config.max_http_body_bytes)
        return replace(limits, **overrides) if overrides else limits

    def for_http(self) -> ListenerLimits:
        """These limits for a metrics/status port: a few connections (Prometheus keeps one)."""
        return replace(self, max_connections=min(self.max_connections, HTTP_MAX_CONNECTIONS),
                       max_connections_per_address=min(self.max_connections_per_address,
                                                       HTTP_MAX_CONNECTIONS_PER_ADDRESS))


# -- decisions ----------------------------------------------------------------------------------------------

def effective_reserve(reserve: int, soft_limit: int | None) -> int:
    """``fdReserve``, but never more than a quarter of a low descriptor limit (and at least ``MIN_FD_RESERVE``):
    under ``ulimit -n 64`` a reserve of 64 would leave no connection at all, not even the other members'."""
    if soft_limit is None:
        return reserve
    return min(reserve, max(MIN_FD_RESERVE, soft_limit // 4))


def fd_refusal(soft_limit: int | None, open_fds: int | None, reserve: int) -> str | None:
    """Why one more connection may not keep a descriptor, with ``open_fds`` open of ``soft_limit``; None: it may.

    The accepted socket is already among ``open_fds``.  ``reserve`` descriptors stay free for the stores.
    """
    if soft_limit is None or open_fds is None:
        return None
    reserve = effective_reserve(reserve, soft_limit)
    if open_fds + reserve > soft_limit:
        return (f"{open_fds} of {soft_limit} file descriptors are open (ulimit -n) and {reserve} are kept for "
                "the stores and peers (fdReserve)")
    return None


def read_deadline(started: float, expected: int, timeout: float, min_rate: int = MIN_READ_RATE) -> float:
    """When a request whose first byte came at ``started`` and that will have ``expected`` bytes must be in."""
    return started + timeout + max(0, expected) / min_rate


def new_request_began(reading: bool, had: int | None, received: int, has: int | None) -> bool:
    """Whether the unfinished request after a read is another one than before it (its read clock starts now).

    ``had`` / ``has``: bytes of the unfinished request buffered before and after a read of ``received``
    bytes (None when the protocol does not say).  The same request only grows by what was read; anything
    else means it completed and the bytes now waiting began a new one.  Without the count a request's
    clock is kept (the old rule), which closed a client streaming for longer than the read timeout whose
    reads kept ending in the middle of a frame (issue #28: the benchmark's load connection).
    """
    if not reading:
        return True
    return had is not None and has is not None and has != had + received


@dataclass
class ConnectionClock:
    """The times the guard keeps for one connection (what :func:`connection_verdict` reads)."""

    opened: float
    last_activity: float
    tls: bool = False
    handshake_done: bool = False
    reading_since: float | None = None
    expected: int = 0
    buffered: int | None = None


def connection_verdict(now: float, c: ConnectionClock, limits: ListenerLimits) -> tuple[str | None, float | None]:
    """``(why to close now, None)`` or ``(None, when to look again)`` (None: never).

    The reasons: ``handshake`` (TLS not done within ``handshake_timeout``), ``slow`` (a request unfinished
    past :func:`read_deadline`), ``idle`` (no byte either way for ``idle_timeout``; a connection in the
    middle of a request is not idle, the read timeout governs it).
    """
    deadlines = []
    if c.tls and not c.handshake_done and limits.handshake_timeout > 0:
        at = c.opened + limits.handshake_timeout
        if due(at, now):
            return "handshake", None
        deadlines.append(at)
    if c.reading_since is not None:
        if limits.read_timeout > 0:
            at = read_deadline(c.reading_since, c.expected, limits.read_timeout)
            if due(at, now):
                return "slow", None
            deadlines.append(at)
    elif limits.idle_timeout > 0:
        at = c.last_activity + limits.idle_timeout
        if due(at, now):
            return "idle", None
        deadlines.append(at)
    if c.reading_since is not None and limits.idle_timeout > 0:
        deadlines.append(now + limits.idle_timeout)
    return None, (min(deadlines) if deadlines else None)


#: X.509 verification errors (OpenSSL's numbers) in an operator's words.
_X509_REASONS = {
    9: "its certificate is not valid yet (or a clock is wrong)",
    10: "its certificate has expired",
    2: "unknown CA: its certificate is not signed by a CA in tlsCa",
    7: "unknown CA: its certificate's signature does not match the CA in tlsCa (another CA of the same name?)",
    18: "unknown CA: its certificate is self-signed",
    19: "unknown CA: its certificate chain ends in a CA that is not in tlsCa",
    20: "unknown CA: its certificate is not signed by a CA in tlsCa",
    21: "unknown CA: its certificate is not signed by a CA in tlsCa",
    23: "its certificate is revoked",
    26: "its certificate may not be used for this purpose",
}
#: Substrings of OpenSSL's error strings -> the reason, first match wins.
_TLS_ERRORS = [
    ("unknown ca", "it does not trust our certificate (unknown CA: is its CA file the group's CA?)"),
    ("certificate expired", "it refused our certificate: expired"),
    ("bad certificate", "it refused our certificate"),
    ("certificate unknown", "it refused our certificate"),
    ("certificate required", "it sent no certificate and one is required"),
    ("peer did not return a certificate", "it sent no certificate and one is required"),
    ("wrong version number", "not TLS: a plaintext client at a TLS port?"),
    ("http request", "not TLS: a plaintext (HTTP) client at a TLS port?"),
    ("packet length too long", "not TLS: a plaintext client at a TLS port?"),
    ("record layer failure", "not TLS: a plaintext client at a TLS port?"),
    ("unsupported protocol", "its TLS version is too old (TLS 1.2 or later is required)"),
    ("no shared cipher", "no cipher in common"),
    ("certificate verify failed", "its certificate did not verify against tlsCa"),
]


def tls_failure_reason(verify_error: int | None, error: str) -> str:
    """Why a TLS handshake failed, from the X.509 verification error (if any) and OpenSSL's error text."""
    if verify_error:
        return _X509_REASONS.get(verify_error, f"its certificate did not verify (X.509 error {verify_error})")
    low = error.lower()
    for needle, reason in _TLS_ERRORS:
        if needle in low:
            return reason
    return error or "the connection closed during the handshake"


# -- file descriptors ---------------------------------------------------------------------------------------

def count_open_fds() -> int | None:
    """Descriptors this process holds now (None where unknown)."""
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return len(os.listdir(path))
        except OSError:
            continue
    return None


class FdBudget:
    """Descriptors for incoming connections, shared by every listener of the process.

    A connection is admitted while the descriptors open (counted exactly whenever the estimate comes near
    the limit, and at least once a second under load) plus ``reserve`` fit under the soft ``RLIMIT_NOFILE``.
    What the stores open meanwhile is seen at the next count, so the reserve needs only cover the moment.
    """

    _shared: FdBudget | None = None

    def __init__(self, soft_limit: int | None, reserve: int = DEFAULT_FD_RESERVE, clock: Any = None,
                 count_open: Any = count_open_fds):
        """``clock``: an ``IReactorTime`` for tests; None (the process's budget) uses ``time.monotonic``."""
        self.soft_limit = soft_limit
        self.reserve = reserve
        self.clock = clock
        self.count_open = count_open
        self.live = 0
        self._base: int | None = None
        self._base_live = 0
        self._counted_at: float | None = None
        self.refused = 0
        self.announced = False

    @classmethod
    def shared(cls) -> FdBudget:
        """The process's budget (created from ``RLIMIT_NOFILE`` on first use)."""
        if cls._shared is None:
            soft, _ = fd_usage()
            cls._shared = cls(soft)
        return cls._shared

    def reserve_at_least(self, reserve: int) -> None:
        """Keep at least ``reserve`` descriptors free (a member's ``fdReserve``)."""
        self.reserve = max(self.reserve, reserve)

    @property
    def connections(self) -> int | None:
        """How many connections the budget allows in total now (None: unlimited or unknown)."""
        if self.soft_limit is None:
            return None
        open_now = self.count_open()
        if open_now is None:
            return None
        return max(0, self.soft_limit - effective_reserve(self.reserve, self.soft_limit) - (open_now - self.live))

    def admit(self) -> str | None:
        """Take a descriptor for a just-accepted connection; why not (and nothing taken), or None."""
        if self.soft_limit is None:
            self.live += 1
            return None
        now = self.clock.seconds() if self.clock is not None else time.monotonic()
        estimate = None if self._base is None else self._base + self.live - self._base_live + 1
        stale = self._counted_at is None or now - self._counted_at >= FD_RECOUNT_INTERVAL
        reserve = effective_reserve(self.reserve, self.soft_limit)
        if estimate is None or stale or estimate + reserve + FD_RECOUNT_SLACK > self.soft_limit:
            counted = self.count_open()
            if counted is None:
                self.live += 1
                return None
            self._base, self._base_live, self._counted_at = counted - 1, self.live, now
            estimate = counted
        why = fd_refusal(self.soft_limit, estimate, self.reserve)
        if why is not None:
            self.refused += 1
            return why
        self.live += 1
        return None

    def release(self) -> None:
        """A connection the budget admitted closed."""
        self.live -= 1


# -- the guard of one listener ------------------------------------------------------------------------------

def warn_peer(protocol: Any, key: Any, fmt: str, **kw: Any) -> None:
    """A warning about a connection's peer, rate-limited per listener, address and ``key`` when the
    connection came through a :class:`ListenerGuard` (one line per 10 s with a count); else logged."""
    transport = getattr(protocol, "transport", None)
    guard = getattr(transport, "listener", None)
    if isinstance(guard, ListenerGuard):
        guard.warn((key, transport.peer_host), fmt, **kw)
    else:
        log.warn(fmt, **kw)


@dataclass
class ListenerStats:
    accepted: int = 0
    refused: int = 0
    closed: dict[str, int] = field(default_factory=dict)  # reason -> connections closed by the guard
    tls_failures: int = 0


class ListenerGuard:
    """The guard of one listening port: admission, per-connection timeouts, rate-limited lines.

    ``name`` appears in every line (``metrics port``, ``broker port``); ``budget`` defaults to the process's
    :meth:`FdBudget.shared`.  :meth:`listen` binds an endpoint string with every connection guarded.
    """

    def __init__(self, name: str, limits: ListenerLimits, clock: Any, budget: FdBudget | None = None,
                 logger: Logger | None = None):
        self.name = name
        self.limits = limits
        self.clock = clock
        self.budget = budget if budget is not None else FdBudget.shared()
        self.lines = RateLimitedLog(logger or log, clock)
        self.connections: set[GuardedProtocol] = set()
        self.per_address: dict[str, int] = {}
        self.stats = ListenerStats()
        self.port: Any = None
        self.accept_guard: AcceptGuard | None = None
        self._pending = 0  # admitted, protocol not yet connected

    def warn(self, key: Any, fmt: str, **kw: Any) -> bool:
        """A rate-limited warning prefixed with the listener's name."""
        return self.lines.warn((self.name, key), "{listener}: " + fmt, listener=self.name, **kw)

    @property
    def refused(self) -> int:
        return self.stats.refused

    def admit(self, host: str) -> str | None:
        """Why a connection just accepted from ``host`` must be closed (logged, rate-limited); None: it is taken."""
        why = admission_refusal(len(self.connections) + self._pending, self.per_address.get(host, 0), self.limits)
        if why is None:
            why = self.budget.admit()
            if why is not None:
                why += " -- raise ulimit -n to accept more"
        if why is not None:
            self.stats.refused += 1
            self.warn(("refused", host), "refusing a connection from {host}: {why}", host=host, why=why)
            return why
        self.stats.accepted += 1
        self.per_address[host] = self.per_address.get(host, 0) + 1
        self._pending += 1
        return None

    def opened(self, proto: GuardedProtocol) -> None:
        self._pending -= 1
        self.connections.add(proto)

    def closed(self, proto: GuardedProtocol, host: str, *, connected: bool = True) -> None:
        if connected:
            self.connections.discard(proto)
        else:
            self._pending -= 1
        left = self.per_address.get(host, 1) - 1
        if left > 0:
            self.per_address[host] = left
        else:
            self.per_address.pop(host, None)
        self.budget.release()

    def wrap(self, factory: Any, tls_options: Any = None) -> Any:
        """``factory`` with every connection guarded (and behind TLS with ``tls_options``)."""
        wrapped = GuardedFactory(self, factory)
        if tls_options is not None:
            from dledger.security.tls import wrap_server_factory

            wrapped = wrap_server_factory(tls_options, wrapped)
        return wrapped

    def listen(self, reactor: Any, endpoint: str, factory: Any, tls_options: Any = None) -> Deferred:
        """Listen on server endpoint string ``endpoint``; fires with the listening port (or fails).

        ``accept`` running out of descriptors pauses accepting with one line (:class:`AcceptGuard`).
        """
        from twisted.internet.endpoints import serverFromString

        self._announce_budget()
        d = maybeDeferred(lambda: serverFromString(reactor, endpoint).listen(self.wrap(factory, tls_options)))

        def bound(port: Any) -> Any:
            self.port = port
            self.accept_guard = guard_accept(port, reactor)
            return port

        return d.addCallback(bound)

    def stop(self) -> None:
        """The port is closing: no pending accept resumes."""
        if self.accept_guard is not None:
            self.accept_guard.cancel()

    def _announce_budget(self) -> None:
        budget = self.budget
        if budget.announced:
            return
        allowed = budget.connections
        if allowed is not None and allowed < self.limits.max_connections:
            budget.announced = True
            self.lines.logger.warn("accepting at most {n} connections across all ports, not maxConnections {m}: "
                                   "the file descriptor limit is {soft} (ulimit -n), {used} are open and {reserve} "
                                   "are kept for the stores and peers (fdReserve); raise the limit to allow more",
                                   n=allowed, m=self.limits.max_connections, soft=budget.soft_limit,
                                   used=budget.count_open(),
                                   reserve=effective_reserve(budget.reserve, budget.soft_limit))


class GuardedFactory(WrappingFactory):
    """Wraps a listener's factory: admission by its :class:`ListenerGuard`, each protocol a :class:`GuardedProtocol`."""

    noisy = False

    def __init__(self, guard: ListenerGuard, wrapped: Any):
        super().__init__(wrapped)
        self.guard = guard
        if IProtocolNegotiationFactory.providedBy(wrapped):
            # TLS (an ssl: endpoint) asks the factory it wraps -- this one -- for the ALPN protocols; with none,
            # Twisted's ALPN callback fails every client that offers ALPN (browsers, curl: "internal error").
            directlyProvides(self, IProtocolNegotiationFactory)

    def acceptableProtocols(self) -> list[bytes]:
        """The wrapped factory's ALPN protocols (``twisted.web``'s Site: ``http/1.1``, and ``h2`` with h2)."""
        return list(self.wrappedFactory.acceptableProtocols())

    def buildProtocol(self, addr: Any) -> GuardedProtocol | None:
        host = str(getattr(addr, "host", addr))
        if self.guard.admit(host) is not None:
            return None  # Twisted closes the accepted socket
        inner = self.wrappedFactory.buildProtocol(addr)
        if inner is None:
            self.guard.closed(None, host, connected=False)
            return None
        return GuardedProtocol(self, inner, host)


@implementer(IHandshakeListener)
class GuardedProtocol(ProtocolWrapper):
    """One guarded connection: the inner protocol sees it as its transport (see the module docstring)."""

    def __init__(self, factory: GuardedFactory, wrapped: Any, host: str):
        super().__init__(factory, wrapped)
        self.listener = factory.guard
        self.peer_host = host
        self._timer: Any = None
        self._clock: ConnectionClock | None = None
        self._progress = getattr(wrapped, "unfinished_request", None)
        self._has_buffered = self._progress is not None and hasattr(type(wrapped), "buffered")
        self._closed_by_guard: str | None = None
        self._wrote = False

    # -- connection -----------------------------------------------------------------------------------------
    def makeConnection(self, transport: Any) -> None:
        guard = self.listener
        now = guard.clock.seconds()
        tls = callable(getattr(transport, "getPeerCertificate", None)) and hasattr(transport, "getHandle")
        self._clock = ConnectionClock(opened=now, last_activity=now, tls=tls)
        guard.opened(self)
        self._schedule(now)
        super().makeConnection(transport)

    def handshakeCompleted(self) -> None:
        if self._clock is not None:
            self._clock.handshake_done = True
        if IHandshakeListener.providedBy(self.wrappedProtocol):
            self.wrappedProtocol.handshakeCompleted()

    def dataReceived(self, data: bytes) -> None:
        c = self._clock
        now = self.listener.clock.seconds()
        c.last_activity = now
        self.wrappedProtocol.dataReceived(data)
        progress = self._progress
        if progress is None:
            return
        expected = progress()
        if not expected:
            c.reading_since = None
            return
        had, has = c.buffered, (self.wrappedProtocol.buffered if self._has_buffered else None)
        c.buffered, c.expected = has, expected
        if new_request_began(c.reading_since is not None, had, len(data), has):
            c.reading_since = now
            self._schedule(now)

    def write(self, data: bytes) -> None:
        self._wrote = True  # the hot path: a flag, the time is taken when the timer looks
        self.transport.write(data)

    def writeSequence(self, data: Any) -> None:
        self._wrote = True
        self.transport.writeSequence(data)

    def connectionLost(self, reason: Failure | None = None) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        c = self._clock
        if c is not None and c.tls and not c.handshake_done and self._closed_by_guard is None:
            self._handshake_failed(reason)
        self.listener.closed(self, self.peer_host)
        super().connectionLost(reason)

    # -- timeouts -------------------------------------------------------------------------------------------
    def _schedule(self, now: float) -> None:
        why, at = connection_verdict(now, self._clock, self.listener.limits)
        if why is not None:
            self._close(why)
            return
        if at is None:
            return
        timer = self._timer
        if timer is not None and timer.active():
            if timer.getTime() <= at:
                return
            timer.cancel()
        self._timer = self.listener.clock.callLater(max(0.0, at - now), self._check)

    def _check(self) -> None:
        self._timer = None
        if self.disconnecting or not self.connected:
            return
        now = self.listener.clock.seconds()
        c = self._clock
        if self._wrote:  # bytes went out since the last look: not idle
            self._wrote = False
            c.last_activity = now
        if c.reading_since is not None and self._progress is not None and not self._progress():
            # The request is no longer unfinished from the peer's side: complete, or the protocol stopped
            # reading (back-pressure is our delay, not a slow sender).  Its clock starts again with new bytes.
            c.reading_since = None
            c.last_activity = max(c.last_activity, now)
        self._schedule(now)

    def _close(self, why: str) -> None:
        guard, limits, c = self.listener, self.listener.limits, self._clock
        self._closed_by_guard = why
        guard.stats.closed[why] = guard.stats.closed.get(why, 0) + 1
        if why == "idle":
            log.debug("{listener}: closing connection from {peer}: idle for {s:g}s", listener=guard.name,
                      peer=self.peer_host, s=limits.idle_timeout)
            self.loseConnection()
            return
        if why == "handshake":
            guard.stats.tls_failures += 1
            guard.warn(("handshake timeout", self.peer_host), "TLS handshake from {peer} not done within {s:g}s "
                       "(connectionHandshakeTimeoutMs); closing it", peer=self.peer_host, s=limits.handshake_timeout)
        else:
            guard.warn(("slow", self.peer_host), "closing connection from {peer}: a request of {n} bytes not "
                       "complete {s:.1f}s after its first byte (requestReadTimeoutMs {t:g}s: a slow or stuck "
                       "sender)", peer=self.peer_host, n=c.expected, t=limits.read_timeout,
                       s=self.listener.clock.seconds() - (c.reading_since or c.opened))
        abort = getattr(self.transport, "abortConnection", None)
        if abort is not None:
            abort()
        else:
            self.loseConnection()

    def _handshake_failed(self, reason: Failure | None) -> None:
        """One rate-limited line: who failed the TLS handshake and why (expired, unknown CA, not TLS)."""
        from dledger.security.tls import verify_error_of

        error = ""
        if reason is not None:
            value = reason.value
            args = getattr(value, "args", ())
            if args and isinstance(args[0], list):
                error = "; ".join(str(x[-1]) for x in args[0] if isinstance(x, tuple) and x) or str(value)
            elif not _is_plain_close(value):
                error = str(value)
        code = verify_error_of(self.transport)
        if not error and code is None:
            log.debug("{listener}: {peer} closed the connection before completing a TLS handshake",
                      listener=self.listener.name, peer=self.peer_host)
            return
        self.listener.stats.tls_failures += 1
        self.listener.warn(("tls", self.peer_host, code, error), "TLS handshake from {peer} failed: {why}",
                           peer=self.peer_host, why=tls_failure_reason(code, error))


def _is_plain_close(value: Any) -> bool:
    from twisted.internet.error import ConnectionDone, ConnectionLost

    return isinstance(value, (ConnectionDone, ConnectionLost))


__all__ = ["TLS_AT_PLAIN_PORT", "ConnectionClock", "FdBudget", "GuardedFactory", "GuardedProtocol",
           "ListenerGuard", "ListenerLimits", "connection_verdict", "fd_refusal", "read_deadline",
           "tls_failure_reason", "tls_hello", "warn_peer"]
