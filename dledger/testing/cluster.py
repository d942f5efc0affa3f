"""Whole dledger groups in one process, for testing applications built on dledger.

>>> from dledger.testing import Cluster
>>> cluster = Cluster(3, seed=1)          # 3 members, simulated clock and network
>>> cluster.start()
>>> leader = cluster.wait_for_leader()
>>> client = cluster.client()
>>> d = client.append(b"hello")
>>> cluster.wait_until(lambda: d.called, what="the append")   # AssertionError if it never happens
True
>>> cluster.wait_applied()          # every member committed it and its commit listeners applied it
1

Time is virtual (:class:`dledger.testing.clock.SimClock`, or any
``IReactorTime`` you pass, e.g. ``task.Clock``) -- or real: pass
``clock=reactor`` and wait with the Deferred-returning :meth:`Cluster.when`
and :meth:`Cluster.leader_elected`.  The network is an
:class:`InProcessNetwork` that can partition, drop, delay, duplicate and
reorder.  Each member's log lives on a :class:`SimulatedDisk` by default, so
``crash(id)`` loses what was not flushed, like a power cut (a flush takes a
few virtual milliseconds, ``flush_latency``, as an ``fdatasync`` does); pass
``store_factory`` to use another store.  Members run every registered
plugin (hooks, option defaults, services) like ``twistd dledger`` members;
pass ``plugin_manager`` to use a manager of your own, and plugin options as
``extras={"myplugin.port": 1}``.
"""

from __future__ import annotations

import atexit
import inspect
import itertools
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import pluggy
from twisted.python.failure import Failure

from dledger import plugins
from dledger.codes import Role
from dledger.config import make_config
from dledger.quorum import is_quorum
from dledger.server import DLedgerServer
from dledger.store.memory import MemoryTermVoteStore
from dledger.testing.clock import SimClock
from dledger.testing.simdisk import DEFAULT_FLUSH_LATENCY, SimulatedDisk, SimulatedIO
from dledger.transport.inprocess import FaultSettings, InProcessNetwork

#: Store directories of clusters made without ``store_base_dir`` (created only if a member writes there, e.g.
#: the snapshots of its state machines); removed when the process exits.
_CLUSTER_DIRS: list[str] = []
_cluster_seq = itertools.count()


def _remove_cluster_dirs() -> None:
    for d in _CLUSTER_DIRS:
        shutil.rmtree(d, ignore_errors=True)


atexit.register(_remove_cluster_dirs)


def _private_store_dir() -> str:
    """A store base directory of this cluster alone (not created here): snapshots never meet another test's."""
    d = os.path.join(tempfile.gettempdir(), f"dledger-cluster-{os.getpid()}-{next(_cluster_seq)}")
    _CLUSTER_DIRS.append(d)
    return d


class Cluster:
    """N members on one clock and one in-process network.

    Without ``store_base_dir`` the members' directories (their snapshots, if they run state machines)
    are in a private temporary directory, removed when the process exits.
    """

    def __init__(self, n: int = 3, *, seed: int = 0, clock=None, preset: str = "fast", group: str = "g0",
                 faults: FaultSettings | None = None, store_factory: Callable | None = None,
                 handlers: Callable | None = None, ids: list[str] | None = None, tear_on_crash: bool = True,
                 flush_latency=DEFAULT_FLUSH_LATENCY, term_write_latency=0.0, plugin_manager=None,
                 commit_listeners: Callable | None = None, **options):
        self.clock = clock if clock is not None else SimClock()
        self.seed = seed
        self.rng = random.Random(seed)
        self.network = InProcessNetwork(self.clock, seed=self.rng.randrange(1 << 30), faults=faults)
        self.ids = ids or [f"n{i}" for i in range(n)]
        peers = ";".join(f"{mid}-127.0.0.1:{20911 + k}" for k, mid in enumerate(self.ids))
        if "store_base_dir" not in options and "storeBaseDir" not in options:
            options["store_base_dir"] = _private_store_dir()
        self._preset, self._group, self._options = preset, group, options
        self.configs = {mid: make_config(preset=preset, group=group, self_id=mid, peers=peers,
                                         store_type="memory", transport_type="inprocess", **options)
                        for mid in self.ids}
        self.term_stores = {mid: MemoryTermVoteStore() for mid in self.ids}
        #: How long a simulated disk's flush takes (seconds, a ``(low, high)`` range, or 0: durable at once).
        self.flush_latency = flush_latency
        self.disks = {mid: self._new_disk(mid) for mid in self.ids}
        #: How long a term/vote write takes (0: inline, the default); members' writes then go through a
        #: :class:`SimulatedIO` that a crash may interrupt before or after the write lands.
        self.term_write_latency = term_write_latency
        self.term_io: dict[str, SimulatedIO] = {}
        self.store_factory = store_factory
        #: ``handlers(mid, server)`` -> role-change handlers to add to member ``mid`` each time it is built.
        self.handlers = handlers
        #: ``commit_listeners(mid)`` or ``commit_listeners(mid, server)`` -> ICommitListeners to add to member
        #: ``mid`` each time it is built (so again after a restart, when they replay from ``start_index()``).
        self.commit_listeners = commit_listeners
        self.tear_on_crash = tear_on_crash
        #: The pluggy manager members take their hooks, options and services from (None: the process-wide one).
        self.plugin_manager = plugin_manager
        #: The running members: id -> :class:`~dledger.server.DLedgerServer` (a crashed member is not here).
        self.servers: dict[str, DLedgerServer] = {}
        #: Ids of crashed (or never started) members that :meth:`crash` took down.
        self.down: set[str] = set()
        self._clients = 0

    def _new_disk(self, mid: str) -> SimulatedDisk:
        cfg = self.configs[mid]
        return SimulatedDisk(cfg.mapped_file_size_for_entry_data, cfg.max_entry_size, clock=self.clock,
                             flush_latency=self.flush_latency,
                             rng=random.Random(f"{self.seed}/{mid}/disk"))  # its own stream: member draws unchanged

    # -- members -------------------------------------------------------------------------
    def build(self, mid: str) -> DLedgerServer:
        """Member ``mid`` built (plugins attached, handlers and listeners added) but not started or tracked.

        :meth:`start` builds and starts; this is for tests of what happens at start (e.g. a plugin
        service that fails to start).
        """
        config = self.configs[mid]
        if self.store_factory is not None:
            store = lambda cfg, state: self.store_factory(mid, cfg, state)
        else:
            store = lambda cfg, state: self.disks[mid].open(state)
        io = None
        if self.term_write_latency:
            io = self.term_io[mid] = SimulatedIO(self.clock, self.term_write_latency,
                                                 random.Random(f"{self.seed}/{mid}/term-io"))
        server = DLedgerServer.build(config, clock=self.clock, store=store, term_store=self.term_stores[mid],
                                     transport=self.network.transport(mid),
                                     rng=random.Random(self.rng.randrange(1 << 30)),
                                     plugin_manager=self.plugin_manager, blocking_io=io)
        if self.handlers is not None:
            for handler in self.handlers(mid, server) or ():
                server.add_role_change_handler(handler)
        if self.commit_listeners is not None:
            for listener in _call_with_server(self.commit_listeners, mid, server) or ():
                server.add_commit_listener(listener)
        return server

    def start(self, *ids: str) -> None:
        """Start the given members (all by default)."""
        for mid in ids or self.ids:
            server = self.build(mid)
            self.servers[mid] = server
            self.down.discard(mid)
            server.start()

    def address(self, mid: str) -> str:
        """The ``host:port`` member ``mid`` has (or, for a member not built yet, would have) in this cluster."""
        if mid in self.configs:
            return self.configs[mid].self_peer.address
        return f"127.0.0.1:{20911 + len(self.ids)}"

    def add_member(self, mid: str, *, join: bool = True, start: bool = True, **options) -> str:
        """A new member ``mid`` in the network, with its own empty store (issue #23); returns its address.

        Its ``--peers`` are the group's configuration in force (the leader's, else the original ids) plus
        itself; with ``join`` (``joinExisting``) it is a learner of that bootstrap and never campaigns
        before the group's log makes it a voter.  It is only started (``start``): making it a member is
        the group's business -- :meth:`change` with ``Change(Op.ADD, mid, address)``.
        """
        if mid in self.configs:
            raise ValueError(f"{mid} is already a member of this cluster")
        address = self.address(mid)
        lid = self.leader()
        known = self.servers[lid].membership.configuration.addresses if lid is not None else \
            {m: self.address(m) for m in self.ids}
        peers = ";".join(f"{m}-{a}" for m, a in {**known, mid: address}.items())
        self.configs[mid] = make_config(preset=self._preset, group=self._group, self_id=mid, peers=peers,
                                        store_type="memory", transport_type="inprocess", join_existing=join,
                                        **{**self._options, **options})
        self.ids.append(mid)
        self.term_stores[mid] = MemoryTermVoteStore()
        self.disks[mid] = self._new_disk(mid)
        if start:
            self.start(mid)
        return address

    def change(self, change, timeout: float = 60.0):
        """Propose ``change`` (a :class:`dledger.membership.rules.Change`) on the stable leader and run until it
        is committed; returns the new configuration (AssertionError with the refusal if it is refused)."""
        lid = self.wait_for_leader(timeout)
        results: list = []
        self.servers[lid].membership.propose(change).addBoth(results.append)
        self.wait_until(lambda: results, timeout, f"configuration change {change.describe()}")
        if isinstance(results[0], Failure):
            raise AssertionError(f"{change.describe()}: {results[0].getErrorMessage()}")
        return results[0]

    def configuration(self, mid: str | None = None):
        """The configuration in force on ``mid`` (the leader by default)."""
        mid = mid or self.leader()
        return self.servers[mid].membership.configuration

    def members(self) -> list[str]:
        """The running members the leader's configuration holds (every running member without a leader)."""
        lid = self.leader()
        if lid is None:
            return list(self.servers)
        ids = self.servers[lid].membership.configuration.ids
        return [m for m in self.servers if m in ids]

    def crash(self, mid: str) -> None:
        """Kill a member as a power cut would: timers stop, unflushed data may be lost or torn."""
        server = self.servers.pop(mid)
        server.crash()
        self.network.crash(mid)
        if mid in self.term_io:
            self.term_io.pop(mid).crash()
        if self.store_factory is None:
            self.disks[mid].crash(self.rng, tear=self.tear_on_crash)
        elif hasattr(server.store, "abandon"):
            server.store.abandon()  # a file store keeps what reached the page cache, like a killed process
        self.down.add(mid)

    def wipe(self, mid: str) -> None:
        """Crash ``mid`` and give it an empty store and term/vote record, as ``rm -rf`` of its store dir would.

        (Simulated disks only: a cluster built with ``store_factory`` owns its own files.)
        """
        if self.store_factory is not None:
            raise ValueError("wipe() needs the cluster's simulated disks (no store_factory)")
        if mid in self.servers:
            self.crash(mid)
        self.disks[mid] = self._new_disk(mid)
        self.term_stores[mid] = MemoryTermVoteStore()

    def restart(self, mid: str) -> None:
        """Start a crashed member again from its durable state."""
        if mid in self.servers:
            raise ValueError(f"{mid} is running")
        self.start(mid)

    def stop(self):
        """Stop every member cleanly (flushing); returns a Deferred that fires when all have stopped."""
        from twisted.internet.defer import gatherResults
        stopping = [self.servers.pop(mid).stop() for mid in list(self.servers)]
        d = gatherResults(stopping, consumeErrors=True)
        d.addBoth(lambda r: (self.network.close(), r)[1])
        return d

    # -- network ---------------------------------------------------------------------------
    def partition(self, *groups) -> None:
        self.network.partition(*groups)

    def isolate(self, mid: str) -> None:
        self.network.isolate(mid)

    def heal(self) -> None:
        self.network.heal()

    def pause(self, mid: str) -> None:
        """Freeze ``mid`` as a stopped (SIGSTOP) process: cut off from the others and its election timers frozen.

        It keeps believing what it believed (a paused leader still thinks it leads); requests delivered
        to it directly are still handled, as a process resumed later would handle them.
        """
        self.network.isolate(mid)
        self.servers[mid].elector.pause()

    # -- observation -------------------------------------------------------------------------
    def leaders(self) -> list[tuple[str, int]]:
        """``(id, term)`` of every running member that believes it leads."""
        return [(mid, s.state.curr_term) for mid, s in self.servers.items() if s.state.role is Role.LEADER]

    def leader(self) -> str | None:
        """The leader of the highest term among running members, if one leads."""
        leaders = self.leaders()
        if not leaders:
            return None
        return max(leaders, key=lambda lt: lt[1])[0]

    def stable_leader(self) -> str | None:
        """A leader that a quorum of running members follow in its term."""
        lid = self.leader()
        if lid is None:
            return None
        term = self.servers[lid].state.curr_term
        voters = self.servers[lid].membership.configuration.voters
        followers = sum(1 for mid, s in self.servers.items()
                        if mid in voters and s.state.curr_term == term and s.state.leader_id == lid)
        return lid if is_quorum(followers, len(voters)) else None

    # -- time -------------------------------------------------------------------------------------
    def run(self, seconds: float) -> None:
        """Let virtual time pass."""
        if isinstance(self.clock, SimClock):
            self.clock.run_until(self.clock.seconds() + seconds)
        else:
            end = self.clock.seconds() + seconds
            while self.clock.seconds() < end:
                self.clock.advance(min(0.001, end - self.clock.seconds()))

    def run_until(self, predicate: Callable[[], bool], timeout: float = 60.0) -> bool:
        """Advance time until ``predicate()`` holds (True) or ``timeout`` virtual seconds pass (False).

        It does **not** raise on timeout: ``assert cluster.run_until(...)``, or use :meth:`wait_until`, which
        raises.  (A bare ``cluster.run_until(...)`` whose result is ignored lets a test go on, and maybe
        pass, after the thing it waited for never happened.)
        """
        end = self.clock.seconds() + timeout
        if isinstance(self.clock, SimClock):
            return self.clock.run_until(end, stop=predicate)
        while not predicate():
            if self.clock.seconds() >= end:
                return False
            self.clock.advance(0.001)
        return True

    def wait_until(self, predicate: Callable[[], Any], timeout: float = 60.0, what: str | None = None) -> Any:
        """Advance time until ``predicate()`` returns something truthy, which is returned; AssertionError otherwise.

        The raising twin of :meth:`run_until`: after ``timeout`` virtual seconds it fails with
        ``<what> not within <timeout>s (virtual time)`` and every running member's state.
        """
        value = None

        def check() -> bool:
            nonlocal value
            value = predicate()
            return bool(value)

        if not self.run_until(check, timeout):
            raise AssertionError(f"{what or 'condition'} not within {timeout:g}s (virtual time); "
                                 f"members: {self.describe()}")
        return value

    def describe(self) -> str:
        """Every member in one line (role, term, log end, committed index, listeners caught up), for failures."""
        parts = []
        for mid in self.ids:
            s = self.servers.get(mid)
            if s is None:
                parts.append(f"{mid} down")
                continue
            st = s.store
            parts.append(f"{mid} {s.state.role.name} term={s.state.curr_term} end={st.ledger_end_index} "
                         f"commit={st.committed_index} applied={'yes' if s.commit_feed.caught_up() else 'no'}")
        return "; ".join(parts)

    def wait_for_leader(self, timeout: float = 60.0) -> str:
        """Run until a stable leader exists and return its id; AssertionError after ``timeout``."""
        if not self.run_until(lambda: self.stable_leader() is not None, timeout):
            raise AssertionError(f"no leader after {timeout}s: {[repr(s.state) for s in self.servers.values()]}")
        return self.stable_leader()

    def wait_applied(self, timeout: float = 60.0, ids: Iterable[str] | None = None) -> int:
        """A barrier: run until everything the leader holds is committed and applied on every running member.

        Waits until a stable leader exists and each member of ``ids`` (every running member by default)
        holds the leader's whole log, has committed all of it, and its commit listeners (a plugin's, or
        those given as ``commit_listeners=``) were handed every committed entry and finished with it
        (:meth:`dledger.commit_feed.CommitFeed.caught_up`; a restarted member replays from its
        listeners' ``start_index()`` first).  Returns the committed index; AssertionError naming each
        member's state after ``timeout`` virtual seconds.  hashicorp/raft's ``Barrier`` is the model:
        call it before reading an application's state on several members.
        """
        members = list(ids) if ids is not None else None

        def applied() -> int | None:
            leader = self.servers.get(self.stable_leader() or "")
            if leader is None:
                return None
            end = leader.store.ledger_end_index
            for mid in members if members is not None else self.members():
                s = self.servers.get(mid)
                if s is None or s.store.ledger_end_index != end or s.store.committed_index != end \
                        or not s.commit_feed.caught_up() or not s.snapshots.caught_up():
                    return None
            return end + 1  # truthy even for index 0; turned back below

        return self.wait_until(applied, timeout, "every member committed and applied the leader's log") - 1

    def converged(self, timeout: float = 60.0, ids: Iterable[str] | None = None) -> list:
        """:meth:`wait_applied`, then check that the members' committed logs are identical (hashicorp's ``EnsureSame``).

        Returns the common committed log (NOOPs left out, as commit listeners see it); AssertionError naming
        the first index where two members differ (term or body) -- a safety bug, or a test that wrote
        to a member's store behind the group's back.
        """
        self.wait_applied(timeout, ids)
        members = list(ids) if ids is not None else self.members()
        logs = {mid: self.committed_entries(mid) for mid in members}
        first = members[0]
        for mid in members[1:]:
            for a, b in zip(logs[first], logs[mid]):
                if (a.index, a.term, a.body) != (b.index, b.term, b.body):
                    raise AssertionError(f"{first} and {mid} differ at index {a.index}: term {a.term} "
                                         f"{a.body[:40]!r} vs index {b.index} term {b.term} {b.body[:40]!r}")
            if len(logs[first]) != len(logs[mid]):
                raise AssertionError(f"{first} committed {len(logs[first])} entries, {mid} {len(logs[mid])}")
        return [e for e in logs[first] if not e.is_control]

    def when(self, predicate: Callable[[], bool], timeout: float = 30.0, interval: float = 0.01):
        """A Deferred that fires once ``predicate()`` holds, for clusters on the real reactor.

        Fails with ``TimeoutError`` after ``timeout`` seconds.  (On a virtual
        clock use :meth:`run_until`, which advances time itself.)
        """
        from twisted.internet.defer import Deferred
        from twisted.internet.task import LoopingCall

        d: Deferred = Deferred()
        deadline = self.clock.seconds() + timeout

        def check():
            if predicate():
                loop.stop()
                d.callback(True)
            elif self.clock.seconds() >= deadline:
                loop.stop()
                d.errback(TimeoutError(f"condition not met within {timeout}s"))

        loop = LoopingCall(check)
        loop.clock = self.clock
        loop.start(interval, now=True)
        return d

    def leader_elected(self, timeout: float = 30.0):
        """Deferred firing with the stable leader's id (real reactor)."""
        return self.when(lambda: self.stable_leader() is not None, timeout).addCallback(
            lambda _: self.stable_leader())

    # -- clients -------------------------------------------------------------------------------
    def client(self, name: str | None = None, **kw):
        """A :class:`dledger.client.DLedgerClient` on this cluster's network."""
        from dledger.client import DLedgerClient
        self._clients += 1
        name = name or f"client{self._clients}"
        transport = self.network.transport(name)
        config = self.configs[self.ids[0]]
        return DLedgerClient(transport, config.group, list(self.ids), clock=self.clock, **kw)

    def append_committed(self, bodies, timeout: float = 60.0) -> str:
        """Append ``bodies`` in order through one client, then :meth:`wait_applied`; returns the leader's id.

        Each body is appended once the previous one was acknowledged, so the log holds them in the order
        given (appends sent together may be stored in any order), and on return every running member
        has committed them and its commit listeners have applied them.  AssertionError after ``timeout``
        virtual seconds (a refused append fails with its error).  The common set-up of a test that needs
        a group with a committed log before it breaks something.
        """
        self.wait_for_leader(timeout)
        client = self.client()
        results: list = []
        pending = list(bodies)
        count = len(pending)

        def next_append(_=None) -> None:
            if pending:
                d = client.append(pending.pop(0))
                d.addCallbacks(lambda r: (results.append(r), next_append()), results.append)

        next_append()
        self.wait_until(lambda: len(results) == count or any(isinstance(r, Failure) for r in results), timeout,
                        f"{count} appends acknowledged")
        for r in results:
            if isinstance(r, Failure):
                r.raiseException()
        self.wait_applied(timeout)
        return self.stable_leader()

    def committed_entries(self, mid: str, *, noops: bool = True) -> list:
        """Member ``mid``'s committed log, for checks: :class:`~dledger.entry.Entry` objects in index order.

        NOOPs (the empty entry each new leader appends to start its term) are included unless
        ``noops=False``; commit listeners and reads through the client never see them.
        """
        s = self.servers[mid]
        store = s.store
        if store.committed_index < 0 or store.ledger_begin_index < 0:
            return []
        entries = [store.get(i) for i in range(store.ledger_begin_index, store.committed_index + 1)]
        return entries if noops else [e for e in entries if not e.is_control]


def _call_with_server(factory: Callable, mid: str, server: DLedgerServer):
    """``factory(mid, server)`` if it takes two arguments, else ``factory(mid)`` (``commit_listeners=`` takes both)."""
    try:
        inspect.signature(factory).bind(mid, server)
    except TypeError:
        return factory(mid)
    except ValueError:  # no signature to inspect (a builtin): the documented one-argument form
        return factory(mid)
    return factory(mid, server)


def isolated_plugin_manager(*extra) -> pluggy.PluginManager:
    """A plugin manager with dledger's own plugins and ``extra`` only, whatever else is installed.

    Entry points of other distributions (say an installed dledger-rocketmq) are not even imported, so
    a test's answers (options declared, stores known, hooks called) do not depend on the machine.
    Pass it as ``Cluster(plugin_manager=...)``.
    """
    pm = plugins.make_plugin_manager(distributions={"dledger"})
    for plugin in extra:
        pm.register(plugin)
    pm.check_pending()
    return pm
