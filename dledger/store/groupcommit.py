"""Group commit: flush rounds, one (or, pipelined, two) at a time; every flush asked for meanwhile shares the next.

A round snapshots what is dirty *now* (``prepare``, on the reactor), makes
it durable through a :class:`dledger.diskio.BlockingIO` (inline, or on the
thread pool while the reactor keeps appending), then reports the index it
covered.  Appends made while a round runs are not covered by it, and a
truncate while it runs lowers what it may report (:meth:`GroupCommit.cap`),
so :attr:`GroupCommit.flushed_index` never claims an entry that is not on
disk.  Each round's latency and the time it kept the reactor busy are
recorded in :class:`FlushStats`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from time import perf_counter
from typing import Any

from twisted.internet.defer import Deferred, FirstError, gatherResults
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode
from dledger.diskio import BlockingIO
from dledger.errors import DLedgerError

log = Logger()


@dataclass
class FlushPlan:
    """One round: make everything up to ``target`` durable by running ``work`` (blocking).

    ``work`` None means nothing is dirty; a list of callables is run side by
    side (on a threaded BlockingIO, independent fsyncs overlap).  ``done(result)`` runs on the
    reactor afterwards and may return False to run ``work`` again (after
    fixing something only the reactor thread may touch, like growing an
    LMDB map).  ``failed(failure)`` puts back what the round did not cover.
    """

    target: int
    work: Callable[[], Any] | list[Callable[[], Any]] | None
    done: Callable[[Any], bool | None] | None = None
    failed: Callable[[Failure], None] | None = None
    #: Run ``work`` on the calling (reactor) thread even on a threaded BlockingIO: a tiny round's
    #: ``fdatasync`` takes less than the two thread hand-offs around it (:func:`.flushing.flush_here`).
    here: bool = False


#: A round synced here that took longer than this (a slow or busy disk: the reactor waited for it) sends
#: the next :data:`HERE_BACKOFF_ROUNDS` small rounds to the worker before one is tried here again.
HERE_SLOW_S = 0.001
HERE_BACKOFF_ROUNDS = 64


def here_backoff(sync_s: float, slow_s: float = HERE_SLOW_S, rounds: int = HERE_BACKOFF_ROUNDS) -> int:
    """How many small rounds go to the worker after one synced here in ``sync_s`` seconds (0: keep here).

    Running a tiny round's ``fdatasync`` on the reactor thread pays only while it is shorter than the two
    thread hand-offs it saves (~0.2-0.3 ms on a local SSD); when the disk is slow or shared, the reactor
    would wait milliseconds per round, so the rounds go back to the worker for a while and one probes again.
    """
    return rounds if sync_s > slow_s else 0


def percentile(values, q: float) -> float:
    """The ``q``-quantile (0..1) of ``values`` by nearest rank; 0.0 when empty."""
    ordered = sorted(values)
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, int(round(q * len(ordered) + 0.5)) - 1))]


class FlushStats:
    """Per-round latency (request to durable) and reactor-blocked time, in seconds, for the last rounds."""

    def __init__(self, history: int = 65536):
        self.rounds = 0
        self.failures = 0
        self.latencies: deque[float] = deque(maxlen=history)
        self.blocked: deque[float] = deque(maxlen=history)
        self.total_blocked = 0.0
        self.max_blocked = 0.0

    def record(self, latency: float, blocked: float) -> None:
        self.rounds += 1
        self.latencies.append(latency)
        self.blocked.append(blocked)
        self.total_blocked += blocked
        self.max_blocked = max(self.max_blocked, blocked)

    def summary(self) -> dict[str, float]:
        """Milliseconds: latency and reactor-blocked p50/p99/max over the recorded rounds."""
        ms = 1000.0
        return {
            "rounds": self.rounds,
            "latency_p50_ms": percentile(self.latencies, 0.50) * ms,
            "latency_p99_ms": percentile(self.latencies, 0.99) * ms,
            "latency_max_ms": max(self.latencies, default=0.0) * ms,
            "blocked_p50_ms": percentile(self.blocked, 0.50) * ms,
            "blocked_p99_ms": percentile(self.blocked, 0.99) * ms,
            "blocked_max_ms": self.max_blocked * ms,
        }


class _Round:
    __slots__ = ("plan", "waiters", "t0", "blocked", "target", "seq", "outcome", "stale")

    def __init__(self, plan: FlushPlan, waiters: list[Deferred], t0: float, seq: int):
        self.plan, self.waiters, self.t0, self.blocked = plan, waiters, t0, 0.0
        self.target = plan.target
        self.seq = seq
        #: None while running; True once its work is durable; a Failure if it failed.
        self.outcome: bool | Failure | None = None
        #: An earlier round failed while this one ran: its target is not durable (the failed range is not).
        self.stale = False


class GroupCommit:
    """Runs flush rounds, up to ``depth`` at a time, completing in order; see the module docstring.

    ``depth`` 1 is one round at a time: a flush asked for while one runs waits for its end, then a whole
    round of its own.  ``depth`` 2 starts that round at once, beside the running one (issue #28: a
    request no longer waits a whole round behind each arrival, nor the reactor's turn between rounds);
    its waiters still fire only after every earlier round is durable, because a later round does not
    sync what an earlier one took (new files, directories, the earlier bytes).  Only stores whose rounds
    may overlap use it (fdatasync of a descriptor covers whatever was written to it before the call,
    whichever thread calls it).
    """

    def __init__(self, io: BlockingIO, prepare: Callable[[], FlushPlan], *,
                 after_round: Callable[[], None] | None = None, flushed_index: int = -1, depth: int = 1):
        if depth < 1:
            raise ValueError(f"group commit depth must be at least 1, not {depth}")
        self.io = io
        self._prepare = prepare
        self._after_round = after_round
        self.flushed_index = flushed_index
        self.depth = depth
        self.stats = FlushStats()
        #: Rounds started, and rounds finished (in order: every round numbered <= ``finished`` has ended).
        self.started = 0
        self.finished = 0
        self._rounds: deque[_Round] = deque()
        self._next: list[Deferred] = []
        #: Small rounds still to send to the worker after a slow sync here (:func:`here_backoff`).
        self.here_backoff = 0

    @property
    def busy(self) -> bool:
        """A round is running (its descriptors may be in use by a worker thread)."""
        return bool(self._rounds)

    def request(self) -> Deferred:
        """A Deferred firing with :attr:`flushed_index` once everything appended so far is durable.

        A round whose plan runs ``here`` may have fired it before it is returned.
        """
        d: Deferred = Deferred()
        self._next.append(d)
        if len(self._rounds) < self.depth:
            self._run_round()
        return d

    def cap(self, index: int) -> None:
        """Entries after ``index`` were removed or replaced: neither the past nor a running round covers them."""
        self.flushed_index = min(self.flushed_index, index)
        for rnd in self._rounds:
            rnd.target = min(rnd.target, index)

    def _run_round(self) -> None:
        waiters, self._next = self._next, []
        t0 = perf_counter()
        try:
            plan = self._prepare()
        except Exception:
            self._fail_waiters(waiters, Failure())
            return
        self.started += 1
        rnd = _Round(plan, waiters, t0, self.started)
        self._rounds.append(rnd)
        if plan.work is None:  # nothing dirty: done, but it reports only after the rounds before it
            rnd.blocked = perf_counter() - t0
            rnd.outcome = True
            self._drain()
            return
        rnd.blocked = perf_counter() - t0
        self._attempt(rnd)

    def _attempt(self, rnd: _Round) -> None:
        t = perf_counter()
        work = rnd.plan.work
        if isinstance(work, list):
            d = gatherResults([self.io.run(w) for w in work], consumeErrors=True)
            d.addErrback(lambda f: f.value.subFailure if isinstance(f.value, FirstError) else f)
        elif rnd.plan.here and not self.here_backoff:
            d = self.io.run_here(work)
            self.here_backoff = here_backoff(perf_counter() - t)
        else:
            if rnd.plan.here:
                self.here_backoff -= 1
            d = self.io.run(work)
        rnd.blocked += perf_counter() - t
        d.addCallbacks(self._work_done, self._work_failed, callbackArgs=(rnd,), errbackArgs=(rnd,))

    def _work_done(self, result: Any, rnd: _Round) -> None:
        t = perf_counter()
        try:
            again = rnd.plan.done is not None and rnd.plan.done(result) is False
        except Exception:
            rnd.blocked += perf_counter() - t
            self._work_failed(Failure(), rnd)
            return
        rnd.blocked += perf_counter() - t
        if again:
            self._attempt(rnd)
            return
        rnd.outcome = True
        self._drain()

    def _work_failed(self, failure: Failure, rnd: _Round) -> None:
        self.stats.failures += 1
        log.failure("flush round failed", failure)
        if rnd.plan.failed is not None:
            rnd.plan.failed(failure)
        for later in self._rounds:
            if later.seq > rnd.seq:
                later.stale = True
        rnd.outcome = failure
        self._drain()

    def _drain(self) -> None:
        """Report the finished rounds at the head of the queue, oldest first; then start the next if asked."""
        rounds = self._rounds
        while rounds and rounds[0].outcome is not None:
            rnd = rounds.popleft()
            self.finished = rnd.seq
            outcome = rnd.outcome
            if outcome is True:  # a failed round is counted in stats.failures only
                self.stats.record(perf_counter() - rnd.t0, rnd.blocked)
            if outcome is True and not rnd.stale:
                self.flushed_index = max(self.flushed_index, rnd.target)
                self._after()
                for w in rnd.waiters:
                    w.callback(self.flushed_index)
            elif outcome is True:  # durable itself, but an earlier round's range is not: ask again
                self._after()
                self._next[:0] = rnd.waiters
            else:
                self._after()
                self._fail_waiters(rnd.waiters, outcome)
        if self._next and len(rounds) < self.depth:
            self._run_round()

    def _after(self) -> None:
        if self._after_round is not None:
            self._after_round()

    @staticmethod
    def _fail_waiters(waiters: list[Deferred], failure: Failure) -> None:
        err = failure.value
        if not isinstance(err, DLedgerError):
            err = DLedgerError(ResponseCode.DISK_ERROR, f"flush failed: {failure.getErrorMessage()}")
        for w in waiters:
            w.errback(err)
