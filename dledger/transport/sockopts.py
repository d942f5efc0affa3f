"""Socket options every request/reply connection of the project sets, in one place.

Request/reply traffic is small writes: with Nagle's algorithm a write waits for the peer's (delayed, up to
40 ms) ACK of the previous one, and a client waiting for its reply waits with it.  RocketMQ's and DLedger's
Netty servers and clients set TCP_NODELAY on every connection; every protocol here calls
:func:`set_no_delay` from ``connectionMade`` (the broker port lacked it until issue #28 found single sends
waiting 20-70 ms; the RocketMQ client lacked it too).
"""

from __future__ import annotations


def set_no_delay(transport) -> bool:
    """Turn Nagle's algorithm off on ``transport`` if it is TCP (TLS wrappers pass the call through).

    True if set; False for transports without the option (UNIX sockets, test fakes, closed sockets).
    """
    setter = getattr(transport, "setTcpNoDelay", None)
    if setter is None:
        return False
    try:
        setter(True)
    except Exception:  # not a TCP socket, or already closed: nothing to tune
        return False
    return True


#: Bytes one read of a request/reply connection takes from the socket (Twisted's default: 64 KiB).  The
#: frames of one read are decoded first and their APPENDs stored as one batch (``IBatchRequestHandler``),
#: so the read size bounds a leader's batch: 64 KiB held ~60 one-entry APPENDs of 1 KiB, and every batch
#: costs a push per follower, a flush round and a reply write.  A larger read lets a pipelined client's
#: backlog go as one batch (issue #28 target 2, docs/benchmarks.md "Round 2b").  128 KiB, not 256: on the
#: quiet machine 256 KiB cost the batched load (256 x 1 KiB requests, fsync) about a fifth of its rate
#: (median 67,000 entries/s against 85,000-87,000 with 64 or 128 KiB), while 128 KiB kept most of the
#: per-request CPU gain (interleaved triples in docs/benchmarks.md "Round 2b: the lead's rerun").
READ_SIZE = 128 * 1024


def set_read_size(transport, size: int = READ_SIZE) -> bool:
    """Let the TCP connection under ``transport`` (through protocol wrappers) read ``size`` bytes at a time.

    True if set; False when there is no file-descriptor transport underneath (test fakes, in-memory).
    """
    from twisted.internet.abstract import FileDescriptor

    for _ in range(4):  # a guard's wrapper, a TLS layer: never deeper
        if transport is None:
            return False
        if isinstance(transport, FileDescriptor):
            transport.bufferSize = size
            return True
        transport = getattr(transport, "transport", None)
    return False
