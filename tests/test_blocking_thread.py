"""dledger.blocking.ReactorThread: the private reactor thread the blocking clients share (issue #26)."""

from __future__ import annotations

import threading

import pytest
from twisted.internet.defer import Deferred, succeed
from twisted.internet.defer import TimeoutError as DeferredTimeout

from dledger.blocking import ReactorThread


@pytest.fixture
def rt():
    thread = ReactorThread("test-reactor-thread")
    yield thread
    thread.stop()


def test_call_runs_on_the_reactor_thread_and_returns_the_result(rt):
    assert rt.call(lambda: threading.current_thread().name) == "test-reactor-thread"
    assert rt.call(lambda: succeed(41).addCallback(lambda n: n + 1)) == 42


def test_a_later_firing_deferred_is_waited_for(rt):
    def later():
        d = Deferred()
        rt.reactor.callLater(0.01, d.callback, "fired")
        return d
    assert rt.call(later, timeout=10) == "fired"


def test_the_failure_is_raised_in_the_caller(rt):
    def boom():
        raise ValueError("bad input")
    with pytest.raises(ValueError, match="bad input"):
        rt.call(boom)


def test_a_pending_deferred_is_cancelled_after_the_timeout(rt):
    pending: list[Deferred] = []

    def never():
        d = Deferred()
        pending.append(d)
        return d
    with pytest.raises(DeferredTimeout):
        rt.call(never, timeout=0.05)
    assert pending[0].called  # cancelled, not left hanging


def test_several_threads_share_one(rt):
    out: list[int] = []
    lock = threading.Lock()

    def worker(i):
        value = rt.call(lambda: i * i, timeout=10)
        with lock:
            out.append(value)
    workers = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(10)
    assert sorted(out) == [i * i for i in range(8)]


def test_stop_ends_the_thread_once_and_later_calls_are_refused():
    rt = ReactorThread("test-stop")
    assert rt.alive
    rt.stop()
    rt.stop()  # idempotent
    assert not rt.alive
    with pytest.raises(RuntimeError, match="test-stop: the reactor thread is stopped"):
        rt.call(lambda: 1)
