"""Micro-benchmark: CPU time of the mmap store's batch appends (and a flush round), fsync left out.

A fresh :class:`dledger.store.mmapfile.MmapLogStore` (in ``/dev/shm`` when there is one) takes
``--batches`` batches of ``--batch`` entries of ``--size`` body bytes, as a leader
(``append_batch_as_leader``) or as a follower (``append_batch_as_follower`` of the encoded entries a
push carries), each batch followed by ``flush()`` with the fsync replaced by a no-op, so what is
measured is the CPU the store spends (placement, encoding, ``pwrite`` into the page cache, index
records, flush planning).  Prints the best of ``--reps`` runs in microseconds per batch
(``time.process_time``).  To compare two trees, run it alternately with each on ``PYTHONPATH``.

Usage: python -m tools.bench_store_append {leader,follower} [--batches 300] [--batch 64] [--size 1024] [--reps 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("leader", "follower"))
    p.add_argument("--batches", type=int, default=300, help="batches per run (default 300)")
    p.add_argument("--batch", type=int, default=64, help="entries per batch (default 64)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--reps", type=int, default=3, help="runs; the best is printed (default 3)")
    args = p.parse_args(argv)

    from dledger import diskio
    from dledger.entry import Entry, EntryList
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState

    diskio.flush_files = lambda *a, **k: None  # CPU only: no fsync

    def make(path, state):
        store = MmapLogStore(path, state, data_file_size=8 << 20, index_file_size=1 << 20)
        store.startup()
        return store

    tmp = tempfile.mkdtemp(dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        bodies = [bytes([i % 251]) * args.size for i in range(args.batch)]
        src = make(os.path.join(tmp, "src"), FakeMemberState())
        pushes = []
        for _ in range(args.batches):
            pushed = EntryList(src.append_batch_as_leader([Entry(body=b, term=1) for b in bodies]))
            pushed.section()  # a push arrives encoded
            pushes.append(pushed)
        src.abandon()
        best = float("inf")
        for rep in range(args.reps):
            state = FakeMemberState()
            if args.mode == "follower":
                state.follow(1, "n0")
            store = make(os.path.join(tmp, f"run{rep}"), state)
            if args.mode == "leader":
                batches = [[Entry(body=b, term=1) for b in bodies] for _ in range(args.batches)]
                t = time.process_time()
                for batch in batches:
                    store.append_batch_as_leader(batch)
                    store.flush()
            else:
                t = time.process_time()
                for batch in pushes:
                    store.append_batch_as_follower(batch, 1, "n0")
                    store.flush()
            best = min(best, time.process_time() - t)
            store.abandon()
            shutil.rmtree(os.path.join(tmp, f"run{rep}"))
        print(f"{best / args.batches * 1e6:.1f}")
    finally:
        shutil.rmtree(tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
