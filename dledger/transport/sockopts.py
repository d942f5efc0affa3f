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
