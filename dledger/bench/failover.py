"""The failover prober of ``dledger bench cluster``: SIGKILL the leader, time the next acknowledged append.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

from twisted.internet.defer import Deferred

from dledger.bench.load import pause
from dledger.bench.runner import progress
from dledger.bench.timeline import failover_trial
from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup

if TYPE_CHECKING:
    from dledger.bench.options import Options


# -- failover --------------------------------------------------------------------------------------
class Prober:
    """Appends continuously, one at a time, through a retrying client; remembers when each one succeeded."""

    def __init__(self, group: LocalGroup):
        self.group = group
        self.client = group.client(request_timeout=1.0, retry_delay=0.005, max_attempts=100_000)
        self.successes: list[float] = []
        self.answered_by: list[str | None] = []
        self.running = True
        self.done = Deferred.fromCoroutine(self._run())

    async def _run(self) -> None:
        n = 0
        while self.running:
            n += 1
            try:
                await self.client.append(f"probe {n}".encode())
                self.successes.append(self.group.reactor.seconds())
                self.answered_by.append(self.client.leader)
            except DLedgerError:
                await pause(self.group.reactor, 0.005)

    def first_success_after(self, t: float, not_by: str | None = None) -> float | None:
        first = None
        for s, by in zip(reversed(self.successes), reversed(self.answered_by)):
            if s <= t:
                break
            if by != not_by:
                first = s
        return first

    async def success_after(self, t: float, timeout: float, not_by: str | None = None) -> float:
        """When the first append after time ``t`` was acknowledged (by a leader other than ``not_by``)."""
        return await self.group.wait_for(lambda: self.first_success_after(t, not_by), timeout,
                                         "an acknowledged append", interval=0.002)

    async def stop(self) -> None:
        self.running = False
        await self.done
        await self.client.close()


async def measure_failover(reactor: Any, base: Path, opts: Options, preset: str) -> dict:
    group = LocalGroup(base / f"failover-{preset}", n=3, store=opts.store, preset=preset, flush_policy=opts.flush,
                       group=opts.group, reactor=reactor)
    admin = group.client(request_timeout=0.5)
    times: list[float] = []
    timelines: list[dict] = []
    prober = None
    try:
        await group.start_and_wait(30)
        prober = Prober(group)
        rng = random.Random(opts.seed)
        heartbeat = group.configs[group.ids[0]].heart_beat_time_interval_ms / 1000.0
        for trial in range(opts.trials):
            # A failure strikes at a random moment of the heartbeat cycle.  Without this pause the kill
            # would follow the catch-up of the previous trial, which completes just after a heartbeat
            # (a restarted member follows on its first heartbeat), and every trial would see the
            # longest detection time.
            await pause(reactor, heartbeat + rng.uniform(0, heartbeat))
            leader = (await group.wait_for_leader(admin, 60)).leader_id
            await prober.success_after(reactor.seconds(), 30)
            if prober.answered_by[-1] != leader:  # leadership moved meanwhile: look again
                leader = (await group.wait_for_leader(admin, 60)).leader_id
                await prober.success_after(reactor.seconds(), 30)
            progress(f"failover ({preset}): trial {trial + 1}/{opts.trials}: kill -9 leader {leader}")
            killed_at = reactor.seconds()
            group.kill(leader)
            ok = await prober.success_after(killed_at, 60, not_by=leader)
            times.append(ok - killed_at)
            await pause(reactor, 0.5)  # the timeline goes on a little past the recovery
            timelines.append({"killed": leader, **failover_trial(prober.successes, prober.answered_by, killed_at, ok,
                                                                 after=0.5)})
            progress(f"failover ({preset}): trial {trial + 1}: next append acknowledged after {times[-1]:.3f} s")
            group.start(leader)
            await group.wait_ready(admin, leader, 30)
            await _caught_up(group, admin, leader)
    finally:
        if prober is not None:
            await prober.stop()
        await admin.close()
        group.close()
    times_sorted = sorted(times)
    return {"preset": preset, "trials_s": times, "median_s": times_sorted[len(times_sorted) // 2] if times else None,
            "min_s": times_sorted[0] if times else None, "max_s": times_sorted[-1] if times else None,
            "timelines": timelines}


async def _caught_up(group: LocalGroup, client: Any, mid: str) -> None:
    async def check() -> bool:
        leader = await group.wait_for_leader(client, 30)
        me = await group.metadata(client, mid)
        lead = await group.metadata(client, leader.leader_id)
        return bool(me and lead and me.ledger_end_index >= lead.committed_index)

    await group.wait_for(check, 60, f"{mid} to catch up", interval=0.05)
