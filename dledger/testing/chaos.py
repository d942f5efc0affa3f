"""A seeded schedule of faults for a :class:`~dledger.testing.cluster.Cluster`: partitions, one-way
blocks, heals and crashes with restarts, at exponentially distributed intervals.

``crash_leader_quick`` is the fault of issue #29: the leader's machine dies (what its disk had not
flushed is lost) and it is back within a few milliseconds, before anyone else stood for election --
the window in which a restarted leader could win its own term again.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from dledger.quorum import majority
from dledger.transport.inprocess import FaultSettings


@dataclass(frozen=True)
class ChaosMix:
    """Relative weights of fault kinds and the timing of the schedule (seconds)."""

    partition: float = 0.3
    block: float = 0.15
    heal: float = 0.25
    crash_leader: float = 0.0
    crash: float = 0.3
    crash_leader_quick: float = 0.0
    #: A member's log and snapshots are erased and it restarts empty (issue #22: it returns by InstallSnapshot).
    wipe: float = 0.0
    #: A member takes a snapshot now (``dledger snapshot``), compacting its log.
    snapshot: float = 0.0
    mean_interval: float = 1.5
    restart_after: tuple[float, float] = (0.1, 2.0)
    quick_restart_after: tuple[float, float] = (0.0, 0.02)

    @classmethod
    def parse(cls, text: str, base: ChaosMix | None = None) -> ChaosMix:
        """``"partition=0.2,crash_leader_quick=0.4"`` over ``base`` (default: the class defaults).

        Weights and ``mean_interval`` are numbers; ``restart_after`` and ``quick_restart_after`` are
        ``low-high`` in seconds.  An unknown name or a bad number is a ValueError naming it.
        """
        from dataclasses import fields, replace
        known = {f.name for f in fields(cls)}
        changes: dict = {}
        for part in filter(None, (p.strip() for p in text.split(","))):
            name, eq, value = part.partition("=")
            name = name.strip()
            if not eq or name not in known:
                raise ValueError(f"unknown fault mix entry {part!r}: use name=value with a name out of "
                                 f"{', '.join(sorted(known))}")
            try:
                if name.endswith("restart_after"):
                    low, _, high = value.partition("-")
                    changes[name] = (float(low), float(high or low))
                else:
                    changes[name] = float(value)
            except ValueError:
                raise ValueError(f"fault mix entry {part!r}: {value!r} is not a number") from None
        return replace(base or cls(), **changes)


class Chaos:
    """Injects faults into a running cluster until :meth:`calm` is called."""

    def __init__(self, cluster, rng: random.Random, mix: ChaosMix = ChaosMix(), *, wiper=None, snapshotter=None):
        """``wiper(member) -> bool`` erases a crashed-now member's store (False: not now, nothing done);
        ``snapshotter(member)`` takes a snapshot on a running member.  Both are the simulation's own.
        """
        self.cluster = cluster
        self.wiper = wiper
        self.snapshotter = snapshotter
        self.wipes = 0
        self.snapshots = 0
        self.rng = rng
        self.mix = mix
        self.active = False
        self.faults = 0
        self.quick_restarts = 0  # leader crashes with a restart within quick_restart_after
        self.max_down = majority(len(cluster.ids))
        kinds = [(self._partition, mix.partition), (self._block, mix.block), (self._heal, mix.heal),
                 (self._crash_leader, mix.crash_leader), (self._crash_any, mix.crash),
                 (self._crash_leader_quick, mix.crash_leader_quick),
                 (self._wipe, mix.wipe if wiper is not None else 0.0),
                 (self._snapshot, mix.snapshot if snapshotter is not None else 0.0)]
        self._kinds = [k for k, w in kinds if w > 0]
        self._weights = [w for _, w in kinds if w > 0]

    def start(self, first_after: float) -> None:
        self.active = True
        self.cluster.clock.callLater(first_after, self._fault)

    def _fault(self) -> None:
        if not self.active:
            return
        self.faults += 1
        self.rng.choices(self._kinds, self._weights)[0]()
        self.cluster.clock.callLater(self.rng.expovariate(1 / self.mix.mean_interval), self._fault)

    def _partition(self) -> None:
        ids = list(self.cluster.ids)
        self.rng.shuffle(ids)
        cut = self.rng.randint(1, len(ids) - 1)
        self.cluster.partition(ids[:cut], ids[cut:])

    def _block(self) -> None:
        ids = self.cluster.ids
        self.cluster.network.block(self.rng.choice(ids), self.rng.choice(ids))

    def _heal(self) -> None:
        self.cluster.heal()

    def _crash_leader(self) -> None:
        leader = self.cluster.leader()
        if leader is not None:
            self.crash(leader)

    def _crash_any(self) -> None:
        self.crash(self.rng.choice(self.cluster.ids))

    def _crash_leader_quick(self) -> None:
        leader = self.cluster.leader()
        if leader is not None:
            self.crash(leader, restart_after=self.mix.quick_restart_after)
            self.quick_restarts += 1

    def _wipe(self, member: str | None = None, tries: int = 10) -> None:
        """Wipe a member (the simulation's ``wiper`` may say "not now": then try again shortly, a few times)."""
        member = member or self.rng.choice(self.cluster.ids)
        if not self.active or member not in self.cluster.servers:
            return
        if self.wiper(member):
            self.wipes += 1
            self.cluster.clock.callLater(self.rng.uniform(*self.mix.restart_after), self._restart, member)
        elif tries > 1:
            self.cluster.clock.callLater(0.05, self._wipe, member, tries - 1)

    def _snapshot(self) -> None:
        member = self.rng.choice(self.cluster.ids)
        if member in self.cluster.servers:
            self.snapshots += 1
            self.snapshotter(member)

    def crash(self, member: str, restart_after: tuple[float, float] | None = None) -> None:
        """Crash ``member`` now (if up and the schedule allows another member down) and restart it later."""
        cluster = self.cluster
        if self.active and member in cluster.servers and len(cluster.down) < self.max_down:
            cluster.crash(member)
            self.faults += 1
            cluster.clock.callLater(self.rng.uniform(*(restart_after or self.mix.restart_after)), self._restart,
                                    member)

    def _restart(self, member: str) -> None:
        if self.active and member in self.cluster.down:
            self.cluster.restart(member)

    def calm(self) -> None:
        """Stop injecting faults, heal the network, clear message faults and restart every crashed member."""
        self.active = False
        cluster = self.cluster
        cluster.heal()
        cluster.network.faults = FaultSettings()
        for member in list(cluster.down):
            cluster.restart(member)
