"""Repairing a damaged committed entry of this member's log from another member's intact copy (issue 21).

Found by the scrub (:mod:`dledger.store.scrub`), by a read that failed its
CRC (a GET on the leader), or by the leader's dispatcher that could not read
an entry to replicate it.  :class:`EntryRepairer` asks the other members, the
leader first, for the entry (a GET with ``followerRead``: a member answers only
from its committed prefix, and only with a copy that verified on its own
disk), and hands the first copy to the store's ``repair_entry``, which writes
it only if it proves to be the same committed entry
(:func:`dledger.store.scrub.repair_refusal`).  A NOOP needs no copy: its index
record says everything about it.  One line says what was repaired, where, and
from whom; a failure is one error line (then one a minute per entry).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import GetEntriesRequest
from dledger.ratelog import RateLimitedLog
from dledger.store.scrub import noop_from_record

log = Logger()

#: Seconds after a failed repair during which :meth:`EntryRepairer.gave_up` is True for that entry.
GIVE_UP_SECONDS = 60.0


def fetch_order(peers: Sequence[str], self_id: str, leader_id: str | None) -> list[str]:
    """Whom to ask for a copy: the leader first (it holds every committed entry), then the others by id."""
    others = sorted(p for p in peers if p != self_id)
    if leader_id in others:
        others.remove(leader_id)
        others.insert(0, leader_id)
    return others


class EntryRepairer:
    """Repairs entries of ``store`` (an IRepairableLogStore) from the members ``peers()`` names.

    ``leader_id()`` gives the leader this member knows; ``transport`` sends the GETs (each waits at most
    ``timeout`` seconds).  :meth:`repair` runs once per index at a time: asking again while a repair of the
    same index runs returns the same Deferred.
    """

    def __init__(self, *, self_id: str, group: str, store, transport, clock, peers: Callable[[], Sequence[str]],
                 leader_id: Callable[[], str | None], timeout: float):
        self.self_id = self_id
        self.group = group
        self.store = store
        self.transport = transport
        self.peers = peers
        self.leader_id = leader_id
        self.timeout = timeout
        self.clock = clock
        self.repaired = 0
        self._running: dict[int, Deferred] = {}
        self._failed: dict[int, float] = {}  # index -> when its last repair failed (bounded)
        self._fail_log = RateLimitedLog(log, clock, interval=60.0)

    def gave_up(self, index: int) -> bool:
        """A repair of ``index`` failed less than :data:`GIVE_UP_SECONDS` ago (nobody held an intact copy)."""
        when = self._failed.get(index)
        return when is not None and self.clock.seconds() - when < GIVE_UP_SECONDS

    def repair(self, index: int, why: str) -> Deferred:
        """Repair entry ``index`` (damaged: ``why``, naming file and offset); fires True if repaired, else False."""
        running = self._running.get(index)
        if running is not None:
            d: Deferred = Deferred()
            running.addBoth(lambda r: (d.callback(r is True), r)[1])
            return d
        d = self._repair(index, why)
        d.addErrback(lambda f: log.failure("{id}: repairing entry {index} failed", f, id=self.self_id,
                                           index=index) or False)
        self._running[index] = d

        def done(result):
            self._running.pop(index, None)
            if result is True:
                self._failed.pop(index, None)
            else:
                if len(self._failed) >= 1024:
                    self._failed.clear()
                self._failed[index] = self.clock.seconds()
            return result

        return d.addBoth(done)

    @inlineCallbacks
    def _repair(self, index: int, why: str):
        store = self.store
        noop = None
        rec = store.index_record(index)
        if rec is not None:
            noop = noop_from_record(rec)
        tried: list[str] = []
        if noop is not None:
            try:
                yield store.repair_entry(noop)
                self._repaired(index, why, "its index record (a NOOP)")
                return True
            except DLedgerError as exc:
                tried.append(f"rebuilt NOOP: {exc.message}")
        for peer in fetch_order(self.peers(), self.self_id, self.leader_id()):
            req = GetEntriesRequest(group=self.group, remote_id=peer, local_id=self.self_id, begin_index=index,
                                    max_size=1, follower_read=True)
            try:
                resp = yield self.transport.send(peer, req, timeout=self.timeout)
            except Exception as exc:
                tried.append(f"{peer}: {getattr(exc, 'message', '') or exc}")
                continue
            if resp.response_code is not ResponseCode.SUCCESS or not resp.entries or resp.entries[0].index != index:
                tried.append(f"{peer}: answered {resp.response_code.name}" + (
                    "" if resp.response_code is not ResponseCode.SUCCESS else " without the entry"))
                continue
            try:
                yield store.repair_entry(resp.entries[0])
            except DLedgerError as exc:
                tried.append(f"{peer}: {exc.message}")
                continue
            self._repaired(index, why, peer)
            return True
        self._fail_log.error(("unrepaired", index), "{id}: damaged entry {index} ({why}) could not be repaired: "
                             "{tried}; it stays as it is (see 'store damaged' in operations.md)", id=self.self_id,
                             index=index, why=why, tried="; ".join(tried) or "no other member to ask")
        return False

    def _repaired(self, index: int, why: str, source: str) -> None:
        self.repaired += 1
        self._fail_log.limiter.forget(("unrepaired", index))
        log.warn("{id}: repaired damaged entry {index} ({why}) with the intact copy from {source}", id=self.self_id,
                 index=index, why=why, source=source)
