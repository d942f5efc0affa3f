"""Run seeded simulations of dledger groups and report safety problems.

    python -m tools.simulate election --seeds 100000
    python -m tools.simulate replication --seeds 10000
    python -m tools.simulate replication --seed 1234 --verbose   # replay one schedule
    python -m tools.simulate replication --seeds 500 --store mmap  # members on real mmap stores
    python -m tools.simulate replication --seeds 500 --outsider auth  # forged frames without credentials
    python -m tools.simulate replication --seeds 10000 --snapshots  # state machines, snapshots, compaction,
                                                     # wiped members back through InstallSnapshot (issue #22)
    python -m tools.simulate replication --seeds 10000 --membership  # random member changes through the leader
                                                     # (issue #23)
    python -m tools.simulate replication --seeds 200 --membership --mutation own-term  # a broken build: caught?
    python -m tools.simulate replication --seeds 2000 --mix crash_leader_quick=0.5 --flush-latency 0.002-0.01 \
        --no-tear                                            # power cuts of the leader, slow fsyncs

Each schedule is deterministic in its seed: a failing seed replays exactly.
The summary line is
``seeds=N, faults=F, acked=A, lost=0, divergent=0, nonlinearizable=0`` and
the exit status is 1 if any schedule broke a safety rule.
"""

from __future__ import annotations

import argparse
import sys
import time

from dledger.testing.chaos import ChaosMix
from dledger.testing.election_sim import ELECTION_MIX
from dledger.testing.mutations import MUTATIONS, mutation
from dledger.testing.replication_sim import REPLICATION_MIX, SNAPSHOT_MIX
from dledger.testing.simdisk import DEFAULT_FLUSH_LATENCY

DEFAULT_MIXES = {"election": ELECTION_MIX, "replication": REPLICATION_MIX}


def _sim_options(args) -> dict:
    """The fault mix, flush latency and tearing the command line asked for (defaults: each simulator's own)."""
    out: dict = {"flush_latency": args.flush_latency, "tear": not args.no_tear}
    if args.term_latency is not None:
        out["term_write_latency"] = args.term_latency
    if args.mix:
        base = SNAPSHOT_MIX if getattr(args, "snapshots", False) else DEFAULT_MIXES[args.kind]
        out["mix"] = ChaosMix.parse(args.mix, base)
    return out


def _latency(text: str):
    """``0.004`` (seconds) or ``0.001-0.008`` (a range each flush draws from)."""
    low, dash, high = text.partition("-")
    try:
        value = (float(low), float(high)) if dash else float(low)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not seconds (0.004) or a range (0.001-0.008)") from None
    if isinstance(value, tuple) and value[0] > value[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: the range must be LOW-HIGH with LOW <= HIGH")
    return value


def _mix(text: str) -> str:
    try:
        ChaosMix.parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def _seeds(args) -> range:
    if args.seed is not None:
        return range(args.seed, args.seed + 1)
    return range(args.start, args.start + args.seeds)


def run_election(args) -> int:
    from dledger.testing.election_sim import run_election_seed
    bad = elections = faults = 0
    seeds = _seeds(args)
    started = time.monotonic()
    quick = 0
    for k, seed in enumerate(seeds, 1):
        r = run_election_seed(seed, duration=args.duration, **_sim_options(args))
        elections += r.elections
        faults += r.faults
        quick += r.quick_restarts
        if r.violation or not r.recovered:
            bad += 1
            what = r.violation or "no leader after healing"
            print(f"seed {seed}: {what}\n  replay: python -m tools.simulate election --seed {seed}"
                  f"{_replay_options(args)}", flush=True)
        elif args.verbose:
            print(f"seed {seed}: members={r.members} elections={r.elections} faults={r.faults} "
                  f"max_term={r.max_term}", flush=True)
        _progress(args, k, len(seeds), started)
    print(f"seeds={len(seeds)}, faults={faults}, quick_leader_restarts={quick}, elections={elections}, "
          f"violations={bad} ({time.monotonic() - started:.1f}s)")
    return 1 if bad else 0


def run_replication(args) -> int:
    from dledger.testing.replication_sim import run_replication_seed
    totals = dict(faults=0, acked=0, lost=0, divergent=0, nonlinearizable=0, leaders=0, stuck=0, forged=0,
                  outsider_effects=0, quick=0, wipes=0, snapshots=0, installs=0, state_mismatch=0, proposed=0,
                  committed=0, refused=0, change_failed=0, joined=0, config_commits=0, decisions=0, membership=0,
                  non_voter_votes=0)
    refusals: dict[str, int] = {}
    failing = []
    seeds = _seeds(args)
    started = time.monotonic()
    for k, seed in enumerate(seeds, 1):
        extra = {"outsider": args.outsider} if args.outsider else {}
        if args.snapshots:
            extra["snapshots"] = True
        if args.membership:
            extra["membership"] = True
        with mutation(args.mutation):
            r = run_replication_seed(seed, duration=args.duration, store=args.store, **extra, **_sim_options(args))
        totals["quick"] += r.quick_restarts
        totals["forged"] += r.forged
        totals["outsider_effects"] += len(r.outsider_effects)
        totals["faults"] += r.faults
        totals["acked"] += r.acked
        for key in ("lost", "divergent", "nonlinearizable", "leaders"):
            totals[key] += len(getattr(r, key))
        totals["stuck"] += bool(r.stuck)
        totals["wipes"] += r.wipes
        totals["snapshots"] += r.snapshots_taken
        totals["installs"] += r.installs
        totals["state_mismatch"] += len(r.state_mismatch)
        if r.changes is not None:
            _add_changes(totals, refusals, r)
        if not r.ok:
            failing.append(seed)
            print(f"seed {seed} ({r.members} members):", flush=True)
            for problem in r.problems()[:10]:
                print(f"  {problem}")
            store = "" if args.store == "simdisk" else f" --store {args.store}"
            store += f" --outsider {args.outsider}" if args.outsider else ""
            store += " --snapshots" if args.snapshots else ""
            store += " --membership" if args.membership else ""
            store += f" --mutation {args.mutation}" if args.mutation else ""
            store += _replay_options(args)
            print(f"  replay: python -m tools.simulate replication --seed {seed}{store}", flush=True)
        elif args.verbose:
            print(f"seed {seed}: members={r.members} faults={r.faults} appends={r.appends} acked={r.acked} "
                  f"gets={r.gets}" + (f" changes proposed={r.changes.total('proposed')} committed="
                                      f"{r.changes.total('committed')} config_entries={r.config_commits}"
                                      if r.changes is not None else ""), flush=True)
        _progress(args, k, len(seeds), started)
    print(f"seeds={len(seeds)}, faults={totals['faults']}, quick_leader_restarts={totals['quick']}, "
          f"acked={totals['acked']}, lost={totals['lost']}, "
          f"divergent={totals['divergent']}, nonlinearizable={totals['nonlinearizable']}, "
          f"two_leaders={totals['leaders']}, stuck={totals['stuck']}"
          + (f", forged={totals['forged']}, outsider_effects={totals['outsider_effects']}" if args.outsider else "")
          + (f", wipes={totals['wipes']}, snapshots_on_demand={totals['snapshots']}, "
             f"installs={totals['installs']}, state_mismatch={totals['state_mismatch']}" if args.snapshots else "")
          + (f", changes_proposed={totals['proposed']}, changes_committed={totals['committed']}, "
             f"refused={totals['refused']}, change_failed={totals['change_failed']}, joined={totals['joined']}, "
             f"config_entries_committed={totals['config_commits']}, decisions_checked={totals['decisions']}, "
             f"votes_by_non_voters={totals['non_voter_votes']}, membership={totals['membership']}"
             if args.membership else "")
          + f" ({time.monotonic() - started:.1f}s)")
    if args.membership and refusals:
        print("refusals: " + ", ".join(f"{k}={v}" for k, v in sorted(refusals.items(), key=lambda kv: -kv[1])))
    return 1 if failing else 0


def _add_changes(totals: dict, refusals: dict, r) -> None:
    """Membership mode: the change schedule's figures of one seed into the totals."""
    c = r.changes
    totals["proposed"] += c.total("proposed")
    totals["committed"] += c.total("committed")
    totals["refused"] += c.total("refused")
    totals["change_failed"] += c.failed
    totals["joined"] += c.members_added
    totals["config_commits"] += r.config_commits
    totals["decisions"] += r.decisions
    totals["non_voter_votes"] += r.non_voter_votes
    totals["membership"] += len(r.membership)
    for reason, n in c.refused.items():
        refusals[reason] = refusals.get(reason, 0) + n


def _replay_options(args) -> str:
    out = f" --duration {args.duration:g}" if args.duration != args.default_duration else ""
    out += f" --mix {args.mix}" if args.mix else ""
    if args.flush_latency_text is not None:
        out += f" --flush-latency {args.flush_latency_text}"
    if args.term_latency_text is not None:
        out += f" --term-latency {args.term_latency_text}"
    return out + (" --no-tear" if args.no_tear else "")


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
        p.add_argument("--mix", type=_mix, default=None,
                       help="change the fault mix: name=value,... over the simulator's own (names: partition, "
                            "block, heal, crash, crash_leader, crash_leader_quick, mean_interval, restart_after, "
                            "quick_restart_after; the last two as LOW-HIGH seconds)")
        p.add_argument("--flush-latency", type=_latency, default=None, dest="flush_latency_arg",
                       help="virtual seconds a simulated disk's flush takes: 0.004, or a range 0.001-0.008 "
                            "drawn per flush (default 0.001-0.008; 0: durable at once)")
        p.add_argument("--term-latency", type=_latency, default=None,
                       help="virtual seconds a term/vote write takes (seconds or LOW-HIGH; default 0: at once); "
                            "a crash lets a write in flight land or not")
        p.add_argument("--no-tear", action="store_true",
                       help="a crash loses every unflushed entry (default: a random prefix of them survives)")
        if name == "replication":
            p.add_argument("--store", choices=("simdisk", "mmap", "lmdb"), default="simdisk",
                           help="member stores: simdisk (crashes lose unflushed writes; default) or real "
                                "mmap/lmdb stores with tiny files in a temp directory")
            p.add_argument("--outsider", choices=("auth", "bounds"), default=None,
                           help="add forged frames from a peer without credentials: 'auth' (members use "
                                "authMode=secret; plausible and out-of-range frames must have no effect) or "
                                "'bounds' (no authentication; out-of-range values must have no effect)")
            p.add_argument("--snapshots", action="store_true",
                           help="members run a state machine, take snapshots and compact; members are wiped and "
                                "return through InstallSnapshot; each machine is checked against the committed "
                                "log (issue #22; simdisk only; default mix: SNAPSHOT_MIX)")
            p.add_argument("--membership", action="store_true",
                           help="the leader is asked at random to add, promote, remove and replace members; every "
                                "commit decision and election is checked against the configurations, and the "
                                "committed configurations must form one single-server sequence (issue #23; "
                                "simdisk only)")
            p.add_argument("--mutation", choices=sorted(MUTATIONS), default=None,
                           help="run a deliberately broken build, to see the checks catch it: 'own-term' lets a new "
                                "leader propose a change before it committed an entry of its term (Ongaro 2015), "
                                "'two-in-flight' lets a change be proposed while another is uncommitted")
        p.set_defaults(func=func, default_duration=duration)
    args = parser.parse_args(argv)
    if getattr(args, "snapshots", False) and args.store != "simdisk":
        parser.error("--snapshots runs on simulated disks only (leave --store at simdisk)")
    if getattr(args, "membership", False) and (args.snapshots or args.store != "simdisk"):
        parser.error("--membership runs on simulated disks without --snapshots")
    if getattr(args, "mutation", None) and not args.membership:
        parser.error("--mutation breaks the membership rules: use it with --membership")
    raw = argv if argv is not None else sys.argv[1:]
    args.flush_latency_text = _option_text(raw, "--flush-latency")
    args.term_latency_text = _option_text(raw, "--term-latency")
    args.flush_latency = DEFAULT_FLUSH_LATENCY if args.flush_latency_arg is None else args.flush_latency_arg
    return args.func(args)


def _option_text(argv: list[str], name: str) -> str | None:
    """The text given to ``name`` (for the replay line), or None."""
    for k, word in enumerate(argv):
        if word == name and k + 1 < len(argv):
            return argv[k + 1]
        if word.startswith(name + "="):
            return word.split("=", 1)[1]
    return None


if __name__ == "__main__":
    sys.exit(main())
