"""The simulator's snapshot mode (issue #22): snapshots, compaction, wipes and InstallSnapshot under faults."""

import os

import pytest

from dledger.testing.chaos import ChaosMix
from dledger.testing.replication_sim import SNAPSHOT_MIX, run_replication_seed

#: A bounded number in ``make test``; the 10,000-seed run is ``python -m tools.simulate replication --snapshots``.
SNAPSHOT_SIM_SEEDS = int(os.environ.get("DLEDGER_SNAPSHOT_SIM_SEEDS", "8"))


def test_snapshot_schedules_are_safe():
    """Seeded schedules with snapshots, compaction, wipes and crashes: nothing lost, every machine = the log."""
    results = [run_replication_seed(seed, snapshots=True, duration=2.0) for seed in range(SNAPSHOT_SIM_SEEDS)]
    bad = [r for r in results if not r.ok]
    assert not bad, (f"replay with: python -m tools.simulate replication --snapshots --duration 2 --seed "
                     f"{bad[0].seed}\n" + "\n".join(bad[0].problems()[:10]))
    assert sum(r.acked for r in results) > 20 * SNAPSHOT_SIM_SEEDS
    assert sum(r.wipes for r in results) > 0 and sum(r.installs for r in results) > 0  # the path was taken


def test_wipes_return_through_install_snapshot():
    """With wipes and snapshots as the main faults, wiped members come back by InstallSnapshot, states agree."""
    mix = ChaosMix(heal=0.2, crash=0.1, wipe=0.5, snapshot=0.5, mean_interval=0.3, restart_after=(0.05, 0.3))
    results = [run_replication_seed(seed, snapshots=True, duration=2.0, mix=mix, members=3) for seed in range(4)]
    bad = [r for r in results if not r.ok]
    assert not bad, "\n".join(bad[0].problems()[:10])
    assert sum(r.installs for r in results) >= 2


def test_state_check_can_fail():
    """The machine check is not vacuous: a member whose machine skipped an entry is reported."""
    from dledger.testing.checker import CommittedLog
    from dledger.testing.replication_sim import _state_mismatches
    from dledger.testing.statemachine import DictMachine

    log = CommittedLog()
    for i, body in enumerate([b"", b"a=1", b"b=2", b"a=3"]):
        log.observe("n0", i, 1, body)
    good, skipped = DictMachine(), DictMachine()

    class E:
        def __init__(self, index, body):
            self.index, self.body = index, body

    good.apply([E(1, b"a=1"), E(2, b"b=2"), E(3, b"a=3")])
    skipped.apply([E(1, b"a=1"), E(3, b"a=3")])
    assert _state_mismatches({"n0": (3, good.state())}, log) == []
    assert len(_state_mismatches({"n0": (3, skipped.state())}, log)) == 1
    assert "never seen committed" in _state_mismatches({"n0": (5, good.state())}, log)[0]


@pytest.mark.parametrize("store", ["mmap"])
def test_snapshot_mode_needs_simulated_disks(store):
    """Snapshot mode is refused on real stores with a clear error (they cannot be wiped between runs)."""
    with pytest.raises(ValueError, match="simdisk"):
        run_replication_seed(0, snapshots=True, store=store)
    assert SNAPSHOT_MIX.wipe > 0 and SNAPSHOT_MIX.snapshot > 0
