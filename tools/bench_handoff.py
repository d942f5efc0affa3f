"""Micro-benchmark: CPU and wall time of one hand-off to a worker thread, Twisted's reactor pool vs BlockingIO.

For each way (``pool``: ``deferToThreadPool`` on the reactor's thread pool, what a threaded BlockingIO did
before; ``lean``: ``dledger.diskio.BlockingIO(reactor, threaded=True)``), interleaved ``--rounds`` times, it
awaits ``--count`` no-op jobs one after the other, then ``--count`` rounds of a 64 KiB ``pwrite`` on the reactor
thread plus an ``fdatasync`` job (a store's flush round), and prints the process CPU time and wall time per
hand-off.  The file lives in ``--dir`` (default: the temp directory).

Usage: python -m tools.bench_handoff [--count 5000] [--rounds 3] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

from twisted.internet import task, threads


async def measure(reactor, run, count: int, fd: int) -> tuple[float, float, float, float]:
    """(noop cpu, noop wall, pwrite+fdatasync cpu, its wall), in microseconds per hand-off."""
    def noop():
        return None

    await run(noop)
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(count):
        await run(noop)
    t1, c1 = time.perf_counter(), time.process_time()
    buf, off = os.urandom(65536), 0
    syncs = max(count // 5, 1)
    t2, c2 = time.perf_counter(), time.process_time()
    for _ in range(syncs):
        os.pwrite(fd, buf, off)
        off += len(buf)
        await run(os.fdatasync, fd)
    t3, c3 = time.perf_counter(), time.process_time()
    us = 1e6
    return ((c1 - c0) / count * us, (t1 - t0) / count * us, (c3 - c2) / syncs * us, (t3 - t2) / syncs * us)


async def main(reactor, args) -> None:
    from dledger.diskio import BlockingIO

    lean = BlockingIO(reactor, threaded=True)
    pool = reactor.getThreadPool()
    ways = {"pool": lambda fn, *a: threads.deferToThreadPool(reactor, pool, fn, *a), "lean": lean.run}
    print(f"{'way':5} {'noop cpu us':>12} {'noop wall us':>13} {'fsync cpu us':>13} {'fsync wall us':>14}")
    with tempfile.TemporaryDirectory(prefix="dledger-handoff-", dir=args.dir) as directory:
        fd = os.open(os.path.join(directory, "f"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            for _ in range(args.rounds):
                for name, run in ways.items():
                    os.ftruncate(fd, 0)
                    figures = await measure(reactor, run, args.count, fd)
                    print(f"{name:5} " + " ".join(f"{v:>12.1f}" for v in figures))
        finally:
            os.close(fd)
            lean.stop()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--count", type=int, default=5000, help="no-op hand-offs per run (fsync rounds: a fifth)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved runs of each way")
    p.add_argument("--dir", default=None, help="directory for the fsync file (default: the temp directory)")
    args = p.parse_args()
    from twisted.internet.defer import Deferred

    task.react(lambda reactor: Deferred.fromCoroutine(main(reactor, args)))


if __name__ == "__main__":
    cli()
