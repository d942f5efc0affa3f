"""A leader that cannot read an entry it must replicate says so, hands leadership over and stops standing."""

import pytest
from twisted.logger import globalLogPublisher

from dledger.codes import ResponseCode, Role
from dledger.entry import Entry
from dledger.errors import DLedgerError
from dledger.metrics import take_snapshot
from dledger.replication.rules import DamageAction, damaged_leader_action
from dledger.testing.cluster import Cluster
from dledger.testing.store_contract import FakeMemberState, fired


@pytest.mark.parametrize("damaged, end, known, max_behind, to", [
    (5, 20, {"n1": 20, "n2": -1}, 1000, "n1"),        # the caught-up holder
    (5, 20, {"n1": 12, "n2": 18}, 1000, "n2"),        # the holder with the most entries
    (5, 20, {"n1": 20, "n2": 20}, 1000, "n1"),        # a tie goes to the smaller id
    (5, 20, {"n1": 4, "n2": -1}, 1000, None),         # nobody holds the damaged entry: keep leading, ask later
    (5, 20, {"n1": -1, "n2": -1}, 1000, None),        # nobody answers: keep leading
    (5, 2000, {"n1": 10, "n2": -1}, 1000, None),      # the holder is too far behind for a transfer
    (5, 2000, {"n1": 1001, "n2": 10}, 1000, "n1"),    # ... unless within maxLeadershipTransferWaitIndex
    (0, 0, {}, 1000, None),                           # a one-member group has nobody to hand over to
])
def test_damaged_leader_action_table(damaged, end, known, max_behind, to):
    """Leadership goes to the member holding the damaged entry and the most entries, within the transfer limit."""
    action = damaged_leader_action(damaged, end, known, max_behind)
    assert isinstance(action, DamageAction) and action.transfer_to == to and action.why


def errors_logged():
    lines = []
    observer = lambda event: lines.append(event) if event["log_level"].name == "error" else None
    globalLogPublisher.addObserver(observer)
    return lines, observer


@pytest.mark.parametrize("seed", [1, 2])
def test_damaged_leader_hands_over_and_the_wiped_follower_catches_up(seed):
    """A leader whose entry 5 is unreadable logs it, transfers leadership, never stands again; the follower refills."""
    cluster = Cluster(3, seed=seed)
    cluster.start()
    leader_id = cluster.append_committed([b"entry-%d" % i for i in range(20)])
    leader = cluster.servers[leader_id]
    end = leader.store.ledger_end_index

    # Entry 5 on the leader's disk now fails its CRC check (what a flipped body byte does to mmap's get).
    good_get = leader.store.get

    def damaged_get(index):
        if index == 5:
            raise DLedgerError(ResponseCode.DISK_ERROR, "entry 5 in /x/00000000000000000000 at offset 270 (pos 270) "
                               "is damaged: body crc32c mismatch")
        return good_get(index)
    leader.store.get = damaged_get
    leader.store.get_range = lambda begin, count, nbytes: [damaged_get(i) for i in range(begin, min(end, begin + 3)
                                                                                                + 1)]
    leader.replicator.recent = type(leader.replicator.recent)()

    wiped, healthy = leader.state.peers
    vote_rounds = leader.elector.vote_rounds
    lines, observer = errors_logged()
    try:
        cluster.wipe(wiped)
        cluster.restart(wiped)
        refilled = cluster.servers[wiped].store
        assert cluster.run_until(lambda: refilled.ledger_end_index >= end and refilled.committed_index >= end, 10), \
            f"{wiped} stuck at {refilled.ledger_end_index}; leader {cluster.leader()}"
        assert cluster.leader() == healthy, "leadership went to the member holding the entry"
        assert [refilled.get(i).body for i in range(end + 1)] == \
            [cluster.servers[healthy].store.get(i).body for i in range(end + 1)]
        # Later: the damaged member never stands again, even when the new leader goes away.
        cluster.run(5)
        cluster.crash(healthy)
        cluster.run(10)
        assert leader.state.role is not Role.LEADER and cluster.servers[wiped].state.role is Role.LEADER
        assert leader.elector.store_damaged and leader.damaged[0] == 5
        assert take_snapshot(leader).store_damaged == 1 and take_snapshot(cluster.servers[wiped]).store_damaged == 0
        assert leader.elector.vote_rounds == vote_rounds, "a member with a damaged store never asks for votes"
    finally:
        globalLogPublisher.removeObserver(observer)
        cluster.stop()
    text = [e.get("log_format", "").format(**e) if "log_format" in e else "" for e in lines]
    unreadable = [t for t in text if "cannot read entry 5" in t]
    assert unreadable and "offset 270" in unreadable[0] and "00000000000000000000" in unreadable[0]
    assert len(unreadable) <= 2, "rate-limited, not once per retry"


def test_mmap_read_error_names_file_offset_and_index(tmp_path):
    """A body byte flipped in an mmap data file makes get() fail with the file, the offset and the index."""
    from dledger.store.mmapfile import MmapLogStore
    state = FakeMemberState()
    def open_():
        store = MmapLogStore(tmp_path / "dledger-n0", state, data_file_size=4096, index_file_size=256,
                             max_entry_size=1024)
        store.startup()
        return store
    store = open_()
    for i in range(4):
        store.append_as_leader(Entry(body=b"body-%d" % i, term=1))
    fired(store.shutdown())
    store = open_()  # reads go to the files (a running store serves the entries it just wrote from memory)
    pos = store.get(2).pos
    data_file = sorted((tmp_path / "dledger-n0" / "data").iterdir())[0]
    with open(data_file, "r+b") as f:
        f.seek(pos + 48 + 1)
        byte = f.read(1)
        f.seek(pos + 48 + 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(DLedgerError) as info:
        store.get(2)
    assert info.value.code is ResponseCode.DISK_ERROR
    assert data_file.name in info.value.message and f"offset {pos}" in info.value.message
    assert "entry 2" in info.value.message
    fired(store.shutdown())


def test_follower_that_cannot_read_a_compared_entry_says_so_once():
    """A follower whose own entry fails on read answers the COMPARE INCONSISTENT_STATE and logs one error line."""
    from dledger.codes import PushType
    from dledger.messages import PushEntryRequest

    cluster = Cluster(3, seed=6)
    cluster.start()
    leader_id = cluster.wait_for_leader()
    leader = cluster.servers[leader_id]
    client = cluster.client()
    ds = [client.append(b"x%d" % i) for i in range(5)]
    assert cluster.run_until(lambda: all(d.called for d in ds))
    peer = leader.state.peers[0]
    follower = cluster.servers[peer]
    assert cluster.run_until(lambda: follower.store.ledger_end_index == leader.store.ledger_end_index)
    entry = leader.store.get(3)

    def broken(index):
        raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} in data/00000000000000000000 is damaged")
    follower.store.get = broken
    lines, observer = errors_logged()
    replies = []
    try:
        for _ in range(3):
            req = PushEntryRequest(group="g0", remote_id=peer, local_id=leader_id, leader_id=leader_id,
                                   term=leader.state.curr_term, commit_index=leader.store.committed_index,
                                   type=PushType.COMPARE, entry=entry)
            follower.entry_handler.handle_push(req).addCallback(replies.append)
    finally:
        globalLogPublisher.removeObserver(observer)
        cluster.crash(peer)
        cluster.stop()
    assert [r.response_code for r in replies] == [ResponseCode.INCONSISTENT_STATE] * 3
    texts = [e["log_format"].format(**e) for e in lines if "log_format" in e]
    assert len([t for t in texts if "cannot read entry 3" in t and "00000000000000000000" in t]) == 1, texts
