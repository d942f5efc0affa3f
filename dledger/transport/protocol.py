"""One RocketMQ-remoting connection as a Twisted protocol, for both directions.

A :class:`RemotingProtocol` matches replies to the requests it sent by ``opaque`` (replies may
arrive in any order, as Java's do), and, when it has an :class:`~dledger.interfaces.IRequestHandler`,
serves the requests it receives concurrently.  Hostile or broken input never escapes
:meth:`~RemotingProtocol.dataReceived`: a request whose header was readable gets an error reply,
anything worse closes the connection, and both leave a log line.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IHandshakeListener, IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger import messages
from dledger.codes import PLUGIN_REQUEST_CODES, ResponseCode
from dledger.errors import DLedgerError, OutcomeUnknown
from dledger.interfaces import IBatchRequestHandler, ILeaderAware, IPluginRequests
from dledger.messages import GetEntriesResponse
from dledger.ratelog import RateLimitedLog
from dledger.security import policy as auth_policy
from dledger.security import secret as auth_secret
from dledger.transport import remoting
from dledger.transport.base import REMARKED, failure_response, refusal_error
from dledger.transport.limits import (
    TLS_AT_PLAIN_PORT,
    BufferBudget,
    ConnectionLimits,
    admission_refusal,
    idle_deadline,
    over_connection_cap,
    tls_hello,
)
from dledger.transport.remoting import (
    REMOTING_SUCCESS,
    BodyError,
    Frame,
    FrameError,
    FrameSplitter,
    Header,
    UnknownRequestCodeError,
)
from dledger.transport.sockopts import set_no_delay

DEFAULT_MAX_IN_FLIGHT = 4096


class BinaryBodyRefused(DLedgerError):
    """The peer answered a binary body (PUSH or APPEND) with a remoting-level error: it is not dledger (e.g. Java)."""

    def __init__(self, message: str):
        super().__init__(ResponseCode.UNSUPPORTED, message)


class _OpaqueCounter:
    """Request ids: one counter per process shared by every connection, as Java's ``RemotingCommand``."""

    def __init__(self) -> None:
        self._count = itertools.count()

    def __call__(self) -> int:
        return next(self._count) & 0x7FFFFFFF


next_opaque = _OpaqueCounter()

_REMOTING_CODES = {
    remoting.REMOTING_REQUEST_CODE_NOT_SUPPORTED: ResponseCode.UNSUPPORTED,
    remoting.REMOTING_SYSTEM_BUSY: ResponseCode.NETWORK_ERROR,
}


@dataclass(slots=True, eq=False)
class _Call:
    """A request sent on this connection and not yet answered."""

    response_cls: type | None  # None: a raw call (the AUTH login), answered with the reply frame
    binary: bool
    deferred: Deferred
    timer: IDelayedCall | None = None


@implementer(IHandshakeListener)
class RemotingProtocol(Protocol):
    """A remoting connection: pipelined requests out, concurrent request handling in.

    ``clock`` schedules request timeouts; ``handler`` (optional) answers incoming requests.
    ``on_lost(protocol, reason)`` and ``on_reply()`` let a connection pool follow the link's health.
    ``guard`` (a :class:`~dledger.security.guard.ServerGuard`, serving side) authenticates the peer and
    authorises every request before the handler sees it; ``credentials`` (a
    :class:`~dledger.security.guard.ClientCredentials`, connecting side) are presented before the first
    request, and :meth:`when_ready` fires once they were accepted (issue #13, docs/security.md).
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, handler: Any = None, *,
                 max_frame_size: int = remoting.DEFAULT_MAX_FRAME_SIZE,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, limits: ConnectionLimits | None = None,
                 budget: BufferBudget | None = None, warnings: RateLimitedLog | None = None,
                 guard: Any = None, credentials: Any = None, expected_peer: str | None = None):
        self.clock = clock
        self.guard = guard
        self.credentials = credentials
        #: The member this outgoing connection means to reach (its certificate must name it).
        self.expected_peer = expected_peer
        #: Who the peer proved to be (serving side; set on its first request).
        self.identity: auth_policy.Identity | None = None
        self._session: bytes | None = None  # secret mode: the connection's HMAC key
        self._send_seq = 0
        self._recv_seq = 0
        self._ready_waiters: list[Deferred] = []  # connecting side with credentials: fired once they were accepted
        self._ready_result: Any = None
        self._ready_done = credentials is None
        self.limits = limits
        self.budget = budget
        #: Rate-limited warnings, shared by a port's connections (one noisy host does not flood the log).
        self.warnings = warnings if warnings is not None else RateLimitedLog(self.log, clock)
        self._idle_timer: IDelayedCall | None = None
        self._last_frame = 0.0
        self._budget_paused = False
        self.handler = handler
        self.max_frame_size = max_frame_size
        self.max_in_flight = max_in_flight
        self.on_lost: Callable[[RemotingProtocol, Failure], None] | None = None
        self.on_reply: Callable[[], None] | None = None
        self.lost = False
        self._lost_waiters: list[Deferred] = []
        self._splitter = FrameSplitter(max_frame_size)
        self._calls: dict[int, _Call] = {}
        self._closing = False
        self._in_flight = 0
        self._paused = False
        self._batch_handler = IBatchRequestHandler.providedBy(handler)

    # -- connection ----------------------------------------------------------------
    @property
    def peer(self) -> str:
        """The remote address, for log lines."""
        try:
            addr = self.transport.getPeer()
        except Exception:
            return "?"
        host, port = getattr(addr, "host", None), getattr(addr, "port", None)
        return f"{host}:{port}" if host is not None else str(addr)

    @property
    def is_open(self) -> bool:
        return self.connected and not self._closing

    @property
    def pending(self) -> int:
        """Requests sent on this connection and not answered yet."""
        return len(self._calls)

    @property
    def buffered(self) -> int:
        """Bytes received of a frame not complete yet (what the connection budget counts)."""
        return self._splitter.buffered

    def unfinished_request(self) -> int:
        """Bytes the frame now arriving will have, 0 if none is unfinished (a listener's read timeout).

        0 as well while this connection does not read (``pauseProducing`` for back-pressure): the wait is ours.
        """
        if self._budget_paused or self._paused:
            return 0
        return self._splitter.unfinished

    def connectionMade(self) -> None:
        set_no_delay(self.transport)
        if self.limits is not None and self.limits.idle_timeout > 0:
            self._last_frame = self.clock.seconds()
            self._idle_timer = self.clock.callLater(self.limits.idle_timeout, self._idle_check)
        if self.credentials is not None and self.credentials.tls_options is None:
            self._present_credentials()  # else after the TLS handshake (handshakeCompleted)

    # -- authentication (issue #13) ---------------------------------------------------------
    def handshakeCompleted(self) -> None:
        """TLS is up: the connecting side checks the server's certificate, then logs in (secret mode)."""
        if self.credentials is None or self._ready_done:
            return
        from dledger.security import tls

        why = self.credentials.check_server(tls.subject_of(self.transport), self.expected_peer)
        if why is not None:
            self._not_ready(f"refusing to talk to {self.peer}: {why}")
            return
        self._present_credentials()

    def _present_credentials(self) -> None:
        creds = self.credentials
        if creds.secret is None:
            self._set_ready()
            return
        body, nonce = creds.hello()
        opaque = next_opaque()
        call = _Call(None, False, Deferred())
        call.timer = self.clock.callLater(creds.handshake_timeout, self._timed_out, opaque, creds.handshake_timeout)
        self._calls[opaque] = call
        self.transport.write(remoting.encode_frame(Header(auth_secret.AUTH_CODE, opaque, 0), body))

        def welcomed(frame: Frame) -> None:
            if self._ready_done:
                return
            try:
                code, server_nonce, proof = auth_secret.parse_welcome(frame.body)
            except auth_secret.AuthError as exc:
                self._not_ready(f"login to {self.peer} failed: {exc}")
                return
            if code != 200:
                self._not_ready(f"{self.peer} refused the login of {creds.kind} {creds.name!r}: "
                                f"{frame.header.remark or ResponseCode.of(code).name}")
                return
            key = creds.session(nonce, server_nonce)
            if not auth_secret.macs_equal(auth_secret.server_proof(key), proof):
                self._not_ready(f"{self.peer} does not know our secret (wrong proof); refusing to talk to it")
                return
            self._session = key
            self._set_ready()

        def failed(f: Failure) -> None:
            self._not_ready(f"login to {self.peer} failed: {f.getErrorMessage()}")

        call.deferred.addCallbacks(welcomed, failed)

    def _set_ready(self) -> None:
        self._ready_done = True
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(None)

    def _not_ready(self, message: str) -> None:
        if self._ready_done:
            return
        self._ready_done = True
        self._ready_result = DLedgerError(ResponseCode.NETWORK_ERROR, message)
        self._abandon(abort=True)
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(self._ready_result)

    def when_ready(self) -> Deferred:
        """Fires once the peer accepted our credentials (at once without any); DLedgerError if it did not."""
        if self._ready_done:
            return fail(self._ready_result) if self._ready_result is not None else succeed(None)
        d: Deferred = Deferred()
        self._ready_waiters.append(d)
        return d

    def _warn(self, key: Any, fmt: str, **kw: Any) -> None:
        """A warning, at most one per ``key`` per interval (hostile input repeats; the log must not)."""
        self.warnings.warn(key, fmt, **kw)

    @property
    def peer_host(self) -> str:
        """The remote host (the rate-limiting key: one noisy host does not mute another)."""
        try:
            return str(getattr(self.transport.getPeer(), "host", "?"))
        except Exception:
            return "?"

    # -- limits (serving connections only) -------------------------------------------------
    def _idle_check(self) -> None:
        self._idle_timer = None
        if self._closing:
            return
        now = self.clock.seconds()
        deadline = idle_deadline(self._last_frame, self._in_flight, now, self.limits.idle_timeout)
        if deadline is not None:
            self._idle_timer = self.clock.callLater(max(0.0, deadline - now), self._idle_check)
            return
        buffered = self._splitter.buffered
        if buffered:
            self._warn(("unfinished frame", self.peer_host), "closing connection from {peer}: no complete frame "
                       "for {s:g}s with {n} bytes of an unfinished frame buffered (connectionIdleTimeoutMs)",
                       peer=self.peer, s=self.limits.idle_timeout, n=buffered)
            self._abandon(abort=True)
        else:
            self.log.debug("closing connection from {peer}: idle for {s:g}s (connectionIdleTimeoutMs)",
                           peer=self.peer, s=self.limits.idle_timeout)
            self._abandon()

    def _account(self) -> None:
        """After a read: close a connection over its buffer cap; stop reading while the port is over its total."""
        buffered = self._splitter.buffered
        refusal = over_connection_cap(buffered, self.limits)
        if refusal is not None:
            self._warn(("over cap", self.peer_host), "closing connection from {peer}: {why}", peer=self.peer,
                       why=refusal)
            self._abandon(abort=True)
            return
        if self.budget is not None and self.budget.update(self, buffered) and not self._budget_paused:
            self._budget_paused = True
            self._warn(("budget", self.peer_host), "pausing reads from {peer}: {total} bytes of unfinished "
                       "frames buffered on this port (maxBufferedBytesTotal {cap})", peer=self.peer,
                       total=self.budget.total, cap=self.limits.max_buffered_total)
            self.transport.pauseProducing()

    def budget_resumed(self) -> None:
        """The port's buffered total fell: read again (unless too many requests are still being served)."""
        self._budget_paused = False
        if self.is_open and not self._paused:
            self.transport.resumeProducing()

    def when_lost(self) -> Deferred:
        """A Deferred that fires (with None) once the connection is closed."""
        d: Deferred = Deferred()
        if self.lost:
            d.callback(None)
        else:
            self._lost_waiters.append(d)
        return d

    def close(self) -> Deferred:
        """Close the connection (after flushing queued writes); fires when it is closed."""
        if not self.connected and not self.lost:
            return succeed(None)
        if self.connected and not self._closing:
            self._closing = True
            self.transport.loseConnection()
        return self.when_lost()

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[override]
        self._closing = True
        self.connected = False
        if self._idle_timer is not None and self._idle_timer.active():
            self._idle_timer.cancel()
        self._idle_timer = None
        if self.budget is not None:
            self.budget.forget(self)
        if not self._ready_done:
            self._not_ready(f"connection to {self.peer} lost before it was ready: "
                            f"{reason.getErrorMessage() if reason else 'closed'}")
        if self.on_lost is not None:
            self.on_lost(self, reason)
        self.fail_pending(f"connection to {self.peer} lost: {reason.getErrorMessage() if reason else 'closed'}")
        self.lost = True
        waiters, self._lost_waiters = self._lost_waiters, []
        for d in waiters:
            d.callback(None)

    def fail_pending(self, message: str) -> None:
        """Fail every request waiting for a reply here with OutcomeUnknown: each went out, the peer may have run it."""
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if call.timer is not None and call.timer.active():
                call.timer.cancel()
            call.deferred.errback(OutcomeUnknown(ResponseCode.NETWORK_ERROR,
                                                 f"{message} (the request was sent: its outcome unknown)"))

    # -- bytes in ------------------------------------------------------------------
    def dataReceived(self, data: bytes) -> None:
        """Decode every frame of ``data``; the requests among them are then served together (see :meth:`_serve`)."""
        if self._closing:
            return
        requests: list[tuple[Header, Any]] = []
        framed = False
        try:
            for frame in self._splitter.feed(data):
                framed = True
                if frame.header.is_response:
                    self._reply_received(frame)
                else:
                    self._request_decoded(frame, requests)
                if self._closing:
                    break
        except FrameError as exc:
            why = TLS_AT_PLAIN_PORT if not framed and tls_hello(data) else exc
            self._warn(("bad frame", self.peer_host), "closing connection from {peer}: {error}", peer=self.peer,
                       error=why)
            self._abandon()
        except Exception:
            self.log.failure("closing connection from {peer}: unexpected error while reading", peer=self.peer)
            self._abandon()
        if self.limits is not None and not self._closing:
            if framed:
                self._last_frame = self.clock.seconds()
            self._account()
        if requests:  # those before a broken frame are served as they would have been one by one
            self._serve(requests)

    def _abandon(self, abort: bool = False) -> None:
        """Close: flushing what we wrote, or (``abort``, for a hostile peer) at once without waiting for it."""
        if not self._closing:
            self._closing = True
            if abort and hasattr(self.transport, "abortConnection"):
                self.transport.abortConnection()
            else:
                self.transport.loseConnection()

    # -- client side ----------------------------------------------------------------
    def send_request(self, request: messages.RequestOrResponse, timeout: float, *,
                     binary: bool = False) -> Deferred:
        """Send ``request``; Deferred of the response object, DLedgerError(TIMEOUT/NETWORK_ERROR) otherwise."""
        if not self.is_open:
            return fail(DLedgerError(ResponseCode.NETWORK_ERROR, f"connection to {self.peer} is closed"))
        opaque = next_opaque()
        try:
            data = remoting.encode_request(request, opaque, binary=binary)
            response_cls = messages.RESPONSE_TYPES[type(request)]
        except (TypeError, ValueError, KeyError, OverflowError, struct.error) as exc:
            return fail(DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"cannot encode request: {exc}"))
        if len(data) > self.max_frame_size:
            return fail(DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                                     f"request frame of {len(data)} bytes exceeds maxFrameSize {self.max_frame_size}"))
        if self._session is not None:
            from dledger.security.guard import sign_request

            data = sign_request(data, self._session, self._send_seq, self.max_frame_size)
            self._send_seq += 1
        call = _Call(response_cls, binary, Deferred(lambda _d: self._forget(opaque)))
        call.timer = self.clock.callLater(timeout, self._timed_out, opaque, timeout)
        self._calls[opaque] = call
        self.transport.write(data)
        return call.deferred

    def _forget(self, opaque: int) -> None:
        call = self._calls.pop(opaque, None)
        if call is not None and call.timer is not None and call.timer.active():
            call.timer.cancel()

    def _timed_out(self, opaque: int, timeout: float) -> None:
        call = self._calls.pop(opaque, None)
        if call is not None:
            call.deferred.errback(DLedgerError(
                ResponseCode.TIMEOUT, f"no reply from {self.peer} to request {opaque} within {timeout:g}s"))

    def _reply_received(self, frame: Frame) -> None:
        header = frame.header
        call = self._calls.pop(header.opaque, None)
        if call is None:
            self.log.debug("dropping reply {opaque} from {peer}: no request waits for it (timed out?)",
                           opaque=header.opaque, peer=self.peer)
            return
        if call.timer is not None and call.timer.active():
            call.timer.cancel()
        if call.response_cls is None:  # the login's reply (read before any session exists)
            call.deferred.callback(frame)
            return
        if self._session is not None:
            from dledger.security.guard import reply_authentic

            if not reply_authentic(frame, self._session):
                self._warn(("bad reply mac", self.peer_host), "reply {opaque} from {peer} does not authenticate "
                           "(wrong or missing MAC); closing the connection", opaque=header.opaque, peer=self.peer)
                call.deferred.errback(OutcomeUnknown(ResponseCode.NETWORK_ERROR,
                                                     f"reply from {self.peer} does not authenticate"))
                self._abandon(abort=True)
                return
        if self.on_reply is not None:
            self.on_reply()
        if header.code != REMOTING_SUCCESS:
            text = f"{self.peer} answered remoting code {header.code}: {header.remark or 'no remark'}"
            if call.binary:
                call.deferred.errback(BinaryBodyRefused(f"{text} (it cannot read binary bodies)"))
            else:
                code = _REMOTING_CODES.get(header.code, ResponseCode.INTERNAL_ERROR)
                call.deferred.errback(DLedgerError(code, text))
            return
        try:
            response = remoting.decode_response(frame, call.response_cls)
        except BodyError as exc:
            self._warn(("bad reply", self.peer_host), "undecodable reply {opaque} from {peer}: {error}",
                       opaque=header.opaque, peer=self.peer, error=exc)
            call.deferred.errback(OutcomeUnknown(ResponseCode.NETWORK_ERROR, f"undecodable reply: {exc}"))
            return
        if response.code == ResponseCode.APPEND_REFUSED:
            # A plugin refused the append: the caller gets its reason (the remark), not only the code.
            call.deferred.errback(refusal_error(response, header.remark))
            return
        call.deferred.callback(response)

    # -- server side ----------------------------------------------------------------
    def _request_decoded(self, frame: Frame, requests: list[tuple[Header, Any]]) -> None:
        """Decode a request frame into ``requests``, or answer at once the one that cannot be decoded."""
        header = frame.header
        guard = self.guard
        if guard is not None and not self._admitted(frame):
            return
        try:
            request = remoting.decode_request(frame)
        except UnknownRequestCodeError as exc:
            self._warn(("unsupported", self.peer_host), "request from {peer}: {error}; answering UNSUPPORTED",
                       peer=self.peer, error=exc)
            self._write_reply(header, remoting.error_body(header, ResponseCode.UNSUPPORTED), str(exc))
            return
        except BodyError as exc:
            self._warn(("bad request", self.peer_host), "request {code} from {peer}: {error}; answering "
                       "UNEXPECTED_ARGUMENT", code=header.code, peer=self.peer, error=exc)
            self._write_reply(header, remoting.error_body(header, ResponseCode.UNEXPECTED_ARGUMENT), str(exc)[:500])
            return
        if self.handler is None:
            self._write_reply(header, remoting.error_body(header, ResponseCode.UNSUPPORTED),
                              "this connection does not serve requests")
            return
        if guard is not None:
            leader = self.handler.current_leader() if ILeaderAware.providedBy(self.handler) else None
            decision = auth_policy.decide_request(guard.auth_mode, header.code, self.identity,
                                                  auth_policy.request_ids(header.code, request), leader,
                                                  self._plugin_role(header.code))
            if not decision.allowed:
                self._refuse(header, decision.reason)
                return
        requests.append((header, request))

    def _admitted(self, frame: Frame) -> bool:
        """The one authorisation check (before decoding): log-in, frame MAC, the code's permission.

        False if the request was answered here (refused, redacted, or the AUTH login itself).
        """
        header, guard = frame.header, self.guard
        if header.code == auth_secret.AUTH_CODE:
            self._login(frame)
            return False
        if self._session is not None:
            from dledger.security.guard import request_authentic

            seq, self._recv_seq = self._recv_seq, self._recv_seq + 1
            if not request_authentic(frame, self._session, seq):
                self._refuse(header, f"request {header.opaque} (code {header.code}) does not authenticate (wrong "
                                     "or missing MAC, replayed or reordered); closing the connection")
                self._abandon()
                return False
        if self.identity is None:
            if guard.auth_mode == "tls":
                self.identity = guard.identify_tls(self.transport, self.peer_host)
            else:
                self.identity = guard.anonymous()
        decision = guard.decide(header.code, self.identity, self._plugin_role(header.code))
        if decision.verdict is auth_policy.Verdict.ALLOW:
            return True
        if decision.verdict is auth_policy.Verdict.REDACT:
            reply = messages.MetadataResponse(group=guard.group)
            self._write_reply(header, remoting.encode_body(reply))
            return False
        self._refuse(header, decision.reason)
        return False

    def _plugin_role(self, code: int) -> str | None:
        """The role a plugin's request ``code`` needs on this member (None: a core code, or no plugin serves it)."""
        if code in PLUGIN_REQUEST_CODES and IPluginRequests.providedBy(self.handler):
            return self.handler.plugin_role(code)
        return None

    def _refuse(self, header: Header, reason: str) -> None:
        """Answer NOT_AUTHORIZED with the reason, and log it (rate-limited per address and code)."""
        self.guard.refused(self.peer_host, header.code, reason)
        self._write_reply(header, remoting.error_body(header, ResponseCode.NOT_AUTHORIZED), reason[:500])

    def _login(self, frame: Frame) -> None:
        """Serve an AUTH request (secret mode): on success the connection has an identity and a session key."""
        header, guard = frame.header, self.guard
        if guard.auth_mode != "secret" or self._session is not None:
            why = "this member does not use authMode=secret" if guard.auth_mode != "secret" else "already logged in"
            self._write_reply(header, auth_secret.refusal_body(int(ResponseCode.UNSUPPORTED)), why)
            return
        try:
            identity, key, body = guard.login(frame.body)
        except auth_secret.AuthError as exc:
            guard.refused(self.peer_host, header.code, f"login refused: {exc}")
            self._write_reply(header, auth_secret.refusal_body(int(ResponseCode.NOT_AUTHORIZED)), str(exc)[:500])
            return
        self._write_reply(header, body)  # unsigned: the client has no key before reading it
        self.identity = identity
        self._session = key

    def _serve(self, requests: list[tuple[Header, Any]]) -> None:
        """Hand requests to the handler, all at once if it is an IBatchRequestHandler, and reply to each."""
        n = len(requests)
        self._in_flight += n
        if self._in_flight >= self.max_in_flight and not self._paused:
            self._paused = True
            self.transport.pauseProducing()
        handler = self.handler
        if n > 1 and self._batch_handler:
            try:
                results = handler.handle_requests([request for _, request in requests])
            except Exception:
                results = [Failure()] * n
        else:
            results = []
            for _, request in requests:
                try:
                    results.append(handler.handle_request(request))
                except Exception:
                    results.append(Failure())
        for (header, request), result in zip(requests, results):
            if isinstance(result, Deferred):
                result.addBoth(self._respond, header, request)
            else:
                self._respond(result, header, request)

    def _respond(self, result: Any, header: Header, request: Any) -> None:
        """Write the reply to ``request`` (a failure becomes its error reply, as :func:`base.answer` does)."""
        remark = None
        try:
            if isinstance(result, Failure):
                exc = result.value
                if isinstance(exc, DLedgerError) and exc.code in REMARKED and exc.message:
                    # A refused argument or a plugin's refusal says why, for the peer's operator or the client
                    # (other replies stay byte-identical to Java's, which sends no remark).
                    remark = exc.message[:500]
                result = failure_response(request, result)
            # Only a successful GET gets the binary body it asked for; refusals stay Java's JSON error reply.
            binary = (type(result) is GetEntriesResponse and result.code == ResponseCode.SUCCESS
                      and header.reply_encoding == remoting.BODY_BINARY)
            body = remoting.encode_get_reply_binary(result) if binary else remoting.encode_body(result)
        except Exception:
            self.log.failure("cannot encode the reply to request {code} from {peer}; answering INTERNAL_ERROR",
                             code=header.code, peer=self.peer)
            body = remoting.error_body(header, ResponseCode.INTERNAL_ERROR)
            binary = False
        self._write_reply(header, body, remark, binary=binary)
        self._request_done(None)

    def _request_done(self, _: Any) -> None:
        self._in_flight -= 1
        if self._paused and self._in_flight <= self.max_in_flight // 2:
            self._paused = False
            if self.is_open and not self._budget_paused:
                self.transport.resumeProducing()

    def _write_reply(self, header: Header, body: bytes, remark: str | None = None, *, binary: bool = False) -> None:
        if header.is_oneway:
            return
        if not self.is_open:
            self.log.debug("connection from {peer} closed; dropping reply {opaque}", peer=self.peer,
                           opaque=header.opaque)
            return
        if self._session is not None:
            from dledger.security.guard import sign_reply

            self.transport.write(sign_reply(header.opaque, body, remark, self._session, binary=binary))
            return
        self.transport.write(remoting.encode_reply(header.opaque, body, remark, binary=binary))


class RemotingServerFactory(Factory):
    """Builds serving protocols for a listening port and remembers the live ones (to close them on stop).

    With ``limits`` it refuses connections beyond ``maxConnections`` / ``maxConnectionsPerAddress`` (closed as
    soon as accepted, one rate-limited line per address) and gives every connection the idle timeout and the
    per-connection and port-wide buffer caps (:mod:`dledger.transport.limits`).
    """

    noisy = False  # no "Starting factory <... object at 0x...>" line per listen

    def __init__(self, clock: IReactorTime, handler: Any, *, max_frame_size: int = remoting.DEFAULT_MAX_FRAME_SIZE,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT, limits: ConnectionLimits | None = None,
                 guard: Any = None, admission: bool = True):
        self.clock = clock
        #: Refuse connections beyond the limits here (False: a ListenerGuard around this factory does it).
        self.admission = admission
        self.handler = handler
        #: Authentication and authorisation of this port (:class:`dledger.security.guard.ServerGuard`; None: off).
        self.guard = guard if guard is not None and guard.enforcing else None
        self.max_frame_size = max_frame_size
        self.max_in_flight = max_in_flight
        self.limits = limits
        self.budget = BufferBudget(limits) if limits is not None else None
        self.warnings = RateLimitedLog(RemotingProtocol.log, clock)
        self.connections: set[RemotingProtocol] = set()
        self.per_address: dict[str, int] = {}
        self.refused = 0

    def buildProtocol(self, addr: Any) -> RemotingProtocol | None:
        host = str(getattr(addr, "host", addr))
        if self.limits is not None and self.admission:
            refusal = admission_refusal(len(self.connections), self.per_address.get(host, 0), self.limits)
            if refusal is not None:
                self.refused += 1
                self.warnings.warn(("refused", host), "refusing a connection from {host}: {why}", host=host,
                                   why=refusal)
                return None  # Twisted closes the accepted socket
        proto = RemotingProtocol(self.clock, self.handler, max_frame_size=self.max_frame_size,
                                 max_in_flight=self.max_in_flight, limits=self.limits, budget=self.budget,
                                 warnings=self.warnings, guard=self.guard)
        proto.factory = self
        self.connections.add(proto)
        self.per_address[host] = self.per_address.get(host, 0) + 1

        def gone(_):
            self.connections.discard(proto)
            left = self.per_address.get(host, 1) - 1
            if left > 0:
                self.per_address[host] = left
            else:
                self.per_address.pop(host, None)

        proto.when_lost().addCallback(gone)
        return proto
