"""The store benchmark: append entries as a leader in batches and flush them, as a member would.

``sync``: every batch is followed by ``flush()`` (group commit: one round per
batch, or fewer when rounds overlap with ``pipeline``).  ``async``: the
store's own timer flushes every ``flushFileInterval`` ms.  With ``io=inline``
the fsync runs on the calling thread (the reactor would be blocked for it);
with ``io=thread`` it runs on a threaded BlockingIO's workers (as a member's) and the report shows
how little of each flush the reactor itself spends.  Figures go to
``docs/benchmarks.md``; nothing here asserts a speed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from twisted.internet import task
from twisted.internet.defer import Deferred

from dledger import diskio
from dledger.entry import HEADER_SIZE, Entry
from dledger.errors import ConfigError
from dledger.testing.store_contract import FakeMemberState, fired

STORES = ("mmap", "lmdb", "memory")


@dataclass
class StoreBenchOptions:
    store: str = "mmap"
    size: int = 1024
    count: int = 100_000
    batch: int = 256
    flush: str = "sync"
    io: str = "inline"
    pipeline: bool = False
    directory: str | None = None
    keep: bool = False
    data_file_size: int = 1 << 30
    index_file_size: int = 160 << 20
    flush_interval_ms: int = 10
    lmdb_map_size: int = 1 << 30


@dataclass
class StoreBenchResult:
    options: StoreBenchOptions
    seconds: float
    entries_per_s: float
    mb_per_s: float
    flush: dict = field(default_factory=dict)
    rss_mib: list[tuple[int, dict]] = field(default_factory=list)
    #: Process CPU time (every thread: the reactor's and the flush workers') over the measured window.
    cpu_seconds: float = 0.0

    def as_dict(self) -> dict:
        return asdict(self)


def rss() -> dict[str, float]:
    """VmRSS, RssAnon and RssFile of this process in MiB (Linux; empty elsewhere)."""
    out = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile"):
                    out[key] = int(value.split()[0]) / 1024.0
    except OSError:
        pass
    return out


def make_store(opts: StoreBenchOptions, directory: Path, state, *, clock, blocking_io):
    if opts.store == "memory":
        from dledger.store.memory import MemoryLogStore
        return MemoryLogStore(state, data_file_size=opts.data_file_size, max_entry_size=opts.data_file_size - 8)
    if opts.store == "lmdb":
        from dledger.store.lmdbstore import LmdbLogStore
        return LmdbLogStore(directory / "lmdb", state, data_file_size=opts.data_file_size,
                            max_entry_size=opts.data_file_size - 8, map_size=opts.lmdb_map_size,
                            flush_policy=opts.flush, flush_interval_ms=opts.flush_interval_ms, clock=clock,
                            blocking_io=blocking_io)
    from dledger.store.mmapfile import MmapLogStore
    return MmapLogStore(directory, state, data_file_size=opts.data_file_size, index_file_size=opts.index_file_size,
                        max_entry_size=opts.data_file_size - 8, flush_policy=opts.flush,
                        flush_interval_ms=opts.flush_interval_ms, clock=clock, blocking_io=blocking_io,
                        disk_usage=lambda: 0.0)


def _samples(count: int) -> set[int]:
    return {count // 4, count // 2, 3 * count // 4}


def _result(opts: StoreBenchOptions, store, seconds: float, rss_mib, cpu: float = 0.0) -> StoreBenchResult:
    stats = getattr(store, "flush_stats", None)
    return StoreBenchResult(opts, seconds, opts.count / seconds, opts.count * (HEADER_SIZE + opts.size) / seconds / 1e6,
                            stats.summary() if stats is not None else {}, rss_mib, cpu)


@contextlib.contextmanager
def _signals_between_batches():
    """SIGTERM/SIGINT only set a flag here; the loop raises between batches (``check()``).

    Why: an exception raised by a signal handler lands in whatever code runs at that moment; inside
    the store's flush (a Deferred callback chain, which catches every exception) it became "flush
    failed: signal 15" and the benchmark went on instead of stopping and removing its directory.
    """
    import signal
    import threading  # allowed: only to ask whether this is the main thread (signal handlers), no thread is started

    from dledger.cli import Terminated

    received: list[int] = []

    def check() -> None:
        if received:
            raise Terminated(received[0]) if received[0] == signal.SIGTERM else KeyboardInterrupt()

    if threading.current_thread() is not threading.main_thread():
        yield check
        return
    previous = {sig: signal.signal(sig, lambda signum, _frame: received.append(signum))
                for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield check
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def run_inline(opts: StoreBenchOptions) -> StoreBenchResult:
    """Run with blocking I/O on this thread; the async timer runs on a Clock advanced by the wall clock."""
    with _directory(opts) as directory, _signals_between_batches() as check_signals:
        clock = task.Clock()
        store = make_store(opts, directory, FakeMemberState(), clock=clock, blocking_io=diskio.INLINE)
        store.startup()
        body = os.urandom(opts.size)
        samples = _samples(opts.count)
        rss_mib = [(0, rss())]
        append = store.append_as_leader
        t0 = last = time.perf_counter()
        c0 = time.process_time()
        done = 0
        while done < opts.count:
            check_signals()
            n = min(opts.batch, opts.count - done)
            for _ in range(n):
                append(Entry(body=body, term=1))
            done += n
            if opts.flush == "sync":
                fired(store.flush())
            else:
                now = time.perf_counter()
                clock.advance(now - last)
                last = now
            if any(done - n < s <= done for s in samples):
                rss_mib.append((done, rss()))
        fired(store.flush())
        seconds = time.perf_counter() - t0
        cpu = time.process_time() - c0
        rss_mib.append((done, rss()))
        result = _result(opts, store, seconds, rss_mib, cpu)
        fired(store.shutdown())
        return result


async def run_threaded(reactor, opts: StoreBenchOptions) -> StoreBenchResult:
    """Run under the reactor with flushes on a threaded BlockingIO (as a member does)."""
    with _directory(opts) as directory:
        io = diskio.BlockingIO(reactor, threaded=True)
        store = make_store(opts, directory, FakeMemberState(), clock=reactor, blocking_io=io)
        store.startup()
        try:
            body = os.urandom(opts.size)
            samples = _samples(opts.count)
            rss_mib = [(0, rss())]
            append = store.append_as_leader
            in_flight: Deferred | None = None
            t0 = time.perf_counter()
            c0 = time.process_time()
            done = 0
            while done < opts.count:
                n = min(opts.batch, opts.count - done)
                for _ in range(n):
                    append(Entry(body=body, term=1))
                done += n
                if opts.flush == "sync":
                    if opts.pipeline:
                        if in_flight is not None:
                            await in_flight
                        in_flight = store.flush()
                    else:
                        await store.flush()
                else:
                    await task.deferLater(reactor, 0, lambda: None)
                if any(done - n < s <= done for s in samples):
                    rss_mib.append((done, rss()))
            if in_flight is not None:
                await in_flight
            await store.flush()
            seconds = time.perf_counter() - t0
            cpu = time.process_time() - c0
            rss_mib.append((done, rss()))
            return _result(opts, store, seconds, rss_mib, cpu)
        finally:
            # Also when a signal cancels the run: the store's flush rounds (its async timer's too) run on the
            # BlockingIO's threads, so the store is shut down and the threads stopped before its directory goes
            # (a round still running would fail on deleted files and print a traceback).
            await store.shutdown()
            io.stop()


class _directory:
    """The store directory: the given one, or a temporary one removed afterwards (unless ``keep``)."""

    def __init__(self, opts: StoreBenchOptions):
        self.opts = opts
        self.path: Path | None = None
        self.temp = False

    def __enter__(self) -> Path:
        if self.opts.directory:
            self.path = Path(self.opts.directory)
            self.path.mkdir(parents=True, exist_ok=True)
            if any(self.path.iterdir()):
                raise ConfigError(f"--dir {self.path}: not empty; give an empty or new directory (the benchmark "
                                  f"writes and then deletes its store there)")
        else:
            self.path = Path(tempfile.mkdtemp(prefix="dledger-bench-"))
            self.temp = True
        return self.path / "dledger-bench"

    def __exit__(self, *exc) -> None:
        if self.path is not None and not self.opts.keep:
            if self.temp:
                shutil.rmtree(self.path, ignore_errors=True)
            else:
                shutil.rmtree(self.path / "dledger-bench", ignore_errors=True)


def format_result(r: StoreBenchResult) -> str:
    o = r.options
    lines = [f"store bench: {o.store}, {o.size}-byte bodies, {o.count} entries, batches of {o.batch}, "
             f"flush {o.flush}, io {o.io}{' (pipelined)' if o.pipeline else ''}",
             f"  throughput: {r.entries_per_s:,.0f} entries/s, {r.mb_per_s:,.1f} MB/s "
             f"(stored bytes, {HEADER_SIZE}-byte header included), {r.seconds:.2f} s"]
    f = r.flush
    if r.cpu_seconds:
        per_round = f", {r.cpu_seconds / f['rounds'] * 1e6:,.0f} us per flush round" if f and f["rounds"] else ""
        lines.append(f"  cpu:        {r.cpu_seconds:.2f} s (all threads), {r.cpu_seconds / o.count * 1e6:.2f} us per "
                     f"entry{per_round}")
    if f:
        lines.append(f"  flush:      {f['rounds']} rounds; latency p50 {f['latency_p50_ms']:.2f} ms, "
                     f"p99 {f['latency_p99_ms']:.2f} ms, max {f['latency_max_ms']:.2f} ms")
        lines.append(f"  reactor:    blocked per flush p50 {f['blocked_p50_ms']:.3f} ms, "
                     f"p99 {f['blocked_p99_ms']:.3f} ms, max {f['blocked_max_ms']:.3f} ms")
    for done, mem in r.rss_mib:
        if mem:
            lines.append(f"  rss @{done:>9}: {mem.get('VmRSS', 0):7.1f} MiB (anon {mem.get('RssAnon', 0):.1f}, "
                         f"file {mem.get('RssFile', 0):.1f})")
    return "\n".join(lines)
