"""Delivers committed entries to commit listeners, in log order, NOOPs left out.

Each listener has its own cursor, starts where it asks (``start_index``) and
may slow its own delivery down by returning a Deferred; a slow listener
never delays the others or the core.
"""

from __future__ import annotations

from twisted.internet.defer import maybeDeferred
from twisted.logger import Logger

from dledger.entry import without_noops
from dledger.errors import DLedgerError

log = Logger()

BATCH = 1000


class _Cursor:
    __slots__ = ("listener", "next_index", "busy")

    def __init__(self, listener, next_index: int):
        self.listener = listener
        self.next_index = next_index
        self.busy = False


class CommitFeed:
    """Feeds ``ICommitListener``s from the store as the committed index moves."""

    def __init__(self, store, clock, member_id: str = "?"):
        self.store = store
        self.clock = clock
        self.member_id = member_id
        self._cursors: list[_Cursor] = []
        self._scheduled = None
        self._stopped = False

    def next_indexes(self) -> list[int]:
        """The next index each listener will be given (what the status page reports as applied)."""
        return [c.next_index for c in self._cursors]

    def add(self, listener) -> None:
        start = max(int(listener.start_index()), 0)
        self._cursors.append(_Cursor(listener, start))
        self.advanced()

    def advanced(self) -> None:
        """The committed index moved (or a listener became free): deliver soon, off the caller's stack."""
        if self._scheduled is None and self._cursors and not self._stopped:
            self._scheduled = self.clock.callLater(0, self._deliver)

    def _deliver(self) -> None:
        self._scheduled = None
        for cursor in self._cursors:
            if not cursor.busy:
                self._feed(cursor)

    def _feed(self, cursor: _Cursor) -> None:
        store = self.store
        committed = store.committed_index
        while cursor.next_index <= committed and not self._stopped:
            if cursor.next_index < store.ledger_begin_index:
                log.warn("{id}: commit listener {l!r} wanted index {i} but the log starts at {b}; skipping ahead",
                         id=self.member_id, l=cursor.listener, i=cursor.next_index, b=store.ledger_begin_index)
                cursor.next_index = store.ledger_begin_index
            count = min(BATCH, committed - cursor.next_index + 1)
            try:
                entries = store.get_range(cursor.next_index, count, 1 << 62)
            except DLedgerError as exc:
                log.error("{id}: commit feed cannot read index {i}: {exc}", id=self.member_id,
                          i=cursor.next_index, exc=exc)
                return
            cursor.next_index = entries[-1].index + 1
            visible = without_noops(entries)
            if not visible:
                continue
            d = maybeDeferred(cursor.listener.entries_committed, visible)
            if d.called:
                d.addErrback(self._listener_failed, cursor)
                continue
            cursor.busy = True
            d.addErrback(self._listener_failed, cursor)
            d.addBoth(self._free, cursor)
            return

    def caught_up(self) -> bool:
        """Every listener was handed every committed entry and has finished with it (none busy, nothing scheduled).

        What :meth:`dledger.testing.Cluster.wait_applied` waits for on each member: the application's state
        machines have applied the whole committed log.
        """
        committed = self.store.committed_index
        return self._scheduled is None and all(not c.busy and c.next_index > committed for c in self._cursors)

    def _listener_failed(self, failure, cursor: _Cursor) -> None:
        log.failure("{id}: commit listener {l!r} failed", failure, id=self.member_id, l=cursor.listener)

    def _free(self, _result, cursor: _Cursor) -> None:
        cursor.busy = False
        self.advanced()

    def stop(self) -> None:
        self._stopped = True
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None
