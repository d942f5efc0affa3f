"""Micro-benchmark: CPU time of a leader batch append (64 x 1 KiB, or --batch) into an mmap store, as a member makes it.

A member appends a client batch through its write guard (:class:`dledger.store.guard.LogGuard`: the
role check and the append hooks) into the store; on a tree without the guard (before #14's split) it calls
the store's ``append_batch_as_leader`` directly, as the member did then.  Measured with and without an
append hook (the contract suite's ``StampPos``: 8 body bytes rewritten, like RocketMQ's physical-offset
hook), nothing flushed: ``time.process_time()`` per batch, the minimum of ``--reps`` repetitions of
``--batches`` batches each.  The follower path is measured too: the same batches stored as a follower
stores a push (``append_batch_as_follower`` of entries that arrive encoded).

The follower's whole per-push store path is measured last: a push of 256 x 1 KiB decoded as the binary
PUSH decoder decodes it (every entry CRC-checked) and stored (``push256_us``, per push).

``--group memory|mmap`` measures instead the CPU of a whole in-process 3-member group
(:class:`dledger.testing.Cluster`, virtual clock, ``--group-entries`` entries appended by one client in
batches of 256 x 1 KiB, 4 in flight): every member's append path, leader and followers.

``--against DIR`` compares with another source tree (e.g. an exported base commit): the two run in
subprocesses, interleaved ``--pairs`` times, and the ratios after/before are printed.

Usage: python -m tools.bench_append [--batches 200] [--reps 7] [--batch 64] [--group memory|mmap]
       [--against DIR --pairs 7]
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


def measure(batches: int, reps: int, hook: bool, batch: int = BATCH) -> float:
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
            batch_list = [[Entry(body=body, term=1) for _ in range(batch)] for _ in range(batches)]
            t0 = time.process_time()
            for entries in batch_list:
                append(entries)
            best = min(best, (time.process_time() - t0) / batches * 1e6)
            fired(store.shutdown())
    return best


def _leader_pushes(batches: int, batch: int, data_file_size: int) -> list:
    """``batches`` pushes of ``batch`` x 1 KiB as a leader's store encodes them (EntryLists, sections made)."""
    from dledger.entry import Entry, EntryList
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState, fired

    body = os.urandom(SIZE)
    with tempfile.TemporaryDirectory(prefix="dledger-bench-append-") as d:
        src = MmapLogStore(os.path.join(d, "leader"), FakeMemberState(), data_file_size=data_file_size,
                           index_file_size=1 << 20)
        src.startup()
        pushes = []
        for _ in range(batches):
            pushed = EntryList(src.append_batch_as_leader([Entry(body=body, term=1) for _ in range(batch)]))
            pushed.section()  # a push arrives encoded
            pushes.append(pushed)
        fired(src.shutdown())
    return pushes


def _best_follower_run(reps: int, batches: int, data_file_size: int, run) -> float:
    """Best of ``reps`` runs of ``run(append)`` (a follower's ``append_batch_as_follower`` on a fresh store),
    in microseconds of CPU per batch."""
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState, fired

    try:
        from dledger.store.guard import LogGuard
    except ImportError:
        LogGuard = None
    best = float("inf")
    for _ in range(reps):
        with tempfile.TemporaryDirectory(prefix="dledger-bench-append-") as d:
            state = FakeMemberState()
            state.follow(1, "n0")
            store = MmapLogStore(d, state, data_file_size=data_file_size, index_file_size=1 << 20)
            store.startup()
            append = (store if LogGuard is None else LogGuard(store, state)).append_batch_as_follower
            t0 = time.process_time()
            run(append)
            best = min(best, (time.process_time() - t0) / batches * 1e6)
            fired(store.shutdown())
    return best


def measure_follower(batches: int, reps: int, batch: int = BATCH) -> float:
    """Microseconds of CPU per batch of a follower storing pushed batches (best of ``reps``)."""
    pushes = _leader_pushes(batches, batch, 256 << 20)

    def run(append):
        for pushed in pushes:
            append(pushed, 1, "n0")

    return _best_follower_run(reps, batches, 256 << 20, run)


def measure_follower_push(batches: int, reps: int, batch: int = 256) -> float:
    """Microseconds of CPU per push of a follower decoding a push's section and storing it (best of ``reps``).

    What a follower does per push of ``batch`` x 1 KiB, less the frame and the reactor: the section
    decoded as the binary PUSH decoder does (:func:`dledger.entry.decode_entries`, every entry CRC-checked,
    and :func:`dledger.messages.decoded_entries_in_bounds`, into an EntryList carrying the section), then
    ``append_batch_as_follower`` (the plain-run path).
    """
    from dledger.entry import EntryList, decode_entries
    from dledger.messages import decoded_entries_in_bounds

    sections = [pushed.section() for pushed in _leader_pushes(batches, batch, 512 << 20)]

    def run(append):
        for section, crc in sections:
            entries, _ = decode_entries(section, 0, len(section), batch, accept_zero_crc=True)
            if not decoded_entries_in_bounds(entries):
                raise SystemExit("an entry out of bounds")
            pushed = EntryList(entries, (section, crc), crc_checked=True, largest=entries.largest)
            if getattr(entries, "irecs", None) is not None:  # the C decoder's index records (Round 2g), as remoting
                pushed.irecs = entries.irecs
            append(pushed, 1, "n0")

    return _best_follower_run(reps, batches, 512 << 20, run)


def group_cpu(kind: str, total: int, batch: int = 256, in_flight: int = 4) -> float:
    """CPU seconds of a 3-member in-process group committing ``total`` entries appended in batches."""
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing import Cluster

    with tempfile.TemporaryDirectory(prefix="dledger-bench-group-") as d:
        factory = None
        if kind == "mmap":
            def factory(mid, cfg, state):
                return MmapLogStore(os.path.join(d, mid), state, data_file_size=256 << 20, index_file_size=8 << 20)
        cluster = Cluster(3, seed=1, store_factory=factory)
        cluster.start()
        cluster.wait_for_leader()
        client = cluster.client()
        body = b"x" * SIZE
        done, sent, failed = [0], [0], []

        def send():
            if sent[0] < total:
                sent[0] += batch
                d = client.append_batch([body] * batch)
                d.addCallbacks(lambda _: (done.__setitem__(0, done[0] + batch), send()), failed.append)

        t0 = time.process_time()
        for _ in range(in_flight):
            send()
        if not cluster.run_until(lambda: done[0] >= total or failed, 600) or failed:
            raise SystemExit(f"the group did not commit every batch: {failed[:1]}")
        cpu = time.process_time() - t0
        cluster.stop()
        return cpu


def run_json(args) -> dict:
    import dledger
    tree = os.path.dirname(os.path.dirname(dledger.__file__))
    if args.group:
        return {"tree": tree, "group_s": group_cpu(args.group, args.group_entries)}
    return {"tree": tree, "plain_us": measure(args.batches, args.reps, False, args.batch),
            "hook_us": measure(args.batches, args.reps, True, args.batch),
            "follower_us": measure_follower(args.batches, args.reps, args.batch),
            "push256_us": measure_follower_push(args.batches, args.reps)}


def child(tree: str, args) -> dict:
    env = dict(os.environ, PYTHONPATH=tree)
    cmd = [sys.executable, os.path.abspath(__file__), "--json", "--batches", str(args.batches), "--reps",
           str(args.reps), "--batch", str(args.batch),
           "--group-entries", str(args.group_entries)] + (["--group", args.group] if args.group else [])
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def here_tree() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batches", type=int, default=200)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--batch", type=int, default=BATCH,
                   help=f"entries per leader batch and per follower push (default {BATCH}; the decoded push is 256)")
    p.add_argument("--group", choices=("memory", "mmap"), help="CPU of a whole in-process group on these stores")
    p.add_argument("--group-entries", type=int, default=200_000)
    p.add_argument("--against", help="another source tree to compare with (interleaved subprocesses)")
    p.add_argument("--pairs", type=int, default=7)
    p.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.json:
        print(json.dumps(run_json(args)))
        return
    if not args.against:
        r = run_json(args)
        if args.group:
            print(f"{r['tree']}: group on {args.group} stores, {r['group_s']:.3f} CPU seconds")
        else:
            print(f"{r['tree']}: no hook {r['plain_us']:.1f} us/batch, hook {r['hook_us']:.1f} us/batch, "
                  f"follower {r['follower_us']:.1f} us/batch, decoded push of 256 {r['push256_us']:.1f} us")
        return
    if args.group:
        pairs = []
        for k in range(args.pairs):
            b, a = child(args.against, args)["group_s"], child(here_tree(), args)["group_s"]
            pairs.append((b, a))
            print(f"pair {k + 1}: {b:.3f} -> {a:.3f} CPU s ({a / b:.3f})", flush=True)
        mb, ma = (sorted(x)[len(x) // 2] for x in zip(*pairs))
        print(f"median: before {mb:.3f} s, after {ma:.3f} s, ratio {ma / mb:.3f}")
        return
    here = here_tree()
    rows = []
    for k in range(args.pairs):
        before, after = child(args.against, args), child(here, args)
        assert before["tree"] != after["tree"], "both runs imported the same tree"
        rows.append((before, after))
        print(f"pair {k + 1}: no hook {before['plain_us']:.1f} -> {after['plain_us']:.1f} us "
              f"({after['plain_us'] / before['plain_us']:.3f}), hook {before['hook_us']:.1f} -> "
              f"{after['hook_us']:.1f} us ({after['hook_us'] / before['hook_us']:.3f}), follower "
              f"{before['follower_us']:.1f} -> {after['follower_us']:.1f} us "
              f"({after['follower_us'] / before['follower_us']:.3f}), decoded push of 256 "
              f"{before['push256_us']:.1f} -> {after['push256_us']:.1f} us "
              f"({after['push256_us'] / before['push256_us']:.3f})", flush=True)
    for key, name in (("plain_us", "no hook"), ("hook_us", "hook"), ("follower_us", "follower"),
                      ("push256_us", "decoded push of 256 (per push)")):
        b, a = min(r[0][key] for r in rows), min(r[1][key] for r in rows)
        print(f"min over pairs, {name}: before {b:.1f} us/batch, after {a:.1f} us/batch, ratio {a / b:.3f}")


if __name__ == "__main__":
    main()
