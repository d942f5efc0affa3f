"""A simulated disk: a memory log store that loses (or tears) what was not flushed when a member crashes.

A real process crash keeps the page cache, so file stores in one test
process never lose unflushed writes; this store models a machine crash
instead.  :class:`SimulatedDisk` is the durable image and outlives members;
:meth:`SimulatedDisk.open` gives a member a store over it, and
:meth:`SimulatedDisk.crash` decides what of the unflushed tail survived -- a
prefix of it, chosen by a seeded RNG, as an OS writing back some pages would
leave after recovery cut the torn rest.  Durability bugs (acknowledging or
counting an entry before ``flush``) show up as lost entries.

A flush takes virtual time, as an ``fdatasync`` does (issue #29): with a
clock and a ``flush_latency`` (seconds, or a callable drawing one), ``flush``
captures what the store holds when it is called and makes it durable only
when the latency has passed; a crash in between loses it.  An immediate flush
hid a leader pushing entries its own disk did not yet hold, which is exactly
the window where a power cut made committed entries diverge.
:meth:`SimulatedDisk.hold` keeps flushes from completing until
:meth:`SimulatedDisk.release`, for transcripts that need the window open.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed

from dledger.store.memory import MemoryLogStore

#: The flush latency of a cluster's simulated disks unless told otherwise (seconds): ``fdatasync`` of a 4 KiB
#: write on these machines took 3.9 ms at the median, 12 ms at the 90th percentile (docs/testing.md).
DEFAULT_FLUSH_LATENCY = (0.001, 0.008)


def latency_source(latency, rng: random.Random | None) -> Callable[[], float]:
    """A callable drawing one flush latency: ``latency`` is seconds, a ``(low, high)`` range, or a callable."""
    if callable(latency):
        return latency
    if isinstance(latency, tuple):
        low, high = latency
        draw = rng or random.Random(0)
        return lambda: draw.uniform(low, high)
    fixed = float(latency)
    return lambda: fixed


class SimulatedDisk:
    """The durable image of one member's log: entries, begin index and the checkpointed committed index.

    ``clock`` and ``flush_latency`` (seconds, a ``(low, high)`` range drawn from ``rng``, or a callable)
    make flushes take virtual time; without a clock a flush is durable when it returns.
    """

    def __init__(self, data_file_size: int = 1 << 30, max_entry_size: int = 4 << 20, *, clock=None,
                 flush_latency=0.0, rng: random.Random | None = None):
        self.data_file_size = data_file_size
        self.max_entry_size = max_entry_size
        self.entries: list = []
        self.begin = -1
        self.committed = -1
        #: ``(index, term)`` and next position of the store's last reset_to_snapshot, once flushed.
        self.snapshot_base = (-1, -1)
        self.base_pos = 0
        self.store: SimulatedDiskStore | None = None
        self.clock = clock
        self.flush_latency = latency_source(flush_latency, rng) if clock is not None else (lambda: 0.0)
        self.held = False
        self._held_flushes: list[Callable[[], None]] = []
        #: Flushes completed (landed) over the disk's life.
        self.flushes = 0

    def open(self, member_state) -> SimulatedDiskStore:
        """A store over the durable image, as a restarted member would find it."""
        store = SimulatedDiskStore(self, member_state)
        self.store = store
        return store

    def hold(self) -> None:
        """Flushes started from now on (and those in flight) complete only at :meth:`release`."""
        self.held = True

    def release(self) -> None:
        """Complete the flushes :meth:`hold` kept back, in the order they were started."""
        self.held = False
        waiting, self._held_flushes = self._held_flushes, []
        for land in waiting:
            land()

    def crash(self, rng: random.Random | None = None, tear: bool = True) -> int:
        """The machine dies: keep a random prefix of the unflushed tail (or none). Returns entries kept.

        Flushes still in flight never complete: what they carried is unflushed and may be torn like the rest.
        """
        store = self.store
        self.store = None
        self.held, self._held_flushes = False, []  # the machine reboots: its disk is no longer slow
        if store is None:
            return 0
        store.closed = True
        store.cancel_flushes()
        unflushed = store._entries[store._synced:]
        keep = rng.randint(0, len(unflushed)) if (tear and rng is not None and unflushed) else 0
        if keep:
            if store._synced == 0:
                self.begin = store.ledger_begin_index
                self.entries = unflushed[:keep]
            else:
                self.entries = self.entries[:store._synced] + unflushed[:keep]
        self.committed = min(self.committed, self.end)
        return keep

    @property
    def end(self) -> int:
        if self.entries:
            return self.begin + len(self.entries) - 1
        return self.snapshot_base[0] if self.snapshot_base[0] >= 0 and self.begin == self.snapshot_base[0] + 1 else -1


class SimulatedDiskStore(MemoryLogStore):
    """A memory store whose ``flush`` is the only way data reaches its :class:`SimulatedDisk`."""

    def __init__(self, disk: SimulatedDisk, member_state):
        super().__init__(member_state, data_file_size=disk.data_file_size, max_entry_size=disk.max_entry_size)
        self.disk = disk
        self.closed = False
        self._entries = list(disk.entries)
        self.ledger_begin_index = disk.begin if disk.entries else -1
        if disk.snapshot_base[0] >= 0 and disk.begin >= disk.snapshot_base[0] + 1:
            self.snapshot_base = disk.snapshot_base
            self.ledger_begin_index = disk.begin
            self._write_pos = disk.base_pos
        if self._entries:
            last = self._entries[-1]
            self._write_pos = last.pos + last.size
        self.committed_index = min(disk.committed, self.ledger_end_index)
        self._synced = len(self._entries)  # leading entries identical on disk
        self.flush_count = 0
        self._in_flight: list = []  # the delayed calls of flushes not yet durable

    @property
    def flushed_index(self) -> int:
        if self._synced == 0:
            return self.ledger_begin_index - 1 if self.ledger_begin_index >= 0 else -1
        return self.ledger_begin_index + self._synced - 1

    def truncate(self, entry, leader_term: int, leader_id: str) -> int:
        begin_before, end_before = self.ledger_begin_index, self.ledger_end_index
        result = super().truncate(entry, leader_term, leader_id)
        if self.ledger_begin_index != begin_before or not (begin_before <= entry.index <= end_before + 1):
            self._synced = 0
        else:
            # Entries from ``entry.index`` on may differ from the disk now.
            self._synced = min(self._synced, entry.index - self.ledger_begin_index)
        return result

    def compact(self, below_index: int) -> int:
        """Compaction reaches the disk at once (a store deletes whole files and rewrites its checkpoint, fsynced).

        What was durable stays durable: the disk drops the same leading entries and ``_synced`` shifts with
        them.  (Resetting it to 0 made every remaining entry count as unflushed: ``flushed_index`` stayed
        below durable entries until the next append -- a follower then never adopted the last commit --
        and a torn crash could replace durable entries with a prefix of them: found by the snapshot soak.)
        """
        before = self.ledger_begin_index
        begin = super().compact(below_index)
        dropped = begin - before
        if dropped > 0:
            disk = self.disk
            if disk.begin == before and len(disk.entries) >= dropped:
                disk.begin, disk.entries = begin, disk.entries[dropped:]
                self._synced = max(0, self._synced - dropped)
            else:  # the disk holds another image (a reset not flushed yet): the next flush rewrites it all
                self._synced = 0
        return begin

    def reset_to_snapshot(self, index: int, term: int, next_pos: int) -> None:
        super().reset_to_snapshot(index, term, next_pos)
        self._synced = 0
        self._base_pos = next_pos

    def flush(self):
        """Make what the store holds now durable: at once, or after the disk's flush latency (a Deferred)."""
        if self.closed:
            return succeed(self.flushed_index)
        self.flush_count += 1
        # What this flush carries is fixed now, as an fdatasync covers the writes made before it was called.
        base = self._synced
        image = (self.ledger_begin_index, base, self._entries[base:], self.committed_index, self.snapshot_base,
                 getattr(self, "_base_pos", 0))
        latency = self.disk.flush_latency()
        if latency <= 0 and not self.disk.held:
            self._land(image)
            return succeed(self.flushed_index)
        d: Deferred = Deferred()

        def land():
            if self.closed:
                return
            self._land(image)
            d.callback(self.flushed_index)

        def due():
            if call in self._in_flight:
                self._in_flight.remove(call)
            if self.closed:
                return
            if self.disk.held:
                self.disk._held_flushes.append(land)
            else:
                land()

        call = self.disk.clock.callLater(max(0.0, latency), due)
        self._in_flight.append(call)
        return d

    def _land(self, image) -> None:
        """The flush that captured ``image`` completes: the disk holds it; recount what memory and disk share."""
        begin, base, tail, committed, snapshot_base, base_pos = image
        disk = self.disk
        disk.snapshot_base, disk.base_pos = snapshot_base, base_pos
        if base == 0:
            disk.begin, disk.entries = begin, list(tail)
        else:
            disk.entries = disk.entries[:base] + tail
        disk.committed = committed
        disk.flushes += 1
        if disk.begin != self.ledger_begin_index or not disk.entries:
            self._synced = 0
            return
        mine, held = self._entries, disk.entries
        k = min(self._synced, base)
        limit = min(len(mine), len(held))
        while k < limit and mine[k] is held[k]:
            k += 1
        self._synced = k

    def cancel_flushes(self) -> None:
        """Forget flushes in flight (the machine died): their Deferreds never fire."""
        for call in self._in_flight:
            if call.active():
                call.cancel()
        self._in_flight = []

    def shutdown(self):
        d = self.flush()

        def closed(result):
            self.closed = True
            return result

        return d.addCallback(closed)


def make_entries(terms: list[int], *, start_index: int = 0, start_pos: int = 0, prefix: bytes = b"e",
                 data_file_size: int = 1 << 30) -> list:
    """Entries with the given terms, consecutive indexes and the positions a leader would give them.

    For setting up scenarios: ``disk.entries = make_entries([1, 1, 2])``.
    """
    from dledger.entry import Entry, place_entry
    out, write = [], start_pos
    for k, term in enumerate(terms):
        index = start_index + k
        body = prefix + f"-{index}-t{term}".encode()
        size = 48 + len(body)
        pos, _ = place_entry(write, size, data_file_size)
        out.append(Entry(body=body, index=index, term=term, pos=pos).sealed())
        write = pos + size
    return out


def preload(disk: SimulatedDisk, entries: list, committed: int = -1) -> None:
    """Put ``entries`` on a disk as if a member had written and flushed them."""
    disk.entries = list(entries)
    disk.begin = entries[0].index if entries else -1
    disk.committed = committed


class SimulatedIO:
    """A :class:`dledger.diskio.BlockingIO` stand-in whose jobs take virtual time, for term/vote writes.

    A running member writes its term and vote on a worker thread and holds every reply that depends on
    them until the write is done (:class:`dledger.election.state.MemberState`); inline writes in tests
    never exercise that wait.  Here a job runs when its latency has passed.  :meth:`crash` decides, per
    job still in flight, whether the write reached the disk before the machine died (a seeded coin): a
    member may restart with a vote it never got to announce, or without one it was about to.
    """

    threaded = False
    stopped = False

    def __init__(self, clock, latency=0.0, rng: random.Random | None = None):
        self.clock = clock
        self.rng = rng or random.Random(0)
        self.latency = latency_source(latency, self.rng)
        self._jobs: list = []  # (delayed call, fn, args, deferred)

    def run(self, fn, *args) -> Deferred:
        latency = self.latency()
        d: Deferred = Deferred()
        if latency <= 0:
            _finish(d, fn, args)
            return d
        job: list = []

        def done():
            if job in self._jobs:
                self._jobs.remove(job)
            _finish(d, fn, args)

        job.extend((self.clock.callLater(latency, done), fn, args, d))
        self._jobs.append(job)
        return d

    def crash(self) -> int:
        """The machine dies: each write in flight lands or not (seeded); no Deferred fires. Returns writes landed."""
        landed = 0
        jobs, self._jobs = self._jobs, []
        for call, fn, args, _d in jobs:
            if call.active():
                call.cancel()
            if self.rng.random() < 0.5:
                fn(*args)
                landed += 1
        return landed

    def stop(self) -> None:
        """Run what is in flight now, as BlockingIO.stop does."""
        jobs, self._jobs = self._jobs, []
        for call, fn, args, d in jobs:
            if call.active():
                call.cancel()
                _finish(d, fn, args)


def _finish(d: Deferred, fn, args) -> None:
    """Run a job and fire its Deferred with the result, or with its failure, as BlockingIO reports it."""
    try:
        result = fn(*args)
    except Exception:
        d.errback()
        return
    d.callback(result)
