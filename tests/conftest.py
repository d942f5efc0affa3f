"""Shared fixtures: a Clock for deterministic time, and the real reactor for network tests."""

import pytest
from hypothesis import settings
from twisted.internet import task

# Property tests check behaviour, never speed: Hypothesis's default 200 ms deadline per example turned a
# codec round trip red on a loaded 2-core machine (DeadlineExceeded at 290 ms). No deadline, anywhere.
settings.register_profile("dledger", deadline=None)
settings.load_profile("dledger")


@pytest.fixture
def clock():
    """A deterministic clock (``twisted.internet.task.Clock``)."""
    return task.Clock()


@pytest.fixture
def reactor():
    """The running global reactor (pytest-twisted installs it); pytest-twisted has no such fixture."""
    from twisted.internet import reactor as _reactor
    return _reactor
