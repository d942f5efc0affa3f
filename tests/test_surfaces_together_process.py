"""Every surface of one secured group at once (issue #21: the surfaces were each fine alone last round).

One 3-member ``twistd dledger`` group with ``authMode = "tls"``, the RocketMQ broker port under RocketMQ
ACL, the metrics port, and the Spark ingest reading it with a read-role client certificate -- all open
together, all through the same connection guard:

* the broker takes a signed send and refuses an anonymous one;
* every metrics port answers a scrape and refuses an oversized POST body (413) before buffering it;
* ``dledger ingest --once`` with TLS client credentials writes every committed entry, the signed
  message among them, while the broker and metrics ports are in use;
* afterwards the group still appends and every member is up.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import pytest_twisted

pytest.importorskip("dledger_rocketmq")
pytest.importorskip("dledger_spark")

from dledger_rocketmq.client.client import RocketMQError, connect
from dledger_rocketmq.common.acl import Credentials
from dledger_rocketmq.tools.localgroup import broker_port_args

from dledger.launcher import LocalGroup, durable_store, free_ports
from dledger.security import certs
from dledger.security.guard import ClientCredentials

ROOT = Path(__file__).resolve().parent.parent
INGEST = ROOT / "spark" / "ingest.py"
STORE = durable_store()
pytestmark = [pytest.mark.process, pytest.mark.spark,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]

TOPIC = "Together"
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


async def run(reactor, argv, cwd, env, timeout=300.0) -> tuple[int, str]:
    """Run a child to its end (bounded); (exit code, stdout + stderr)."""
    from twisted.internet import utils

    d = utils.getProcessOutputAndValue(argv[0], argv[1:], env=env, path=str(cwd), reactor=reactor)
    d.addTimeout(timeout, reactor)
    out, err, code = await d
    return code, (out + err).decode(errors="replace")


async def http(reactor, port: int, request: bytes) -> bytes:
    """One raw HTTP exchange with 127.0.0.1:port; the whole answer (the server closes the connection)."""
    from twisted.internet import protocol
    from twisted.internet.defer import Deferred

    done: Deferred = Deferred()

    class Once(protocol.Protocol):
        def __init__(self):
            self.data = b""

        def connectionMade(self):
            self.transport.write(request)

        def dataReceived(self, data):
            self.data += data

        def connectionLost(self, reason):
            if not done.called:
                done.callback(self.data)

    await protocol.ClientCreator(reactor, Once).connectTCP("127.0.0.1", port, timeout=5)
    done.addTimeout(20, reactor)
    return await done


async def send(reactor, port: int, body: bytes, credentials=None):
    c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=credentials)
    try:
        return await c.send(TOPIC, body, queue_id=0)
    finally:
        c.close()


@pytest_twisted.ensureDeferred
async def test_broker_port_metrics_port_and_spark_ingest_on_one_tls_group(tmp_path, reactor):
    """The broker port (ACL), the metrics ports and a TLS Spark ingest, open together on one tls group."""
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0", "n1", "n2"], [certs.ClientSpec("ops", "admin"),
                                                    certs.ClientSpec("reader", "read")])
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    options = {"authMode": "tls", "clientsFile": str(d / "clients.txt"), "tlsCert": str(d / "{selfId}.crt"),
               "tlsKey": str(d / "{selfId}.key"), "tlsCa": str(d / "ca.crt"),
               "plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0,
               "plugins.rocketmq.aclEnable": True, "plugins.rocketmq.aclFile": str(acl_file)}
    admin_creds = ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-ops.crt"),
                                               tls_key=str(d / "client-ops.key"))
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    group = LocalGroup(tmp_path / "group", n=3, store=STORE, preset="fast", metrics=True,
                       member_args=broker_port_args(ports), options=options, client_credentials=admin_creds)
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)

        async def master():
            meta = await group.wait_for_leader(admin, 30)
            try:
                await send(reactor, ports[meta.leader_id], b"probe", PRODUCER)
            except Exception:
                return None
            return meta.leader_id

        leader = await group.wait_for(master, 60, "a master broker taking a signed send", interval=0.1)
        sent = await send(reactor, ports[leader], b"together", PRODUCER)
        assert sent.queue_offset >= 1
        with pytest.raises(RocketMQError) as info:
            await send(reactor, ports[leader], b"anonymous")
        assert info.value.code == 1 and "No accessKey is configured" in str(info.value)

        for mid, member in group.members.items():
            scrape = await http(reactor, member.metrics_port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n"
                                                              b"Connection: close\r\n\r\n")
            assert scrape.startswith(b"HTTP/1.1 200") and b"dledger_up" in scrape, (mid, scrape[:200])
            huge = await http(reactor, member.metrics_port, b"POST /metrics HTTP/1.1\r\nHost: x\r\n"
                                                            b"Content-Length: 99999999999\r\n\r\n")
            assert huge.startswith(b"HTTP/1.1 413"), (mid, huge[:200])

        out, ck = tmp_path / "out", tmp_path / "ck"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("DLEDGER_", "PYSPARK_"))}
        code, text = await run(reactor, [sys.executable, str(INGEST), "--peers", group.peers, "--group", "g0",
                                         "--output", str(out), "--checkpoint", str(ck), "--once",
                                         "--tls-ca", str(d / "ca.crt"), "--tls-cert", str(d / "client-reader.crt"),
                                         "--tls-key", str(d / "client-reader.key")], tmp_path, env)
        assert code == 0, text[-3000:]

        import pyarrow.parquet as pq
        table = pq.read_table(out)
        bodies = table.column("body").to_pylist()
        assert table.num_rows >= 2 and any(b"together" in bytes(b) for b in bodies), table.num_rows

        # The group still works with every surface used: an append is acknowledged, all members are up.
        ack = await admin.append(b"after-everything")
        assert ack.index > 0
        assert all(m.running for m in group.members.values())
    finally:
        await admin.close()
        await group.stop_all()
        group.close()
