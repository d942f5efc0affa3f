"""The mmap store's run planning (dledger.store.runplan), one table row per placement rule (SPEC §5)."""

import pytest

from dledger.codes import ResponseCode
from dledger.entry import HEADER_SIZE, MIN_BLANK_LEN, Entry
from dledger.errors import DLedgerError
from dledger.store.runplan import NextRun, extends_run, next_run, run_limit

F = 1024  # data file size
MAX = 1000  # maxEntrySize

NEXT_RUN = [
    # (rule, write_pos, size, files [start, end), fixed pos, expected NextRun)
    ("fits_the_current_file", 100, 200, (0, F), None, NextRun(100, None, 0, None, F - 8)),
    ("exactly_fills_the_file_leaving_room_for_a_blank", 100, F - 100 - MIN_BLANK_LEN, (0, F), None,
     NextRun(100, None, 0, None, F - 8)),
    ("needs_a_blank_marker_and_a_new_file", 100, F - 100 - MIN_BLANK_LEN + 1, (0, F), None,
     NextRun(F, 100, F - 100, F, 2 * F - 8)),
    ("blank_marker_before_a_file_that_exists", F + 900, 200, (0, 3 * F), None,
     NextRun(2 * F, F + 900, F - 900, None, 3 * F - 8)),
    ("empty_log_creates_its_first_file", 0, 200, (-1, -1), None, NextRun(0, None, 0, 0, F - 8)),
    ("empty_log_at_an_initial_position", 4 * F, 200, (-1, -1), None, NextRun(4 * F, None, 0, 4 * F, 5 * F - 8)),
    ("log_ending_at_a_file_edge_creates_the_next_file", F, 200, (0, F), None, NextRun(F, None, 0, F, 2 * F - 8)),
    ("follower_entry_at_its_leader_position", 100, 200, (0, F), 100, NextRun(100, None, 0, None, F - 8)),
    ("follower_entry_after_a_blank_marker", 900, 200, (0, F), F, NextRun(F, 900, F - 900, F, 2 * F - 8)),
]


@pytest.mark.parametrize("rule, wp, size, files, fixed, expected", NEXT_RUN, ids=[r[0] for r in NEXT_RUN])
def test_next_run(rule, wp, size, files, fixed, expected):
    """An entry starts a run where the log ends if it fits, else after a blank marker in the next file."""
    assert next_run(wp, size, file_size=F, max_size=MAX, files_start=files[0], files_end=files[1],
                    fixed_pos=fixed) == expected


REFUSED = [
    # (rule, write_pos, size, max size, fixed pos, code, message)
    ("oversized_entry", 0, MAX + 1, MAX, None, ResponseCode.UNEXPECTED_ARGUMENT, "exceeds maxEntrySize"),
    ("entry_that_no_data_file_can_hold", 0, F - MIN_BLANK_LEN + 1, 2 * F, None, ResponseCode.UNEXPECTED_ARGUMENT,
     "cannot fit a data file"),
    ("follower_entry_whose_pos_disagrees", 100, 200, MAX, 120, ResponseCode.DISK_ERROR, "placement changed"),
    ("follower_entry_in_this_file_that_must_go_to_the_next", 900, 200, MAX, 900, ResponseCode.DISK_ERROR,
     "placement changed"),
]


@pytest.mark.parametrize("rule, wp, size, max_size, fixed, code, message", REFUSED, ids=[r[0] for r in REFUSED])
def test_next_run_refuses(rule, wp, size, max_size, fixed, code, message):
    """Oversized entries and entries whose fixed position disagrees are refused before anything is written."""
    with pytest.raises(DLedgerError, match=message) as info:
        next_run(wp, size, file_size=F, max_size=max_size, files_start=0, files_end=F, fixed_pos=fixed, index=7)
    assert info.value.code == code


EXTENDS = [
    # (rule, run end, size, limit, expected)
    ("fits_before_the_limit", 100, 200, F - 8, True),
    ("ends_exactly_at_the_limit", 100, F - 8 - 100, F - 8, True),
    ("one_byte_past_the_limit", 100, F - 8 - 99, F - 8, False),
    ("oversized_even_if_it_would_fit", 0, MAX + 1, 10 * F, False),
    ("no_file_cached_yet", 0, 40, -1, False),
]


@pytest.mark.parametrize("rule, end, size, limit, expected", EXTENDS, ids=[r[0] for r in EXTENDS])
def test_extends_run(rule, end, size, limit, expected):
    """An entry extends the current run only if it ends by the run's limit and is not oversized."""
    assert extends_run(end, size, limit, MAX) is expected


def test_extending_a_run_agrees_with_next_run():
    """Wherever the append loop's quick test says "extends the run", the full planner puts the entry right there."""
    for wp in range(0, 3 * F, 24):
        limit = run_limit(wp - wp % F + F)
        for size in range(HEADER_SIZE, F + 16, 40):
            if extends_run(wp, size, limit, MAX):
                assert next_run(wp, size, file_size=F, max_size=MAX, files_start=0, files_end=3 * F) == \
                    NextRun(wp, None, 0, None, limit)


def test_a_store_writes_what_the_plan_says(tmp_path):
    """Entries crossing a data file end sit where next_run puts them, after a blank marker the size it says."""
    from dledger.entry import Blank, decode_blank
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState

    store = MmapLogStore(tmp_path / "m", FakeMemberState(), data_file_size=F, index_file_size=256, max_entry_size=MAX)
    store.startup()
    stored = store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(4)])
    plan = next_run(stored[1].pos + stored[1].size, HEADER_SIZE + 300, file_size=F, max_size=MAX,
                    files_start=0, files_end=F)
    assert [e.pos for e in stored[:3]] == [0, stored[0].size, plan.pos] and plan.new_file == F
    assert len(store.data_files) == 2
    store.update_committed_index(1, 3)
    assert decode_blank(store.read_at(plan.blank_at, 8)) == Blank(plan.blank)
    store.abandon()
