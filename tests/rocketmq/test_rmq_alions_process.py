"""Real processes and a stock client: ali-ons (JavaScript RocketMQ client) across a master SIGKILL.

A name server (``twistd rocketmq-namesrv``) and a 3-member broker group
(``twistd dledger`` with the broker plugin, registering with that name
server) on 127.0.0.1; the ali-ons producer and push consumer
(``tools/alions/failover.js``, installed by ``make test`` with npm) know only
the name server's address.  The master's process is SIGKILLed while both
run.  Every acknowledged message must be consumed at least once; the test
prints the duplicates and the longest send outage (the gap between two
acknowledged sends around the kill).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import connect
from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master
from twisted.internet import protocol
from twisted.internet.defer import Deferred

from dledger.launcher import TWISTD, LocalGroup, child_env, durable_store, free_ports
from dledger.testing.procs import LogFile as Process

ROOT = Path(__file__).resolve().parent.parent.parent
DRIVER = ROOT / "tools" / "alions" / "failover.js"
NODE = shutil.which("node")
HAS_NAMESRV = importlib.util.find_spec("dledger_rocketmq.namesrv.namesrv") is not None
STORE = durable_store()
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(NODE is None, reason="node is not installed"),
    pytest.mark.skipif(not HAS_NAMESRV, reason="this broker plugin has no name server yet"),
    pytest.mark.skipif(not (DRIVER.parent / "node_modules" / "ali-ons").is_dir(),
                       reason="ali-ons is not installed (make test installs it with npm)"),
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
]

TOPIC = "AlionsTopic"
GROUP = "alions_cg"
BEFORE_KILL = 60
AFTER_KILL = 60


class Lines(protocol.ProcessProtocol):
    """Collects a child's JSON lines from stdout (stderr kept for the failure message)."""

    def __init__(self):
        self.buf = b""
        self.events: list[dict] = []
        self.stderr = b""
        self.ended: Deferred = Deferred()

    def outReceived(self, data: bytes):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        for line in lines:
            if line.strip():
                self.events.append(json.loads(line))

    def errReceived(self, data: bytes):
        self.stderr = (self.stderr + data)[-20000:]

    def processEnded(self, reason):
        self.ended.callback(reason.value.exitCode)

    def of(self, ev: str) -> list[dict]:
        return [e for e in self.events if e["ev"] == ev]




@pytest_twisted.ensureDeferred
async def test_alions_producer_and_push_consumer_across_a_master_kill(tmp_path, reactor, capsys):
    """ali-ons sends and consumes through our name server and brokers; nothing acknowledged is lost on a kill."""
    namesrv_port, *ports = free_ports(4)
    ports = dict(zip(["n0", "n1", "n2"], ports, strict=True))
    namesrv = f"127.0.0.1:{namesrv_port}"
    member_args = broker_port_args(ports)
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=member_args,
                       options={"plugins.rocketmq.enabled": True, "plugins.rocketmq.namesrvAddr": namesrv,
                                "plugins.rocketmq.brokerName": "broker-a"})
    admin = group.client(request_timeout=0.3)
    ns = Process(tmp_path / "namesrv.log")
    ns_proc = reactor.spawnProcess(ns, group.python, [group.python, "-c", TWISTD, "-n", "--pidfile=",
                                                      "rocketmq-namesrv", "--listen",
                                                      f"tcp:{namesrv_port}:interface=127.0.0.1"],
                                   env=child_env(), path=str(tmp_path))
    driver = None
    try:
        await group.start_and_wait(30)

        # The topic exists on the master before ali-ons asks the name server for its route.
        await wait_for_master(group, admin, ports, topic=TOPIC, body=b"warm-up")

        driver = Lines()
        node = reactor.spawnProcess(driver, NODE, [NODE, str(DRIVER), namesrv, TOPIC, GROUP, "--interval", "20",
                                                   "--max-seconds", "150"],
                                    env=child_env(), path=str(DRIVER.parent))
        await group.wait_for(lambda: driver.of("ready") or driver.ended.called, 60, "ali-ons to start")
        assert driver.of("ready"), driver.stderr.decode(errors="replace")[-3000:]
        await group.wait_for(lambda: len(driver.of("sent")) >= BEFORE_KILL, 60, "sends before the kill")
        victim = (await group.wait_for_leader(admin, 10)).leader_id
        sent_before = len(driver.of("sent"))
        routes = await connect(reactor, "127.0.0.1", namesrv_port, timeout=2)

        async def new_master_registered():
            header, body = await routes.request(105, {"topic": TOPIC})
            addrs = json.loads(body)["brokerDatas"][0]["brokerAddrs"] if header.code == 0 else {}
            return addrs.get("0") not in (None, f"127.0.0.1:{ports[victim]}")
        killed_at = reactor.seconds()
        group.kill(victim)
        await group.wait_for(new_master_registered, 30, "the name server to name a new master")
        registered = reactor.seconds() - killed_at
        routes.close()
        await group.wait_exit(victim, 10)
        await group.wait_for(lambda: len(driver.of("sent")) >= sent_before + AFTER_KILL, 90,
                             "sends after the kill")
        node.writeToChild(0, b"stop\n")
        await group.wait_for(lambda: driver.of("stopped"), 30, "the producer to stop")
        acked = {e["body"] for e in driver.of("sent")}

        def all_received():
            return acked <= {e["body"] for e in driver.of("recv")}
        await group.wait_for(all_received, 60, "every acknowledged message to be consumed")
        node.writeToChild(0, b"exit\n")
        await group.wait_for(lambda: driver.ended.called, 30, "ali-ons to exit")

        sent = driver.of("sent")
        times = [e["t"] for e in sent]
        outage = max((b - a for a, b in zip(times, times[1:], strict=False)), default=0) / 1000
        received = [e["body"] for e in driver.of("recv") if e["body"] in acked]
        duplicates = len(received) - len(set(received))
        errors = driver.of("send_error")
        with capsys.disabled():
            print(f"\nali-ons failover (process): {len(sent)} acknowledged sends, {len(errors)} failed sends, "
                  f"longest send outage {outage:.2f}s, new master registered {registered:.2f}s after the kill, "
                  f"{duplicates} duplicate deliveries, "
                  f"killed master {victim}")
        assert acked <= set(received)
    finally:
        if driver is not None and not driver.ended.called:
            node.signalProcess("KILL")
            await driver.ended
        await group.stop_all()
        group.close()
        if not ns.ended.called:
            ns_proc.signalProcess("TERM")
            await ns.ended
