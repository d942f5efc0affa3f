"""The framing half of a remoting connection: bytes in as frames, the connection's limits and its lifetime.

:class:`FramedConnection` splits what arrives into remoting frames, enforces a serving port's limits
(idle timeout, per-connection and port-wide buffer caps: :mod:`dledger.transport.limits`), closes the
connection on a broken frame with one rate-limited line, and tells its waiters when the connection is gone.
What a frame *means* is the subclass's business (:class:`~dledger.transport.protocol.RemotingProtocol`:
replies to its calls, requests to its handler): kept apart so the byte handling, which hostile peers
probe, reads on its own (issue #26 item 3).
"""

from __future__ import annotations

from typing import Any

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.ratelog import RateLimitedLog
from dledger.transport.limits import (
    TLS_AT_PLAIN_PORT,
    BufferBudget,
    ConnectionLimits,
    idle_deadline,
    over_connection_cap,
    tls_hello,
)
from dledger.transport.outbox import send_written, sendable_connection
from dledger.transport.remoting import Frame, FrameError, FrameSplitter, Header
from dledger.transport.sockopts import set_no_delay, set_read_size


class FramedConnection(Protocol):
    """Frames in, limits kept, one close path; subclasses say what a frame means.

    A subclass implements :meth:`_reply_received` (a response frame), :meth:`_request_decoded` (a request
    frame: append ``(header, request)`` to the read's list, or answer it at once), :meth:`_serve` (the read's
    requests, together) and may extend :meth:`connectionLost`.  ``_in_flight`` and ``_paused`` are the
    subclass's count of requests being served and its back-pressure flag (the idle timer and the read timeout
    respect both).
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, *, max_frame_size: int, limits: ConnectionLimits | None = None,
                 budget: BufferBudget | None = None, warnings: RateLimitedLog | None = None):
        self.clock = clock
        self.limits = limits
        self.budget = budget
        #: Rate-limited warnings, shared by a port's connections (one noisy host does not flood the log).
        self.warnings = warnings if warnings is not None else RateLimitedLog(self.log, clock)
        self.max_frame_size = max_frame_size
        self.lost = False
        self._idle_timer: IDelayedCall | None = None
        self._last_frame = 0.0
        self._budget_paused = False
        self._lost_waiters: list[Deferred] = []
        self._splitter = FrameSplitter(max_frame_size)
        self._closing = False
        self._in_flight = 0
        self._paused = False
        #: The plain TCP connection under the transport, whose writes are sent at the end of the work that
        #: wrote them (:mod:`dledger.transport.outbox`); None for TLS and anything else (Twisted's own path).
        self._sendable = None

    # -- what the subclass says a frame means -----------------------------------------------
    def _reply_received(self, frame: Frame) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _request_decoded(self, frame: Frame, requests: list[tuple[Header, Any]]) -> None:  # pragma: no cover
        raise NotImplementedError

    def _serve(self, requests: list[tuple[Header, Any]]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

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
    def peer_host(self) -> str:
        """The remote host (the rate-limiting key: one noisy host does not mute another)."""
        try:
            return str(getattr(self.transport.getPeer(), "host", "?"))
        except Exception:
            return "?"

    @property
    def is_open(self) -> bool:
        return self.connected and not self._closing

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
        set_read_size(self.transport)
        self._sendable = sendable_connection(self.transport)
        if self.limits is not None and self.limits.idle_timeout > 0:
            self._last_frame = self.clock.seconds()
            self._idle_timer = self.clock.callLater(self.limits.idle_timeout, self._idle_check)

    def _warn(self, key: Any, fmt: str, **kw: Any) -> None:
        """A warning, at most one per ``key`` per interval (hostile input repeats; the log must not)."""
        self.warnings.warn(key, fmt, **kw)

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

    # -- closing -----------------------------------------------------------------------
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

    def _connection_closed(self) -> None:
        """The first step of :meth:`connectionLost`: no more reads, timers or budget share."""
        self._closing = True
        self.connected = False
        if self._idle_timer is not None and self._idle_timer.active():
            self._idle_timer.cancel()
        self._idle_timer = None
        if self.budget is not None:
            self.budget.forget(self)

    def _fire_lost(self) -> None:
        """The last step of :meth:`connectionLost`: wake whoever waits for the close."""
        self.lost = True
        waiters, self._lost_waiters = self._lost_waiters, []
        for d in waiters:
            d.callback(None)

    def connectionLost(self, reason: Failure = None) -> None:  # type: ignore[override]
        self._connection_closed()
        self._fire_lost()

    def _abandon(self, abort: bool = False) -> None:
        """Close: flushing what we wrote, or (``abort``, for a hostile peer) at once without waiting for it."""
        if not self._closing:
            self._closing = True
            if abort and hasattr(self.transport, "abortConnection"):
                self.transport.abortConnection()
            else:
                self.transport.loseConnection()

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
        # What handling this read wrote (its replies, the answers of a commit a follower's reply made, the
        # calls a reply's callbacks made) leaves now, not after the reactor's next poll and the reads it finds.
        send_written()
