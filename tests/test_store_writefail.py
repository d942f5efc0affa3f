"""A store whose writes fail (full or failing disk) refuses at once for a while, logs once, holds nothing (issue 21)."""

import errno
import gc

import pytest
from twisted.internet import task
from twisted.logger import globalLogPublisher

from dledger import diskio
from dledger.codes import ResponseCode, Role
from dledger.entry import Entry
from dledger.errors import BatchAppendError, DLedgerError
from dledger.replication.durability import Flusher
from dledger.replication.follower import EntryHandler
from dledger.store import writefail
from dledger.store.mmapfile import MmapLogStore
from dledger.store.writefail import WriteFailures, failure_code, retry_delay, room_for_file
from dledger.testing.store_contract import FakeMemberState


@pytest.mark.parametrize("err, code", [
    (errno.ENOSPC, ResponseCode.DISK_FULL),
    (errno.EDQUOT, ResponseCode.DISK_FULL),
    (errno.EFBIG, ResponseCode.DISK_FULL),
    (errno.EIO, ResponseCode.DISK_ERROR),
    (errno.EROFS, ResponseCode.DISK_ERROR),
    (None, ResponseCode.DISK_ERROR),
])
def test_failure_code(err, code):
    """No room is DISK_FULL (415); any other write error is DISK_ERROR (414)."""
    assert failure_code(err) is code


@pytest.mark.parametrize("attempts, delay", [(1, 0.5), (2, 1.0), (3, 2.0), (4, 4.0), (5, 5.0), (50, 5.0)])
def test_retry_delay_doubles_up_to_the_cap(attempts, delay):
    """The disk is tried again after 0.5 s, then twice as long each time, never more than 5 s apart."""
    assert retry_delay(attempts) == delay


@pytest.mark.parametrize("free, size, ok", [(5 << 20, 32 << 20, False), (32 << 20, 32 << 20, True), (0, 1, False)])
def test_room_for_file(free, size, ok):
    """A new file is only created (fallocated) when the disk has its whole size free."""
    assert room_for_file(free, size) is ok


def test_write_failures_refuse_until_the_retry_time_then_try_and_clear_on_success():
    """Refused without trying until retry_at; a failed retry pushes retry_at out; a success ends it."""
    wf = WriteFailures()
    assert wf.refusal(0.0) is None and wf.code is None
    assert wf.failed(ResponseCode.DISK_FULL, "no space", 10.0) is True
    assert wf.refusal(10.2).code is ResponseCode.DISK_FULL
    assert wf.refusal(10.5) is None  # time to try the disk again
    assert wf.failed(ResponseCode.DISK_FULL, "still no space", 10.5) is False
    assert wf.refusal(11.4) is not None and wf.refusal(11.5) is None  # 1 s after the second failure
    over = wf.succeeded()
    assert over.attempts == 2 and over.since == 10.0 and wf.code is None and wf.refusal(11.6) is None


def small_store(tmp_path, clock, free):
    store = MmapLogStore(tmp_path / "dledger-n1", FakeMemberState(self_id="n1", role=Role.FOLLOWER, leader_id="n0"),
                         data_file_size=4096, index_file_size=32 * 64, max_entry_size=1024, clock=clock,
                         disk_usage=lambda: 0.1)
    store.startup()
    return store


def leader_entries(n, size=900):
    """``n`` entries as the leader placed them in 4096-byte data files (each ~950 bytes: 4 per file)."""
    from dledger.entry import HEADER_SIZE, body_crc, place_entry
    out, pos = [], 0
    for i in range(n):
        body = bytes([i % 251]) * size
        pos = place_entry(pos, HEADER_SIZE + size, 4096)[0]
        out.append(Entry(body=body, index=i, term=1, pos=pos, body_crc=body_crc(body)))
        pos += HEADER_SIZE + size
    return out


def errors_logged():
    lines = []
    observer = lambda event: lines.append(event) if event["log_level"].name == "error" else None
    globalLogPublisher.addObserver(observer)
    return lines, observer


def test_a_full_disk_is_refused_without_fallocate_logged_once_and_retried_later(tmp_path, monkeypatch):
    """No room for the next data file: DISK_FULL before fallocate, one line with dir and free space, then recovery."""
    clock = task.Clock()
    free = {"bytes": 1 << 30}
    monkeypatch.setattr(diskio, "free_bytes", lambda path: free["bytes"])
    store = small_store(tmp_path, clock, free)
    creates = []
    real_create = diskio.create_sized_file
    monkeypatch.setattr(diskio, "create_sized_file", lambda *a, **k: (creates.append(a[0]), real_create(*a, **k)))
    state = store.member_state
    state.role, state.leader_id = Role.LEADER, "n1"
    for _i in range(4):
        store.append_as_leader(Entry(body=b"x" * 900, term=1))
    creates.clear()
    lines, observer = errors_logged()
    free["bytes"] = 1000  # less than a data file
    try:
        codes = []
        for _ in range(20):
            try:
                store.append_as_leader(Entry(body=b"y" * 900, term=1))
            except DLedgerError as exc:
                codes.append(exc.code)
            clock.advance(0.1)
        assert codes == [ResponseCode.DISK_FULL] * 20 and store.disk_full and store.disk_problem == "disk full"
        assert creates == [], "never fallocates a file the disk has no room for"
        assert store.write_refusal() is not None
    finally:
        globalLogPublisher.removeObserver(observer)
    texts = [e["log_format"].format(**e) for e in lines if "log_format" in e]
    assert len(texts) == 1, texts
    assert str(tmp_path / "dledger-n1") in texts[0] and "1000 bytes free on its disk" in texts[0]
    free["bytes"] = 1 << 30
    clock.advance(writefail.MAX_RETRY)
    e = store.append_as_leader(Entry(body=b"z" * 900, term=1))
    assert e.index == 4 and store.disk_problem is None and store.write_refusal() is None and len(creates) == 1


def test_a_write_error_is_disk_error_and_refused_until_retry(tmp_path, monkeypatch):
    """EIO from pwrite: DISK_ERROR, and the next appends are refused without writing until the retry time."""
    clock = task.Clock()
    store = small_store(tmp_path, clock, None)
    state = store.member_state
    state.role, state.leader_id = Role.LEADER, "n1"
    from dledger.store import mmapwriter as mmapfile
    calls = []

    def broken(fd, data, offset):
        calls.append(offset)
        raise OSError(errno.EIO, "Input/output error")
    monkeypatch.setattr(mmapfile, "_write_at", broken)
    for _ in range(3):
        with pytest.raises(DLedgerError) as info:
            store.append_as_leader(Entry(body=b"x" * 10, term=1))
        assert info.value.code is ResponseCode.DISK_ERROR
    assert len(calls) == 1 and store.disk_problem == "disk error"
    assert store.ledger_end_index == -1


def test_a_refused_follower_append_leaves_no_reference_cycle(tmp_path, monkeypatch):
    """A failed batch append creates no garbage cycle holding the push (a member's collector runs rarely)."""
    clock = task.Clock()
    store = small_store(tmp_path, clock, None)
    entries = leader_entries(8)
    store.append_batch_as_follower(entries[:4], 1, "n0")  # fills the first data file
    monkeypatch.setattr(diskio, "free_bytes", lambda path: 1000)
    gc.collect()
    gc.disable()
    try:
        for _ in range(20):
            clock.advance(writefail.MAX_RETRY)  # every attempt reaches the disk check
            with pytest.raises(BatchAppendError):
                store.append_batch_as_follower(entries[4:], 1, "n0")
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_follower_answers_pushes_at_once_and_parks_nothing_while_its_disk_refuses(tmp_path, monkeypatch):
    """Pipelined APPENDs behind a refused one are answered DISK_FULL at once instead of waiting in memory."""
    from dledger.codes import PushType
    from dledger.messages import PushEntryRequest

    clock = task.Clock()
    store = small_store(tmp_path, clock, None)
    handler = EntryHandler(store.member_state, store, Flusher(store, clock), clock, push_timeout=1.0)
    entries = leader_entries(12)
    store.append_batch_as_follower(entries[:4], 1, "n0")
    monkeypatch.setattr(diskio, "free_bytes", lambda path: 1000)
    replies = []

    def push(batch):
        req = PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=1, commit_index=-1,
                               type=PushType.APPEND, batch_entry=batch)
        handler.handle_push(req).addBoth(replies.append)

    push(entries[8:10])   # ahead of the end: would wait for its turn
    push(entries[4:6])    # the next one: fails for want of a data file
    push(entries[10:12])  # arrives while the store refuses
    codes = [r.response_code for r in replies]
    assert codes == [ResponseCode.DISK_FULL] * 3 and handler.parked == 0
