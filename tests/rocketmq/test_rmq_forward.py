"""A slave forwards sends to the master it learned from the name server (dledger_rocketmq.broker.forward)."""

from __future__ import annotations

import dataclasses

import pytest
from dledger_rocketmq.broker.forward import FORWARDED, should_forward
from dledger_rocketmq.broker.port import SEND_MESSAGE_V2
from dledger_rocketmq.namesrv import registration
from dledger_rocketmq.plugin import broker_for, registration_for
from test_rmq_registration import Net, group_with_namesrv, run


@pytest.fixture
def net(monkeypatch):
    n = Net()
    monkeypatch.setattr(registration, "connect_client", n.connect)
    return n


@pytest.mark.parametrize("enabled, is_master, forwarded, master_known, expected", [
    (True, False, False, True, True),     # a slave that knows the master forwards
    (True, True, False, True, False),     # the master stores it itself
    (True, False, True, True, False),     # forwarded once already: never again (no loops)
    (True, False, False, False, False),   # no master known: answer SERVICE_NOT_AVAILABLE, the client retries
    (False, False, False, True, False),   # rocketmq.forwardSendsToMaster = false
])
def test_should_forward(enabled, is_master, forwarded, master_known, expected):
    """Forward only from a slave, once, to a known master, when enabled."""
    assert should_forward(enabled=enabled, is_master=is_master, forwarded=forwarded,
                          master_known=master_known) is expected


def ports_of(cluster, net):
    """member id -> its BrokerPort (made by group_with_namesrv), each given its registration's fetcher."""
    out = {}
    for k, mid in enumerate(cluster.ids):
        port = net.servers[f"127.0.0.1:{30911 + k}"].port
        port.master_fetcher = registration_for(cluster.servers[mid]).fetcher
        out[mid] = port
    return out


def send(cluster, net, addr: str, ext_extra=None):
    """SEND_MESSAGE_V2 of one message to ``addr`` over the in-memory network; the (header, body) reply."""
    host, port = addr.split(":")
    out = []
    ext = {"a": "fwd_pg", "b": "Fwd", "c": "TBW102", "d": 4, "e": 0, "f": 0, "g": 1, "h": 0, "i": "", "j": 0,
           "k": "false", "m": "false", **(ext_extra or {})}  # SEND_MESSAGE_V2's short names, as a Java client
    net.connect(cluster.clock, host, int(port)).addCallback(
        lambda c: c.request(SEND_MESSAGE_V2, ext, b"hi")).addBoth(out.append)
    assert run(cluster, net, lambda: bool(out), 10)
    if isinstance(out[0], Exception) or hasattr(out[0], "value"):
        raise AssertionError(out[0])
    return out[0]


def test_send_to_a_slave_is_stored_by_the_master(tmp_path, net):
    """A send to a slave is relayed to the master, stored there once, and answered with the master's reply."""
    cluster, _ns = group_with_namesrv(tmp_path, net)
    ports = ports_of(cluster, net)
    addr = {mid: f"127.0.0.1:{30911 + k}" for k, mid in enumerate(cluster.ids)}

    def master():
        found = [m for m, s in cluster.servers.items() if broker_for(s).role == "MASTER"]
        return found[0] if len(found) == 1 else None
    assert run(cluster, net, lambda: master() is not None)
    m = master()
    slave = next(mid for mid in cluster.ids if mid != m)
    assert run(cluster, net, lambda: ports[slave].master_fetcher.known(), 10)
    header, _ = send(cluster, net, addr[slave])
    assert header.code == 0, header.remark
    assert int(header.ext_fields["queueOffset"]) == 0 and header.ext_fields["msgId"]
    assert ports[slave].stats.forwarded == 1
    assert run(cluster, net, lambda: broker_for(cluster.servers[m]).max_offset("Fwd", 0) == 1, 5)
    # Already forwarded once (the marker set): a slave answers it itself, as RocketMQ would.
    header, _ = send(cluster, net, addr[slave], {FORWARDED: "nX"})
    assert header.code == 14 and ports[slave].stats.forwarded == 1
    # Switched off: refused as before.
    b = broker_for(cluster.servers[slave])
    on = b.options
    b.options = dataclasses.replace(on, forward_sends=False)
    header, _ = send(cluster, net, addr[slave])
    assert header.code == 14
    b.options = on
    # The master unreachable: the slave answers SERVICE_NOT_AVAILABLE instead of failing the request.
    del net.servers[addr[m]]
    ports[slave].master_fetcher.close()
    header, _ = send(cluster, net, addr[slave])
    assert header.code == 14 and ports[slave].stats.forwarded == 1
