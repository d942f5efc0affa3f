"""Pipelined group commit (issue #28, round 2b): two flush rounds may run at once, acknowledged in order.

An append counts as durable (a leader's commit, a follower's ack) when ``flush()`` fires with an index at or
past it.  With two rounds in flight the second round's own fdatasync may end first: these tests complete
the rounds' jobs by hand (:class:`dledger.testing.handio.HandIO`, no threads, no time) in every order and
check that no flush fires with an index whose bytes no finished fdatasync covered.
"""

import pytest
from twisted.internet.defer import Deferred

from dledger.entry import Entry
from dledger.store.groupcommit import FlushPlan, GroupCommit
from dledger.store.mmapfile import MmapLogStore
from dledger.testing.handio import HandIO
from dledger.testing.store_contract import FakeMemberState, fired

S = 1024  # data file size: a few entries per file, so rounds touch new files and directories


def _open(path, io, **settings):
    store = MmapLogStore(path, FakeMemberState(), data_file_size=S, index_file_size=256, blocking_io=io, **settings)
    store.startup()
    return store


class SyncLog:
    """Stands in for ``diskio.flush_files``: records, per finished call, the data bytes it made durable."""

    def __init__(self, store):
        self.store = store
        self.durable_upto: list[int] = []  # per finished job: the end of the log's bytes it synced (max so far)

    def __call__(self, synced, new, dirs):
        fds = set(synced) | set(new)
        ends = [f.end for f in self.store._data.files if f.fd in fds]
        self.durable_upto.append(max(ends, default=0))


def _acks(store, d: Deferred, syncs: SyncLog, acks: list):
    """On firing: the index acknowledged, and whether every entry up to it lies in bytes a finished job synced."""
    def fired_with(index):
        pos_end = store.get(index).pos + store.get(index).size if index >= 0 else 0
        covered = 0
        for upto in syncs.durable_upto:  # jobs in the order they finished; a later one never covers a gap
            covered = max(covered, upto)
        acks.append((index, len(syncs.durable_upto), pos_end <= covered))
        return index
    return d.addCallback(fired_with)


def test_the_next_round_starts_while_the_previous_one_runs(tmp_path, monkeypatch):
    """A flush asked for while a round runs gets its own round at once, not after the running one ends."""
    from dledger import diskio

    io = HandIO()
    store = _open(tmp_path / "m", io)
    monkeypatch.setattr(diskio, "flush_files", SyncLog(store))
    store.append_batch_as_leader([Entry(body=bytes(100), term=1) for _ in range(3)])
    d1 = store.flush()
    store.append_batch_as_leader([Entry(body=bytes(100), term=1) for _ in range(3)])
    d2 = store.flush()
    assert len(io.calls) == 2, "the second round's job was issued beside the first"
    store.append_batch_as_leader([Entry(body=bytes(100), term=1)])
    d3 = store.flush()
    assert len(io.calls) == 2, "at most two rounds run at once"
    io.drain()
    assert (fired(d1), fired(d2), fired(d3)) == (2, 5, 6)
    store.abandon()


@pytest.mark.parametrize("order", [(0, 0), (1, 0)], ids=["in_order", "second_job_ends_first"])
def test_an_append_is_acknowledged_only_after_its_bytes_were_fdatasynced(tmp_path, monkeypatch, order):
    """Whichever job ends first, a flush fires only with entries every finished fdatasync covers."""
    from dledger import diskio

    io = HandIO()
    store = _open(tmp_path / "m", io)
    syncs = SyncLog(store)
    monkeypatch.setattr(diskio, "flush_files", syncs)
    acks: list = []
    store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(2)])
    d1 = _acks(store, store.flush(), syncs, acks)
    store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(4)])  # into new data files
    d2 = _acks(store, store.flush(), syncs, acks)
    io.complete(order[0])
    if order[0] == 1:
        assert acks == [] and store.flushed_index == -1, "the second round ended, but the first is not durable"
    io.complete(order[1])
    assert fired(d1) == 1 and fired(d2) == 5
    assert [a[0] for a in acks] == [1, 5]
    assert all(covered for _i, _jobs, covered in acks), acks
    assert acks[-1][1] == 2, "the last ack came after both jobs"
    store.abandon()


def test_a_failed_round_makes_the_round_after_it_sync_again(tmp_path, monkeypatch):
    """The first round fails after the second ended: the second's entries are not durable (the first's bytes
    are not), so its flush is served by a new round that syncs the first round's files again."""
    from dledger import diskio

    io = HandIO()
    store = _open(tmp_path / "m", io)
    syncs = SyncLog(store)
    calls = []

    def flush_files(synced, new, dirs):
        calls.append(set(synced) | set(new))
        syncs(synced, new, dirs)

    monkeypatch.setattr(diskio, "flush_files", flush_files)
    acks: list = []
    store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(2)])
    first_fds = {f.fd for f in store._data.files}
    d1 = store.flush()
    store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(2)])
    d2 = _acks(store, store.flush(), syncs, acks)
    io.complete(1)  # the second round's fdatasync ends
    io.fail(0, OSError(5, "EIO"))  # then the first one fails
    failures = []
    d1.addErrback(failures.append)
    assert failures and acks == [] and store.flushed_index == -1
    assert len(io.calls) == 1, "a new round for the second round's flush"
    io.complete(0)
    assert fired(d2) == 3 and acks and all(c for _i, _j, c in acks)
    assert first_fds <= calls[-1], "the new round synced the first round's file again"
    store.abandon()


def test_one_round_at_a_time_when_asked(tmp_path, monkeypatch):
    """``flush_rounds=1``: a flush asked for while a round runs waits for its end (the pre-2b behaviour)."""
    from dledger import diskio

    io = HandIO()
    store = _open(tmp_path / "m", io, flush_rounds=1)
    monkeypatch.setattr(diskio, "flush_files", SyncLog(store))
    store.append_batch_as_leader([Entry(body=bytes(100), term=1)])
    d1 = store.flush()
    store.append_batch_as_leader([Entry(body=bytes(100), term=1)])
    d2 = store.flush()
    assert len(io.calls) == 1
    io.step()
    assert fired(d1) == 0 and len(io.calls) == 1
    io.step()
    assert fired(d2) == 1
    store.abandon()


def test_files_removed_while_two_rounds_run_close_after_both_that_may_use_them(tmp_path):
    """A removed file stays open until every round running when it was removed has ended, not a later one."""
    io = HandIO()
    state = FakeMemberState()
    state.follow(1)
    store = MmapLogStore(tmp_path / "m", state, data_file_size=S, index_file_size=256, blocking_io=io)
    store.startup()
    from dledger.testing.store_contract import LogStoreContract

    entries = LogStoreContract()._leader_entries(30, file_size=S)
    for e in entries[:20]:
        store.append_as_follower(e, 1, "n1")
    d1 = store.flush()
    for e in entries[20:]:
        store.append_as_follower(e, 1, "n1")
    d2 = store.flush()
    store.truncate(entries[2], 1, "n1")  # removes files both running rounds may be syncing
    held = store.closing_files
    assert held and all(not f.mm.closed for f in held)
    io.complete(0)
    assert store.closing_files == held, "the second round still runs"
    d3 = store.flush()  # started after the removal: does not hold the files back
    io.complete(0)
    assert not store.closing_files and all(f.mm.closed for f in held)
    io.drain()
    assert fired(d1) == 2 and fired(d2) == 2 and fired(d3) == 2
    store.abandon()


class _Plans:
    """A prepare function handing out plans whose work does nothing (the GroupCommit alone)."""

    def __init__(self):
        self.end = -1

    def __call__(self) -> FlushPlan:
        return FlushPlan(self.end, (lambda: None) if self.end >= 0 else None)


@pytest.mark.parametrize("rule, depth, cap_at, expected", [
    ("cap_lowers_every_running_round", 2, 0, (0, 0)),
    ("no_cap", 2, None, (1, 3)),
    ("one_at_a_time_cap_lowers_the_running_round", 1, 0, (0, 3)),
])
def test_cap_while_rounds_run(rule, depth, cap_at, expected):
    """A truncate while rounds run: none of them reports past what is left."""
    io, plans = HandIO(), _Plans()
    gc = GroupCommit(io, plans, depth=depth)
    plans.end = 1
    d1 = gc.request()
    plans.end = 3
    d2 = gc.request()
    if cap_at is not None:
        gc.cap(cap_at)
    io.drain()
    assert (fired(d1), fired(d2)) == expected


def test_nothing_dirty_behind_a_running_round_waits_for_it():
    """A round with no work, asked for while a round runs, fires only after the running one."""
    io, plans = HandIO(), _Plans()
    gc = GroupCommit(io, plans, depth=2)
    plans.end = 4
    d1 = gc.request()
    plans.end = -1  # the prepare finds nothing dirty now
    got = []
    gc.request().addCallback(got.append)
    assert got == [], "must not fire before the round that covers the entries"
    io.step()
    assert fired(d1) == 4 and got == [4]


def test_depth_must_be_one_or_more():
    with pytest.raises(ValueError, match="at least 1"):
        GroupCommit(HandIO(), _Plans(), depth=0)


def test_a_member_asks_the_next_flush_at_once_and_counts_entries_only_once_synced(tmp_path, monkeypatch):
    """The member's Flusher (what a leader counts and a follower acknowledges by) keeps two flushes in flight
    on a pipelining store, and resolves a wait only once every finished fdatasync covers the entry."""
    from twisted.internet import task

    from dledger import diskio
    from dledger.replication.durability import Flusher

    io, clock = HandIO(), task.Clock()
    store = _open(tmp_path / "m", io)
    syncs = SyncLog(store)
    monkeypatch.setattr(diskio, "flush_files", syncs)
    flusher = Flusher(store, clock)
    acks: list = []
    store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(2)])
    w1 = _acks(store, flusher.wait(1), syncs, acks)
    clock.advance(0)
    store.append_batch_as_leader([Entry(body=bytes(300), term=1) for _ in range(4)])
    w2 = _acks(store, flusher.wait(5), syncs, acks)
    clock.advance(0)
    assert len(io.calls) == 2, "the second flush was asked for while the first ran"
    io.complete(1)
    clock.advance(0)
    assert acks == [], "the second round ended first: nothing is counted before the first one ends"
    io.complete(0)
    clock.advance(0)
    assert fired(w1) == 1 and fired(w2) == 5 and [a[0] for a in acks] == [1, 5]
    assert all(covered and jobs == 2 for _i, jobs, covered in acks), acks
    flusher.stop()
    store.abandon()


def test_a_member_keeps_one_flush_in_flight_on_a_store_that_runs_one_round():
    """A store whose ``flush_rounds`` is 1 (memory, lmdb, the simulated disk) gets one flush at a time, as before."""
    from twisted.internet import task

    from dledger.replication.durability import Flusher

    class OneRound:
        flushed_index = -1
        flush_rounds = 1

        def __init__(self):
            self.asked: list[Deferred] = []

        def flush(self):
            d = Deferred()
            self.asked.append(d)
            return d

    store, clock = OneRound(), task.Clock()
    flusher = Flusher(store, clock)
    flusher.wait(0)
    clock.advance(0)
    flusher.wait(1)
    clock.advance(0)
    assert len(store.asked) == 1
    store.flushed_index = 0
    store.asked[0].callback(0)
    clock.advance(0)
    assert len(store.asked) == 2


def test_a_tiny_round_runs_here_a_new_file_or_a_large_round_on_the_worker(tmp_path, monkeypatch):
    """The store plans where each round's sync runs; a round run here still acknowledges only what it synced."""
    from dledger import diskio

    io = HandIO()
    store = MmapLogStore(tmp_path / "m", FakeMemberState(), data_file_size=1 << 16, index_file_size=4096,
                         blocking_io=io)
    store.startup()
    syncs = SyncLog(store)
    monkeypatch.setattr(diskio, "flush_files", syncs)
    store._flushing.here_bytes = 2048
    store.append_batch_as_leader([Entry(body=bytes(100), term=1)])
    d1 = store.flush()  # the first round syncs the new files and their directories: the worker
    io.drain()
    assert io.here == 0 and fired(d1) == 0
    store.append_batch_as_leader([Entry(body=bytes(100), term=1) for _ in range(3)])
    d2 = store.flush()
    assert io.here == 1, "a few hundred bytes in a file synced before: here"
    io.drain()
    assert fired(d2) == 3 and len(syncs.durable_upto) == 2
    store.append_batch_as_leader([Entry(body=bytes(1000), term=1) for _ in range(3)])
    d3 = store.flush()
    io.drain()
    assert io.here == 1 and fired(d3) == 6, "past the limit: the worker"
    store.abandon()


def test_a_round_run_here_runs_on_the_calling_thread_and_fires_before_request_returns():
    """``BlockingIO.run_here`` runs on the calling thread even when threaded: no worker, no hand-off back."""
    import threading

    from dledger.diskio import BlockingIO

    class Reactor:
        def callFromThread(self, f, *a):
            raise AssertionError("a round run here needs no hand-off back")

    io = BlockingIO(Reactor(), threaded=True)
    ran_on: list = []
    plan = FlushPlan(7, lambda: ran_on.append(threading.get_ident()), here=True)
    gc = GroupCommit(io, lambda: plan, depth=2)
    d = gc.request()
    assert ran_on == [threading.get_ident()] and io.threads_started == 0 and fired(d) == 7
    failing = FlushPlan(8, lambda: 1 / 0, here=True)
    gc = GroupCommit(io, lambda: failing)
    errors: list = []
    gc.request().addErrback(lambda f: errors.append(f.value.code))
    assert errors and gc.flushed_index == -1


def test_the_flusher_sends_what_a_round_run_here_answered(monkeypatch):
    """A round that fired in ``store.flush()`` (synced here): the replies its waiters wrote are sent at once
    (``send_written``), as a worker's results are by ``BlockingIO.after_results``."""
    from twisted.internet.task import Clock

    from dledger.replication import durability

    events: list = []
    monkeypatch.setattr(durability, "send_written", lambda: events.append("sent"))
    gc = GroupCommit(HandIO(), lambda: FlushPlan(3, None))

    class Store:  # a round with nothing to sync fires inside flush(), as one synced here does
        flush_rounds = 2

        @property
        def flushed_index(self):
            return gc.flushed_index

        def flush(self):
            return gc.request()

    clock = Clock()
    flusher = durability.Flusher(Store(), clock)
    flusher.wait(3).addCallback(lambda i: events.append(("answered", i)))
    clock.advance(0)
    assert events == [("answered", 3), "sent"]


@pytest.mark.parametrize("rule, sync_s, expected", [
    ("fast_sync_stays_here", 0.0003, 0),
    ("at_the_bound_stays_here", 0.001, 0),
    ("slow_sync_backs_off", 0.0011, 64),
])
def test_here_backoff(rule, sync_s, expected):
    from dledger.store.groupcommit import here_backoff

    assert here_backoff(sync_s) == expected


def test_a_slow_sync_here_sends_the_next_small_rounds_to_the_worker(monkeypatch):
    """A round synced here that kept the reactor past HERE_SLOW_S: the next HERE_BACKOFF_ROUNDS go to the
    worker, then one is tried here again; a fast one keeps the rounds here."""
    from twisted.internet.defer import maybeDeferred

    from dledger.store import groupcommit

    now = [0.0]
    monkeypatch.setattr(groupcommit, "perf_counter", lambda: now[0])

    class RunsHere(HandIO):
        def run_here(self, fn, *args):
            self.here += 1
            return maybeDeferred(fn, *args)

    sync_s = [0.005]
    io = RunsHere()
    gc = GroupCommit(io, lambda: FlushPlan(1, lambda: now.__setitem__(0, now[0] + sync_s[0]), here=True))
    gc.request()
    assert io.here == 1 and gc.here_backoff == groupcommit.HERE_BACKOFF_ROUNDS
    sync_s[0] = 0.0002
    for _ in range(groupcommit.HERE_BACKOFF_ROUNDS):
        gc.request()
        assert len(io.calls) == 1, "on the worker"
        io.drain()
    assert io.here == 1
    gc.request()
    gc.request()
    assert io.here == 3 and not io.calls, "tried here again, and fast: kept here"
