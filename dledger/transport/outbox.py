"""What a stretch of the reactor's work wrote, sent at the end of that work instead of after the next poll.

Twisted's ``transport.write`` only buffers: a plain TCP connection registers for writing and its bytes go
out in ``doWrite`` once the reactor has finished its turn (the rest of the poll's events) and polled again,
and when that poll also finds the socket readable it handles the read first (``_doReadOrWrite``: read,
then write).  So a leader's reply waited for the next requests of its own client connection to be
decoded and stored, a push for the follower's reply on the same connection to be handled (a commit, its
answers), each hop of a request paying a turn of the busiest process.  Traced at 10,000/s offered with
fsync (``tools/stage_trace``: ``write_to_send``, ``read_before_write``; docs/benchmarks.md "Round 2f") the
leader's replies waited p50 ~2 ms (p90 ~7) from the write to the send, nine bursts in ten behind a read of
the same connection, its pushes p50 ~0.8 ms.

The lever: every place that hands the reactor's control back to us and may write (a connection's read
handled: :class:`~dledger.transport.framing.FramedConnection`; a disk job's results delivered:
:class:`~dledger.diskio.BlockingIO`; a leader's pump) calls :func:`send_written` at its end, which sends
what the connections written during it buffered: one send per connection per stretch of work, so the
replies of one commit or the pushes of one pump still leave as one write.  Bytes written anywhere else
(a timer, a user's call) wait for Twisted's poll as before: sending early is an optimisation, never a
condition of delivery.

Only a plain TCP connection is sent early (:func:`sendable_connection`): under TLS the protocol wrapper
owns what goes to the socket (its handshake, its own buffering and producer), so a TLS connection keeps
Twisted's path.  The connection guard's wrapper (:class:`~dledger.transport.listener.GuardedProtocol`)
passes writes straight down and stays in place: its accounting sees every write as before.
"""

from __future__ import annotations

import threading  # allowed: a per-thread outbox (threading.local), no thread is started
from typing import Any

from twisted.internet.tcp import Connection
from twisted.protocols.policies import ProtocolWrapper
from twisted.protocols.tls import TLSMemoryBIOProtocol

#: How many protocol wrappers (the connection guard's) :func:`sendable_connection` looks through.
_MAX_WRAPPERS = 3


def sendable_connection(transport: Any) -> Connection | None:
    """The plain TCP connection under ``transport`` whose buffered bytes may be sent early, or None.

    Looks through plain protocol wrappers (the listener's guard); None for TLS (a TLS layer anywhere on the
    way, or a connection that started TLS), for anything that is not a TCP connection (test fakes, the
    in-process transport, UNIX sockets' other classes), and for deeper stacks than the project builds.
    """
    for _ in range(_MAX_WRAPPERS + 1):
        if isinstance(transport, Connection):
            return None if getattr(transport, "TLS", False) else transport
        if isinstance(transport, TLSMemoryBIOProtocol) or not isinstance(transport, ProtocolWrapper):
            return None
        transport = transport.transport
    return None


def may_send(connected: bool, disconnecting: bool, write_disconnecting: bool, buffered: int) -> bool:
    """Whether to call a connection's ``doWrite`` now: open both ways and holding bytes.

    A closing connection is left to the reactor: once its buffer empties ``doWrite`` returns the close,
    which only the reactor acts on (here it would be lost and the connection never closed).
    """
    return connected and not disconnecting and not write_disconnecting and buffered > 0


def buffered_bytes(connection: Connection) -> int:
    """Bytes written to ``connection`` and not sent yet (Twisted's two write buffers)."""
    return len(connection.dataBuffer) - connection.offset + connection._tempDataLen


#: The most ``doWrite`` calls one :func:`send_buffered` makes: each sends at most Twisted's ``SEND_LIMIT``
#: (128 KiB), and a batched push of 256 x 1 KiB is ~260 KiB; a larger backlog is left to the poll.
MAX_SENDS = 4


def send_buffered(connection: Connection) -> bool:
    """Send what ``connection`` buffered, as the reactor's next polls would have; True if it tried.

    ``doWrite`` sends at most 128 KiB a call, so it is called again while the socket takes everything
    (up to :data:`MAX_SENDS` calls).  What the socket does not take stays buffered and the connection
    registered for writing (Twisted's own path goes on from there).  An error result is left to the
    reactor too: ``doWrite`` returns before it stops writing, so the next poll reports the socket and the
    reactor closes the connection as always.
    """
    left = buffered_bytes(connection)
    if not may_send(connection.connected, connection.disconnecting,
                    getattr(connection, "_writeDisconnecting", False), left):
        return False
    for _ in range(MAX_SENDS):
        if connection.doWrite() is not None:
            break
        before, left = left, buffered_bytes(connection)
        if not left or before - left < connection.SEND_LIMIT:  # all sent, or the socket took less: full
            break
    return True


class Outbox:
    """The connections written during the current stretch of work (insertion-ordered, each once)."""

    def __init__(self) -> None:
        self._written: dict[Connection, None] = {}

    def wrote(self, connection: Connection | None) -> None:
        """``connection`` (a :func:`sendable_connection` result, None for others) holds bytes to send."""
        if connection is not None:
            self._written[connection] = None

    def send(self) -> int:
        """Send every written connection's buffered bytes; how many connections were tried."""
        if not self._written:
            return 0
        written, self._written = self._written, {}
        return sum(send_buffered(c) for c in written)


class _ThreadOutbox(threading.local):
    """One :class:`Outbox` per thread.  A process may run several reactors, each in its own thread (a
    :class:`~dledger.blocking.BlockingClient`'s private reactor beside the program's own, or two such
    clients), and a Twisted connection may only be touched from its reactor's thread: one reactor's
    :func:`send_written` must never call ``doWrite`` on another's connection while that reactor writes to
    it.  A connection is written (:func:`wrote`) only on its reactor's thread, so the thread's own outbox
    holds exactly its reactor's connections.  (Several members in one process on one reactor, as the
    tests run them, share their thread's outbox harmlessly.)"""

    def __init__(self) -> None:
        self.outbox = Outbox()


_THREAD = _ThreadOutbox()


def wrote(connection: Connection | None) -> None:
    """This thread's stretch of work wrote to ``connection`` (a :func:`sendable_connection` result; None for
    TLS and other transports, which keep Twisted's path): :func:`send_written` at its end sends it."""
    if connection is not None:
        _THREAD.outbox._written[connection] = None


def send_written() -> int:
    """Send what this thread's current stretch of work wrote (every connection registered by :func:`wrote`
    on this thread since the last call); how many connections were tried."""
    return _THREAD.outbox.send()
