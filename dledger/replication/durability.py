"""Group commit: one store flush in flight at a time (two for a store that pipelines its rounds), many
waiters served by each.

An entry counts toward the quorum (leader) or is acknowledged (follower)
only once the store reports it durable.  Requests that arrive while a flush
runs are covered by the next one, so a burst of appends costs one or two
fsyncs, not one each.  A store whose ``flush_rounds`` is 2 (the mmap store) runs the next flush
beside the running one and still reports rounds in order, so a second flush is asked for at once rather
than after the first ends (issue #28, round 2b).  With ``flushPolicy=async`` (Java's behaviour) nothing
waits: the store flushes on its own timer.
"""

from __future__ import annotations

import heapq
import itertools

from twisted.internet.defer import Deferred, succeed
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.ratelog import RateLimitedLog
from dledger.transport.outbox import send_written

log = Logger()


class Flusher:
    """Resolves ``wait(index)`` once ``store.flushed_index >= index``."""

    def __init__(self, store, clock, *, sync: bool = True):
        self.store = store
        self.clock = clock
        self.sync = sync
        self._waiters: list[tuple[int, int, Deferred]] = []
        self._seq = itertools.count()
        self._flushing = 0  # store flushes asked for and not yet answered
        #: How many flushes may be in flight: the store's pipelined rounds (``ILogStore.flush_rounds``).
        self._max_flushing = store.flush_rounds
        self._scheduled = None
        self._stopped = False
        self.flushes = 0
        self._fail_log = RateLimitedLog(log, clock, interval=60.0)

    def wait(self, index: int) -> Deferred:
        """Deferred firing when entry ``index`` is durable."""
        if not self.sync or self.store.flushed_index >= index:
            return succeed(index)
        d: Deferred = Deferred()
        heapq.heappush(self._waiters, (index, next(self._seq), d))
        self._schedule()
        return d

    def _schedule(self) -> None:
        if self._flushing >= self._max_flushing or self._scheduled is not None or self._stopped:
            return
        self._scheduled = self.clock.callLater(0, self._flush)

    def _flush(self) -> None:
        self._scheduled = None
        if self._stopped:
            return
        self._flushing += 1
        self.flushes += 1
        d = self.store.flush()
        d.addCallbacks(self._flushed, self._failed)
        if d.called:  # a round synced here (or nothing to sync): what the waiters wrote leaves now, not at the poll
            send_written()

    def _flushed(self, _result) -> None:
        self._flushing -= 1
        flushed = self.store.flushed_index
        while self._waiters and self._waiters[0][0] <= flushed:
            _, _, d = heapq.heappop(self._waiters)
            d.callback(flushed)
        if self._waiters:
            self._schedule()

    def _failed(self, failure) -> None:
        self._flushing -= 1
        if isinstance(failure.value, OSError):  # a disk that fails every flush: one line a minute, no traceback
            self._fail_log.error("flush", "flush of the store in {dir} failed: {why}; failing {n} waiters "
                                 "(DISK_ERROR)", dir=getattr(self.store, "member_dir", "?"),
                                 why=failure.value.strerror or failure.value, n=len(self._waiters))
        else:
            log.failure("flush failed; failing {n} waiters", failure, n=len(self._waiters))
        self._fail_where(lambda index: True, DLedgerError(ResponseCode.DISK_ERROR, f"flush failed: {failure.value}"))

    def cancel_above(self, index: int, why: str) -> None:
        """Fail waiters for entries past ``index`` (they were truncated away and will never be durable)."""
        self._fail_where(lambda i: i > index, DLedgerError(ResponseCode.INCONSISTENT_STATE, why))

    def _fail_where(self, pred, error: DLedgerError) -> None:
        keep, failed = [], []
        for item in self._waiters:
            (failed if pred(item[0]) else keep).append(item)
        heapq.heapify(keep)
        self._waiters = keep
        for _, _, d in failed:
            d.errback(error)

    def stop(self) -> None:
        self._stopped = True
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None
        self._fail_where(lambda i: True, DLedgerError(ResponseCode.TERM_CHANGED, "member stopped"))
