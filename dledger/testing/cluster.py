"""Whole dledger groups in one process, for testing applications built on dledger.

>>> from dledger.testing import Cluster
>>> cluster = Cluster(3, seed=1)          # 3 members, simulated clock and network
>>> cluster.start()
>>> leader = cluster.wait_for_leader()
>>> client = cluster.client()
>>> d = client.append(b"hello")
>>> cluster.run_until(lambda: d.called)
True

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

import random
from collections.abc import Callable

import pluggy

from dledger import plugins
from dledger.codes import Role
from dledger.config import make_config
from dledger.quorum import is_quorum
from dledger.server import DLedgerServer
from dledger.store.memory import MemoryTermVoteStore
from dledger.testing.clock import SimClock
from dledger.testing.simdisk import DEFAULT_FLUSH_LATENCY, SimulatedDisk, SimulatedIO
from dledger.transport.inprocess import FaultSettings, InProcessNetwork


class Cluster:
    """N members on one clock and one in-process network."""

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
        self.handlers = handlers
        #: ``commit_listeners(mid)`` -> ICommitListeners to add to member ``mid`` each time it is built.
        self.commit_listeners = commit_listeners
        self.tear_on_crash = tear_on_crash
        #: The pluggy manager members take their hooks, options and services from (None: the process-wide one).
        self.plugin_manager = plugin_manager
        self.servers: dict[str, DLedgerServer] = {}
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
            for listener in self.commit_listeners(mid) or ():
                server.add_commit_listener(listener)
        return server

    def start(self, *ids: str) -> None:
        """Start the given members (all by default)."""
        for mid in ids or self.ids:
            server = self.build(mid)
            self.servers[mid] = server
            self.down.discard(mid)
            server.start()

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
        followers = sum(1 for s in self.servers.values()
                        if s.state.curr_term == term and s.state.leader_id == lid)
        return lid if is_quorum(followers, len(self.ids)) else None

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
        """Advance time until ``predicate()`` holds (True) or ``timeout`` virtual seconds pass (False)."""
        end = self.clock.seconds() + timeout
        if isinstance(self.clock, SimClock):
            return self.clock.run_until(end, stop=predicate)
        while not predicate():
            if self.clock.seconds() >= end:
                return False
            self.clock.advance(0.001)
        return True

    def wait_for_leader(self, timeout: float = 60.0) -> str:
        """Run until a stable leader exists and return its id; AssertionError after ``timeout``."""
        if not self.run_until(lambda: self.stable_leader() is not None, timeout):
            raise AssertionError(f"no leader after {timeout}s: {[repr(s.state) for s in self.servers.values()]}")
        return self.stable_leader()

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
        """Append ``bodies`` through a client and run until every running member holds and committed them all.

        Returns the leader's id; AssertionError after ``timeout`` virtual seconds.  The common set-up of a
        test that needs a group with a committed log before it breaks something.
        """
        leader_id = self.wait_for_leader(timeout)
        client = self.client()
        ds = [client.append(body) for body in bodies]

        def done() -> bool:
            leader = self.servers.get(self.leader() or "")
            if leader is None or not all(d.called for d in ds):
                return False
            end = leader.store.ledger_end_index
            return all(s.store.ledger_end_index == end and s.store.committed_index == end
                       for s in self.servers.values())

        if not self.run_until(done, timeout):
            raise AssertionError(f"{len(ds)} appends not committed on every member within {timeout}s")
        return self.leader() or leader_id

    def committed_entries(self, mid: str) -> list:
        """Member ``mid``'s committed log (NOOPs included), for checks."""
        s = self.servers[mid]
        store = s.store
        if store.committed_index < 0 or store.ledger_begin_index < 0:
            return []
        return [store.get(i) for i in range(store.ledger_begin_index, store.committed_index + 1)]


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
