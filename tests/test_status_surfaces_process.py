"""The status page with every surface on at once (as tests/test_surfaces_together_process.py does for the rest).

One 3-member ``twistd dledger`` group with ``authMode = "tls"``, the broker port under RocketMQ ACL and
the metrics/status endpoints on ``ssl:`` endpoint strings (the members' certificates):

* every member's ``/status.json`` answers over HTTPS verified against the group CA, with the group,
  its leader and the broker's sections (the signed send's topic among the queues);
* plain HTTP to those ports gets no page; an oversized POST is refused (413) before it is buffered;
* in the headless browser (when chromium is installed) the leader's page goes live over TLS.
"""

from __future__ import annotations

import json
import ssl
import urllib.request

import pytest
import pytest_twisted
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

pytest.importorskip("dledger_rocketmq")

from dledger_rocketmq.client.client import connect
from dledger_rocketmq.common.acl import Credentials
from dledger_rocketmq.tools.localgroup import broker_port_args

from dledger.launcher import LocalGroup, durable_store, free_ports
from dledger.security import certs
from dledger.security.guard import ClientCredentials
from dledger.testing.browser import HeadlessBrowser, find_chromium

STORE = durable_store()
pytestmark = [pytest.mark.process, pytest.mark.network,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]

TOPIC = "Audited"
PRODUCER = Credentials("producer1", "producer-secret")
PLAIN_ACL = f"""\
accounts:
- accessKey: {PRODUCER.access_key}
  secretKey: {PRODUCER.secret_key}
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - {TOPIC}=PUB|SUB
"""


def https_get(url: str, ca) -> tuple[int, bytes]:
    ctx = ssl.create_default_context(cafile=str(ca))
    with urllib.request.urlopen(url, context=ctx, timeout=5) as resp:
        return resp.status, resp.read()


def plain_get(port: int) -> bytes:
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"GET /status.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        try:
            return s.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return b""


def raw_tls(port: int, ca, request: bytes) -> bytes:
    import socket

    ctx = ssl.create_default_context(cafile=str(ca))
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname="localhost") as s:
            s.sendall(request)
            return s.recv(65536)


@pytest_twisted.ensureDeferred
async def test_status_page_on_a_tls_group_with_the_broker_under_acl(tmp_path, reactor):
    """HTTPS status of every member of a tls group with the ACL'd broker; the browser page goes live over TLS."""
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0", "n1", "n2"], [certs.ClientSpec("ops", "admin")])
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    options = {"authMode": "tls", "clientsFile": str(d / "clients.txt"), "tlsCert": str(d / "{selfId}.crt"),
               "tlsKey": str(d / "{selfId}.key"), "tlsCa": str(d / "ca.crt"),
               "plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0,
               "plugins.rocketmq.aclEnable": True, "plugins.rocketmq.aclFile": str(acl_file)}
    admin_creds = ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-ops.crt"),
                                               tls_key=str(d / "client-ops.key"))
    ids = ["n0", "n1", "n2"]
    ports = dict(zip(ids, free_ports(6)[:3], strict=True))
    status_ports = dict(zip(ids, free_ports(3), strict=True))
    args = broker_port_args(ports)
    for mid in ids:  # a later --metrics wins: the status/metrics endpoint over TLS with the member's certificate
        args[mid] += ["--metrics", f"ssl:{status_ports[mid]}:interface=127.0.0.1:privateKey={d / (mid + '.key')}"
                                   f":certKey={d / (mid + '.crt')}"]
    group = LocalGroup(tmp_path / "group", n=3, store=STORE, preset="fast", member_args=args, options=options,
                       client_credentials=admin_creds)
    admin = group.client(request_timeout=0.5)
    chromium = find_chromium()
    browser = HeadlessBrowser(reactor, chromium, tmp_path / "profile", extra_args=("--ignore-certificate-errors",)) \
        if chromium else None
    try:
        await group.start_and_wait(30)

        async def master():
            meta = await group.wait_for_leader(admin, 30)
            try:
                c = await connect(reactor, "127.0.0.1", ports[meta.leader_id], timeout=5.0, credentials=PRODUCER)
                try:
                    await c.send(TOPIC, b"signed", queue_id=0)
                finally:
                    c.close()
            except Exception:
                return None
            return meta.leader_id

        leader = await group.wait_for(master, 60, "a master broker taking a signed send", interval=0.1)
        for mid in ids:
            async def shows_topic(mid=mid):
                code, body = await deferToThread(https_get, f"https://localhost:{status_ports[mid]}/status.json",
                                                 d / "ca.crt")
                doc = json.loads(body)
                rows = [r for s in doc["sections"] for t in s["tables"] if t["id"] == "rocketmq-queues"
                        for r in t["rows"]]
                return doc if code == 200 and any(r[0] == TOPIC for r in rows) else None
            doc = await group.wait_for(shows_topic, 30, f"{mid}'s status naming {TOPIC}", interval=0.2)
            assert doc["group"] == "g0" and doc["self_id"] == mid and doc["member"]["leader"] == leader
            assert [r["id"] for r in doc["members"]] == ids
            code, page = await deferToThread(https_get, f"https://localhost:{status_ports[mid]}/status", d / "ca.crt")
            assert code == 200 and b"RocketMQ broker" in page
            plain = await deferToThread(plain_get, status_ports[mid])
            assert b"200 OK" not in plain and b"status" not in plain.lower()
            huge = await deferToThread(raw_tls, status_ports[mid], d / "ca.crt",
                                       b"POST /status.json HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n")
            assert huge.startswith(b"HTTP/1.1 413"), huge[:100]

        if browser is not None:
            await browser.start()
            await browser.navigate(f"https://127.0.0.1:{status_ports[leader]}/status")
            deadline = reactor.seconds() + 20
            while True:
                try:
                    banner, shown = await browser.texts(["#banner", "#leader"])
                except Exception:
                    banner, shown = None, None
                if banner and banner.startswith("live") and shown == leader:
                    break
                assert reactor.seconds() < deadline, (banner, shown, await browser.evaluate(
                    "location.href + ' ' + document.body.innerText.slice(0, 300)"))
                await deferLater(reactor, 0.1, lambda: None)
            assert await browser.evaluate(f"document.body.textContent.includes('{TOPIC}')")
        # the group still appends, every member still up
        await admin.append(b"after")
        assert all(group.members[m].running for m in ids)
    finally:
        if browser is not None:
            await browser.stop()
        await admin.close()
        await group.stop_all()
        group.close()
