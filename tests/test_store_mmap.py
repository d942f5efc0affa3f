"""The mmap file store: the log-store contract, file layout, checkpoint, flushing, retention and disk-full."""

from __future__ import annotations

import os
import struct
import time
from pathlib import Path

import crc32c
import pytest
from twisted.internet import task
from zope.interface.verify import verifyObject

from dledger.codes import ResponseCode
from dledger.config import make_config
from dledger.entry import Entry
from dledger.errors import AppendHookError, BatchAppendError, StoreError
from dledger.interfaces import IRetainingLogStore, ITermVoteStore
from dledger.plugins import get_store_type
from dledger.store.guard import LogGuard
from dledger.store.mmapfile import MmapLogStore
from dledger.store.retention import RetentionPolicy
from dledger.store.termvote import FileTermVoteStore
from dledger.testing.handio import HandIO
from dledger.testing.store_contract import FakeMemberState, LogStoreContract, bodies, expect_code, fired


def open_mmap(path, state, **kwargs):
    kwargs.setdefault("data_file_size", 1024)
    kwargs.setdefault("index_file_size", 256)
    kwargs.setdefault("max_entry_size", 1024 - 8)
    store = MmapLogStore(path, state, **kwargs)
    store.startup()
    return store


class TestMmapStoreContract(LogStoreContract):
    persistent = True

    @pytest.fixture(params=[256, 4096], ids=["index256", "index4096"])
    def index_file_size(self, request):
        return request.param

    @pytest.fixture
    def open_store(self, tmp_path, index_file_size):
        def open_(member_state):
            return open_mmap(tmp_path / "dledger-n0", member_state, data_file_size=self.data_file_size,
                             index_file_size=index_file_size, max_entry_size=self.max_entry_size)
        return open_


# -- helpers -------------------------------------------------------------------------------




@pytest.fixture
def state():
    return FakeMemberState()


@pytest.fixture
def member_dir(tmp_path):
    return tmp_path / "dledger-n0"


def assert_reopens_intact(store, member_dir, state, end):
    """Close ``store`` and check that it reopens ending at ``end``, nothing cut by recovery."""
    fired(store.shutdown())
    again = open_mmap(member_dir, state)
    assert again.ledger_end_index == end and not again.recovered.cut
    fired(again.shutdown())


def append(store, n, state, size=0):
    return [store.append_as_leader(Entry(body=b, term=state.curr_term)) for b in bodies(n, size=size)]


# -- layout ----------------------------------------------------------------------------------
def test_provides_retaining_interface(member_dir, state):
    """The mmap store provides IRetainingLogStore (retention) on top of ILogStore."""
    store = open_mmap(member_dir, state)
    assert verifyObject(IRetainingLogStore, store)
    fired(store.shutdown())


def test_files_roll_and_are_named_by_offset(member_dir, state):
    """Data and index files have their full size, 20-digit offset names, and roll as the log grows."""
    store = open_mmap(member_dir, state, data_file_size=1024, index_file_size=256)
    entries = append(store, 40, state, size=100)
    fired(store.shutdown())
    data = sorted((member_dir / "data").iterdir())
    index = sorted((member_dir / "index").iterdir())
    assert [int(p.name) for p in data] == [1024 * k for k in range(len(data))]
    assert [int(p.name) for p in index] == [256 * k for k in range(len(index))]
    assert all(len(p.name) == 20 and p.stat().st_size == 1024 for p in data)
    assert all(p.stat().st_size == 256 for p in index)
    assert len(index) == 5 and entries[-1].pos // 1024 == len(data) - 1


def test_data_file_of_wrong_size_is_refused(member_dir, state):
    """A data file whose length is not the configured size stops the store, naming the file and both sizes."""
    store = open_mmap(member_dir, state)
    append(store, 30, state, size=100)
    fired(store.shutdown())
    victim = sorted((member_dir / "data").iterdir())[1]
    with open(victim, "ab") as fh:
        fh.write(b"x")
    with pytest.raises(StoreError, match=f"{victim.name} is 1025 bytes but the configured data file size is 1024"):
        open_mmap(member_dir, state)


def test_unexpected_file_in_data_dir_is_refused(member_dir, state):
    """A stray file in data/ is reported by name instead of being guessed at or deleted."""
    store = open_mmap(member_dir, state)
    append(store, 3, state)
    fired(store.shutdown())
    (member_dir / "data" / "notes.txt").write_text("hi")
    with pytest.raises(StoreError, match="notes.txt"):
        open_mmap(member_dir, state)


SPEC_HEADER = struct.Struct(">iiqqqiiii")  # SPEC §5, written out independently of dledger.entry
SPEC_INDEX = struct.Struct(">iqiqq")


def spec_parse(member_dir: Path, file_size: int) -> tuple[list[dict], list[tuple]]:
    """A reader that knows only SPEC §5: walk the data files and the index files."""
    entries = []
    for path in sorted((member_dir / "data").iterdir()):
        raw = path.read_bytes()
        assert len(raw) == file_size
        off = 0
        while off + 8 <= len(raw):
            magic, size = struct.unpack_from(">ii", raw, off)
            if magic == -1:
                assert size == len(raw) - off
                break
            if magic == 0 and size == 0:
                assert raw[off:].count(0) == len(raw) - off
                break
            magic, size, index, term, pos, channel, chain, crc, body_size = SPEC_HEADER.unpack_from(raw, off)
            body = raw[off + 48:off + 48 + body_size]
            assert size == 48 + body_size and pos == int(path.name) + off and (channel, chain) == (0, 0)
            assert crc & 0xFFFFFFFF == crc32c.crc32c(body)
            entries.append(dict(magic=magic, index=index, term=term, pos=pos, size=size, body=body))
            off += size
    index_raw = b"".join(p.read_bytes() for p in sorted((member_dir / "index").iterdir()))
    records = [SPEC_INDEX.unpack_from(index_raw, i * 32) for i in range(len(entries))]
    return entries, records


def test_independent_parser_reads_what_we_write(member_dir, state):
    """A SPEC §5 parser that does not use dledger.entry reads back every entry, blank and index record."""
    store = open_mmap(member_dir, state, data_file_size=1024, index_file_size=256)
    written = append(store, 25, state)
    state.lead(4)
    written += [store.append_as_leader(Entry(body=b"", term=4)),
                store.append_as_leader(Entry(body=b"noop", term=4, magic=2))]
    written += append(store, 20, state, size=200)
    fired(store.shutdown())
    entries, records = spec_parse(member_dir, 1024)
    assert [(e["index"], e["term"], e["pos"], e["body"], e["magic"]) for e in entries] == \
        [(e.index, e.term, e.pos, e.body, e.magic) for e in written]
    assert records == [(e.magic, e.pos, e.size, e.index, e.term) for e in written]


def test_checkpoint_file_format(member_dir, state):
    """shutdown writes Java's checkpoint (committedIndex first) and keeps the previous one in checkpoint.bak."""
    store = open_mmap(member_dir, state)
    append(store, 10, state)
    store.update_committed_index(1, 6)
    fired(store.shutdown())
    store = open_mmap(member_dir, state)
    append(store, 2, state)
    store.update_committed_index(1, 11)
    fired(store.shutdown())
    assert (member_dir / "checkpoint").read_bytes() == b"committedIndex=11\nendIndex=11\n"
    assert (member_dir / "checkpoint.bak").read_bytes() == b"committedIndex=6\nendIndex=9\n"


# -- timers ----------------------------------------------------------------------------------
def test_checkpoint_is_written_periodically(member_dir, state, clock):
    """Every check_point_interval ms the flushed end and committed index are checkpointed, only when changed."""
    store = open_mmap(member_dir, state, clock=clock, checkpoint_interval_ms=3000)
    append(store, 5, state)
    fired(store.flush())
    store.update_committed_index(1, 3)
    clock.advance(2.9)
    assert not (member_dir / "checkpoint").exists()
    clock.advance(0.1)
    assert (member_dir / "checkpoint").read_bytes() == b"committedIndex=3\nendIndex=4\n"
    mtime = (member_dir / "checkpoint").stat().st_mtime_ns
    os.utime(member_dir / "checkpoint", ns=(0, 0))
    clock.advance(3)
    assert (member_dir / "checkpoint").stat().st_mtime_ns == 0 != mtime, "unchanged: not rewritten"
    append(store, 1, state)
    clock.advance(3)
    assert (member_dir / "checkpoint").read_bytes() == b"committedIndex=3\nendIndex=4\n", "5 is not flushed yet"
    fired(store.shutdown())
    assert (member_dir / "checkpoint").read_bytes() == b"committedIndex=3\nendIndex=5\n"
    assert not clock.getDelayedCalls(), "shutdown stops every timer"


def test_async_policy_flushes_periodically(member_dir, state, clock):
    """With flushPolicy async, appends become durable by themselves every flush_file_interval ms."""
    store = open_mmap(member_dir, state, clock=clock, flush_policy="async", flush_interval_ms=10)
    append(store, 7, state)
    assert store.flushed_index == -1
    clock.advance(0.01)
    assert store.flushed_index == 6
    rounds = store.flush_stats.rounds
    clock.advance(0.05)
    assert store.flush_stats.rounds == rounds, "nothing dirty: no flush round"
    fired(store.shutdown())


def test_sync_policy_does_not_flush_by_itself(member_dir, state, clock):
    """With flushPolicy sync nothing is flushed until flush() is called (the member decides when)."""
    store = open_mmap(member_dir, state, clock=clock)
    append(store, 3, state)
    clock.advance(10)
    assert store.flushed_index == -1
    assert fired(store.flush()) == 2
    fired(store.shutdown())


# -- flushing ----------------------------------------------------------------------------------
def test_threaded_flush_reports_only_what_it_covered(member_dir, state):
    """Appends made while a flush runs on the thread pool are not reported by it; flushes asked meanwhile group.

    One round at a time (``flush_rounds=1``); two pipelined rounds: tests/test_store_groupcommit.py.
    """
    io = HandIO()
    store = open_mmap(member_dir, state, blocking_io=io, flush_rounds=1)
    append(store, 10, state)
    first = store.flush()
    append(store, 5, state)
    second, third = store.flush(), store.flush()
    assert store.flushed_index == -1 and io.calls
    io.step()
    assert fired(first) == 9 and store.flushed_index == 9
    assert io.calls, "the two later requests started one more round"
    io.step()
    assert fired(second) == fired(third) == 14
    assert store.flush_stats.rounds == 2 and not io.calls
    d = store.shutdown()
    io.drain()
    fired(d)


def test_truncate_during_flush_caps_the_report(member_dir, state):
    """A truncate while a flush runs stops that flush from claiming the dropped (or replaced) entries."""
    io = HandIO()
    state.follow(1)
    store = open_mmap(member_dir, state, blocking_io=io)
    entries = LogStoreContract()._leader_entries(20, file_size=1024)
    for e in entries:
        store.append_as_follower(e, 1, "n1")
    d = store.flush()
    store.truncate(entries[11], 1, "n1")
    store.append_as_follower(entries[12], 1, "n1")
    io.step()
    assert fired(d) == 11 and store.flushed_index == 11
    d = store.flush()
    io.step()
    assert fired(d) == 12
    d = store.shutdown()
    io.drain()
    fired(d)


def test_removed_files_stay_open_until_the_flush_round_ends(member_dir, state):
    """A file removed while a threaded flush may still sync its descriptor is closed only after the round."""
    io = HandIO()
    state.follow(1)
    store = open_mmap(member_dir, state, blocking_io=io)
    entries = LogStoreContract()._leader_entries(30, file_size=1024)
    for e in entries:
        store.append_as_follower(e, 1, "n1")
    d = store.flush()
    store.truncate(entries[2], 1, "n1")
    assert store.closing_files and all(not f.mm.closed for f in store.closing_files)
    held = store.closing_files
    io.step()
    fired(d)
    assert not store.closing_files and all(f.mm.closed for f in held)
    d = store.shutdown()
    io.drain()
    fired(d)


def test_flush_failure_is_a_disk_error_and_is_retried(member_dir, state, monkeypatch):
    """A failing fsync fails the flush with DISK_ERROR, reports nothing new, and the next flush covers it all."""
    store = open_mmap(member_dir, state)
    append(store, 5, state)
    from dledger import diskio
    real = diskio.flush_files

    def broken(*args):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(diskio, "flush_files", broken)
    failures = []
    store.flush().addErrback(failures.append)
    assert failures[0].value.code == ResponseCode.DISK_ERROR and store.flushed_index == -1
    monkeypatch.setattr(diskio, "flush_files", real)
    assert fired(store.flush()) == 4
    fired(store.shutdown())


def test_flush_stats_measure_reactor_blocking(member_dir, state):
    """Each flush round records its latency and how long it kept the reactor thread busy."""
    io = HandIO()
    store = open_mmap(member_dir, state, blocking_io=io)
    append(store, 5, state)
    d = store.flush()
    io.step()
    fired(d)
    summary = store.flush_stats.summary()
    assert summary["rounds"] == 1 and summary["blocked_max_ms"] >= 0 and summary["latency_p50_ms"] > 0
    d = store.shutdown()
    io.drain()
    fired(d)


# -- appends ---------------------------------------------------------------------------------
def test_failing_append_hook_leaves_nothing_behind(member_dir, state):
    """If an append hook raises, the entry is not stored and its bytes are wiped (no ghost for recovery)."""
    store = open_mmap(member_dir, state)
    append(store, 3, state)

    class Boom:
        def before_append(self, entry, buffer, body_offset):
            raise RuntimeError("boom")

    guard = LogGuard(store, state)
    guard.add_append_hook(Boom())
    with pytest.raises(AppendHookError, match="RuntimeError: boom"):
        guard.append_as_leader(Entry(body=b"ghost", term=1))
    assert store.ledger_end_index == 2
    assert_reopens_intact(store, member_dir, state, 2)


def test_batch_is_one_write_per_data_file(member_dir, state, monkeypatch):
    """A batch costs one pwrite per data file it touches (plus the blank markers), not one per entry."""
    from dledger.store import mmapwriter as mmapfile

    writes = []
    real = mmapfile._write_at
    monkeypatch.setattr(mmapfile, "_write_at", lambda fd, data, off: (writes.append(len(data)), real(fd, data, off)))
    store = open_mmap(member_dir, state)
    stored = store.append_batch_as_leader([Entry(body=b, term=1) for b in bodies(10, size=200)])
    files = {e.pos // 1024 for e in stored}
    assert len(files) == 4
    assert [n for n in writes if n > 8] == [sum(e.size for e in stored if e.pos // 1024 == f) for f in sorted(files)]
    state.follow(1)
    follower = open_mmap(member_dir.parent / "follower", state)
    writes.clear()
    assert follower.append_batch_as_follower(stored, 1, "n1") == stored
    assert len([n for n in writes if n > 8]) == 4
    fired(store.shutdown())
    fired(follower.shutdown())


def test_batch_write_failure_keeps_the_runs_written_before(member_dir, state, monkeypatch):
    """ENOSPC on the second data file of a batch: the first file's entries stay, the caller learns which."""
    from dledger.errors import BatchAppendError
    from dledger.store import mmapwriter as mmapfile

    store = open_mmap(member_dir, state)
    real, calls = mmapfile._write_at, []

    def write_at(fd, data, off):
        calls.append(len(data))
        if len([n for n in calls if n > 8]) == 2:
            raise OSError(28, "No space left on device")
        real(fd, data, off)

    monkeypatch.setattr(mmapfile, "_write_at", write_at)
    with pytest.raises(BatchAppendError) as info:
        store.append_batch_as_leader([Entry(body=b, term=1) for b in bodies(6, size=200)])
    assert info.value.code == ResponseCode.DISK_FULL
    assert [e.index for e in info.value.stored] == [0, 1, 2] and store.ledger_end_index == 2
    monkeypatch.setattr(mmapfile, "_write_at", real)
    assert store.append_as_leader(Entry(body=b"after", term=1)).index == 3
    fired(store.flush())
    fired(store.shutdown())
    again = open_mmap(member_dir, state)
    assert again.ledger_end_index == 3 and again.get(3).body == b"after" and not again.recovered.cut
    fired(again.shutdown())


def test_batch_follower_bad_crc_keeps_the_entries_before_it(member_dir, state):
    """A follower batch with a damaged body stores the entries before it and refuses the rest."""
    from dledger.errors import BatchAppendError

    leader = open_mmap(member_dir, state)
    entries = leader.append_batch_as_leader([Entry(body=b, term=1) for b in bodies(6)])
    state.follow(1)
    follower = open_mmap(member_dir.parent / "follower", state)
    bad = entries[4]
    bad = Entry(body=bad.body[:-1] + b"?", index=bad.index, term=1, pos=bad.pos, body_crc=bad.body_crc)
    with pytest.raises(BatchAppendError) as info:
        follower.append_batch_as_follower(entries[:4] + [bad, entries[5]], 1, "n1")
    assert info.value.code == ResponseCode.UNEXPECTED_ARGUMENT and info.value.stored == entries[:4]
    assert follower.ledger_end_index == 3
    fired(leader.shutdown())
    fired(follower.shutdown())


def test_failing_hook_in_a_batch_keeps_the_entries_before_it(member_dir, state):
    """A hook raising on the third entry of a batch: the first two are stored, the batch fails with the hook error."""
    store = open_mmap(member_dir, state)

    class BoomOnThird:
        def before_append(self, entry, buffer, body_offset):
            if entry.index == 2:
                raise RuntimeError("boom")

    guard = LogGuard(store, state)
    guard.add_append_hook(BoomOnThird())
    with pytest.raises(BatchAppendError) as info:
        guard.append_batch_as_leader([Entry(body=b, term=1) for b in bodies(4)])
    assert isinstance(info.value.cause, AppendHookError) and len(info.value.stored) == 2
    assert store.ledger_end_index == 1 and store.get(1).body == bodies(2)[1]
    assert_reopens_intact(store, member_dir, state, 1)


def test_flushed_pages_are_unmapped_in_steps_not_every_round(member_dir, state, monkeypatch):
    """Flush rounds unmap flushed pages once a MiB of log was flushed since the last time, not each round."""
    from dledger.store.mappedfiles import MappedFile

    released = []
    real = MappedFile.release
    monkeypatch.setattr(MappedFile, "release", lambda f, a, b: (released.append((f.start, a, b)), real(f, a, b)))
    store = open_mmap(member_dir, state, data_file_size=2 << 20, index_file_size=64 << 10, max_entry_size=4096)
    for _ in range(3):
        store.append_batch_as_leader([Entry(body=b"x" * 1000, term=1) for _ in range(100)])
        fired(store.flush())
    assert released == [], "300 KB flushed: nothing unmapped yet"
    for _ in range(8):
        store.append_batch_as_leader([Entry(body=b"x" * 1000, term=1) for _ in range(100)])
        fired(store.flush())
    assert len(released) == 1 and released[0][2] > 1 << 20, "one data release past the first MiB"
    fired(store.shutdown())


def test_reserved_fields_and_bad_crc_are_refused(member_dir, state):
    """Durable stores refuse non-zero reserved fields and a follower entry whose body CRC does not match."""
    store = open_mmap(member_dir, state)
    expect_code(ResponseCode.UNEXPECTED_ARGUMENT, store.append_as_leader, Entry(body=b"x", term=1, channel=1))
    state.follow(1)
    bad = Entry(body=b"x", index=0, term=1, pos=0, body_crc=12345)
    expect_code(ResponseCode.UNEXPECTED_ARGUMENT, store.append_as_follower, bad, 1, "n1")
    assert store.ledger_end_index == -1
    fired(store.shutdown())


def test_java_zero_crc_follower_entries_need_the_option(member_dir, state):
    """An entry with bodyCrc 0 from a Java leader is stored only with acceptJavaZeroCrc."""
    state.follow(1)
    java = Entry(body=b"from-java", index=0, term=1, pos=0, body_crc=0)
    store = open_mmap(member_dir, state)
    expect_code(ResponseCode.UNEXPECTED_ARGUMENT, store.append_as_follower, java, 1, "n1")
    fired(store.shutdown())
    store = open_mmap(member_dir, state, accept_zero_crc=True)
    assert store.append_as_follower(java, 1, "n1") == java
    fired(store.shutdown())
    store = open_mmap(member_dir, state, accept_zero_crc=True)
    assert store.get(0) == java
    fired(store.shutdown())


# -- retention -----------------------------------------------------------------------------
def local(hour: int) -> float:
    return time.mktime((2026, 3, 10, hour, 30, 0, 0, 0, -1))


def aged_store(member_dir, state, *, committed, age_hours=100, usage=0.1, **kwargs):
    """A store with ~16 data files, all last modified ``age_hours`` before local(4).

    ``used[0]`` is the disk usage it reports: a fraction, or a function returning one.
    """
    used = [usage]
    store = open_mmap(member_dir, state, disk_usage=lambda: used[0]() if callable(used[0]) else used[0],
                      retention=RetentionPolicy(file_reserved_hours=72, delete_when="04", **kwargs))
    entries = append(store, 60, state, size=200)
    store.update_committed_index(1, committed)
    fired(store.flush())
    for p in store.data_files:
        os.utime(p, (local(4) - age_hours * 3600,) * 2)
    return store, entries, used


def first_index_of_file(entries, k):
    return next(e.index for e in entries if e.pos >= k * 1024)


def test_retention_deletes_expired_committed_files_at_delete_when(member_dir, state):
    """At a deleteWhen hour, expired files wholly below the committed index go; begin moves; the last file stays."""
    store, entries, _ = aged_store(member_dir, state, committed=59)
    n_files = len(store.data_files)
    removed = store.clean_expired(local(4))
    assert len(store.data_files) == 1 and removed == store.ledger_begin_index
    assert store.ledger_begin_index == first_index_of_file(entries, n_files - 1)
    expect_code(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, store.get, store.ledger_begin_index - 1)
    assert store.get(59) == entries[59]
    assert all(int(p.name) + 256 > store.ledger_begin_index * 32 for p in store.index_files)
    begin = store.ledger_begin_index
    fired(store.shutdown())
    again = open_mmap(member_dir, state)
    assert (again.ledger_begin_index, again.ledger_end_index) == (begin, 59)
    fired(again.shutdown())


def test_retention_never_deletes_above_committed(member_dir, state):
    """A file holding any entry above the committed index is kept, and so is every file after it."""
    store, entries, _ = aged_store(member_dir, state, committed=20)
    store.clean_expired(local(4))
    begin = store.ledger_begin_index
    assert 0 < begin <= 21
    file_of_21 = entries[21].pos // 1024
    assert int(store.data_files[0].name) // 1024 == file_of_21
    assert [store.get(i) for i in range(begin, 60)] == entries[begin:]
    fired(store.shutdown())


def test_retention_waits_for_delete_when_or_disk_pressure(member_dir, state):
    """Outside deleteWhen hours nothing goes, unless the disk is fuller than diskSpaceRatioToCheckExpired."""
    store, entries, used = aged_store(member_dir, state, committed=59)
    assert store.clean_expired(local(10)) == 0 and store.ledger_begin_index == 0
    used[0] = 0.75
    assert store.clean_expired(local(10)) > 0
    fired(store.shutdown())


def test_retention_keeps_files_younger_than_reserved_hours(member_dir, state):
    """Files modified within fileReservedHours are kept even at deleteWhen."""
    store, entries, _ = aged_store(member_dir, state, committed=59, age_hours=10)
    assert store.clean_expired(local(4)) == 0
    fired(store.shutdown())


def test_force_clean_deletes_young_committed_files_until_below_ratio(member_dir, state):
    """Past diskSpaceRatioToForceClean, young committed files go oldest first until the disk is below it."""
    store, entries, used = aged_store(member_dir, state, committed=59, age_hours=1)
    calls = []

    def usage():
        calls.append(1)
        return 0.95 if len(calls) < 4 else 0.5

    used[0] = usage
    removed = store.clean_expired(local(10))
    assert removed > 0 and len(store.data_files) > 1
    assert store.ledger_begin_index == removed
    fired(store.shutdown())


def test_force_clean_can_be_disabled(member_dir, state):
    """With enableDiskForceClean off, a full disk deletes only expired files."""
    store, entries, used = aged_store(member_dir, state, committed=59, age_hours=1,
                                      enable_disk_force_clean=False)
    used[0] = 0.88
    assert store.clean_expired(local(10)) == 0
    fired(store.shutdown())


def test_retention_runs_on_the_clock(member_dir, state, clock):
    """The store checks retention on its clock every clean_interval_ms."""
    clock.advance(local(4))
    store, entries, _ = aged_store(member_dir, state, committed=59)
    fired(store.shutdown())
    store = open_mmap(member_dir, state, clock=clock, clean_interval_ms=1000,
                      retention=RetentionPolicy(file_reserved_hours=72, delete_when="04"), disk_usage=lambda: 0.1)
    for p in store.data_files:
        os.utime(p, (local(4) - 100 * 3600,) * 2)
    assert store.ledger_begin_index == 0
    clock.advance(1)
    assert store.ledger_begin_index > 0
    fired(store.shutdown())


# -- disk full ---------------------------------------------------------------------------------
def test_disk_full_refuses_appends_and_recovers(member_dir, state, clock):
    """Past diskFullRatio appends fail with DISK_FULL, reads go on, and appends resume once space is freed."""
    used = [0.5]
    store = open_mmap(member_dir, state, clock=clock, disk_usage=lambda: used[0], clean_interval_ms=1000)
    append(store, 3, state)
    used[0] = 0.95
    clock.advance(1)
    assert store.disk_full
    expect_code(ResponseCode.DISK_FULL, store.append_as_leader, Entry(body=b"x", term=1))
    state.follow(1)
    nxt = Entry(body=b"y", index=3, term=1, pos=store.get(2).pos + store.get(2).size).sealed()
    expect_code(ResponseCode.DISK_FULL, store.append_as_follower, nxt, 1, "n1")
    assert store.get(2).index == 2 and store.ledger_end_index == 2
    used[0] = 0.6
    clock.advance(1)
    assert not store.disk_full
    assert store.append_as_follower(nxt, 1, "n1") == nxt
    fired(store.shutdown())


def test_disk_full_is_noticed_when_a_new_file_is_needed(member_dir, state):
    """Without waiting for the timer, rolling to a new data file re-checks the disk and refuses when full."""
    used = [0.5]
    store = open_mmap(member_dir, state, disk_usage=lambda: used[0])
    append(store, 3, state, size=300)
    used[0] = 0.99
    files = len(store.data_files)
    assert store.append_as_leader(Entry(body=b"fits", term=1)).index == 3, "no new file: no check"
    expect_code(ResponseCode.DISK_FULL, store.append_as_leader, Entry(body=b"z" * 700, term=1))
    assert store.ledger_end_index == 3 and len(store.data_files) == files
    fired(store.shutdown())


# -- term store and plugin ---------------------------------------------------------------------
def test_file_term_store_round_trip(member_dir):
    """FileTermVoteStore provides ITermVoteStore, starts at (0, None) and returns what was saved."""
    store = FileTermVoteStore(member_dir)
    assert verifyObject(ITermVoteStore, store)
    assert store.load() == (0, None)
    store.save(3, "n2")
    store.save(4, None)
    assert FileTermVoteStore(member_dir).load() == (4, None)
    assert (member_dir / "currterm").read_bytes() == b"voteLeader=\ncurrTerm=4\n"


@pytest.mark.parametrize("content, message", [
    (b"voteLeader=n1\n", "missing 'currTerm'"),
    (b"voteLeader=n1\ncurrTerm=abc\n", "'currTerm' is 'abc', not an integer"),
    (b"voteLeader=n1\ncurrTerm=-2\n", "must be >= 0"),
    (b"\xff\xfe\x00", "not a text file"),
    (b"garbage line\n", "is not 'key=value'"),
])
def test_corrupt_currterm_is_a_clear_error(member_dir, content, message):
    """A damaged currterm file raises StoreError naming the file and what is wrong (never term 0)."""
    member_dir.mkdir(parents=True)
    (member_dir / "currterm").write_bytes(content)
    with pytest.raises(StoreError, match=message) as info:
        FileTermVoteStore(member_dir).load()
    assert str(member_dir / "currterm") in str(info.value)


def test_missing_currterm_with_backup_is_an_error(member_dir):
    """currterm gone but currterm.bak present: refuse rather than forget a vote."""
    store = FileTermVoteStore(member_dir)
    store.save(2, "n1")
    store.save(3, "n1")
    (member_dir / "currterm").unlink()
    with pytest.raises(StoreError, match="currterm is missing but currterm.bak exists.*reset-vote .* --term 3"):
        FileTermVoteStore(member_dir).load()


def test_mmap_store_type_is_registered(tmp_path):
    """The mmap store type is a plugin: it builds a store and a currterm store from a config."""
    config = make_config(store_base_dir=str(tmp_path), store_type="mmap",
                         mapped_file_size_for_entry_data=4096, mapped_file_size_for_entry_index=512)
    st = get_store_type("mmap")
    store = st.make_log_store(config, FakeMemberState(), clock=task.Clock())
    store.startup()
    assert store.member_dir == tmp_path / "dledger-n0"
    append(store, 3, FakeMemberState())
    fired(store.shutdown())
    term = st.make_term_store(config)
    term.save(1, "n0")
    assert (tmp_path / "dledger-n0" / "currterm").exists()


def test_options_are_one_checked_value(member_dir, state):
    """A store's settings are one MmapStoreOptions (keywords replace fields); bad sizes or names fail at once."""
    from dledger.store.mmapoptions import MmapStoreOptions
    opts = MmapStoreOptions(data_file_size=1024, index_file_size=256, max_entry_size=1016)
    store = MmapLogStore(member_dir, state, opts, flush_policy="async")
    assert store.options == MmapStoreOptions(data_file_size=1024, index_file_size=256, max_entry_size=1016,
                                             flush_policy="async")
    assert store.data_file_size == 1024 and store.retention == RetentionPolicy()
    assert MmapStoreOptions(retention=None).retention == RetentionPolicy()
    with pytest.raises(ValueError, match="not a positive multiple of 32"):
        MmapStoreOptions(index_file_size=100)
    with pytest.raises(ValueError, match="cannot hold an entry"):
        MmapLogStore(member_dir, state, data_file_size=40)
    with pytest.raises(ValueError, match="flush policy 'sometimes'"):
        MmapLogStore(member_dir, state, flush_policy="sometimes")
    with pytest.raises(TypeError):
        MmapLogStore(member_dir, state, data_file_sise=1024)


def test_options_from_config_follow_the_member_config(tmp_path):
    """MmapLogStore.from_config builds its options from the DLedgerConfig fields it maps."""
    from dledger.config import DLedgerConfig
    cfg = DLedgerConfig(group="g", self_id="n0", peers="n0-127.0.0.1:1", store_base_dir=str(tmp_path),
                        mapped_file_size_for_entry_data=1 << 20, mapped_file_size_for_entry_index=1 << 16,
                        max_entry_size=1000, flush_policy="async", flush_file_interval=7, check_point_interval=99,
                        accept_java_zero_crc=True, truncate_damaged=True, file_reserved_hours=5)
    store = MmapLogStore.from_config(cfg, FakeMemberState(), clock=object())
    o = store.options
    assert (o.data_file_size, o.index_file_size, o.max_entry_size, o.flush_policy, o.flush_interval_ms,
            o.checkpoint_interval_ms, o.accept_zero_crc, o.truncate_damaged) == (
        1 << 20, 1 << 16, 1000, "async", 7, 99, True, True)
    assert o.retention == RetentionPolicy.from_config(cfg) and o.retention.file_reserved_hours == 5
    assert (o.full_verify, o.release_flushed_pages, o.clean_interval_ms) == (False, True, 1000)


def test_retention_policy_can_be_replaced_while_running(member_dir, state):
    """Assigning store.retention replaces the policy in the store's options; the next clean uses it."""
    store, entries, _ = aged_store(member_dir, state, committed=59)
    store.retention = RetentionPolicy(file_reserved_hours=float("inf"), enable_disk_force_clean=False)
    assert store.options.retention.file_reserved_hours == float("inf")
    assert store.clean_expired(local(4)) == 0
    fired(store.shutdown())


# -- the newest entries held in memory ---------------------------------------------------------

def test_reads_after_a_truncate_see_the_new_entries_not_the_dropped_ones(member_dir, state):
    """Entries served from memory are the log's own: after a truncate and new appends, reads give the new bytes."""
    state.follow(1)
    store = open_mmap(member_dir, state)
    old = LogStoreContract()._leader_entries(12, file_size=1024)
    for e in old:
        store.append_as_follower(e, 1, "n1")
    assert store.get_range(8, 10, 1 << 20) == old[8:]  # held: the same entries back
    state.follow(2)
    new = [Entry(body=b"new-%d" % i, index=e.index, term=2, pos=e.pos).sealed() for i, e in enumerate(old[8:10])]
    new[1] = Entry(body=new[1].body, index=new[1].index, term=2,
                   pos=new[0].pos + new[0].size).sealed()
    store.truncate(new[0], 2, "n1")
    store.append_as_follower(new[1], 2, "n1")
    assert store.ledger_end_index == 9
    assert [e.body for e in store.get_range(7, 10, 1 << 20)] == [old[7].body, b"new-0", b"new-1"]
    assert store.get(8).body == b"new-0" and store.get(9).term == 2
    fired(store.shutdown())
    again = open_mmap(member_dir, state)
    assert [e.body for e in again.get_range(7, 10, 1 << 20)] == [old[7].body, b"new-0", b"new-1"]
    fired(again.shutdown())


def test_entries_held_in_memory_equal_what_the_files_hold(member_dir, state):
    """Every entry a store serves from memory is the one a reopened store decodes from its files."""
    store = open_mmap(member_dir, state)
    written = append(store, 40, state, size=100)
    held = store.get_range(0, 100, 1 << 30)
    assert len({e.pos // store.data_file_size for e in written}) > 1, "the appends should roll data files"
    assert store._recent._bytes == sum(e.size for e in written), "its byte budget counts exactly what it holds"
    fired(store.shutdown())
    again = open_mmap(member_dir, state)
    assert held == written == again.get_range(0, 100, 1 << 30)
    fired(again.shutdown())


class _ChangesNothing:
    """An append hook that leaves every entry as it is: with it the store takes its general loop (``seal.into``)."""

    def before_append(self, entry, buffer, body_offset):
        pass


@pytest.mark.parametrize("case", ["plain", "file ends", "reserved field", "too large", "small index files"])
def test_plain_leader_loop_stores_what_the_general_loop_stores(tmp_path, case):
    """The leader's loop for plain entries (no hooks) gives the entries, errors and bytes the general loop gives
    (forced by a hook that changes nothing), wherever a batch stops being plain: at a data file's end, at an
    entry with a reserved field set, at an entry over maxEntrySize."""
    data_file_size = 1024 if case == "file ends" else 1 << 16
    # 20 records per index file: batches of 8 fill the first file's records at once and cross into the next
    # (the plain loop's records are copied in one slice only where one file holds them all); 8 per file
    # (256 bytes): each batch starts a new index file.
    index_file_size = 256 if case == "small index files" else 20 * 32
    batches = [[Entry(body=bytes([b * 16 + i]) * (30 + 41 * i), term=1) for i in range(8)] for b in range(4)]
    if case == "reserved field":
        batches[1][5].channel = 1
    elif case == "too large":
        batches[2][3] = Entry(body=b"x" * 2000, term=1)
    outcomes, contents, records, files = [], [], [], []

    def placed(e):
        return e.index, e.pos, e.body_crc, e.body

    for hooked in (False, True):
        state = FakeMemberState()
        store = open_mmap(tmp_path / f"hooked{hooked}", state, data_file_size=data_file_size,
                          index_file_size=index_file_size)
        guard = LogGuard(store, state)
        if hooked:
            guard.add_append_hook(_ChangesNothing())
        got = []
        for batch in batches:
            try:
                got.append(("stored", [placed(e) for e in guard.append_batch_as_leader(batch)]))
            except BatchAppendError as exc:
                got.append((exc.cause.code, [placed(e) for e in exc.stored]))
        outcomes.append(got)
        end = store.ledger_end_index
        contents.append([placed(e) for e in store.get_range(0, end + 1, 1 << 30)])
        # The index records as written (the plain loop encodes them with its entries, Round 2f), read from
        # the index files: get_range above may answer from the entries held in memory.
        records.append([store._ilog.read(i) for i in range(end + 1)])
        store.shutdown()
        files.append({str(f.relative_to(tmp_path / f"hooked{hooked}")): f.read_bytes()
                      for f in sorted((tmp_path / f"hooked{hooked}").rglob("*")) if f.is_file()})
    assert outcomes[0] == outcomes[1]
    assert contents[0] == contents[1] and contents[0][-1][0] == outcomes[0][-1][1][-1][0]
    assert records[0] == records[1] and None not in records[0]
    assert records[0] == [(1, pos, 48 + len(body), index, 1) for index, pos, _, body in contents[0]]
    assert files[0] == files[1]  # data and index files byte for byte
    kinds = [kind for kind, _ in outcomes[0]]
    assert kinds == (["stored"] * 4 if case in ("plain", "file ends", "small index files") else
                     ["stored", ResponseCode.UNEXPECTED_ARGUMENT, "stored", "stored"] if case == "reserved field" else
                     ["stored", "stored", ResponseCode.UNEXPECTED_ARGUMENT, "stored"]), kinds
    if case == "file ends":
        assert len({pos // data_file_size for _, pos, _, _ in contents[0]}) > 3, "the batches crossed data files"
