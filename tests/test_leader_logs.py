"""The leader's lines about its followers: one per state change, a periodic summary, behind and caught up."""

from twisted.logger import globalLogPublisher

from dledger.replication.leader import BEHIND_LOG_ENTRIES, DOWN_SUMMARY_INTERVAL
from dledger.testing.cluster import Cluster


def capture():
    lines = []

    def observer(event):
        if event.get("log_namespace", "").startswith("dledger.replication.leader") and "log_format" in event:
            lines.append((event["log_level"].name, event["log_format"].format(**event)))
    globalLogPublisher.addObserver(observer)
    return lines, observer


def test_a_down_follower_costs_one_line_then_a_summary_per_interval_and_lag_lines():
    """Isolated for 130 s: one 'does not answer' line, 2 summaries; behind/caught-up and 'answers again' once each."""
    cluster = Cluster(3, seed=11)
    cluster.start()
    leader_id = cluster.wait_for_leader()
    leader = cluster.servers[leader_id]
    peer = leader.state.peers[0]
    lines, observer = capture()
    try:
        cluster.partition([peer], [m for m in cluster.ids if m != peer])
        client = cluster.client()
        ds = [client.append_batch([b"x"] * 100) for _ in range(BEHIND_LOG_ENTRIES // 100 + 2)]
        assert cluster.run_until(lambda: all(d.called for d in ds), 30)
        cluster.run(2 * DOWN_SUMMARY_INTERVAL + 10 - cluster.clock.seconds() % 1)
        end = leader.store.ledger_end_index
        cluster.heal()
        assert cluster.run_until(lambda: cluster.servers[peer].store.ledger_end_index == end, 30)
        cluster.run(1)
    finally:
        globalLogPublisher.removeObserver(observer)
        cluster.stop()
    about = [(level, text) for level, text in lines if f"follower {peer} " in text]
    down = [t for lv, t in about if "does not answer:" in t]
    summaries = [t for lv, t in about if "still does not answer" in t]
    behind = [t for lv, t in about if "entries behind" in t]
    again = [t for lv, t in about if "answers again" in t]
    caught = [t for lv, t in about if "has caught up" in t]
    assert len(down) == 1, about
    assert len(summaries) == 2, about
    assert len(behind) == 1 and len(again) == 1 and len(caught) == 1, about
    assert len(about) == 6, about
    assert all(lv == "warn" for lv, t in about if "answer:" in t or "still" in t)


def test_a_follower_refusing_entries_is_a_warning_on_the_leader_not_a_debug_line():
    """A follower answering 411 to every push makes the leader warn (rate-limited), instead of stalling silently."""
    from dledger.codes import ResponseCode
    from dledger.errors import DLedgerError

    cluster = Cluster(3, seed=12)
    cluster.start()
    leader_id = cluster.wait_for_leader()
    leader = cluster.servers[leader_id]
    peer = leader.state.peers[0]

    def refuse(entries, term, leader_id):
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "entry has bodyCrc 0 and acceptJavaZeroCrc is false")
    cluster.servers[peer].entry_handler._append_batch = refuse
    lines, observer = capture()
    try:
        client = cluster.client()
        ds = [client.append(b"x") for _ in range(3)]
        assert cluster.run_until(lambda: all(d.called for d in ds), 30)
        cluster.run(25)
    finally:
        globalLogPublisher.removeObserver(observer)
        cluster.stop()
    refused = [(lv, t) for lv, t in lines if f"follower {peer} refuses entries" in t]
    assert refused and all(lv == "warn" for lv, _ in refused)
    assert len(refused) <= 4, "one line per 10 s, not one per retry"
