"""Run seeded simulations of dledger groups and report safety problems.

    python -m tools.simulate election --seeds 100000
    python -m tools.simulate replication --seeds 10000
    python -m tools.simulate replication --seed 1234 --verbose   # replay one schedule
    python -m tools.simulate replication --seeds 500 --store mmap  # members on real mmap stores
    python -m tools.simulate replication --seeds 500 --outsider auth  # forged frames without credentials

Each schedule is deterministic in its seed: a failing seed replays exactly.
The summary line is
``seeds=N, faults=F, acked=A, lost=0, divergent=0, nonlinearizable=0`` and
the exit status is 1 if any schedule broke a safety rule.
"""

from __future__ import annotations

import argparse
import sys
import time


def _seeds(args) -> range:
    if args.seed is not None:
        return range(args.seed, args.seed + 1)
    return range(args.start, args.start + args.seeds)


def run_election(args) -> int:
    from dledger.testing.election_sim import run_election_seed
    bad = elections = faults = 0
    seeds = _seeds(args)
    started = time.monotonic()
    for k, seed in enumerate(seeds, 1):
        r = run_election_seed(seed, duration=args.duration)
        elections += r.elections
        faults += r.faults
        if r.violation or not r.recovered:
            bad += 1
            what = r.violation or "no leader after healing"
            print(f"seed {seed}: {what}\n  replay: python -m tools.simulate election --seed {seed}", flush=True)
        elif args.verbose:
            print(f"seed {seed}: members={r.members} elections={r.elections} faults={r.faults} "
                  f"max_term={r.max_term}", flush=True)
        _progress(args, k, len(seeds), started)
    print(f"seeds={len(seeds)}, faults={faults}, elections={elections}, violations={bad} "
          f"({time.monotonic() - started:.1f}s)")
    return 1 if bad else 0


def run_replication(args) -> int:
    from dledger.testing.replication_sim import run_replication_seed
    totals = dict(faults=0, acked=0, lost=0, divergent=0, nonlinearizable=0, leaders=0, stuck=0, forged=0,
                  outsider_effects=0)
    failing = []
    seeds = _seeds(args)
    started = time.monotonic()
    for k, seed in enumerate(seeds, 1):
        extra = {"outsider": args.outsider} if args.outsider else {}
        r = run_replication_seed(seed, duration=args.duration, store=args.store, **extra)
        totals["forged"] += r.forged
        totals["outsider_effects"] += len(r.outsider_effects)
        totals["faults"] += r.faults
        totals["acked"] += r.acked
        for key in ("lost", "divergent", "nonlinearizable", "leaders"):
            totals[key] += len(getattr(r, key))
        totals["stuck"] += bool(r.stuck)
        if not r.ok:
            failing.append(seed)
            print(f"seed {seed} ({r.members} members):", flush=True)
            for problem in r.problems()[:10]:
                print(f"  {problem}")
            store = "" if args.store == "simdisk" else f" --store {args.store}"
            store += f" --outsider {args.outsider}" if args.outsider else ""
            print(f"  replay: python -m tools.simulate replication --seed {seed}{store}", flush=True)
        elif args.verbose:
            print(f"seed {seed}: members={r.members} faults={r.faults} appends={r.appends} acked={r.acked} "
                  f"gets={r.gets}", flush=True)
        _progress(args, k, len(seeds), started)
    print(f"seeds={len(seeds)}, faults={totals['faults']}, acked={totals['acked']}, lost={totals['lost']}, "
          f"divergent={totals['divergent']}, nonlinearizable={totals['nonlinearizable']}, "
          f"two_leaders={totals['leaders']}, stuck={totals['stuck']}"
          + (f", forged={totals['forged']}, outsider_effects={totals['outsider_effects']}" if args.outsider else "")
          + f" ({time.monotonic() - started:.1f}s)")
    return 1 if failing else 0


def _progress(args, done: int, total: int, started: float) -> None:
    if not args.verbose and total >= 100 and done % max(1, total // 20) == 0 and done < total:
        print(f"  ... {done}/{total} seeds ({time.monotonic() - started:.0f}s)", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.simulate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="kind", required=True)
    for name, func, duration in (("election", run_election, 20.0), ("replication", run_replication, 8.0)):
        p = sub.add_parser(name, help=f"seeded {name} schedules")
        p.add_argument("--seeds", type=int, default=1000, help="number of schedules (default 1000)")
        p.add_argument("--start", type=int, default=0, help="first seed (default 0)")
        p.add_argument("--seed", type=int, help="run only this seed (replay)")
        p.add_argument("--duration", type=float, default=duration,
                       help=f"virtual seconds of faults per schedule (default {duration})")
        p.add_argument("--verbose", action="store_true", help="one line per seed")
        if name == "replication":
            p.add_argument("--store", choices=("simdisk", "mmap", "lmdb"), default="simdisk",
                           help="member stores: simdisk (crashes lose unflushed writes; default) or real "
                                "mmap/lmdb stores with tiny files in a temp directory")
            p.add_argument("--outsider", choices=("auth", "bounds"), default=None,
                           help="add forged frames from a peer without credentials: 'auth' (members use "
                                "authMode=secret; plausible and out-of-range frames must have no effect) or "
                                "'bounds' (no authentication; out-of-range values must have no effect)")
        p.set_defaults(func=func)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
