"""The nemesis's command line (``make nemesis`` runs ``long``).

    python -m dledger.testing.nemesis run --workload log --seed 7 --seconds 30 --out nemesis-runs
    python -m dledger.testing.nemesis long --seconds 1800 --seed 1 --workloads "log broker" --out nemesis-runs
    python -m dledger.testing.nemesis mutants --out nemesis-runs

``run`` is one run in this process (it moves into the clients' namespace); ``long`` and ``mutants`` start one
``run`` process per segment, so each gets fresh namespaces and a fresh group, and aggregate their results into
the summary table. Exit status: 0 when every run passed (``mutants``: when every mutation was caught), 1 when
one did not, 2 on bad arguments or when namespaces are not available.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from dledger.testing.nemesis import faults as F
from dledger.testing.nemesis.mutations import MUTATIONS


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dledger.testing.nemesis",
                                description="Faults on real processes in network namespaces, histories checked "
                                            "(docs/testing.md \"Nemesis\"). Needs root.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="one run: a group, a workload, a seeded fault schedule, the verdict")
    r.add_argument("--workload", choices=("log", "broker", "kv"), default="log",
                   help="log: appends and reads; broker: RocketMQ producers/consumers; kv: the example kv map")
    r.add_argument("--seed", type=int, default=1)
    r.add_argument("--seconds", type=float, default=20.0, help="seconds of faults (then a quiet period)")
    r.add_argument("--members", type=int, default=3)
    r.add_argument("--clients", type=int, default=4)
    r.add_argument("--kinds", default=None, help=f"comma-separated fault kinds (default all): {', '.join(F.KINDS)}")
    r.add_argument("--mutation", choices=MUTATIONS, default=None, help="a deliberately broken member build")
    r.add_argument("--out", default=None, help="folder for result files and the files of failing runs")
    r.add_argument("--tag", default=None, help="prefix of the namespaces' names (unique per run)")
    r.add_argument("--keep", action="store_true", help="keep the run's files even if it passes")
    r.add_argument("--converge-timeout", type=float, default=60.0, dest="converge",
                   help="seconds the healed group has to converge before the run is stuck (default 60; a mutant "
                        "run that may never converge can pass less)")
    g = sub.add_parser("long", help="runs of SEGMENT seconds until SECONDS per workload; a summary per fault kind")
    g.add_argument("--seconds", type=float, default=1800.0)
    g.add_argument("--seed", type=int, default=1)
    g.add_argument("--workloads", default="log broker", help="space-separated: log, broker, kv")
    g.add_argument("--segment", type=float, default=90.0)
    g.add_argument("--members", type=int, default=0, help="default: 5 for the log, 3 for the broker")
    g.add_argument("--out", default="nemesis-runs")
    m = sub.add_parser("mutants", help="each mutation against each fault kind: which fault makes the checker fail")
    m.add_argument("--seconds", type=float, default=15.0)
    m.add_argument("--seed", type=int, default=1)
    m.add_argument("--out", default="nemesis-runs/mutants")
    m.add_argument("--kinds", default=None)
    m.add_argument("--mutations", default=",".join(MUTATIONS))
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from dledger.testing.nemesis.net import unavailable
    why = unavailable()
    if why is not None:
        print(f"nemesis: {why}", file=sys.stderr)
        return 2
    if args.command == "run":
        return _run(args)
    if args.command == "long":
        return _long(args)
    return _mutants(args)


def _run(args) -> int:
    from dledger.testing.nemesis.runner import RunSpec, run_in_process
    spec = RunSpec(workload=args.workload, seed=args.seed, seconds=args.seconds, members=args.members,
                   clients=args.clients, kinds=args.kinds, mutation=args.mutation, out=args.out, tag=args.tag,
                   keep=args.keep, converge=args.converge)
    try:
        F.parse_kinds(args.kinds, F.KINDS)
    except ValueError as exc:
        print(f"nemesis: {exc}", file=sys.stderr)
        return 2
    if args.workload == "kv":
        from dledger.testing.nemesis.kvload import available
        why = available()
        if why is not None:
            print(f"nemesis: {why}", file=sys.stderr)
            return 2
    result = run_in_process(spec)
    verdict = "PASS" if result.passed else "FAIL"
    print(f"{verdict} {spec.workload} seed={spec.seed} mutation={spec.mutation} ops={result.ops} ok={result.ok} "
          f"timeouts={result.timeouts} faults={result.faults} anomalies={len(result.anomalies)} "
          f"stuck={result.stuck!r} files={result.dir}")
    for a in result.anomalies[:20]:
        print(f"  {a}")
    return 0 if result.passed else 1


def child(argv: list[str], timeout: float) -> int:
    """Run ``python -m dledger.testing.nemesis <argv>`` (its own namespaces); SIGTERM it at ``timeout``."""
    proc = subprocess.Popen([sys.executable, "-m", "dledger.testing.nemesis", *argv])
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        return proc.wait(60)
    except BaseException:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        raise


def summarize(results: list[dict]) -> str:
    """The summary table: per fault kind, faults injected, operations that overlapped them, their failures and
    timeouts, and the verdict of the runs the kind was in (anomalies found, ``ok`` when none)."""
    rows: dict[str, dict] = {}
    for r in results:
        bad = len(r["anomalies"]) + (r["stuck"] is not None)
        for kind, k in r["kinds"].items():
            row = rows.setdefault(kind, {"injected": 0, "ops": 0, "failed": 0, "timeouts": 0, "bad_runs": 0})
            for key in ("injected", "ops", "failed", "timeouts"):
                row[key] += k[key]
            row["bad_runs"] += bool(bad)
    lines = [f"{'fault':<20}{'injected':>9}{'ops':>9}{'failed':>9}{'timeouts':>9}  verdict"]
    for kind in F.KINDS:
        if kind in rows:
            row = rows[kind]
            verdict = "ok" if not row["bad_runs"] else f"FAIL in {row['bad_runs']} run(s)"
            lines.append(f"{kind:<20}{row['injected']:>9}{row['ops']:>9}{row['failed']:>9}{row['timeouts']:>9}  "
                         f"{verdict}")
    total_ops = sum(r["ops"] for r in results)
    anomalies = sum(len(r["anomalies"]) for r in results)
    stuck = sum(r["stuck"] is not None for r in results)
    lines.append(f"{'all':<20}{sum(r['faults'] for r in results):>9}{total_ops:>9}"
                 f"{sum(r['failed'] for r in results):>9}{sum(r['timeouts'] for r in results):>9}  "
                 f"runs={len(results)} anomalies={anomalies} stuck={stuck}")
    return "\n".join(lines)


def _long(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    status = 0
    for workload in args.workloads.split():
        members = args.members or (5 if workload == "log" else 3)
        results = []
        began = time.monotonic()
        i = 0
        while time.monotonic() - began < args.seconds:
            seed = args.seed * 1000 + i
            i += 1
            seg = min(args.segment, max(10.0, args.seconds - (time.monotonic() - began)))
            rc = child(["run", "--workload", workload, "--seed", str(seed), "--seconds", str(seg),
                        "--members", str(members), "--out", str(out), "--tag", f"nl{os.getpid() % 10000}{i % 100}"],
                       timeout=seg + 240)
            path = out / f"{workload}-seed{seed}.json"
            if path.exists():
                results.append(json.loads(path.read_text(encoding="utf-8")))
            status |= rc != 0
            print(f"[{workload}] run {i} seed {seed}: exit {rc}", flush=True)
        table = summarize(results)
        header = (f"nemesis {workload}: {len(results)} runs, {round(time.monotonic() - began)} s, "
                  f"{members} members, seed {args.seed}")
        print(f"\n{header}\n{table}\n", flush=True)
        (out / f"summary-{workload}.txt").write_text(f"{header}\n{table}\n", encoding="utf-8")
    return status


def _mutants(args) -> int:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kinds = args.kinds.split(",") if args.kinds else [k for k in F.KINDS if k != "ring"]
    lines = [f"{'mutation':<16}{'fault':<20}verdict"]
    status = 0
    for mutation in args.mutations.split(","):
        for kind in kinds:
            for workload in ("log",):
                child(["run", "--workload", workload, "--seed", str(args.seed), "--seconds", str(args.seconds),
                       "--kinds", kind, "--mutation", mutation, "--out", str(out), "--converge-timeout", "10",
                       "--tag", f"nm{os.getpid() % 10000}{len(lines) % 100}"], timeout=args.seconds + 240)
                path = out / f"{workload}-seed{args.seed}-{mutation}.json"
                r = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
                caught = r is not None and bool(r["anomalies"])
                first = r["anomalies"][0][:90] if caught else (r or {}).get("stuck") or "not caught"
                lines.append(f"{mutation:<16}{kind:<20}{'CAUGHT' if caught else 'missed'}: {first}")
                print(lines[-1], flush=True)
                if path.exists():
                    path.rename(out / f"{workload}-seed{args.seed}-{mutation}-{kind}.json")
    (out / "mutants.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    return status
