"""A member's mending of its own log: damaged committed entries rewritten from another member's copy.

Owned by :class:`dledger.server.DLedgerServer` (issue 21, item 6).  When the store can be repaired
(``IRepairableLogStore``) it keeps an :class:`~dledger.replication.repair.EntryRepairer` (fetches a copy
proven to be the same entry and has the store rewrite it) and, with ``scrubIntervalSeconds`` > 0, a
:class:`~dledger.store.scrub.Scrubber` that looks for damage in the background.  A read that hits a
damaged entry is answered once it is repaired; a member whose store was marked damaged for that entry
stands for election again.  Kept apart from the server so the server only routes to it.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.interfaces import IRepairableLogStore
from dledger.replication.repair import EntryRepairer
from dledger.store.scrub import Scrubber

log = Logger()


class Mending:
    """Repairer and scrubber of one member's store (both None when the store cannot be repaired)."""

    def __init__(self, server, config, store, transport, clock):
        self.server = server
        self.store = store
        self.repairer: EntryRepairer | None = None
        self.scrubber: Scrubber | None = None
        if IRepairableLogStore.providedBy(store):
            self.repairer = EntryRepairer(self_id=server.self_id, group=config.group, store=store, transport=transport,
                                          clock=clock, peers=lambda: list(server.state.members),
                                          leader_id=lambda: server.state.leader_id,
                                          timeout=config.max_push_time_out_ms / 1000.0)
            if config.scrub_interval_seconds > 0:
                self.scrubber = Scrubber(store, clock, server.blocking_io, interval=config.scrub_interval_seconds,
                                         bytes_per_second=config.scrub_bytes_per_second,
                                         on_damaged=self.repair, accept_zero_crc=config.accept_java_zero_crc,
                                         name=server.self_id)

    def start(self) -> None:
        if self.scrubber is not None:
            self.scrubber.start()

    def stop(self) -> None:
        if self.scrubber is not None:
            self.scrubber.stop()

    def may_repair(self, index: int) -> bool:
        """A repair of ``index`` is worth trying (a repairer exists and has not given up on it)."""
        return self.repairer is not None and not self.repairer.gave_up(index)

    def read(self, begin: int, want: int, read_now: Callable[[int, int], object]):
        """``read_now(begin, want)``; an entry that fails its CRC is first repaired from another member's copy.

        Entries before the damaged one are served at once (a shorter answer); the damaged one is answered
        once the repair has rewritten it, or with the DISK_ERROR if nobody holds it.
        """
        try:
            return read_now(begin, want)
        except DLedgerError as exc:
            if exc.code is not ResponseCode.DISK_ERROR or self.repairer is None:
                raise
            error = exc
        bad = begin
        while bad < min(self.store.committed_index, begin + want - 1):
            try:
                self.store.get(bad)
            except DLedgerError:
                break
            bad += 1
        if bad > begin:
            return read_now(begin, bad - begin)

        def repaired(ok: bool):
            if not ok:
                raise error
            return read_now(begin, want)

        return self.repair(bad, error.message or str(error)).addCallback(repaired)

    def repair(self, index: int, why: str) -> Deferred:
        """Rewrite damaged committed entry ``index`` from another member's copy; fires True if it was repaired.

        If the member had marked its store damaged for that entry (it stopped standing for election), the
        mark goes: the entry reads back intact now.
        """
        if self.repairer is None:
            return succeed(False)
        server = self.server

        def done(ok: bool) -> bool:
            if ok and server.damaged is not None and server.damaged[0] == index:
                server.damaged = None
                server.elector.store_damaged = None
                log.info("{id}: entry {index} was repaired: this member stands for election again",
                         id=server.self_id, index=index)
            return ok

        return self.repairer.repair(index, why).addCallback(done)
