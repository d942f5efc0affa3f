"""In-memory log and term/vote stores: the full store contract, nothing durable.

Storage only (:class:`dledger.interfaces.IPlainLogStore`): the member's
:class:`dledger.store.guard.LogGuard` checks roles and runs the append hooks.

Used by tests, simulations and embedded groups.  Byte positions follow the
same file layout as the mmap store (:func:`dledger.entry.place_entry`), so a
memory member and a file member agree on every entry's ``pos``.
"""

from __future__ import annotations

from collections.abc import Sequence

from twisted.internet.defer import succeed
from zope.interface import implementer

from dledger.entry import Entry
from dledger.hookspecs import hookimpl
from dledger.interfaces import (
    IBatchLogStore,
    ICompactingLogStore,
    IPlainLogStore,
    IPositionReader,
    ITermVoteStore,
)
from dledger.plugin_types import StoreType
from dledger.store import base, positions


@implementer(IPlainLogStore, IBatchLogStore, IPositionReader, ICompactingLogStore)
class MemoryLogStore(positions.EntryPositionReader):
    """A list of entries plus the begin/end/committed bookkeeping."""

    def __init__(self, member_state, *, data_file_size: int = 1 << 30, max_entry_size: int = 4 << 20):
        self.member_state = member_state
        self.data_file_size = data_file_size
        self.max_entry_size = max_entry_size
        self._entries: list[Entry] = []
        self.ledger_begin_index = -1
        self.committed_index = -1
        self._write_pos = 0
        #: ``(index, term)`` of the last :meth:`reset_to_snapshot` (``(-1, -1)``: none).
        self.snapshot_base = (-1, -1)

    @classmethod
    def from_config(cls, config, member_state, **_ignored) -> MemoryLogStore:
        """``clock``/``blocking_io`` keywords, which a member passes to every store factory, are not needed here."""
        return cls(member_state, data_file_size=config.mapped_file_size_for_entry_data,
                   max_entry_size=config.max_entry_size)

    # -- bookkeeping ---------------------------------------------------------
    @property
    def ledger_end_index(self) -> int:
        if self._entries:
            return self.ledger_begin_index + len(self._entries) - 1
        return self.snapshot_base[0] if self.ledger_begin_index == self.snapshot_base[0] + 1 else -1

    @property
    def ledger_end_term(self) -> int:
        if self._entries:
            return self._entries[-1].term
        return self.snapshot_base[1] if self.ledger_begin_index == self.snapshot_base[0] + 1 else -1

    #: ``ILogStore.flush_rounds``: nothing to pipeline, a flush is durable at once.
    flush_rounds = 1

    @property
    def flushed_index(self) -> int:
        return self.ledger_end_index

    def startup(self) -> None:
        pass

    def shutdown(self):
        return succeed(None)

    def flush(self):
        return succeed(self.ledger_end_index)

    # -- appends -------------------------------------------------------------
    def _place(self, size: int) -> int:
        return base.place(self._write_pos, size, self.data_file_size, self.max_entry_size)[0]

    def _push(self, entry: Entry) -> Entry:
        if not self._entries:
            self.ledger_begin_index = entry.index
        self._entries.append(entry)
        self._write_pos = entry.pos + entry.size
        return entry

    def append_as_leader(self, entry: Entry, seal=None) -> Entry:
        pos = self._place(entry.size)
        index = self.ledger_end_index + 1
        return self._push(base.placed(entry, index, pos) if seal is None else seal(entry, index, pos))

    def append_as_follower(self, entry: Entry, leader_term: int, leader_id: str) -> Entry:
        base.check_next_index(entry, self.ledger_end_index)
        base.check_position(entry, self._place(entry.size))
        return self._push(entry)

    def append_batch_as_leader(self, entries: Sequence[Entry], seal=None) -> list[Entry]:
        """One-entry appends in a row (nothing to gain from batching a list; simulations use this path)."""
        return base.append_each(self.append_as_leader, entries, seal)

    def append_batch_as_follower(self, entries: Sequence[Entry], leader_term: int, leader_id: str) -> list[Entry]:
        return base.append_each(self.append_as_follower, entries, leader_term, leader_id)

    def truncate(self, entry: Entry, leader_term: int, leader_id: str) -> int:
        begin = self.ledger_begin_index
        action = base.plan_truncate(entry, begin, self.ledger_end_index, self.committed_index, self.get)
        if action is base.TruncateAction.DROP_AFTER:
            del self._entries[entry.index - begin + 1:]
            self._write_pos = entry.pos + entry.size
        elif action is base.TruncateAction.REPLACE:
            del self._entries[entry.index - begin:]
            prev = self._entries[-1]
            self._write_pos = prev.pos + prev.size
            base.check_position(entry, self._place(entry.size))
            self._push(entry)
        elif action is base.TruncateAction.APPEND:
            base.check_position(entry, self._place(entry.size))
            self._push(entry)
        else:  # RESET: outside our range (or replacing our first entry): start over at the leader's entry
            base.check_entry_size(entry.size, self.max_entry_size)
            self._entries = [entry]
            self.ledger_begin_index = entry.index
            self._write_pos = entry.pos + entry.size
            self.committed_index = entry.index - 1
        self.committed_index = min(self.committed_index, self.ledger_end_index)
        return entry.index

    # -- compaction (ICompactingLogStore) -------------------------------------
    def compact(self, below_index: int) -> int:
        """Drop the entries below ``below_index`` (never a committed one's successor, never the last entry)."""
        below = base.compact_floor(below_index, self.ledger_begin_index, self.ledger_end_index, self.committed_index)
        if below > self.ledger_begin_index:
            del self._entries[:below - self.ledger_begin_index]
            self.ledger_begin_index = below
        return self.ledger_begin_index

    def reset_to_snapshot(self, index: int, term: int, next_pos: int) -> None:
        """Drop every entry: the log is empty with a base at ``index``/``term``; the next entry goes at ``next_pos``."""
        base.check_snapshot_base(index, term, next_pos)
        self._entries = []
        self.snapshot_base = (index, term)
        self.ledger_begin_index = index + 1
        self.committed_index = index
        self._write_pos = next_pos

    # -- reads ---------------------------------------------------------------
    def get(self, index: int) -> Entry:
        begin = self.ledger_begin_index
        if not self._entries or index < begin or index > self.ledger_end_index:
            raise base.index_out_of_range(index, begin, self.ledger_end_index if self._entries else -1)
        return self._entries[index - begin]

    def get_range(self, begin_index: int, max_count: int, max_bytes: int) -> list[Entry]:
        return base.read_range(self.get, begin_index, self.ledger_end_index, max_count, max_bytes)

    def get_first_log_of_target_term(self, term: int, end_index: int) -> int:
        return base.first_index_of_term(lambda i: self._entries[i - self.ledger_begin_index].term, term,
                                        self.ledger_begin_index, self.ledger_end_index, end_index)

    def update_committed_index(self, term: int, index: int) -> None:
        self.committed_index = base.next_committed_index(
            self.committed_index, term, self.member_state.curr_term, index,
            self.ledger_begin_index, self.ledger_end_index)


@implementer(ITermVoteStore)
class MemoryTermVoteStore:
    """Term and vote kept in memory; survives a simulated crash if the same object is reused."""

    save_off_reactor = True  # two attribute stores: safe on any thread

    def __init__(self, term: int = 0, vote_for: str | None = None):
        self.term = term
        self.vote_for = vote_for

    def load(self) -> tuple[int, str | None]:
        return self.term, self.vote_for

    def save(self, term: int, vote_for: str | None) -> None:
        self.term, self.vote_for = term, vote_for

    def close(self) -> None:
        pass


@hookimpl
def dledger_store_types():
    return [StoreType(
        name="memory",
        make_log_store=MemoryLogStore.from_config,
        make_term_store=lambda config: MemoryTermVoteStore(),
        description="entries in memory; nothing survives a restart",
    )]
