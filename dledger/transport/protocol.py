"""One RocketMQ-remoting connection as a Twisted protocol, for both directions.

A :class:`RemotingProtocol` matches replies to the requests it sent by ``opaque`` (replies may
arrive in any order, as Java's do), and, when it has an :class:`~dledger.interfaces.IRequestHandler`,
serves the requests it receives concurrently.  Hostile or broken input never escapes
:meth:`~RemotingProtocol.dataReceived`: a request whose header was readable gets an error reply,
anything worse closes the connection, and both leave a log line.

The connection is three classes, one concern each: framing, limits and lifetime in
:mod:`dledger.transport.framing`, authentication and authorisation in :mod:`dledger.transport.admission`,
and here the dispatch of replies to calls and of requests to the handler.
"""

from __future__ import annotations

import itertools
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.interfaces import IDelayedCall, IHandshakeListener, IReactorTime
from twisted.internet.protocol import Factory
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger import messages
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError, OutcomeUnknown
from dledger.interfaces import ANSWER_LATER, IAnsweringRequestHandler, IBatchRequestHandler
from dledger.messages import GetEntriesResponse
from dledger.ratelog import RateLimitedLog
from dledger.security import policy as auth_policy
from dledger.transport import remoting
from dledger.transport.admission import ConnectionAuth
from dledger.transport.base import REMARKED, failure_response, refusal_error
from dledger.transport.framing import FramedConnection
from dledger.transport.limits import BufferBudget, ConnectionLimits, admission_refusal
from dledger.transport.outbox import wrote
from dledger.transport.remoting import (
    REMOTING_SUCCESS,
    BodyError,
    Frame,
    Header,
    UnknownRequestCodeError,
)

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
class RemotingProtocol(FramedConnection):
    """A remoting connection: pipelined requests out, concurrent request handling in (the dispatch).

    Three parts, each its own class (issue #26 item 3): the framing, limits and lifetime of the connection
    (:class:`~dledger.transport.framing.FramedConnection`, the base), its security
    (:class:`~dledger.transport.admission.ConnectionAuth`, ``self.auth``), and here the dispatch: replies
    matched to the calls sent, requests decoded, handed to the handler and answered.

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
        super().__init__(clock, max_frame_size=max_frame_size, limits=limits, budget=budget, warnings=warnings)
        self.guard = guard
        self.credentials = credentials
        #: The member this outgoing connection means to reach (its certificate must name it).
        self.expected_peer = expected_peer
        #: The connection's security (None: no guard and no credentials, nothing to check or present).
        self.auth: ConnectionAuth | None = (ConnectionAuth(self, guard, credentials)
                                            if guard is not None or credentials is not None else None)
        self.handler = handler
        self.max_in_flight = max_in_flight
        self.on_lost: Callable[[RemotingProtocol, Failure], None] | None = None
        self.on_reply: Callable[[], None] | None = None
        self._calls: dict[int, _Call] = {}
        self._batch_handler = IBatchRequestHandler.providedBy(handler)
        #: The handler answers waiting requests by calling :meth:`_answer` (no Deferred each).
        self._answering = IAnsweringRequestHandler.providedBy(handler)
        #: id(header) -> header of requests answered with the handler's exception: their later answer is dropped.
        self._answered_early: dict[int, Header] = {}

    @property
    def identity(self) -> auth_policy.Identity | None:
        """Who the peer proved to be (serving side; set on its first request)."""
        return self.auth.identity if self.auth is not None else None

    @property
    def pending(self) -> int:
        """Requests sent on this connection and not answered yet."""
        return len(self._calls)

    # -- connection ----------------------------------------------------------------
    def connectionMade(self) -> None:
        super().connectionMade()
        if self.auth is not None:
            self.auth.connection_made()

    def handshakeCompleted(self) -> None:
        """TLS is up: the connecting side checks the server's certificate, then logs in (secret mode)."""
        if self.auth is not None:
            self.auth.handshake_completed()

    def when_ready(self) -> Deferred:
        """Fires once the peer accepted our credentials (at once without any); DLedgerError if it did not."""
        return self.auth.when_ready() if self.auth is not None else succeed(None)

    @property
    def ready_error(self) -> DLedgerError | None:
        """Why the peer did not accept our credentials (None: it did, it has not answered yet, or none needed)."""
        return self.auth.ready_error if self.auth is not None else None

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[override]
        self._connection_closed()
        if self.auth is not None and not self.auth.ready_done:
            self.auth.not_ready(f"connection to {self.peer} lost before it was ready: "
                                f"{reason.getErrorMessage() if reason else 'closed'}")
        if self.on_lost is not None:
            self.on_lost(self, reason)
        self.fail_pending(f"connection to {self.peer} lost: {reason.getErrorMessage() if reason else 'closed'}")
        self._fire_lost()

    def fail_pending(self, message: str) -> None:
        """Fail every request waiting for a reply here with OutcomeUnknown: each went out, the peer may have run it."""
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if call.timer is not None and call.timer.active():
                call.timer.cancel()
            call.deferred.errback(OutcomeUnknown(ResponseCode.NETWORK_ERROR,
                                                 f"{message} (the request was sent: its outcome unknown)"))

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
        auth = self.auth
        if auth is not None and auth.session is not None:
            data = auth.sign_request(data, self.max_frame_size)
        call = _Call(response_cls, binary, Deferred(lambda _d: self._forget(opaque)))
        call.timer = self.clock.callLater(timeout, self._timed_out, opaque, timeout)
        self._calls[opaque] = call
        self.transport.write(data)
        wrote(self._sendable)
        return call.deferred

    def raw_call(self, code: int, body: bytes, timeout: float) -> Deferred:
        """Send a request of ``code`` with ``body`` as is (the AUTH login); Deferred of the reply frame."""
        opaque = next_opaque()
        call = _Call(None, False, Deferred())
        call.timer = self.clock.callLater(timeout, self._timed_out, opaque, timeout)
        self._calls[opaque] = call
        self.transport.write(remoting.encode_frame(Header(code, opaque, 0), body))
        wrote(self._sendable)
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
        auth = self.auth
        if auth is not None and auth.session is not None:
            if not auth.reply_authentic(frame):
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
        if guard is not None and not self.auth.admitted(frame):
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
        if guard is not None and not self.auth.authorised(header, request):
            return
        requests.append((header, request))

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
                if self._answering:
                    results = handler.handle_requests_answering([request for _, request in requests], self._answer,
                                                                [header for header, _ in requests])
                else:
                    results = handler.handle_requests([request for _, request in requests])
            except Exception:
                results = [Failure()] * n
                if self._answering:  # some may be parked already: each request gets one reply, this one
                    self._answered_early.update((id(header), header) for header, _ in requests)
        else:
            results = []
            for _, request in requests:
                try:
                    results.append(handler.handle_request(request))
                except Exception:
                    results.append(Failure())
        for (header, request), result in zip(requests, results):
            if result is ANSWER_LATER:
                continue
            if isinstance(result, Deferred):
                result.addBoth(self._respond, header, request)
            else:
                self._respond(result, header, request)

    def _answer(self, header: Header, response: Any) -> None:
        """The handler's answer to a request it gave :data:`ANSWER_LATER` for (a response, never a Failure)."""
        if self._answered_early and self._answered_early.pop(id(header), None) is header:
            return
        self._respond(response, header, None)

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
        auth = self.auth
        if auth is not None and auth.session is not None:
            self.transport.write(auth.sign_reply(header.opaque, body, remark, binary))
            wrote(self._sendable)
            return
        self.transport.write(remoting.encode_reply(header.opaque, body, remark, binary=binary))
        wrote(self._sendable)


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
