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
