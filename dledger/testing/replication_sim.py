"""Seeded replication simulation: clients append and read while the network and disks misbehave.

Each schedule runs a group on a :class:`SimClock` with an
:class:`InProcessNetwork` (partitions, one-way blocks, loss, duplication,
delay and reordering) and :class:`SimulatedDisk` stores (crashes lose or tear
unflushed writes).  Clients record every invocation and completion.  After a
quiet period in which everything heals, the run is checked for lost and
divergent entries, two leaders in a term and non-linearizable histories (see
:mod:`dledger.testing.checker`).

``python -m tools.simulate replication --seeds 10000`` runs many schedules;
a failing seed replays exactly with ``--seed N``.
"""

from __future__ import annotations

import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from dledger.errors import DLedgerError
from dledger.testing.chaos import Chaos, ChaosMix
from dledger.testing.checker import CommittedLog, History, linearizability_violations, lost_appends
from dledger.testing.clock import SimClock
from dledger.testing.configcheck import MembershipChecker, committed_sequence, sequence_problems
from dledger.testing.election_sim import ElectionChecker, checked_cluster
from dledger.testing.membership_sim import Changer, ChangeStats, MembershipProbe, final_members, membership_converged
from dledger.testing.outsider import Outsider
from dledger.testing.simdisk import DEFAULT_FLUSH_LATENCY
from dledger.testing.statemachine import DictMachine
from dledger.transport.inprocess import FaultSettings


@dataclass
class SimResult:
    seed: int
    members: int
    faults: int = 0
    appends: int = 0
    acked: int = 0
    gets: int = 0
    lost: list[str] = field(default_factory=list)
    divergent: list[str] = field(default_factory=list)
    nonlinearizable: list[str] = field(default_factory=list)
    leaders: list[str] = field(default_factory=list)
    #: outsider fault (issue #13): forged frames injected, and what any of them changed (must stay empty)
    forged: int = 0
    #: leader crashes with a restart within a few milliseconds (ChaosMix.crash_leader_quick)
    quick_restarts: int = 0
    outsider_effects: list[str] = field(default_factory=list)
    stuck: str | None = None
    #: snapshot mode (issue #22): wipes done, snapshots asked for, InstallSnapshots completed, snapshots taken
    wipes: int = 0
    snapshot_faults: int = 0
    installs: int = 0
    snapshots_taken: int = 0
    #: a member's state machine differs from the committed log fed to a fresh one (must stay empty)
    state_mismatch: list[str] = field(default_factory=list)
    #: membership mode (issue #23): what the change schedule did, and the membership checks' findings
    changes: ChangeStats | None = None
    config_commits: int = 0  # configuration entries committed (the final sequence's length)
    decisions: int = 0  # commit decisions and election wins checked against the configurations
    non_voter_votes: int = 0  # votes granted by members whose own log did not make them voters (allowed)
    membership: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.divergent or self.nonlinearizable or self.leaders or self.stuck
                    or self.outsider_effects or self.state_mismatch or self.membership)

    def problems(self) -> list[str]:
        """Every finding, the rarest kinds first (a stuck member's lagging log makes many 'lost' lines)."""
        out = [f"leaders: {x}" for x in self.leaders] + [f"membership: {x}" for x in self.membership]
        out += [f"divergent: {x}" for x in self.divergent] + [f"nonlinearizable: {x}" for x in self.nonlinearizable]
        out += [f"outsider: {x}" for x in self.outsider_effects]
        out += [f"state: {x}" for x in self.state_mismatch]
        if self.stuck:
            out.append(f"stuck: {self.stuck}")
        return out + [f"lost: {x}" for x in self.lost]


def _watch_commits(cluster, committed: CommittedLog, held: dict[str, int], problems: list[str]) -> None:
    """Record every entry each member commits; check a member still holds what it committed before."""
    original = cluster.build

    def make(mid):
        server = original(mid)
        store = server.store
        startup = store.startup

        def started(store=store, mid=mid, startup=startup):
            startup()
            floor = held.get(mid, -1)
            if store.ledger_end_index < floor:
                problems.append(f"{mid} restarted with log end {store.ledger_end_index} but had committed {floor}")
            for i in range(max(store.ledger_begin_index, 0), min(floor, store.ledger_end_index) + 1):
                e = store.get(i)
                committed.observe(mid, i, e.term, e.body)

        store.startup = started
        update = store.update_committed_index

        def watched(term, index, store=store, mid=mid, update=update):
            before = store.committed_index
            update(term, index)
            for i in range(max(before + 1, store.ledger_begin_index), store.committed_index + 1):
                e = store.get(i)
                committed.observe(mid, i, e.term, e.body)
            held[mid] = max(held.get(mid, -1), store.committed_index)

        store.update_committed_index = watched
        return server

    cluster.build = make


STORES = ("simdisk", "mmap", "lmdb")


def file_store_factory(kind: str, root: Path, clock) -> Callable:
    """Members on real mmap or LMDB stores in ``root`` with tiny files, so files roll and reset constantly.

    A crash abandons the store (what reached the page cache survives, as after a SIGKILL).
    """
    from dledger.store.lmdbstore import LmdbLogStore
    from dledger.store.mmapfile import MmapLogStore

    def factory(mid, config, state):
        if kind == "mmap":
            return MmapLogStore(root / f"dledger-{mid}", state, data_file_size=4096, index_file_size=1024,
                                clock=clock, disk_usage=lambda: 0.1)
        return LmdbLogStore(root / f"dledger-{mid}" / "lmdb", state, data_file_size=4096, map_size=1 << 20,
                            clock=clock)
    return factory


#: The replication soak's fault mix: leader crashes, with quick restarts among them (issue #29).
REPLICATION_MIX = ChaosMix(partition=0.25, block=0.1, heal=0.25, crash_leader=0.1, crash=0.3,
                           crash_leader_quick=0.15, mean_interval=0.8, restart_after=(0.05, 1.5))


#: The snapshot soak's fault mix (issue #22): the replication mix plus wiped members (they return through
#: InstallSnapshot) and snapshots on demand; with crashes, some land in the middle of a snapshot being
#: written, a transfer, or an install.
SNAPSHOT_MIX = ChaosMix(partition=0.2, block=0.1, heal=0.25, crash_leader=0.1, crash=0.3, crash_leader_quick=0.1,
                        wipe=0.25, snapshot=0.35, mean_interval=0.6, restart_after=(0.05, 1.5))
#: Virtual seconds a snapshot file operation takes in snapshot mode (so a crash can interrupt one).
SNAPSHOT_IO_LATENCY = (0.0005, 0.004)


def run_replication_seed(seed: int, duration: float = 8.0, members: int | None = None,
                         clients: int = 3, store: str = "simdisk", outsider: str | None = None, *,
                         mix: ChaosMix | None = None, flush_latency=DEFAULT_FLUSH_LATENCY,
                         tear: bool = True, term_write_latency=0.0, snapshots: bool = False,
                         membership: bool = False) -> SimResult:
    """One seeded schedule; the result lists every safety problem found (empty lists when safe).

    ``store`` is ``simdisk`` (crashes lose or tear unflushed writes; a flush takes ``flush_latency``
    virtual seconds, 0 for at once; ``tear`` False loses the whole unflushed tail) or a real
    ``mmap``/``lmdb`` store in a temporary directory.  ``outsider`` (``auth`` or ``bounds``) adds the
    outsider fault of :mod:`dledger.testing.outsider`: forged frames without credentials.  ``mix``
    replaces the fault mix (:data:`REPLICATION_MIX`); ``term_write_latency`` makes term/vote writes take
    virtual time (a crash may interrupt them).

    ``snapshots`` (issue #22): every member runs a :class:`~dledger.testing.statemachine.DictMachine`,
    takes snapshots (by threshold and on demand) and compacts its log; members are wiped and come back
    through InstallSnapshot (:data:`SNAPSHOT_MIX`); snapshot file I/O takes virtual time, so crashes land
    in the middle of snapshots, transfers and installs.  Every member's machine is then checked against
    the committed log (``state_mismatch``).

    ``membership`` (issue #23): the leader is asked, at random, to add, promote, remove and replace
    members (:class:`~dledger.testing.membership_sim.Changer`); every commit decision and election is
    checked against the configurations (:mod:`dledger.testing.configcheck`), and the committed
    configurations must form one single-server sequence (``membership``).
    """
    if store not in STORES:
        raise ValueError(f"store must be one of {STORES}")
    if snapshots and store != "simdisk":
        raise ValueError("snapshot mode runs on simulated disks (store=simdisk)")
    if membership and (snapshots or store != "simdisk"):
        raise ValueError("membership mode runs on simulated disks without snapshots (store=simdisk)")
    opts = dict(mix=mix or (SNAPSHOT_MIX if snapshots else REPLICATION_MIX), flush_latency=flush_latency, tear=tear,
                term_write_latency=term_write_latency or (SNAPSHOT_IO_LATENCY if snapshots else 0.0),
                snapshots=snapshots)
    if membership:
        opts["membership"] = True
    if snapshots:
        with tempfile.TemporaryDirectory(prefix=f"dledger-snap-sim-{seed}-") as root:
            return _run(seed, duration, members, clients, None, store, outsider, snapshot_root=Path(root), **opts)
    if store != "simdisk":
        with tempfile.TemporaryDirectory(prefix=f"dledger-sim-{seed}-") as root:
            return _run(seed, duration, members, clients, Path(root), store, outsider, **opts)
    return _run(seed, duration, members, clients, None, store, outsider, **opts)


def _run(seed, duration, members, clients, root, store, outsider=None, *, mix, flush_latency, tear,
         term_write_latency, snapshots=False, snapshot_root: Path | None = None, membership=False) -> SimResult:
    rng = random.Random(seed)
    n = members or rng.choice([3, 3, 5])
    result = SimResult(seed, n)
    checker = ElectionChecker()
    faults = FaultSettings(min_delay=0.0002, max_delay=rng.choice([0.001, 0.005, 0.03]),
                           loss=rng.choice([0.0, 0.01, 0.05]), duplicate=rng.choice([0.0, 0.02, 0.1]))
    clock = SimClock()
    factory = file_store_factory(store, root, clock) if root is not None else None
    machines: dict[str, DictMachine] = {}
    extra = {}
    if snapshots:  # drawn only in snapshot mode, so the other modes' seeds replay as before
        extra = dict(store_base_dir=str(snapshot_root), snapshot_threshold=rng.choice([0, 15, 40, 100]),
                     snapshot_threshold_bytes=0, trailing_entries=rng.choice([0, 0, 3, 20]),
                     snapshot_chunk_size=1024, snapshot_file_size=4096, handlers=_machines(machines))
    cluster = checked_cluster(n, seed, checker, faults=faults, max_pending_requests_num=200,
                              max_batch_push_size=rng.choice([512, 4096, 65536]),
                              enable_batch_push=rng.random() < 0.8, clock=clock, store_factory=factory,
                              flush_latency=flush_latency, tear_on_crash=tear,
                              term_write_latency=term_write_latency, **extra)
    committed = CommittedLog()
    held: dict[str, int] = {}
    restart_problems: list[str] = []
    _watch_commits(cluster, committed, held, restart_problems)
    history = History()
    wiper = snapshotter = None
    if snapshots:
        wiper = _wiper(cluster, held)
        snapshotter = _snapshotter(cluster, result)
        _count_installs(cluster, result)
    chaos = Chaos(cluster, rng, mix, wiper=wiper, snapshotter=snapshotter)
    changer = probe = None
    if membership:  # its own random stream: the schedule above draws exactly as in the other modes
        probe = MembershipProbe(cluster, checker, MembershipChecker())
        result.changes = ChangeStats()
        changer = Changer(cluster, random.Random(f"{seed}/membership"), result.changes)

    intruder = Outsider(cluster, random.Random(seed ^ 0x0A5), outsider) if outsider else None

    def outsider_loop():
        if chaos.active:
            intruder.inject()
            clock.callLater(rng.expovariate(1 / 0.3), outsider_loop)

    # -- clients ------------------------------------------------------------------
    counter = [0]

    def client_loop(name, client):
        if not chaos.active:
            return
        if rng.random() < 0.75:
            counter[0] += 1
            body = f"{seed}:{name}:{counter[0]}".encode()
            if snapshots:  # key=value bodies: the machines' state (and so each snapshot) grows to several chunks
                body = f"k{counter[0] % 150}={'v' * 24}{body.decode()}".encode()
            op = history.invoke("append", name, clock.seconds(), body=body)
            result.appends += 1
            d = client.append(body)
            d.addCallbacks(lambda resp, op=op: History.complete(op, clock.seconds(), ok=True, index=resp.index),
                           lambda f, op=op: History.complete(op, clock.seconds(), ok=False, error=_code(f)))
        else:
            top = max(committed.entries, default=0)
            index = rng.randint(max(0, top - 5), top + 3)
            op = history.invoke("get", name, clock.seconds(), index=index)
            result.gets += 1
            d = client.get(index, 1)

            def got(entries, op=op, index=index):
                hit = [e for e in entries if e.index == index]
                if hit:
                    History.complete(op, clock.seconds(), ok=True, result=hit[0].body)
                else:
                    History.complete(op, clock.seconds(), ok=False, error="NOOP_OR_SKIPPED")

            d.addCallbacks(got, lambda f, op=op: History.complete(op, clock.seconds(), ok=False, error=_code(f)))
        d.addBoth(lambda _r: clock.callLater(rng.expovariate(1 / 0.02), client_loop, name, client))

    try:
        cluster.start()
        for k in range(clients):
            client = cluster.client(f"c{k}", at_least_once=rng.random() < 0.5, request_timeout=0.5, max_attempts=5)
            clock.callLater(rng.uniform(0, 0.3), client_loop, f"c{k}", client)
        chaos.start(rng.uniform(0.2, 1.0))
        if changer is not None:
            changer.start(changer.rng.uniform(0.3, 1.0))
        if intruder is not None:
            clock.callLater(rng.uniform(0.1, 0.5), outsider_loop)
        cluster.run(duration)
        chaos.calm()
        if changer is not None:
            changer.calm()
        converged = _converged if changer is None else membership_converged
        pending = [op for op in history.ops if op.completed is None]
        if not cluster.run_until(lambda: all(op.completed is not None for op in pending)
                                 and converged(cluster), 60):
            result.stuck = _describe(cluster, history)
    finally:
        logs = {mid: cluster.committed_entries(mid) for mid in cluster.ids if mid in cluster.servers}
        if probe is not None:
            every_log = dict(logs)
            members = final_members(cluster)
            logs = {mid: entries for mid, entries in logs.items() if mid in members}
        states = {mid: (cluster.servers[mid].snapshots.applied_index, machines[mid].state())
                  for mid in cluster.servers if mid in machines}
        for mid in list(cluster.servers):
            cluster.crash(mid)

    # -- checks ---------------------------------------------------------------------
    result.faults = chaos.faults
    result.quick_restarts = chaos.quick_restarts
    result.wipes = chaos.wipes
    result.snapshot_faults = chaos.snapshots
    if intruder is not None:
        result.forged = intruder.injected
        result.outsider_effects = intruder.effects
    result.acked = len(history.acked)
    result.leaders = list(checker.violations)
    result.divergent = committed.divergences + restart_problems
    if snapshots:
        # A compacted member's log starts late: below its first index, what it committed is what the group
        # committed (checked by ``divergent``), and its state machine must be exactly that prefix applied.
        observed = committed.bodies()
        for mid, entries in logs.items():
            begin = entries[0].index if entries else len(observed)
            logs[mid] = [_Seen(i, observed[i]) for i in range(begin) if i in observed] + list(entries)
        result.state_mismatch = _state_mismatches(states, committed)
    result.lost = lost_appends(history, logs)
    final = {}
    for entries in logs.values():
        for e in entries:
            prev = final.setdefault(e.index, e.body)
            if prev != e.body:
                result.divergent.append(f"final logs differ at {e.index}")
    result.nonlinearizable = linearizability_violations(history, final)
    if probe is not None:
        base = MembershipProbe.base_of(cluster.configs[cluster.ids[0]])
        result.membership = probe.checker.problems + sequence_problems(every_log, base)
        result.config_commits = len(committed_sequence(every_log))
        result.decisions = probe.checker.commits + probe.checker.wins
        result.non_voter_votes = probe.checker.votes_by_non_voters
    return result


def _code(failure) -> str:
    exc = failure.value
    return exc.code.name if isinstance(exc, DLedgerError) else type(exc).__name__


def _converged(cluster) -> bool:
    leader = cluster.stable_leader()
    if leader is None:
        return False
    target = cluster.servers[leader].store
    if target.committed_index < target.ledger_end_index:
        return False
    return all(s.store.committed_index == target.committed_index for s in cluster.servers.values())


def _describe(cluster, history) -> str:
    states = ", ".join(f"{mid}: {s.state.role.name} t{s.state.curr_term} end={s.store.ledger_end_index} "
                       f"commit={s.store.committed_index}" for mid, s in sorted(cluster.servers.items()))
    pending = sum(1 for op in history.ops if op.completed is None)
    return f"no convergence after healing ({states}; {pending} ops pending)"




# -- snapshot mode (issue #22) ---------------------------------------------------------------------

@dataclass
class _Seen:
    """An entry of the committed log known from an earlier observation (a compacted member no longer has it)."""

    index: int
    body: bytes


def _machines(machines: dict[str, DictMachine]) -> Callable:
    """The ``handlers=`` hook that gives every member (each incarnation) a fresh DictMachine."""

    def add(mid, server):
        machine = machines[mid] = DictMachine(piece=700)
        server.add_state_machine(machine)
        return []

    return add


def _wiper(cluster, held: dict[str, int]) -> Callable[[str], bool]:
    """Erase a member's log and snapshots (its term/vote record stays), if no entry is lost by it.

    A wiped member's acknowledgements are gone; the rest of the group must still hold, durably, every
    entry anyone holds, or a quorum including the empty member could elect a leader without a committed
    entry (Raft's rule that a member never forgets what it acknowledged).  So a wipe happens only while
    every member is up and every other member has flushed the longest log in the group.
    """

    def wipe(mid: str) -> bool:
        if cluster.down or mid not in cluster.servers:
            return False
        longest = max(s.store.ledger_end_index for s in cluster.servers.values())
        if any(s.store.flushed_index < longest for m, s in cluster.servers.items() if m != mid):
            return False
        term_store = cluster.term_stores[mid]
        cluster.wipe(mid)
        cluster.term_stores[mid] = term_store  # the vote it cast is not forgotten (no double vote)
        shutil.rmtree(cluster.configs[mid].member_dir / "snapshot", ignore_errors=True)
        held[mid] = -1
        return True

    return wipe


def _snapshotter(cluster, result: SimResult) -> Callable[[str], None]:
    def take(mid: str) -> None:
        def taken(_manifest):
            result.snapshots_taken += 1

        machines = cluster.servers[mid].snapshots
        newest = machines.snapshot_store.newest()
        if machines.applied_index > (newest.index if newest is not None else -1):  # else nothing new to take
            machines.take().addCallbacks(taken, lambda _f: None)

    return take


def _count_installs(cluster, result: SimResult) -> None:
    """Count completed InstallSnapshots (each member incarnation's receiver reports them)."""
    original = cluster.build

    def make(mid):
        server = original(mid)
        installed = server.snapshot_receive.on_installed

        def counted(index, term, leader, installed=installed):
            result.installs += 1
            installed(index, term, leader)

        server.snapshot_receive.on_installed = counted
        return server

    cluster.build = make


def _state_mismatches(states: dict[str, tuple[int, dict]], committed: CommittedLog) -> list[str]:
    """Members whose machine is not the committed log up to their applied index, fed to a fresh machine."""
    out = []
    for mid, (applied, state) in sorted(states.items()):
        missing = [i for i in range(applied + 1) if i not in committed.entries]
        if missing:
            out.append(f"{mid} applied up to {applied} but index {missing[0]} was never seen committed")
            continue
        fresh = DictMachine()
        fresh.apply([_Applied(i, committed.entries[i][1]) for i in range(applied + 1) if committed.entries[i][1]])
        want = fresh.state()
        want["last"] = state["last"] if applied >= 0 and state["last"] <= applied else want["last"]
        if {k: v for k, v in state.items() if k != "last"} != {k: v for k, v in want.items() if k != "last"}:
            out.append(f"{mid}: machine after index {applied} holds {state['count']} entries (digest "
                       f"{state['digest']:#x}), the committed log {want['count']} (digest {want['digest']:#x})")
    return out


@dataclass
class _Applied:
    index: int
    body: bytes
