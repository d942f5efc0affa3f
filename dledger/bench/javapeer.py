"""``dledger bench cluster --java-peer``: the same load generator against a Java DLedger 0.3.2 group, interleaved.

Issue #28 asks for dledger's plain log against Java DLedger "with the same frames, both warm, same
generator": this starts three Java DLedger members (``java-dledger server`` from the Java kit,
``../shared/javakit`` or ``$DLEDGER_JAVAKIT``) beside the dledger group, warms both up, then runs the
selected load phases in rounds that alternate between the two groups (dledger, Java, dledger, Java,
...), so a slow moment of a shared machine lands on both.  The load generator sends Java's JSON APPEND
frames to both (Java DLedger reads nothing else).  Medians and dledger/Java ratios are reported.

Java DLedger acknowledges from the page cache (it flushes every 10 ms); compare it with
``--flush async`` for equal durability, or with the default ``sync`` to see what fsync costs dledger.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

from dledger.bench.load import Loader
from dledger.bench.options import Options
from dledger.bench.runner import progress
from dledger.errors import ConfigError
from dledger.launcher import LocalGroup, free_ports

#: The phases a Java DLedger group can run (one entry per APPEND request; no batched appends in 0.3.2's client).
JAVA_PHASES = ("pipeline", "latency")
#: The figure compared in each phase (throughput higher is better, p99 lower is better).
JAVA_FIGURES = {"pipeline": "entries_per_s", "latency": "p99_ms"}


def java_dledger_launcher() -> Path:
    """The kit's ``bin/java-dledger``; a ConfigError naming what is missing when it or ``java`` is not there."""
    kit = Path(os.environ.get("DLEDGER_JAVAKIT") or Path(__file__).resolve().parents[3] / "shared" / "javakit")
    launcher = kit / "bin" / "java-dledger"
    if not launcher.is_file():
        raise ConfigError(f"--java-peer: no Java DLedger launcher at {launcher} (set DLEDGER_JAVAKIT to the Java kit)")
    if shutil.which("java") is None:
        raise ConfigError("--java-peer: 'java' is not on PATH (Java DLedger needs a JDK)")
    return launcher


class JavaGroup:
    """Three Java DLedger 0.3.2 members on 127.0.0.1 (``java-dledger server``), each in its own session.

    Output goes to ``<base>/<id>.log``; :meth:`close` SIGKILLs every process group still running.
    """

    def __init__(self, base: Path, launcher: Path, group: str = "g0", n: int = 3):
        self.base = base
        self.launcher = launcher
        self.group = group
        self.ids = [f"n{i}" for i in range(n)]
        ports = free_ports(n)
        self.peers = ";".join(f"{mid}-127.0.0.1:{port}" for mid, port in zip(self.ids, ports))
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        self.base.mkdir(parents=True, exist_ok=True)
        for mid in self.ids:
            with (self.base / f"{mid}.log").open("ab") as out:
                self.procs[mid] = subprocess.Popen(
                    [str(self.launcher), "server", "-g", self.group, "-i", mid, "-p", self.peers,
                     "-s", str(self.base / f"store-{mid}")],
                    stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, cwd=self.base,
                    start_new_session=True)

    def rss_bytes(self) -> dict[str, int]:
        """Each member's VmHWM (peak resident set) from /proc; 0 if unknown."""
        out = {}
        for mid, proc in self.procs.items():
            out[mid] = 0
            try:
                with open(f"/proc/{proc.pid}/status", encoding="ascii") as fh:
                    out[mid] = next((int(line.split()[1]) * 1024 for line in fh if line.startswith("VmHWM:")), 0)
            except (OSError, ValueError):
                pass
        return out

    def cpu_seconds(self) -> float:
        """User + system CPU seconds of all members so far (from /proc; the launcher execs the JVM)."""
        total = 0.0
        for proc in self.procs.values():
            try:
                with open(f"/proc/{proc.pid}/stat", encoding="ascii") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
            except (OSError, ValueError, IndexError):
                pass
        return total

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait(5)


async def run_phase(loader: Loader, phase: str, opts: Options, label: str, cpu_seconds: Any) -> dict:
    """One phase on one side; the pipeline phase also gets the members' CPU per 1,000 entries (warm-up
    included, as :func:`dledger.bench.cluster.measured` counts it): the figure a loaded machine moves least."""
    if phase != "pipeline":
        return await loader.open_loop(opts.rate, opts.duration, opts.warmup)
    cpu = cpu_seconds()
    result = await loader.closed_loop(f"{label}: one entry per request", 1, opts.in_flight, opts.duration,
                                      opts.warmup)
    acked = result["entries_per_s"] * opts.duration
    result["member_cpu_ms_per_1k_entries"] = round((cpu_seconds() - cpu) * 1e6 / acked, 1) if acked else None
    return result


def median(values: list[float]) -> float | None:
    ordered = sorted(v for v in values if v is not None)
    return ordered[len(ordered) // 2] if ordered else None


def summarize(rounds: dict[str, list[dict]], phases: tuple[str, ...]) -> dict:
    """Medians per side and the dledger/Java ratio of each phase's figure (pure: table-tested)."""
    medians: dict[str, dict] = {}
    ratios: dict[str, float] = {}
    for phase in phases:
        key = JAVA_FIGURES[phase]
        m = {side: median([r[phase][key] for r in rounds[side] if phase in r]) for side in ("dledger", "java")}
        medians[phase] = m
        if m["dledger"] and m["java"]:
            ratios[phase] = m["dledger"] / m["java"]
    cpu = {side: median([r["pipeline"].get("member_cpu_ms_per_1k_entries") for r in rounds[side] if "pipeline" in r])
           for side in ("dledger", "java")}
    out: dict = {"java_median": medians, "java_ratio": ratios}
    if cpu["dledger"] is not None or cpu["java"] is not None:
        out["java_cpu_median"] = cpu
    return out


async def compare_java(reactor: Any, base: Path, opts: Options, say=progress) -> dict:
    """Both groups up, one warm-up of each, then ``opts.java_rounds`` interleaved rounds of the phases."""
    phases = tuple(p for p in JAVA_PHASES if p in opts.phases)
    if not phases:
        raise ConfigError(f"--java-peer runs the phases {', '.join(JAVA_PHASES)}; none of them was selected")
    launcher = java_dledger_launcher()
    group = LocalGroup(base / "dledger", n=3, store=opts.store, preset=opts.preset, flush_policy=opts.flush,
                       group=opts.group, reactor=reactor)
    java = JavaGroup(base / "java", launcher, opts.group)
    loaders: dict[str, Loader] = {}

    def members_cpu() -> float:
        return sum(group.cpu_seconds(mid) for mid in group.ids)

    rounds: dict[str, list[dict]] = {"dledger": [], "java": []}
    try:
        say(f"starting 3 dledger members ({opts.store}, flush {opts.flush}) and 3 Java DLedger 0.3.2 members")
        java.start()
        await group.start_and_wait(30)
        for side, peers in (("dledger", group.peers), ("java", java.peers)):
            loader = Loader(reactor, peers, opts.group, opts.size, binary=False)
            await loader.find_leader(60)
            await loader.connect_raw()
            loaders[side] = loader
        for side in ("dledger", "java"):  # JIT and page cache warm on both sides before anything counts
            say(f"warm-up: {side}, {opts.java_warmup:g} s")
            await loaders[side].closed_loop(f"{side} warm-up", 1, opts.in_flight, opts.java_warmup, 0.0)
        for k in range(opts.java_rounds):
            for side in ("dledger", "java"):
                say(f"round {k + 1}/{opts.java_rounds}: {side}")
                if loaders[side].raw.lost:  # closed by the member (or its leader changed): find it again
                    say(f"{side}: load connection lost; reconnecting to the leader")
                    await loaders[side].find_leader(60)
                    await loaders[side].connect_raw()
                cpu = members_cpu if side == "dledger" else java.cpu_seconds
                rounds[side].append({phase: await run_phase(loaders[side], phase, opts, side, cpu) for phase in phases})
        out = {"java_rounds": rounds, **summarize(rounds, phases)}
        out["java_rss_peak_mb"] = {mid: round(v / 2**20, 1) for mid, v in java.rss_bytes().items()}
        out["rss_peak_mb"] = {mid: round(group.peak_rss_bytes(mid) / 2**20, 1) for mid in group.ids}
        out["rss_mb"] = {mid: round(group.rss_bytes(mid) / 2**20, 1) for mid in group.ids}
        last = rounds["dledger"][-1]
        out.update({phase: last[phase] for phase in phases})
        return out
    finally:
        for loader in loaders.values():
            await loader.close()
        group.close()
        java.close()
