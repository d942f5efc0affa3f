"""A leader feeds a far-behind follower a window of bytes at a time (issue #23: a learner catching up 1 GiB).

Before the byte bound, the dispatcher read and sent up to ``maxPendingSize`` pushes of ``maxBatchPushSize``
each in one reactor turn; a large backlog then took the leader's heartbeats with it.
"""

from __future__ import annotations

import pytest

from dledger.testing import Cluster

BATCH = 64 * 1024


@pytest.mark.parametrize("full_pushes", [None, 2])
def test_a_far_behind_follower_gets_at_most_the_byte_window_in_flight(full_pushes):
    """The window is ``maxInFlightFullPushes`` full pushes: the default (4) and a smaller one set in the config."""
    options = {} if full_pushes is None else {"max_in_flight_full_pushes": full_pushes}
    cluster = Cluster(3, seed=7, max_batch_push_size=BATCH, max_pending_size=1000, **options)
    try:
        cluster.start()
        leader = cluster.wait_for_leader()
        lagging = next(m for m in cluster.ids if m != leader)
        cluster.crash(lagging)
        leader = cluster.append_committed([bytes([i % 251]) * (BATCH - 200) for i in range(120)])
        dispatcher = cluster.servers[leader].replicator.dispatchers[lagging]
        window = (full_pushes or 4) * cluster.servers[leader].replicator.max_batch_bytes
        seen = []
        sent = dispatcher.sent_append

        def record(first, last, nbytes=0):
            sent(first, last, nbytes)
            seen.append(dispatcher.in_flight_bytes)

        dispatcher.sent_append = record
        cluster.restart(lagging)
        cluster.converged()
        assert seen, "the lagging follower was fed nothing"
        # One push may take the total past the window (it goes while there is room); never two.
        assert max(seen) <= window + cluster.servers[leader].replicator.max_batch_bytes
        assert max(seen) >= window // 2, "the window was never used: the test would not see a regression"
    finally:
        cluster.stop()
