"""``dledger bench cluster``: throughput, latency, failover time and memory of a three-member TCP group.

By default the benchmark starts its own group (``twistd dledger`` processes
on 127.0.0.1, :class:`dledger.launcher.LocalGroup`); ``--peers`` targets a
running group instead (then the failover and memory phases, which need to
kill and inspect processes, are skipped).  Phases:

``batch``     committed entries/s with batched appends (``--batch`` bodies per request, several in flight)
``pipeline``  committed entries/s with one entry per request, ``--in-flight`` requests in flight
``latency``   p50/p99/p999 at a fixed offered rate (``--rate``, open loop, measured from each request's
              scheduled send time, so a stalled client or server cannot hide its delay)
``failover``  SIGKILL the leader -> next acknowledged append, ``--trials`` times for each of ``--presets``
``rss``       resident memory of each member after the load phases
``pysyncobj`` the same machine's figure for PySyncObj when it is installed (one entry per call)

The load generator is one process speaking the remoting protocol straight
to the leader (no retry wrapper).  Figures are printed, never asserted.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

# The load generator, the failover prober and the PySyncObj driver live in their own modules; their
# names stay importable from here.
from dledger.bench.failover import Prober, measure_failover  # noqa: F401
from dledger.bench.load import Loader, RawAppends, pause  # noqa: F401
from dledger.bench.options import PHASES, TARGETS, Options
from dledger.bench.pysyncobj_bench import PYSYNCOBJ_NODE_SCRIPT, measure_pysyncobj, pysyncobj_version  # noqa: F401
from dledger.bench.runner import progress, run_benchmark
from dledger.commands.argtypes import non_negative_float, non_negative_int, positive_float, positive_int
from dledger.errors import ConfigError
from dledger.launcher import LocalGroup, durable_store


def register(bench_subparsers) -> None:
    """Add ``cluster`` to ``dledger bench``'s sub-commands."""
    p = bench_subparsers.add_parser(
        "cluster", help="throughput, latency, failover and RSS of a 3-member TCP group",
        description="Start three 'twistd dledger' members on 127.0.0.1 (or target --peers) and measure committed "
                    "entries/s for batched and one-per-request appends, latency at a fixed offered rate, "
                    "failover time after SIGKILL of the leader, and each member's RSS. Progress goes to stderr. "
                    "See docs/benchmarks.md.")
    p.add_argument("--peers", help="benchmark this running group instead of starting one (no failover/rss)")
    p.add_argument("--group", default="g0", help="group name (default g0)")
    p.add_argument("--store", help="store of the group it starts (default: mmap, else lmdb, else memory)")
    p.add_argument("--flush", choices=("sync", "async"), default="sync", help="flush policy (default sync)")
    p.add_argument("--preset", choices=("default", "fast"), default="default",
                   help="timer preset of the group used for the load phases (default: DLedger's)")
    p.add_argument("--size", type=non_negative_int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--duration", type=positive_float, default=5.0,
                   help="seconds measured per load phase (default 5)")
    p.add_argument("--warmup", type=non_negative_float, default=1.0,
                   help="seconds of load before measuring (default 1)")
    p.add_argument("--batch", type=positive_int, default=256, help="bodies per batched append (default 256)")
    p.add_argument("--batch-in-flight", type=positive_int, default=4, help="batched requests in flight (default 4)")
    p.add_argument("--in-flight", type=positive_int, default=256, help="one-entry requests in flight (default 256)")
    p.add_argument("--rate", type=positive_int, default=10_000,
                   help="offered appends/s in the latency phase (default 10000)")
    p.add_argument("--trials", type=positive_int, default=5, help="failover trials per preset (default 5)")
    p.add_argument("--presets", default="fast,default", help="presets for the failover phase (default fast,default)")
    p.add_argument("--seed", type=int, default=1, help="seed of the random kill moments (default 1)")
    p.add_argument("--pysyncobj-in-flight", type=positive_int, default=10000,
                   help="PySyncObj calls in flight (default 10000; it batches per tick, so it needs many)")
    p.add_argument("--phases", default=",".join(PHASES), help=f"phases to run (default {','.join(PHASES)})")
    p.add_argument("--quick", action="store_true", help="a tiny run (keeps the benchmark working in the test suite)")
    p.add_argument("--dir", dest="directory", help="directory for stores and logs (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the directory afterwards")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--plot", metavar="FILE.svg", type=_plot_path,
                   help="also draw throughput over time, latency percentiles and the failover timeline into FILE "
                        "(.svg, .png or .pdf; needs matplotlib: pip install 'dledger[plot]')")
    p.add_argument("--tls", action="store_true",
                   help="run the load phases in interleaved rounds on a plain group and on a group with mutual TLS "
                        "(authMode=tls) and report both with their ratio (docs/security.md)")
    p.add_argument("--tls-rounds", type=positive_int, default=3,
                   help="plain/TLS round pairs with --tls (default 3); the medians are compared")
    p.add_argument("--member-option", metavar="NAME=VALUE", action="append", default=[], type=member_option,
                   help="a config option of the members the load phases start (docs/configuration.md; the value "
                        "in TOML: 5, 0.5, true, '\"text\"'), e.g. switchIntervalMs=5 to compare a setting in "
                        "interleaved runs of the same code; repeatable; not with --peers or --java-peer")
    p.add_argument("--java-frames", action="store_true",
                   help="send APPENDs in Java's JSON form (Base64 bodies) instead of dledger's binary APPEND body")
    p.add_argument("--java-peer", action="store_true",
                   help="also start three Java DLedger 0.3.2 members (the Java kit's java-dledger) and run the "
                        "pipeline and latency phases on both groups in interleaved rounds with Java's JSON frames; "
                        "reports medians and dledger/Java ratios (use --flush async for Java's page-cache durability)")
    p.add_argument("--java-rounds", type=positive_int, default=3,
                   help="dledger/Java round pairs with --java-peer (default 3); the medians are compared")
    p.add_argument("--java-warmup", type=non_negative_float, default=5.0,
                   help="seconds of unmeasured load on each group before the --java-peer rounds (default 5: "
                        "Java's JIT)")
    p.set_defaults(func=cmd_bench_cluster)


def options_from_args(args) -> Options:
    phases = tuple(x.strip() for x in args.phases.split(",") if x.strip())
    unknown = set(phases) - set(PHASES)
    if unknown:
        raise ConfigError(f"--phases: unknown phases {sorted(unknown)}; known: {', '.join(PHASES)}")
    presets = tuple(x.strip() for x in args.presets.split(",") if x.strip())
    if not presets or set(presets) - {"default", "fast"}:
        raise ConfigError(f"--presets: {args.presets!r}: expected default and/or fast, separated by ','")
    opts = Options(peers=args.peers, group=args.group, store=args.store, flush=args.flush, preset=args.preset,
                   size=args.size, duration=args.duration, warmup=args.warmup, batch=args.batch,
                   batch_in_flight=args.batch_in_flight, in_flight=args.in_flight, rate=args.rate,
                   trials=args.trials, presets=presets, seed=args.seed,
                   pysyncobj_in_flight=args.pysyncobj_in_flight, phases=phases,
                   directory=args.directory, keep=args.keep, json=args.json, java_frames=args.java_frames,
                   tls=args.tls, tls_rounds=args.tls_rounds, java_peer=args.java_peer,
                   java_rounds=args.java_rounds, java_warmup=args.java_warmup,
                   member_options=dict(getattr(args, "member_option", None) or ()))
    if opts.member_options and (opts.peers or opts.java_peer):
        raise ConfigError("--member-option sets the members this benchmark starts: not with --peers or --java-peer")
    if opts.java_peer:
        if opts.peers or opts.tls:
            raise ConfigError("--java-peer starts both groups itself: it cannot be used with --peers or --tls")
        opts.java_frames = True  # Java DLedger reads only its JSON APPEND frames
    if args.quick:
        opts.tls_rounds = opts.java_rounds = 1
        opts.java_warmup = min(opts.java_warmup, 0.5)
        opts.duration, opts.warmup, opts.trials, opts.presets = 0.5, 0.2, 1, ("fast",)
        opts.rate, opts.in_flight = min(opts.rate, 500), min(opts.in_flight, 32)
        opts.pysyncobj_in_flight = min(opts.pysyncobj_in_flight, 64)
    return opts


def member_option(text: str) -> tuple[str, Any]:
    """``NAME=VALUE`` of ``--member-option``: the value read as TOML (``5``, ``0.5``, ``true``), else as text.

    The name and the value are checked when the group's config is built (one line naming the option).
    """
    import argparse
    import tomllib

    name, sep, value = text.partition("=")
    if not sep or not name.strip() or not value.strip():
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE (a member config option), got {text!r}")
    try:
        parsed = tomllib.loads(f"v = {value.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value.strip()
    return name.strip(), parsed


def _plot_path(value: str) -> str:
    from dledger.bench.plot import plot_path

    return plot_path(value)


def cmd_bench_cluster(args) -> int:
    opts = options_from_args(args)
    plot = getattr(args, "plot", None)
    if plot:
        from dledger.bench import plot as plotting

        plotting.require()  # a missing extra is one line before the run, not after it
    kept: list[dict] = []

    async def go(reactor: Any, say: Any) -> dict:
        kept.append(await run(reactor, opts, say))
        return kept[-1]

    status = run_benchmark(go, format_results, as_json=opts.json)
    if plot and kept:
        drawn = plotting.write(kept[-1], plot)
        progress(f"plot ({', '.join(drawn)}) written to {plot}")
    return status


async def run(reactor: Any, opts: Options, say=progress) -> dict:
    """Run the selected phases; a dict of results (see :func:`format_results`)."""
    own = opts.peers is None
    if opts.store is None:
        opts.store = durable_store() or "memory"
    base = Path(opts.directory) if opts.directory else Path(tempfile.mkdtemp(prefix="dledger-bench-"))
    results: dict[str, Any] = {"settings": {
        "members": 3, "store": opts.store if own else "(running group)", "flush": opts.flush if own else None,
        "preset": opts.preset, "size": opts.size, "duration_s": opts.duration, "cpus": os.cpu_count(),
        "python": sys.version.split()[0], "phases": list(opts.phases),
        "frames": "java-json" if opts.java_frames else "binary", "member_options": opts.member_options}}
    group = None
    loader = None
    if opts.java_peer:
        from dledger.bench.javapeer import compare_java

        results["settings"]["java_rounds"] = opts.java_rounds
        try:
            results.update(await compare_java(reactor, base, opts, say))
            return results
        finally:
            if not (opts.keep or opts.directory):
                shutil.rmtree(base, ignore_errors=True)
    if opts.tls:
        if not own:
            raise ConfigError("--tls compares groups the benchmark starts itself; it cannot be used with --peers")
        results["settings"]["tls_rounds"] = opts.tls_rounds
        try:
            results.update(await compare_tls(reactor, base, opts, say))
            return results
        finally:
            if not (opts.keep or opts.directory):
                shutil.rmtree(base, ignore_errors=True)
    try:
        if own:
            group = LocalGroup(base / "load", n=3, store=opts.store, preset=opts.preset, flush_policy=opts.flush,
                               group=opts.group, reactor=reactor, options=opts.member_options)
            say(f"starting 3 members ({opts.store}, flush {opts.flush}, preset {opts.preset}) in {base}")
            await group.start_and_wait(30)
            peers = group.peers
        else:
            peers = opts.peers
        loader = Loader(reactor, peers, opts.group, opts.size, binary=not opts.java_frames)
        if any(p in opts.phases for p in ("batch", "pipeline", "latency")):
            results["leader"] = await loader.find_leader()
            await loader.connect_raw()
        if "batch" in opts.phases:
            results["batch"] = await measured(group, opts.duration, loader.closed_loop(
                "batched appends", opts.batch, opts.batch_in_flight, opts.duration, opts.warmup))
        if "pipeline" in opts.phases:
            results["pipeline"] = await measured(group, opts.duration, loader.closed_loop(
                "one entry per request", 1, opts.in_flight, opts.duration, opts.warmup))
        if "latency" in opts.phases:
            results["latency"] = await measured(group, opts.duration, loader.open_loop(
                opts.rate, opts.duration, opts.warmup), "achieved_per_s")
        if "rss" in opts.phases and group is not None:
            results["rss_mb"] = {mid: round(group.rss_bytes(mid) / 2**20, 1) for mid in group.ids}
            results["rss_peak_mb"] = {mid: round(group.peak_rss_bytes(mid) / 2**20, 1) for mid in group.ids}
        await loader.close()
        loader = None
        if group is not None:
            await group.stop_all()
            group.close()
            group = None
        if "failover" in opts.phases and own:
            results["failover"] = [await measure_failover(reactor, base, opts, preset) for preset in opts.presets]
        if "pysyncobj" in opts.phases:
            if pysyncobj_version() is None:
                results["pysyncobj"] = {"skipped": "not installed (pip install pysyncobj to compare)"}
            else:
                results["pysyncobj"] = await measure_pysyncobj(reactor, base, opts, None)
        return results
    finally:
        # Synchronous clean-up first: after a signal the reactor may stop at the first await below.
        if group is not None:
            group.close()
        if not (opts.keep or opts.directory):
            shutil.rmtree(base, ignore_errors=True)
        if loader is not None:
            await loader.close()


#: The figure compared between plain and TLS rounds for each load phase.
TLS_FIGURES = {"batch": "entries_per_s", "pipeline": "entries_per_s", "latency": "p99_ms"}


def members_cpu_seconds(group: LocalGroup) -> float:
    """User + system CPU seconds all members' processes used so far (see :meth:`LocalGroup.cpu_seconds`)."""
    return sum(group.cpu_seconds(mid) for mid in group.ids)


async def measured(group: LocalGroup | None, duration: float, coro: Any, rate_key: str = "entries_per_s") -> dict:
    """A load phase's result with ``member_cpu_ms_per_1k_entries``: the members' CPU over the phase.

    The warm-up's CPU is counted too (its entries are not), so compare the
    figure between runs of the same settings; it follows the code, not the
    machine's load, as throughput does.  Nothing is added for a group this
    benchmark did not start (``--peers``).  ``rate_key`` names the result's
    acknowledged entries/s: the latency phase's ``achieved_per_s`` (issue #28
    target 2c: at a fixed offered rate the CPU per entry is what the machine
    has left, and so what the queueing behind the tail is made of).
    """
    if group is None:
        return await coro
    before = process_cpu_seconds(group)
    result = await coro
    acked = result[rate_key] * duration
    after = process_cpu_seconds(group)
    per_1k = {name: round((after[name] - before[name]) * 1e6 / acked, 1) if acked else None for name in after}
    result["member_cpu_ms_per_1k_entries"] = (round(sum(after[m] - before[m] for m in group.ids) * 1e6 / acked, 1)
                                              if acked else None)
    result["cpu_ms_per_1k_entries_by_process"] = per_1k
    return result


def process_cpu_seconds(group: LocalGroup) -> dict[str, float]:
    """CPU seconds so far of each member (by id) and of this process, the load generator (``"generator"``).

    The generator shares the 2 cores with the members: its share per entry says
    how much of the machine the measurement itself takes (issue #28 target 2).
    """
    times = os.times()
    return {**{mid: group.cpu_seconds(mid) for mid in group.ids}, "generator": times.user + times.system}


async def load_round(reactor: Any, base: Path, opts: Options, tls: bool, say=progress) -> dict:
    """One round of the load phases on a fresh group, plain or with mutual TLS (authMode=tls)."""
    options, credentials = {}, None
    if tls:
        from dledger.security.certs import local_group_security

        options, credentials = local_group_security(base / "certs", opts.group, ["n0", "n1", "n2"])
    group = LocalGroup(base, n=3, store=opts.store, preset=opts.preset, flush_policy=opts.flush, group=opts.group,
                       reactor=reactor, options={**opts.member_options, **options}, client_credentials=credentials)
    loader = None
    out: dict[str, Any] = {}
    try:
        await group.start_and_wait(30)
        loader = Loader(reactor, group.peers, opts.group, opts.size, binary=not opts.java_frames,
                        credentials=credentials)
        await loader.find_leader()
        await loader.connect_raw()
        label = "TLS" if tls else "plain"

        if "batch" in opts.phases:
            out["batch"] = await measured(group, opts.duration, loader.closed_loop(
                f"{label}: batched appends", opts.batch, opts.batch_in_flight, opts.duration, opts.warmup))
        if "pipeline" in opts.phases:
            out["pipeline"] = await measured(group, opts.duration, loader.closed_loop(
                f"{label}: one entry per request", 1, opts.in_flight, opts.duration, opts.warmup))
        if "latency" in opts.phases:
            out["latency"] = await loader.open_loop(opts.rate, opts.duration, opts.warmup)
        await loader.close()
        loader = None
        await group.stop_all()
        return out
    finally:
        group.close()
        if loader is not None:
            await loader.close()


async def compare_tls(reactor: Any, base: Path, opts: Options, say=progress) -> dict:
    """``--tls``: plain and TLS rounds interleaved (plain, TLS, plain, TLS, ...); medians and TLS/plain ratios.

    Interleaving spreads slow moments of a shared machine over both sides.  The ratios are
    TLS/plain: throughput below 1.0 is TLS's cost, a p99 above 1.0 its added latency.
    """
    rounds: dict[str, list[dict]] = {"plain": [], "tls": []}
    for k in range(opts.tls_rounds):
        for mode in ("plain", "tls"):
            say(f"round {k + 1}/{opts.tls_rounds}: {mode}")
            rounds[mode].append(await load_round(reactor, base / f"round{k}-{mode}", opts, mode == "tls", say))
    summary: dict[str, Any] = {"tls_rounds": rounds, "tls_median": {}, "tls_ratio": {}, "tls_cpu_median": {},
                               "tls_cpu_ratio": {}}

    def median(mode: str, phase: str, key: str) -> float | None:
        values = sorted(r[phase][key] for r in rounds[mode] if r.get(phase, {}).get(key) is not None)
        return values[len(values) // 2] if values else None

    for phase, key in TLS_FIGURES.items():
        if phase not in opts.phases:
            continue
        medians = {mode: median(mode, phase, key) for mode in ("plain", "tls")}
        summary["tls_median"][phase] = medians
        if medians["plain"] and medians["tls"] is not None:
            summary["tls_ratio"][phase] = medians["tls"] / medians["plain"]
        if phase != "latency":
            cpu = {mode: median(mode, phase, "member_cpu_ms_per_1k_entries") for mode in ("plain", "tls")}
            summary["tls_cpu_median"][phase] = cpu
            if cpu["plain"] and cpu["tls"] is not None:
                summary["tls_cpu_ratio"][phase] = cpu["tls"] / cpu["plain"]
    last_plain = rounds["plain"][-1]
    summary.update({phase: last_plain[phase] for phase in TLS_FIGURES if phase in last_plain})
    return summary


def format_results(r: dict) -> str:
    """The results as a short table, each figure next to its target."""
    s = r["settings"]
    lines = [f"dledger cluster benchmark: {s['members']} members on 127.0.0.1, store {s['store']} "
             f"(flush {s['flush']}), preset {s['preset']}, {s['size']}-byte bodies, {s['cpus']} CPUs, "
             f"Python {s['python']}"]

    def row(name: str, value: str) -> None:
        lines.append(f"  {name:<52} {value}")

    if "batch" in r:
        b = r["batch"]
        row(f"batched appends ({b['bodies_per_request']}/request, {b['in_flight']} in flight)",
            f"{b['entries_per_s']:>9,.0f} entries/s   (target >= {TARGETS['batch']:,}){_errors(b)}{_cpu(b)}")
    if "pipeline" in r:
        b = r["pipeline"]
        row(f"one entry per request ({b['in_flight']} in flight)",
            f"{b['entries_per_s']:>9,.0f} entries/s   (target >= {TARGETS['pipeline']:,}){_errors(b)}{_cpu(b)}")
    if "latency" in r:
        lat = r["latency"]
        fmt = lambda v: "-" if v is None else f"{v:.2f}"
        row(f"latency at {lat['offered_per_s']:,}/s offered ({lat['achieved_per_s']:,.0f}/s acknowledged)",
            f"p50 {fmt(lat['p50_ms'])} ms  p99 {fmt(lat['p99_ms'])} ms  p999 {fmt(lat['p999_ms'])} ms  "
            f"(target p99 <= {TARGETS['p99_ms']:g} ms){_cpu(lat)}")
    for f in r.get("failover", []):
        target = TARGETS.get(f"failover_{f['preset']}_s")
        trials = ", ".join(f"{t:.2f}" for t in f["trials_s"])
        row(f"failover, preset {f['preset']} ({len(f['trials_s'])} trials)",
            f"median {f['median_s']:.2f} s  [{trials}]" + (f"  (target <= {target:g} s)" if target else ""))
    if "rss_mb" in r:
        now = ", ".join(f"{m} {v:.0f}" for m, v in r["rss_mb"].items())
        peak = max(r["rss_peak_mb"].values())
        row("RSS per member (MB)", f"{now}; peak {peak:.0f}   (target <= {TARGETS['rss_mb']} MB)")
    if "pysyncobj" in r:
        p = r["pysyncobj"]
        if "entries_per_s" in p:
            ratio = ""
            if "pipeline" in r and p["entries_per_s"]:
                ratio = f"; dledger one-per-request is {r['pipeline']['entries_per_s'] / p['entries_per_s']:.1f}x"
            where = "calls made in the leader" if p.get("driver_was_leader") else "calls forwarded by a follower"
            row(f"PySyncObj {p['version']} (one entry per call, {p['in_flight']} in flight)",
                f"{p['entries_per_s']:>9,.0f} entries/s ({where}, journal without fsync){ratio}")
        else:
            row("PySyncObj", p.get("skipped") or p.get("error", "?"))
    if "tls_median" in r:
        lines.append(f"  plain TCP vs mutual TLS (authMode=tls), medians of {s.get('tls_rounds')} interleaved rounds:")
        for phase, m in r["tls_median"].items():
            unit = "ms p99" if phase == "latency" else "entries/s"
            ratio = r["tls_ratio"].get(phase)
            fmt = lambda v, ms=(phase == "latency"): "-" if v is None else f"{v:,.2f}" if ms else f"{v:,.0f}"
            row(f"{phase}: plain {fmt(m['plain'])} / TLS {fmt(m['tls'])} {unit}",
                "-" if ratio is None else f"TLS/plain = {ratio:.2f}")
            cpu = r.get("tls_cpu_median", {}).get(phase)
            if cpu and cpu["plain"] and cpu["tls"]:
                row(f"{phase}: members' CPU ms per 1,000 entries, plain {cpu['plain']:.0f} / TLS {cpu['tls']:.0f}",
                    f"TLS/plain = {r['tls_cpu_ratio'][phase]:.2f}")
    if "java_median" in r:
        lines.append(f"  dledger vs Java DLedger 0.3.2, Java's JSON frames, medians of {s.get('java_rounds')} "
                     f"interleaved rounds (flush {s['flush']} vs Java's page cache):")
        for phase, m in r["java_median"].items():
            ms = phase == "latency"
            fmt = lambda v, ms=ms: "-" if v is None else f"{v:,.2f}" if ms else f"{v:,.0f}"
            ratio = r["java_ratio"].get(phase)
            row(f"{phase}: dledger {fmt(m['dledger'])} / Java {fmt(m['java'])} {'ms p99' if ms else 'entries/s'}",
                "-" if ratio is None else f"dledger/Java = {ratio:.2f}" + ("" if ms else "   (target >= 2)"))
        cpu = r.get("java_cpu_median") or {}
        if cpu.get("dledger") and cpu.get("java"):
            row(f"members' CPU ms per 1k entries: dledger {cpu['dledger']:.0f} / Java {cpu['java']:.0f}",
                f"Java/dledger = {cpu['java'] / cpu['dledger']:.2f}")
        peak = r.get("java_rss_peak_mb") or {}
        if peak:
            row("Java DLedger peak RSS per member (MB)", ", ".join(f"{m} {v:.0f}" for m, v in peak.items()))
    return "\n".join(lines)


def _errors(b: dict) -> str:
    return f"  errors {b['errors']}" if b.get("errors") else ""


def _cpu(b: dict) -> str:
    cpu = b.get("member_cpu_ms_per_1k_entries")
    split = b.get("cpu_ms_per_1k_entries_by_process") or {}
    each = ", ".join(f"{name} {ms:g}" for name, ms in split.items() if ms is not None)
    return (f"; members' CPU {cpu:g} ms per 1k entries" + (f" ({each})" if each else "")) if cpu is not None else ""
