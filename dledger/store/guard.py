"""The one place where writes to a log store are checked and hooked: role, term and leader, then the append hooks.

A store is storage (hashicorp/raft's plain ``LogStore``): it keeps entries,
places them in its layout and refuses what it cannot store (a gap in the
indexes, a position that disagrees with the leader's, a damaged body, a full
disk).  Whether this member may write at all depends on who it is -- a
leader appends, a follower takes entries only from the leader it knows, in
the term it is in (SPEC §4) -- and the application's append hooks rewrite
a leader's entries; both rules are the same for every store, so they live
here, once, in :class:`LogGuard`, which every write of a member goes through.

Hooks need an entry's final byte position, which the store decides while it
places a batch (file rollover, blank markers).  So the guard does not place
entries itself: it hands a store that is storage only
(:class:`dledger.interfaces.IPlainLogStore`) a ``seal(entry, index, pos)``
function, which the store calls for each entry once it knows where the entry
goes, in the same pass (no second loop over the entries).  Without hooks the
guard passes no ``seal`` and the store seals the CRC itself
(:func:`dledger.store.base.placed`).  A store written before this split
(role checks and ``add_append_hook`` of its own) keeps working: the guard
still checks first and hands it the hooks.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

import crc32c

from dledger.codes import EntryType, ResponseCode, Role
from dledger.entry import BODY_CRC_OFFSET, BODY_OFFSET, CONTROL_MAGICS, HEADER, Entry, body_crc, config_entries
from dledger.errors import AppendHookError, BatchAppendError, DLedgerError
from dledger.interfaces import IBatchLogStore, IPlainLogStore
from dledger.store.base import append_each, placed

_pack_header_into = HEADER.pack_into
_pack_crc_into = struct.Struct(">i").pack_into
_crc = crc32c.crc32c
_NOOP = int(EntryType.NOOP)
_CONFIG = int(EntryType.CONFIG_CHANGE)


def check_leader(state) -> None:
    """A leader append is only allowed on the leader (NOT_LEADER names the leader this member knows)."""
    if state.role is not Role.LEADER:
        raise DLedgerError(ResponseCode.NOT_LEADER, f"role is {state.role.name}", leader_id=state.leader_id)


def check_follower(state, leader_term: int, leader_id: str) -> None:
    """The follower-side checks of ``appendAsFollower`` / ``truncate`` (SPEC §4), in Java's order."""
    if state.role is not Role.FOLLOWER:
        raise DLedgerError(ResponseCode.NOT_FOLLOWER, f"role is {state.role.name}")
    if leader_term != state.curr_term:
        raise DLedgerError(ResponseCode.INCONSISTENT_TERM,
                           f"leader term {leader_term} != current term {state.curr_term}")
    if leader_id != state.leader_id:
        raise DLedgerError(ResponseCode.INCONSISTENT_LEADER, f"leader {leader_id} != known leader {state.leader_id}")


def seal_leader_entry(hooks: Sequence, entry: Entry, index: int, pos: int) -> Entry:
    """The entry a leader stores: placed at ``index``/``pos``, rewritten by ``hooks``, CRC sealed last.

    ``hooks`` come first so that ``functools.partial(seal_leader_entry, hooks)`` is the ``seal`` a
    store calls (a positional partial costs no Python frame of its own on the append path).

    Hooks see user entries only: a NOOP (the leader's own term-start entry)
    is not an application's, and a hook that chokes on its empty body must
    not keep a leader from starting its term; nor is a CONFIG_CHANGE entry
    (a hook rewriting its body would change the group's configuration).  A hook that raises fails this
    entry with :class:`AppendHookError`, a DLedgerError, so the store's batch
    rule applies: earlier entries stay, nothing of this one is written.
    Each hook gets a writable memoryview of exactly the encoded entry
    (header, then body from ``BODY_OFFSET``): it can rewrite bytes in place
    but never change the entry's length.
    """
    if not hooks or entry.magic in CONTROL_MAGICS:
        return placed(entry, index, pos)
    return seal_leader_entry_into(hooks, entry, index, pos, memoryview(bytearray(BODY_OFFSET + len(entry.body))), 0)


def seal_leader_entry_into(hooks: Sequence, entry: Entry, index: int, pos: int, view: memoryview,
                           start: int) -> Entry:
    """:func:`seal_leader_entry`, encoded at ``start`` of ``view`` (the store's write buffer): the stored entry.

    A store that writes a run of entries from one buffer
    (:class:`~dledger.store.mmapfile.MmapLogStore`) asks for this form,
    ``seal.into``, with room for the entry at ``start``: the hooks then
    rewrite the bytes the store writes, and the sealed entry is not built in
    a buffer of its own and copied again (one buffer and one copy of the
    body less per entry on a leader).  The hooks get the entry's own part of
    ``view`` (header, then body from ``BODY_OFFSET``), so a hook neither
    sees the other entries nor changes a length.  If a hook fails, the bytes
    written at ``start`` are not part of anything: the store does not count them.
    """
    body = entry.body
    n = len(body)
    magic = entry.magic
    end = start + BODY_OFFSET + n
    if not hooks or magic == _NOOP or magic == _CONFIG:
        crc = body_crc(body)
        _pack_header_into(view, start, magic, BODY_OFFSET + n, index, entry.term, pos, 0, 0, crc, n)
        view[start + BODY_OFFSET:end] = body
        return Entry(body, index, entry.term, pos, magic, 0, 0, crc)
    stored = Entry(body, index, entry.term, pos, magic, 0, 0, 0)
    _pack_header_into(view, start, magic, BODY_OFFSET + n, index, entry.term, pos, 0, 0, 0, n)
    view[start + BODY_OFFSET:end] = body
    mine = view[start:end]
    for hook in hooks:
        try:
            hook.before_append(stored, mine, BODY_OFFSET)
        except Exception as exc:
            raise hook_error(hook, index, exc) from exc
    sealed = stored.body = bytes(mine[BODY_OFFSET:])
    crc = _crc(sealed)
    if crc >= 0x80000000:
        crc -= 0x100000000  # stored signed, as body_crc gives it
    stored.body_crc = crc
    _pack_crc_into(view, start + BODY_CRC_OFFSET, crc)
    return stored


def hook_error(hook, index: int, exc: Exception) -> AppendHookError:
    """The error a leader append fails with when ``hook`` raised ``exc`` on entry ``index``."""
    code = exc.code if isinstance(exc, DLedgerError) else ResponseCode.INTERNAL_ERROR
    detail = f"{code.name}: {exc.message}" if isinstance(exc, DLedgerError) else f"{type(exc).__name__}: {exc}"
    return AppendHookError(code, f"append hook {hook!r} failed on entry {index}: {detail}")


class LogGuard:
    """Every write a member makes to its ``store``: checked against ``state`` (an IMemberState), hooked, then stored.

    Reads go to the store directly; only appends and truncation pass here.
    The batch methods exist whatever the store: a store without
    :class:`~dledger.interfaces.IBatchLogStore` gets one-entry appends in a
    row, with the same failure rule (:func:`dledger.store.base.append_each`).
    A refused check stores nothing: the one-entry methods raise the
    DLedgerError, the batch methods a :class:`BatchAppendError` with no
    stored entries.
    """

    def __init__(self, store, state):
        self.store = store
        self.state = state
        #: The append hooks (:class:`dledger.interfaces.IAppendHook`), run in this order on every leader entry.
        self.hooks: list = []
        #: ``seal(entry, index, pos)``, what a plain store calls for each placed leader entry (see the module
        #: docstring): :func:`seal_leader_entry` with :attr:`hooks`.
        self.seal = functools.partial(seal_leader_entry, self.hooks)
        #: ``seal.into(entry, index, pos, view, start)``: the same, encoded at ``start`` of the store's buffer
        #: (:func:`seal_leader_entry_into`), for a store that writes runs of entries from one buffer.
        self.seal.into = functools.partial(seal_leader_entry_into, self.hooks)
        self._plain = IPlainLogStore.providedBy(store)
        self._batch = IBatchLogStore.providedBy(store)
        self._seal = None  # None while there are no hooks: the store seals the CRC itself, no call per entry
        #: Told of every configuration entry stored and of every truncation (the member's
        #: :class:`dledger.membership.tracker.Membership`: ``config_appended(entries)``, ``truncated(end)``).
        self.membership = None

    def _stored(self, stored: Sequence[Entry]) -> None:
        if self.membership is not None:
            found = config_entries(stored)
            if found:
                self.membership.config_appended(found)

    def _batch_stored(self, append, *args) -> list[Entry]:
        """``append(*args)``, the membership told of what was stored even when the batch failed part way."""
        try:
            stored = append(*args)
        except BatchAppendError as exc:
            self._stored(exc.stored)
            raise
        self._stored(stored)
        return stored

    def add_append_hook(self, hook) -> None:
        """Run ``hook`` (an IAppendHook) on every later leader append, after the hooks added before it."""
        self.hooks.append(hook)
        if self._plain:
            self._seal = self.seal
        else:
            self.store.add_append_hook(hook)  # a store that runs hooks itself (written before the guard)

    # -- leader --------------------------------------------------------------------
    def append_as_leader(self, entry: Entry) -> Entry:
        """Append ``entry`` at the end of the log if this member leads; returns it as stored."""
        state = self.state
        if state.role is not Role.LEADER:
            check_leader(state)
        if self._plain:
            stored = self.store.append_as_leader(entry, self._seal)
        else:
            stored = self.store.append_as_leader(entry)
        if stored.magic == _CONFIG:
            self._stored([stored])
        return stored

    def append_batch_as_leader(self, entries: Sequence[Entry]) -> list[Entry]:
        """:meth:`append_as_leader` for each of ``entries`` in order (IBatchLogStore's failure rule)."""
        state = self.state
        if state.role is not Role.LEADER:
            try:
                check_leader(state)
            except DLedgerError as exc:
                raise BatchAppendError(exc, []) from None
        store = self.store
        if self._batch:
            if self._plain:
                return self._batch_stored(store.append_batch_as_leader, entries, self._seal)
            return self._batch_stored(store.append_batch_as_leader, entries)
        if self._plain:
            return self._batch_stored(append_each, store.append_as_leader, entries, self._seal)
        return self._batch_stored(append_each, store.append_as_leader, entries)

    # -- follower ------------------------------------------------------------------
    def append_as_follower(self, entry: Entry, leader_term: int, leader_id: str) -> Entry:
        """Store the leader's ``entry`` if it comes from the leader this member follows, in its term."""
        check_follower(self.state, leader_term, leader_id)
        stored = self.store.append_as_follower(entry, leader_term, leader_id)
        if stored.magic == _CONFIG:
            self._stored([stored])
        return stored

    def append_batch_as_follower(self, entries: Sequence[Entry], leader_term: int, leader_id: str) -> list[Entry]:
        """:meth:`append_as_follower` for each of ``entries`` in order (IBatchLogStore's failure rule)."""
        try:
            check_follower(self.state, leader_term, leader_id)
        except DLedgerError as exc:
            raise BatchAppendError(exc, []) from None
        if self._batch:
            return self._batch_stored(self.store.append_batch_as_follower, entries, leader_term, leader_id)
        return self._batch_stored(append_each, self.store.append_as_follower, entries, leader_term, leader_id)

    def truncate(self, entry: Entry, leader_term: int, leader_id: str) -> int:
        """The store's ``truncate`` (make ``entry`` the last entry) if the leader this member follows asks."""
        check_follower(self.state, leader_term, leader_id)
        end = self.store.truncate(entry, leader_term, leader_id)
        if self.membership is not None:
            self.membership.truncated(self.store.ledger_end_index)
            if entry.magic == _CONFIG:  # the truncate's entry is written as the new last entry
                self._stored([entry])
        return end
