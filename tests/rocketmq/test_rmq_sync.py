"""Slave metadata sync (dledger_rocketmq.broker.sync): at once on role/master change, every 10 s, never backwards."""

from __future__ import annotations

import pytest
from conftest import GOLDEN, STORE
from dledger_rocketmq.broker.sync import ORDER, SlaveSync, SyncKind, apply_sync, master_body
from dledger_rocketmq.common.control import OffsetCommit
from dledger_rocketmq.store.metadata import BrokerMetadata, topic_config
from test_rmq_offsets import frame_body
from twisted.internet import defer, task

FRAMES = GOLDEN / "frames"
GOLDEN_BODIES = {
    SyncKind.TOPIC_CONFIG: frame_body(FRAMES / "021-get-all-topic-config-end-of-run-with-data-response.bin"),
    SyncKind.CONSUMER_OFFSET: frame_body(FRAMES / "043-get-all-consumer-offset-end-of-run-with-data-response.bin"),
    SyncKind.DELAY_OFFSET: frame_body(FRAMES / "045-get-all-delay-offset-end-of-run-with-data-response.bin"),
    SyncKind.SUBSCRIPTION_GROUP: frame_body(
        FRAMES / "201-get-all-subscriptiongroup-config-end-of-run-with-data-response.bin"),
}


class Master:
    """A fake broker port: answers fetches with given bodies, at once or when released."""

    def __init__(self, bodies=None, hold=False):
        self.bodies = dict(bodies or GOLDEN_BODIES)
        self.hold = hold
        self.calls: list[SyncKind] = []
        self.pending: list[tuple[defer.Deferred, SyncKind]] = []

    def fetch(self, kind):
        self.calls.append(kind)
        d = defer.Deferred()
        if self.hold:
            self.pending.append((d, kind))
        else:
            self._answer(d, kind)
        return d

    def _answer(self, d, kind):
        body = self.bodies[kind]
        if isinstance(body, Exception):
            d.errback(body)
        else:
            d.callback(body)

    def release(self):
        pending, self.pending = self.pending, []
        for d, kind in pending:
            self._answer(d, kind)


def make(tmp_path, master, interval=10.0):
    clock = task.Clock()
    meta = BrokerMetadata(tmp_path, cluster_name="RaftCluster", broker_name="RaftNode00", clock=clock)
    sync = SlaveSync(meta, master.fetch, clock=clock, interval=interval)
    sync.startService()
    return clock, meta, sync


def test_golden_bodies_make_the_golden_files(tmp_path):
    """Syncing the four golden GET_ALL_* bodies yields the golden store's config files byte for byte."""
    clock, meta, sync = make(tmp_path, Master())
    sync.become_slave("n1")
    assert sync.rounds == 1
    for name in ("topics.json", "consumerOffset.json", "delayOffset.json", "subscriptionGroup.json"):
        assert (tmp_path / "config" / name).read_bytes() == (STORE / "config" / name).read_bytes(), name


def test_syncs_at_once_then_every_interval(tmp_path):
    """become_slave syncs immediately (RocketMQ waits for a registration), then every 10 s, in RocketMQ's order."""
    master = Master()
    clock, meta, sync = make(tmp_path, master)
    sync.become_slave("n1")
    assert master.calls == list(ORDER)
    clock.advance(9.9)
    assert len(master.calls) == 4
    clock.advance(0.1)
    assert len(master.calls) == 8 and sync.rounds == 2


def test_master_change_syncs_at_once(tmp_path):
    """A new master is synced from at once; the same master again does nothing extra."""
    master = Master()
    clock, meta, sync = make(tmp_path, master)
    sync.become_slave("n1")
    sync.master_changed("n1")
    assert sync.rounds == 1
    clock.advance(3)
    sync.master_changed("n2")
    assert sync.rounds == 2 and sync.master == "n2"
    clock.advance(9.9)
    assert sync.rounds == 2  # the 10 s period restarted at the change
    clock.advance(0.1)
    assert sync.rounds == 3


def test_become_master_stops_and_discards_in_flight(tmp_path):
    """After become_master no timer remains and a round in flight merges nothing."""
    master = Master(hold=True)
    clock, meta, sync = make(tmp_path, master)
    sync.become_slave("n1")
    sync.become_master()
    master.release()
    assert meta.topics.get("GoldenTopic") is None and meta.offsets.query("golden_push_cg", "GoldenTopic", 0) == -1
    assert not clock.getDelayedCalls()


def test_stale_master_answer_discarded(tmp_path):
    """An answer from the previous master arriving after a master change is not merged."""
    master = Master(hold=True)
    clock, meta, sync = make(tmp_path, master)
    sync.become_slave("n1")
    sync.master_changed("n2")  # coalesced: runs after the held round
    master.bodies[SyncKind.TOPIC_CONFIG] = {"dataVersion": {"counter": 99, "timestamp": 1},
                                            "topicConfigTable": {"New": topic_config("New")}}
    master.release()  # n1's answer: discarded
    assert meta.topics.get("New") is None
    master.release()  # the round for n2
    assert meta.topics.get("New") is not None


@pytest.mark.parametrize("local, remote, final", [(9, 4, 9), (4, 9, 9), (-1, 3, 3)])
def test_sync_never_moves_a_consumer_offset_backwards(tmp_path, local, remote, final):
    """apache/rocketmq#1094: a master's older offset does not overwrite a newer local one."""
    master = Master({**GOLDEN_BODIES,
                     SyncKind.CONSUMER_OFFSET: {"offsetTable": {"T@g": {0: remote}}},
                     SyncKind.DELAY_OFFSET: {"offsetTable": {1: remote}}})
    clock, meta, sync = make(tmp_path, master)
    meta.offsets.apply([OffsetCommit("g", "T", 0, local)])
    meta.delay_offsets.advance(1, local)
    sync.become_slave("n1")
    assert meta.offsets.query("g", "T", 0) == final
    assert meta.delay_offsets.get(1) == final


def test_topics_replaced_only_when_data_version_differs(tmp_path):
    """Topic configs are copied wholesale when the master's DataVersion differs, else left alone."""
    meta = BrokerMetadata(tmp_path)
    assert apply_sync(meta, SyncKind.TOPIC_CONFIG, GOLDEN_BODIES[SyncKind.TOPIC_CONFIG])
    assert meta.topics.data_version == {"counter": 8, "timestamp": 1795427039157}
    assert not apply_sync(meta, SyncKind.TOPIC_CONFIG, GOLDEN_BODIES[SyncKind.TOPIC_CONFIG])


def test_failed_kind_does_not_stop_the_others(tmp_path):
    """A fetch error or a bad body for one kind is counted and logged; the other kinds still merge."""
    master = Master({**GOLDEN_BODIES, SyncKind.TOPIC_CONFIG: RuntimeError("connection refused"),
                     SyncKind.DELAY_OFFSET: b'{"offsetTable":'})
    clock, meta, sync = make(tmp_path, master)
    sync.become_slave("n1")
    assert sync.errors == 2 and sync.rounds == 1
    assert meta.topics.get("GoldenTopic") is None
    assert meta.offsets.query("golden_push_cg", "GoldenTopic", 2) == 8
    assert meta.groups.get("golden_pull_cg") is not None


def test_stop_waits_for_round_in_flight(tmp_path):
    """stopService cancels the timer and fires once the round in flight ends, merging nothing more."""
    master = Master(hold=True)
    clock, meta, sync = make(tmp_path, master)
    sync.become_slave("n1")
    d = sync.stopService()
    assert not d.called and not clock.getDelayedCalls()
    master.release()
    assert d.called and meta.topics.get("GoldenTopic") is None


def test_not_started_does_not_fetch(tmp_path):
    """Before startService, become_slave only records the role; starting syncs at once."""
    master = Master()
    clock = task.Clock()
    sync = SlaveSync(BrokerMetadata(tmp_path), master.fetch, clock=clock)
    sync.become_slave("n1")
    assert master.calls == []
    sync.startService()
    assert len(master.calls) == 4


@pytest.mark.parametrize("kind", list(SyncKind))
def test_master_answers_with_golden_bodies(tmp_path, golden_dir_meta, kind):
    """A master built from the golden files answers each GET_ALL_* with the golden body byte for byte."""
    assert master_body(golden_dir_meta, kind) == GOLDEN_BODIES[kind]


@pytest.fixture
def golden_dir_meta(tmp_path):
    """BrokerMetadata loaded from a copy of the golden config files."""
    import shutil
    shutil.copytree(STORE / "config", tmp_path / "store" / "config")
    meta = BrokerMetadata(tmp_path / "store", cluster_name="RaftCluster", broker_name="RaftNode00")
    meta.load()
    return meta
