"""Real processes: RocketMQ ACL on a secured broker group (issue #21 items 1 and 2).

A 3-member ``twistd dledger`` group with ``authMode = "tls"`` and the broker
plugin with ``rocketmq.aclEnable`` (a RocketMQ 4.x plain_acl.yml).  On main
before the ACL an unsigned ``send`` was stored on every member and a raw
DELETE_TOPIC_IN_BROKER (215) without credentials answered 0; here both are
refused with RocketMQ's answer (code 1, ``AclException`` remark), signed ones
go through, an ACL change made with mqadmin's code 50 goes through the log
and the next master (after a SIGKILL) enforces it.  A member whose broker port
would be anonymous while ``authMode`` is on refuses to start with one line.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import RocketMQError, connect
from dledger_rocketmq.common.acl import Credentials
from dledger_rocketmq.tools.localgroup import broker_port_args
from twisted.internet import protocol
from twisted.internet.defer import Deferred

from dledger.launcher import LocalGroup, durable_store, free_ports
from dledger.security import certs
from dledger.security.guard import ClientCredentials

ROOT = Path(__file__).resolve().parent.parent.parent
STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]

TOPIC = "AclTopic"
PRODUCER = Credentials("producer1", "producer-secret")
ADMIN = Credentials("rocketmq-admin", "admin-secret-1")
LATER = Credentials("added-later", "added-later-secret")
PLAIN_ACL = f"""\
# a RocketMQ 4.x plain_acl.yml
globalWhiteRemoteAddresses:

accounts:
- accessKey: {PRODUCER.access_key}
  secretKey: {PRODUCER.secret_key}
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - {TOPIC}=PUB|SUB

- accessKey: {ADMIN.access_key}
  secretKey: {ADMIN.secret_key}
  admin: true
"""


def secured_options(tmp_path, **extra):
    """authMode tls (certificates from ``dledger certs init``) and the broker plugin with the given options."""
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0", "n1", "n2"], [certs.ClientSpec("ops", "admin"), certs.ClientSpec("app1", "write"),
                                                    certs.ClientSpec("reader", "read")])
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    options = {"authMode": "tls", "clientsFile": str(d / "clients.txt"), "tlsCert": str(d / "{selfId}.crt"),
               "tlsKey": str(d / "{selfId}.key"), "tlsCa": str(d / "ca.crt"),
               "plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0,
               **{f"plugins.rocketmq.{k}": v for k, v in extra.items()}}
    admin = ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-ops.crt"),
                                         tls_key=str(d / "client-ops.key"))
    return options, admin, acl_file


async def answer(reactor, port: int, code: int, ext: dict, body: bytes = b"", credentials=None):
    """One raw request to a broker port: (code, remark) of the reply."""
    c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=credentials)
    try:
        header, _ = await c.request(code, ext, body)
        return header.code, header.remark
    finally:
        c.close()


async def master_of(group, admin, ports, credentials, live=None, **connect_kw) -> str:
    """The member whose broker takes a signed send (the master)."""
    async def probe():
        meta = await group.wait_for_leader(admin, 30)
        mid = meta.leader_id
        if live is not None and mid not in live:
            return None
        try:
            c = await connect(group.reactor, "127.0.0.1", ports[mid], timeout=2.0, credentials=credentials,
                              **connect_kw)
        except Exception:
            return None
        try:
            await c.send(TOPIC, b"probe", queue_id=0)
        except Exception:
            return None
        finally:
            c.close()
        return mid
    return await group.wait_for(probe, 60, "a master broker taking a signed send", interval=0.1)


async def max_offset(reactor, port: int) -> int:
    c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=ADMIN)
    try:
        return await c.max_offset(TOPIC, 0)
    finally:
        c.close()


@pytest_twisted.ensureDeferred
async def test_a_secured_group_refuses_unsigned_requests_and_takes_signed_ones(tmp_path, reactor):
    """Unsigned send and raw 215 refused (code 1, AclException remark), signed ones accepted; an ACL change
    through the log is enforced by the next master."""
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    options, creds, acl_file = secured_options(tmp_path, aclEnable=True, aclFile=str(acl_file_path(tmp_path)))
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=broker_port_args(ports),
                       options=options, client_credentials=creds)
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)
        master = await master_of(group, admin, ports, PRODUCER)
        port = ports[master]
        before = await max_offset(reactor, port)

        # Anonymous: the two requests issue #21 found accepted.
        with pytest.raises(RocketMQError) as info:
            c = await connect(reactor, "127.0.0.1", port, timeout=5.0)
            try:
                await c.send(TOPIC, b"anonymous", queue_id=0)
            finally:
                c.close()
        assert info.value.code == 1 and "AclException: No accessKey is configured" in str(info.value)
        code, remark = await answer(reactor, port, 215, {"topic": TOPIC})
        assert code == 1 and "AclException: No accessKey is configured" in remark
        # Signed by an account without the permission: refused too.
        code, remark = await answer(reactor, port, 215, {"topic": TOPIC}, credentials=PRODUCER)
        assert code == 1 and "Need admin permission for request code=215, but accessKey=producer1" in remark
        code, remark = await answer(reactor, port, 310, {"a": "pg", "b": "Elsewhere", "c": "TBW102", "d": "4",
                                                         "e": "0", "f": "0", "g": "0", "h": "0", "i": "",
                                                         "j": "0", "k": "false", "m": "false"},
                                    b"x", credentials=PRODUCER)
        assert code == 1 and "No default permission for topic:Elsewhere" in remark
        assert await max_offset(reactor, port) == before, "a refused send was stored"

        # Signed and permitted: stored.
        c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=PRODUCER)
        try:
            r = await c.send(TOPIC, b"signed", queue_id=0)
        finally:
            c.close()
        assert r.queue_offset == before
        assert await max_offset(reactor, port) == before + 1

        # The CLI: signed with --access-key/--secret-key-file, refused without.
        secret = tmp_path / "producer.secret"
        secret.write_text(PRODUCER.secret_key + "\n")
        cli = [str(Path(sys.executable).parent / "dledger"), "rocketmq", "send", f"127.0.0.1:{port}", TOPIC]
        code, out = await run(reactor, [*cli, "by-cli", "--access-key", PRODUCER.access_key,
                                        "--secret-key-file", str(secret)], tmp_path)
        assert code == 0 and "sent " in out, out
        code, out = await run(reactor, [*cli, "anonymous-cli"], tmp_path)
        assert code == 1 and "No accessKey is configured" in out and out.count("\n") == 1, out
        assert await max_offset(reactor, port) == before + 2

        # mqadmin updateAclConfig (50) by the admin account: through the log, on every member.
        code, remark = await answer(reactor, port, 50, {"accessKey": LATER.access_key,
                                                        "secretKey": LATER.secret_key,
                                                        "topicPerms": f"{TOPIC}=PUB"}, credentials=ADMIN)
        assert (code, remark) == (0, None)
        await group.wait_for(lambda: all(group.log_lines(mid, "ACL from log index") for mid in group.ids)
                             and all(len(group.log_lines(mid, "ACL from log index")) >= 2 for mid in group.ids),
                             30, "every member to apply both ACL entries")

        # The next master enforces the same ACL (the change included).
        group.kill(master)
        live = set(group.ids) - {master}
        new_master = await master_of(group, admin, ports, LATER, live=live)
        assert new_master != master
        code, remark = await answer(reactor, ports[new_master], 215, {"topic": TOPIC})
        assert code == 1 and "No accessKey is configured" in remark
        code, remark = await answer(reactor, ports[new_master], 215, {"topic": TOPIC}, credentials=LATER)
        assert code == 1 and "Need admin permission" in remark
        code, remark = await answer(reactor, ports[new_master], 215, {"topic": TOPIC}, credentials=ADMIN)
        assert code == 0, remark
        refusals = [line for mid in live for line in group.log_lines(mid, "rocketmq port refused request 215")]
        assert refusals, "refusals are logged"
    finally:
        await admin.close()
        await group.stop_all()
        group.close()


@pytest_twisted.ensureDeferred
async def test_client_certificates_on_the_broker_port_act_by_their_role(tmp_path, reactor):
    """rocketmq.tlsClientAuth: the broker port speaks TLS; a write certificate sends, a read one only pulls, an
    admin one may delete a topic, no certificate (and no ACL) is refused, plaintext gets no answer."""
    from dledger_rocketmq.client.client import tls_options

    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    options, creds, _ = secured_options(tmp_path, tlsClientAuth=True)
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=broker_port_args(ports),
                       options=options, client_credentials=creds)
    admin = group.client(request_timeout=0.5)
    d = tmp_path / "certs"

    def tls(name=None):
        return tls_options(str(d / "ca.crt"), str(d / f"client-{name}.crt") if name else None,
                           str(d / f"client-{name}.key") if name else None)
    try:
        await group.start_and_wait(30)
        master = await master_of(group, admin, ports, None, tls_options=tls("app1"))
        port = ports[master]

        async def ask(code, ext, body=b"", who=None):
            c = await connect(reactor, "127.0.0.1", port, timeout=5.0, tls_options=tls(who))
            try:
                header, _ = await c.request(code, ext, body)
                return header.code, header.remark
            finally:
                c.close()
        send = {"a": "pg", "b": TOPIC, "c": "TBW102", "d": "4", "e": "0", "f": "0", "g": "0", "h": "0", "i": "",
                "j": "0", "k": "false", "m": "false"}
        assert (await ask(310, send, b"w", "app1"))[0] == 0
        code, remark = await ask(310, send, b"r", "reader")
        assert code == 1 and "No permission for topic:AclTopic with the certificate's role read" in remark
        assert (await ask(14, {"consumerGroup": "g", "topic": TOPIC, "queueId": "0"}, b"", "reader"))[0] == 0
        code, remark = await ask(215, {"topic": TOPIC}, b"", "app1")
        assert code == 1 and "Need admin permission" in remark
        code, remark = await ask(310, send, b"anonymous", None)
        assert code == 1 and "No client certificate" in remark
        assert (await ask(215, {"topic": TOPIC}, b"", "ops"))[0] == 0
        with pytest.raises(RocketMQError):  # plaintext: the TLS port never answers a RocketMQ frame
            c = await connect(reactor, "127.0.0.1", port, timeout=2.0)
            try:
                await c.max_offset(TOPIC, 0)
            finally:
                c.close()
    finally:
        await admin.close()
        await group.stop_all()
        group.close()


def acl_file_path(tmp_path):
    return tmp_path / "plain_acl.yml"


@pytest.mark.parametrize("extra, starts", [
    ({}, False),
    ({"allowAnonymous": True}, True),
])
@pytest_twisted.ensureDeferred
async def test_an_anonymous_broker_port_on_an_authenticated_member_refuses_to_start(tmp_path, reactor, extra,
                                                                                     starts):
    """authMode tls + a broker port without aclEnable/tlsClientAuth: one line naming the options, exit 1;
    with rocketmq.allowAnonymous = true the member starts."""
    ports = {"n0": free_ports(1)[0]}
    options, creds, _ = secured_options(tmp_path, **extra)
    group = LocalGroup(tmp_path, n=1, store=STORE, preset="fast", member_args=broker_port_args(ports),
                       options=options, client_credentials=creds)
    try:
        group.start()
        if starts:
            await group.wait_for(lambda: group.log_lines("n0", "RocketMQ broker port on"), 30, "the broker port")
            assert group.members["n0"].running
            return
        status = await group.wait_exit("n0", 30)
        assert status == 1
        lines = group.log_lines("n0", "rocketmq.aclEnable")
        assert len(lines) == 1, group.log_lines("n0")
        assert "rocketmq.allowAnonymous = true" in lines[0] and "authMode is 'tls'" in lines[0]
        assert not group.log_lines("n0", "Traceback")
    finally:
        await group.stop_all()
        group.close()


# -- stock clients through a name server with ACL: the Java client (AclClientRPCHook) and ali-ons -----------------

KIT = Path(os.environ.get("DLEDGER_JAVAKIT", ROOT.parent / "shared" / "javakit"))
RMQ_JAVA = KIT / "bin" / "rmq-java"
NODE = shutil.which("node")
ALIONS = ROOT / "tools" / "alions" / "failover.js"

JAVA_CLIENT = r"""
import java.util.*;
import org.apache.rocketmq.acl.common.AclClientRPCHook;
import org.apache.rocketmq.acl.common.SessionCredentials;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.client.producer.SendResult;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.remoting.RPCHook;

// AclClient NAMESRV TOPIC GROUP COUNT [ACCESS_KEY SECRET_KEY]: one line per event on stdout.
public class AclClient {
    public static void main(String[] a) throws Exception {
        String namesrv = a[0], topic = a[1], group = a[2];
        int count = Integer.parseInt(a[3]);
        RPCHook hook = a.length > 5 ? new AclClientRPCHook(new SessionCredentials(a[4], a[5])) : null;
        DefaultMQProducer producer = new DefaultMQProducer(group + "_pg", hook);
        producer.setNamesrvAddr(namesrv);
        producer.setSendMsgTimeout(3000);
        producer.setRetryTimesWhenSendFailed(0);
        producer.start();
        try {
            for (int i = 0; i < count; i++) {
                SendResult r = producer.send(new Message(topic, "TagA", ("java-acl-" + i).getBytes("UTF-8")));
                System.out.println("sent java-acl-" + i + " " + r.getSendStatus());
            }
        } catch (Exception e) {
            System.out.println("refused " + e.getClass().getSimpleName() + ": "
                               + String.valueOf(e.getMessage()).replace('\n', ' '));
            producer.shutdown();
            return;
        }
        producer.shutdown();
        DefaultLitePullConsumer consumer = new DefaultLitePullConsumer(group, hook);
        consumer.setNamesrvAddr(namesrv);
        consumer.setConsumeFromWhere(org.apache.rocketmq.common.consumer.ConsumeFromWhere.CONSUME_FROM_FIRST_OFFSET);
        consumer.subscribe(topic, "*");
        consumer.start();
        Set<String> got = new HashSet<>();
        long deadline = System.currentTimeMillis() + 60000;
        while (got.size() < count && System.currentTimeMillis() < deadline) {
            for (MessageExt m : consumer.poll(1000)) {
                String body = new String(m.getBody(), "UTF-8");
                if (body.startsWith("java-acl-") && got.add(body)) System.out.println("recv " + body);
            }
        }
        consumer.shutdown();
        System.out.println("done");
    }
}
"""


def namesrv_group(tmp_path, ports, namesrv_port):
    """A secured group with ACL whose n0 runs a name server with ACL; members register with the admin account."""
    secret = tmp_path / "admin.secret"
    secret.write_text(ADMIN.secret_key + "\n")
    namesrv = f"127.0.0.1:{namesrv_port}"
    options, creds, acl_file = secured_options(tmp_path, aclEnable=True, aclFile=str(acl_file_path(tmp_path)),
                                               namesrvAddr=namesrv, accessKey=ADMIN.access_key,
                                               secretKeyFile=str(secret), brokerName="broker-acl")
    args = broker_port_args(ports)
    args["n0"] += ["--plugin-opt", f"rocketmq.namesrvListen=tcp:{namesrv_port}:interface=127.0.0.1"]
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=args, options=options,
                       client_credentials=creds)
    return group, namesrv


async def routed(reactor, namesrv_port: int) -> bool:
    """The name server (with ACL) gives the topic's route to a signed request."""
    c = await connect(reactor, "127.0.0.1", namesrv_port, timeout=2.0, credentials=PRODUCER)
    try:
        header, _ = await c.request(105, {"topic": TOPIC})
        return header.code == 0
    finally:
        c.close()


async def run(reactor, argv, cwd, env=None, timeout=120.0) -> tuple[int, str]:
    """Run a child to its end (bounded); (exit code, stdout + stderr)."""
    from twisted.internet import utils

    d = utils.getProcessOutputAndValue(argv[0], argv[1:], env=env if env is not None else dict(os.environ),
                                       path=str(cwd), reactor=reactor)
    d.addTimeout(timeout, reactor)
    out, err, code = await d
    return code, (out + err).decode(errors="replace")


@pytest_twisted.ensureDeferred
async def test_members_sign_their_own_requests_and_a_forwarded_send_keeps_the_clients_signature(tmp_path, reactor):
    """With ACL everywhere: registrations (admin account) reach the name server, the slaves' metadata sync is not
    refused, a signed send to a slave is forwarded and stored, an unsigned one is refused by the slave."""
    namesrv_port, *rest = free_ports(4)
    ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
    group, namesrv = namesrv_group(tmp_path, ports, namesrv_port)
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)
        master = await master_of(group, admin, ports, PRODUCER)
        await group.wait_for(lambda: routed(reactor, namesrv_port), 60, "the topic's route on the name server")
        slave = next(mid for mid in group.ids if mid != master)
        before = await max_offset(reactor, ports[master])

        async def forwarded():
            try:
                c = await connect(reactor, "127.0.0.1", ports[slave], timeout=2.0, credentials=PRODUCER)
            except Exception:
                return False
            try:
                await c.send(TOPIC, b"via-slave", queue_id=0)
                return True
            except RocketMQError as exc:
                assert exc.code == 14, exc  # not yet knowing the master: SERVICE_NOT_AVAILABLE, never refused
                return False
            finally:
                c.close()
        await group.wait_for(forwarded, 30, "a signed send to a slave to be forwarded", interval=0.2)
        assert await max_offset(reactor, ports[master]) == before + 1
        code, remark = await answer(reactor, ports[slave], 310, {"b": TOPIC, "e": "0"}, b"anonymous")
        assert code == 1 and "No accessKey is configured" in remark
        assert not [line for mid in group.ids for line in group.log_lines(mid, "refused request")
                    if "from 127.0.0.1: No accessKey" in line and "request 310" not in line], \
            "a member's own request (registration, sync) was refused"
        assert not group.log_lines("n0", "name server refused request 103")
    finally:
        await admin.close()
        await group.stop_all()
        group.close()


@pytest.mark.skipif(not RMQ_JAVA.exists(), reason=f"the Java kit is not at {KIT} (set DLEDGER_JAVAKIT)")
@pytest.mark.skipif(shutil.which("java") is None, reason="java is not installed")
@pytest_twisted.ensureDeferred
async def test_java_client_with_acl_hook_sends_and_consumes_and_is_refused_without(tmp_path, reactor):
    """RocketMQ 4.9.8's Java client with AclClientRPCHook sends and consumes through the secured group and its name
    server; without credentials it is refused."""
    namesrv_port, *rest = free_ports(4)
    ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
    group, namesrv = namesrv_group(tmp_path, ports, namesrv_port)
    admin = group.client(request_timeout=0.5)
    (tmp_path / "AclClient.java").write_text(JAVA_CLIENT)
    env = {**os.environ, "RMQ_LOG_ROOT": str(tmp_path / "rmq-logs")}
    try:
        await group.start_and_wait(30)
        await master_of(group, admin, ports, PRODUCER)  # creates the topic
        await group.wait_for(lambda: routed(reactor, namesrv_port), 60, "the topic's route on the name server")
        code, out = await run(reactor, [str(RMQ_JAVA), "AclClient.java", namesrv, TOPIC, "java_acl_cg", "5",
                                        PRODUCER.access_key, PRODUCER.secret_key], tmp_path, env)
        assert code == 0, out[-3000:]
        sent = [line for line in out.splitlines() if line.startswith("sent ")]
        recv = {line.split()[1] for line in out.splitlines() if line.startswith("recv ")}
        assert len(sent) == 5 and all(line.endswith("SEND_OK") for line in sent), out[-3000:]
        assert recv == {f"java-acl-{i}" for i in range(5)}, out[-3000:]

        code, out = await run(reactor, [str(RMQ_JAVA), "AclClient.java", namesrv, TOPIC, "java_anon_cg", "1"],
                              tmp_path, env)
        assert code == 0 and "refused " in out and "sent " not in out, out[-3000:]
    finally:
        await admin.close()
        await group.stop_all()
        group.close()


@pytest.mark.skipif(NODE is None, reason="node is not installed")
@pytest.mark.skipif(not (ALIONS.parent / "node_modules" / "ali-ons").is_dir(),
                    reason="ali-ons is not installed (make test installs it with npm)")
@pytest_twisted.ensureDeferred
async def test_alions_with_access_key_sends_and_consumes(tmp_path, reactor):
    """ali-ons signs with accessKey/secretKey (numbers and booleans in extFields): it sends and consumes through
    the secured group; with a wrong secret nothing is acknowledged."""
    namesrv_port, *rest = free_ports(4)
    ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
    group, namesrv = namesrv_group(tmp_path, ports, namesrv_port)
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)
        await master_of(group, admin, ports, PRODUCER)
        await group.wait_for(lambda: routed(reactor, namesrv_port), 60, "the topic's route on the name server")
        good = await alions(reactor, group, namesrv, PRODUCER.secret_key, lambda d: consumed(d) >= 5)
        bad = await alions(reactor, group, namesrv, "wrong-secret", lambda d: len(d.of("send_error")) >= 3)
        assert consumed(good) >= 5, (good.events[-5:], good.stderr[-3000:])
        assert len(bad.of("send_error")) >= 3 and not bad.of("sent") and not bad.of("recv"), bad.events[:5]
    finally:
        await admin.close()
        await group.stop_all()
        group.close()


def consumed(driver) -> int:
    """How many of the driver's acknowledged sends it also received."""
    return len({e["body"] for e in driver.of("sent")} & {e["body"] for e in driver.of("recv")})


async def alions(reactor, group, namesrv: str, secret: str, enough) -> _AlionsLines:
    """Run the ali-ons driver signing as producer1 with ``secret`` until ``enough(driver)`` (bounded), then stop it."""
    from dledger.launcher import child_env

    env = {**child_env(), "ALIONS_ACCESS_KEY": PRODUCER.access_key, "ALIONS_SECRET_KEY": secret}
    driver = _AlionsLines()
    proc = reactor.spawnProcess(driver, NODE, [NODE, str(ALIONS), namesrv, TOPIC, "alions_acl_cg", "--interval",
                                               "50", "--max-seconds", "40"], env=env, path=str(ALIONS.parent))
    try:
        await group.wait_for(lambda: enough(driver) or driver.ended.called, 60, "ali-ons")
    finally:
        if not driver.ended.called:
            proc.signalProcess("KILL")
        await driver.ended
    return driver


class _AlionsLines(protocol.ProcessProtocol):
    """The ali-ons driver's JSON lines."""

    def __init__(self):
        self.buf, self.events, self.stderr = b"", [], ""
        self.ended: Deferred = Deferred()

    def outReceived(self, data: bytes):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        self.events += [json.loads(line) for line in lines if line.strip()]

    def errReceived(self, data: bytes):
        self.stderr = (self.stderr + data.decode(errors="replace"))[-20000:]

    def processEnded(self, reason):
        self.ended.callback(None)

    def of(self, ev: str) -> list[dict]:
        return [e for e in self.events if e["ev"] == ev]
