"""The pure snapshot decisions (dledger.snapshot.rules), one table each."""

import pytest

from dledger.snapshot import rules
from dledger.snapshot.rules import RestoreAction


@pytest.mark.parametrize("applied, last, bytes_since, threshold, threshold_bytes, due", [
    (-1, -1, 0, 10, 0, False),          # nothing applied
    (9, -1, 0, 10, 0, True),            # 10 entries (0..9) since no snapshot
    (8, -1, 0, 10, 0, False),
    (100, 95, 0, 10, 0, False),         # 5 since the last
    (105, 95, 0, 10, 0, True),
    (105, 95, 0, 0, 0, False),          # both off
    (96, 95, 1000, 0, 1000, True),      # bytes reached
    (96, 95, 999, 0, 1000, False),
    (95, 95, 10 ** 9, 10, 1, False),    # nothing new since the snapshot, whatever the bytes
    (96, 95, 10, 1, 0, True),           # threshold 1: every entry
])
def test_snapshot_due(applied, last, bytes_since, threshold, threshold_bytes, due):
    """A snapshot is due after snapshotThreshold entries or snapshotThresholdBytes bytes, never with nothing new."""
    assert rules.snapshot_due(applied, last, bytes_since, threshold, threshold_bytes) is due


@pytest.mark.parametrize("snap, trailing, committed, peers_ok, limit", [
    (1000, 100, 1200, True, 900),       # keep trailingEntries below the snapshot
    (1000, 0, 1200, True, 1000),        # keeps the snapshot's own entry at least
    (1000, 100, 500, True, 501),        # never past the committed index (+1)
    (1000, 2000, 1200, True, None),     # trailing reaches below 0: nothing goes
    (1000, 1000, 1200, True, None),     # limit 0: nothing below index 0
    (1000, 100, 1200, False, None),     # a Java peer: never compact
    (-1, 0, 10, True, None),            # no snapshot
])
def test_compact_limit(snap, trailing, committed, peers_ok, limit):
    """What the log may lose after a snapshot: below snapshot - trailingEntries, committed, no Java peer."""
    assert rules.compact_limit(snap, trailing, committed, peers_ok) == limit


@pytest.mark.parametrize("snaps, begin, end, machines, action, index, reset, skipped", [
    ([], -1, -1, True, RestoreAction.FRESH, -1, False, ()),                   # new member
    ([], 0, 50, True, RestoreAction.FRESH, -1, False, ()),                    # whole log kept
    ([(40, True)], 0, 50, True, RestoreAction.RESTORE, 40, False, ()),
    ([(40, True)], 30, 50, True, RestoreAction.RESTORE, 40, False, ()),       # compacted below the snapshot
    ([(40, True)], 41, 50, True, RestoreAction.RESTORE, 40, False, ()),       # log continues right after it
    ([(40, True)], 42, 50, True, RestoreAction.REFUSE, -1, False, ()),        # a gap: entry 41 missing
    ([(40, True)], -1, -1, True, RestoreAction.RESTORE, 40, True, ()),        # empty log: reset to the snapshot
    ([(40, True)], 30, 35, True, RestoreAction.RESTORE, 40, True, ()),        # log ends before it (lost tail)
    ([(60, False), (40, True)], 30, 70, True, RestoreAction.RESTORE, 40, False, (60,)),  # damaged: previous
    ([(60, False), (40, False)], 0, 70, True, RestoreAction.FRESH, -1, False, (60, 40)),  # none, log from 0
    ([(60, False), (40, False)], 30, 70, True, RestoreAction.REFUSE, -1, False, (60, 40)),
    ([(60, True)], 30, 70, False, RestoreAction.FRESH, -1, False, ()),        # no machine: nothing to restore
    ([], 30, 70, True, RestoreAction.REFUSE, -1, False, ()),
])
def test_restore_plan(snaps, begin, end, machines, action, index, reset, skipped):
    """Which snapshot a starting member restores; damaged ones fall back; a gap is a refusal."""
    plan = rules.restore_plan(snaps, begin, end, machines)
    assert (plan.action, plan.index, plan.reset_log, plan.skipped) == (action, index, reset, skipped)
    if action is RestoreAction.REFUSE:
        assert "fix:" in plan.why and "\n" not in plan.why and str(begin) in plan.why


@pytest.mark.parametrize("indexes, reserved, in_use, victims", [
    ([50, 40, 30, 20], 3, set(), [20]),
    ([50, 40, 30, 20], 2, set(), [30, 20]),
    ([50, 40, 30, 20], 2, {30}, [20]),      # being sent to a follower: kept
    ([50], 0, set(), []),                   # the newest is always kept
    ([50, 40], 5, set(), []),
])
def test_prune_victims(indexes, reserved, in_use, victims):
    """All but the newest maxSnapshotReservedNum go, never one in use."""
    assert rules.prune_victims(indexes, reserved, in_use) == victims


@pytest.mark.parametrize("install, newest, stale", [(40, 50, True), (50, 50, True), (60, 50, False), (0, -1, False)])
def test_stale_install(install, newest, stale):
    """A partial transfer no newer than a complete snapshot is deleted at start-up."""
    assert rules.stale_install(install, newest) is stale
