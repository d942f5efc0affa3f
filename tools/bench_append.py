"""Micro-benchmark: CPU time of a leader batch append (64 x 1 KiB) into an mmap store, as a member makes it.

A member appends a client batch through its write guard (:class:`dledger.store.guard.LogGuard`: the
role check and the append hooks) into the store; on a tree without the guard (before #14's split) it calls
the store's ``append_batch_as_leader`` directly, as the member did then.  Measured with and without an
append hook (the contract suite's ``StampPos``: 8 body bytes rewritten, like RocketMQ's physical-offset
hook), nothing flushed: ``time.process_time()`` per batch, the minimum of ``--reps`` repetitions of
``--batches`` batches each.

``--against DIR`` compares with another source tree (e.g. an exported base commit): the two run in
subprocesses, interleaved ``--pairs`` times, and the ratios after/before are printed.

Usage: python -m tools.bench_append [--batches 200] [--reps 7] [--against DIR --pairs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

BATCH, SIZE = 64, 1024


def measure(batches: int, reps: int, hook: bool) -> float:
    """Microseconds of CPU per batch (best of ``reps``)."""
    from dledger.entry import Entry
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState, StampPos, fired

    try:
        from dledger.store.guard import LogGuard
    except ImportError:
        LogGuard = None
    body = os.urandom(SIZE)
    best = float("inf")
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="dledger-bench-append-") as d:
            state = FakeMemberState()
            store = MmapLogStore(d, state, data_file_size=256 << 20, index_file_size=1 << 20)
            store.startup()
            target = store if LogGuard is None else LogGuard(store, state)
            if hook:
                target.add_append_hook(StampPos())
            append = target.append_batch_as_leader
            batch_list = [[Entry(body=body, term=1) for _ in range(BATCH)] for _ in range(batches)]
            t0 = time.process_time()
            for entries in batch_list:
                append(entries)
            best = min(best, (time.process_time() - t0) / batches * 1e6)
            fired(store.shutdown())
    return best


def run_json(args) -> dict:
    import dledger
    return {"tree": os.path.dirname(os.path.dirname(dledger.__file__)),
            "plain_us": measure(args.batches, args.reps, False), "hook_us": measure(args.batches, args.reps, True)}


def child(tree: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--json", "--batches", str(args.batches),
                          "--reps", str(args.reps)], env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--against", help="another source tree to compare with (interleaved subprocesses)")
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.json:
        print(json.dumps(run_json(args)))
        return
    if not args.against:
        r = run_json(args)
        print(f"{r['tree']}: no hook {r['plain_us']:.1f} us/batch, hook {r['hook_us']:.1f} us/batch")
        return
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for k in range(args.pairs):
        before, after = child(args.against, args), child(here, args)
        assert before["tree"] != after["tree"], "both runs imported the same tree"
        rows.append((before, after))
        print(f"pair {k + 1}: no hook {before['plain_us']:.1f} -> {after['plain_us']:.1f} us "
              f"({after['plain_us'] / before['plain_us']:.3f}), hook {before['hook_us']:.1f} -> "
              f"{after['hook_us']:.1f} us ({after['hook_us'] / before['hook_us']:.3f})", flush=True)
    for key, name in (("plain_us", "no hook"), ("hook_us", "hook")):
        b, a = min(r[0][key] for r in rows), min(r[1][key] for r in rows)
        print(f"min over pairs, {name}: before {b:.1f} us/batch, after {a:.1f} us/batch, ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
