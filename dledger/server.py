"""A dledger member: store, term/vote store, transport, elector and replication wired together.

:class:`DLedgerServer` takes every seam as a constructor argument (as
hashicorp/raft does) and is the transport's :class:`IRequestHandler`.
:meth:`DLedgerServer.build` assembles one from a config and the plugin
manager for the common case.
"""

from __future__ import annotations

import random

from twisted.internet.defer import Deferred, inlineCallbacks, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger import plugins, reads
from dledger.codes import ResponseCode, Role
from dledger.commit_feed import CommitFeed
from dledger.diskio import INLINE, BlockingIO
from dledger.election import transfer
from dledger.election.elector import LeaderElector
from dledger.election.state import MemberState
from dledger.entry import Entry, without_noops
from dledger.errors import DLedgerError
from dledger.interfaces import IBatchRequestHandler, IDiskHealth, ILeaderAware
from dledger.leader_ready import LeaderReady
from dledger.mending import Mending
from dledger.messages import (
    AppendEntryRequest,
    GetEntriesRequest,
    GetEntriesResponse,
    HeartBeatRequest,
    InstallSnapshotRequest,
    LeadershipTransferRequest,
    LeadershipTransferResponse,
    MetadataRequest,
    MetadataResponse,
    PushEntryRequest,
    VoteRequest,
)
from dledger.ratelog import RateLimitedLog
from dledger.replication import appends
from dledger.replication.durability import Flusher
from dledger.replication.follower import EntryHandler
from dledger.replication.leader import LeaderReplicator
from dledger.replication.peerkind import PeerKinds
from dledger.replication.pending import PendingAppends
from dledger.replication.pushcheck import append_window
from dledger.replication.rules import damaged_leader_action
from dledger.replication.snapshot_receive import SnapshotReceive
from dledger.services import MemberServices
from dledger.snapshot.machines import StateMachines
from dledger.stats import ServerStats
from dledger.store.guard import LogGuard

log = Logger()

#: Byte budget of one GET reply.
GET_MAX_BYTES = 4 * 1024 * 1024


@implementer(IBatchRequestHandler, ILeaderAware)
class DLedgerServer:
    """One member of a group."""

    def __init__(self, config, state: MemberState, store, transport, clock, *,
                 rng: random.Random | None = None, plugin_manager=None, use_plugins: bool = True,
                 blocking_io: BlockingIO | None = None):
        if use_plugins:
            config = plugins.resolve_config(config, plugin_manager)  # plugin option defaults, checked types
        self.config = config
        self.state = state
        self.store = store
        self.transport = transport
        self.clock = clock
        #: Where this member's blocking syscalls run (the store's fsyncs; plugins' too): a pool thread in a
        #: running member, inline in tests and tools.
        self.blocking_io = blocking_io or INLINE
        self.self_id = config.self_id
        self.flusher = Flusher(store, clock, sync=config.flush_policy == "sync")
        #: Every write to the store passes here: role/term/leader checks and the append hooks (:mod:`.store.guard`).
        self.guard = LogGuard(store, state)
        self.pending = PendingAppends(clock, config.max_wait_ack_time_ms / 1000.0, config.max_pending_requests_num)
        #: The leader's client-append path (its collaborators given explicitly; see :mod:`.appends`).
        self.client_appends = appends.ClientAppends(state=state, config=config, pending=self.pending,
                                                    append_batch=self.guard.append_batch_as_leader, clock=clock,
                                                    check_request=self.check_request, not_leader=self.not_leader)
        self.elector = LeaderElector(config, state, store, transport, clock, rng)
        self.entry_handler = EntryHandler(state, store, self.flusher, clock, guard=self.guard,
                                          push_timeout=config.max_push_time_out_ms / 1000.0,
                                          on_commit=self.committed_advanced,
                                          append_window=append_window(config.max_pending_size,
                                                                      config.max_batch_push_size),
                                          max_waiting=config.max_pending_size)
        self.commit_feed = CommitFeed(store, clock, self.self_id)
        #: What each peer is (dledger or Java DLedger): InstallSnapshot and compaction ask (issue #22).
        self.peer_kinds = PeerKinds(self.self_id, config.group, list(config.members), transport, clock,
                                    timeout=config.max_push_time_out_ms / 1000.0,
                                    on_all_dledger=self._peers_take_snapshots)
        #: The state machines, their snapshots and the log compaction after each (:mod:`dledger.snapshot`).
        self.snapshots = StateMachines.for_server(self, peers_take_snapshots=self.peer_kinds.all_take_snapshots)
        #: The follower's side of InstallSnapshot (:mod:`dledger.replication.snapshot_receive`).
        self.snapshot_receive = SnapshotReceive(state, store, clock, lambda: self.snapshots,
                                                on_installed=self.entry_handler.installed)
        #: "Leader ready" events (:mod:`dledger.leader_ready`).
        self.leader_ready = LeaderReady(self)
        #: Plugin services (:mod:`dledger.services`): started after the member serves, stopped before it stops.
        self.services = MemberServices(self.self_id, clock)
        self.replicator: LeaderReplicator | None = None
        #: Monitoring counters; None (nothing recorded) until :meth:`enable_stats`.
        self.stats: ServerStats | None = None
        self._preferred_timer = None
        #: ``(index, reason)`` once this member found an entry of its own log unreadable (store damaged);
        #: cleared only by a restart (after the operator repaired the store).
        self.damaged: tuple[int, str] | None = None
        self._damage_log = RateLimitedLog(log, clock, interval=60.0)
        #: Damaged committed entries rewritten from another member's copy, and the scrub (dledger.mending).
        self.mending = Mending(self, config, store, transport, clock)
        self.elector.observe(self._role_changed)
        self.running = False
        if use_plugins:
            ext = plugins.server_extensions(self, plugin_manager)
            for handler in ext.role_change_handlers:
                self.add_role_change_handler(handler)
            for hook in ext.append_hooks:
                self.add_append_hook(hook)
            for listener in ext.commit_listeners:
                self.add_commit_listener(listener)
            for listener in ext.leader_ready_listeners:
                self.add_leader_ready_listener(listener)
            for machine in ext.state_machines:
                self.add_state_machine(machine)
            plugins.add_services(self, self.services, plugin_manager)

    @property
    def append_batch(self):
        """The store's batch leader append (or one made of one-entry appends), as the append path uses it."""
        return self.client_appends.append_batch

    # -- construction ------------------------------------------------------------------
    @classmethod
    def build(cls, config, *, clock=None, transport=None, store=None, term_store=None,
              rng: random.Random | None = None, plugin_manager=None, blocking_io=None,
              **transport_kwargs) -> DLedgerServer:
        """A server from ``config``: store and transport come from the plugins named in the config unless given.

        ``blocking_io`` (a :class:`dledger.diskio.BlockingIO`) says where the
        store's fsyncs run: inline by default (tests, tools), on the reactor's
        thread pool for a running member (``BlockingIO(reactor, threaded=True)``).
        Term/vote writes use it too when the term store allows it
        (``save_off_reactor``, :mod:`dledger.election.state`).
        """
        if clock is None:
            from twisted.internet import reactor as clock
        store_type = None
        if store is None or term_store is None:
            store_type = plugins.get_store_type(config.store_type, plugin_manager)
        if term_store is None:
            term_store = store_type.make_term_store(config)
        # Term/vote writes go off the reactor thread too when the term store says its save may run on a
        # pool thread (``save_off_reactor``); otherwise (and for plugin stores that do not say) inline.
        term_io = (blocking_io or INLINE) if getattr(term_store, "save_off_reactor", False) else INLINE
        state = MemberState(config.self_id, list(config.members), term_store, config.group, blocking_io=term_io)
        if store is None:
            store = store_type.make_log_store(config, state, clock=clock, blocking_io=blocking_io or INLINE)
        elif callable(store) and not hasattr(store, "append_as_leader"):
            store = store(config, state)
        if transport is None:
            ttype = plugins.get_transport_type(config.transport_type, plugin_manager)
            transport = ttype.make_transport(config, clock, **transport_kwargs)
        return cls(config, state, store, transport, clock, rng=rng, plugin_manager=plugin_manager,
                   blocking_io=blocking_io)

    # -- extension points --------------------------------------------------------------
    def enable_stats(self) -> ServerStats:
        """Start counting appends, reads and replication round trips (for :mod:`dledger.metrics`)."""
        if self.stats is None:
            self.stats = ServerStats(self.clock)
            self.elector.observe(self.stats.role_changed)
            self.client_appends.stats = self.stats
            if self.replicator is not None:
                self.replicator.stats = self.stats
        return self.stats

    def add_role_change_handler(self, handler) -> None:
        """Register an ``IRoleChangeHandler`` (called with every role change, in order)."""
        self.elector.notifier.add(handler)

    def add_append_hook(self, hook) -> None:
        """Register an ``IAppendHook`` (run on every later leader append, after those registered before)."""
        self.guard.add_append_hook(hook)

    def add_commit_listener(self, listener) -> None:
        """Register an ``ICommitListener`` (receives committed entries in order)."""
        self.commit_feed.add(listener)

    def add_leader_ready_listener(self, listener) -> None:
        """Register an ``ILeaderReadyListener`` (told once per term this member leads with that term committed)."""
        self.leader_ready.add(listener)

    def add_state_machine(self, machine) -> None:
        """Register an ``IStateMachine`` (before :meth:`start`): restored from snapshots, fed committed entries."""
        self.snapshots.add(machine)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Deferred:
        """Recover the store, start serving and stand for election."""
        self.store.startup()
        if self.store.committed_index > self.store.ledger_end_index:
            raise AssertionError("store reports committed index past its end")
        d = self.snapshots.start()  # restore the newest intact snapshot (or refuse to start, one line)
        d.addCallback(lambda _: self.transport.start(self))
        d.addCallback(lambda _: self._started())
        d.addCallback(lambda _: self._start_services())
        return d

    def _start_services(self):
        """Plugin services start once the member serves; if one cannot, the member stops and start() fails."""
        try:
            self.services.start()
        except Exception:
            failure = Failure()
            return self.stop().addBoth(lambda _: failure)

    def _started(self) -> None:
        self.running = True
        log.info("{id}: started in group {group} (term {term}, log {b}..{e}, committed {c})", id=self.self_id,
                 group=self.config.group, term=self.state.curr_term, b=self.store.ledger_begin_index,
                 e=self.store.ledger_end_index, c=self.store.committed_index)
        self.elector.start()
        self.peer_kinds.start()
        self.commit_feed.advanced()
        self.snapshots.advanced()
        self.mending.start()
        if transfer.takes_preferred_check(self.self_id, self.config.preferred_leaders):
            self._preferred_timer = self.clock.callLater(self.elector.heartbeat, self._check_preferred_leader)

    @inlineCallbacks
    def stop(self):
        """Stop timers, answer everything pending, stop the transport and close the store (flushed)."""
        if not self.running or self.services.stopping:
            return
        yield self.services.stop()  # plugin services may still use the member until they have stopped
        self.running = False
        self.leader_ready.stop()
        self.elector.stop()
        self.peer_kinds.stop()
        self.snapshot_receive.stop()
        self.mending.stop()
        if self._preferred_timer is not None and self._preferred_timer.active():
            self._preferred_timer.cancel()
        if self.replicator is not None:
            self.replicator.stop()
            self.replicator = None
        self.pending.fail_all(ResponseCode.TERM_CHANGED)
        self.entry_handler.stop()
        self.commit_feed.stop()
        self.snapshots.stop()
        self.flusher.stop()
        yield maybeDeferred(self.transport.stop)
        yield maybeDeferred(self.store.shutdown)
        # A term/vote write still in flight (on the thread pool) finishes before its store is closed.
        yield self.state.persisted().addErrback(lambda _f: None)
        close = getattr(self.state.term_store, "close", None)
        if close is not None:
            close()  # releases the store directory's lock (dledger.store.ownership) with the log store's

    def crash(self) -> None:
        """Stop dead, as a killed process would: no flush, no goodbye (for tests and simulations)."""
        self.running = False
        self.services.stop()  # not awaited: a killed process's services just vanish (their timers stop here)
        self.leader_ready.stop()
        self.elector.stop()
        self.peer_kinds.stop()
        self.snapshot_receive.stop()
        self.mending.stop()
        if self.replicator is not None:
            self.replicator.stop()
            self.replicator = None
        self.entry_handler.stop()
        self.commit_feed.stop()
        self.snapshots.stop()
        self.flusher.stop()
        self.pending.fail_all(ResponseCode.TERM_CHANGED)
        self.transport.stop()

    # -- role changes -------------------------------------------------------------------
    def _role_changed(self, term: int, role: Role) -> None:
        if self.replicator is not None:
            self.replicator.stop()
            self.replicator = None
        self.pending.fail_all(ResponseCode.TERM_CHANGED)
        self.entry_handler.reset()
        if role is Role.LEADER:
            self.replicator = LeaderReplicator(term, config=self.config, self_id=self.self_id,
                                               members=self.state.members, store=self.store,
                                               append_as_leader=self.guard.append_as_leader,
                                               transport=self.transport, clock=self.clock, flusher=self.flusher,
                                               on_committed=self.committed_advanced,
                                               on_store_damaged=self.store_damaged, stats=self.stats,
                                               snapshot_store=self._snapshot_store(), peer_kinds=self.peer_kinds)
            self.replicator.start()

    def _peers_take_snapshots(self) -> None:
        """Every peer is now known to be a dledger member: a snapshot taken while one might have been Java
        (start-up, say) compacts the log now rather than at the next snapshot."""
        newest = self.snapshots.snapshot_store.newest()
        if newest is not None and self.running:
            self.snapshots.compact(newest.index)

    def _snapshot_store(self):
        """The member's SnapshotStore (``server.snapshots.snapshot_store``): the leader sends its newest."""
        return self.snapshots.snapshot_store

    def committed_advanced(self) -> None:
        """The committed index moved: answer appends, feed listeners, tell idle followers."""
        self.pending.resolve_upto(self.store.committed_index)
        self.commit_feed.advanced()
        self.snapshots.advanced()
        self.leader_ready.check()
        if self.replicator is not None:
            self.replicator.schedule_pump()

    # -- request dispatch ------------------------------------------------------------------
    def handle_request(self, request):
        self.check_request(request)
        handler = self._handlers.get(type(request))
        if handler is None:
            raise DLedgerError(ResponseCode.UNSUPPORTED, type(request).__name__)
        return handler(self, request)

    def handle_requests(self, requests: list) -> list:
        """Requests that arrived together, in order; consecutive APPENDs are appended as one store batch.

        Each result is what :meth:`handle_request` would give (a Failure where it raises).
        """
        results: list = []
        run: list[AppendEntryRequest] = []
        for request in requests:
            if type(request) is AppendEntryRequest:
                run.append(request)
                continue
            if run:
                results += self.client_appends.append_requests(run, self.replicator)
                run = []
            try:
                results.append(self.handle_request(request))
            except Exception:
                results.append(Failure())
        if run:
            results += self.client_appends.append_requests(run, self.replicator)
        return results

    def check_request(self, request) -> None:
        """What every request must pass: a running member, addressed to us, in our group."""
        if not self.running:
            raise DLedgerError(ResponseCode.NETWORK_ERROR, f"{self.self_id} is not running")
        if request.remote_id is not None and request.remote_id != self.self_id:
            raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{request.remote_id} != {self.self_id}",
                               leader_id=self.state.leader_id)
        if request.group != self.config.group:
            raise DLedgerError(ResponseCode.UNKNOWN_GROUP, f"{request.group} != {self.config.group}",
                               leader_id=self.state.leader_id)

    # -- client API -------------------------------------------------------------------------
    def current_leader(self) -> str | None:
        """The leader this member follows now (ILeaderAware: the connection's id check for LEADERSHIP_TRANSFER)."""
        return self.state.leader_id

    def leads(self) -> bool:
        """This member leads and its replicator runs: it may append, transfer, and answer reads as leader."""
        return self.state.role is Role.LEADER and self.replicator is not None

    def not_leader(self) -> DLedgerError:
        """NOT_LEADER naming the leader this member knows, so a client can redirect."""
        return DLedgerError(ResponseCode.NOT_LEADER, f"{self.self_id} is {self.state.role.name}",
                            leader_id=self.state.leader_id)

    def handle_append(self, request: AppendEntryRequest) -> Deferred:
        """Append one body or a batch; fires when the last entry commits (SPEC §4 ``handleAppend``)."""
        (result,) = self.client_appends.append_requests([request], self.replicator)
        if isinstance(result, Failure):
            result.raiseException()
        return result

    def handle_get(self, request: GetEntriesRequest):
        """Committed entries from ``beginIndex``: at most ``maxSize`` of them (0 means 1), NOOPs left out.

        Entries at or below the committed index never change, so they are
        served at once.  Before saying an index is *not* committed yet the
        leader confirms it still leads and that its own term's first entry is
        committed (Raft's ReadIndex), so a deposed leader never answers a
        stale INDEX_OUT_OF_RANGE; a follower serves ``followerRead`` GETs from
        its own committed prefix.  The decisions are :mod:`dledger.reads`'.
        """
        store = self.store
        begin, want = request.begin_index, max(1, request.max_size)
        replicator = self.replicator
        decision = reads.read_decision(self.leads(), request.follower_read is True, begin, store.ledger_begin_index,
                                       store.committed_index, self.self_id)
        if decision.action is reads.ReadAction.SERVE:
            return self._read(begin, want)
        if decision.action is reads.ReadAction.REFUSE:
            raise self._read_refused(decision)

        def confirmed(ok: bool):
            after = reads.confirmed_read_decision(ok, self.replicator is replicator, begin, store.committed_index,
                                                  replicator.term_start_index, self.self_id)
            if after.action is reads.ReadAction.SERVE:
                return self._read(begin, want)
            raise self._read_refused(after)

        return self.elector.confirm_leadership().addCallback(confirmed)

    def _read_refused(self, decision: reads.ReadDecision) -> DLedgerError:
        if decision.code is ResponseCode.NOT_LEADER:
            return self.not_leader()
        return decision.error(self.state.leader_id)

    def _read(self, begin: int, want: int):
        """:meth:`_read_now`, with a damaged entry repaired first (:meth:`dledger.mending.Mending.read`)."""
        return self.mending.read(begin, want, self._read_now)

    def _read_now(self, begin: int, want: int) -> GetEntriesResponse:
        store = self.store
        committed = store.committed_index
        started = self.clock.seconds() if self.stats is not None else 0.0
        out: list[Entry] = []
        while begin <= committed and not out:
            entries = store.get_range(begin, min(want, committed - begin + 1), GET_MAX_BYTES)
            out = without_noops(entries)
            begin = entries[-1].index + 1
        if self.stats is not None:
            self.stats.read_done(started)
        return GetEntriesResponse(group=self.config.group, entries=out)

    def handle_metadata(self, request: MetadataRequest) -> MetadataResponse:
        """The peer map and leader (Java's shape); ``detail`` adds role, term and log indexes."""
        resp = MetadataResponse(group=self.config.group, leader_id=self.state.leader_id,
                                peers={p.id: p.address for p in self.config.members.values()})
        if request.detail:
            resp.term = self.state.curr_term
            resp.role = self.state.role.name
            resp.ledger_begin_index = self.store.ledger_begin_index
            resp.ledger_end_index = self.store.ledger_end_index
            resp.committed_index = self.store.committed_index
            resp.disk = getattr(self.store, "disk_problem", None) if IDiskHealth.providedBy(self.store) else None
            if self.leads():
                resp.peer_disk = self.replicator.peer_disk_problems() or None
        return resp

    def append(self, body: bytes) -> Deferred:
        """Embedded use: append ``body`` on this member (which must be the leader)."""
        return maybeDeferred(self.handle_append, AppendEntryRequest(group=self.config.group, body=body))

    # -- leadership transfer -------------------------------------------------------------------
    def handle_leadership_transfer(self, request: LeadershipTransferRequest) -> Deferred:
        """Transfer leadership (leader side) or take it (transferee side), as Java DLedger does."""
        if request.transfer_id == self.self_id:
            return self._transfer_from_here(request)
        if request.transferee_id == self.self_id:
            return self.elector.take_leadership(request)
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"transfer {request.transfer_id} -> {request.transferee_id} does not involve {self.self_id}")

    def _transfer_from_here(self, request: LeadershipTransferRequest) -> Deferred:
        """The leader side: stop appends, wait until ``target`` holds our end, ask it to take over (SPEC §3).

        Whether it may start and whether a failure ends it are :mod:`dledger.election.transfer`'s decisions.
        """
        st = self.state
        target = request.transferee_id
        leads = self.leads()
        refusal = transfer.transfer_refusal(target, self.self_id, st.member_set, leads, request.term, st.curr_term,
                                            st.transferee, self.store.ledger_end_index,
                                            self.replicator.peer_watermark(target) if leads else -1,
                                            self.config.max_leadership_transfer_wait_index)
        if refusal is not None:
            if refusal[0] is ResponseCode.NOT_LEADER:
                raise self.not_leader()
            raise DLedgerError(*refusal)
        term = st.curr_term
        st.transferee = target
        replicator = self.replicator
        end = self.store.ledger_end_index
        log.info("{id}: transferring leadership to {to} (term {term}, end index {end})", id=self.self_id,
                 to=target, term=term, end=end)
        timeout = self.clock.callLater(self.config.leadership_transfer_wait_timeout / 1000.0,
                                       lambda: caught.called or caught.errback(
                                           DLedgerError(ResponseCode.TAKE_LEADERSHIP_FAILED,
                                                        f"{target} did not catch up in time")))
        caught = replicator.wait_peer(target, end)

        def ask(_):
            if timeout.active():
                timeout.cancel()
            take = LeadershipTransferRequest(group=self.config.group, term=term, leader_id=self.self_id,
                                             local_id=self.self_id, remote_id=target, transfer_id=self.self_id,
                                             transferee_id=target, take_leadership_ledger_index=end)
            return self.transport.send(target, take, timeout=self.config.leadership_transfer_wait_timeout / 1000.0
                                       + self.elector.vote_timeout)

        def done(result):
            if timeout.active():
                timeout.cancel()
            if isinstance(result, LeadershipTransferResponse) and result.response_code is ResponseCode.SUCCESS:
                return result
            if transfer.transfer_failure_resumes(st.transferee, target, st.curr_term, term):
                st.transferee = None
            if isinstance(result, LeadershipTransferResponse):
                return result
            code = result.value.code if isinstance(result.value, DLedgerError) else ResponseCode.INTERNAL_ERROR
            return LeadershipTransferResponse(code=int(code), term=st.curr_term)

        caught.addCallback(ask)
        caught.addBoth(done)
        return caught

    def store_damaged(self, index: int, exc: Exception) -> None:
        """An entry of our log cannot be read (e.g. its body CRC fails): stop leading, stop standing.

        A leader that cannot read a committed entry can never bring a follower that lacks it up to
        date, so the group would stay short of a replica for good (issue #9).  The member marks its
        store damaged -- the elector then never asks for votes (or takes leadership) until a restart --
        and, while it leads, hands leadership to a member that holds the entry (decided by
        :func:`damaged_leader_action`; asked again at every failed read, i.e. about once a heartbeat,
        until a transfer succeeds).
        """
        why = getattr(exc, "message", "") or str(exc)
        if self.mending.may_repair(index):
            # First try to rewrite it from a member's intact copy; only if nobody has one is the store damaged.
            self.mending.repair(index, why).addCallback(lambda ok: ok or self.store_damaged(index, exc))
            return
        if self.damaged is None:
            self.damaged = (index, why)
            self.elector.store_damaged = f"entry {index} of this member's log is unreadable: {why}"
            log.error("{id}: store damaged: entry {index} cannot be read ({why}); this member will hand over "
                      "leadership and not stand for election until its store is repaired and it is restarted",
                      id=self.self_id, index=index, why=why)
        st = self.state
        if not self.leads() or st.transferee is not None:
            return
        known = {peer: self.replicator.peer_known(peer) for peer in st.peers}
        action = damaged_leader_action(index, self.store.ledger_end_index, known,
                                       self.config.max_leadership_transfer_wait_index)
        if action.transfer_to is None:
            self._damage_log.warn("no-transfer", "{id}: store damaged but leadership cannot be handed over yet: "
                                  "{why}", id=self.self_id, why=action.why)
            return
        log.info("{id}: store damaged: transferring leadership to {to} ({why})", id=self.self_id,
                 to=action.transfer_to, why=action.why)
        req = LeadershipTransferRequest(group=self.config.group, term=st.curr_term, transfer_id=self.self_id,
                                        transferee_id=action.transfer_to)
        maybeDeferred(self.handle_leadership_transfer, req).addErrback(lambda f: None)

    def _check_preferred_leader(self) -> None:
        """As leader, hand leadership to a live, caught-up preferred member (Java's preferredLeaderIds)."""
        self._preferred_timer = None
        if not self.running:
            return
        st = self.state
        replicator = self.replicator
        preferred = self.config.preferred_leaders
        leads = self.leads()
        marks = {pid: replicator.peer_watermark(pid) for pid in preferred} if leads else {}
        pid = transfer.preferred_transferee(self.self_id, preferred, leads, st.transferee is not None,
                                            st.peers_live, self.store.ledger_end_index, marks,
                                            self.config.max_leadership_transfer_wait_index)
        if pid is not None:
            log.info("{id}: preferred leader {pid} is live and caught up: transferring", id=self.self_id, pid=pid)
            req = LeadershipTransferRequest(group=self.config.group, term=st.curr_term, transfer_id=self.self_id,
                                            transferee_id=pid)
            maybeDeferred(self.handle_leadership_transfer, req).addErrback(lambda f: None)
        self._preferred_timer = self.clock.callLater(self.elector.heartbeat, self._check_preferred_leader)

    _handlers = {
        VoteRequest: lambda self, r: self.elector.handle_vote(r),
        HeartBeatRequest: lambda self, r: self.elector.handle_heartbeat(r),
        # A push reply acknowledges entries of the leader's term: held until that term is on disk here.
        PushEntryRequest: lambda self, r: self.state.after_persisted(self.entry_handler.handle_push(r)),
        InstallSnapshotRequest: lambda self, r: self.state.after_persisted(
            maybeDeferred(self.snapshot_receive.handle, r)),
        AppendEntryRequest: handle_append,
        GetEntriesRequest: handle_get,
        MetadataRequest: handle_metadata,
        LeadershipTransferRequest: handle_leadership_transfer,
    }


