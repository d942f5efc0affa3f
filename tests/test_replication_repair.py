"""Followers that lost entries are repaired by the leader without client traffic, and lag counts what is known."""

import pytest

from dledger.codes import PushType, ResponseCode
from dledger.messages import PushEntryRequest
from dledger.metrics import take_snapshot
from dledger.testing.cluster import Cluster
from dledger.testing.simdisk import SimulatedDisk, preload


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_wiped_follower_is_refilled_within_two_heartbeats_of_an_idle_group(seed):
    """A follower restarted with an empty store is refilled by the leader within 2 heartbeats, no client writes."""
    cluster = Cluster(3, seed=seed)
    cluster.start()
    leader_id = cluster.append_committed([b"entry-%d" % i for i in range(20)])
    leader = cluster.servers[leader_id]
    follower = leader.state.peers[0]
    heartbeat = leader.config.heart_beat_time_interval_ms / 1000.0
    end = leader.store.ledger_end_index

    cluster.wipe(follower)
    cluster.run(5 * heartbeat)  # idle: the leader only sends heartbeats and COMMITs
    assert take_snapshot(leader).lag[follower] == end + 1, "a follower that does not answer is not known to hold any"
    cluster.restart(follower)
    restarted = cluster.servers[follower].store
    assert restarted.ledger_end_index == -1
    # Joining takes up to two heartbeats (a higher term first makes it a candidate of that term, as in Java).
    state = cluster.servers[follower].state
    assert cluster.run_until(lambda: state.leader_id == leader_id, 3 * heartbeat)
    caught_up = cluster.run_until(lambda: restarted.ledger_end_index == end and restarted.committed_index == end,
                                  2 * heartbeat)
    assert caught_up, f"{follower} at {restarted.ledger_end_index} (leader end {end}) after 2 heartbeats"
    assert cluster.run_until(lambda: take_snapshot(leader).lag[follower] == 0, heartbeat)
    assert [restarted.get(i) for i in range(end + 1)] == [leader.store.get(i) for i in range(end + 1)]
    assert cluster.leader() == leader_id
    cluster.stop()


@pytest.mark.parametrize("kept", [1, 6, 15])
def test_follower_whose_recovery_cut_committed_entries_is_refilled_while_idle(kept):
    """A follower restarted holding only a prefix of what it acknowledged (recovery cut it) is refilled, no writes.

    (A guard: a non-empty prefix was already repaired before issue #9 by the unmatched-tail rule; the empty
    store of the test above was not.)
    """
    cluster = Cluster(3, seed=kept)
    cluster.start()
    leader_id = cluster.append_committed([b"entry-%d" % i for i in range(20)])
    leader = cluster.servers[leader_id]
    follower = leader.state.peers[1]
    heartbeat = leader.config.heart_beat_time_interval_ms / 1000.0
    end = leader.store.ledger_end_index
    prefix = [cluster.servers[follower].store.get(i) for i in range(kept)]
    cluster.crash(follower)
    cfg = cluster.configs[follower]
    cluster.disks[follower] = SimulatedDisk(cfg.mapped_file_size_for_entry_data, cfg.max_entry_size)
    preload(cluster.disks[follower], prefix, kept - 1)
    cluster.restart(follower)
    store = cluster.servers[follower].store
    assert store.ledger_end_index == kept - 1
    assert cluster.run_until(lambda: store.ledger_end_index == end and store.committed_index == end, 5 * heartbeat)
    assert cluster.run_until(lambda: take_snapshot(leader).lag[follower] == 0, heartbeat)
    assert [store.get(i) for i in range(end + 1)] == [leader.store.get(i) for i in range(end + 1)]
    cluster.stop()


def test_follower_lacking_committed_entries_answers_commit_inconsistent():
    """A follower asked to commit past its end (its store was emptied) says INCONSISTENT_STATE, never SUCCESS."""
    cluster = Cluster(3, seed=4)
    cluster.start()
    leader_id = cluster.append_committed([b"x" for _ in range(5)])
    leader = cluster.servers[leader_id]
    follower = leader.state.peers[1]
    cluster.wipe(follower)
    cluster.restart(follower)
    server = cluster.servers[follower]
    assert cluster.run_until(lambda: server.state.leader_id == leader_id, 5)
    cluster.partition([follower], [m for m in cluster.ids if m != follower])  # keep the leader from repairing it
    req = PushEntryRequest(group="g0", remote_id=follower, local_id=leader_id, leader_id=leader_id,
                           term=server.state.curr_term, commit_index=leader.store.committed_index,
                           type=PushType.COMMIT)
    replies = []
    server.entry_handler.handle_push(req).addCallback(replies.append)
    assert replies and replies[0].response_code is ResponseCode.INCONSISTENT_STATE
    assert replies[0].end_index < leader.store.committed_index
    cluster.stop()


@pytest.mark.parametrize("begin, end, known, lag", [
    (0, -1, -1, 0),      # empty leader log: nothing to lag
    (0, 9, -1, 10),      # unknown follower: every entry counts
    (0, 9, 4, 5),
    (0, 9, 9, 0),
    (0, 9, 12, 0),       # never negative
    (5, 9, -1, 5),       # unknown, leader keeps 5..9 only
    (5, 9, 2, 5),        # known below the leader's begin counts like unknown
    (5, 9, 7, 2),
])
def test_lag_entries_counts_what_the_follower_is_not_known_to_hold(begin, end, known, lag):
    """lag = leader end minus what the follower is known to hold, unknown counting as every entry held."""
    from dledger.stats import lag_entries
    assert lag_entries(begin, end, known) == lag
