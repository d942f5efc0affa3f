"""Micro-benchmark: how long a flush round's ``fdatasync`` on a BlockingIO worker takes to come back to a busy reactor.

A member's flush round runs ``fdatasync`` on a :class:`dledger.diskio.BlockingIO` worker thread, without the
GIL.  When the call returns while the reactor thread is running Python, the worker waits for the GIL until
the reactor thread blocks in a syscall or the interpreter's switch interval (``sys.setswitchinterval``;
5 ms unless changed, the member's ``switchIntervalMs``) forces a hand-over.  This tool shows that wait: the
reactor thread runs ``--busy-ms`` of pure Python (no syscall) out of every ``--period-ms``, like a turn that
reads and appends a batch of requests, while rounds of a 1 KiB ``pwrite`` + ``fdatasync`` job are awaited
one after the other; for each switch interval of ``--intervals`` (interleaved ``--rounds`` times) it prints,
with the reactor idle and busy, the p50 / p99 in ms of a round's job back on the worker (``fdatasync``
returned and the GIL taken again: what the switch interval bounds) and of the round's result back on the
reactor thread (which a busy turn delays whatever the interval).

Usage: python -m tools.bench_gil_handback [--intervals 5,1,0.5] [--count 300] [--rounds 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

from twisted.internet import task


def spin(seconds: float) -> None:
    """Pure Python for ``seconds`` (no syscall, so the GIL is only released by a forced switch)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(200):
            pass


def synced(fd: int) -> float:
    """The job: ``fdatasync``, then the time once this thread holds the GIL again."""
    os.fdatasync(fd)
    return time.perf_counter()


async def rounds(lean, fd: int, count: int) -> tuple[list[float], list[float]]:
    """``count`` flush rounds (pwrite on the reactor thread, fdatasync on the worker): the times from the
    round's start to its job back on the worker and to its result on the reactor thread, each sorted."""
    on_worker, on_reactor, off, buf = [], [], 0, os.urandom(1024)
    for _ in range(count):
        t0 = time.perf_counter()
        os.pwrite(fd, buf, off)
        off += len(buf)
        back = await lean.run(synced, fd)
        on_worker.append(back - t0)
        on_reactor.append(time.perf_counter() - t0)
    return sorted(on_worker), sorted(on_reactor)


def pct(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))] * 1e3


async def main(reactor, args) -> None:
    from dledger.diskio import BlockingIO

    intervals = [float(x) for x in args.intervals.split(",")]
    lean = BlockingIO(reactor, threaded=True)
    busy = task.LoopingCall(spin, args.busy_ms / 1e3)
    print(f"{'switch ms':>9} {'reactor':>7} {'worker p50':>10} {'p99':>7} {'reactor p50':>11} {'p99':>7}")
    with tempfile.TemporaryDirectory(prefix="dledger-gil-", dir=args.dir) as directory:
        fd = os.open(os.path.join(directory, "f"), os.O_RDWR | os.O_CREAT, 0o644)
        before = sys.getswitchinterval()
        try:
            for _ in range(args.rounds):
                for ms in intervals:
                    sys.setswitchinterval(ms / 1e3)
                    for state in ("idle", "busy"):
                        os.ftruncate(fd, 0)
                        if state == "busy":
                            busy.start(args.period_ms / 1e3)
                        try:
                            worker, back = await rounds(lean, fd, args.count)
                        finally:
                            if busy.running:
                                busy.stop()
                        print(f"{ms:>9g} {state:>7} {pct(worker, .5):>10.2f} {pct(worker, .99):>7.2f} "
                              f"{pct(back, .5):>11.2f} {pct(back, .99):>7.2f}", flush=True)
        finally:
            sys.setswitchinterval(before)
            os.close(fd)
            lean.stop()


def cli() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--intervals", default="5,1,0.5", help="switch intervals to compare, ms (default 5,1,0.5)")
    p.add_argument("--count", type=int, default=300, help="flush rounds per measurement (default 300)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved runs of each interval (default 2)")
    p.add_argument("--busy-ms", type=float, default=2.0, help="pure Python per reactor busy stretch (default 2)")
    p.add_argument("--period-ms", type=float, default=2.5, help="one busy stretch every this many ms (default 2.5)")
    p.add_argument("--dir", default=None, help="directory for the fsync file (default: the temp directory)")
    args = p.parse_args()
    from twisted.internet.defer import Deferred

    task.react(lambda reactor: Deferred.fromCoroutine(main(reactor, args)))


if __name__ == "__main__":
    cli()
