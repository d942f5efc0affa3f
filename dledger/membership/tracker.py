"""The configuration one member tracks from its log (issue #23): :class:`Membership`, ``server.membership``.

A member's configuration is the newest CONFIG_CHANGE entry in its log, committed or not, else the
base: the configuration of the snapshot its log starts after, or the bootstrap ``--peers`` for a log
that starts at 1 (:func:`dledger.membership.rules.in_force`).  So the tracker keeps

* ``base`` -- the configuration before the log's first entry, and
* ``history`` -- every configuration entry the log holds, in index order,

and moves them with the log: every append (leader and follower, batches too) and every follower
truncation pass through :class:`dledger.store.guard.LogGuard`, which tells the tracker
(``config_appended``/``truncated``); a compaction turns the removed entries' newest configuration
into the base (:meth:`compacted`); an installed snapshot replaces both (:meth:`installed`).  At
start-up the tracker scans the log (as hashicorp/raft does after its snapshot), in batches, through
the store's read API (the mmap store's index records, which hold each entry's magic, when it has them).

Observers (``observe(cb)``, ``cb(old, new)``) hear of every change of the configuration in force: the
member's state (voters, members), its transport (addresses), its security guard, its replicator.
The leader's side of a change (propose, promotion, a removed leader's step-down) is
:mod:`dledger.membership.changes`.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, fail
from twisted.logger import Logger
from zope.interface import implementer

from dledger.codes import EntryType, ResponseCode
from dledger.errors import DLedgerError
from dledger.interfaces import IMembership
from dledger.membership import rules
from dledger.membership.configuration import Configuration, ConfigurationError, bootstrap, decode

log = Logger(namespace="dledger.membership")

#: Entries read per batch by the start-up scan (and its byte budget): a long log is scanned without
#: holding more than one batch in memory.
SCAN_BATCH = 4096
SCAN_BYTES = 16 * 1024 * 1024
_CONFIG = int(EntryType.CONFIG_CHANGE)


def config_entry_indexes(store, begin: int, end: int) -> list[int]:
    """Indexes of the CONFIG_CHANGE entries in ``begin..end`` of ``store``.

    A store that can say an entry's magic without reading its body (``index_record(index)``: the mmap
    store's 32-byte index records, ``(magic, pos, size, index, term)``) is asked that, the entry read only
    where a record is not valid; any other store is read in batches of :data:`SCAN_BATCH`.
    """
    if begin < 0 or end < begin:
        return []
    record_of = getattr(store, "index_record", None)
    if record_of is not None:
        found = []
        for i in range(begin, end + 1):
            rec = record_of(i)
            magic = rec[0] if rec is not None and rec[3] == i else store.get(i).magic
            if magic == _CONFIG:
                found.append(i)
        return found
    found: list[int] = []
    index = begin
    while index <= end:
        batch = store.get_range(index, SCAN_BATCH, SCAN_BYTES)
        if not batch:
            break
        found.extend(e.index for e in batch if e.magic == _CONFIG and e.index <= end)
        index = batch[-1].index + 1
    return found


@implementer(IMembership)
class Membership:
    """The configuration in force on one member, kept from its log (see the module docstring)."""

    def __init__(self, self_id: str, store, base: Configuration):
        self.self_id = self_id
        self.store = store
        #: The configuration before the log's first entry (snapshot's, or bootstrap ``--peers``).
        self.base = base
        #: The configuration entries the log holds, by index (committed or not).
        self.history: list[Configuration] = []
        self._config = base
        self._observers: list[Callable[[Configuration, Configuration], None]] = []
        #: The leader's change flow (:class:`dledger.membership.changes.MembershipChanges`), set by the server.
        self.changes = None
        #: Called when the committed index moved: keeps the committed configuration's entry from retention
        #: where no snapshot records it (:func:`dledger.membership.wiring.attach`); None: nothing to keep.
        self.retain = None

    @classmethod
    def from_config(cls, config, store) -> Membership:
        """A tracker whose base is the bootstrap configuration of ``config`` (``--peers``, ``joinExisting``)."""
        return cls(config.self_id, store, bootstrap(config.members, config.self_id,
                                                    join_existing=config.join_existing))

    # -- IMembership ------------------------------------------------------------------------
    @property
    def configuration(self) -> Configuration:
        return self._config

    def committed(self) -> bool:
        return self._config.index <= self.store.committed_index

    def observe(self, callback: Callable[[Configuration, Configuration], None]) -> Callable[[], None]:
        """Call ``callback(old, new)`` after every change of the configuration in force; returns deregister."""
        self._observers.append(callback)
        return lambda: callback in self._observers and self._observers.remove(callback)

    def propose(self, change) -> Deferred:
        if self.changes is None:
            return fail(DLedgerError(ResponseCode.UNSUPPORTED, "this member cannot change the configuration"))
        return self.changes.propose(change)

    # -- views --------------------------------------------------------------------------------
    def at(self, index: int) -> Configuration:
        """The configuration in force at log index ``index`` (what a snapshot at ``index`` records)."""
        return rules.in_force([c for c in self.history if c.index <= index], self.base)

    def standing(self) -> rules.Standing:
        return rules.standing(self._config, self.self_id)

    def removed_committed(self) -> bool:
        """This member is not in the committed configuration in force: it no longer serves as a member."""
        return self.committed() and self._config.get(self.self_id) is None

    # -- the log moves ------------------------------------------------------------------------------
    def scan(self) -> int:
        """Read the log's configuration entries now (start-up, inline); returns how many it holds."""
        store = self.store
        return self.loaded([store.get(i) for i in
                            config_entry_indexes(store, store.ledger_begin_index, store.ledger_end_index)])

    def loaded(self, entries) -> int:
        """The log's configuration ``entries`` as read at start-up: the newest is in force; returns how many."""
        self.history = sorted((c for c in (self._decode(e) for e in entries) if c is not None),
                              key=lambda c: c.index)
        self._recompute("start-up")
        return len(self.history)

    def config_appended(self, entries) -> None:
        """CONFIG_CHANGE ``entries`` were stored (LogGuard): the newest is in force now, committed or not."""
        added = [c for c in (self._decode(e) for e in entries) if c is not None]
        if not added:
            return
        indexes = {c.index for c in added}
        self.history = sorted([c for c in self.history if c.index not in indexes] + added, key=lambda c: c.index)
        self._recompute("appended")

    def truncated(self, end_index: int) -> None:
        """The follower's log was cut back to ``end_index``: configurations after it no longer apply."""
        kept = rules.after_truncation(self.history, end_index)
        if len(kept) != len(self.history):
            self.history = kept
            self._recompute(f"truncated to {end_index}")

    def compacted(self, begin_index: int, recompute: bool = True) -> None:
        """Entries before ``begin_index`` are gone: their newest configuration becomes the base."""
        if self.history and self.history[0].index < begin_index:
            self.base, self.history = rules.after_compaction(self.history, self.base, begin_index)
            if recompute:
                self._recompute("compacted")

    def installed(self, config: Configuration | None, index: int, term: int) -> None:
        """A snapshot at ``index`` replaced the log: its configuration (None: unknown, keep ours) is the base."""
        base = config.at(index, term) if config is not None else self.at(index).at(index, term)
        self.base, self.history = base, []
        self._recompute(f"snapshot {index} installed")

    def restored(self, config: Configuration | None, index: int, term: int) -> None:
        """Start-up restored a snapshot at ``index``: its configuration is the base of the log after it."""
        if config is not None and config.index <= index:
            self.base = config.at(index, term)

    # -- internals ------------------------------------------------------------------------------------
    def _decode(self, entry) -> Configuration | None:
        try:
            return decode(entry.body, entry.index, entry.term)
        except ConfigurationError as exc:
            log.error("{id}: ignoring configuration entry {index} (term {term}): {why}; the configuration in force "
                      "stays {config}", id=self.self_id, index=entry.index, term=entry.term, why=exc,
                      config=self._config.describe())
            return None

    def _recompute(self, why: str) -> None:
        old = self._config
        new = rules.in_force(self.history, self.base)
        if new == old:
            return
        self._config = new
        if not new.same_members(old):
            log.info("{id}: configuration {old_i} -> {new_i} ({why}): {members}", id=self.self_id,
                     old_i=old.index, new_i=new.index, why=why, members=new.describe())
        for cb in list(self._observers):
            cb(old, new)
