"""dledger.testing.Cluster on the real reactor (pytest-twisted), for applications tested in real time."""

import pytest_twisted

from dledger.codes import ResponseCode
from dledger.testing.cluster import Cluster


@pytest_twisted.inlineCallbacks
def test_cluster_on_the_real_reactor(reactor):
    """A 3-member in-process group on the real reactor elects a leader and commits an append."""
    cluster = Cluster(3, seed=2, clock=reactor)
    cluster.start()
    try:
        leader = yield cluster.leader_elected(timeout=10)
        assert leader in cluster.ids
        resp = yield cluster.client().append(b"real time")
        assert resp.code == ResponseCode.SUCCESS
        yield cluster.when(lambda: all(s.store.committed_index >= resp.index for s in cluster.servers.values()),
                           timeout=10)
    finally:
        yield cluster.stop()
    left = [c for c in reactor.getDelayedCalls() if getattr(c.func, "__module__", "").startswith("dledger")]
    assert not left, f"timers left behind after stop: {left}"
