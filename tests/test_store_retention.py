"""Retention of the mmap store (dledger.store.retention): when old data files go, one table row per rule."""

import time

import pytest

from dledger.store.retention import CleanMode, RetentionPolicy, keeps_uncommitted

P = RetentionPolicy(file_reserved_hours=72, delete_when="04;16", disk_space_ratio_to_check_expired=0.70,
                    disk_space_ratio_to_force_clean=0.85, enable_disk_force_clean=True, disk_full_ratio=0.90)


def local(hour: int) -> float:
    return time.mktime((2026, 3, 10, hour, 30, 0, 0, 0, -1))


MODE = [
    # (rule, policy, hour, used ratio, expected)
    ("quiet_hour_and_room_on_disk_cleans_nothing", P, 10, 0.5, CleanMode.NONE),
    ("a_delete_when_hour_cleans_expired_files", P, 4, 0.5, CleanMode.EXPIRED),
    ("every_delete_when_hour_counts", P, 16, 0.5, CleanMode.EXPIRED),
    ("disk_over_check_expired_ratio_cleans_expired_files", P, 10, 0.75, CleanMode.EXPIRED),
    ("disk_over_force_clean_ratio_forces", P, 10, 0.86, CleanMode.FORCE),
    ("force_clean_disabled_only_cleans_expired", RetentionPolicy(enable_disk_force_clean=False), 10, 0.95,
     CleanMode.EXPIRED),
]


@pytest.mark.parametrize("rule, policy, hour, used, expected", MODE, ids=[r[0] for r in MODE])
def test_clean_mode(rule, policy, hour, used, expected):
    """Cleaning runs at deleteWhen hours or on a filling disk, and forces past diskSpaceRatioToForceClean."""
    assert policy.mode(local(hour), used) is expected


NOW = local(10)
HOUR = 3600.0

MAY_DELETE = [
    # (rule, mode, file age in hours, used ratio, expected)
    ("expired_file_goes", CleanMode.EXPIRED, 73, 0.5, True),
    ("young_file_stays", CleanMode.EXPIRED, 71, 0.95, False),
    ("file_exactly_reserved_hours_old_stays", CleanMode.EXPIRED, 72, 0.5, False),
    ("young_file_goes_while_forcing_over_the_ratio", CleanMode.FORCE, 1, 0.9, True),
    ("forcing_stops_once_below_the_ratio", CleanMode.FORCE, 1, 0.8, False),
    ("expired_file_goes_while_forcing_below_the_ratio", CleanMode.FORCE, 100, 0.8, True),
]


@pytest.mark.parametrize("rule, mode, age, used, expected", MAY_DELETE, ids=[r[0] for r in MAY_DELETE])
def test_may_delete(rule, mode, age, used, expected):
    """A committed oldest file goes when expired, or while a forced clean still finds the disk too full."""
    assert P.may_delete(mode, NOW, NOW - age * HOUR, used) is expected


UNCOMMITTED = [
    # (rule, first index after the file, committed index, expected)
    ("file_wholly_committed_may_go", 100, 99, False),
    ("file_holding_the_first_uncommitted_entry_stays", 100, 98, True),
    ("file_wholly_below_a_higher_commit_may_go", 100, 500, False),
    ("nothing_after_the_file_says_where_it_ends", None, 500, True),
]


@pytest.mark.parametrize("rule, next_first, committed, expected", UNCOMMITTED, ids=[r[0] for r in UNCOMMITTED])
def test_keeps_uncommitted(rule, next_first, committed, expected):
    """Retention never deletes a file that may hold an entry above the committed index."""
    assert keeps_uncommitted(next_first, committed) is expected


DISK_FULL = [
    ("below_disk_full_ratio", 0.89, False),
    ("at_disk_full_ratio", 0.90, False),
    ("over_disk_full_ratio", 0.91, True),
]


@pytest.mark.parametrize("rule, used, expected", DISK_FULL, ids=[r[0] for r in DISK_FULL])
def test_disk_full(rule, used, expected):
    """Appends are refused only while the disk is fuller than diskFullRatio."""
    assert P.disk_full(used) is expected
