"""The other ports over TLS with ``ssl:`` endpoint strings: the RocketMQ broker port and the metrics endpoint.

Both take a Twisted server endpoint string (``rocketmq.listen``, ``--metrics``), so ``ssl:PORT:
privateKey=KEY:certKey=CERT`` serves them over TLS with a certificate from ``dledger certs init``.
The clients here are the standard library's (``ssl``, ``urllib``), verifying against the group's CA.
"""

import socket
import ssl
import urllib.request
from types import SimpleNamespace

import pytest
import pytest_twisted
from prometheus_client import CollectorRegistry, Counter
from twisted.internet.threads import deferToThread

from dledger.security import certs
from dledger.transport import remoting

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def certdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    certs.init_group(d, "g0", ["n0"])
    return d


def ssl_endpoint(d):
    return f"ssl:0:interface=127.0.0.1:privateKey={d / 'n0.key'}:certKey={d / 'n0.crt'}"


def tls_exchange(port, ca, data):
    """Connect with TLS verifying against ``ca``, send ``data``, return the first bytes answered."""
    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(data)
            return s.recv(65536)


@pytest_twisted.ensureDeferred
async def test_rocketmq_broker_port_serves_over_ssl_endpoint(reactor, certdir):
    """rocketmq.listen=ssl:...: a TLS client gets the broker's reply (an unsupported code answered with code 3)."""
    pytest.importorskip("dledger_rocketmq")
    from dledger_rocketmq.broker.port import BrokerPort, encode_command

    broker = SimpleNamespace(server=SimpleNamespace(self_id="n0", clock=reactor))
    port = BrokerPort(broker, ssl_endpoint(certdir), reactor=reactor)
    port.startService()
    try:
        listening = await port.listening
        request = encode_command(remoting.Header(105, 9, 0, "JAVA", 409, None, {"topic": "T"}))
        data = await deferToThread(tls_exchange, listening.getHost().port, certdir / "ca.crt", request)
        frame = remoting.decode_frame(data)
        assert (frame.header.code, frame.header.opaque) == (3, 9)
        with pytest.raises((OSError, ValueError)):  # plain TCP to the TLS port gets no remoting reply
            await deferToThread(plain_exchange, listening.getHost().port, request)
    finally:
        await port.stopService()


def plain_exchange(port, data):
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(data)
        reply = s.recv(65536)
        remoting.decode_frame(reply)  # a TLS alert is not a remoting frame
        return reply


@pytest_twisted.ensureDeferred
async def test_metrics_endpoint_serves_over_ssl_endpoint(reactor, certdir):
    """--metrics ssl:...: Prometheus text over HTTPS, verified against the group's CA."""
    from dledger.metrics import MetricsService

    registry = CollectorRegistry()
    Counter("dledger_test_total", "a counter", registry=registry).inc(3)
    svc = MetricsService(ssl_endpoint(certdir), registry, reactor)
    svc.startService()
    try:
        listening = await svc.listening
        url = f"https://localhost:{listening.getHost().port}/metrics"
        ctx = ssl.create_default_context(cafile=str(certdir / "ca.crt"))
        text = await deferToThread(lambda: urllib.request.urlopen(url, context=ctx, timeout=5).read().decode())
        assert "dledger_test_total 3.0" in text
    finally:
        await svc.stopService()


@pytest_twisted.ensureDeferred
async def test_metrics_endpoint_over_ssl_accepts_clients_offering_alpn(reactor, certdir):
    """Browsers and curl offer ALPN: the guarded ssl: metrics/status port negotiates http/1.1 instead of failing
    the handshake with "internal error" (the guard's factory hid the Site's ALPN protocols from TLS)."""
    from dledger.metrics import MetricsService

    registry = CollectorRegistry()
    Counter("dledger_alpn_total", "a counter", registry=registry).inc(1)
    svc = MetricsService(ssl_endpoint(certdir), registry, reactor)
    svc.startService()
    try:
        listening = await svc.listening
        ctx = ssl.create_default_context(cafile=str(certdir / "ca.crt"))
        ctx.set_alpn_protocols(["h2", "http/1.1"])

        def get():
            with socket.create_connection(("127.0.0.1", listening.getHost().port), timeout=5) as raw:
                with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
                    data = b""
                    while chunk := s.recv(65536):
                        data += chunk
                    return s.selected_alpn_protocol(), data

        protocol, data = await deferToThread(get)
        assert protocol == "http/1.1" and b"dledger_alpn_total 1.0" in data
    finally:
        await svc.stopService()
