"""Resource limits of a member's listening port: connections, idle time, buffered bytes, file descriptors.

Why (issue #9, item 14): 20 connections each announcing a 16 MiB frame and sending 15 MiB took a
member from 39 to 345 MiB; 500 idle connections were held forever; under ``ulimit -n 128`` 200
idle connections made every push fail with EMFILE and a traceback each.  Before authentication
exists, anyone who can reach the port can do this, so the port bounds what a connection may cost:

* at most ``maxConnections`` incoming connections, ``maxConnectionsPerAddress`` from one host;
  more are closed as soon as they are accepted (one rate-limited line per address);
* a connection that has not completed a frame for ``connectionIdleTimeoutMs`` (and has no request
  being served) is closed -- as Java's remoting server closes channels idle for 120 s;
* at most ``maxBufferedBytesPerConnection`` bytes of unfinished frames per connection (closed
  beyond that) and ``maxBufferedBytesTotal`` across all of them: over the total, a connection that
  holds a large unfinished frame stops reading (``pauseProducing``) until the total falls again.
  Small unfinished frames (heartbeats, votes, ordinary pushes, at most ``SMALL_FRAME`` bytes) keep
  flowing, so a flood of large frames cannot starve the group's own traffic;
* ``accept`` failing with EMFILE (out of file descriptors) pauses accepting for a moment with one
  rate-limited line, instead of a line per attempt; existing connections keep working.

The decisions are the pure functions below; :mod:`dledger.transport.protocol` applies them.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass, replace
from typing import Any

from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger.timing import due

MiB = 1024 * 1024
#: An unfinished frame up to this size keeps reading even when the total buffer cap is exceeded.
SMALL_FRAME = 1 * MiB
#: Reading resumes once the total falls to this fraction of the cap (hysteresis: no pause/resume flapping).
RESUME_FRACTION = 0.75
#: accept() errors that mean "no resources now", not "the port is broken" (Twisted's _ACCEPT_ERRORS).
OUT_OF_RESOURCES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
#: How long accepting pauses after an out-of-resources error.
ACCEPT_PAUSE = 0.5


@dataclass(frozen=True)
class ConnectionLimits:
    """The limits of one listening port (seconds and bytes); see the module docstring."""

    max_connections: int = 1024
    max_connections_per_address: int = 256
    idle_timeout: float = 120.0
    max_buffered_per_connection: int = 17 * MiB
    max_buffered_total: int = 64 * MiB

    def within_fds(self, soft_limit: int | None, open_fds: int | None) -> ConnectionLimits:
        """These limits with ``max_connections`` lowered to what the descriptor limit allows (see fd_connection_cap)."""
        cap = fd_connection_cap(self.max_connections, soft_limit, open_fds)
        if cap >= self.max_connections:
            return self
        return replace(self, max_connections=cap,
                       max_connections_per_address=min(self.max_connections_per_address, cap))

    @classmethod
    def from_config(cls, config: Any) -> ConnectionLimits:
        """The limits a member's configuration asks for."""
        return cls(max_connections=config.max_connections,
                   max_connections_per_address=config.max_connections_per_address,
                   idle_timeout=config.connection_idle_timeout_ms / 1000.0,
                   max_buffered_per_connection=config.max_buffered_bytes_per_connection,
                   max_buffered_total=config.max_buffered_bytes_total)


#: File descriptors kept free for everything but incoming connections (store files and checkpoints,
#: outgoing connections to peers, log files): running out there fails writes, not just accepts.
FD_RESERVE = 32


def fd_connection_cap(max_connections: int, soft_limit: int | None, open_fds: int | None,
                      reserve: int = FD_RESERVE) -> int:
    """``maxConnections`` lowered so that incoming connections never take the descriptors the store needs.

    ``soft_limit`` is the process's descriptor limit (``ulimit -n``) and ``open_fds`` how many it holds
    already (None when unknown: no change).  At least one connection is always allowed.
    """
    if soft_limit is None or open_fds is None or soft_limit < 0:
        return max_connections
    return max(1, min(max_connections, soft_limit - open_fds - reserve))


def fd_usage() -> tuple[int | None, int | None]:
    """``(soft descriptor limit, descriptors open now)`` of this process, None where unknown."""
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        soft = None if soft == resource.RLIM_INFINITY else soft
    except (ImportError, OSError, ValueError):
        soft = None
    for path in ("/proc/self/fd", "/dev/fd"):
        try:
            return soft, len(os.listdir(path))
        except OSError:
            continue
    return soft, None


def admission_refusal(open_connections: int, from_address: int, limits: ConnectionLimits) -> str | None:
    """Why a new connection is refused, given the connections open in total and from its address; None to accept."""
    if open_connections >= limits.max_connections:
        return f"{open_connections} connections are open (maxConnections {limits.max_connections})"
    if from_address >= limits.max_connections_per_address:
        return (f"{from_address} connections from this address are open "
                f"(maxConnectionsPerAddress {limits.max_connections_per_address})")
    return None


def over_connection_cap(buffered: int, limits: ConnectionLimits) -> str | None:
    """Why a connection buffering ``buffered`` bytes of unfinished frames must be closed; None if within its cap."""
    if buffered > limits.max_buffered_per_connection:
        return (f"{buffered} bytes of unfinished frames buffered "
                f"(maxBufferedBytesPerConnection {limits.max_buffered_per_connection})")
    return None


def should_pause(buffered: int, total: int, limits: ConnectionLimits) -> bool:
    """A connection holding ``buffered`` bytes stops reading while the total exceeds the cap (large frames only)."""
    return total > limits.max_buffered_total and buffered > SMALL_FRAME


def may_resume(total: int, limits: ConnectionLimits) -> bool:
    """Paused connections read again once the total fell well below the cap."""
    return total <= limits.max_buffered_total * RESUME_FRACTION


def idle_deadline(last_frame: float, serving: int, now: float, timeout: float) -> float | None:
    """When to look again at a connection whose last frame completed at ``last_frame``; None: close it now.

    A connection with requests still being served is not idle (its client waits for our answer).
    """
    if serving > 0:
        return now + timeout
    if due(last_frame + timeout, now):
        return None
    return last_frame + timeout


class BufferBudget:
    """Bytes of unfinished frames across a port's connections; pauses and resumes readers around the cap."""

    def __init__(self, limits: ConnectionLimits):
        self.limits = limits
        self.total = 0
        self._held: dict[Any, int] = {}
        self.paused: set[Any] = set()

    def update(self, proto: Any, buffered: int) -> bool:
        """Record that ``proto`` now buffers ``buffered`` bytes; True if it must stop reading."""
        if not buffered and proto not in self._held:
            return False  # the common case: every frame of the read was complete
        old = self._held.pop(proto, 0)
        if buffered:
            self._held[proto] = buffered
        self.total += buffered - old
        if buffered < old and self.paused and may_resume(self.total, self.limits):
            self._resume_all()
        if should_pause(buffered, self.total, self.limits):
            self.paused.add(proto)
            return True
        return False

    def forget(self, proto: Any) -> None:
        """``proto`` closed: its bytes are released."""
        self.paused.discard(proto)
        self.update(proto, 0)

    def _resume_all(self) -> None:
        paused, self.paused = self.paused, set()
        for proto in paused:
            proto.budget_resumed()


class AcceptGuard:
    """Wraps a listening socket so that ``accept`` out of file descriptors pauses accepting instead of spinning.

    Twisted's ``tcp.Port`` logs a few lines per failed accept and, the pending connection still being
    in the backlog, is woken again at once.  This wrapper turns EMFILE (and the other out-of-resources
    errors) into "nothing to accept now", stops reading the port for ``ACCEPT_PAUSE`` seconds and logs
    one rate-limited line; established connections are not affected.  Everything else is delegated.
    """

    log = Logger()

    def __init__(self, sock: Any, port: Any, clock: Any, pause: float = ACCEPT_PAUSE):
        self._sock = sock
        self._port = port
        self._clock = clock
        self._pause = pause
        self._resume_call = None
        self.lines = RateLimitedLog(self.log, clock)
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def accept(self) -> Any:
        try:
            return self._sock.accept()
        except OSError as exc:
            if exc.errno not in OUT_OF_RESOURCES:
                raise
            self.refused += 1
            self.lines.warn(("accept", exc.errno), "cannot accept connections on {address}: {error} "
                            "({name}); not accepting for {pause:g}s, established connections keep working "
                            "(raise the file descriptor limit, ulimit -n, or lower maxConnections)",
                            address=self._sock.getsockname(), error=exc.strerror,
                            name=errno.errorcode.get(exc.errno, exc.errno), pause=self._pause)
            self._pause_accepting()
            raise BlockingIOError(errno.EAGAIN, "paused after running out of file descriptors") from None

    def _pause_accepting(self) -> None:
        if self._resume_call is not None and self._resume_call.active():
            return
        self._port.stopReading()
        self._resume_call = self._clock.callLater(self._pause, self._resume)

    def _resume(self) -> None:
        self._resume_call = None
        if getattr(self._port, "connected", True) and not getattr(self._port, "disconnecting", False):
            self._port.startReading()

    def cancel(self) -> None:
        """Stop the pending resume (the port is closing)."""
        if self._resume_call is not None and self._resume_call.active():
            self._resume_call.cancel()
        self._resume_call = None


def guard_accept(port: Any, clock: Any) -> AcceptGuard | None:
    """Install an :class:`AcceptGuard` on a listening ``tcp.Port`` (None for ports without a socket)."""
    sock = getattr(port, "socket", None)
    if sock is None or not hasattr(sock, "accept") or isinstance(sock, AcceptGuard):
        return None
    guard = AcceptGuard(sock, port, clock)
    port.socket = guard
    return guard


def tls_hello(data: bytes) -> bool:
    """``data`` starts like a TLS ClientHello record (what a TLS client sends first to a plaintext port)."""
    return len(data) >= 3 and data[0] == 0x16 and data[1] == 0x03 and data[2] <= 0x04


#: What a plaintext port says about a connection that opened with a TLS ClientHello.
TLS_AT_PLAIN_PORT = ("it opened with a TLS handshake but this port is plaintext (a client given --tls-ca, or "
                     "a member with tlsCert, talking to a member without it)")
