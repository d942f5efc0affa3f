"""The real RocketMQ 4.9.8 Java client and mqadmin (../shared/javakit) against real processes of ours.

- the stock Java producer, push consumer and lite-pull consumer through our name server and a 3-member
  broker group across a master SIGKILL: every acknowledged message is consumed by both consumers, the
  send outage is printed;
- mqadmin commands of docs/rocketmq.md against our group, in one JVM (``AdminBatch.java``), each checked
  for the fields a 4.9.8 broker group gives (the full comparison with a real Java broker group, process
  by process with exit statuses, is ``test_rmq_java_compare.py``, marked slow);
- our broker registering with the real Java NameServer.

Skipped with the reason when the kit or ``java`` is absent.  A JVM takes 1-3 s to start on the 2-core
machine: each test starts as few as it can.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import connect
from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master
from twisted.internet import protocol
from twisted.internet.defer import Deferred

from dledger.launcher import TWISTD, LocalGroup, child_env, durable_store, free_ports
from dledger.testing.procs import LogFile

ROOT = Path(__file__).resolve().parent.parent.parent
KIT = Path(os.environ.get("DLEDGER_JAVAKIT", ROOT.parent / "shared" / "javakit"))
JAVA_SRC = Path(__file__).resolve().parent / "java"
RMQ_JAVA = KIT / "bin" / "rmq-java"
STORE = durable_store()
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(not RMQ_JAVA.exists(), reason=f"the Java kit is not at {KIT} (set DLEDGER_JAVAKIT)"),
    pytest.mark.skipif(shutil.which("java") is None, reason="java is not installed"),
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
]

TOPIC = "JavaTopic"
GROUP = "java_cg"
BEFORE_KILL = 60
AFTER_KILL = 60


def java_env(tmp_path: Path) -> dict[str, str]:
    return child_env({"RMQ_LOG_ROOT": str(tmp_path / "rmq-logs"), "RMQ_HEAP": "-Xms32m -Xmx192m"})


class JsonLines(protocol.ProcessProtocol):
    """A Java driver's JSON event lines (other stdout lines, e.g. the client's log, are kept apart)."""

    def __init__(self):
        self.buf = b""
        self.events: list[dict] = []
        self.other: list[str] = []
        self.ended: Deferred = Deferred()

    def outReceived(self, data: bytes):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace").strip()
            if text.startswith("{"):
                self.events.append(json.loads(text))
            elif text:
                self.other = (self.other + [text])[-200:]

    def errReceived(self, data: bytes):
        self.other = (self.other + data.decode(errors="replace").splitlines())[-200:]

    def processEnded(self, reason):
        self.ended.callback(reason.value.exitCode)

    def of(self, ev: str, **match) -> list[dict]:
        return [e for e in self.events if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]

    def tail(self) -> str:
        return "\n".join(self.other[-40:])




def start_namesrv(reactor, group, tmp_path: Path, port: int):
    """Our name server (``twistd rocketmq-namesrv``) on 127.0.0.1:port; (protocol, process)."""
    ns = LogFile(tmp_path / "namesrv.log")
    proc = reactor.spawnProcess(ns, group.python, [group.python, "-c", TWISTD, "-n", "--pidfile=",
                                                   "rocketmq-namesrv", "--listen", f"tcp:{port}:interface=127.0.0.1"],
                                env=child_env(), path=str(tmp_path))
    return ns, proc


async def stop_child(proto, proc, sig: str = "TERM") -> None:
    if not proto.ended.called:
        try:
            proc.signalProcess(sig)
        except Exception:  # already gone
            pass
        await proto.ended


def broker_group(tmp_path: Path, namesrv: str, ports: dict[str, int], name: str = "broker-java",
                 **options) -> LocalGroup:
    return LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=broker_port_args(ports),
                      options={"plugins.rocketmq.enabled": True, "plugins.rocketmq.namesrvAddr": namesrv,
                               "plugins.rocketmq.brokerName": name, **options})


async def route_master(reactor, namesrv_port: int, topic: str) -> str | None:
    """The master address the name server gives for ``topic`` (None: no route yet, or not listening yet)."""
    try:
        c = await connect(reactor, "127.0.0.1", namesrv_port, timeout=2)
    except Exception:
        return None
    try:
        header, body = await c.request(105, {"topic": topic})
        if header.code != 0:
            return None
        return json.loads(body)["brokerDatas"][0]["brokerAddrs"].get("0")
    finally:
        c.close()


@pytest_twisted.ensureDeferred
async def test_java_producer_push_and_lite_pull_consumers_across_a_master_kill(tmp_path, reactor, capsys):
    """The stock 4.9.8 Java client (producer, push consumer, lite-pull consumer) through our name server and
    brokers: a SIGKILL of the master loses no acknowledged message; the send outage is printed."""
    namesrv_port, *rest = free_ports(4)
    ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
    namesrv = f"127.0.0.1:{namesrv_port}"
    group = broker_group(tmp_path, namesrv, ports)
    admin = group.client(request_timeout=0.3)
    ns, ns_proc = start_namesrv(reactor, group, tmp_path, namesrv_port)
    driver = proc = None
    try:
        await group.start_and_wait(30)
        await wait_for_master(group, admin, ports, topic=TOPIC, body=b"warm-up")
        await group.wait_for(lambda: route_master(reactor, namesrv_port, TOPIC), 30, "the topic's route")

        driver = JsonLines()
        proc = reactor.spawnProcess(driver, str(RMQ_JAVA), [str(RMQ_JAVA), str(JAVA_SRC / "JavaFailover.java"),
                                                            namesrv, TOPIC, GROUP, "20"],
                                    env=java_env(tmp_path), path=str(tmp_path))
        await group.wait_for(lambda: driver.of("ready") or driver.ended.called, 60, "the Java client to start")
        assert driver.of("ready"), driver.tail()
        await group.wait_for(lambda: len(driver.of("sent")) >= BEFORE_KILL or driver.ended.called, 60,
                             "sends before the kill")
        assert len(driver.of("sent")) >= BEFORE_KILL, driver.tail()
        victim = (await group.wait_for_leader(admin, 10)).leader_id
        sent_before = len(driver.of("sent"))
        killed_at = reactor.seconds()
        group.kill(victim)

        async def new_master():
            return (await route_master(reactor, namesrv_port, TOPIC)) not in (None, f"127.0.0.1:{ports[victim]}")
        await group.wait_for(new_master, 30, "the name server to name a new master")
        registered = reactor.seconds() - killed_at
        await group.wait_exit(victim, 10)
        await group.wait_for(lambda: len(driver.of("sent")) >= sent_before + AFTER_KILL, 90, "sends after the kill")
        proc.writeToChild(0, b"stop\n")
        await group.wait_for(lambda: driver.of("stopped"), 30, "the producer to stop")
        acked = {e["body"] for e in driver.of("sent")}

        def missing(via: str) -> set[str]:
            return acked - {e["body"] for e in driver.of("recv", via=via)}
        await group.wait_for(lambda: not missing("push") and not missing("lite"), 90,
                             "every acknowledged message at both consumers")
        proc.writeToChild(0, b"exit\n")
        await group.wait_for(lambda: driver.ended.called, 30, "the Java client to exit")

        times = [e["t"] for e in driver.of("sent")]
        outage = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0) / 1000
        with capsys.disabled():
            print(f"\njava client failover (process): {len(acked)} acknowledged sends, "
                  f"{len(driver.of('send_error'))} failed sends, longest send outage {outage:.2f}s, "
                  f"new master registered {registered:.2f}s after the kill, "
                  f"push deliveries {len(driver.of('recv', via='push'))}, "
                  f"lite-pull deliveries {len(driver.of('recv', via='lite'))}, killed master {victim}")
        assert not missing("push") and not missing("lite")
    finally:
        if driver is not None:
            await stop_child(driver, proc, "KILL")
        await admin.close()
        await group.stop_all()
        group.close()
        await stop_child(ns, ns_proc)


# -- mqadmin against our group (one JVM), and our brokers registered with the real Java NameServer ---------------

class AdminSession(JsonLines):
    """``AdminBatch.java``: mqadmin commands run one at a time in one JVM; ``ask`` waits for each result."""

    def __init__(self, group):
        super().__init__()
        self.group = group
        self.proc = None

    async def ask(self, *args: str, timeout: float = 60.0) -> dict:
        done = len(self.events)
        self.proc.writeToChild(0, json.dumps(list(args)).encode() + b"\n")
        await self.group.wait_for(lambda: len(self.events) > done or self.ended.called, timeout,
                                  f"mqadmin {args[0]}")
        assert len(self.events) > done, self.tail()
        result = self.events[done]
        result["text"] = result["out"] + result["err"]
        return result


def start_admin(reactor, group, tmp_path: Path) -> AdminSession:
    session = AdminSession(group)
    session.proc = reactor.spawnProcess(session, str(RMQ_JAVA), [str(RMQ_JAVA), str(JAVA_SRC / "AdminBatch.java")],
                                        env=java_env(tmp_path), path=str(tmp_path))
    return session


def start_java_namesrv(reactor, tmp_path: Path, port: int):
    """RocketMQ 4.9.8's own NameServer from the kit on ``port``; (protocol, process)."""
    conf = tmp_path / "namesrv.properties"
    conf.write_text(f"listenPort={port}\n")
    ns = LogFile(tmp_path / "java-namesrv.log")
    env = child_env({"RMQ_LOG_ROOT": str(tmp_path / "rmq-logs"), "RMQ_HEAP": "-Xms32m -Xmx128m"})
    proc = reactor.spawnProcess(ns, str(KIT / "bin" / "mqnamesrv"), [str(KIT / "bin" / "mqnamesrv"), "-c", str(conf)],
                                env=env, path=str(tmp_path))
    return ns, proc


async def cluster_brokers(reactor, namesrv_port: int) -> dict:
    """GET_BROKER_CLUSTER_INFO of a name server: brokerAddrTable (empty when it does not answer yet)."""
    try:
        c = await connect(reactor, "127.0.0.1", namesrv_port, timeout=2)
    except Exception:
        return {}
    try:
        header, body = await c.request(106, {})
        from dledger_rocketmq.common import fastjson
        return fastjson.loads(body).get("brokerAddrTable", {}) if header.code == 0 else {}
    except Exception:
        return {}
    finally:
        c.close()


def uniq_key(now_ms: int, counter: int = 1) -> str:
    """A UNIQ_KEY as the Java client builds it (MessageClientIDSetter): ip, pid, loader hash, ms since the start
    of the month (local time), counter -- queryMsgByUniqueKey reads the time back to bound its query."""
    import datetime
    import struct

    now = datetime.datetime.fromtimestamp(now_ms / 1000)
    month = now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    span = now_ms - int(month.timestamp() * 1000)
    head = bytes([127, 0, 0, 1]) + struct.pack(">hi", os.getpid() & 0x7FFF, 0x1234)
    return (head + struct.pack(">IH", span & 0xFFFFFFFF, counter)).hex().upper()


#: What mqadmin prints for each command against a 4.9.8 broker group (its column heads and labels, from the
#: tools jar's format strings; test_rmq_java_compare.py checks them against a real Java group).
EXPECT = {
    "clusterList": ["#Cluster Name", "#Broker Name", "#BID", "#Addr", "#Version", "#InTPS(LOAD)", "#OutTPS(LOAD)",
                    "#PCWait(ms)", "#Hour", "#SPACE"],
    "topicList": [TOPIC],
    "topicRoute": ['"brokerDatas"', '"queueDatas"'],
    "updateTopic": ["create topic to", "success."],
    "updateSubGroup": ["create subscription group to", "success."],
    "topicStatus": ["#Broker Name", "#QID", "#Min Offset", "#Max Offset", "#Last Updated"],
    "brokerStatus": ["msgPutTotalTodayNow", "putTps", "putLatency99", "getTransferedTps"],
    "consumerProgress": ["#Topic", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset",
                         "#Diff", "#LastTime", "Consume TPS:", "Diff Total:"],
    "consumerConnection": ["#ClientId", "#ClientAddr", "#Language", "#Version", "Below is subscription:",
                           "ConsumeType: CONSUME_PASSIVELY"],
    "producerConnection": ["0001  127.0.0.1@java-admin", "JAVA"],
    "queryMsgById": ["OffsetID:", "Topic:", "Tags:", "Keys:", "Queue ID:", "Queue Offset:", "Store Timestamp:",
                     "Message Body Path:", "MessageTrack [consumerGroup="],
    "queryMsgByKey": ["#Message ID", "#QID", "#Offset"],
    "queryMsgByUniqueKey": ["Topic:", "Keys:", "Queue Offset:", "MessageTrack [consumerGroup="],
    "statsAll": ["#Topic", "#Consumer Group", "#Accumulation", "#InTPS", "#OutTPS", "#InMsg24Hour", "#OutMsg24Hour"],
    "brokerConsumeStats": ["#Topic", "#Group", "#Broker Name", "#QID", "#Broker Offset", "#Consumer Offset",
                           "#Diff", "#LastTime", "Diff Total:"],
    "topicClusterList": ["DefaultCluster"],
    "deleteSubGroup": ["delete subscription group", "success."],
    "deleteTopic": ["delete topic [AdminNewTopic] from cluster [DefaultCluster] success."],
}
#: Never in the output of a command that worked (the broker refused a request code, or a stack trace).
FAILURE_MARKS = ("not supported", "Exception", "\tat org.apache")


def check_output(name: str, result: dict) -> None:
    text = result["text"]
    missing = [s for s in EXPECT[name] if s not in text]
    assert not missing, f"mqadmin {name}: {missing} not in\n{text[-3000:]}"
    bad = [m for m in FAILURE_MARKS if m in text]
    assert not bad, f"mqadmin {name}: {bad} in\n{text[-3000:]}"


@pytest_twisted.ensureDeferred
async def test_mqadmin_commands_against_our_group_and_the_java_namesrv(tmp_path, reactor, capsys):
    """mqadmin (4.9.8) commands of docs/rocketmq.md against our group give the fields a 4.9.8 group gives, without
    an error; brokerStatus shows the messages counted (not requests) and live rates; clusterList's #Hour and
    #SPACE are RocketMQ's arithmetic on our runtime info; our members also register with the real Java
    NameServer, which lists them to mqadmin."""
    from dledger_rocketmq.broker import admin as rmq_admin

    namesrv_port, java_ns_port, *rest = free_ports(5)
    ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
    namesrv, java_ns = f"127.0.0.1:{namesrv_port}", f"127.0.0.1:{java_ns_port}"
    # registrations every 2 s: the Java NameServer (a JVM) is not listening yet when the members first register
    group = broker_group(tmp_path, f"{namesrv};{java_ns}", ports, name="broker-admin",
                         **{"plugins.rocketmq.registerNameServerPeriod": 2000})
    admin = group.client(request_timeout=0.3)
    ns, ns_proc = start_namesrv(reactor, group, tmp_path, namesrv_port)
    jns, jns_proc = start_java_namesrv(reactor, tmp_path, java_ns_port)
    session = start_admin(reactor, group, tmp_path)
    consumer = None
    try:
        await group.start_and_wait(30)
        master = await wait_for_master(group, admin, ports, topic=TOPIC, body=b"warm-up")
        addr = f"127.0.0.1:{ports[master]}"
        await group.wait_for(lambda: route_master(reactor, namesrv_port, TOPIC), 30, "the topic's route")
        # data for the queries: 3 messages with keys (one with a Java-style UNIQ_KEY), a batch of 5, an online
        # consumer and producer (heartbeats on a connection kept open), pulls and a committed offset
        consumer = await connect(reactor, "127.0.0.1", ports[master], timeout=2, producer_group="java_admin_pg")
        uniq = uniq_key(int(reactor.seconds() * 1000) - 10)
        sent = await consumer.send(TOPIC, b"admin-0", tags="TagA", keys="admin-key", queue_id=1,
                                   properties={"UNIQ_KEY": uniq})
        await consumer.send(TOPIC, b"admin-1", keys="admin-key", queue_id=1)
        await consumer.send(TOPIC, b"admin-2", queue_id=1)
        await consumer.send_batch(TOPIC, [b"b%d" % i for i in range(5)], queue_id=2)
        heartbeat = {"clientID": "127.0.0.1@java-admin", "producerDataSet": [{"groupName": "java_admin_pg"}],
                     "consumerDataSet": [{"groupName": GROUP, "consumeType": "CONSUME_PASSIVELY",
                                          "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET",
                                          "unitMode": False, "subscriptionDataSet": [
                                              {"topic": TOPIC, "subString": "*", "tagsSet": [], "codeSet": [],
                                               "subVersion": 1, "classFilterMode": False, "expressionType": "TAG"}]}]}
        header, _ = await consumer.request(34, {}, json.dumps(heartbeat).encode())
        assert header.code == 0, header.remark
        pulled = await consumer.pull(GROUP, TOPIC, 1, 0, 32)
        assert len(pulled.messages) == 3
        await consumer.commit_offset(GROUP, TOPIC, 1, 2)
        await group.wait_for(lambda: cluster_brokers(reactor, java_ns_port), 60,
                             "our brokers registered with the Java NameServer")

        results = {}
        cluster = "DefaultCluster"
        commands = [
            ("clusterList", "-n", namesrv), ("topicList", "-n", namesrv), ("topicRoute", "-n", namesrv, "-t", TOPIC),
            ("updateTopic", "-n", namesrv, "-c", cluster, "-t", "AdminNewTopic", "-r", "2", "-w", "2"),
            ("updateSubGroup", "-n", namesrv, "-c", cluster, "-g", "admin_sg"),
            ("topicStatus", "-n", namesrv, "-t", TOPIC), ("brokerStatus", "-n", namesrv, "-b", addr),
            ("consumerProgress", "-n", namesrv, "-g", GROUP), ("consumerConnection", "-n", namesrv, "-g", GROUP),
            ("producerConnection", "-n", namesrv, "-g", "java_admin_pg", "-t", TOPIC),
            ("queryMsgById", "-n", namesrv, "-i", sent.msg_id), ("queryMsgByKey", "-n", namesrv, "-t", TOPIC,
                                                                  "-k", "admin-key"),
            ("queryMsgByUniqueKey", "-n", namesrv, "-t", TOPIC, "-i", uniq), ("statsAll", "-n", namesrv),
            ("brokerConsumeStats", "-n", namesrv, "-b", addr), ("topicClusterList", "-n", namesrv, "-t", TOPIC),
            ("deleteSubGroup", "-n", namesrv, "-c", cluster, "-g", "admin_sg"),
            ("deleteTopic", "-n", namesrv, "-c", cluster, "-t", "AdminNewTopic"),
        ]
        for args in commands:
            results[args[0]] = await session.ask(*args)
            check_output(args[0], results[args[0]])
        on_java_ns = await session.ask("clusterList", "-n", java_ns)

        # brokerStatus: the 4.9.8 key set; 8 messages put (plus the warm-ups), not the 6 send requests
        status = dict(line.split(":", 1) for line in results["brokerStatus"]["out"].splitlines() if ":" in line)
        status = {k.strip(): v.strip() for k, v in status.items()}  # mqadmin prints "%-32s: %s"
        assert set(rmq_admin.RUNTIME_KEYS) <= set(status), set(rmq_admin.RUNTIME_KEYS) - set(status)
        # The warm-ups stored: wait_for_master sends again after a send it saw fail, which a slow machine's
        # timeout can make after the first was stored (a fresh-clone CI run counted 10); queue 0 holds only them.
        warm_ups = await consumer.max_offset(TOPIC, 0)
        assert warm_ups >= 1
        assert status["putMessageTimesTotal"] == status["msgPutTotalTodayNow"] == str(8 + warm_ups)
        assert status["msgGetTotalTodayNow"] == "3"
        assert "[0~10ms]" in status["putMessageDistributeTime"]
        # clusterList: our broker, #Hour since the first message (minutes ago: 0.00), #SPACE the disk ratio
        line = next(ln for ln in results["clusterList"]["out"].splitlines() if "broker-admin" in ln)
        fields = line.split()
        hour, space = float(fields[-2]), float(fields[-1])
        assert 0.0 <= hour < 0.1 and 0.0 < space < 1.0, line
        # the ratio is RocketMQ's full double (not rounded to 2 places); the disk is shared, so it moves
        assert len(status["commitLogDiskRatio"].split(".")[1]) > 4, status["commitLogDiskRatio"]
        assert space == pytest.approx(float(status["commitLogDiskRatio"]), abs=0.02)
        assert "broker-admin" in on_java_ns["out"], on_java_ns["text"][-2000:]
        # the message track: queryMsgById knows the group that consumed the message
        assert f"MessageTrack [consumerGroup={GROUP}, trackType=CONSUMED" in results["queryMsgById"]["out"]
        assert f"{TOPIC}" in results["statsAll"]["out"] and GROUP in results["statsAll"]["out"]
        with capsys.disabled():
            slowest = max(results.values(), key=lambda r: r["ms"])
            print(f"\nmqadmin against our group: {len(results) + 1} commands in one JVM, slowest "
                  f"{slowest['args'][0]} {slowest['ms']} ms; clusterList line: {' '.join(fields)}")
    finally:
        if consumer is not None:
            consumer.close()
        if not session.ended.called:
            session.proc.closeStdin()
        await group.wait_for(lambda: session.ended.called, 15, "mqadmin to exit") if session.proc else None
        await admin.close()
        await group.stop_all()
        group.close()
        await stop_child(ns, ns_proc)
        await stop_child(jns, jns_proc)
