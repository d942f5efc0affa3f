"""One nemesis run: namespaces, members, a workload, a seeded fault schedule, the verdict.

:func:`run_in_process` is the whole run inside the calling process (``python -m dledger.testing.nemesis run``
calls it): build the namespaces, move this process into the clients' namespace, start the members, run the
workload while the schedule injects faults, heal everything, let the workload go on for a quiet period, wait
until the group converges, stop the members, read their stores back and check. Whatever happens -- an
exception, SIGTERM, Ctrl-C -- the ``finally`` kills every process it started and deletes every namespace.

The result (``result.json`` in the run's directory) holds the counts per fault kind the summary table is made
of; a failing run also keeps ``history.jsonl`` / ``events.jsonl``, ``schedule.json`` and every member's log.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from dledger.testing.nemesis import faults as F
from dledger.testing.nemesis.members import Processes, faketime_lib
from dledger.testing.nemesis.net import NetNS, enter

PORT = 20911
BROKER_PORT = 10911
NAMESRV_PORT = 9876
GROUP = "g0"


@dataclass
class RunSpec:
    workload: str = "log"  # log | broker | kv
    seed: int = 1
    seconds: float = 20.0
    members: int = 3
    clients: int = 4
    kinds: str | None = None  # comma-separated fault kinds, None: every available one
    mutation: str | None = None
    out: str | None = None  # where a failing run's files are kept (and result.json)
    tag: str | None = None
    quiet: float = 3.0
    keep: bool = False  # keep the run's files even when it passes
    #: How long the healed group has to converge before the run is "stuck". A broken build may never converge
    #: (divergent logs): a mutant run that only needs the verdict passes a few seconds.
    converge: float = 60.0


@dataclass
class KindStats:
    injected: int = 0
    ops: int = 0
    failed: int = 0
    timeouts: int = 0


@dataclass
class RunResult:
    workload: str
    seed: int
    mutation: str | None
    ops: int = 0
    ok: int = 0
    failed: int = 0
    timeouts: int = 0
    faults: int = 0
    anomalies: list[str] = field(default_factory=list)
    stuck: str | None = None
    kinds: dict[str, dict] = field(default_factory=dict)
    windows: list[tuple[str, float, float]] = field(default_factory=list)
    dir: str | None = None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return not self.anomalies and self.stuck is None


def default_tag() -> str:
    import os
    return f"nm{os.getpid() % 100000}{random.randrange(100):02d}"


class Nemesis:
    """Applies schedule actions to the processes and the network, remembering what is to be undone."""

    def __init__(self, run: Run, rng: random.Random):
        self.run, self.rng = run, rng
        self.net_cuts: set[tuple[str, str]] = set()
        self.stopped: list[str] = []
        self.killed: list[str] = []
        self.skewed: set[str] = set()
        self.drifting: dict[str, Any] = {}

    async def target(self, who: Any) -> str | None:
        ids = self.run.ids
        leader = await self.run.leader()
        if leader is None and who in ("leader", "follower"):  # mid-election: give it a moment
            try:
                leader = await self.run.wait_for(self.run.leader, 2.0, "a leader", interval=0.1)
            except TimeoutError:
                leader = None
        if who == "leader":
            return leader
        if who == "follower":
            others = [m for m in ids if m != leader and m not in self.killed and m not in self.stopped]
            return self.rng.choice(others) if others else None
        if isinstance(who, tuple) and who[0] == "leader-of":
            return leader if leader in who[1] else self.rng.choice(list(who[1]))
        return self.rng.choice(ids)

    async def apply(self, action: F.Action) -> str:
        op, args = action.op, action.args
        procs, ids = self.run.procs, self.run.ids
        if op == "cut":
            shape = args[0]
            if shape == "isolate":
                m = await self.target(args[1]) or self.rng.choice(ids)
                cuts = F.split_cuts([m], [o for o in ids if o != m])
                what = f"isolate {m}"
            elif shape == "split":
                cuts, what = F.split_cuts(list(args[1]), list(args[2])), f"split {args[1]} | {args[2]}"
            elif shape == "ring":
                cuts, what = F.ring_cuts(list(args[1])), f"ring {args[1]}"
            else:
                m = await self.target(args[1]) or self.rng.choice(ids)
                cuts = F.oneway_cuts(m, [o for o in ids if o != m], args[2])
                what = f"one-way {'from' if args[2] else 'to'} {m}"
            self.net_cuts = cuts
            self.run.net.set_cuts(self.run.extra_cuts(cuts))
            return what
        if op == "heal":
            self.net_cuts = set()
            self.run.net.set_cuts(set())
            return "heal"
        if op == "stop":
            m = await self.target(args[0])
            if m is None or not procs.running(m):
                return "stop: no target"
            procs.pause(m)
            self.stopped.append(m)
            return f"SIGSTOP {m}"
        if op == "cont":
            done = [m for m in self.stopped]
            for m in done:
                procs.resume(m)
            self.stopped.clear()
            return f"SIGCONT {' '.join(done)}"
        if op == "kill":
            m = await self.target(args if args[0] == "leader-of" else args[0])
            if m is None or m in self.killed:
                return "kill: no target"
            procs.kill(m)
            self.killed.append(m)
            return f"SIGKILL {m}"
        if op == "restart":
            done = list(self.killed)
            for m in done:
                procs.start(m)
            self.killed.clear()
            return f"restart {' '.join(done)}"
        if op == "clock":
            m = await self.target(args[0]) or self.rng.choice(ids)
            procs.set_clock(m, args[1])
            self.skewed.add(m)
            return f"clock {m} {args[1]:+g}s"
        if op == "drift":
            m = await self.target(args[0]) or self.rng.choice(ids)
            self.skewed.add(m)
            self.drifting[m] = args[1]
            return f"drift {m} {args[1]:+g}s/s"
        if op == "clock-reset":
            for m in self.skewed:
                procs.set_clock(m, 0.0)
            self.skewed.clear()
            self.drifting.clear()
            return "clocks reset"
        raise ValueError(f"unknown action {op!r}")

    def drift_tick(self) -> None:
        for m, rate in self.drifting.items():
            self.run.procs.set_clock(m, self.run.procs.offsets.get(m, 0.0) + rate)

    def heal_all(self) -> None:
        self.net_cuts = set()
        self.run.net.set_cuts(set())
        for m in self.stopped:
            self.run.procs.resume(m)
        self.stopped.clear()
        for m in self.killed:
            self.run.procs.start(m)
        self.killed.clear()
        for m in list(self.skewed):
            self.run.procs.set_clock(m, 0.0)
        self.skewed.clear()
        self.drifting.clear()


class Run:
    """The state of one run (built by :func:`run_in_process`)."""

    def __init__(self, spec: RunSpec, base: Path, reactor: Any):
        self.spec, self.base, self.reactor = spec, base, reactor
        self.ids = [f"n{i}" for i in range(spec.members)]
        extra = ["namesrv"] if spec.workload == "broker" else []
        self.net = NetNS(spec.tag, self.ids + extra + ["client"])
        self.procs: Processes | None = None
        self.log: list[str] = []
        self.admin = None
        self.committed: dict[str, dict[int, bytes]] = {}
        self.workload_result: Any = None
        self.t0 = 0.0

    def extra_cuts(self, cuts: set[tuple[str, str]]) -> set[tuple[str, str]]:
        return cuts

    def note(self, text: str) -> None:
        line = f"{time.strftime('%H:%M:%S')} {self.reactor.seconds() - self.t0:8.3f} {text}"
        self.log.append(line)

    async def metadata(self, mid: str):
        from dledger.errors import DLedgerError
        from dledger.messages import MetadataRequest
        try:
            return await self.admin.transport.send(mid, MetadataRequest(group=GROUP, remote_id=mid, detail=True),
                                                   timeout=0.5)
        except DLedgerError:
            return None

    async def leader(self) -> str | None:
        """The member that says it leads in the highest term (paused or killed ones are not asked)."""
        best = None
        for mid in self.ids:
            if not self.procs.running(mid) or mid in self.procs.paused:
                continue
            meta = await self.metadata(mid)
            if meta is not None and meta.role == "LEADER" and (best is None or meta.term > best[0]):
                best = (meta.term, mid)
        return best[1] if best else None

    async def wait_for(self, condition, timeout: float, what: str, interval: float = 0.1):
        from twisted.internet.task import deferLater
        deadline = self.reactor.seconds() + timeout
        while True:
            value = await condition()
            if value:
                return value
            if self.reactor.seconds() >= deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            await deferLater(self.reactor, interval, lambda: None)

    async def converged(self):
        metas = [await self.metadata(mid) for mid in self.ids]
        if any(m is None for m in metas):
            return None
        ends = {(m.ledger_end_index, m.committed_index, m.term, m.leader_id) for m in metas}
        return metas if len(ends) == 1 and metas[0].ledger_end_index == metas[0].committed_index else None


def member_config(base: Path, run: Run, broker: bool) -> Path:
    peers = ";".join(f"{mid}-{run.net.addrs[mid]}:{PORT}" for mid in run.ids)
    # Timers between the "fast" preset's (a leader given up after 0.3 s: on a loaded 2-core machine the group
    # re-elected without any fault) and the default's (6 s: a fault of a few seconds would not be noticed).
    text = (f'preset = "fast"\ngroup = "{GROUP}"\npeers = "{peers}"\nstoreType = "mmap"\n'
            'heartBeatTimeIntervalMs = 250\nmaxHeartBeatLeak = 3\nminVoteIntervalMs = 100\nmaxVoteIntervalMs = 400\n'
            'maxWaitAckTimeMs = 2500\nmaxPushTimeOutMs = 1000\n'
            f'storeBaseDir = "{base}"\nflushPolicy = "sync"\nmappedFileSizeForEntryData = {64 << 20}\n'
            f'mappedFileSizeForEntryIndex = {32 * (256 << 10)}\n')
    if broker:
        text += (f'\n[plugins.rocketmq]\nenabled = true\nbrokerName = "broker-a"\nbrokerClusterName = "Nemesis"\n'
                 f'namesrvAddr = "{run.net.addrs["namesrv"]}:{NAMESRV_PORT}"\nmappedFileSizeConsumeQueue = 6000\n')
    path = base / "dledger.toml"
    path.write_text(text, encoding="utf-8")
    return path


async def _main(reactor: Any, spec: RunSpec, run: Run, result: RunResult) -> None:
    from twisted.internet.task import deferLater

    from dledger.client import connect

    base = run.base
    broker = spec.workload == "broker"
    config = member_config(base, run, broker)
    procs = run.procs
    for mid in run.ids:
        args = ["dledger", "--config", str(config), "--id", mid]
        if spec.workload == "kv":
            args += ["--plugin-opt", "kv.enabled=true"]
        if broker:
            addr = run.net.addrs[mid]
            args += ["--plugin-opt", f"rocketmq.listen=tcp:{BROKER_PORT}:interface={addr}",
                     "--plugin-opt", f"rocketmq.storeHost={addr}:{BROKER_PORT}"]
        procs.define(mid, mid, args)
    if broker:
        procs.define("namesrv", "namesrv", ["rocketmq-namesrv", "--listen",
                                            f"tcp:{NAMESRV_PORT}:interface={run.net.addrs['namesrv']}"], mutate=False)
        procs.start("namesrv")
    for mid in run.ids:
        procs.start(mid)
    peers = ";".join(f"{mid}-{run.net.addrs[mid]}:{PORT}" for mid in run.ids)
    run.admin = connect(peers, GROUP, reactor=reactor, request_timeout=0.5)
    run.t0 = reactor.seconds()
    await run.wait_for(run.leader, 60, "a leader")
    run.note(f"leader {await run.leader()}")

    if broker:
        from dledger.testing.nemesis.brokerload import BrokerWorkload
        workload = BrokerWorkload(run, random.Random(spec.seed * 7919 + 1), spec.clients)
    elif spec.workload == "kv":
        from dledger.testing.nemesis.kvload import KVWorkload
        workload = KVWorkload(run, peers, random.Random(spec.seed * 7919 + 1), spec.clients)
    else:
        from dledger.testing.nemesis.logload import LogWorkload
        workload = LogWorkload(run, peers, random.Random(spec.seed * 7919 + 1), spec.clients)
    await workload.start()

    clock = faketime_lib() is not None
    kinds = F.parse_kinds(spec.kinds, F.available_kinds(spec.members, clock))
    steps = F.schedule(spec.seed, spec.seconds, run.ids, kinds)
    (base / "schedule.json").write_text(json.dumps([asdict(s) for s in steps], indent=1), encoding="utf-8")
    nemesis = Nemesis(run, random.Random(spec.seed * 104729 + 3))
    start = reactor.seconds()

    async def at(t: float) -> None:
        while reactor.seconds() - start < t:
            await deferLater(reactor, min(0.25, t - (reactor.seconds() - start)), lambda: None)
            if nemesis.drifting:
                nemesis.drift_tick()

    for step in steps:
        t_begin, applied = None, False
        for action in sorted(step.actions, key=lambda a: a.at):
            await at(step.start + action.at)
            what = await nemesis.apply(action)
            run.note(f"{step.kind}: {what}")
            if t_begin is None:
                t_begin, applied = reactor.seconds(), not what.endswith("no target")
        stats = result.kinds.setdefault(step.kind, asdict(KindStats()))
        if applied:  # a pause or kill of "the leader" while nobody leads did nothing: not counted
            result.windows.append((step.kind, t_begin, reactor.seconds()))
            result.faults += 1
            stats["injected"] += 1
    await at(spec.seconds)
    nemesis.heal_all()
    run.note("healed everything")
    await deferLater(reactor, spec.quiet, lambda: None)
    await workload.stop()
    run.note("workload stopped")
    try:
        await run.wait_for(run.converged, spec.converge, "every member to hold and commit the same log")
    except TimeoutError as exc:
        result.stuck = str(exc)
    await workload.finish(result)
    await run.admin.close()
    procs.terminate_all()
    await run.wait_for(_all_exited(run), 30, "every member to exit")
    if not broker:
        run.committed = await read_committed(run, config)


def _all_exited(run: Run):
    async def exited():
        return not any(run.procs.running(n) for n in run.procs.procs)
    return exited


async def read_committed(run: Run, config_path: Path) -> dict[str, dict[int, bytes]]:
    """Every member's committed log (NOOPs left out), read from its stopped store."""
    from dledger.config import make_config
    from dledger.launcher import read_stored_log
    out = {}
    for mid in run.ids:
        log = await read_stored_log(make_config(file=config_path, self_id=mid))
        out[mid] = {e.index: e.body for e in log.entries if e.index <= log.committed and not e.is_noop}
    return out


def run_in_process(spec: RunSpec) -> RunResult:
    """Build, run, check and clean up one run (this process moves into the clients' namespace: call it in a
    process of its own -- ``python -m dledger.testing.nemesis run``)."""
    from twisted.internet import reactor as global_reactor

    out = Path(spec.out) if spec.out else None
    spec.tag = spec.tag or default_tag()
    base = Path(tempfile.mkdtemp(prefix=f"nemesis-{spec.tag}-{spec.workload}-{spec.seed}-"))
    result = RunResult(spec.workload, spec.seed, spec.mutation)
    run = Run(spec, base, global_reactor)
    run.t0 = global_reactor.seconds()
    run.procs = Processes(run.net, base, mutation=spec.mutation, clock=True)
    started = time.monotonic()
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def on_term(signum, frame):
        # Inside the reactor an exception would only be logged: stop it, and the run ends as interrupted.
        if global_reactor.running:
            global_reactor.callFromThread(global_reactor.stop)
        else:
            raise KeyboardInterrupt(signal.Signals(signum).name)
    for sig in previous:
        signal.signal(sig, on_term)
    failure: BaseException | None = None
    try:
        run.net.build()
        enter(run.net.ns("client"))
        from twisted.internet.defer import ensureDeferred

        box: dict[str, Any] = {}

        def go():
            d = ensureDeferred(_main(global_reactor, spec, run, result))
            d.addBoth(lambda r: (box.__setitem__("r", r), global_reactor.stop()))
        global_reactor.callWhenRunning(go)
        global_reactor.run(installSignalHandlers=False)
        if "r" not in box:
            raise KeyboardInterrupt("the reactor stopped before the run finished")
        if hasattr(box["r"], "raiseException"):
            box["r"].raiseException()
    except BaseException as exc:
        failure = exc
        import traceback
        run.log.append(traceback.format_exc())
        result.stuck = result.stuck or f"{type(exc).__name__}: {exc}"
    finally:
        run.procs.terminate_all()
        deadline = time.monotonic() + 20
        while any(run.procs.running(n) for n in run.procs.procs) and time.monotonic() < deadline:
            time.sleep(0.1)  # allowed: the harness's clean-up after its reactor stopped, not the core
        run.procs.kill_all()
        run.net.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if failure is None and run.workload_result is not None:
        try:
            _check(spec, run, result)
        except Exception as exc:
            result.stuck = result.stuck or f"the check could not run: {type(exc).__name__}: {exc}"
    result.seconds = round(time.monotonic() - started, 1)
    keep = spec.keep or not result.passed
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        dest = out / f"{spec.workload}-seed{spec.seed}{'-' + spec.mutation if spec.mutation else ''}"
        if keep:
            if dest.exists():
                shutil.rmtree(dest)
            shutil.copytree(base, dest, ignore=shutil.ignore_patterns("dledger-*", "rocketmq-*", "*.faketime"))
            (dest / "nemesis.log").write_text("\n".join(run.log) + "\n", encoding="utf-8")
            result.dir = str(dest)
        out.joinpath(f"{dest.name}.json").write_text(json.dumps(asdict(result), indent=1), encoding="utf-8")
    shutil.rmtree(base, ignore_errors=True)
    if isinstance(failure, KeyboardInterrupt):
        raise failure
    return result


def _check(spec: RunSpec, run: Run, result: RunResult) -> None:
    from dledger.testing.nemesis import history as H
    workload = run.workload_result
    if spec.workload == "log":
        from dledger.testing.nemesis.logcheck import check_log_history
        logs = run.committed
        H.write_ops(run.base / "history.jsonl", workload)
        (run.base / "committed.json").write_text(json.dumps(
            {m: {str(i): b.decode("latin-1") for i, b in sorted(lg.items())} for m, lg in logs.items()}),
            encoding="utf-8")
        result.anomalies += check_log_history(workload, logs, prefix=b"nemesis ")
    elif spec.workload == "kv":
        from dledger.testing.nemesis.kvload import check_kv, write_kv_history
        write_kv_history(run.base / "history.jsonl", workload)
        result.anomalies += check_kv(workload, run.committed)
    else:
        from dledger.testing.nemesis.brokercheck import broker_anomalies
        events, final = workload
        H.write_events(run.base / "events.jsonl", events)
        (run.base / "final.json").write_text(json.dumps({q: {str(o): b for o, b in sorted(v.items())}
                                                         for q, v in final.items()}), encoding="utf-8")
        result.anomalies += broker_anomalies(events, final)

