"""A simulated disk: a memory log store that loses (or tears) what was not flushed when a member crashes.

A real process crash keeps the page cache, so file stores in one test
process never lose unflushed writes; this store models a machine crash
instead.  :class:`SimulatedDisk` is the durable image and outlives members;
:meth:`SimulatedDisk.open` gives a member a store over it, and
:meth:`SimulatedDisk.crash` decides what of the unflushed tail survived -- a
prefix of it, chosen by a seeded RNG, as an OS writing back some pages would
leave after recovery cut the torn rest.  Durability bugs (acknowledging or
counting an entry before ``flush``) show up as lost entries.
"""

from __future__ import annotations

import random

from twisted.internet.defer import succeed

from dledger.store.memory import MemoryLogStore


class SimulatedDisk:
    """The durable image of one member's log: entries, begin index and the checkpointed committed index."""

    def __init__(self, data_file_size: int = 1 << 30, max_entry_size: int = 4 << 20):
        self.data_file_size = data_file_size
        self.max_entry_size = max_entry_size
        self.entries: list = []
        self.begin = -1
        self.committed = -1
        self.store: SimulatedDiskStore | None = None

    def open(self, member_state) -> SimulatedDiskStore:
        """A store over the durable image, as a restarted member would find it."""
        store = SimulatedDiskStore(self, member_state)
        self.store = store
        return store

    def crash(self, rng: random.Random | None = None, tear: bool = True) -> int:
        """The machine dies: keep a random prefix of the unflushed tail (or none). Returns entries kept."""
        store = self.store
        self.store = None
        if store is None:
            return 0
        unflushed = store._entries[store._synced:]
        keep = rng.randint(0, len(unflushed)) if (tear and rng is not None and unflushed) else 0
        if keep:
            if store._synced == 0:
                self.begin = store.ledger_begin_index
                self.entries = unflushed[:keep]
            else:
                self.entries = self.entries[:store._synced] + unflushed[:keep]
        self.committed = min(self.committed, self.end)
        store.closed = True
        return keep

    @property
    def end(self) -> int:
        return self.begin + len(self.entries) - 1 if self.entries else -1


class SimulatedDiskStore(MemoryLogStore):
    """A memory store whose ``flush`` is the only way data reaches its :class:`SimulatedDisk`."""

    def __init__(self, disk: SimulatedDisk, member_state):
        super().__init__(member_state, data_file_size=disk.data_file_size, max_entry_size=disk.max_entry_size)
        self.disk = disk
        self.closed = False
        self._entries = list(disk.entries)
        self.ledger_begin_index = disk.begin if disk.entries else -1
        if self._entries:
            last = self._entries[-1]
            self._write_pos = last.pos + last.size
        self.committed_index = min(disk.committed, self.ledger_end_index)
        self._synced = len(self._entries)  # leading entries identical on disk
        self.flush_count = 0

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

    def flush(self):
        if self.closed:
            return succeed(self.flushed_index)
        disk = self.disk
        if self._synced == 0:
            disk.begin = self.ledger_begin_index
            disk.entries = list(self._entries)
        else:
            del disk.entries[self._synced:]
            disk.entries.extend(self._entries[self._synced:])
        self._synced = len(self._entries)
        disk.committed = self.committed_index
        self.flush_count += 1
        return succeed(self.flushed_index)

    def shutdown(self):
        d = self.flush()
        self.closed = True
        return d


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
