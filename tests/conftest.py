"""Shared fixtures: a Clock for deterministic time, and the real reactor for network tests."""

import pytest
from twisted.internet import task


@pytest.fixture
def clock():
    """A deterministic clock (``twisted.internet.task.Clock``)."""
    return task.Clock()


@pytest.fixture
def reactor():
    """The running global reactor (pytest-twisted installs it); pytest-twisted has no such fixture."""
    from twisted.internet import reactor as _reactor
    return _reactor
