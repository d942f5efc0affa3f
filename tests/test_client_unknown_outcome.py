"""An append whose request went out and whose connection was lost before the answer has an unknown outcome.

The member may have appended it (it read the request, the answer was lost with the connection), so resending it
may store the body twice. ``at_least_once=False`` promises the caller that the client never does: the outcome
comes back as an error instead. The nemesis's log workload relies on it (each body at most once in the log).

These tests run the real client stack -- ``DLedgerClient`` over ``RemoteTransport``, ``RemotingClient``'s link
and ``RemotingProtocol`` -- on a ``MemoryReactorClock``: each connection the client opens is made by hand on a
``StringTransport``, and the test drops it after the request was written.
"""

from __future__ import annotations

import pytest
from twisted.internet.address import IPv4Address
from twisted.internet.error import ConnectionLost
from twisted.internet.testing import MemoryReactorClock, StringTransport
from twisted.python.failure import Failure

from dledger.client import connect
from dledger.codes import RequestCode
from dledger.errors import DLedgerError, OutcomeUnknown
from dledger.transport import remoting


class DroppingNetwork:
    """Accepts every connection the client opens, lets it write, then drops it (the member got the request)."""

    def __init__(self, reactor: MemoryReactorClock):
        self.reactor = reactor
        self.served = 0
        self.wires: list[StringTransport] = []

    def accept_new(self) -> list:
        protocols = []
        while self.served < len(self.reactor.tcpClients):
            host, port, factory, _timeout, _bind = self.reactor.tcpClients[self.served]
            self.served += 1
            proto = factory.buildProtocol(IPv4Address("TCP", host, port))
            wire = StringTransport()
            proto.makeConnection(wire)
            self.wires.append(wire)
            protocols.append(proto)
        return protocols

    def appends_sent(self) -> int:
        frames = [f for wire in self.wires for f in remoting.split_frames(wire.value())]
        return sum(1 for f in frames if not f.header.is_response and f.header.code == RequestCode.APPEND)

    def run(self, seconds: float) -> None:
        """For ``seconds`` of clock time: accept what connects, drop each connection once its request is out."""
        for _ in range(int(seconds * 20)):
            for proto in self.accept_new():
                if proto.transport.value():  # the request went out: the answer is lost with the connection
                    proto.connectionLost(Failure(ConnectionLost("peer reset the connection")))
            self.reactor.advance(0.05)


def _append(at_least_once: bool):
    reactor = MemoryReactorClock()
    client = connect("n0-127.0.0.1:20911", "g0", reactor=reactor, request_timeout=2.0, max_attempts=5,
                     retry_delay=0.05, at_least_once=at_least_once)
    outcome: list = []
    client.append(b"body").addBoth(outcome.append)
    net = DroppingNetwork(reactor)
    net.run(10.0)
    return net, outcome


def test_an_append_lost_with_its_connection_is_not_resent_at_most_once():
    """``at_least_once=False``: the append was written once, then its connection dropped: it is not sent again,
    and the caller gets an error whose outcome is unknown (not a NETWORK_ERROR that says nothing happened)."""
    net, outcome = _append(at_least_once=False)
    assert net.appends_sent() == 1
    [result] = outcome
    assert isinstance(result, Failure) and result.check(DLedgerError)
    error = result.value
    assert isinstance(error, OutcomeUnknown) and "outcome unknown" in error.message


def test_an_append_lost_with_its_connection_is_resent_at_least_once():
    """The default (at least once) resends it: the test network does drop requests after they went out."""
    net, outcome = _append(at_least_once=True)
    assert net.appends_sent() >= 2  # resent after each loss (attempts made while the link backs off send nothing)
    [result] = outcome
    assert isinstance(result, Failure) and result.check(DLedgerError)


@pytest.mark.parametrize("at_least_once", [False, True])
def test_a_refused_connection_is_always_retried(at_least_once):
    """A connection that never opened carried nothing: retried in both modes (NETWORK_ERROR, nothing was sent)."""
    reactor = MemoryReactorClock()
    client = connect("n0-127.0.0.1:20911", "g0", reactor=reactor, request_timeout=2.0, max_attempts=3,
                     retry_delay=0.05, at_least_once=at_least_once)
    outcome: list = []
    client.append(b"body").addBoth(outcome.append)
    attempts = 0
    for _ in range(200):
        while attempts < len(reactor.tcpClients):
            _h, _p, factory, _t, _b = reactor.tcpClients[attempts]
            attempts += 1
            factory.clientConnectionFailed(None, Failure(ConnectionLost("refused")))
        reactor.advance(0.05)
    assert attempts >= 2
    [result] = outcome
    assert isinstance(result, Failure) and result.check(DLedgerError) and not result.check(OutcomeUnknown)


def test_an_append_whose_reply_cannot_be_decoded_is_not_resent_at_most_once():
    """The member read the request and answered something undecodable: it may have appended the body, so
    at most once means no resend (the outcome is unknown), as for a connection lost after the request."""
    reactor = MemoryReactorClock()
    client = connect("n0-127.0.0.1:20911", "g0", reactor=reactor, request_timeout=2.0, max_attempts=5,
                     retry_delay=0.05, at_least_once=False)
    outcome: list = []
    client.append(b"body").addBoth(outcome.append)
    net = DroppingNetwork(reactor)
    answered: set[tuple[int, int]] = set()
    protocols: list = []
    for _ in range(200):
        protocols.extend(net.accept_new())
        for k, (wire, proto) in enumerate(zip(net.wires, protocols)):
            frames = [f for f in remoting.split_frames(wire.value()) if not f.header.is_response]
            for f in frames:
                if (k, f.header.opaque) not in answered:
                    answered.add((k, f.header.opaque))
                    proto.dataReceived(remoting.encode_reply(f.header.opaque, b"{not json"))
        reactor.advance(0.05)
    assert net.appends_sent() == 1
    [result] = outcome
    assert isinstance(result, Failure) and result.check(OutcomeUnknown), result
