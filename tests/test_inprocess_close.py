"""The in-process network: requests in flight when the network is closed settle without errors."""

from __future__ import annotations

from types import SimpleNamespace

from twisted.internet import task

from dledger.transport.inprocess import InProcessNetwork


def test_refusal_in_flight_after_close_fails_the_request_quietly():
    """A send to a down member that is still being refused when the network closes fails it; no AlreadyCancelled."""
    clock = task.Clock()
    net = InProcessNetwork(clock)
    net.crash("b")  # known to the network, no handler: the send is refused after a delay
    out = []
    net.send("a", "b", object(), 5.0).addErrback(out.append)
    net.close()  # the cluster stopped: every request timeout is cancelled
    clock.advance(1.0)  # the pending refusal runs now
    assert len(out) == 1 and "is down" in out[0].getErrorMessage()


def test_reply_in_flight_after_close_is_delivered_quietly():
    """A reply still travelling when the network closes is delivered; no AlreadyCancelled from its timeout."""
    clock = task.Clock()
    net = InProcessNetwork(clock)
    net.transport("b").start(SimpleNamespace(handle_request=lambda request: "pong"))
    out = []
    net.send("a", "b", "ping", 5.0).addBoth(out.append)
    for _ in range(100_000):  # until delivered: the reply is then on its way back
        if net.stats.delivered:
            break
        clock.advance(0.00001)
    assert net.stats.delivered == 1 and out == []
    net.close()
    clock.advance(1.0)
    assert out == ["pong"]
