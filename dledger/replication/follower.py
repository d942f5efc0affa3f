"""The follower's entry handler (SPEC §4 "Entry handler").

APPEND pushes are kept by first index and applied strictly in order at
``ledger_end_index + 1``, whatever order they arrive in; COMPARE, TRUNCATE
and COMMIT are handled on arrival.  A SUCCESS reply to an APPEND or TRUNCATE
is sent only once the entries are durable.  A push that waits for a gap
longer than ``maxPushTimeOutMs`` is answered INCONSISTENT_STATE so the
leader re-compares (DLedger's fast-forward check).
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.codes import PushType, ResponseCode
from dledger.config import DLedgerConfig
from dledger.errors import DLedgerError
from dledger.interfaces import IDiskHealth
from dledger.messages import PushEntryRequest, PushEntryResponse
from dledger.ratelog import RateLimitedLog
from dledger.replication import pushcheck
from dledger.replication.follower_rules import (
    AppendKind,
    MatchedPrefix,
    classify_append,
    commit_needs_compare,
    commit_to_adopt,
    leader_log_changed,
    overdue_push,
    stale_truncate,
)
from dledger.store.guard import LogGuard

log = Logger()

#: The APPEND window of a follower built without one: what the default configuration allows a leader.
DEFAULT_APPEND_WINDOW = pushcheck.append_window(DLedgerConfig.max_pending_size, DLedgerConfig.max_batch_push_size)


class EntryHandler:
    """Applies the leader's pushes to this member's store."""

    def __init__(self, state, store, flusher, clock, *, push_timeout: float,
                 on_commit: Callable[[], None] = lambda: None, append_window: int = DEFAULT_APPEND_WINDOW,
                 max_waiting: int = DLedgerConfig.max_pending_size, guard: LogGuard | None = None):
        self.state = state
        self.append_window = append_window
        self.max_waiting = max_waiting
        self.refusals = RateLimitedLog(log, clock)
        # (term, leader, index) of the last COMPARE received: a reset TRUNCATE must follow one (pushcheck)
        self._compared: tuple[int, str | None, int] | None = None
        self.store = store
        self.flusher = flusher
        self.clock = clock
        self.push_timeout = push_timeout
        self.on_commit = on_commit
        #: The store's writes, checked against ``state`` (:mod:`dledger.store.guard`; the member's own if given).
        self.guard = guard if guard is not None else LogGuard(store, state)
        self._append_batch = self.guard.append_batch_as_follower
        self._waiting: dict[int, tuple[PushEntryRequest, Deferred, float]] = {}
        self._timer = None
        # Highest index known to match the current leader's log in the current term.
        self._matched = MatchedPrefix()
        self._refusals = RateLimitedLog(log, clock, interval=30.0)
        self._disk = store if IDiskHealth.providedBy(store) else None

    @property
    def parked(self) -> int:
        """APPENDs that arrived ahead of the log's end and wait for the gap before them (at most ``max_waiting``)."""
        return len(self._waiting)

    # -- replies -------------------------------------------------------------------
    def _response(self, req: PushEntryRequest, code: ResponseCode) -> PushEntryResponse:
        return PushEntryResponse(
            group=req.group, term=req.term, code=int(code),
            index=None if req.type is PushType.COMMIT else req.first_entry_index,
            count=req.count, begin_index=self.store.ledger_begin_index, end_index=self.store.ledger_end_index)

    def _reply(self, d: Deferred, req: PushEntryRequest, code: ResponseCode) -> None:
        if not d.called:
            d.callback(self._response(req, code))

    def _refuse(self, d: Deferred, req: PushEntryRequest, exc: DLedgerError) -> None:
        """Refuse entries we must not store, loudly: an error line (rate-limited per leader) and the reason.

        The reason travels back as the error reply's remark, so the leader's operator can read why (a Java
        leader's zero CRCs with acceptJavaZeroCrc off stalled a mixed group with only a debug line).
        """
        self._refusals.error(("refused", req.leader_id), "{id}: refusing entries {first}..{last} from leader "
                             "{leader} (term {term}): {why}", id=self.state.self_id, first=req.first_entry_index,
                             last=req.last_entry_index, leader=req.leader_id, term=req.term, why=exc.message or exc)
        if not d.called:
            d.errback(exc)

    def _reply_when_durable(self, d: Deferred, req: PushEntryRequest, index: int) -> None:
        def durable(_):
            self._adopt_commit(req)
            self._reply(d, req, ResponseCode.SUCCESS)

        self.flusher.wait(index).addCallbacks(
            durable,
            lambda f: self._reply(d, req, f.value.code if isinstance(f.value, DLedgerError)
                                  else ResponseCode.DISK_ERROR))

    # -- matched prefix and commit ----------------------------------------------------
    def _current(self, req: PushEntryRequest) -> bool:
        return req.term == self.state.curr_term and req.leader_id == self.state.leader_id

    def _match(self, req: PushEntryRequest, index: int) -> None:
        if self._current(req):
            self._matched.match((req.term, req.leader_id), index)

    def _mismatch(self, req: PushEntryRequest, index: int) -> None:
        """The leader's entry at ``index`` differs from ours: if we had verified it, this is a new incarnation."""
        epoch = (req.term, req.leader_id)
        if self._current(req) and leader_log_changed(index, False, self._matched.of(epoch)):
            self._refusals.warn(("incarnation", epoch), "{id}: leader {leader} of term {term} sent an entry at "
                                "{index} other than the one verified against it: it restarted and leads the "
                                "same term again (a Java DLedger leader may); forgetting what was verified "
                                "so it can repair this log", id=self.state.self_id, leader=req.leader_id,
                                term=req.term, index=index)
            self._matched.reset()

    def _adopt_commit(self, req: PushEntryRequest) -> None:
        """Adopt ``min(leaderCommit, matched prefix, durable)``: never commit entries not known to match the leader."""
        epoch = (req.term, req.leader_id)
        if not self._current(req) or not self._matched.known(epoch):
            return
        durable = self.store.flushed_index if self.flusher.sync else self.store.ledger_end_index
        target = commit_to_adopt(req.commit_index, self._matched.of(epoch), durable)
        before = self.store.committed_index
        if target > before:
            self.store.update_committed_index(req.term, target)
            if self.store.committed_index > before:
                self.on_commit()

    # -- entry point -------------------------------------------------------------------
    def handle_push(self, req: PushEntryRequest) -> Deferred:
        d: Deferred = Deferred()
        refusal = self._protocol_error(req)
        if refusal is not None:
            self.refusals.warn(("push refused", req.type), "{id}: refusing a {type} push from {leader} "
                               "(term {term}): {why}", id=self.state.self_id, type=req.type.name,
                               leader=req.leader_id, term=req.term, why=refusal)
            d.errback(DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, refusal))
            return d
        try:
            if req.type is PushType.APPEND:
                self._on_append(req, d)
            elif req.type is PushType.COMMIT:
                self._on_commit(req, d)
            elif req.type is PushType.COMPARE:
                self._on_compare(req, d)
            elif req.type is PushType.TRUNCATE:
                self._on_truncate(req, d)
            else:  # pragma: no cover - the enum has no other members
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"push type {req.type}")
        except DLedgerError as exc:
            if exc.code is ResponseCode.UNEXPECTED_ARGUMENT and req.type in (PushType.APPEND, PushType.TRUNCATE):
                self._refuse(d, req, exc)
            else:
                self._reply(d, req, exc.code)
        return d

    def _protocol_error(self, req: PushEntryRequest) -> str | None:
        """Why ``req`` is not a push a real leader would send now (see :mod:`pushcheck`); None if it may proceed.

        Checked before anything else, so a refused push changes nothing, on disk or in memory.
        """
        store = self.store
        if req.type is PushType.COMPARE and req.entry is not None:
            self._compared = (req.term, req.leader_id, req.entry.index)
        elif req.type is PushType.TRUNCATE and req.entry is not None:
            compared = self._compared
            index = compared[2] if compared is not None and compared[:2] == (req.term, req.leader_id) else None
            return pushcheck.check_truncate(req.entry.index, store.ledger_begin_index, store.ledger_end_index, index)
        elif req.type is PushType.APPEND:
            return pushcheck.check_append([e.index for e in req.entries()], store.ledger_end_index,
                                          self.append_window, len(self._waiting), self.max_waiting)
        return None

    def _clear_waiting(self, why: str, code: ResponseCode = ResponseCode.INCONSISTENT_STATE) -> None:
        waiting, self._waiting = self._waiting, {}
        for req, d, _ in waiting.values():
            self._reply(d, req, code)
        if waiting:
            log.debug("{id}: dropped {n} waiting pushes: {why}", id=self.state.self_id, n=len(waiting), why=why)

    def installed(self, index: int, term: int, leader_id: str | None) -> None:
        """The log was reset to a snapshot at ``index`` (InstallSnapshot): nothing above it waits or is verified.

        The snapshot came from the leader of ``term``: if that is still the leader we follow, the log up to
        ``index`` matches its log, so its commit index may be adopted up to there at once.
        """
        self._clear_waiting("snapshot installed")
        self.flusher.cancel_above(index, f"snapshot {index} installed")
        self._matched.reset()
        self._compared = None
        if term == self.state.curr_term and leader_id == self.state.leader_id:
            self._matched.match((term, leader_id), index)

    def reset(self) -> None:
        """The term or leader changed: answer everything still waiting."""
        self._clear_waiting("term or leader changed")
        self._matched.reset()

    def _on_commit(self, req: PushEntryRequest, d: Deferred) -> None:
        """Adopt the leader's commit index; if we lack committed entries or hold unmatched ones, ask for a COMPARE.

        After a restart (or any gap in what we know) our tail may hold entries
        that were truncated before the crash but never flushed; committing
        them by position alone could commit the wrong entries.
        """
        matched = self._matched.of((req.term, req.leader_id))
        if self._current(req) and commit_needs_compare(req.commit_index, matched, self.store.ledger_end_index):
            # Committed entries we do not hold (a wiped or recovered store) must be re-sent: SUCCESS here
            # would tell the leader we are in sync and leave us empty until the next client write.  What we
            # hold and verified may still be committed (bounded by the matched prefix, so always safe).
            self._adopt_commit(req)
            self._reply(d, req, ResponseCode.INCONSISTENT_STATE)
            return
        self._adopt_commit(req)
        self._reply(d, req, ResponseCode.SUCCESS)

    def _on_compare(self, req: PushEntryRequest, d: Deferred) -> None:
        if req.entry is None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "COMPARE without an entry")
        self._clear_waiting("COMPARE")
        base_index, base_term = getattr(self.store, "snapshot_base", (-1, -1))
        try:
            if 0 <= base_index == req.entry.index < self.store.ledger_begin_index:
                # The log starts after an installed snapshot: its last entry is known by index and term only.
                same = req.entry.term == base_term
            else:
                same = self.store.get(req.entry.index) == req.entry
        except DLedgerError as exc:
            same = False
            if exc.code is ResponseCode.DISK_ERROR:  # damaged here: say so, the leader's compare alone would not
                self._refusals.error(("unreadable", req.entry.index), "{id}: cannot read entry {index} of this "
                                     "member's log to compare it with leader {leader}: {why}; the store is damaged "
                                     "(see 'store damaged' in operations.md)", id=self.state.self_id,
                                     index=req.entry.index, leader=req.leader_id, why=exc.message or exc)
        if same:
            self._match(req, req.entry.index)
        else:
            self._mismatch(req, req.entry.index)
        self._reply(d, req, ResponseCode.SUCCESS if same else ResponseCode.INCONSISTENT_STATE)

    def _on_truncate(self, req: PushEntryRequest, d: Deferred) -> None:
        """Drop our tail after the leader's entry -- unless the request is stale.

        Within one term a leader's log only grows, so a TRUNCATE below the
        prefix we already verified against this leader can only be an old or
        duplicated message (the network reordered it behind later appends);
        obeying it would drop entries we have acknowledged and the leader may
        have counted toward a commit.
        """
        if req.entry is None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "TRUNCATE without an entry")
        matched = self._matched.of((req.term, req.leader_id))
        if stale_truncate(req.entry.index, matched):
            log.debug("{id}: ignoring a stale TRUNCATE at {i} (verified up to {m})", id=self.state.self_id,
                      i=req.entry.index, m=matched)
            self._reply(d, req, ResponseCode.INCONSISTENT_STATE)
            return
        self._clear_waiting("TRUNCATE")
        was_empty = self.store.ledger_end_index < 0
        index = self.guard.truncate(req.entry, req.term, req.leader_id)
        self.flusher.cancel_above(index - 1, f"truncated at {index}")
        # An empty log (new group, wiped store) is filled, not repaired: say so, so that it does not read as damage.
        what = "log was empty; starting it at index {index}" if was_empty else "truncated to index {index}"
        log.info("{id}: " + what + " for leader {leader} (term {term})", id=self.state.self_id,
                 index=index, leader=req.leader_id, term=req.term)
        self._match(req, index)
        self._adopt_commit(req)
        self._reply_when_durable(d, req, index)

    def _on_append(self, req: PushEntryRequest, d: Deferred) -> None:
        entries = req.entries()
        if not entries:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "APPEND without entries")
        end = self.store.ledger_end_index
        kind = classify_append(entries[0].index, entries[-1].index, end)
        if kind is AppendKind.DUPLICATE:
            self._on_duplicate(req, d, entries)
            return
        if kind is AppendKind.OVERLAP:
            # Overlaps what we hold (a retry after a lost ack): the held part must agree.
            held = [e for e in entries if e.index <= end]
            if not self._holds(held):
                self._mismatch(req, held[0].index)
                self._reply(d, req, ResponseCode.INCONSISTENT_STATE)
                return
            req = _trimmed(req, [e for e in entries if e.index > end])
        first = req.first_entry_index
        if first in self._waiting:
            self._reply(d, req, ResponseCode.REPEATED_PUSH)
            return
        refusal = self._disk.write_refusal() if self._disk is not None else None
        if refusal is not None:  # a full or failing disk: answer now rather than hold the push (issue 21)
            self._clear_waiting("the store refuses writes", refusal.code)
            self._reply(d, req, refusal.code)
            return
        self._waiting[first] = (req, d, self.clock.seconds())
        self._drain()

    def _holds(self, entries) -> bool:
        try:
            return all(self.store.get(e.index) == e for e in entries)
        except DLedgerError:
            return False

    def _on_duplicate(self, req: PushEntryRequest, d: Deferred, entries) -> None:
        if self._holds(entries):
            self._match(req, entries[-1].index)
            self._reply_when_durable(d, req, entries[-1].index)
        else:
            self._mismatch(req, entries[0].index)
            self._reply(d, req, ResponseCode.INCONSISTENT_STATE)

    def _drain(self) -> None:
        while True:
            item = self._waiting.pop(self.store.ledger_end_index + 1, None)
            if item is None:
                break
            req, d, _ = item
            try:
                self._append_batch(req.entries(), req.term, req.leader_id)
            except DLedgerError as exc:  # what was stored before the failing entry stays, as Java's loop leaves it
                if exc.code is ResponseCode.UNEXPECTED_ARGUMENT:
                    self._refuse(d, req, exc)
                else:
                    self._reply(d, req, exc.code)
                    if exc.code in (ResponseCode.DISK_FULL, ResponseCode.DISK_ERROR):
                        # Nothing after the failed push can be stored either: answer the rest now, hold nothing.
                        self._clear_waiting("the store refuses writes", exc.code)
                continue
            last = req.last_entry_index
            self._match(req, last)
            self._adopt_commit(req)
            self._reply_when_durable(d, req, last)
        self._arm_fast_forward()

    # -- fast-forward check ---------------------------------------------------------------
    def _arm_fast_forward(self) -> None:
        if not self._waiting:
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None
            return
        if self._timer is None or not self._timer.active():
            oldest = min(arrived for _, _, arrived in self._waiting.values())
            delay = max(0.0, oldest + self.push_timeout - self.clock.seconds())
            self._timer = self.clock.callLater(delay, self._fast_forward)

    def _fast_forward(self) -> None:
        """Answer the earliest push that has waited too long for a gap, so the leader re-compares."""
        self._timer = None
        first = overdue_push({f: arrived for f, (_, _, arrived) in self._waiting.items()}, self.clock.seconds(),
                             self.push_timeout)
        if first is not None:
            req, d, _ = self._waiting.pop(first)
            log.debug("{id}: push at {first} waited for a gap after {end}: INCONSISTENT_STATE",
                      id=self.state.self_id, first=req.first_entry_index, end=self.store.ledger_end_index)
            self._reply(d, req, ResponseCode.INCONSISTENT_STATE)
        self._arm_fast_forward()

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None
        self._clear_waiting("member stopped")


def _trimmed(req: PushEntryRequest, entries) -> PushEntryRequest:
    """The same push without the entries we already hold."""
    return PushEntryRequest(group=req.group, remote_id=req.remote_id, local_id=req.local_id, code=req.code,
                            leader_id=req.leader_id, term=req.term, commit_index=req.commit_index,
                            type=req.type, batch_entry=list(entries), total_size=req.total_size)
