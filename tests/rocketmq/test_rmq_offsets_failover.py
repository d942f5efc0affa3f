"""Offsets committed through the dledger log survive a leader kill on every member (the #10 "beyond RocketMQ" point)."""

from __future__ import annotations

from dledger_rocketmq.common.control import OffsetCommit, encode_offset_commits, is_control
from dledger_rocketmq.store.offsets import ConsumerOffsetTable

from dledger.testing import Cluster


class OffsetListener:
    """A commit listener feeding control entries to a member's table, as the broker's dispatcher does."""

    def __init__(self, table: ConsumerOffsetTable):
        self.table = table

    def start_index(self) -> int:
        return self.table.applied_index + 1

    def entries_committed(self, entries) -> None:
        for entry in entries:
            if is_control(entry.body):
                self.table.on_control(entry.index, entry.body)


def test_new_leader_knows_every_offset_committed_before_the_kill():
    """After the leader is crashed, the new leader's table holds every acknowledged commit: no duplicates."""
    cluster = Cluster(3, seed=7)
    cluster.start()
    tables = {}

    def attach(mid):
        tables[mid] = ConsumerOffsetTable()
        cluster.servers[mid].add_commit_listener(OffsetListener(tables[mid]))

    for mid in cluster.ids:
        attach(mid)
    leader = cluster.wait_for_leader()
    client = cluster.client()
    acked = {}
    for n in range(1, 41):
        commit = OffsetCommit("cg", "T", n % 4, n)
        d = client.append(encode_offset_commits([commit]))
        assert cluster.run_until(lambda d=d: d.called)
        if d.result is not None and not hasattr(d.result, "getErrorMessage"):
            acked[commit.queue_id] = commit.offset
    assert acked == {0: 40, 1: 37, 2: 38, 3: 39}
    cluster.crash(leader)
    new = cluster.wait_for_leader()
    assert new != leader
    cluster.run(1)
    for qid, offset in acked.items():
        assert tables[new].query("cg", "T", qid) == offset  # RocketMQ's slave copy could be 10 s old
    # the crashed member rebuilds the same table from the log when it comes back
    cluster.restart(leader)
    attach(leader)
    assert cluster.run_until(lambda: tables[leader].to_json() == tables[new].to_json())


def test_malformed_control_entry_skipped_alike_on_every_member():
    """A control entry that does not decode is skipped (logged) on every member, which keep equal tables."""
    tables = {mid: ConsumerOffsetTable() for mid in ("a", "b")}
    good = encode_offset_commits([OffsetCommit("cg", "T", 0, 5)])
    for table in tables.values():
        assert table.on_control(0, b"RMQC\x07\x00") == 0
        assert table.on_control(1, good) == 1
        assert table.on_control(1, good) == 0  # replayed: applied once
    assert tables["a"].to_json() == tables["b"].to_json() and tables["a"].applied_index == 1
