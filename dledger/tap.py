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
import errno
import gc
import os
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred, fail, gatherResults, maybeDeferred, succeed
from twisted.internet.endpoints import TCP4ServerEndpoint, TCP6ServerEndpoint, serverFromString
from twisted.internet.error import CannotListenError
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger, LogLevel
from twisted.python import usage

from dledger import logfilter, plugins
from dledger.config import FLUSH_POLICIES, PRESETS, DLedgerConfig, make_config
from dledger.diskio import BlockingIO
from dledger.errors import ConfigError, StoreError
from dledger.services import ServiceStartError

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
        ["snapshot-threshold", None, None, "entries applied between automatic snapshots of the state machines "
                                           "(snapshotThreshold; 0: only on demand; docs/snapshots.md)"],
        ["metrics", None, None, "serve Prometheus metrics (/metrics) and the status page (/status) on this server "
                                "endpoint, e.g. tcp:9108:interface=127.0.0.1"],
        ["log-level", None, "info", f"lowest level logged: {', '.join(logfilter.LEVELS)} (default info; debug also "
                                    "shows vote rounds, connection chatter and the traceback of a start-up error)"],
    ]

    optFlags = [
        ["truncate-damaged", None, "mmap store: let start-up recovery cut the log at damage it would otherwise "
                                   "refuse to cut (committed or verified entries after it are dropped and "
                                   "re-fetched from the leader); config option truncateDamaged"],
        ["adopt-store", None, "take over a store whose identity record names another group or member, and "
                              "rewrite the record (a deliberate move; see docs/operations.md)"],
        ["join", None, "join a running group (joinExisting): with an empty store, start as a learner of --peers "
                       "(the running members and this one) and wait for 'dledger members add' on the leader; "
                       "see docs/operations.md \"Growing a group\""],
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

    def getUsage(self, width: int | None = None) -> str:
        """The usage text, then every option installed plugins declare (name, type, default, help)."""
        return super().getUsage(width) + plugins.options_help()

    def postOptions(self) -> None:
        broken = plugins.broken_plugins(plugins.get_plugin_manager(report=False))
        if broken:  # a member must not run without a plugin it would normally load (its broker, its checks)
            raise usage.UsageError(broken[0].line().removeprefix("dledger: ").replace(
                "; left out:", "; a member does not start without it:"))
        for key, allowed in (("preset", tuple(PRESETS)), ("flush-policy", FLUSH_POLICIES),
                             ("log-level", tuple(logfilter.LEVELS))):
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
        parent = getattr(self, "parent", None)
        if parent is not None:  # under twistd: log at --log-level, without per-connection chatter
            logfilter.use_for_twistd(parent, logfilter.LEVELS[self["log-level"]])


_OPTION_TO_CONFIG = {
    "group": "group", "id": "self_id", "peers": "peers", "store": "store_type", "store-dir": "store_base_dir",
    "flush-policy": "flush_policy", "listen": "listen",
}


def build_config(options: Options) -> DLedgerConfig:
    """The member's config: preset, then the file, then the command line; plugins and extras checked."""
    overrides = {name: options[opt] for opt, name in _OPTION_TO_CONFIG.items() if options[opt] is not None}
    if options["truncate-damaged"]:
        overrides["truncate_damaged"] = True
    if options["adopt-store"]:
        overrides["adopt_store"] = True
    if options["join"]:
        overrides["join_existing"] = True
    if options["snapshot-threshold"] is not None:
        text = options["snapshot-threshold"]
        if not text.strip().isdigit():
            raise ConfigError(f"--snapshot-threshold: expected a whole number of entries (0: off), got {text!r}")
        overrides["snapshot_threshold"] = int(text)
    config = make_config(preset=options["preset"] or "default", file=options["config"], **overrides)
    extras = plugins.flatten_extras(config.extras)  # [plugins.<name>] tables as dotted names
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


def set_switch_interval(config: DLedgerConfig) -> None:
    """Let the member's threads take the GIL from a busy reactor thread after ``switchIntervalMs``.

    A flush round's ``fdatasync`` runs on a :class:`dledger.diskio.BlockingIO` worker without the GIL;
    when it returns while the reactor thread runs Python (reading and appending a batch of requests),
    the worker waits for the GIL until the reactor thread blocks in a syscall or the switch interval
    forces a hand-over: CPython's 5 ms, against an ``fdatasync`` of ~0.2 ms, and every request of
    that round waits with it.  A shorter interval bounds that wait; it costs a forced switch only
    when another thread wants the GIL, which in a member is rare.  The default stays CPython's 5 ms:
    1 ms bounded the wait in ``tools/bench_gil_handback`` but gave no end-to-end gain at 10,000/s in
    the quiet rerun (docs/benchmarks.md, "Round 2e: the lead's rerun after the merge").  The interval
    is per process: a member embedded in another program sets it for that program.
    """
    sys.setswitchinterval(config.switch_interval_ms / 1000.0)


#: Store types whose files live in ``member_dir``: its directory is checked before the store opens.
FILE_STORES = ("mmap", "lmdb")


class EndpointError(Exception):
    """An endpoint of the member cannot be bound (checked before the store is opened)."""

    def __init__(self, what: str, endpoint: str, cause: BaseException):
        self.what, self.endpoint, self.cause = what, endpoint, cause
        super().__init__(f"cannot listen on {endpoint} ({what}): {listen_reason(cause)}")


def listen_reason(exc: BaseException) -> str:
    """Why an endpoint could not be bound, in words: ``port 20911 is already in use (...)``."""
    if isinstance(exc, CannotListenError):
        err = exc.socketError
        code = getattr(err, "errno", None)
        if code == errno.EADDRINUSE:
            return (f"port {exc.port} is already in use (another member or process listens there; "
                    f"'ss -ltnp sport = :{exc.port}' shows which)")
        if code == errno.EADDRNOTAVAIL:
            return f"address {exc.interface!r} is not an address of this machine"
        if code == errno.EACCES:
            return f"permission denied for port {exc.port} (ports below 1024 need privileges)"
        return getattr(err, "strerror", None) or str(err)
    return str(exc)


def check_store_dir(path: Path) -> None:
    """Refuse, with one line, a store directory that cannot be used, before any file in it is opened.

    ``path`` is the member's directory (``<storeBaseDir>/dledger-<id>``); it need not exist yet, but then
    the nearest existing ancestor must be a writable directory (the store creates the rest).
    """
    if path.exists():
        if not path.is_dir():
            raise StoreError(f"store dir {path} is a regular file, not a directory (check storeBaseDir / --store-dir)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise StoreError(f"store dir {path} is not writable by this user (uid {os.getuid()}); "
                             f"fix its owner or permissions")
        return
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise StoreError(f"cannot create store dir {path}: {parent} is a regular file, not a directory "
                         f"(check storeBaseDir / --store-dir)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise StoreError(f"cannot create store dir {path}: {parent} is not writable by this user "
                         f"(uid {os.getuid()}); create it for this user or fix its permissions")


def probe_endpoint(reactor: Any, endpoint: str) -> Deferred:
    """Fires if server endpoint ``endpoint`` can be bound now, fails (CannotListenError) if not.

    A TCP endpoint is checked with a plain socket (bound the way Twisted binds, then closed, so no
    Twisted port lines are logged); any other endpoint is listened on and closed again.
    """
    ep = serverFromString(reactor, endpoint)
    if isinstance(ep, (TCP4ServerEndpoint, TCP6ServerEndpoint)):
        port, interface = ep._port, ep._interface
        if not port:
            return succeed(None)  # port 0: the system picks a free one
        family = socket.AF_INET6 if isinstance(ep, TCP6ServerEndpoint) else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((interface or ("::" if family == socket.AF_INET6 else ""), port))
            except OSError as exc:
                return fail(CannotListenError(interface, port, exc))
        return succeed(None)
    factory = Factory.forProtocol(Protocol)
    factory.noisy = False
    return ep.listen(factory).addCallback(lambda p: p.stopListening())


def start_error_line(exc: BaseException) -> str | None:
    """The one line an operator reads for a member that could not start; None for an unexpected error (a bug).

    Operator mistakes (a port in use, a bad store directory, a config or store refused with a message,
    any StoreError subclass) get one line; their traceback is logged at debug level only.
    """
    if isinstance(exc, ServiceStartError):
        inner = start_error_line(exc.cause)
        return f"plugin service {exc.service} failed to start: {inner}" if inner is not None else None
    if isinstance(exc, (ConfigError, StoreError, EndpointError)):
        return str(exc)
    if isinstance(exc, CannotListenError):
        return f"cannot listen on {exc.interface or '*'}:{exc.port}: {listen_reason(exc)}"
    if isinstance(exc, OSError) and exc.strerror:
        where = f" {exc.filename}" if exc.filename else ""
        return f"{exc.strerror}:{where}" if where else exc.strerror
    return None


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

    def forget_exit_status(self) -> None:
        """Do not set the process's exit status at reactor shutdown (it is set by default, for ``twistd``).

        For a member service run inside a longer-lived process -- a test, an application embedding it --
        whose exit status is not the member's.  Call it after :meth:`startService`.
        """
        if self._exit_trigger is not None:
            self.reactor.removeSystemEventTrigger(self._exit_trigger)
            self._exit_trigger = None

    def startService(self) -> None:
        super().startService()
        tune_gc()
        set_switch_interval(self.config)
        self._exit_trigger = self.reactor.addSystemEventTrigger("after", "shutdown", self._set_exit_status)
        cfg = self.config
        log.info("dledger {id}: starting (group {group}, store {store}, flush {flush})", id=cfg.self_id,
                 group=cfg.group, store=cfg.store_type, flush=cfg.flush_policy)
        # Every endpoint is bound (or found busy) before the store is opened or the group joined: a member
        # that cannot serve must not recover files or vote first.
        checks = [self._check_listen()]
        if self.metrics is not None:
            checks.append(self._check_metrics())
        d = gatherResults(checks, consumeErrors=True)
        d.addCallback(lambda _: self._start_member())
        d.addCallbacks(self._ready, self._start_failed)

    def _check_listen(self) -> Deferred:
        """Check that the member's server endpoint can be bound: EndpointError if it is taken."""
        cfg = self.config
        if cfg.transport_type != "tcp":
            return succeed(None)
        from dledger.transport.tcp import listen_endpoint_description

        endpoint = cfg.listen or listen_endpoint_description(cfg.self_peer)
        d = maybeDeferred(probe_endpoint, self.reactor, endpoint)

        def refused(f: Any) -> None:
            raise EndpointError("peers and clients", endpoint, f.value)

        return d.addErrback(refused)

    def _check_metrics(self) -> Deferred:
        """The metrics endpoint's binding (MetricsService starts first): EndpointError if it is taken."""
        endpoint = self.metrics.endpoint

        def refused(f: Any) -> None:
            raise EndpointError("metrics", endpoint, f.value)

        return self.metrics.listening.addErrback(refused)

    def _start_member(self) -> Deferred:
        from dledger.server import DLedgerServer
        from dledger.transport.outbox import send_written

        cfg = self.config
        if cfg.store_type in FILE_STORES:
            check_store_dir(cfg.member_dir)
        # A flush round's results reach the reactor between its polls: what they let the member send
        # (replies, answers) goes out at once, not after the next poll (dledger.transport.outbox).
        bio = BlockingIO(self.reactor, threaded=self.threaded_io, after_results=send_written)
        self.server = DLedgerServer.build(cfg, clock=self.reactor, blocking_io=bio)
        if self.metrics is not None:
            self.server.enable_stats()
        return maybeDeferred(self.server.start)

    def summary(self) -> str:
        """The one line an operator reads to know what this member is and where it serves."""
        cfg, server = self.config, self.server
        where = getattr(server.transport, "listening_address", None)
        listening = f"{where.host}:{where.port}" if where is not None else (cfg.listen or cfg.self_peer.address)
        if cfg.store_type == "memory":
            store = "memory (nothing survives a restart)"
        else:
            store = f"{cfg.store_type} in {cfg.member_dir} (flush {cfg.flush_policy})"
        from dledger.security.guard import security_label

        parts = [f"dledger member {cfg.self_id} of group {cfg.group} serving on {listening}{security_label(cfg)}",
                 f"peers {cfg.peers}", f"store {store}", f"preset {preset_label(cfg)}"]
        if self.metrics is not None and self.metrics.port is not None:
            host = self.metrics.port.getHost()
            parts.append(f"metrics http://{host.host}:{host.port}/metrics")
            if getattr(self.metrics, "status", None) is not None:
                parts.append(f"status http://{host.host}:{host.port}/status")
        st = server.store
        parts.append(f"log {st.ledger_begin_index}..{st.ledger_end_index} committed {st.committed_index} "
                     f"term {server.state.curr_term}")
        return "; ".join(parts)

    def _ready(self, _results: Any) -> None:
        from dledger.security.guard import open_port_warning

        log.info("{summary}", summary=self.summary())
        where = getattr(self.server.transport, "listening_address", None)
        address = f"{where.host}:{where.port}" if where is not None else (self.config.listen or
                                                                           self.config.self_peer.address)
        warning = open_port_warning(self.config, address)
        if warning is not None:
            log.warn("dledger {id}: {warning}", id=self.config.self_id, warning=warning)
        self.ready.callback(self)

    def _start_failed(self, failure: Any) -> None:
        err = failure.value.subFailure if hasattr(failure.value, "subFailure") else failure
        line = start_error_line(err.value)
        if line is None:  # not an operator mistake: the traceback is what a developer needs
            log.failure("dledger {id}: could not start; exiting with status 1", err, id=self.config.self_id)
        else:
            log.error("dledger {id}: could not start: {reason}; exiting with status 1", id=self.config.self_id,
                      reason=line)
            log.failure("dledger {id}: traceback of the start-up error", err, id=self.config.self_id,
                        level=LogLevel.debug)
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
        d.addBoth(self._stop_io)
        d.addCallbacks(self._stopped, self._stop_failed)
        return d

    def _stop_io(self, result: Any) -> Any:
        """The member is stopped (its store flushed and closed): let its BlockingIO's worker threads exit.

        Under ``twistd`` the reactor's shutdown would stop them a moment later anyway; a member run inside a
        longer-lived process (a test, an application) leaves no idle threads behind.
        """
        self.server.blocking_io.stop()
        return result

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
        from dledger.status.board import StatusBoard
        from dledger.transport.listener import FdBudget, ListenerLimits

        registry = make_registry(lambda: member.server, reactor, config.group, config.self_id)
        FdBudget.shared().reserve_at_least(config.fd_reserve)
        member.metrics = MetricsService(options["metrics"], registry, reactor,
                                        ListenerLimits.from_config(config).for_http(),
                                        status=StatusBoard(lambda: member.server, reactor))
        member.metrics.setServiceParent(top)
    member.setServiceParent(top)
    return top
