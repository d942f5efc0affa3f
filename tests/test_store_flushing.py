"""The mmap store's flush planning and page release (dledger.store.flushing), one table row per rule."""

import pytest

from dledger.store.flushing import RELEASE_STEP, needs_flush, release_due, released_mark, span

S = 1024  # file size

SPAN = [
    # (rule, first file start, file count, lo, hi, expected files [a, b))
    ("range_inside_one_file", 0, 3, 100, 200, (0, 1)),
    ("range_ending_at_a_file_edge_stays_in_that_file", 0, 3, 100, S, (0, 1)),
    ("range_starting_at_a_file_edge_is_in_the_next", 0, 3, S, S + 1, (1, 2)),
    ("range_across_three_files", 0, 3, 500, 2 * S + 1, (0, 3)),
    ("range_past_the_last_file_is_clamped", 0, 2, S + 10, 5 * S, (1, 2)),
    ("range_before_the_first_file_is_clamped", 4 * S, 2, 0, 4 * S + 10, (0, 1)),
    ("empty_range_touches_nothing", 0, 3, 300, 300, (0, 0)),
    ("no_files", 0, 0, 0, 100, (0, 0)),
]


@pytest.mark.parametrize("rule, first, count, lo, hi, expected", SPAN, ids=[r[0] for r in SPAN])
def test_span(rule, first, count, lo, hi, expected):
    """A flush syncs exactly the files holding the unflushed byte range, found by arithmetic."""
    assert span(first, S, count, lo, hi) == expected


NEEDS_FLUSH = [
    # (rule, data_lo, write_pos, index_lo, end_index, dirs changed, expected)
    ("everything_durable", 500, 500, 10, 9, False, False),
    ("data_bytes_appended", 500, 600, 10, 9, False, True),
    ("index_records_appended", 500, 500, 10, 10, False, True),
    ("a_directory_gained_or_lost_a_file", 500, 500, 10, 9, True, True),
    ("truncated_below_the_flushed_end", 400, 500, 8, 9, False, True),
]


@pytest.mark.parametrize("rule, data_lo, wp, index_lo, end, dirs, expected", NEEDS_FLUSH,
                         ids=[r[0] for r in NEEDS_FLUSH])
def test_needs_flush(rule, data_lo, wp, index_lo, end, dirs, expected):
    """The async flush timer runs a round only when bytes, records or directory entries are not durable."""
    assert needs_flush(data_lo, wp, index_lo, end, dirs) is expected


RELEASE = [
    # (rule, released_to, flushed_to, expected)
    ("nothing_new_flushed", 5000, 5000, False),
    ("less_than_a_step_flushed", 0, RELEASE_STEP - 1, False),
    ("a_full_step_flushed", 0, RELEASE_STEP, True),
    ("more_than_a_step_flushed", 4096, 4096 + 3 * RELEASE_STEP, True),
]


@pytest.mark.parametrize("rule, released, flushed, expected", RELEASE, ids=[r[0] for r in RELEASE])
def test_release_due(rule, released, flushed, expected):
    """Flushed pages are unmapped in steps of RELEASE_STEP bytes, not after every small round."""
    assert release_due(released, flushed) is expected


MARK = [
    # (rule, lo, upto, page, expected)
    ("whole_pages_only", 0, 10_000, 4096, 8192),
    ("exact_page_end", 0, 8192, 4096, 8192),
    ("never_moves_back", 9000, 9100, 4096, 9000),
]


@pytest.mark.parametrize("rule, lo, upto, page, expected", MARK, ids=[r[0] for r in MARK])
def test_released_mark(rule, lo, upto, page, expected):
    """A release reaches the last whole page; the partial page after it is released next time."""
    assert released_mark(lo, upto, page) == expected


def test_a_failed_round_is_covered_by_the_next(tmp_path, monkeypatch):
    """After a failed fsync the store's marks go back: the next round syncs the same files again."""
    from dledger import diskio
    from dledger.entry import Entry
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState, fired

    store = MmapLogStore(tmp_path / "m", FakeMemberState(), data_file_size=S, index_file_size=256)
    store.startup()
    store.append_batch_as_leader([Entry(body=bytes(100), term=1) for _ in range(12)])
    rounds = []

    def flush_files(synced, new, dirs):
        rounds.append((len(synced), len(new), len(dirs)))
        if len(rounds) == 1:
            raise OSError(5, "EIO")

    monkeypatch.setattr(diskio, "flush_files", flush_files)
    d = store.flush()
    d.addErrback(lambda f: None)
    fired(store.flush())
    assert rounds[1] == rounds[0] and rounds[0][1] > 0, rounds
    fired(store.flush())
    assert len(rounds) == 2, "nothing left to sync"
    store.abandon()
