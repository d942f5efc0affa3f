"""``dledger bench rocketmq-java``: the stock RocketMQ 4.9.8 Java producer against RocketMQ and against dledger.

Runs ``tools/rmq_producer_bench/ProducerBench.java`` (``DefaultMQProducer``,
synchronous sends, 1 KiB bodies over 8 queues of one topic) against two
groups on 127.0.0.1, one after the other and alternating which goes first
each round: (a) a real RocketMQ 4.9.8 group in DLedger mode (the Java kit's
``mqnamesrv`` and three ``mqbroker`` with ``enableDLegerCommitLog``) and (b) a
dledger broker group (three ``twistd dledger`` members with the broker plugin
and the plugin's name server).  Durability is compared like for like:
``async`` is RocketMQ ``ASYNC_FLUSH`` against dledger's async flush (page
cache), ``sync`` is ``SYNC_FLUSH`` against dledger's sync flush (fsync before
the answer).  Each workload reports msg/s, p50/p99 send latency, the ratio
dledger / RocketMQ and every member's CPU per message (from /proc, over the
producer's measured window).  Without ``java`` or the kit the benchmark
reports why it skipped and exits 0.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import protocol
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater

from dledger.bench.runner import run_benchmark
from dledger.commands.argtypes import positive_float, positive_int
from dledger.launcher import TWISTD, LocalGroup, child_env, durable_store, free_ports
from dledger_rocketmq.client.client import connect
from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master

ROOT = Path(__file__).resolve().parents[4]
PROGRAM = ROOT / "tools" / "rmq_producer_bench" / "ProducerBench.java"
KIT = Path(os.environ.get("DLEDGER_JAVAKIT", ROOT.parent / "shared" / "javakit"))
TOPIC = "BenchTopic"
GET_ROUTEINFO_BY_TOPIC = 105
#: workload name -> (mode, producer threads, messages per send)
WORKLOADS = {"single16": ("single", 16, 1), "single64": ("single", 64, 1), "batch32": ("batch", 4, 32)}
#: durability name -> (RocketMQ flushDiskType, dledger flush policy)
DURABILITY = {"async": ("ASYNC_FLUSH", "async"), "sync": ("SYNC_FLUSH", "sync")}
PEERS = ("rocketmq", "dledger")
DEFAULT_WORKLOADS, DEFAULT_DURABILITY = ",".join(WORKLOADS), ",".join(DURABILITY)
#: issue #28 target 1: dledger / RocketMQ for single64 and batch32 (async), and with fsync
TARGETS = {"async": 2.0, "sync": 1.5}


@dataclass
class Options:
    duration: float = 10.0
    warmup: float = 3.0
    rounds: int = 1
    workloads: tuple[str, ...] = ("single16", "single64", "batch32")
    durability: tuple[str, ...] = ("async", "sync")
    peers: tuple[str, ...] = PEERS
    size: int = 1024
    queues: int = 8
    store: str | None = None
    kit: Path = KIT
    directory: str | None = None
    keep: bool = False
    json: bool = False


def _choices(text: str, known, what: str) -> tuple[str, ...]:
    chosen = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in chosen if p not in known]
    if unknown or not chosen:
        raise SystemExit(f"dledger bench rocketmq-java: error: unknown {what} {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(known)}")
    return chosen


def register(bench_subparsers) -> None:
    """Add ``dledger bench rocketmq-java`` (called through the ``dledger_bench_subjects`` hook)."""
    p = bench_subparsers.add_parser(
        "rocketmq-java", help="the stock RocketMQ 4.9.8 Java producer against RocketMQ DLedger mode and dledger",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--duration", type=positive_float, default=10.0, help="seconds measured per workload (default 10)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of load before measuring (default 3)")
    p.add_argument("--rounds", type=positive_int, default=1,
                   help="rounds; each runs both peers, the first one alternating (default 1)")
    p.add_argument("--workloads", default=DEFAULT_WORKLOADS,
                   help=f"comma-separated, out of {', '.join(WORKLOADS)} (default all)")
    p.add_argument("--durability", default=DEFAULT_DURABILITY,
                   help="async (page cache: ASYNC_FLUSH vs dledger async) and/or sync (SYNC_FLUSH vs dledger sync)")
    p.add_argument("--peers", default="rocketmq,dledger", help="which groups to run (default rocketmq,dledger)")
    p.add_argument("--store", choices=("mmap", "lmdb"), default=None, help="dledger's store (default: mmap)")
    p.add_argument("--kit", type=Path, default=KIT, help=f"the Java kit (default {KIT}; env DLEDGER_JAVAKIT)")
    p.add_argument("--quick", action="store_true",
                   help="a short check: 1 s per workload after 1 s, one round; single16, batch32, async unless given")
    p.add_argument("--dir", dest="directory", default=None, help="directory for the groups (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the groups' files afterwards")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench_rocketmq_java)


def options_from_args(args) -> Options:
    opts = Options(duration=args.duration, warmup=max(args.warmup, 0.0), rounds=args.rounds,
                   workloads=_choices(args.workloads, WORKLOADS, "workload(s)"),
                   durability=_choices(args.durability, DURABILITY, "durability"),
                   peers=_choices(args.peers, PEERS, "peer(s)"), store=args.store, kit=args.kit,
                   directory=args.directory, keep=args.keep, json=args.json)
    if args.quick:
        opts.duration, opts.warmup, opts.rounds = 1.0, 1.0, 1
        if args.workloads == DEFAULT_WORKLOADS:
            opts.workloads = ("single16", "batch32")
        if args.durability == DEFAULT_DURABILITY:
            opts.durability = ("async",)
    return opts


def cmd_bench_rocketmq_java(args) -> int:
    opts = options_from_args(args)
    return run_benchmark(lambda reactor, say: run(reactor, opts, say), format_results, as_json=opts.json)


def missing_java(kit: Path) -> str | None:
    """Why the benchmark cannot run here (None: it can)."""
    if shutil.which("java") is None:
        return "java is not on PATH"
    for launcher in ("rmq-java", "mqnamesrv", "mqbroker"):
        if not (kit / "bin" / launcher).exists():
            return f"the Java kit is not at {kit} (no bin/{launcher}; set DLEDGER_JAVAKIT or --kit)"
    if not PROGRAM.exists():
        return f"the producer program is missing ({PROGRAM})"
    return None


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0.0 if unknown)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, TypeError):
        return 0.0


def ratios(results: dict) -> dict:
    """dledger msg/s / RocketMQ msg/s per durability and workload, from each round's runs (None if one is missing)."""
    out: dict[str, dict[str, list]] = {}
    for rnd in results.get("rounds", []):
        for dur, peers in rnd.items():
            for wl in (w for w in WORKLOADS if w in peers.get("rocketmq", {}) or w in peers.get("dledger", {})):
                java = peers.get("rocketmq", {}).get(wl, {}).get("msgs_per_s")
                ours = peers.get("dledger", {}).get(wl, {}).get("msgs_per_s")
                out.setdefault(dur, {}).setdefault(wl, []).append(round(ours / java, 2) if java and ours else None)
    return out


# -- processes ---------------------------------------------------------------------------------------
class Child(protocol.ProcessProtocol):
    """A child process whose output goes to a log file; stdout lines to ``on_line`` as well."""

    def __init__(self, log: Path, on_line=None):
        self.log = open(log, "ab")  # closed when the process ends
        self.on_line, self.ended, self.partial = on_line, Deferred(), b""

    def outReceived(self, data: bytes):
        self.log.write(data)
        if self.on_line is not None:
            lines = (self.partial + data).split(b"\n")
            self.partial = lines.pop()
            for line in lines:
                self.on_line(line.decode("utf-8", "replace"))

    def errReceived(self, data: bytes):
        self.log.write(data)

    def processEnded(self, reason):
        self.log.close()
        self.ended.callback(reason.value.exitCode)


async def stop_child(reactor, child: Child, proc, timeout: float = 20.0) -> None:
    if child.ended.called:
        return
    for sig in ("TERM", "KILL"):
        try:
            proc.signalProcess(sig)
        except Exception:  # already gone
            return
        waited = 0.0
        while not child.ended.called and waited < timeout:
            await deferLater(reactor, 0.1, lambda: None)
            waited += 0.1
        if child.ended.called:
            return


def broker_ports() -> tuple[int, int]:
    """A RocketMQ listenPort whose neighbours (VIP channel -2, HA +1) are free too, and a DLedger port."""
    for _ in range(50):
        [port, dledger] = free_ports(2)
        try:
            for p in (port - 2, port + 1):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", p))
            return port, dledger
        except OSError:
            continue
    raise RuntimeError("no free RocketMQ port triple on 127.0.0.1")


async def _until(reactor, check, timeout: float, what: str, interval: float = 0.25):
    waited = 0.0
    while waited < timeout:
        got = await check()
        if got:
            return got
        await deferLater(reactor, interval, lambda: None)
        waited += interval
    raise TimeoutError(f"dledger bench rocketmq-java: no {what} within {timeout:g} s")


async def route_master_port(reactor, namesrv_port: int, topic: str, queues: int) -> int | None:
    """The master's port the name server gives for ``topic`` once it has ``queues`` write queues (else None)."""
    try:
        c = await connect(reactor, "127.0.0.1", namesrv_port, timeout=2)
    except Exception:
        return None
    try:
        header, body = await c.request(GET_ROUTEINFO_BY_TOPIC, {"topic": topic})
        if header.code != 0:
            return None
        route = json.loads(body)
        if sum(q.get("writeQueueNums", 0) for q in route.get("queueDatas", [])) < queues:
            return None
        addr = route["brokerDatas"][0]["brokerAddrs"].get("0")
        return int(addr.rsplit(":", 1)[1]) if addr else None
    except Exception:
        return None
    finally:
        c.close()


async def _takes_send(reactor, port: int, queues: int) -> bool:
    try:
        c = await connect(reactor, "127.0.0.1", port, timeout=2, default_topic_queue_nums=queues)
    except Exception:
        return False
    try:
        await c.send(TOPIC, b"warm-up", queue_id=0)
        return True
    except Exception:
        return False
    finally:
        c.close()


class JavaGroup:
    """RocketMQ 4.9.8: mqnamesrv and 3 mqbroker in DLedger mode (the kit's examples/broker-n0.conf)."""

    name = "rocketmq"

    def __init__(self, reactor, base: Path, kit: Path, flush_disk_type: str, queues: int):
        self.reactor, self.base, self.kit, self.flush, self.queues = reactor, base, kit, flush_disk_type, queues
        self.children: list[tuple[Child, Any]] = []
        self.pids: dict[str, int] = {}
        self.ports: dict[str, int] = {}
        self.master: str | None = None
        self.env = child_env({"RMQ_LOG_ROOT": str(base / "rmq-logs")})

    def _spawn(self, name: str, launcher: str, conf: Path) -> None:
        exe = str(self.kit / "bin" / launcher)
        child = Child(self.base / f"{name}.log")
        proc = self.reactor.spawnProcess(child, exe, [exe, "-c", str(conf)], env=self.env, path=str(self.base))
        self.children.append((child, proc))
        self.pids[name] = proc.pid

    async def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        [self.namesrv_port] = free_ports(1)
        conf = self.base / "namesrv.properties"
        conf.write_text(f"listenPort={self.namesrv_port}\n")
        self._spawn("namesrv", "mqnamesrv", conf)
        pairs = [broker_ports() for _ in range(3)]
        peers = ";".join(f"n{i}-127.0.0.1:{d}" for i, (_, d) in enumerate(pairs))
        for i, (port, _) in enumerate(pairs):
            store = self.base / f"n{i}"
            conf = self.base / f"broker-n{i}.conf"
            conf.write_text("\n".join([
                "brokerClusterName=RaftCluster", "brokerName=RaftNode00", f"listenPort={port}",
                f"namesrvAddr=127.0.0.1:{self.namesrv_port}", f"storePathRootDir={store}",
                f"storePathCommitLog={store}/commitlog", "enableDLegerCommitLog=true", "dLegerGroup=RaftNode00",
                f"dLegerPeers={peers}", f"dLegerSelfId=n{i}", "sendMessageThreadPoolNums=4",
                "autoCreateTopicEnable=true", f"flushDiskType={self.flush}", "mappedFileSizeCommitLog=134217728",
                "mappedFileSizeConsumeQueue=600000", "brokerIP1=127.0.0.1", "brokerIP2=127.0.0.1",
                "registerNameServerPeriod=5000", ""]))
            self.ports[f"n{i}"] = port
            self._spawn(f"n{i}", "mqbroker", conf)

        async def a_master():
            for mid, port in self.ports.items():
                if await _takes_send(self.reactor, port, self.queues):
                    return mid
            return None
        self.master = await _until(self.reactor, a_master, 120, "RocketMQ master taking a send")
        await _until(self.reactor, lambda: route_master_port(self.reactor, self.namesrv_port, TOPIC, self.queues),
                     60, "route with the topic's queues on the Java name server")

    def member_pids(self) -> dict[str, int]:
        return {mid: self.pids[mid] for mid in self.ports}

    async def stop(self) -> None:
        for child, proc in reversed(self.children):
            await stop_child(self.reactor, child, proc)


class DLedgerGroup:
    """3 ``twistd dledger`` members with the broker plugin, and the plugin's name server."""

    name = "dledger"

    def __init__(self, reactor, base: Path, store: str, flush: str, queues: int):
        self.reactor, self.base, self.store, self.flush, self.queues = reactor, base, store, flush, queues
        self.group: LocalGroup | None = None
        self.namesrv: tuple[Child, Any] | None = None
        self.master: str | None = None

    async def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        self.namesrv_port, *rest = free_ports(4)
        ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
        child = Child(self.base / "namesrv.log")
        proc = self.reactor.spawnProcess(child, sys.executable, [
            sys.executable, "-c", TWISTD, "-n", "--pidfile=", "rocketmq-namesrv", "--listen",
            f"tcp:{self.namesrv_port}:interface=127.0.0.1"], env=child_env(), path=str(self.base))
        self.namesrv = (child, proc)
        self.group = LocalGroup(self.base, n=3, store=self.store, preset="default", flush_policy=self.flush,
                                reactor=self.reactor, member_args=broker_port_args(ports),
                                options={"plugins.rocketmq.enabled": True,
                                         "plugins.rocketmq.namesrvAddr": f"127.0.0.1:{self.namesrv_port}",
                                         "plugins.rocketmq.brokerName": "broker-bench",
                                         "plugins.rocketmq.registerNameServerPeriod": 5000})
        await self.group.start_and_wait(60)
        admin = self.group.client(request_timeout=0.5)
        try:
            self.master = await wait_for_master(self.group, admin, ports, topic=TOPIC, timeout=60,
                                                queues=self.queues)
        finally:
            await admin.close()
        await _until(self.reactor, lambda: route_master_port(self.reactor, self.namesrv_port, TOPIC, self.queues),
                     60, "route with the topic's queues on the plugin's name server")

    def member_pids(self) -> dict[str, int]:
        return {mid: self.group.members[mid].pid for mid in self.group.ids} if self.group else {}

    async def stop(self) -> None:
        if self.group is not None:
            await self.group.stop_all()
            self.group.close()
        if self.namesrv is not None:
            await stop_child(self.reactor, *self.namesrv)


async def run_producer(reactor, opts: Options, base: Path, namesrv_port: int, workload: str,
                       pids: dict[str, int]) -> dict:
    """One ProducerBench run; its JSON line plus every member's CPU per message over the measured window."""
    mode, threads, batch = WORKLOADS[workload]
    marks: dict[str, dict[str, float]] = {}
    result: list[dict] = []

    def on_line(line: str) -> None:
        line = line.strip()
        if line in ("window-start", "window-end"):
            marks[line] = {mid: cpu_seconds(pid) for mid, pid in pids.items()}
        elif line.startswith("{"):
            result.append(json.loads(line))

    exe = str(opts.kit / "bin" / "rmq-java")
    log = base / f"producer-{workload}.log"
    child = Child(log, on_line)
    env = child_env({"RMQ_LOG_ROOT": str(base / "rmq-logs"), "RMQ_HEAP": "-Xms256m -Xmx512m"})
    proc = reactor.spawnProcess(child, exe, [
        exe, str(PROGRAM), "--namesrv", f"127.0.0.1:{namesrv_port}", "--topic", TOPIC, "--mode", mode,
        "--threads", str(threads), "--batch", str(batch), "--size", str(opts.size), "--queues", str(opts.queues),
        "--warmup", f"{opts.warmup:g}", "--duration", f"{opts.duration:g}"], env=env, path=str(base))
    limit = opts.warmup + opts.duration + 120
    waited = 0.0
    while not child.ended.called and waited < limit:
        await deferLater(reactor, 0.2, lambda: None)
        waited += 0.2
    if not child.ended.called:
        await stop_child(reactor, child, proc)
    code = await child.ended
    if not result:
        tail = log.read_text(errors="replace")[-400:].strip().replace("\n", " | ")
        return {"error": f"ProducerBench exit {code}: {tail}"}
    r = result[0]
    start, end = marks.get("window-start"), marks.get("window-end")
    if start and end and r.get("messages"):
        r["cpu_us_per_msg"] = {mid: round((end[mid] - start[mid]) * 1e6 / r["messages"], 1) for mid in pids}
    return r


async def run(reactor: Any, opts: Options, say) -> dict:
    """Every round: for each durability, each peer's group started, every workload run, the group stopped."""
    results: dict[str, Any] = {"settings": {"size": opts.size, "queues": opts.queues, "duration": opts.duration,
                                            "warmup": opts.warmup, "workloads": list(opts.workloads),
                                            "durability": list(opts.durability), "peers": list(opts.peers),
                                            "rounds": opts.rounds, "load": os.getloadavg()[0]}}
    why = missing_java(opts.kit)
    if why:
        say(f"skipped: {why}")
        results["skipped"] = why
        return results
    store = opts.store or durable_store() or "mmap"
    results["settings"]["store"] = store
    base = Path(opts.directory) if opts.directory else Path(tempfile.mkdtemp(prefix="dledger-bench-rmq-java-"))
    results["rounds"] = []
    try:
        for rnd in range(opts.rounds):
            round_results: dict[str, dict] = {}
            results["rounds"].append(round_results)
            peers = opts.peers if rnd % 2 == 0 else tuple(reversed(opts.peers))
            for dur in opts.durability:
                java_flush, our_flush = DURABILITY[dur]
                for peer in peers:
                    where = base / f"r{rnd}-{dur}-{peer}"
                    group: Any = (JavaGroup(reactor, where, opts.kit, java_flush, opts.queues) if peer == "rocketmq"
                                  else DLedgerGroup(reactor, where, store, our_flush, opts.queues))
                    say(f"round {rnd + 1}, {dur}: starting the {peer} group in {where}")
                    per_peer: dict[str, Any] = {}
                    round_results.setdefault(dur, {})[peer] = per_peer
                    try:
                        await group.start()
                        per_peer["master"] = group.master
                        for wl in opts.workloads:
                            load = os.getloadavg()[0]
                            r = await run_producer(reactor, opts, where, group.namesrv_port, wl, group.member_pids())
                            r["load"] = round(load, 2)
                            per_peer[wl] = r
                            say(f"{peer} {dur} {wl}: {r.get('msgs_per_s', 0):,} msg/s, p50 {r.get('p50_ms')} ms, "
                                f"p99 {r.get('p99_ms')} ms, master CPU "
                                f"{r.get('cpu_us_per_msg', {}).get(group.master)} us/msg {r.get('error', '')}")
                    except TimeoutError as e:
                        per_peer["error"] = str(e)
                        say(str(e))
                    finally:
                        await group.stop()
        results["ratios"] = ratios(results)
        return results
    finally:
        if not (opts.keep or opts.directory):
            shutil.rmtree(base, ignore_errors=True)


def format_results(r: dict) -> str:
    s = r["settings"]
    if "skipped" in r:
        return f"dledger bench rocketmq-java: skipped: {r['skipped']}"
    lines = [f"dledger bench rocketmq-java: stock RocketMQ 4.9.8 producer, {s['size']} B over {s['queues']} queues, "
             f"{s['duration']:g} s after {s['warmup']:g} s; dledger store {s.get('store')}; load at start "
             f"{s['load']:.2f}"]
    for i, rnd in enumerate(r.get("rounds", [])):
        for dur, peers in rnd.items():
            lines.append(f"  round {i + 1}, durability {dur} ({DURABILITY[dur][0]} vs dledger {DURABILITY[dur][1]}):")
            for peer, per in peers.items():
                if "error" in per:
                    lines.append(f"    {peer:9} {per['error']}")
                for wl in s["workloads"]:
                    w = per.get(wl)
                    if not w:
                        continue
                    if "error" in w:
                        lines.append(f"    {peer:9} {wl:9} {w['error']}")
                        continue
                    cpu = ", ".join(f"{m}{'*' if m == per.get('master') else ''} {v:g}"
                                    for m, v in w.get("cpu_us_per_msg", {}).items())
                    lines.append(f"    {peer:9} {wl:9} {w['msgs_per_s']:>8,} msg/s  p50 {w['p50_ms']:.2f} ms  "
                                 f"p99 {w['p99_ms']:.2f} ms  errors {w['errors']}  CPU us/msg (*master) {cpu}  "
                                 f"load {w.get('load')}")
    for dur, per in r.get("ratios", {}).items():
        for wl, values in per.items():
            target = f"  (target >= {TARGETS[dur]:g} for single64, batch32)" if wl != "single16" else ""
            lines.append(f"  ratio dledger/RocketMQ {dur} {wl}: {', '.join(str(v) for v in values)}{target}")
    return "\n".join(lines)
