"""The mmap store's flush planning and page release (dledger.store.flushing), one table row per rule."""

import pytest

from dledger.store.flushing import (
    RELEASE_STEP,
    flush_here,
    here_bytes_setting,
    index_sync_due,
    needs_flush,
    release_due,
    released_mark,
    span,
)

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
    # (rule, data_lo, write_pos, dirs changed, expected)
    ("everything_durable", 500, 500, False, False),
    ("data_bytes_appended", 500, 600, False, True),
    ("a_directory_gained_or_lost_a_file", 500, 500, True, True),
    ("truncated_below_the_flushed_end", 400, 500, False, True),
]


@pytest.mark.parametrize("rule, data_lo, wp, dirs, expected", NEEDS_FLUSH, ids=[r[0] for r in NEEDS_FLUSH])
def test_needs_flush(rule, data_lo, wp, dirs, expected):
    """The async flush timer runs a round only when data bytes or directory entries are not durable (index
    records are synced with the checkpoint)."""
    assert needs_flush(data_lo, wp, dirs) is expected


INDEX_SYNC_DUE = [
    # (rule, index_lo, checkpoint end, expected)
    ("records_up_to_the_checkpoint_already_synced", 10, 9, False),
    ("the_checkpoint_vouches_for_an_unsynced_record", 10, 10, True),
    ("a_repair_rewrote_records_below_the_checkpoint", 3, 9, True),
    ("empty_log_checkpoint", 0, -1, False),
]


@pytest.mark.parametrize("rule, index_lo, end, expected", INDEX_SYNC_DUE, ids=[r[0] for r in INDEX_SYNC_DUE])
def test_index_sync_due(rule, index_lo, end, expected):
    """A checkpoint syncs the index first when it would vouch for records not synced yet."""
    assert index_sync_due(index_lo, end) is expected


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


def _store(path):
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState

    store = MmapLogStore(path, FakeMemberState(), data_file_size=S, index_file_size=256)
    store.startup()
    return store


def test_rounds_sync_data_and_the_checkpoint_syncs_the_index_first(tmp_path, monkeypatch):
    """Issue #28: a flush round fdatasyncs only data files; the checkpoint job syncs the index files holding
    the records it vouches for, before it replaces the checkpoint; a failed checkpoint leaves them to the next."""
    from dledger import diskio
    from dledger.entry import Entry
    from dledger.store import checkpoint as checkpoint_module
    from dledger.testing.store_contract import fired

    store = _store(tmp_path / "m")
    store.append_batch_as_leader([Entry(body=bytes(100), term=1) for _ in range(12)])  # 12 records: 2 index files
    fired(store.flush())  # new files are synced in full with their directories, index files too
    store.append_batch_as_leader([Entry(body=bytes(100), term=1) for _ in range(2)])
    data_fds = {f.fd for f in store._data.files}
    index_fds = {f.fd for f in store._index.files}
    calls = []
    monkeypatch.setattr(diskio, "flush_files", lambda synced, new, dirs: calls.append(("sync", set(synced + new))))
    real_write, failures = checkpoint_module.write_checkpoint, [OSError(28, "ENOSPC")]

    def write_checkpoint(member_dir, ck):
        calls.append(("checkpoint", ck.end_index))
        if failures:
            raise failures.pop()
        real_write(member_dir, ck)

    monkeypatch.setattr(checkpoint_module, "write_checkpoint", write_checkpoint)
    fired(store.flush())
    [(_, synced)] = calls
    assert synced and synced <= data_fds, "a round syncs data files only"
    calls.clear()
    store._write_checkpoint(force=False).addErrback(lambda f: None)
    assert calls == [("sync", index_fds), ("checkpoint", 13)]
    calls.clear()
    fired(store._write_checkpoint(force=False))  # same checkpoint, but its records were not made durable
    assert calls == [("sync", index_fds), ("checkpoint", 13)]
    calls.clear()
    fired(store._write_checkpoint(force=False))
    assert calls == [], "nothing new to vouch for"
    store.abandon()


def test_index_records_lost_past_the_checkpoint_come_back_from_the_data(tmp_path):
    """A power cut may lose index records the rounds no longer sync (those past the checkpoint): recovery
    rewrites them from the data, and every flushed entry is served as it was."""
    from dledger.entry import INDEX_UNIT_SIZE, Entry
    from dledger.testing.store_contract import fired

    store = _store(tmp_path / "m")
    store.append_batch_as_leader([Entry(body=b"a%d" % i, term=1) for i in range(5)])
    fired(store.flush())
    fired(store._write_checkpoint(force=True))  # vouches for 0..4
    store.append_batch_as_leader([Entry(body=b"b%d" % i, term=1) for i in range(9)])
    fired(store.flush())  # 5..13 durable through their data only
    before = [store.get(i).body for i in range(14)]
    store.abandon()
    for f in sorted((tmp_path / "m").rglob("index/*")):  # what a power cut could leave: records past 4 zero
        raw = bytearray(f.read_bytes())
        start = int(f.name)
        for pos in range(0, len(raw), INDEX_UNIT_SIZE):
            if (start + pos) // INDEX_UNIT_SIZE > 4:
                raw[pos:pos + INDEX_UNIT_SIZE] = bytes(INDEX_UNIT_SIZE)
        f.write_bytes(bytes(raw))
    again = _store(tmp_path / "m")
    assert again.ledger_end_index == 13
    assert [again.get(i).body for i in range(14)] == before
    again.abandon()


def test_pages_read_back_below_the_released_mark_are_released_again(tmp_path, monkeypatch):
    """Issue #28 target 4: entries read from the files (a follower catching up from far behind) map their pages
    in again; once the read-back range spans a release step those pages are unmapped again, so a leader's RSS
    does not grow by what it reads back."""
    from dledger.entry import Entry
    from dledger.store import flushing
    from dledger.store.mappedfiles import MappedFile
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState, fired

    store = MmapLogStore(tmp_path / "m", FakeMemberState(), data_file_size=1 << 20, index_file_size=1 << 16)
    store.startup()
    for _ in range(40):  # ~2.6 MiB, flushed round by round: the released mark moves past the first MiB
        store.append_batch_as_leader([Entry(body=bytes(1000), term=1) for _ in range(64)])
        fired(store.flush())
    store.recent_entries.clear()  # every read below comes from the files
    released = []
    real = MappedFile.release
    monkeypatch.setattr(MappedFile, "release", lambda f, a, b: (released.append((f.start + a, f.start + b)),
                                                                real(f, a, b))[1])
    assert store._flushing.data_released > flushing.RELEASE_STEP
    for i in range(100):
        store.get(i)
    assert released == [], "less than a release step read back: left mapped"
    i = 100
    while not released and i < 1500:
        store.get(i)
        i += 1
    assert released, "the pages read back were unmapped again"
    assert min(a for a, _ in released) <= store.get(0).pos and max(b for _, b in released) >= flushing.RELEASE_STEP
    store.abandon()


FLUSH_HERE = [
    # (rule, data bytes, new files, directories, limit, expected)
    ("a_tiny_round_of_old_files_syncs_here", 21_000, False, False, 65536, True),
    ("a_round_at_the_limit_syncs_here", 65536, False, False, 65536, True),
    ("a_round_past_the_limit_goes_to_the_worker", 65537, False, False, 65536, False),
    ("a_new_file_goes_to_the_worker", 100, True, False, 65536, False),
    ("a_directory_to_sync_goes_to_the_worker", 100, False, True, 65536, False),
    ("limit_zero_always_the_worker", 100, False, False, 0, False),
    ("no_data_bytes_nothing_to_gain", 0, False, False, 65536, False),
]


@pytest.mark.parametrize("rule, nbytes, new, dirs, limit, expected", FLUSH_HERE, ids=[r[0] for r in FLUSH_HERE])
def test_flush_here(rule, nbytes, new, dirs, limit, expected):
    """Only a small round of data bytes in files synced before runs on the reactor thread (issue #28, 2c)."""
    assert flush_here(nbytes, new, dirs, limit) is expected


@pytest.mark.parametrize("value, expected", [("", 0), ("0", 0), ("65536", 65536), ("-5", 0)])
def test_here_bytes_setting(value, expected):
    assert here_bytes_setting({"DLEDGER_FLUSH_HERE_BYTES": value} if value else {}) == expected


def test_here_bytes_setting_refuses_a_typo():
    with pytest.raises(ValueError, match="DLEDGER_FLUSH_HERE_BYTES"):
        here_bytes_setting({"DLEDGER_FLUSH_HERE_BYTES": "64k"})
