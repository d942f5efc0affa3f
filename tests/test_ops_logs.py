"""Log lines an operator reads: a fresh follower is filled, not repaired; a checkpoint past the log refuses."""

import pytest
from twisted.logger import LogLevel, formatEvent, globalLogPublisher

from dledger.entry import Entry
from dledger.errors import DamagedStoreError
from dledger.replication.rules import truncate_reason
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.store_contract import FakeMemberState, fired


@pytest.mark.parametrize("follower_end, expected, not_expected", [
    (-1, "its log is empty; sending it our log from index {index}", "truncating"),
    (40, "truncating it at index {index} to repair its log (it ends at 40)", "empty"),
    (None, "truncating it at index {index} to repair its log;", "empty"),
])
def test_truncate_line_says_fill_for_an_empty_follower(follower_end, expected, not_expected):
    """The leader's TRUNCATE line says 'empty log; sending' for a fresh follower and 'repair' only for a real one."""
    reason = truncate_reason(follower_end)
    assert expected in reason and not_expected not in reason


def test_checkpoint_past_the_log_refuses_then_cut_is_logged_as_error(tmp_path):
    """A checkpoint claiming more than the log holds refuses to start; a forced cut logs both indexes as an error."""
    member_dir = tmp_path / "dledger-n0"
    state = FakeMemberState()
    store = MmapLogStore(member_dir, state, data_file_size=1 << 20, index_file_size=32 * 1024)
    store.startup()
    for i in range(10):
        store.append_as_leader(Entry(body=b"x%d" % i, term=state.curr_term))
    store.update_committed_index(state.curr_term, 9)
    fired(store.flush())
    fired(store.shutdown())
    (member_dir / "checkpoint").write_bytes(b"committedIndex=25\nendIndex=9\n")
    (member_dir / "checkpoint.bak").unlink(missing_ok=True)
    with pytest.raises(DamagedStoreError, match="the log ends at entry 9.*entries up to 25 are committed"):
        MmapLogStore(member_dir, FakeMemberState(), data_file_size=1 << 20, index_file_size=32 * 1024).startup()
    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        store = MmapLogStore(member_dir, FakeMemberState(), data_file_size=1 << 20, index_file_size=32 * 1024,
                             truncate_damaged=True)
        store.startup()
    finally:
        globalLogPublisher.removeObserver(events.append)
    fired(store.shutdown())
    errors = [formatEvent(e) for e in events if e.get("log_level") == LogLevel.error]
    assert any("the checkpoint claims more than the log holds: committed index 25 but entries only up to 9" in w
               for w in errors), [formatEvent(e) for e in events]


def test_follower_says_an_empty_log_is_started_not_truncated():
    """A follower with an empty log logs 'log was empty; starting it' for the first TRUNCATE, 'truncated' later."""
    from twisted.internet import task

    from dledger.codes import PushType
    from dledger.messages import PushEntryRequest
    from dledger.replication.durability import Flusher
    from dledger.replication.follower import EntryHandler
    from dledger.store.memory import MemoryLogStore
    from dledger.testing.simdisk import make_entries

    state = FakeMemberState(self_id="n1")
    state.follow(1, "n0")
    store = MemoryLogStore(state)
    clock = task.Clock()
    h = EntryHandler(state, store, Flusher(store, clock), clock, push_timeout=1.0)
    log = make_entries([1, 1, 1])

    def truncate(entry, term):
        state.follow(term, "n0")
        h.reset()
        d = h.handle_push(PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=term,
                                           type=PushType.TRUNCATE, entry=entry))
        clock.advance(0)
        fired(d)

    events = []
    globalLogPublisher.addObserver(events.append)
    try:
        truncate(log[0], 1)
        truncate(log[0], 2)
    finally:
        globalLogPublisher.removeObserver(events.append)
    lines = [formatEvent(e) for e in events if "for leader n0" in formatEvent(e)]
    assert lines[0].startswith("n1: log was empty; starting it at index 0 for leader n0 (term 1)"), lines
    assert lines[1].startswith("n1: truncated to index 0 for leader n0 (term 2)"), lines
