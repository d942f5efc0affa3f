"""A dledger member: store, term/vote store, transport, elector and replication wired together.

:class:`DLedgerServer` takes every seam as a constructor argument (as
hashicorp/raft does) and is the transport's :class:`IRequestHandler`.
:meth:`DLedgerServer.build` assembles one from a config and the plugin
manager for the common case.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from twisted.internet.defer import Deferred, inlineCallbacks, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger import plugins, readpath
from dledger.codes import ResponseCode, Role
from dledger.commit_feed import CommitFeed
from dledger.diskio import INLINE, BlockingIO
from dledger.election.elector import LeaderElector
from dledger.election.handover import Handover
from dledger.election.state import MemberState
from dledger.errors import DLedgerError
from dledger.interfaces import IAnsweringRequestHandler, IBatchAppender, ILeaderAware, IPluginRequests
from dledger.leader_ready import LeaderReady
from dledger.membership import wiring as membership_wiring
from dledger.mending import Mending
from dledger.messages import (
    AppendEntryRequest,
    GetEntriesRawRequest,
    GetEntriesRequest,
    HeartBeatRequest,
    InstallSnapshotRequest,
    LeadershipTransferRequest,
    MembersRequest,
    MetadataRequest,
    MetadataResponse,
    PluginRequest,
    PushEntryRequest,
    SnapshotRequest,
    VoteRequest,
)
from dledger.plugin_requests import PluginRequests
from dledger.readpath import ReadPath
from dledger.replication import appends
from dledger.replication.durability import Flusher
from dledger.replication.follower import EntryHandler
from dledger.replication.leader import LeaderReplicator
from dledger.replication.peerkind import PeerKinds
from dledger.replication.pending import PendingAppends
from dledger.replication.pushcheck import append_window
from dledger.replication.snapshot_receive import SnapshotReceive
from dledger.server_build import build
from dledger.services import MemberServices
from dledger.snapshot.machines import StateMachines
from dledger.stats import ServerStats
from dledger.store.guard import LogGuard

log = Logger()

#: Byte budget of one GET reply (kept here for callers that imported it from the server).
GET_MAX_BYTES = readpath.GET_MAX_BYTES


@implementer(IBatchAppender, IAnsweringRequestHandler, ILeaderAware, IPluginRequests)
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
        #: The body of a new leader's term-start NOOP: ``callable() -> bytes`` (None: empty).  A plugin whose
        #: Java peers parse every entry body (RocketMQ's DLedgerCommitLog) gives one they can read (issue #27).
        self.noop_body = None
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
        #: The last role changes with their reasons (:mod:`dledger.status.events`); None until :meth:`enable_stats`.
        self.role_events = None
        #: ``(index, reason)`` once this member found an entry of its own log unreadable (store damaged);
        #: cleared only by a restart (after the operator repaired the store).
        self.damaged: tuple[int, str] | None = None
        #: Damaged committed entries rewritten from another member's copy, and the scrub (dledger.mending).
        self.mending = Mending(self, config, store, transport, clock)
        self.elector.observe(self._role_changed)
        self.running = False
        #: The request codes plugins serve here (:mod:`dledger.plugin_requests`).
        self.plugin_requests = PluginRequests(self.self_id, clock)
        #: GETs and ReadIndex (:mod:`dledger.readpath`).
        self.reads = ReadPath(self)
        #: Leadership transfers: requested, to a preferred leader, away from a damaged store (:mod:`.handover`).
        self.handover = Handover(self)
        self.membership = membership_wiring.attach(self)  #: the configuration in force (:mod:`dledger.membership`)
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
            for handler in ext.request_handlers:
                self.add_request_handler(handler)
            plugins.add_services(self, self.services, plugin_manager)

    @property
    def append_batch(self):
        """The store's batch leader append (or one made of one-entry appends), as the append path uses it."""
        return self.client_appends.append_batch

    # -- construction ------------------------------------------------------------------
    #: ``DLedgerServer.build(config, ...)``: a server whose store and transport come from the config's plugins
    #: (:func:`dledger.server_build.build`, which documents the arguments).
    build = classmethod(build)

    # -- extension points --------------------------------------------------------------
    def enable_stats(self) -> ServerStats:
        """Start counting appends, reads and replication round trips (for :mod:`dledger.metrics`)."""
        if self.stats is None:
            from dledger.status.events import RoleEvents

            self.stats = ServerStats(self.clock)
            self.elector.observe(self.stats.role_changed)
            #: The last role changes with their reasons, for the status page (dledger.status).
            self.role_events = RoleEvents(self.state, self.clock)
            self.elector.observe(self.role_events.role_changed)
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

    def add_request_handler(self, handler) -> None:
        """Serve a plugin request code (a :class:`dledger.plugin_types.RequestHandler`); ConfigError if it cannot be."""
        self.plugin_requests.add(handler)

    def plugin_role(self, code: int) -> str | None:
        """The role plugin request ``code`` needs (IPluginRequests: the connection's check); None if none serves it."""
        return self.plugin_requests.role(code)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> Deferred:
        """Recover the store, start serving and stand for election."""
        self.store.startup()
        if self.store.committed_index > self.store.ledger_end_index:
            raise AssertionError("store reports committed index past its end")
        d = self.snapshots.start()  # restore the newest intact snapshot (or refuse to start, one line)
        d.addCallback(lambda _: membership_wiring.load(self, self.blocking_io))  # the log's configuration
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
        if self.snapshots.machines:
            self.peer_kinds.start()  # only snapshots need to know the peers' kinds: no probes without them
        self.commit_feed.advanced()
        self.snapshots.advanced()
        self.mending.start()
        self.handover.start()

    @inlineCallbacks
    def stop(self):
        """Stop timers, answer everything pending, stop the transport and close the store (flushed)."""
        if not self.running or self.services.stopping:
            return
        yield self.services.stop()  # plugin services may still use the member until they have stopped
        self.running = False
        self._halt()
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
        self._halt()
        self.transport.stop()

    def _halt(self) -> None:
        """Stop every timer and part of the member (not the transport or store) and fail pending appends."""
        for part in (self.leader_ready, self.elector, self.peer_kinds, self.snapshot_receive, self.mending,
                     self.handover, self.membership.changes):
            part.stop()
        if self.replicator is not None:
            self.replicator.stop()
            self.replicator = None
        for part in (self.entry_handler, self.commit_feed, self.snapshots, self.flusher):
            part.stop()
        self.pending.fail_all(ResponseCode.TERM_CHANGED)

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
                                               snapshot_store=self.snapshots.snapshot_store, peer_kinds=self.peer_kinds,
                                               configuration=self.membership.configuration,
                                               noop_body=self.noop_body)
            self.replicator.start()

    def _peers_take_snapshots(self) -> None:
        """Every peer is now known to be a dledger member: a snapshot taken while one might have been Java
        (start-up, say) compacts the log now rather than at the next snapshot."""
        newest = self.snapshots.snapshot_store.newest()
        if newest is not None and self.running:
            self.snapshots.compact(newest.index)

    def committed_advanced(self) -> None:
        """The committed index moved: answer appends, feed listeners, tell idle followers."""
        self.pending.resolve_upto(self.store.committed_index)
        self.commit_feed.advanced()
        self.snapshots.advanced()
        self.leader_ready.check()
        self.membership.changes.committed_advanced()
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
        return self.handle_requests_answering(requests, None, ())

    def handle_requests_answering(self, requests: list, answer: Any, tokens: Sequence[Any]) -> list:
        """:meth:`handle_requests`, the waiting APPENDs answered by ``answer(tokens[i], response)``.

        See :class:`~dledger.interfaces.IAnsweringRequestHandler`; ``answer`` None: Deferreds, as
        :meth:`handle_requests`.
        """
        results: list = []
        run: list[AppendEntryRequest] = []
        run_from = 0
        appends = self.client_appends.append_requests
        for i, request in enumerate(requests):
            if type(request) is AppendEntryRequest:
                if not run:
                    run_from = i
                run.append(request)
                continue
            if run:
                results += appends(run, self.replicator, answer, tokens[run_from:i] if answer else ())
                run = []
            try:
                results.append(self.handle_request(request))
            except Exception:
                results.append(Failure())
        if run:
            results += appends(run, self.replicator, answer, tokens[run_from:] if answer else ())
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
        self.membership.changes.check_serving(request)  # a removed member serves no client

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

    def handle_appends(self, requests: list[AppendEntryRequest]) -> list:
        """Append several requests as ONE store batch (:class:`~dledger.interfaces.IBatchAppender`).

        For a plugin that gathers client requests itself (one store write and
        one replicator wake-up for many, instead of one each); each result is
        what :meth:`handle_append` would give, a ``Failure`` where it raises.
        """
        return self.client_appends.append_requests(requests, self.replicator)

    def handle_get(self, request: GetEntriesRequest):
        """Committed entries from ``beginIndex`` (:meth:`dledger.readpath.ReadPath.handle_get`)."""
        return self.reads.handle_get(request)

    def read_index(self) -> Deferred:
        """Raft's ReadIndex: a Deferred of the index a linearizable read waits for (:meth:`.ReadPath.read_index`)."""
        return self.reads.read_index()

    def handle_plugin_request(self, request: PluginRequest) -> Deferred:
        """A plugin's request code: its handler's bytes, or its refusal as the reply's code and reason."""
        return self.plugin_requests.handle(request)

    def handle_metadata(self, request: MetadataRequest) -> MetadataResponse:
        """The peer map and leader (Java's shape); ``detail`` adds role, term and log indexes (:mod:`.readpath`)."""
        return self.reads.metadata(request)

    def append(self, body: bytes) -> Deferred:
        """Embedded use: append ``body`` on this member (which must be the leader)."""
        return maybeDeferred(self.handle_append, AppendEntryRequest(group=self.config.group, body=body))

    def handle_snapshot(self, request: SnapshotRequest) -> Deferred:
        """Take a snapshot now (``dledger snapshot``, admin role): :meth:`.StateMachines.handle_request`."""
        return self.snapshots.handle_request(request)

    # -- leadership transfer -------------------------------------------------------------------
    def handle_leadership_transfer(self, request: LeadershipTransferRequest) -> Deferred:
        """Transfer leadership (leader side) or take it (transferee side) (:mod:`dledger.election.handover`)."""
        return self.handover.handle(request)

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
        self.handover.away_from_damage(index)

    _handlers = {
        VoteRequest: lambda self, r: self.elector.handle_vote(r),
        HeartBeatRequest: lambda self, r: self.elector.handle_heartbeat(r),
        # A push reply acknowledges entries of the leader's term: held until that term is on disk here.
        PushEntryRequest: lambda self, r: self.state.after_persisted(self.entry_handler.handle_push(r)),
        InstallSnapshotRequest: lambda self, r: self.state.after_persisted(
            maybeDeferred(self.snapshot_receive.handle, r)),
        AppendEntryRequest: handle_append,
        GetEntriesRequest: handle_get,
        GetEntriesRawRequest: handle_get,  # the same GET (DLedgerClient.get_raw) through an in-process transport
        MetadataRequest: handle_metadata,
        LeadershipTransferRequest: handle_leadership_transfer,
        SnapshotRequest: handle_snapshot,
        PluginRequest: handle_plugin_request,
        MembersRequest: lambda self, r: self.membership.changes.handle_request(r),
    }


