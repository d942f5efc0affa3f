"""MmapLogStore.set_initial_position: an empty log starts at a given data position (a migrated CommitLog's end)."""

from __future__ import annotations

import pytest

from dledger.entry import Entry
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.store_contract import FakeMemberState, fired


def make(path, state):
    return MmapLogStore(path, state, data_file_size=1024, index_file_size=256, max_entry_size=1000)


def test_an_empty_log_starts_at_the_initial_position_and_keeps_it_across_restarts(tmp_path):
    """The first entry goes at the initial position, the first data file is named by it, and a reopen keeps it."""
    state = FakeMemberState()
    store = make(tmp_path / "m", state)
    store.set_initial_position(4096)
    store.startup()
    assert store.begin_position() == store.committed_position() == 4096
    first = store.append_as_leader(Entry(body=b"x" * 100, term=state.curr_term))
    second = store.append_as_leader(Entry(body=b"y", term=state.curr_term))
    assert (first.index, first.pos, second.pos) == (0, 4096, 4096 + 48 + 100)
    store.update_committed_index(state.curr_term, 1)
    assert store.read_at(4096 + 48, 100) == b"x" * 100
    fired(store.shutdown())
    assert sorted(p.name for p in (tmp_path / "m" / "data").iterdir()) == ["00000000000000004096"]
    again = make(tmp_path / "m", state)
    again.set_initial_position(8192)  # ignored: the log holds entries
    again.startup()
    assert again.get(1).pos == 4096 + 148 and again.begin_position() == 4096
    third = again.append_as_leader(Entry(body=b"z", term=state.curr_term))
    assert third.pos == 4096 + 148 + 49
    fired(again.shutdown())


@pytest.mark.parametrize("pos", [-1024, 100, 1025])
def test_initial_position_must_be_a_file_boundary(tmp_path, pos):
    """A position that is negative or not a multiple of the data file size is refused with one line."""
    with pytest.raises(ValueError, match="multiple of the data file size"):
        make(tmp_path / "m", FakeMemberState()).set_initial_position(pos)


def test_initial_position_only_before_startup(tmp_path):
    """Setting it on a started store is refused (the log's start is decided when it opens)."""
    store = make(tmp_path / "m", FakeMemberState())
    store.startup()
    with pytest.raises(ValueError, match="before the store starts"):
        store.set_initial_position(1024)
    fired(store.shutdown())
