"""Issue #21 item 7 against live ``twistd dledger`` members: auth off is loud, auth failures are visible.

Before: the start-up line said nothing about ``authMode = none``; a failed TLS handshake (wrong CA, expired
certificate) was not logged at all; a plaintext client at a TLS port got "Connection was closed cleanly".
Now the summary line names the auth mode, ``none`` adds one warning saying what it exposes and how to turn
authentication on, each failed handshake is one rate-limited line with the peer and the reason, and the
CLI says in one line that it reached a TLS port in plaintext (or a plaintext port with TLS).
"""

import datetime
import subprocess
import sys

import pytest
import pytest_twisted
from cryptography.hazmat.primitives import serialization
from twisted.internet.threads import deferToThread

from dledger import messages
from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, child_env, durable_store
from dledger.security import certs
from dledger.security.guard import ClientCredentials
from dledger.security.tls import client_options, load_ca_certs, load_private_certificate
from dledger.transport.client import RemotingClient

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]


def save(directory, name, cert, key):
    crt, kf = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    kf.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    return str(crt), str(kf)


def bad_certificates(d, other):
    """An expired client certificate and one for group g1 (both from the group's CA), one from another CA."""
    ca_cert, ca_key, _ = certs.load_ca(d)
    now = datetime.datetime.now(datetime.UTC)
    out = {"expired": save(d, "expired", *certs.issue(ca_cert, ca_key, "g0", "client", "app1", 1,
                                                      now - datetime.timedelta(days=30))),
           "wrong group": save(d, "g1", *certs.issue(ca_cert, ca_key, "g1", "client", "app1", 30, now))}
    certs.init_group(other, "g0", ["n0"], [certs.ClientSpec("app1", "write")])
    out["unknown CA"] = (str(other / "client-app1.crt"), str(other / "client-app1.key"))
    return out


def cli(*args):
    return subprocess.run([sys.executable, "-m", "dledger.cli", *args], env=child_env(), capture_output=True,
                          text=True, timeout=60)


@pytest_twisted.ensureDeferred
async def test_auth_failures_are_visible_on_the_member_and_in_the_cli(tmp_path, reactor):
    """Expired, unknown-CA and wrong-group certificates and a plaintext client: one member line each, with the
    peer and the reason; the CLI says the port is TLS; the summary line says TLS and authMode=tls."""
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0"], [certs.ClientSpec("ops", "admin")])
    options = {"authMode": "tls", "clientsFile": str(d / "clients.txt"), "tlsCert": str(d / "{selfId}.crt"),
               "tlsKey": str(d / "{selfId}.key"), "tlsCa": str(d / "ca.crt")}
    admin = ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-ops.crt"),
                                         tls_key=str(d / "client-ops.key"))
    group = LocalGroup(tmp_path / "g", n=1, store=STORE, preset="fast", reactor=reactor, options=options,
                       client_credentials=admin)
    bad = bad_certificates(d, tmp_path / "other")
    ca = load_ca_certs(str(d / "ca.crt"))
    clients = {}
    try:
        await group.start_and_wait(30)
        address = f"127.0.0.1:{group.members['n0'].port}"
        outcomes = {}
        for what, (crt, key) in bad.items():
            clients[what] = RemotingClient(reactor, timeout=3.0, credentials=ClientCredentials(
                "g0", "client", "app1", None, client_options(load_private_certificate(crt, key), ca)))
            for _ in range(2):  # twice: still one line per peer and reason
                try:
                    meta = await clients[what].send(address, messages.MetadataRequest(group="g0", remote_id="n0"))
                    outcomes[what] = "redacted" if meta.peers is None else "answered"
                except DLedgerError as exc:
                    outcomes[what] = f"refused: {exc.code.name}"
                await clients[what].close()
                clients[what] = RemotingClient(reactor, timeout=3.0, credentials=ClientCredentials(
                    "g0", "client", "app1", None, client_options(load_private_certificate(crt, key), ca)))
        assert outcomes == {"expired": "refused: NETWORK_ERROR", "unknown CA": "refused: NETWORK_ERROR",
                            "wrong group": "redacted"}, outcomes

        plain = await deferToThread(cli, "append", "--peers", group.peers, "--group", "g0", "--body", "x",
                                    "--timeout", "3")
        assert plain.returncode == 1 and plain.stderr.count("\n") == 1, plain.stderr
        assert f"{address} is a TLS port" in plain.stderr and "--tls-ca" in plain.stderr, plain.stderr

        meta = await deferToThread(cli, "metadata", "--peers", group.peers, "--group", "g0", "--timeout", "3")
        assert meta.returncode == 1 and f"{address} is a TLS port" in meta.stdout, meta.stdout

        def lines(text):
            return [x for x in group.log_lines("n0", text)]

        await group.wait_for(lambda: lines("not TLS"), 10, "the plaintext client's handshake line")
        expired, unknown = lines("has expired"), lines("unknown CA")
        assert len(expired) == 1 and "TLS handshake from 127.0.0.1 failed" in expired[0], expired
        assert len(unknown) == 1 and "127.0.0.1" in unknown[0], unknown
        wrong = lines("the certificate is for group 'g1', not 'g0'")
        assert len(wrong) == 1 and "127.0.0.1" in wrong[0], wrong
        summary = lines("dledger member n0 of group g0 serving on")
        assert len(summary) == 1 and "(TLS, authMode=tls)" in summary[0], summary
        assert lines("authMode is none") == []
        for c in clients.values():
            await c.close()
        assert await group.stop_all() == {"n0": 0}
        assert not lines("Traceback")
    finally:
        for c in clients.values():
            await c.close()
        group.close()


@pytest_twisted.ensureDeferred
async def test_auth_mode_none_is_loud_and_tls_at_a_plain_port_is_named(tmp_path, reactor):
    """authMode none: the summary says so and one warning says what it exposes and how to turn auth on; a CLI
    given --tls-ca against this plaintext port says so in one line."""
    group = LocalGroup(tmp_path / "g", n=1, store=STORE, preset="fast", reactor=reactor)
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0"])
    try:
        await group.start_and_wait(30)
        address = f"127.0.0.1:{group.members['n0'].port}"
        summary = group.log_lines("n0", "dledger member n0 of group g0 serving on")
        assert len(summary) == 1 and f"serving on {address} (authMode=none)" in summary[0], summary
        warning = group.log_lines("n0", "authMode is none")
        assert len(warning) == 1, warning
        assert all(x in warning[0] for x in (f"anyone who can reach {address}", "erase", 'authMode = "tls"',
                                             "dledger certs init", "docs/security.md")), warning
        tls = await deferToThread(cli, "append", "--peers", group.peers, "--group", "g0", "--body", "x",
                                  "--timeout", "3", "--tls-ca", str(d / "ca.crt"))
        assert tls.returncode == 1 and tls.stderr.count("\n") == 1, tls.stderr
        assert f"{address} does not speak TLS" in tls.stderr, tls.stderr
        hello = group.log_lines("n0", "opened with a TLS handshake but this port is plaintext")
        assert 1 <= len(hello) <= 2 and "127.0.0.1" in hello[0], hello  # the member says so too, rate-limited
        assert await group.stop_all() == {"n0": 0}
    finally:
        group.close()
