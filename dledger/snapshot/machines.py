"""``server.snapshots``: feeds the state machines, takes snapshots, restores them (docs/snapshots.md).

Every machine is fed the same batches of committed entries, in log order,
one batch at a time: a batch is handed to each machine in turn (waiting for
a Deferred it returns), and only then does :attr:`StateMachines.applied_index`
move to the batch's last index.  So between two batches every machine has
applied exactly the entries up to ``applied_index``, and that is where a
snapshot is taken: each machine's ``snapshot(writer)`` is called there, all
in one go, before the next batch (each captures its view synchronously in
the call, then writes it out while later batches are applied).

Start-up restores the newest intact snapshot and applies only the entries
after it (:func:`dledger.snapshot.rules.restore_plan`); a damaged snapshot is
passed over with one log line, and a member that cannot rebuild its state
refuses to start with one line naming the fix.  After each snapshot the log
is compacted below ``snapshot index - trailingEntries``
(:func:`dledger.snapshot.rules.compact_limit`) and old snapshots are pruned.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable

from twisted.internet.defer import Deferred, fail, gatherResults, inlineCallbacks, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode
from dledger.diskio import format_bytes
from dledger.entry import without_noops
from dledger.errors import DLedgerError, StoreError
from dledger.interfaces import ICompactingLogStore, IStateMachine
from dledger.messages import SnapshotRequest, SnapshotResponse
from dledger.snapshot import rules
from dledger.snapshot.manifest import NAME_RE, Manifest
from dledger.snapshot.store import SnapshotDamaged, SnapshotError, SnapshotStore

log = Logger()

#: Entries read from the store per batch (and handed to every machine at once).
BATCH = 1000


class StateMachines:
    """The member's state machines (``server.snapshots``): fed in lockstep, snapshotted, restored, installed."""

    def __init__(self, store, snapshot_store: SnapshotStore, clock, *, member_id: str = "?",
                 members: Callable[[], list[str]] | None = None, threshold: int = 0, threshold_bytes: int = 0,
                 trailing: int = 0, peers_take_snapshots: Callable[[], bool] = lambda: True):
        self.store = store
        self.snapshot_store = snapshot_store
        self.clock = clock
        self.member_id = member_id
        self.members = members or (lambda: [])
        #: ``snapshotThreshold`` / ``snapshotThresholdBytes``: a snapshot is taken automatically past either.
        self.threshold = threshold
        self.threshold_bytes = threshold_bytes
        #: ``trailingEntries``: entries kept below a snapshot's index when the log is compacted.
        self.trailing = trailing
        #: Whether every peer can be sent a snapshot (no Java DLedger member): compaction waits otherwise.
        self.peers_take_snapshots = peers_take_snapshots
        #: The member's configuration tracker (``server.membership``; None: static members): a snapshot
        #: records the configuration at its index, compaction and installs move the tracker's base.
        self.membership = None
        self.machines: list = []
        #: Every machine applied the entries up to here (the snapshot or restored index included).
        self.applied_index = -1
        #: Why the feed stopped for good (a machine failed to apply), else None.
        self.halted: str | None = None
        self._next = 0
        self._bytes_since = 0
        self._running = False
        self._busy = False  # a batch is being applied
        self._paused = 0  # a snapshot or install waits for the batch in flight; no new batch starts
        self._idle_waiters: list[Deferred] = []
        self._scheduled = None
        self._taking: list[Deferred] | None = None  # while a snapshot is taken: who else waits for it
        self._waiters: list[tuple[int, int, Deferred]] = []  # (index, seq, deferred), sorted
        self._seq = itertools.count()

    @classmethod
    def for_server(cls, server, peers_take_snapshots: Callable[[], bool] = lambda: True) -> StateMachines:
        """The machines of ``server``, their snapshots in ``<member dir>/snapshot`` (its options from its config)."""
        config = server.config
        snaps = SnapshotStore(config.member_dir / "snapshot", server.blocking_io,
                              reserved=config.max_snapshot_reserved_num, file_size=config.snapshot_file_size)
        return cls(server.store, snaps, server.clock, member_id=server.self_id,
                   members=lambda: [str(p) for p in config.members.values()],
                   threshold=config.snapshot_threshold, threshold_bytes=config.snapshot_threshold_bytes,
                   trailing=config.trailing_entries, peers_take_snapshots=peers_take_snapshots)

    # -- machines ------------------------------------------------------------------------
    def add(self, machine) -> None:
        """Register an :class:`IStateMachine` (before the member starts: it is restored and fed from then on)."""
        if not IStateMachine.providedBy(machine) and not all(
                hasattr(machine, a) for a in ("name", "apply", "snapshot", "restore")):
            raise TypeError(f"{machine!r} is not an IStateMachine (name, apply, snapshot, restore)")
        name = machine.name
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise ValueError(f"state machine name {name!r} must match [a-z0-9_.-]{{1,64}}")
        if any(m.name == name for m in self.machines):
            raise ValueError(f"a state machine named {name!r} is already registered")
        if self._running:
            raise ValueError(f"state machine {name!r} added after the member started (applied index "
                             f"{self.applied_index}): it would miss entries; add machines before start")
        self.machines.append(machine)

    # -- start-up ----------------------------------------------------------------------------
    @inlineCallbacks
    def start(self):
        """Restore the newest intact snapshot (if any machine needs it), then feed the entries after it.

        Fails with :class:`dledger.errors.StoreError` (one line naming the fix) when no intact snapshot
        and the log together hold the whole state.
        """
        store, snaps = self.store, self.snapshot_store
        manifests = yield snaps.load() if self.machines else succeed([])
        statuses: list[tuple[int, bool]] = []
        by_index = {}
        while True:
            for m in manifests:
                if m.index in by_index or any(i == m.index for i, _ok in statuses):
                    continue
                intact = yield snaps.verify(m)
                statuses.append((m.index, intact))
                if intact:
                    by_index[m.index] = m
                    break
            plan = rules.restore_plan(statuses, store.ledger_begin_index, store.ledger_end_index,
                                      bool(self.machines), str(snaps.directory))
            if plan.action is rules.RestoreAction.REFUSE:
                raise StoreError(f"{self.member_id}: {plan.why}")
            if plan.action is rules.RestoreAction.FRESH:
                self._reset_position(-1)
                if plan.skipped:
                    log.warn("{id}: no intact snapshot to restore; applying the whole log from index {b}",
                             id=self.member_id, b=max(store.ledger_begin_index, 0))
                break
            manifest = by_index[plan.index]
            started = self.clock.seconds()
            try:
                yield self._restore_machines(manifest)
            except SnapshotDamaged as exc:
                snaps._report_damaged(manifest.dirname, str(exc))
                statuses = [(i, ok and i != manifest.index) for i, ok in statuses]
                del by_index[manifest.index]
                manifests = [m for m in manifests if m.index != manifest.index]
                continue
            if plan.reset_log:
                store.reset_to_snapshot(manifest.index, manifest.term, manifest.next_pos)
            else:
                self._raise_committed(manifest.index)
            if self.membership is not None:
                self.membership.restored(manifest.config(), manifest.index, manifest.term)
            self._reset_position(manifest.index)
            log.info("{id}: restored snapshot {name} ({n} machine(s), {size}) in {t:.3f}s; applying the "
                     "entries after index {i}", id=self.member_id, name=manifest.dirname, n=len(self.machines),
                     size=format_bytes(manifest.size), t=self.clock.seconds() - started, i=manifest.index)
            break
        self._running = True
        self._update_floor()
        self.advanced()

    def _update_floor(self) -> None:
        """Retention and compaction share one rule: with machines, retention keeps what no snapshot holds yet."""
        if self.machines and hasattr(self.store, "retention_floor"):
            newest = self.snapshot_store.newest()
            self.store.retention_floor = newest.index + 1 if newest is not None else 0

    def _raise_committed(self, index: int) -> None:
        """Entries up to a snapshot's index were committed (they were applied): the store knows it too."""
        store = self.store
        if store.committed_index < index <= store.ledger_end_index:
            state = getattr(store, "member_state", None)
            store.update_committed_index(getattr(state, "curr_term", 0) if state is not None else 0, index)

    def _reset_position(self, index: int) -> None:
        self.applied_index = index
        self._next = index + 1
        self._bytes_since = 0
        self._fire_waiters()

    @inlineCallbacks
    def _restore_machines(self, manifest: Manifest):
        for machine in self.machines:
            if manifest.section(machine.name) is None:
                log.warn("{id}: snapshot {name} has no section {m!r}: that machine starts empty",
                         id=self.member_id, name=manifest.dirname, m=machine.name)
            yield maybeDeferred(machine.restore, self.snapshot_store.open_section(manifest, machine.name))

    def stop(self) -> None:
        self._running = False
        if self._scheduled is not None and self._scheduled.active():
            self._scheduled.cancel()
        self._scheduled = None

    # -- the feed ------------------------------------------------------------------------------
    def advanced(self) -> None:
        """The committed index moved: apply soon, off the caller's stack."""
        if self._scheduled is None and self._running and not self._busy and not self._paused:
            self._scheduled = self.clock.callLater(0, self._feed)

    def caught_up(self) -> bool:
        """Every machine applied every committed entry (what :meth:`dledger.testing.Cluster.wait_applied` waits for)."""
        return not self._busy and self._scheduled is None and self.applied_index >= self.store.committed_index

    def _feed(self) -> None:
        self._scheduled = None
        store = self.store
        if not self.machines:  # nothing to feed: the applied index follows the committed one, no entry read
            if store.committed_index > self.applied_index:
                self.applied_index = store.committed_index
                self._next = self.applied_index + 1
                self._fire_waiters()
            self._release_idle()
            return
        while (self._running and not self._busy and not self._paused and self.halted is None
               and self._next <= store.committed_index):
            if self._next < store.ledger_begin_index:
                if self.machines:
                    self._halt(f"the log starts at index {store.ledger_begin_index} but the state machines have "
                               f"applied only up to {self.applied_index}")
                    return
                self._next = store.ledger_begin_index
            count = min(BATCH, store.committed_index - self._next + 1)
            try:
                entries = store.get_range(self._next, count, 1 << 62)
            except DLedgerError as exc:
                log.error("{id}: state machines cannot read index {i}: {exc}", id=self.member_id, i=self._next,
                          exc=exc)
                return
            last = entries[-1].index
            size = sum(e.size for e in entries)
            visible = without_noops(entries)
            self._next = last + 1
            if not visible:
                self._applied(last, size)
                continue
            self._busy = True
            d = self._apply_all(visible)
            if d.called:
                d.addCallbacks(self._batch_done, self._batch_failed, (last, size), None, (visible,))
                continue
            d.addCallbacks(self._batch_done, self._batch_failed, (last, size), None, (visible,))
            return
        self._release_idle()

    def _apply_all(self, entries: list) -> Deferred:
        """Hand ``entries`` to each machine in turn, the next once the previous one's Deferred fired."""
        d = succeed(None)
        for machine in self.machines:
            d.addCallback(lambda _, m=machine: maybeDeferred(m.apply, entries))
        return d

    def _batch_done(self, _result, last: int, size: int) -> None:
        self._busy = False
        self._applied(last, size)
        if not self._scheduled:
            self.advanced()
        self._release_idle()

    def _batch_failed(self, failure: Failure, entries: list) -> None:
        self._busy = False
        self._halt(f"a state machine failed to apply entries {entries[0].index}..{entries[-1].index}: "
                   f"{failure.getErrorMessage()}")
        log.failure("{id}: state machine apply failed", failure, id=self.member_id)
        self._release_idle()

    def _halt(self, why: str) -> None:
        self.halted = why
        log.error("{id}: state machines stopped: {why}; restart the member once the cause is fixed",
                  id=self.member_id, why=why)

    def _applied(self, last: int, size: int) -> None:
        self.applied_index = last
        self._bytes_since += size
        self._fire_waiters()
        if self.machines and self._taking is None and rules.snapshot_due(
                last, self._last_snapshot_index(), self._bytes_since, self.threshold, self.threshold_bytes):
            self.take().addErrback(lambda f: None)  # take() logs its own failure

    def _last_snapshot_index(self) -> int:
        newest = self.snapshot_store.newest()
        return newest.index if newest is not None else -1

    # -- waiting -------------------------------------------------------------------------------
    def wait_applied(self, index: int) -> Deferred:
        """A Deferred that fires (with the applied index) once every machine applied ``index``."""
        if self.applied_index >= index:
            return succeed(self.applied_index)
        d: Deferred = Deferred()
        bisect.insort(self._waiters, (index, next(self._seq), d))
        return d

    def _fire_waiters(self) -> None:
        while self._waiters and self._waiters[0][0] <= self.applied_index:
            _i, _s, d = self._waiters.pop(0)
            d.callback(self.applied_index)

    def _pause(self) -> Deferred:
        """Stop starting batches; fires once no batch is in flight (the machines are at ``applied_index``)."""
        self._paused += 1
        if not self._busy:
            return succeed(None)
        d: Deferred = Deferred()
        self._idle_waiters.append(d)
        return d

    def _resume(self) -> None:
        self._paused -= 1
        self.advanced()

    def _release_idle(self) -> None:
        if not self._busy:
            waiters, self._idle_waiters = self._idle_waiters, []
            for d in waiters:
                d.callback(None)

    # -- snapshots -------------------------------------------------------------------------------
    def handle_request(self, request: SnapshotRequest) -> Deferred:
        """``dledger snapshot`` (admin role): take one now; a refusal carries its one-line reason."""

        def taken(manifest):
            return request.base_reply(SnapshotResponse, index=manifest.index, snapshot_term=manifest.term,
                                      snapshot_bytes=manifest.size, ledger_begin_index=self.store.ledger_begin_index)

        def refused(failure):
            failure.trap(SnapshotError)
            code = ResponseCode.UNSUPPORTED if not self.machines else ResponseCode.INTERNAL_ERROR
            return request.base_reply(SnapshotResponse, code, error=failure.getErrorMessage()[:500])

        return self.take().addCallbacks(taken, refused)

    def take(self) -> Deferred:
        """Snapshot every machine at the applied index (Deferred of the :class:`Manifest`); then compact and prune.

        One at a time: a call while one is being taken gets that one's result.  If nothing was
        applied since the newest snapshot, that snapshot is the answer.
        """
        if not self.machines:
            return fail(SnapshotError(f"{self.member_id}: no state machine is registered on this member: "
                                      f"nothing to snapshot"))
        if self.halted is not None:
            return fail(SnapshotError(f"{self.member_id}: state machines stopped ({self.halted})"))
        if self._taking is not None:
            d: Deferred = Deferred()
            self._taking.append(d)
            return d
        waiters: list[Deferred] = []
        self._taking = waiters

        def done(result):
            self._taking = None
            for w in waiters:
                w.callback(result) if not isinstance(result, Failure) else w.errback(result)
            return result

        return self._take().addBoth(done)

    @inlineCallbacks
    def _take(self):
        yield self._pause()
        try:
            index = self.applied_index
            newest = self.snapshot_store.newest()
            if index < 0:
                raise SnapshotError(f"{self.member_id}: nothing applied yet: nothing to snapshot")
            if newest is not None and newest.index >= index:
                return newest
            term, next_pos = self._point(index)
            builder = self.snapshot_store.create(index, term, next_pos, *self._members_at(index))
            started = self.clock.seconds()
            writes = [maybeDeferred(m.snapshot, builder.section(m.name)) for m in self.machines]
            self._bytes_since = 0
        finally:
            self._resume()  # every machine captured its view inside snapshot(): applies continue
        try:
            yield gatherResults(writes, consumeErrors=True)
            manifest = yield builder.finish()
        except Exception as exc:
            builder.abort()
            why = getattr(exc, "subFailure", None)
            why = why.getErrorMessage() if why is not None else str(exc)
            log.error("{id}: snapshot at index {i} failed: {why}", id=self.member_id, i=index, why=why)
            raise SnapshotError(f"{self.member_id}: snapshot at index {index} failed: {why}") from None
        self._update_floor()
        begin = self.compact(manifest.index)
        pruned = yield self.snapshot_store.prune()
        log.info("{id}: snapshot {name} taken ({n} section(s), {size}, {t:.3f}s); log begins at {b}{p}",
                 id=self.member_id, name=manifest.dirname, n=len(manifest.sections), size=format_bytes(manifest.size),
                 t=self.clock.seconds() - started, b=begin, p=f"; pruned {', '.join(pruned)}" if pruned else "")
        return manifest

    def _members_at(self, index: int) -> tuple[list[str], dict | None]:
        """A manifest's ``members`` ("id-host:port") and ``configuration`` (with roles) at ``index``."""
        if self.membership is None:
            return self.members(), None
        config = self.membership.at(index)
        return [f"{m.id}-{m.address}" for m in config.members], config.to_json()

    def _point(self, index: int) -> tuple[int, int]:
        """``(term, next_pos)`` of entry ``index``: where a store reset to a snapshot there writes the next one."""
        try:
            entry = self.store.get(index)
        except DLedgerError as exc:
            raise SnapshotError(f"{self.member_id}: cannot read entry {index} to snapshot at it: {exc}") from None
        return entry.term, entry.pos + entry.size

    def compact(self, snapshot_index: int) -> int:
        """Compact the log after a snapshot at ``snapshot_index`` as the rule allows; returns the begin index."""
        store = self.store
        if not ICompactingLogStore.providedBy(store):
            return store.ledger_begin_index
        limit = rules.compact_limit(snapshot_index, self.trailing, store.committed_index,
                                    bool(self.peers_take_snapshots()))
        if limit is None:
            return store.ledger_begin_index
        begin = store.compact(limit)
        if self.membership is not None:
            self.membership.compacted(begin)
        return begin

    @inlineCallbacks
    def install(self, manifest: Manifest):
        """Make a received snapshot the state: restore every machine, reset the log to it (after ``receiver.finish()``).

        Applied and committed index are ``manifest.index`` afterwards; the leader's next PUSH starts at
        ``manifest.index + 1``.
        """
        yield self._pause()
        try:
            yield self._restore_machines(manifest)
            self.store.reset_to_snapshot(manifest.index, manifest.term, manifest.next_pos)
            if self.membership is not None:
                self.membership.installed(manifest.config(), manifest.index, manifest.term)
            self._reset_position(manifest.index)
            self._update_floor()
            log.info("{id}: installed snapshot {name} ({size}); the log continues at index {n}",
                     id=self.member_id, name=manifest.dirname, size=format_bytes(manifest.size),
                     n=manifest.index + 1)
        finally:
            self._resume()
        pruned = yield self.snapshot_store.prune()
        return pruned
