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


class RecordingReactor(task.Clock):
    """Records which descriptors asked to read/write; never polls (nothing is sent unless the code sends it)."""

    def __init__(self):
        super().__init__()
        self.writers, self.readers = set(), set()

    def addWriter(self, w):
        self.writers.add(w)

    def removeWriter(self, w):
        self.writers.discard(w)

    def addReader(self, r):
        self.readers.add(r)

    def removeReader(self, r):
        self.readers.discard(r)


@pytest.fixture
def never_polls():
    """A Clock that records ``addWriter``/``addReader`` and never polls: on a real connection (:func:`wire`),
    whatever the peer can read was sent by the code under test itself (dledger.transport.outbox's tests)."""
    return RecordingReactor()


@pytest.fixture
def wire():
    """A connected 127.0.0.1 pair: (our end's socket, the peer's socket, non-blocking); both closed after."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    ours = socket.create_connection(listener.getsockname())
    peer, _ = listener.accept()
    listener.close()
    peer.setblocking(False)
    yield ours, peer
    ours.close()
    peer.close()
