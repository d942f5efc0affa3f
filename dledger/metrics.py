"""Prometheus metrics of one member: a collector that reads the member when scraped, served by twisted.web.

Metric names are Java DLedger's where it has one (``DLedgerMetricsConstant``):
``dledger_append_entry_latency``, ``dledger_append_entry_batch_count``,
``dledger_append_entry_batch_bytes``, ``dledger_replicate_entry_latency``,
``dledger_replica_entry_batch_count``, ``dledger_replica_entry_batch_bytes``,
``dledger_read_latency``, ``dledger_lag_entries_count``,
``dledger_entry_store_size``; every series carries Java's ``group`` and
``self_id`` labels (and ``remote_id`` per peer).  Latencies are in
microseconds with Java's buckets, because that is what Java records.
dledger adds the member's role, term, indexes, pending appends and a few
counters (see docs/operations.md for the full list).

Cost: the hot path only updates :class:`dledger.stats.ServerStats`; gauges
are read and histograms copied when Prometheus scrapes.  ``prometheus_client``
renders on the reactor's thread pool, so the collector takes its snapshot on
the reactor thread (``blockingCallFromThread``) and the member's state is
only ever touched by the reactor thread.  Each member has its own
:class:`CollectorRegistry`; nothing goes into the global one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import CollectorRegistry, CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.utils import floatToGoString
from twisted.application import service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.threads import blockingCallFromThread
from twisted.logger import Logger, LogLevel
from twisted.python.threadable import isInIOThread
from twisted.web.server import Site

from dledger.codes import Role
from dledger.stats import Histogram, lag_entries

log = Logger()


@dataclass
class Snapshot:
    """Everything one scrape reports, copied on the reactor thread."""

    group: str
    self_id: str
    running: bool = False
    role: str = "CANDIDATE"
    term: int = -1
    leader_id: str | None = None
    begin: int = -1
    end: int = -1
    end_term: int = -1
    committed: int = -1
    store_bytes: int = 0
    pending: int = 0
    flushes: int = 0
    lag: dict[str, int] = field(default_factory=dict)
    store_damaged: int = 0
    disk_problem: str | None = None
    scrub: Any = None
    histograms: dict[str, Histogram] = field(default_factory=dict)
    peer_histograms: dict[str, dict[str, Histogram]] = field(default_factory=dict)
    appends: dict[str, int] = field(default_factory=dict)
    entries_appended: int = 0
    role_changes: int = 0
    plugin_families: list = field(default_factory=list)
    #: The configuration in force: ``(member id, "voter" | "learner", awaiting automatic promotion)``.
    members: list[tuple[str, str, bool]] = field(default_factory=list)
    config_index: int = 0


def take_snapshot(server: Any, providers: list | None = None, on_error: Callable | None = None) -> Snapshot:
    """Read ``server`` (a :class:`~dledger.server.DLedgerServer`); call on the reactor thread.

    ``providers`` are the plugins' metric providers (``dledger_metric_families``); their families are
    collected here, on the reactor thread, with the rest.
    """
    cfg = server.config
    snap = Snapshot(cfg.group, cfg.self_id)
    state, store = server.state, server.store
    snap.running = bool(server.running)
    snap.role = state.role.name
    snap.term = state.curr_term
    snap.leader_id = state.leader_id
    snap.begin, snap.end = store.ledger_begin_index, store.ledger_end_index
    snap.end_term = store.ledger_end_term
    snap.committed = store.committed_index
    snap.store_bytes = store_bytes(store)
    snap.pending = len(server.pending)
    snap.flushes = server.flusher.flushes
    snap.store_damaged = 1 if getattr(server, "damaged", None) is not None else 0
    snap.disk_problem = getattr(store, "disk_problem", None)
    mending = getattr(server, "mending", None)
    scrubber = mending.scrubber if mending is not None else None
    snap.scrub = dataclasses.replace(scrubber.stats) if scrubber is not None else None
    snap.members, snap.config_index = configuration_rows(server)
    replicator = server.replicator
    if replicator is not None and state.role is Role.LEADER:
        for peer in state.peers:
            snap.lag[peer] = lag_entries(snap.begin, snap.end, replicator.peer_known(peer))
    stats = server.stats
    if stats is not None:
        snap.histograms = {
            "dledger_append_entry_latency": stats.append_latency.copy(),
            "dledger_append_entry_batch_count": stats.append_batch_count.copy(),
            "dledger_append_entry_batch_bytes": stats.append_batch_bytes.copy(),
            "dledger_read_latency": stats.read_latency.copy(),
        }
        snap.peer_histograms = {
            "dledger_replicate_entry_latency": {p: h.copy() for p, h in stats.replicate_latency.items()},
            "dledger_replica_entry_batch_count": {p: h.copy() for p, h in stats.replicate_batch_count.items()},
            "dledger_replica_entry_batch_bytes": {p: h.copy() for p, h in stats.replicate_batch_bytes.items()},
        }
        snap.appends = dict(stats.appends)
        snap.entries_appended = stats.entries_appended
        snap.role_changes = stats.role_changes
    for provider in providers or ():
        try:
            snap.plugin_families.extend(provider())
        except Exception as e:
            if on_error is not None:
                on_error(provider, e)
    return snap


def configuration_rows(server: Any) -> tuple[list[tuple[str, str, bool]], int]:
    """The configuration in force (``server.membership``, issue #23) as rows, and its entry's index.

    A server without membership tracking runs on its ``--peers``: every member a voter, index 0.
    """
    membership = getattr(server, "membership", None)
    config = getattr(membership, "configuration", None)
    if config is None:
        return [(mid, "voter", False) for mid in server.config.members], 0
    return [(m.id, m.role.value, bool(m.promote and not m.voter)) for m in config.members], config.index


def store_bytes(store: Any) -> int:
    """Bytes of the data log from the first entry's position to the end of the last one."""
    if store.ledger_end_index < 0 or store.ledger_begin_index < 0:
        return 0
    try:
        first, last = store.get(store.ledger_begin_index), store.get(store.ledger_end_index)
    except Exception:  # a store mid-truncation; report nothing rather than fail the scrape
        return 0
    return last.pos + last.size - first.pos


_HELP = {
    "dledger_append_entry_latency": "Append request received on the leader until committed, in microseconds",
    "dledger_append_entry_batch_count": "Entries per append request",
    "dledger_append_entry_batch_bytes": "Body bytes per append request",
    "dledger_read_latency": "GET request handling time on the leader, in microseconds",
    "dledger_replicate_entry_latency": "APPEND push sent to a follower until its SUCCESS reply, in microseconds",
    "dledger_replica_entry_batch_count": "Entries per APPEND push to a follower",
    "dledger_replica_entry_batch_bytes": "Bytes per APPEND push to a follower",
}


class MemberCollector:
    """A ``prometheus_client`` collector for one member; ``get_server()`` may return None before start."""

    def __init__(self, get_server: Callable[[], Any], reactor: Any, group: str, self_id: str,
                 plugin_manager: Any = None, use_plugins: bool = True):
        self.get_server = get_server
        self.reactor = reactor
        self.group = group
        self.self_id = self_id
        self.plugin_manager = plugin_manager
        self.use_plugins = use_plugins
        self._providers: tuple[Any, list] = (None, [])
        self._errors: Any = None

    def describe(self) -> list:
        return []  # do not collect at registration time (the reactor may not run yet)

    def _snapshot(self) -> Snapshot | None:
        server = self.get_server()
        if server is None:
            return None
        return take_snapshot(server, self._providers_for(server), self._provider_failed)

    def _providers_for(self, server: Any) -> list:
        """The plugins' metric providers for ``server`` (``dledger_metric_families``), asked once per server."""
        if not self.use_plugins:
            return []
        if self._providers[0] is not server:
            from dledger import plugins

            self._providers = (server, plugins.metric_providers(server, self.plugin_manager))
        return self._providers[1]

    def _provider_failed(self, provider: Any, exc: BaseException) -> None:
        if self._errors is None:
            from dledger.ratelog import RateLimitedLog

            self._errors = RateLimitedLog(log, self.reactor, interval=60.0)
        name = getattr(provider, "__qualname__", type(provider).__name__)
        self._errors.warn(("metrics", name), "metric provider {name} failed: {exc}", name=name, exc=exc)

    def snapshot(self) -> Snapshot | None:
        if isInIOThread():
            return self._snapshot()
        return blockingCallFromThread(self.reactor, self._snapshot)

    def collect(self) -> Iterator:
        snap = self.snapshot()
        base = ["group", "self_id"]
        ids = [self.group, self.self_id]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=base)
            g.add_metric(ids, value)
            return g

        yield gauge("dledger_up", "1 while the member is started and serving", 1 if snap and snap.running else 0)
        if snap is None:
            return
        roles = GaugeMetricFamily("dledger_role", "1 for the member's current role", labels=[*base, "role"])
        for role in Role:
            roles.add_metric([*ids, role.name], 1 if role.name == snap.role else 0)
        yield roles
        yield gauge("dledger_term", "Current term", snap.term)
        yield gauge("dledger_is_leader", "1 on the leader", 1 if snap.role == "LEADER" else 0)
        yield gauge("dledger_ledger_begin_index", "Index of the first entry in the log (-1 when empty)", snap.begin)
        yield gauge("dledger_ledger_end_index", "Index of the last entry in the log (-1 when empty)", snap.end)
        yield gauge("dledger_ledger_end_term", "Term of the last entry in the log", snap.end_term)
        yield gauge("dledger_committed_index", "Highest index known committed here", snap.committed)
        yield gauge("dledger_entries_count", "Entries in the log (end - begin + 1)",
                    snap.end - snap.begin + 1 if snap.end >= 0 <= snap.begin else 0)
        yield gauge("dledger_entry_store_size", "Bytes of the data log from the first to the last entry",
                    snap.store_bytes)
        yield gauge("dledger_pending_appends", "Appends waiting on the leader for their quorum", snap.pending)
        yield gauge("dledger_store_damaged", "1 once an entry of this member's own log was found unreadable "
                    "(it no longer stands for election; cleared by a restart)", snap.store_damaged)
        yield gauge("dledger_store_disk_full", "1 while this member's store refuses appends for want of space "
                    "(diskFullRatio, or a write that failed with ENOSPC)", 1 if snap.disk_problem == "disk full" else 0)
        yield gauge("dledger_store_disk_error", "1 while this member's store refuses appends after a write error",
                    1 if snap.disk_problem == "disk error" else 0)
        yield from _member_metrics(snap, base, ids)
        if snap.scrub is not None:
            yield from _scrub_metrics(snap.scrub, base, ids)
        yield from snap.plugin_families
        lag = GaugeMetricFamily("dledger_lag_entries_count", "Entries the leader has that a follower is not known "
                                "to hold (unknown: all of them; leader only)", labels=[*base, "remote_id"])
        for peer, value in sorted(snap.lag.items()):
            lag.add_metric([*ids, peer], value)
        yield lag
        flushes = CounterMetricFamily("dledger_store_flushes", "Group-commit store flushes", labels=base)
        flushes.add_metric(ids, snap.flushes)
        yield flushes
        if not snap.histograms:
            return
        appends = CounterMetricFamily("dledger_appends", "Append requests answered by the leader, by result code",
                                      labels=[*base, "code"])
        for code, n in sorted(snap.appends.items()):
            appends.add_metric([*ids, code], n)
        yield appends
        entries = CounterMetricFamily("dledger_entries_appended", "Entries appended as leader", labels=base)
        entries.add_metric(ids, snap.entries_appended)
        yield entries
        changes = CounterMetricFamily("dledger_role_changes", "Role changes since start", labels=base)
        changes.add_metric(ids, snap.role_changes)
        yield changes
        for name, h in snap.histograms.items():
            fam = HistogramMetricFamily(name, _HELP[name], labels=base)
            fam.add_metric(ids, _buckets(h), h.sum)
            yield fam
        for name, per_peer in snap.peer_histograms.items():
            fam = HistogramMetricFamily(name, _HELP[name], labels=[*base, "remote_id"])
            for peer, h in sorted(per_peer.items()):
                fam.add_metric([*ids, peer], _buckets(h), h.sum)
            yield fam


_SCRUB = (
    ("passes", "Background scrub passes finished (every committed entry read back and verified)"),
    ("bytes", "Bytes of entries the scrub read back and verified"),
    ("entries", "Entries the scrub read back and verified"),
    ("damaged", "Damaged committed entries the scrub found"),
    ("repaired", "Damaged entries the scrub had rewritten from another member's intact copy"),
    ("unrepaired", "Damaged entries the scrub found that no member could supply an intact copy of (left as they are)"),
    ("read_errors", "Scrub reads that failed (the entries were not verified)"),
)


def _member_metrics(snap: Snapshot, base: list[str], ids: list[str]) -> Iterator:
    """``dledger_members{member,role}`` (1 per member of the configuration in force, issue #23), the
    configuration's entry index, and the learners the leader is to promote once they caught up."""
    members = GaugeMetricFamily("dledger_members", "1 per member of the configuration in force, with its role "
                                "(voter or learner)", labels=[*base, "member", "role"])
    pending = GaugeMetricFamily("dledger_member_promotion_pending", "1 per learner the leader promotes to voter "
                                "once it is within learnerPromoteLag entries", labels=[*base, "member"])
    for mid, role, promote in snap.members:
        members.add_metric([*ids, mid, role], 1)
        if promote:
            pending.add_metric([*ids, mid], 1)
    yield members
    yield pending
    g = GaugeMetricFamily("dledger_members_config_index", "Index of the entry of the configuration in force (0: "
                          "the bootstrap --peers)", labels=base)
    g.add_metric(ids, snap.config_index)
    yield g


def _scrub_metrics(stats: Any, base: list[str], ids: list[str]) -> Iterator:
    """``dledger_scrub_*``: what the background scrub (:mod:`dledger.store.scrub`) did since the member started."""
    for name, doc in _SCRUB:
        c = CounterMetricFamily(f"dledger_scrub_{name}", doc, labels=base)
        c.add_metric(ids, getattr(stats, name))
        yield c
    g = GaugeMetricFamily("dledger_scrub_last_pass_end_seconds", "When the last scrub pass ended (reactor time; 0: "
                          "none yet)", labels=base)
    g.add_metric(ids, stats.last_pass_end)
    yield g


def _buckets(h: Histogram) -> list[tuple[str, int]]:
    return [(floatToGoString(bound), n) for bound, n in h.cumulative()]


def make_registry(get_server: Callable[[], Any], reactor: Any, group: str, self_id: str, *,
                  plugin_manager: Any = None, use_plugins: bool = True) -> CollectorRegistry:
    """A registry of its own for one member (never the process-global one); plugins add families through
    ``dledger_metric_families`` unless ``use_plugins`` is false."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MemberCollector(get_server, reactor, group, self_id, plugin_manager, use_plugins))
    return registry


class QuietSite(Site):
    """A Site that writes no access-log line: Prometheus scrapes every few seconds, forever."""

    def log(self, request: Any) -> None:
        pass


class MetricsService(service.Service):
    """Serves ``registry`` as Prometheus text on a server endpoint string (``tcp:9108:interface=127.0.0.1``).

    With a ``status`` board (:class:`dledger.status.board.StatusBoard`; ``twistd dledger --metrics`` gives
    one) the same site serves the status page: ``/metrics`` is Prometheus, ``/``, ``/status`` and
    ``/status.json`` the page (:mod:`dledger.status.resource`), and the board samples while the
    service runs.  Without one, every path answers Prometheus text, as before.

    The port goes through the process's connection guard (:mod:`dledger.transport.listener`): at most
    ``limits.max_connections`` connections, the idle and read timeouts, request bodies over
    ``limits.max_body`` refused before they are buffered, and the descriptor budget shared with every
    other port -- so a flood of scrapers cannot take the descriptors the store needs.
    """

    name = "dledger-metrics"

    def __init__(self, endpoint: str, registry: CollectorRegistry, reactor: Any, limits: Any = None,
                 status: Any = None):
        from dledger.transport.listener import ListenerLimits

        self.endpoint = endpoint
        self.registry = registry
        self.status = status
        self.reactor = reactor
        self.limits = limits if limits is not None else ListenerLimits().for_http()
        self.guard: Any = None
        self.port = None
        #: Fires with the listening port once bound, or fails (the member service waits on it).
        self.listening: Deferred = Deferred()

    def startService(self) -> None:
        from prometheus_client.twisted import MetricsResource

        from dledger.transport.bounded_http import BoundedSite
        from dledger.transport.listener import ListenerGuard

        super().startService()
        root = MetricsResource(registry=self.registry)
        if self.status is not None:
            from dledger.status.resource import StatusRoot

            root = StatusRoot(root, self.status)
            self.status.start()
        site = BoundedSite(root, max_body=self.limits.max_body)
        self.guard = ListenerGuard("metrics port", self.limits, self.reactor)
        d = maybeDeferred(self.guard.listen, self.reactor, self.endpoint, site)

        def bound(port: Any) -> Any:
            self.port = port
            where = f"{port.getHost().host}:{port.getHost().port}"
            if self.status is not None:
                log.info("serving Prometheus metrics on http://{where}/metrics and the status page on "
                         "http://{where}/status", where=where)
            else:
                log.info("serving Prometheus metrics on http://{where}/metrics", where=where)
            self.listening.callback(port)

        def failed(f: Any) -> None:
            # The member reports it in one line (twistd dledger); the traceback is for --log-level debug.
            log.failure("cannot serve metrics on {endpoint}", f, endpoint=self.endpoint, level=LogLevel.debug)
            self.listening.errback(f)

        d.addCallbacks(bound, failed)

    def stopService(self) -> Deferred | None:
        super().stopService()
        if self.status is not None:
            self.status.stop()
        if self.guard is not None:
            self.guard.stop()
        port, self.port = self.port, None
        if port is not None:
            return maybeDeferred(port.stopListening)
        return None
