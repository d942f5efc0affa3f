"""The snapshot benchmark (``dledger bench snapshot``, figures in docs/benchmarks.md; nothing here asserts a speed).

``restart``: how long a member with COUNT entries takes from opening its store until its state
machine has applied the whole log -- with no snapshot (every entry replayed) and with a snapshot
TAIL entries before the end (restore, then apply the tail), on the mmap store.  The two are run
interleaved (A B A B ...) on copies of one log so that both see the same disk and page cache, and
the report gives each run, the medians and their ratio.

``cost``: append throughput of a leader store while a snapshot of a KEYS-key state machine is
being taken, against the same windows without one, interleaved, on the real reactor with the
store's and the snapshot's I/O on worker threads (as in a member).  Appends are batches of BATCH
entries, each flushed and then applied.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from twisted.internet.defer import Deferred
from zope.interface import implementer

from dledger import diskio
from dledger.entry import Entry
from dledger.interfaces import IStateMachine
from dledger.snapshot.machines import StateMachines
from dledger.snapshot.store import SnapshotStore
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.store_contract import FakeMemberState, fired

MiB = 1024 * 1024


@implementer(IStateMachine)
class KeyCounts:
    """A realistic small machine: ``key`` -> count, ``keys`` distinct keys; snapshot = the dict as JSON lines."""

    name = "counts"

    def __init__(self, io=None):
        self.counts: dict[bytes, int] = {}
        #: Where the frozen copy is turned into bytes: inline, or a BlockingIO's worker (off the reactor).
        self.io = io

    def apply(self, entries):
        counts = self.counts
        for e in entries:
            k = bytes(e.body[:16])
            counts[k] = counts.get(k, 0) + 1

    def snapshot(self, writer):
        frozen = dict(self.counts)  # the point-in-time view, taken inside the call
        items = iter(frozen.items())
        d = Deferred()

        def encode() -> bytes:
            return "".join(f"{k.hex()} {v}\n" for k, v in _take(items, 20000)).encode()

        def write(data: bytes):
            if not data:
                d.callback(None)
                return None
            return writer.write(data).addCallback(more)

        def more(_=None):
            if self.io is not None:  # the frozen copy is never changed again: safe to read on a worker
                self.io.run(encode).addCallback(write).addErrback(d.errback)
                return None
            while True:
                data = encode()
                if not data:
                    d.callback(None)
                    return None
                w = writer.write(data)
                if not w.called:
                    w.addCallbacks(more, d.errback)
                    return None

        more()
        return d

    def restore(self, reader):
        counts: dict[bytes, int] = {}
        rest = [b""]
        d = Deferred()

        def got(data: bytes):
            if not data:
                self.counts = counts
                d.callback(None)
                return
            lines = (rest[0] + data).split(b"\n")
            rest[0] = lines.pop()
            for line in lines:
                k, v = line.split(b" ")
                counts[bytes.fromhex(k.decode())] = int(v)
            reader.read(4 * MiB).addCallbacks(got, d.errback)

        reader.read(4 * MiB).addCallbacks(got, d.errback)
        return d


def _take(it, n):
    out = []
    for item in it:
        out.append(item)
        if len(out) == n:
            break
    return out


class _Now:
    """A clock whose ``callLater`` calls run from :meth:`drain` in order (the restart bench runs without a reactor)."""

    def __init__(self):
        self.calls: list = []

    def seconds(self) -> float:
        return time.perf_counter()

    def callLater(self, _delay, fn, *args):
        call = _Call(fn, args)
        self.calls.append(call)
        return call

    def drain(self) -> None:
        while self.calls:
            call = self.calls.pop(0)
            if call.live:
                call.live = False
                call.fn(*call.args)


class _Call:
    def __init__(self, fn, args):
        self.fn, self.args, self.live = fn, args, True

    def active(self) -> bool:
        return self.live

    def cancel(self) -> None:
        self.live = False


def _body(i: int, size: int, keys: int) -> bytes:
    return f"{i % keys:016d}".encode() + b"x" * max(0, size - 16)


def _open(directory: Path, state, clock=None, io=diskio.INLINE) -> MmapLogStore:
    store = MmapLogStore(directory, state, data_file_size=64 * MiB, index_file_size=8 * MiB,
                         max_entry_size=4 * MiB, clock=clock, blocking_io=io, disk_usage=lambda: 0.0)
    store.startup()
    return store


def build_log(directory: Path, count: int, size: int, keys: int) -> None:
    """``count`` committed entries in an mmap store at ``directory``, flushed and shut down."""
    state = FakeMemberState()
    store = _open(directory, state)
    batch = 1000
    for start in range(0, count, batch):
        store.append_batch_as_leader([Entry(body=_body(i, size, keys), term=1)
                                      for i in range(start, min(count, start + batch))])
    fired(store.flush())
    store.update_committed_index(1, count - 1)
    fired(store.shutdown())


def _machines(store, snap_dir: Path, clock) -> tuple[StateMachines, KeyCounts]:
    machine = KeyCounts()
    sm = StateMachines(store, SnapshotStore(snap_dir, diskio.INLINE), clock, member_id="bench", trailing=0)
    sm.add(machine)
    return sm, machine


def restart_once(member_dir: Path, snap_dir: Path) -> tuple[float, int, int]:
    """Seconds from opening the store to every committed entry applied; (seconds, entries applied, begin index)."""
    clock = _Now()
    state = FakeMemberState()
    t0 = time.perf_counter()
    store = _open(member_dir, state)
    sm, _machine = _machines(store, snap_dir, clock)
    fired(sm.start())
    restored = sm.applied_index
    clock.drain()
    seconds = time.perf_counter() - t0
    assert sm.applied_index == store.committed_index, (sm.applied_index, store.committed_index)
    applied = store.committed_index - restored
    begin = store.ledger_begin_index
    fired(store.shutdown())
    return seconds, applied, begin


@dataclass
class RestartResult:
    count: int
    tail: int
    size: int
    keys: int
    runs: int
    plain: list[float]
    snapshot: list[float]
    snapshot_bytes: int
    applied_plain: int
    applied_snapshot: int

    def as_dict(self) -> dict:
        d = dict(self.__dict__)
        d["plain_median_s"] = statistics.median(self.plain)
        d["snapshot_median_s"] = statistics.median(self.snapshot)
        d["ratio"] = d["snapshot_median_s"] / d["plain_median_s"]
        return d


def run_restart(count: int = 1_000_000, tail: int = 10_000, size: int = 64, keys: int = 100_000, runs: int = 3,
                directory: str | None = None) -> RestartResult:
    """Restart of a member with ``count`` entries, without a snapshot and with one ``tail`` entries before the end."""
    root = Path(directory or tempfile.mkdtemp(prefix="dledger-bench-snap-"))
    try:
        plain, snap = root / "plain", root / "snap"
        build_log(plain / "dledger-n0", count, size, keys)
        shutil.copytree(plain, snap)
        # The snapshot copy: apply up to count - tail, snapshot, compact (trailing 0), as a member would have.
        clock = _Now()
        state = FakeMemberState()
        store = _open(snap / "dledger-n0", state)
        sm, _ = _machines(store, snap / "snapshot", clock)
        fired(sm.start())
        committed = store.committed_index
        store.committed_index = count - 1 - tail  # feed only up to the snapshot point
        clock.drain()
        manifest = fired(sm.take())
        store.committed_index = committed
        fired(store.shutdown())
        times: dict[str, list[float]] = {"plain": [], "snapshot": []}
        applied = {}
        for _ in range(runs):
            for name, where in (("plain", plain), ("snapshot", snap)):
                seconds, n, _begin = restart_once(where / "dledger-n0", where / "snapshot")
                times[name].append(seconds)
                applied[name] = n
        return RestartResult(count, tail, size, keys, runs, times["plain"], times["snapshot"], manifest.size,
                             applied["plain"], applied["snapshot"])
    finally:
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)


def format_restart(r: RestartResult) -> str:
    d = r.as_dict()
    return (f"restart of a member with {r.count} entries ({r.size}-byte bodies, {r.keys} keys), {r.runs} interleaved "
            f"runs each\n"
            f"  no snapshot:   applied {r.applied_plain} entries; median {d['plain_median_s']:.2f}s "
            f"(runs {', '.join(f'{x:.2f}' for x in r.plain)})\n"
            f"  with snapshot: {diskio.format_bytes(r.snapshot_bytes)} restored, then {r.applied_snapshot} entries; "
            f"median {d['snapshot_median_s']:.2f}s (runs {', '.join(f'{x:.2f}' for x in r.snapshot)})\n"
            f"  ratio with/without: {d['ratio']:.3f}")


# -- the cost of a snapshot on appends -----------------------------------------------------------

async def run_cost(reactor, keys: int = 1_000_000, batch: int = 256, size: int = 128, runs: int = 3,
                   directory: str | None = None, encode: str = "reactor") -> dict:
    """Append throughput while a snapshot of ``keys`` keys is taken vs the same windows without one (interleaved)."""
    root = Path(directory or tempfile.mkdtemp(prefix="dledger-bench-snapcost-"))
    io = diskio.BlockingIO(reactor, threaded=True)
    state = FakeMemberState()
    store = _open(root / "dledger-n0", state, clock=reactor, io=io)
    machine = KeyCounts(io if encode == "thread" else None)
    sm = StateMachines(store, SnapshotStore(root / "snapshot", io), reactor, member_id="bench", trailing=10 ** 9)
    sm.add(machine)
    await sm.start()
    machine.counts = {f"{i:016d}".encode(): 1 for i in range(keys)}
    counter = [0]

    async def append_batch() -> None:
        i = counter[0]
        counter[0] += batch
        store.append_batch_as_leader([Entry(body=_body(i + k, size, keys), term=1) for k in range(batch)])
        await store.flush()
        store.update_committed_index(1, store.ledger_end_index)
        sm.advanced()
        await sm.wait_applied(store.ledger_end_index)

    async def window(with_snapshot: bool, seconds: float | None) -> tuple[float, float]:
        done = [False]
        t0 = time.perf_counter()
        if with_snapshot:
            d = sm.take()
            d.addBoth(lambda r: done.__setitem__(0, True) or r)
        n0 = counter[0]
        while True:
            await append_batch()
            elapsed = time.perf_counter() - t0
            if (with_snapshot and done[0]) or (not with_snapshot and elapsed >= seconds):
                break
        if with_snapshot:
            await d
        return (counter[0] - n0) / elapsed, elapsed

    try:
        for _ in range(3):  # warm up: appends, and one snapshot (threads started, files and page cache warm)
            await append_batch()
        await sm.take()
        await append_batch()
        plain, snap, lengths = [], [], []
        for _ in range(runs):
            rate, length = await window(True, None)
            snap.append(rate)
            lengths.append(length)
            rate, _ = await window(False, length)
            plain.append(rate)
        newest = sm.snapshot_store.newest()
        result = {"encode": encode, "keys": keys, "batch": batch, "size": size, "runs": runs,
                  "snapshot_bytes": newest.size,
                  "snapshot_seconds": lengths, "with_snapshot_eps": snap, "without_eps": plain,
                  "with_median_eps": statistics.median(snap), "without_median_eps": statistics.median(plain)}
        result["ratio"] = result["with_median_eps"] / result["without_median_eps"]
        return result
    finally:
        await store.shutdown()
        io.stop()
        if directory is None:
            shutil.rmtree(root, ignore_errors=True)


def format_cost(r: dict) -> str:
    return (f"appends ({r['batch']}-entry flushed batches of {r['size']}-byte bodies) while a snapshot of "
            f"{r['keys']} keys ({diskio.format_bytes(r['snapshot_bytes'])}, encoded on the {r['encode']}) is taken, "
            f"{r['runs']} interleaved runs\n"
            f"  snapshot took {', '.join(f'{x:.2f}s' for x in r['snapshot_seconds'])}\n"
            f"  with snapshot:    median {r['with_median_eps']:,.0f} entries/s "
            f"(runs {', '.join(f'{x:,.0f}' for x in r['with_snapshot_eps'])})\n"
            f"  without snapshot: median {r['without_median_eps']:,.0f} entries/s "
            f"(runs {', '.join(f'{x:,.0f}' for x in r['without_eps'])})\n"
            f"  ratio with/without: {r['ratio']:.3f}")


def to_json(obj) -> str:
    return json.dumps(obj, sort_keys=True)
