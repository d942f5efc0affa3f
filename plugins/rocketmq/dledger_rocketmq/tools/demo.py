"""``make demo-rocketmq``: a name server and two 3-member broker groups as real twistd processes on 127.0.0.1.

What it shows: both groups (broker-a, broker-b, one cluster) register with
the name server; the route-aware client (:class:`~dledger_rocketmq.client.client.RouteClient`)
spreads sends over both groups' queues and pulls them all back; then
broker-a's master is killed (SIGKILL): the name server drops it at once,
the group elects a new leader, the new master registers as brokerId 0, and
sends and pulls go on through the new route.  Every process it starts is
stopped at the end (and killed if it does not stop).  Exit status 0 when
every message sent was read back exactly once, 1 otherwise.

    python -m dledger_rocketmq.tools.demo [--dir DIR] [--messages N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from twisted.internet import defer, task

from dledger_rocketmq.client.client import RocketMQError, RouteClient, connect, message_queues, route_masters
from dledger_rocketmq.common import fastjson

#: twistd with this interpreter (so the children import the same packages as this process).
TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; sys.exit(run())"
CLUSTER = "DemoCluster"
GROUPS = ("broker-a", "broker-b")
TOPIC = "DemoTopic"


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports of 127.0.0.1 that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class Processes:
    """The demo's child processes (each in its own session, so a kill reaches its whole group)."""

    def __init__(self, base: Path):
        self.base = base
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, argv: list[str]) -> None:
        with (self.base / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen([sys.executable, "-c", TWISTD, "-n", "--pidfile=", *argv],
                                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                                cwd=self.base, start_new_session=True)

    def signal(self, name: str, sig: int) -> None:
        p = self.procs.get(name)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        p = self.procs.get(name)
        if p is not None:
            p.wait(10)

    async def stop_all(self, reactor: Any, timeout: float = 20.0) -> None:
        for name in self.procs:
            self.signal(name, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while any(p.poll() is None for p in self.procs.values()) and time.monotonic() < deadline:
            await task.deferLater(reactor, 0.1, lambda: None)
        for name in self.procs:
            self.kill(name)


def member_config(base: Path, group: str, peers: str, namesrv: str) -> Path:
    """The TOML file the three members of ``group`` share (per-member options go on the command line)."""
    path = base / f"{group}.toml"
    path.write_text(f'preset = "fast"\ngroup = "{group}"\npeers = "{peers}"\nstoreType = "mmap"\n'
                    f'storeBaseDir = "{base / group}"\nmappedFileSizeForEntryData = {64 << 20}\n'
                    f'mappedFileSizeForEntryIndex = {32 * (256 << 10)}\n\n[plugins.rocketmq]\nenabled = true\n'
                    f'brokerName = "{group}"\nbrokerClusterName = "{CLUSTER}"\nnamesrvAddr = "{namesrv}"\n'
                    f'mappedFileSizeConsumeQueue = 6000\n', encoding="utf-8")
    return path


async def cluster_info(reactor: Any, namesrv: str) -> dict[str, Any] | None:
    """GET_BROKER_CLUSTER_INFO from the name server (None if it does not answer)."""
    host, _, port = namesrv.rpartition(":")
    try:
        c = await connect(reactor, host, int(port), timeout=2.0)
    except Exception:
        return None
    try:
        header, body = await c.request(106, {})
        return fastjson.loads(body) if header.code == 0 else None
    except (RocketMQError, ValueError):
        return None
    finally:
        c.close()


def masters(info: dict[str, Any] | None) -> dict[str, str]:
    """brokerName -> master address in a ClusterInfo."""
    out = {}
    for name, data in ((info or {}).get("brokerAddrTable") or {}).items():
        addr = (data.get("brokerAddrs") or {}).get("0")
        if addr:
            out[name] = addr
    return out


async def wait_for(reactor: Any, what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await task.deferLater(reactor, 0.2, lambda: None)


async def read_all(rc: RouteClient, group: str) -> list[bytes]:
    """Every message of TOPIC in every group's read queues, from offset 0."""
    route = await rc.route(TOPIC, fresh=True)
    bodies = []
    for name, queue_id in message_queues(route, write=False):
        offset = 0
        while True:
            p = await rc.pull(group, TOPIC, name, queue_id, offset, 32)
            if not p.messages:
                break
            bodies += [m.body for m in p.messages]
            offset = p.next_begin_offset
    return bodies


async def run(reactor: Any, args: argparse.Namespace) -> int:
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dledger-rocketmq-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    procs = Processes(base)
    ports = free_ports(1 + 6 * len(GROUPS))
    namesrv = f"127.0.0.1:{ports[0]}"
    broker_ports: dict[str, str] = {}  # broker address -> process name
    rc = None
    try:
        print(f"demo directory {base}; name server on {namesrv}")
        procs.start("namesrv", ["--logfile", str(base / "namesrv.twistd.log"), "rocketmq-namesrv", "--listen",
                                f"tcp:{ports[0]}:interface=127.0.0.1"])
        for g, group in enumerate(GROUPS):
            raft = ports[1 + 6 * g:4 + 6 * g]
            rmq = ports[4 + 6 * g:7 + 6 * g]
            peers = ";".join(f"n{k}-127.0.0.1:{p}" for k, p in enumerate(raft))
            config = member_config(base, group, peers, namesrv)
            for k in range(3):
                name = f"{group}-n{k}"
                broker_ports[f"127.0.0.1:{rmq[k]}"] = name
                procs.start(name, ["--logfile", str(base / f"{name}.twistd.log"), "dledger", "--config", str(config),
                                   "--id", f"n{k}", "--plugin-opt", f"rocketmq.listen=tcp:{rmq[k]}:interface=127.0.0.1",
                                   "--plugin-opt", f"rocketmq.storeHost=127.0.0.1:{rmq[k]}"])
            print(f"{group}: members n0..n2 (raft ports {raft}, broker ports {rmq})")

        async def both_masters():
            found = masters(await cluster_info(reactor, namesrv))
            return found if set(found) == set(GROUPS) else None
        found = await wait_for(reactor, "a master in both groups", both_masters, 90)
        for group in GROUPS:
            print(f"name server: {group} master {found[group]} ({broker_ports[found[group]]})")
        rc = RouteClient(reactor, namesrv, timeout=5.0)
        for group in GROUPS:  # the first send to each group creates the topic there (from TBW102)
            await rc.send(TOPIC, f"hello {group}".encode(), broker_name=group)

        async def routed_on_both():
            try:
                route = await rc.route(TOPIC, fresh=True)
            except RocketMQError:
                return None
            return route if set(route_masters(route)) == set(GROUPS) and len(route["queueDatas"]) == 2 else None
        await wait_for(reactor, f"{TOPIC}'s route on both groups", routed_on_both, 30)
        sent = [f"hello {g}".encode() for g in GROUPS]

        async def send_and_read_back(prefix: str, what: str, pulled: str) -> bool:
            """Send ``args.messages`` bodies spread over the groups; read everything back; equal to all sent?"""
            spread: dict[str, int] = {}
            for i in range(args.messages):
                r = await rc.send(TOPIC, f"{prefix}{i}".encode())
                sent.append(f"{prefix}{i}".encode())
                spread[r.broker_name] = spread.get(r.broker_name, 0) + 1
            print(f"sent {args.messages} {what}: {spread}")
            got = await read_all(rc, "demo_cg")
            print(f"pulled {len(got)} messages {pulled}")
            if sorted(got) != sorted(sent):
                print("error: the messages pulled are not the messages sent", file=sys.stderr)
                return False
            return True
        if not await send_and_read_back("m", "messages", "from both groups"):
            return 1
        old = found["broker-a"]
        print(f"kill -9 broker-a's master {broker_ports[old]} ({old})")
        killed_at = time.monotonic()
        procs.kill(broker_ports[old])

        async def new_master():
            m = masters(await cluster_info(reactor, namesrv)).get("broker-a")
            return m if m and m != old else None
        new = await wait_for(reactor, "broker-a's new master", new_master, 60)
        print(f"name server: broker-a master {new} ({broker_ports[new]}) after {time.monotonic() - killed_at:.1f} s")
        if not await send_and_read_back("after", "more", "in all"):
            return 1
        print("ok: every message sent was read back once, across the failover")
        return 0
    except (TimeoutError, RocketMQError, OSError) as exc:
        print(f"error: {exc} (logs in {base})", file=sys.stderr)
        return 1
    finally:
        if rc is not None:
            rc.close()
        await procs.stop_all(reactor)
        print("stopped every process")
        if not args.dir and not args.keep:
            shutil.rmtree(base, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dledger_rocketmq.tools.demo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", help="working directory (default: a temporary one, removed at the end)")
    parser.add_argument("--messages", type=int, default=20, help="messages to send before and after the kill")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (logs, stores)")
    args = parser.parse_args(argv)
    if args.messages < 1:
        parser.error(f"--messages must be at least 1, got {args.messages}")
    status: list[int] = []

    def go(reactor: Any) -> defer.Deferred:
        return defer.ensureDeferred(run(reactor, args)).addCallback(status.append)
    try:
        task.react(go)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return int(exc.code)
    return status[0] if status else 1


if __name__ == "__main__":
    sys.exit(main())
