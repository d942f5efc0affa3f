"""dledger.testing.wait_until: a bounded poll for blocking test code waiting on another process."""

from __future__ import annotations

import pytest

from dledger.testing import wait_until


def test_wait_until_returns_the_first_truthy_value():
    """The condition is called until it gives something truthy, which is what wait_until returns."""
    calls = []

    def ready():
        calls.append(1)
        return ["ready"] if len(calls) == 3 else []

    assert wait_until(ready, 5, "ready", interval=0) == ["ready"] and len(calls) == 3


def test_wait_until_stops_at_its_deadline_naming_what_never_happened():
    """A condition that never holds ends in a TimeoutError naming it, after at least one call."""
    calls = []
    with pytest.raises(TimeoutError, match="timed out after 0s waiting for the port"):
        wait_until(lambda: calls.append(1), 0, "the port", interval=0)
    assert calls, "the condition runs at least once, even with no time to wait"


def test_wait_until_lets_the_conditions_errors_through():
    """An exception from the condition propagates at once (a condition that expects some catches them)."""
    def broken():
        raise AssertionError("the process died")

    with pytest.raises(AssertionError, match="the process died"):
        wait_until(broken, 5, "anything")


def test_simulated_io_runs_jobs_after_their_latency_and_a_crash_decides_what_landed():
    """SimulatedIO (term/vote writes in simulations): a job runs when its latency has passed; a crash lets each
    job in flight land or not (seeded) and fires no Deferred; stop() runs what is left at once."""
    import random

    from twisted.internet import task

    from dledger.testing.simdisk import SimulatedIO

    clock = task.Clock()
    io = SimulatedIO(clock, 0.004, random.Random(3))
    done, written = [], []
    io.run(written.append, "a").addCallback(done.append)
    assert written == [] and done == []
    clock.advance(0.004)
    assert written == ["a"] and done == [None]
    failed = []
    io.run(lambda: 1 / 0).addErrback(lambda f: failed.append(f.type))
    clock.advance(0.004)
    assert failed == [ZeroDivisionError]
    fired = []
    for k in range(40):
        io.run(written.append, k).addBoth(fired.append)
    landed = io.crash()
    assert fired == [] and 0 < landed < 40 and len(written) == 1 + landed
    clock.advance(1)
    assert len(written) == 1 + landed, "nothing runs after the crash"
    io.run(written.append, "last").addCallback(fired.append)
    io.stop()
    assert written[-1] == "last" and fired == [None]
