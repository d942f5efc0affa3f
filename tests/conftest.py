"""Shared fixtures: a Clock for deterministic time, and the real reactor for network tests."""

import os

import pytest
from hypothesis import settings
from twisted.internet import task

# Property tests check behaviour, never speed: Hypothesis's default 200 ms deadline per example turned a
# codec round trip red on a loaded 2-core machine (DeadlineExceeded at 290 ms). No deadline, anywhere.
settings.register_profile("dledger", deadline=None)
settings.load_profile("dledger")

# Spark sessions start without the driver's class archive (dledger_spark.session): recording one costs a
# fresh machine about 30 s at its first ingest (test_spark_bench.py: 49 s recording, 19 s without), more
# than the later sessions of one run win back, and CI always starts fresh.  The archive's decisions have
# their own table tests (tests/spark/test_spark_planning.py).  Set DLEDGER_SPARK_CLASS_ARCHIVE to a path to
# run the tests with one.  (Here, not in a tests/spark/conftest.py: a second module named ``conftest``
# would shadow tests/rocketmq's, which test modules import by that name.)
os.environ.setdefault("DLEDGER_SPARK_CLASS_ARCHIVE", "off")


@pytest.fixture
def clock():
    """A deterministic clock (``twisted.internet.task.Clock``)."""
    return task.Clock()


@pytest.fixture
def reactor():
    """The running global reactor (pytest-twisted installs it); pytest-twisted has no such fixture."""
    from twisted.internet import reactor as _reactor
    return _reactor
