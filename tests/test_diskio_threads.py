"""The threaded BlockingIO: its own few worker threads, results on the reactor thread, nothing lost at stop.

The async tests run under the real reactor (pytest-twisted); every job that
blocks waits on a threading.Event with a bound, so a broken pool fails the
test instead of hanging it.  ``RecordingReactor`` checks the shutdown trigger
without stopping the real reactor.
"""

from __future__ import annotations

import threading

import pytest
import pytest_twisted
from twisted.internet.defer import gatherResults

from dledger.diskio import INLINE, BlockingIO

WAIT = 10.0  # bound on every wait for another thread; never reached when the pool works


def wait_for(event: threading.Event) -> str:
    """A job that blocks until ``event`` is set; fails (rather than hangs) if it never is."""
    if not event.wait(WAIT):
        raise TimeoutError("event not set")
    return threading.current_thread().name


class Boom(Exception):
    """The exception a failing job raises."""


def boom(text: str) -> None:
    raise Boom(text)


class RecordingReactor:
    """Just enough of a reactor: records system event triggers; callFromThread queues calls for :meth:`drain`."""

    def __init__(self):
        self.triggers: dict[int, tuple[str, str, object]] = {}
        self.calls: list = []
        self._next = 0

    def addSystemEventTrigger(self, phase, event, f, *args):
        self._next += 1
        self.triggers[self._next] = (phase, event, f)
        return self._next

    def removeSystemEventTrigger(self, trigger):
        del self.triggers[trigger]

    def callFromThread(self, f, *args):
        self.calls.append((f, args))  # list.append is atomic under the GIL

    def fire(self, phase, event):
        for trigger, (p, e, f) in list(self.triggers.items()):
            if (p, e) == (phase, event):
                del self.triggers[trigger]
                f()

    def drain(self):
        while self.calls:
            f, args = self.calls.pop(0)
            f(*args)


@pytest_twisted.ensureDeferred
async def test_result_arrives_on_the_reactor_thread(reactor):
    """A job runs on a worker thread and its result fires the Deferred on the reactor thread."""
    io = BlockingIO(reactor, threaded=True)
    reactor_thread = threading.current_thread()
    fired_on = []
    try:
        d = io.run(lambda x: (threading.current_thread(), x * 2), 21)
        d.addCallback(lambda r: (fired_on.append(threading.current_thread()), r)[1])
        worker, value = await d
    finally:
        io.stop()
    assert value == 42
    assert worker is not reactor_thread and worker.name.startswith("dledger-io-")
    assert fired_on == [reactor_thread]


@pytest_twisted.ensureDeferred
async def test_exception_comes_back_with_its_type_message_and_traceback(reactor):
    """A job's exception errbacks its Deferred with the original type and message, and the job's own frame."""
    io = BlockingIO(reactor, threaded=True)
    try:
        d = io.run(boom, "disk on fire")
        failures = []
        d.addErrback(failures.append)
        await d
    finally:
        io.stop()
    (failure,) = failures
    assert failure.type is Boom and str(failure.value) == "disk on fire"
    assert "boom" in [frame[0] for frame in failure.frames]


@pytest_twisted.ensureDeferred
async def test_jobs_in_flight_run_side_by_side_and_all_answer(reactor):
    """Three jobs that only finish together (a barrier) all answer: the workers run them at the same time."""
    io = BlockingIO(reactor, threaded=True, workers=4)
    barrier = threading.Barrier(3, timeout=WAIT)
    try:
        results = await gatherResults([io.run(lambda i=i: (barrier.wait(), i)[1]) for i in range(3)])
    finally:
        io.stop()
    assert results == [0, 1, 2]
    assert io.threads_started == 3


@pytest_twisted.ensureDeferred
async def test_never_more_than_workers_threads(reactor):
    """Six jobs blocked at once start only ``workers`` (2) threads; the queued ones run as threads free up."""
    io = BlockingIO(reactor, threaded=True, workers=2)
    release = threading.Event()
    before = {t.name for t in threading.enumerate()}
    try:
        ds = [io.run(wait_for, release) for _ in range(6)]
        assert io.threads_started == 2
        started = {t.name for t in threading.enumerate()} - before
        release.set()
        names = await gatherResults(ds)
    finally:
        release.set()
        io.stop()
    assert len(started) == 2 and set(names) <= started


@pytest_twisted.ensureDeferred
async def test_threads_start_lazily_one_per_busy_worker(reactor):
    """No thread before the first job; jobs run one after the other never start a second thread."""
    io = BlockingIO(reactor, threaded=True, workers=4)
    try:
        assert io.threads_started == 0
        for i in range(5):
            assert await io.run(lambda i=i: i) == i
    finally:
        io.stop()
    assert io.threads_started == 1


def test_queued_jobs_run_and_fire_before_stop_returns(reactor):
    """Jobs queued when stop is called still run (an fsync asked for happens) and their Deferreds have fired."""
    io = BlockingIO(reactor, threaded=True, workers=1)
    started, release = threading.Event(), threading.Event()
    ran = []

    def first():
        started.set()
        wait_for(release)
        ran.append("first")

    ds = [io.run(first)] + [io.run(ran.append, name) for name in ("second", "third")]
    assert started.wait(WAIT)
    assert io._jobs.qsize() == 2  # second and third are still queued behind the busy worker
    release.set()
    io.stop()
    assert ran == ["first", "second", "third"]
    assert all(d.called for d in ds)
    assert not any(t.is_alive() for t in io._threads)


def test_job_after_stop_runs_inline_and_answers(reactor):
    """After stop a job runs inline on the calling thread and its Deferred has already fired."""
    io = BlockingIO(reactor, threaded=True)
    io.stop()
    d = io.run(lambda: threading.current_thread())
    assert d.called and io.stopped
    assert d.result is threading.current_thread()
    failed = io.run(boom, "late")
    assert failed.called
    assert failed.result.type is Boom
    failed.addErrback(lambda f: None)


def test_shutdown_trigger_is_during_shutdown_and_runs_queued_jobs():
    """The first job registers one 'during shutdown' trigger; firing it runs queued jobs and fires their Deferreds."""
    reactor = RecordingReactor()
    io = BlockingIO(reactor, threaded=True, workers=1)
    assert reactor.triggers == {}  # no thread, no trigger before the first job
    started, release = threading.Event(), threading.Event()
    ran = []
    ds = [io.run(lambda: (started.set(), wait_for(release))), io.run(ran.append, "queued"), io.run(boom, "x")]
    assert [(p, e) for p, e, _ in reactor.triggers.values()] == [("during", "shutdown")]
    assert started.wait(WAIT)
    reactor.fire("before", "shutdown")
    assert not io.stopped  # the member's stop (the 'before' phase) can still use the workers
    release.set()
    reactor.fire("during", "shutdown")
    assert io.stopped and ran == ["queued"] and reactor.triggers == {}
    assert [d.called for d in ds] == [True, True, True]
    assert ds[2].result.type is Boom
    ds[2].addErrback(lambda f: None)
    reactor.drain()  # the workers' late wake-ups find nothing left to deliver
    assert [d.called for d in ds] == [True, True, True]


def test_explicit_stop_removes_the_shutdown_trigger():
    """A BlockingIO stopped by its owner leaves no trigger behind (no pile-up in a long-lived process)."""
    reactor = RecordingReactor()
    io = BlockingIO(reactor, threaded=True)
    d = io.run(lambda: 7)
    assert len(reactor.triggers) == 1
    io.stop()
    assert reactor.triggers == {}
    assert d.result == 7
    io.stop()  # idempotent


def test_bad_arguments_are_refused():
    """A threaded BlockingIO needs a reactor with threads and at least one worker; INLINE ignores stop."""
    from twisted.internet.task import Clock

    with pytest.raises(ValueError, match="needs a reactor"):
        BlockingIO(threaded=True)
    with pytest.raises(TypeError, match="needs a reactor with threads"):
        BlockingIO(Clock(), threaded=True)  # its results could never come back
    with pytest.raises(ValueError, match="at least one worker"):
        BlockingIO(RecordingReactor(), threaded=True, workers=0)
    INLINE.stop()
    assert not INLINE.stopped and INLINE.run(lambda: 3).result == 3


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_twistd_member_flushes_on_its_workers_and_exits_0_promptly_on_sigterm(tmp_path, reactor):
    """A twistd mmap member's acknowledged appends are in its files after SIGTERM, and it exits 0 in time."""
    import signal

    from dledger.launcher import LocalGroup

    group = LocalGroup(tmp_path, n=1, store="mmap", reactor=reactor)
    client = group.client()
    bodies = [b"entry %d" % i for i in range(20)]
    try:
        group.start()
        await group.wait_ready(client, "n0", 30)
        await group.wait_for_leader(client, 20)
        for body in bodies:
            await client.append(body)
        group.signal("n0", signal.SIGTERM)
        assert await group.wait_exit("n0", 20) == 0
        assert group.log_lines("n0", "stopped cleanly")
        log = await group.read_log("n0")
    finally:
        await client.close()
        group.close()
    stored = [e.body for e in log.entries]
    assert stored[-len(bodies):] == bodies
    assert log.committed == log.end
