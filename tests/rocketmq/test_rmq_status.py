"""The broker on the status page and in /metrics (dledger_rocketmq.broker.status): topics, queues, consumers, delays."""

from __future__ import annotations

import pytest
from dledger_rocketmq.broker import status
from dledger_rocketmq.broker.clients import ClientRegistry
from dledger_rocketmq.common.control import OffsetCommit
from dledger_rocketmq.common.heartbeat import ConsumerData, Heartbeat, Subscription
from dledger_rocketmq.common.message import MessageRecord, encode_properties
from dledger_rocketmq.plugin import broker_for
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from rmq_cluster_util import broker_cluster, master, msg, put, settled

from dledger.metrics import make_registry
from dledger.status.board import StatusBoard


class Port:
    """Stands in for the BrokerPort: what the status reads of it is its client registry."""

    def __init__(self):
        self.sessions = type("Sessions", (), {})()
        self.sessions.registry = ClientRegistry()


@pytest.fixture
def group(tmp_path):
    cluster = broker_cluster(tmp_path)
    yield cluster
    cluster.stop()


def _fill(cluster):
    broker = master(cluster)
    for i in range(3):
        put(cluster, broker, [msg("Orders", b"o", queue_id=i % 2) for _ in range(i + 2)])
    delayed = MessageRecord(topic="Orders", body=b"later", queue_id=0, born_timestamp=1,
                            properties=encode_properties({"DELAY": "3"}))
    put(cluster, broker, delayed)
    out = []
    broker.commit_offsets([OffsetCommit("billing", "Orders", 0, 2), OffsetCommit("billing", "Orders", 1, 1)]
                          ).addBoth(out.append)
    assert cluster.run_until(lambda: bool(out)) and settled(cluster)
    return broker


def test_view_and_sections_show_queues_consumer_lag_clients_and_delays(group):
    """Queues with their offsets, a group's lag per queue, its clients and the waiting delayed message."""
    broker = _fill(group)
    port = Port()
    hb = Heartbeat("10.0.0.9@1", consumers=(ConsumerData("billing", subscriptions=(Subscription("Orders"),)),))
    port.sessions.registry.heartbeat(object(), hb, now_ms=1000, addr="10.0.0.9:5555")
    view = status.read_view(broker, port)
    queues = {(q.topic, q.queue_id): q.max_offset for q in view.queues}
    assert queues[("Orders", 0)] == 2 + 4 and queues[("Orders", 1)] == 3
    lags = {(r.group, r.queue_id): r.lag for r in view.offsets}
    assert lags == {("billing", 0): 6 - 2, ("billing", 1): 3 - 1}
    assert [(level, top - done) for level, _ms, top, done in view.delayed] == [(3, 1)]
    secs = {s["id"]: s for s in status.sections(view, now_ms=3500)}
    assert set(secs) == {"rocketmq-topics", "rocketmq-consumers", "rocketmq-delayed"}
    tables = {t["id"]: t for s in secs.values() for t in s["tables"]}
    assert ["billing", 1, "Orders", 2, 6] in tables["rocketmq-groups"]["rows"]
    assert tables["rocketmq-offsets"]["rows"][0] == ["billing", "Orders", 0, 2, 6, 4]  # the largest lag first
    assert tables["rocketmq-clients"]["rows"] == [["billing", "consumer", "10.0.0.9@1", "10.0.0.9:5555", "JAVA", 2.5]]
    assert tables["rocketmq-delay-levels"]["rows"] == [[3, "10s", 1, 0, 1]]
    assert dict(secs["rocketmq-topics"]["summary"])["dispatch lag (bytes)"] == 0


def test_broker_sections_reach_the_members_status_document(group):
    """Through the plugin's hook, every member's /status.json carries the broker's sections."""
    _fill(group)
    for mid, server in group.servers.items():
        doc = StatusBoard(lambda s=server: s, group.clock, group.plugin_manager).document()
        titles = [s["title"] for s in doc["sections"]]
        assert any("RocketMQ broker" in t and broker_for(server).role in t for t in titles), (mid, titles)


def test_broker_metrics_name_dispatch_and_consumer_lag(group):
    """/metrics of a broker member carries rocketmq_dispatch_lag_bytes and consumer lag per queue."""
    broker = _fill(group)
    server = broker.server
    text = generate_latest(make_registry(lambda: server, group.clock, "g0", server.self_id,
                                         plugin_manager=group.plugin_manager)).decode()
    found = {(s.name, s.labels.get("queue_id")): s.value for f in text_string_to_metric_families(text)
             for s in f.samples
             if s.name.startswith("rocketmq_") and s.labels.get("consumer_group") in (None, "billing")}
    assert found[("rocketmq_dispatch_lag_bytes", None)] == 0 and found[("rocketmq_broker_is_master", None)] == 1
    assert found[("rocketmq_consumer_lag_messages", "0")] == 4 and found[("rocketmq_consumer_lag_messages", "1")] == 2
    assert found[("rocketmq_delayed_messages", None)] == 1
