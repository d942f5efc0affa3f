"""The leader's side of replication: one dispatcher per follower and the quorum ack check (SPEC §4).

A :class:`LeaderReplicator` lives for one leadership (an *epoch*: a term,
or a second leadership of the same member in the same term).  It appends a
NOOP first so the commit index can move at once, runs an
:class:`EntryDispatcher` per follower, and advances the committed index to
the majority watermark -- only to an entry of its own term.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.codes import EntryType, PushType, ResponseCode
from dledger.config import push_budget
from dledger.entry import Entry, EntryList, encoded_size
from dledger.errors import DLedgerError
from dledger.messages import PushEntryRequest
from dledger.ratelog import RateLimitedLog, RateLimiter
from dledger.replication import peerdisk, snapshot_rules
from dledger.replication.install_step import InstallStep
from dledger.replication.progress import Progress
from dledger.replication.rules import (
    Step,
    after_compare,
    first_compare_index,
    leader_commit_index,
    truncate_reason,
    voters_commit_index,
)
from dledger.stats import lag_entries
from dledger.store.base import read_range
from dledger.store.recent import RecentEntries
from dledger.transport.outbox import send_written

log = Logger()


def _encoded_size(batch: Sequence[Entry]) -> int:
    """Bytes of a push's entries; an EntryList (the leader's pushes) answers without a property call per entry."""
    return batch.encoded_size() if type(batch) is EntryList else encoded_size(batch)


#: A follower more than this many entries behind the leader gets an info line (and another when it has
#: caught up); see "What it logs" in docs/operations.md.
BEHIND_LOG_ENTRIES = 1000
#: While a follower does not answer, the leader repeats one summary line per this many seconds.
DOWN_SUMMARY_INTERVAL = 60.0


class EntryDispatcher(InstallStep, Progress):
    """Brings one follower's log in line with the leader's: COMPARE -> TRUNCATE -> APPEND.

    The state and its transitions are :class:`~dledger.replication.progress.Progress`; this class reads
    the leader's store, sends, and arms the retry timer.
    """

    def __init__(self, leader: LeaderReplicator, peer: str):
        super().__init__()
        self.leader = leader
        self.peer = peer
        self._retry = None
        self.down_since: float | None = None  # when the follower stopped answering (None: it answers)
        self.last_contact: float | None = None  # when it last answered (the status page shows it)
        self.failures = 0  # requests that failed since then
        self.behind = False  # an info line said it is more than BEHIND_LOG_ENTRIES behind
        #: "disk full" / "disk error" while the follower refuses our entries for that (issue 21), else None.
        self.disk_problem: str | None = None
        #: The snapshot transfer while in step INSTALL (:mod:`dledger.replication.snapshot_send`).
        self.sending = None  # a SnapshotSend

    def _shrunk(self, resp) -> bool:
        """Believe what the follower says it holds when that is less than its watermark (True if so).

        A follower's log can shrink behind the leader's back only by losing its store (wiped, or cut by
        recovery); its watermark must then come down, or the leader would think it in sync for good and
        report no lag (issue #9: an emptied follower answered COMMIT with SUCCESS and was never refilled).
        Only the entry handler's own answers (SUCCESS, INCONSISTENT_STATE) carry its ledger range.
        """
        if resp.response_code not in (ResponseCode.SUCCESS, ResponseCode.INCONSISTENT_STATE):
            return False
        mark = self.watermark
        if self.shrunk_to(resp.end_index):
            log.warn("{leader}: {peer} holds entries only up to {end} but had acknowledged {mark} "
                     "(store wiped or recovered?): repairing it", leader=self.leader.self_id, peer=self.peer,
                     end=resp.end_index, mark=mark)
            return True
        return False

    def _lost_contact(self, why: object) -> None:
        """A request failed: one line when the follower stops answering, then only the periodic summary."""
        self.in_contact = False
        lead = self.leader
        if self.down_since is None:
            self.down_since = lead.clock.seconds()
            self.failures = 1
            lead.follower_log.warn(("down", self.peer), "{id}: follower {peer} does not answer: {why}",
                                   id=lead.self_id, peer=self.peer, why=why)
            lead.down_summaries.check(self.peer)  # the summary starts one interval from now
        else:
            self.failures += 1

    def _answering(self) -> None:
        self.in_contact = True
        self.last_contact = self.leader.clock.seconds()
        if self.down_since is not None:
            lead = self.leader
            lead.down_summaries.forget(self.peer)
            lead.follower_log.info(("up", self.peer), "{id}: follower {peer} answers again after {secs:.1f}s "
                                   "({n} failed requests)", id=lead.self_id, peer=self.peer,
                                   secs=lead.clock.seconds() - self.down_since, n=self.failures)
            self.down_since = None
            self.failures = 0

    def report(self) -> None:
        """Once per heartbeat: the periodic summary while down, and the fell-behind / caught-up lines."""
        lead = self.leader
        store = lead.store
        lag = lag_entries(store.ledger_begin_index, store.ledger_end_index, self.known_index())
        if self.down_since is not None and lead.down_summaries.check(self.peer) is not None:
            log.warn("{id}: follower {peer} still does not answer after {secs:.0f}s ({n} failed requests); "
                     "its lag is {lag} entries", id=lead.self_id, peer=self.peer,
                     secs=lead.clock.seconds() - self.down_since, n=self.failures, lag=lag)
        if not self.behind and lag > lead.behind_log_entries:
            self.behind = True
            log.info("{id}: follower {peer} is {lag} entries behind (leader end {end}, follower known to hold up "
                     "to {known})", id=lead.self_id, peer=self.peer, lag=lag, end=store.ledger_end_index,
                     known=self.known_index())
        elif self.behind and lag == 0:
            self.behind = False
            log.info("{id}: follower {peer} has caught up (index {end})", id=lead.self_id, peer=self.peer,
                     end=store.ledger_end_index)

    # -- state ---------------------------------------------------------------------------
    def _retry_later(self, why: str) -> None:
        """Something failed: compare again after a short pause (never a tight loop; a heartbeat for a disk problem)."""
        self.become(Step.COMPARE, -1)
        if self._retry is None and not self.stopped:
            log.debug("{peer}: retrying in COMPARE: {why}", peer=self.peer, why=why)
            lead = self.leader
            delay = peerdisk.retry_after(self.disk_problem, lead.retry_delay, lead.heartbeat)
            self._retry = lead.clock.callLater(delay, self._retry_now)

    def _disk_answer(self, code: ResponseCode, first: int, last: int) -> bool:
        """The follower's answer says its disk refuses writes: say so (once, then once a minute); True if it did."""
        problem = peerdisk.peer_disk_problem(code)
        if problem is None:
            return False
        lead = self.leader
        self.disk_problem = problem
        lead.disk_log.error(("disk", self.peer), "{id}: follower {peer} cannot store entries {first}..{last}: "
                            "{problem} ({code}); its own log names the store directory and free space. "
                            "Retrying every heartbeat", id=lead.self_id, peer=self.peer, first=first, last=last,
                            problem=problem, code=code.name)
        return True

    def _stores_again(self) -> None:
        lead = self.leader
        was, self.disk_problem = self.disk_problem, None
        lead.disk_log.limiter.forget(("disk", self.peer))
        log.info("{id}: follower {peer} stores entries again (was: {was})", id=lead.self_id, peer=self.peer,
                 was=was)

    def _retry_now(self) -> None:
        self._retry = None
        self.pump()

    def become(self, step: Step, index: int) -> None:
        if self.sending is not None and step is not Step.INSTALL:
            self.sending.stop()
            self.sending = None
        super().become(step, index)

    def stop(self) -> None:
        super().stop()
        if self.sending is not None:
            self.sending.stop()
            self.sending = None
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None

    # -- reading the leader's log -------------------------------------------------------------
    def _read(self, index: int) -> Entry | None:
        """Entry ``index`` from the leader's store, or None after reporting it unreadable (see _unreadable)."""
        try:
            return self.leader.store.get(index)
        except DLedgerError as exc:
            self._read_failed(index, exc)
            return None

    def _read_range(self, begin: int) -> list[Entry]:
        """A batch from ``begin``; if an entry in it is unreadable, the readable entries before it.

        The follower then gets everything up to the damaged entry, and the next push starts at that
        entry, whose read failure is reported (``_unreadable``) with its exact index.  (Only this rare
        path probes entries one by one; the batch itself is cut by ``base.read_range``, like any read.)
        """
        lead = self.leader
        store = lead.store
        try:
            return store.get_range(begin, lead.max_batch_entries, lead.max_batch_bytes)
        except DLedgerError as exc:
            for index in range(begin, min(store.ledger_end_index, begin + lead.max_batch_entries - 1) + 1):
                try:
                    store.get(index)
                except DLedgerError as bad:
                    if index == begin:
                        self._read_failed(index, bad)
                        return []
                    return read_range(store.get, begin, index - 1, lead.max_batch_entries, lead.max_batch_bytes)
            self._read_failed(begin, exc)
            return []

    def _read_failed(self, index: int, exc: DLedgerError) -> None:
        if exc.code is ResponseCode.DISK_ERROR:
            self._unreadable(index, exc)
        else:  # not damage (e.g. the range moved under us): compare again, as after any failure
            self._retry_later(f"reading entry {index} failed: {exc}")

    def _unreadable(self, index: int, exc: DLedgerError) -> None:
        """The leader cannot read an entry this follower needs: report it, and try again a heartbeat later.

        Retrying at once would spin; the leader (LeaderReplicator.entry_unreadable) logs it and decides
        whether to hand leadership to a member that holds the entry.
        """
        self.become(Step.COMPARE, -1)
        self.leader.entry_unreadable(self.peer, index, exc)
        if self._retry is None and not self.stopped:
            self._retry = self.leader.clock.callLater(self.leader.heartbeat, self._retry_now)

    # -- sending ---------------------------------------------------------------------------
    def _push(self, type_: PushType, *, entry=None, batch=None) -> PushEntryRequest:
        lead = self.leader
        return PushEntryRequest(group=lead.group, remote_id=self.peer, local_id=lead.self_id,
                                leader_id=lead.self_id, term=lead.term, commit_index=lead.store.committed_index,
                                type=type_, entry=entry, batch_entry=batch or [],
                                total_size=_encoded_size(batch) if batch else 0)

    def _send(self, req: PushEntryRequest, on_reply: Callable, on_fail: Callable) -> None:
        gen = self.gen
        d = self.leader.transport.send(self.peer, req, timeout=self.leader.push_timeout)

        def reply(resp):
            if self.accepts(gen):
                self._answering()
                on_reply(resp)

        def failed(f):
            if self.accepts(gen):
                self._lost_contact(f.value)
                on_fail(f.value)

        d.addCallbacks(reply, failed)

    def pump(self) -> None:
        """Send whatever the current state calls for."""
        if self.stopped or self._retry is not None:
            return
        store = self.leader.store
        if self.step is Step.COMPARE:
            if self.outstanding or store.ledger_end_index < 0:
                return
            self.compare_index = first_compare_index(self.compare_index, store.ledger_begin_index,
                                                     store.ledger_end_index)
            entry = self._read(self.compare_index)
            if entry is None:
                return
            self.outstanding = True
            self._send(self._push(PushType.COMPARE, entry=entry),
                       self._on_compare, lambda exc: self._retry_later(f"COMPARE failed: {exc}"))
        elif self.step is Step.APPEND:
            self._pump_append()

    def _pump_append(self) -> None:
        lead = self.leader
        store = lead.store
        end = store.ledger_end_index
        while self.may_append(end, peerdisk.in_flight_limit(self.disk_problem, lead.max_in_flight),
                              lead.max_in_flight_bytes):
            if self.write_index < store.ledger_begin_index:
                self.become(Step.COMPARE, -1)
                self.pump()
                return
            if lead.batch_push:
                batch = lead.recent.get_range(self.write_index, lead.max_batch_entries, lead.max_batch_bytes) \
                    or self._read_range(self.write_index)
                if not batch:
                    return
                req = self._push(PushType.APPEND, batch=batch)
                first, last = batch[0].index, batch[-1].index
                nbytes = _encoded_size(batch)
            else:
                entry = self._read(self.write_index)
                if entry is None:
                    return
                req = self._push(PushType.APPEND, entry=entry)
                first = last = entry.index
                nbytes = entry.size
            self.sent_append(first, last, nbytes)
            on_reply = lambda resp, f=first, la=last: self._on_append(resp, f, la)
            if lead.stats is not None:
                entries = batch if lead.batch_push else [entry]
                on_reply = lead.stats.timed_push(self.peer, len(entries), req.total_size or entries[0].size, on_reply)
            self._send(req, on_reply, lambda exc: self._retry_later(f"APPEND failed: {exc}"))
        if self.needs_commit(store.committed_index):
            self.send_commit()

    def send_commit(self) -> None:
        """Tell an idle follower the committed index (also sent once per heartbeat interval)."""
        if self.stopped or self.step is not Step.APPEND or not self.idle():
            return
        self.outstanding = True
        self.told_commit = self.leader.store.committed_index
        self._send(self._push(PushType.COMMIT), self._on_commit_reply, self._on_commit_fail)

    # -- replies ------------------------------------------------------------------------------
    def _on_compare(self, resp) -> None:
        self.outstanding = False
        store = self.leader.store
        code = resp.response_code
        if code not in (ResponseCode.SUCCESS, ResponseCode.INCONSISTENT_STATE):
            self._retry_later(f"COMPARE answered {code.name}")
            return
        self._shrunk(resp)
        nxt = after_compare(self.compare_index, code is ResponseCode.SUCCESS, resp.begin_index, resp.end_index,
                            store.ledger_begin_index, store.ledger_end_index)
        if self._snapshot_instead(nxt, code is ResponseCode.SUCCESS, resp.end_index):
            return
        if nxt.step is Step.APPEND:
            self.matched(nxt.index - 1)
            self.become(Step.APPEND, nxt.index)
            self.leader.watermark_changed(self)
        elif nxt.step is Step.TRUNCATE:
            self._truncate(nxt.index, resp.end_index)
            return
        else:
            self.become(Step.COMPARE, nxt.index)
        self.pump()

    def _truncate(self, index: int, follower_end: int | None = None) -> None:
        entry = self._read(index)
        if entry is None:
            return
        self.become(Step.TRUNCATE, index)
        self.outstanding = True
        log.info("{leader}: {peer}: " + truncate_reason(follower_end), leader=self.leader.self_id, peer=self.peer,
                 index=index)
        self._send(self._push(PushType.TRUNCATE, entry=entry),
                   lambda resp: self._on_truncate(resp, index),
                   lambda exc: self._retry_later(f"TRUNCATE failed: {exc}"))

    def _on_truncate(self, resp, index: int) -> None:
        self.outstanding = False
        if resp.response_code is ResponseCode.UNEXPECTED_ARGUMENT:
            self._refused(index, index)
        self._disk_answer(resp.response_code, index, index)
        if resp.response_code is not ResponseCode.SUCCESS:
            self._retry_later(f"TRUNCATE answered {resp.response_code.name}")
            return
        if self.disk_problem is not None:
            self._stores_again()
        self.truncated(index)
        self.leader.watermark_changed(self)
        self.pump()

    def _on_append(self, resp, first: int, last: int) -> None:
        code = resp.response_code
        if code is ResponseCode.SUCCESS:
            if self.disk_problem is not None:
                self._stores_again()
            if self.append_acked(first, last):
                self.leader.watermark_changed(self)
            self.pump()
        elif code is ResponseCode.REPEATED_PUSH:
            # Another copy of this push waits on the follower; its answer may have been the one we lost.
            gen = self.gen
            self.leader.clock.callLater(self.leader.push_timeout, self._check_repeated, gen, first, last)
        else:
            if code is ResponseCode.UNEXPECTED_ARGUMENT:
                self._refused(first, last)
            self._disk_answer(code, first, last)
            self._retry_later(f"APPEND {first}-{last} answered {code.name}")

    def _refused(self, first: int, last: int) -> None:
        """The follower refuses our entries outright (411): never only a debug line, as a stall would be silent."""
        lead = self.leader
        lead.follower_log.warn(("refused", self.peer), "{id}: follower {peer} refuses entries {first}..{last} "
                               "(UNEXPECTED_ARGUMENT); its log and the reply's remark say why", id=lead.self_id,
                               peer=self.peer, first=first, last=last)

    def _check_repeated(self, gen: int, first: int, last: int) -> None:
        settled = self.repeated_settled(first, last) if self.accepts(gen) else None
        if settled is None:
            return
        if settled:
            self.settled(first)
            self.pump()
        else:
            self._retry_later(f"APPEND {first}-{last} still unanswered after REPEATED_PUSH")

    def _on_commit_reply(self, resp) -> None:
        self.outstanding = False
        shrunk = self._shrunk(resp)
        if resp.response_code is ResponseCode.SUCCESS and not shrunk:
            self.pump()
        else:
            # The follower lacks entries we thought it held (or cannot vouch for them): compare again.
            self._retry_later(f"COMMIT answered {resp.response_code.name} (follower end {resp.end_index})")

    def _on_commit_fail(self, exc) -> None:
        self.commit_lost()


class LeaderReplicator:
    """One leadership: NOOP, dispatchers, watermarks and the committed index.

    Its collaborators are given explicitly (as etcd/raft's and hashicorp/raft's replication get theirs),
    not reached through the server: the member's ``store``, ``transport``, ``clock`` and ``flusher``
    (the leader's own durability), ``stats`` (None: nothing recorded; the server sets it when stats are
    enabled later), and two callbacks: ``on_committed()`` when the committed index moved and
    ``on_store_damaged(index, exc)`` when an entry of this member's log cannot be read.
    ``append_as_leader(entry)`` appends the term's NOOP: the member's checked write
    (:meth:`dledger.store.guard.LogGuard.append_as_leader`); the store's own method by default.
    """

    def __init__(self, term: int, *, config, self_id: str, members: Sequence[str], store, transport, clock,
                 flusher, on_committed: Callable[[], None], on_store_damaged: Callable[[int, Exception], None],
                 stats=None, append_as_leader: Callable[[Entry], Entry] | None = None,
                 snapshot_store=None, peer_kinds=None, configuration=None, noop_body=None):
        cfg = config
        #: ``callable() -> bytes``: the term-start NOOP's body (None: empty; ``server.noop_body``).
        self.noop_body = noop_body
        self.self_id = self_id
        self.group = cfg.group
        self.term = term
        self.store = store
        self.append_as_leader = append_as_leader or store.append_as_leader
        self.transport = transport
        self.clock = clock
        self.flusher = flusher
        self.stats = stats
        self.on_committed = on_committed
        self.on_store_damaged = on_store_damaged
        self.fast_advance = cfg.enable_fast_advance_commit_index
        self.members = len(members)
        self.push_timeout = cfg.max_push_time_out_ms / 1000.0
        self.retry_delay = min(self.push_timeout, 0.05)
        self.heartbeat = cfg.heart_beat_time_interval_ms / 1000.0
        self.batch_push = cfg.enable_batch_push
        self.max_batch_bytes = push_budget(cfg.max_batch_push_size, cfg.max_frame_size)
        self.max_batch_entries = 10_000
        self.max_in_flight = cfg.max_pending_size
        #: Bytes of APPENDs in flight to one follower (:meth:`Progress.may_append`): a few full pushes, enough
        #: to keep a loopback or LAN link busy, never a reactor turn that reads a whole backlog.
        #: ``maxInFlightFullPushes`` full pushes (``maxBatchPushSize``): 4 MiB at the defaults, more than a LAN's
        #: bandwidth-delay product. Each push in flight is held two or three times on the leader (entries read
        #: back, the encoded frame, the transport's buffer): 16 made a leader catching up one follower peak at
        #: 181-187 MB RSS, 4 at 136 MB with the same batched throughput (issue #28 target 4, docs/benchmarks.md).
        self.max_in_flight_bytes = cfg.max_in_flight_full_pushes * self.max_batch_bytes
        #: The member's snapshots (``server.snapshots.store``; None: no snapshots, never InstallSnapshot).
        self.snapshot_store = snapshot_store
        #: What each peer is (:class:`dledger.replication.peerkind.PeerKinds`; None: every peer is dledger).
        self.peer_kinds = peer_kinds
        self.snapshot_chunk_size = getattr(cfg, "snapshot_chunk_size", snapshot_rules.DEFAULT_CHUNK_SIZE)
        self.snapshot_window = snapshot_rules.DEFAULT_WINDOW
        self.dispatchers = {peer: EntryDispatcher(self, peer) for peer in members if peer != self_id}
        #: The configuration in force (issue #23; None: every member of ``members`` votes, as before).
        self.configuration = configuration
        self._voters = frozenset(configuration.voters) if configuration is not None else frozenset()
        #: Dispatchers of members the configuration no longer holds, kept until they hold its entry (so a
        #: removed member learns it was removed) or stop answering.
        self.leaving: dict[str, EntryDispatcher] = {}
        self.term_start_index = -1
        # The newest entries for the pushes: the store's own when it keeps them (it also sees truncations),
        # else a copy made here of what this leader appends.
        shared = getattr(store, "recent_entries", None)
        self.recent = shared if isinstance(shared, RecentEntries) else RecentEntries()
        #: True when :attr:`recent` is this leader's own copy, which it extends after each append.
        self.keeps_recent = self.recent is not shared
        self.damage_log = RateLimitedLog(log, self.clock, interval=60.0)
        self.follower_log = RateLimitedLog(log, self.clock, interval=10.0)  # a flapping follower: one line per 10 s
        self.disk_log = RateLimitedLog(log, self.clock, interval=60.0)  # a follower's full disk: one line a minute
        self.java_log = RateLimitedLog(log, self.clock, interval=60.0)  # a Java follower behind our first index
        self.down_summaries = RateLimiter(self.clock, DOWN_SUMMARY_INTERVAL)
        self.behind_log_entries = BEHIND_LOG_ENTRIES
        self._durable_wanted = -1  # highest index whose durability was asked for
        self._durable_waiting = False
        self._waiters: list[tuple[str, int, Deferred]] = []
        self._pump_scheduled = None
        self._commit_timer = None
        self.stopped = False

    def start(self) -> None:
        store = self.store
        if self.fast_advance:
            try:
                body = self.noop_body() if self.noop_body is not None else b""
                noop = self.append_as_leader(Entry(body=body, term=self.term, magic=EntryType.NOOP))
                if self.keeps_recent:
                    self.recent.add(noop)
                self.term_start_index = noop.index
                self.entries_appended(noop.index)
            except DLedgerError as exc:
                log.error("{id}: could not append the NOOP of term {term}: {exc}", id=self.self_id,
                          term=self.term, exc=exc)
                self.term_start_index = store.ledger_end_index + 1
        else:
            self.term_start_index = store.ledger_end_index + 1
        self._commit_timer = self.clock.callLater(self.heartbeat, self._periodic_commit)
        for d in self.dispatchers.values():
            d.pump()
        self.check_commit()

    def configuration_changed(self, config) -> None:
        """The configuration in force changed: a dispatcher for each new member; the leaving ones wind down."""
        self.configuration = config
        self._voters = frozenset(config.voters)
        if self.stopped:
            return
        for peer in config.ids:
            if peer != self.self_id and peer not in self.dispatchers:
                d = self.leaving.pop(peer, None) or EntryDispatcher(self, peer)
                self.dispatchers[peer] = d
                d.pump()
        for peer in [p for p in self.dispatchers if p not in config.ids]:
            self.leaving[peer] = self.dispatchers.pop(peer)
        self._release_leaving()
        self.check_commit()

    def _release_leaving(self) -> None:
        """Stop replicating to a removed member once it holds its removal (or does not answer)."""
        config = self.configuration
        for peer, d in list(self.leaving.items()):
            holds = config is None or (d.watermark >= config.index and self.store.committed_index >= config.index)
            if holds or (d.down_since is not None and d.failures > 3):
                if holds and d.step is Step.APPEND and not d.in_flight and not d.stopped:
                    d.send_commit()  # it learns its removal is committed, and stops serving
                d.stop()
                del self.leaving[peer]

    def stop(self) -> None:
        self.stopped = True
        for d in list(self.dispatchers.values()) + list(self.leaving.values()):
            d.stop()
        for call in (self._pump_scheduled, self._commit_timer):
            if call is not None and call.active():
                call.cancel()
        self._pump_scheduled = self._commit_timer = None
        waiters, self._waiters = self._waiters, []
        for _, _, d in waiters:
            d.errback(DLedgerError(ResponseCode.TERM_CHANGED, "leadership lost"))

    # -- appends --------------------------------------------------------------------------
    def entries_appended(self, last_index: int) -> None:
        """New entries are in the leader's store: make them durable and push them.

        An idle follower gets them at once; followers with pushes in flight get them with the turn's pump
        (``schedule_pump``), so appends made while pushes run are batched per reactor turn.

        One durability wait at a time: when it fires, a new one covers whatever was appended meanwhile,
        so a burst of appends costs one Deferred per flush round, not one per append.
        """
        if last_index > self._durable_wanted:
            self._durable_wanted = last_index
            if not self._durable_waiting:
                self._wait_durable()
        self.schedule_pump()

    def schedule_pump(self) -> None:
        """Let every dispatcher send what it can, once per reactor turn (so appends of one turn share a push)."""
        if self._pump_scheduled is None and not self.stopped:
            self._pump_scheduled = self.clock.callLater(0, self._pump_all)

    def _wait_durable(self) -> None:
        self._durable_waiting = True
        self.flusher.wait(self._durable_wanted).addCallbacks(self._self_durable, self._durable_failed)

    def _pump_all(self) -> None:
        self._pump_scheduled = None
        for d in self.dispatchers.values():
            d.pump()
        for d in self.leaving.values():
            d.pump()
        # The pushes leave now, not after the next poll and the follower replies it finds on their connections.
        send_written()

    def _self_durable(self, _index) -> None:
        self._durable_waiting = False
        if self.stopped:
            return
        if self.flusher.sync and self._durable_wanted > self.store.flushed_index:
            self._wait_durable()
        self.check_commit()

    def _durable_failed(self, _failure) -> None:
        # The flusher logged it; ask again with the next append (or commit-index move).
        self._durable_waiting = False
        self._durable_wanted = self.store.flushed_index

    def _periodic_commit(self) -> None:
        self._commit_timer = None
        if self.stopped:
            return
        if self.leaving:
            self._release_leaving()
        for d in list(self.dispatchers.values()) + list(self.leaving.values()):
            if d.step is Step.APPEND and not d.in_flight:
                d.send_commit()
            elif d.step is Step.COMPARE:
                d.pump()
            d.report()
        self._commit_timer = self.clock.callLater(self.heartbeat, self._periodic_commit)

    # -- quorum -------------------------------------------------------------------------------
    def watermarks(self) -> list[int]:
        own = self.store.flushed_index if self.flusher.sync else self.store.ledger_end_index
        return [own] + [d.watermark for d in self.dispatchers.values()]

    def watermark_changed(self, dispatcher: EntryDispatcher) -> None:
        if dispatcher.peer in self.leaving:
            self._release_leaving()
            return
        self.check_commit()
        if self._waiters:
            ready = [w for w in self._waiters if w[0] == dispatcher.peer and dispatcher.watermark >= w[1]]
            for w in ready:
                self._waiters.remove(w)
                w[2].callback(dispatcher.watermark)

    def check_commit(self) -> None:
        if self.stopped:
            return
        store = self.store
        current = store.committed_index
        config = self.configuration
        if config is None:
            own, *peers = self.watermarks()
            target = leader_commit_index(current, own, peers, self.members, self.term_start_index)
        elif self.self_id in self._voters:  # the leader counts itself: the usual rule over the voters
            own = self.store.flushed_index if self.flusher.sync else self.store.ledger_end_index
            voters = self._voters
            peers = [d.watermark for peer, d in self.dispatchers.items() if peer in voters]
            target = leader_commit_index(current, own, peers, len(voters), self.term_start_index)
        else:  # removing itself: it leads without counting itself until that change commits
            own = self.store.flushed_index if self.flusher.sync else self.store.ledger_end_index
            marks = {peer: d.watermark for peer, d in self.dispatchers.items()}
            target = voters_commit_index(current, own, self.self_id, marks, config, self.term_start_index)
        if target > current:
            store.update_committed_index(self.term, target)
            if store.committed_index > current:
                self.on_committed()

    def peer_watermark(self, peer: str) -> int:
        d = self.dispatchers.get(peer)
        return d.watermark if d is not None else -1

    def live_peers(self, within: float) -> frozenset[str]:
        """Members that answered this leader within the last ``within`` seconds (a change's quorum check)."""
        now = self.clock.seconds()
        return frozenset(p for p, d in self.dispatchers.items()
                         if d.last_contact is not None and now - d.last_contact <= within)

    def entry_unreadable(self, peer: str, index: int, exc: DLedgerError) -> None:
        """An entry a follower needs cannot be read from this member's store (e.g. its body CRC fails).

        Logged as an error (once per index and interval, with the store's file and offset), then handed
        to ``on_store_damaged`` (the server's), which marks the store damaged (no more standing for election) and moves
        leadership to a member holding the entry (:func:`dledger.election.transfer.damaged_leader_action`).
        """
        self.damage_log.error(("unreadable", index), "{id}: cannot read entry {index} to replicate it to {peer}: "
                              "{why}; this member's store is damaged (see 'store damaged' in operations.md)",
                              id=self.self_id, index=index, peer=peer, why=exc.message or exc)
        self.on_store_damaged(index, exc)

    def peer_installs(self, peer: str) -> bool:
        """``peer`` may be sent a snapshot: not known to be a Java member."""
        return self.peer_kinds is None or self.peer_kinds.may_install(peer)

    def peer_unsupported(self, peer: str) -> None:
        """``peer`` answered InstallSnapshot with UNSUPPORTED: a Java member (learnt for good)."""
        if self.peer_kinds is not None:
            self.peer_kinds.saw_unsupported(peer)

    def peer_disk_problems(self) -> dict[str, str]:
        """Followers whose last answer said their disk refuses writes: ``{peer: "disk full" | "disk error"}``."""
        return {peer: d.disk_problem for peer, d in self.dispatchers.items() if d.disk_problem is not None}

    def peer_known(self, peer: str) -> int:
        """The highest index ``peer`` is known to hold now (-1: unknown); what the lag metric counts from."""
        d = self.dispatchers.get(peer)
        return d.known_index() if d is not None else -1

    def wait_peer(self, peer: str, index: int) -> Deferred:
        """Fires once ``peer`` is known to hold ``index`` (leadership transfer waits for this)."""
        d: Deferred = Deferred()
        if self.peer_watermark(peer) >= index:
            d.callback(self.peer_watermark(peer))
        else:
            self._waiters.append((peer, index, d))
        return d
