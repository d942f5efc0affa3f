"""``twistd dledger``: run one member of a group as a Twisted service.

    twistd -n dledger --config etc/dledger.toml
    twistd -n dledger --group g0 --id n0 --peers 'n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913' \\
        --store mmap --store-dir /var/lib/dledger --metrics tcp:9108:interface=127.0.0.1

Options on the command line override the config file, which overrides the
preset.  :func:`makeService` returns a ``MultiService`` holding a
:class:`MemberService` (and a :class:`~dledger.metrics.MetricsService` with
``--metrics``).  Once the member serves, it logs one summary line starting
with ``dledger member``.  SIGTERM (or SIGINT) stops it: pending appends are
answered, the store is flushed and closed, and twistd exits 0; a member that
cannot start, or cannot flush on the way down, exits 1.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import sys
from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred, fail, gatherResults, maybeDeferred
from twisted.internet.endpoints import serverFromString
from twisted.logger import Logger
from twisted.python import usage

from dledger import plugins
from dledger.config import FLUSH_POLICIES, PRESETS, DLedgerConfig, make_config
from dledger.diskio import BlockingIO
from dledger.errors import ConfigError, StoreError

log = Logger()


class Options(usage.Options):
    """Command-line options of ``twistd dledger``."""

    synopsis = "[--config FILE] [--group G --id ID --peers PEERS] [options]"
    longdesc = ("Run one member of a dledger group (a Raft-replicated commit log, DLedger-compatible). "
                "Options override --config FILE, which overrides --preset. See docs/operations.md.")

    optParameters = [
        ["config", "c", None, "TOML config file (etc/dledger.toml is a commented sample)"],
        ["group", "g", None, "group name (the same on every member)"],
        ["id", "i", None, "this member's id (selfId), one of the ids in --peers"],
        ["peers", "p", None, "every member as 'id-host:port' separated by ';' (the same on every member)"],
        ["store", None, None, "store type: memory, mmap or lmdb (what is installed; default: memory)"],
        ["store-dir", None, None, "storeBaseDir: files go to <store-dir>/dledger-<id>/"],
        ["preset", None, None, f"timer preset applied first: {' or '.join(PRESETS)}"],
        ["flush-policy", None, None, "sync (fsync before acknowledging, default) or async (Java's behaviour)"],
        ["listen", None, None, "server endpoint for peers and clients (default tcp:<own port>:interface=<own host>)"],
        ["metrics", None, None, "serve Prometheus metrics on this server endpoint, e.g. tcp:9108:interface=127.0.0.1"],
    ]

    optFlags = [
        ["adopt-store", None, "take over a store whose identity record names another group or member, and "
                              "rewrite the record (a deliberate move; see docs/operations.md)"],
    ]

    def __init__(self) -> None:
        super().__init__()
        self["plugin_opts"] = {}
        self.config: DLedgerConfig | None = None

    def opt_plugin_opt(self, value: str) -> None:
        """Plugin option as name=value (repeatable); overrides the config file's [plugins] table."""
        name, eq, val = value.partition("=")
        if not eq or not name.strip():
            raise usage.UsageError(f"--plugin-opt: expected name=value, got {value!r}")
        self["plugin_opts"][name.strip()] = val.strip()

    def postOptions(self) -> None:
        for key, allowed in (("preset", tuple(PRESETS)), ("flush-policy", FLUSH_POLICIES)):
            if self[key] is not None and self[key] not in allowed:
                raise usage.UsageError(f"--{key}: {self[key]!r} is not one of {', '.join(allowed)}")
        if self["store"] is not None:
            known = plugins.store_types()
            if self["store"] not in known:
                raise usage.UsageError(f"--store: {self['store']!r} is not an installed store type "
                                       f"(installed: {', '.join(sorted(known))})")
        for key in ("listen", "metrics"):
            if self[key]:
                try:
                    serverFromString(None, self[key])
                except (ValueError, KeyError, TypeError) as exc:
                    raise usage.UsageError(f"--{key}: bad endpoint {self[key]!r}: {exc}") from None
        try:
            self.config = build_config(self)
        except ConfigError as exc:
            raise usage.UsageError(str(exc)) from None


_OPTION_TO_CONFIG = {
    "group": "group", "id": "self_id", "peers": "peers", "store": "store_type", "store-dir": "store_base_dir",
    "flush-policy": "flush_policy", "listen": "listen",
}


def build_config(options: Options) -> DLedgerConfig:
    """The member's config: preset, then the file, then the command line; plugins and extras checked."""
    overrides = {name: options[opt] for opt, name in _OPTION_TO_CONFIG.items() if options[opt] is not None}
    if options["adopt-store"]:
        overrides["adopt_store"] = True
    config = make_config(preset=options["preset"] or "default", file=options["config"], **overrides)
    extras = dict(config.extras)
    extras.update(options["plugin_opts"])
    resolved = plugins.resolve_extras(extras)
    plugins.get_store_type(config.store_type)
    plugins.get_transport_type(config.transport_type)
    return config.replace(extras=resolved)


def preset_label(config: DLedgerConfig) -> str:
    """Which preset the config's timers match (``fast``, ``default``) or ``custom``, with the heartbeat."""
    timers = PRESETS["fast"]
    defaults = {f.name: f.default for f in dataclasses.fields(DLedgerConfig)}
    if all(getattr(config, k) == v for k, v in timers.items()):
        name = "fast"
    elif all(getattr(config, k) == defaults[k] for k in timers):
        name = "default"
    else:
        name = "custom"
    return (f"{name} (heartbeat {config.heart_beat_time_interval_ms} ms, "
            f"vote {config.min_vote_interval_ms}-{config.max_vote_interval_ms} ms)")


def tune_gc() -> None:
    """Make the cyclic garbage collector run rarely and skip what start-up allocated.

    A busy member allocates a few objects per entry (entries, requests, replies, Deferreds), almost
    none of them in reference cycles, and keeps thousands of recent entries alive for pushes; with
    CPython's default thresholds the collector walks them every few hundred allocations, about a
    tenth of the leader's CPU per one-entry append (docs/benchmarks.md).  Cycles are still
    collected, only later; start-up objects (modules, config) are frozen out of every collection.
    """
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


class MemberService(service.Service):
    """Builds the member's :class:`~dledger.server.DLedgerServer` on start and stops it (flushed) on stop."""

    name = "dledger-member"

    def __init__(self, config: DLedgerConfig, reactor: Any, *, metrics: Any = None, threaded_io: bool = True):
        self.config = config
        self.reactor = reactor
        self.metrics = metrics
        self.threaded_io = threaded_io
        self.server = None
        self.exit_status = 0
        self.stopped_cleanly = False
        self._exit_trigger = None
        #: Fires once the member serves (after the summary line), or fails if it could not start.
        self.ready: Deferred = Deferred()

    def startService(self) -> None:
        from dledger.server import DLedgerServer

        super().startService()
        tune_gc()
        self._exit_trigger = self.reactor.addSystemEventTrigger("after", "shutdown", self._set_exit_status)
        cfg = self.config
        bio = BlockingIO(self.reactor, threaded=self.threaded_io)
        log.info("dledger {id}: starting (group {group}, store {store}, flush {flush})", id=cfg.self_id,
                 group=cfg.group, store=cfg.store_type, flush=cfg.flush_policy)
        try:
            self.server = DLedgerServer.build(cfg, clock=self.reactor, blocking_io=bio)
            if self.metrics is not None:
                self.server.enable_stats()
            started = maybeDeferred(self.server.start)
        except Exception:
            started = fail()
        waits = [started] + ([self.metrics.listening] if self.metrics is not None else [])
        d = gatherResults(waits, consumeErrors=True)
        d.addCallbacks(self._ready, self._start_failed)

    def summary(self) -> str:
        """The one line an operator reads to know what this member is and where it serves."""
        cfg, server = self.config, self.server
        where = getattr(server.transport, "listening_address", None)
        listening = f"{where.host}:{where.port}" if where is not None else (cfg.listen or cfg.self_peer.address)
        if cfg.store_type == "memory":
            store = "memory (nothing survives a restart)"
        else:
            store = f"{cfg.store_type} in {cfg.member_dir} (flush {cfg.flush_policy})"
        parts = [f"dledger member {cfg.self_id} of group {cfg.group} serving on {listening}",
                 f"peers {cfg.peers}", f"store {store}", f"preset {preset_label(cfg)}"]
        if self.metrics is not None and self.metrics.port is not None:
            host = self.metrics.port.getHost()
            parts.append(f"metrics http://{host.host}:{host.port}/metrics")
        st = server.store
        parts.append(f"log {st.ledger_begin_index}..{st.ledger_end_index} committed {st.committed_index} "
                     f"term {server.state.curr_term}")
        return "; ".join(parts)

    def _ready(self, _results: Any) -> None:
        log.info("{summary}", summary=self.summary())
        self.ready.callback(self)

    def _start_failed(self, failure: Any) -> None:
        err = failure.value.subFailure if hasattr(failure.value, "subFailure") else failure
        if isinstance(err.value, StoreError):
            # An operator's mistake (store in use, another member's store, lost term/vote): one line, no
            # traceback (twistd shows every level; wt/ops adds --log-level and the debug traceback).
            log.error("dledger {id}: could not start: {reason}; exiting with status 1", id=self.config.self_id,
                      reason=str(err.value))
        else:
            log.failure("dledger {id}: could not start; exiting with status 1", err, id=self.config.self_id)
        self.exit_status = 1
        self.ready.errback(err)
        self.ready.addErrback(lambda f: None)
        if self.reactor.running:
            self.reactor.stop()
        else:
            self.reactor.callWhenRunning(self.reactor.stop)

    def stopService(self) -> Deferred | None:
        super().stopService()
        server = self.server
        if server is None or not server.running:
            return None
        log.info("dledger {id}: stopping: answering pending appends, flushing and closing the store",
                 id=self.config.self_id)
        d = server.stop()
        d.addCallbacks(self._stopped, self._stop_failed)
        return d

    def _stopped(self, _: Any) -> None:
        self.stopped_cleanly = True
        st = self.server.store
        log.info("dledger {id}: stopped cleanly (log {b}..{e}, committed {c})", id=self.config.self_id,
                 b=st.ledger_begin_index, e=st.ledger_end_index, c=st.committed_index)

    def _stop_failed(self, failure: Any) -> None:
        log.failure("dledger {id}: stopping failed; exiting with status 1", failure, id=self.config.self_id)
        self.exit_status = 1

    def _set_exit_status(self) -> None:
        """twistd re-raises the signal that stopped it; a member that stopped cleanly exits 0 instead, and 1 on error.

        Runs after the reactor shut down (every service stopped, the store flushed).
        """
        if self.exit_status:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(self.exit_status)
        if self.stopped_cleanly and getattr(self.reactor, "_exitSignal", None) in (signal.SIGTERM, signal.SIGINT):
            self.reactor._exitSignal = None


def makeService(options: Options) -> service.MultiService:
    """The ``twistd dledger`` service: the member, plus the metrics endpoint with ``--metrics``."""
    from twisted.internet import reactor

    config = options.config if options.config is not None else build_config(options)
    top = service.MultiService()
    member = MemberService(config, reactor)
    if options["metrics"]:
        from dledger.metrics import MetricsService, make_registry

        registry = make_registry(lambda: member.server, reactor, config.group, config.self_id)
        member.metrics = MetricsService(options["metrics"], registry, reactor)
        member.metrics.setServiceParent(top)
    member.setServiceParent(top)
    return top
