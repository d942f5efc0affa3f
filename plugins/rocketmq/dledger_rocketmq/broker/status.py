"""The broker on the member's status page and in its Prometheus metrics.

``dledger_status_sections`` (the page) and ``dledger_metric_families`` (``/metrics``) of the broker
plugin read the same :class:`BrokerView`: topics and queues (min/max offsets), the dispatch lag,
consumer groups (offsets, lag per queue, clients) and delayed messages per level, as
``mqadmin topicStatus`` / ``consumerProgress`` / ``consumerConnection`` show them.  Reading is cheap
(no disk I/O: every figure is in memory) and happens on the reactor thread.

Consumer lag is RocketMQ's ``diffTotal``: max offset minus the group's committed offset, per queue the
group has an offset in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily

from dledger.status.model import section, table
from dledger_rocketmq.store.consumequeue import DELAY_LEVELS_MS, SCHEDULE_TOPIC

#: Queue rows per consumer group sent to the page at most (the largest lags first); the metrics carry all.
MAX_OFFSET_ROWS = 5000


@dataclass(frozen=True)
class QueueRow:
    topic: str
    queue_id: int
    min_offset: int
    max_offset: int


@dataclass(frozen=True)
class OffsetRow:
    group: str
    topic: str
    queue_id: int
    offset: int
    max_offset: int

    @property
    def lag(self) -> int:
        return max(0, self.max_offset - max(self.offset, 0))


@dataclass(frozen=True)
class ClientRow:
    group: str
    kind: str  # "consumer" / "producer"
    client_id: str
    addr: str
    language: str
    last_heartbeat_ms: int


@dataclass
class BrokerView:
    """What the page and the metrics show of one broker, copied from it on the reactor thread."""

    broker_name: str
    cluster_name: str
    role: str
    dispatch_lag_bytes: int
    dispatched_index: int
    queues: list[QueueRow] = field(default_factory=list)
    offsets: list[OffsetRow] = field(default_factory=list)
    clients: list[ClientRow] = field(default_factory=list)
    subscriptions: dict[str, list[str]] = field(default_factory=dict)
    delayed: list[tuple[int, int, int, int]] = field(default_factory=list)  # (level, delay ms, max, delivered)


def read_view(broker: Any, port: Any = None) -> BrokerView:
    """Copy ``broker`` (and its port's client registry, if it serves one) into a :class:`BrokerView`."""
    opts = broker.options
    view = BrokerView(opts.broker_name, opts.cluster_name, broker.role, broker.lag(),
                      broker.dispatcher.dispatched_index)
    queues = broker.dispatcher.queues
    maxes: dict[tuple[str, int], int] = {}
    for q in queues.queues() if queues is not None else ():
        maxes[(q.topic, q.queue_id)] = q.max_offset
        if q.topic != SCHEDULE_TOPIC:
            view.queues.append(QueueRow(q.topic, q.queue_id, q.min_offset, q.max_offset))
    for c in broker.offsets.items():
        if c.topic == SCHEDULE_TOPIC:
            continue
        view.offsets.append(OffsetRow(c.group, c.topic, c.queue_id, c.offset, maxes.get((c.topic, c.queue_id), 0)))
    view.offsets.sort(key=lambda r: (r.group, r.topic, r.queue_id))
    levels = getattr(queues, "levels", DELAY_LEVELS_MS) if queues is not None else DELAY_LEVELS_MS
    delay_offsets = broker.meta.delay_offsets.items()
    for level, delay_ms in enumerate(levels, start=1):
        top = maxes.get((SCHEDULE_TOPIC, level - 1), 0)
        done = delay_offsets.get(level, 0)
        if top or done:
            view.delayed.append((level, delay_ms, top, done))
    registry = getattr(getattr(port, "sessions", None), "registry", None)
    if registry is not None:
        for group, info in sorted(registry.consumers.items()):
            view.subscriptions[group] = sorted(info.subscriptions)
            for ch in info.channels.values():
                view.clients.append(ClientRow(group, "consumer", ch.client_id, ch.addr, ch.language,
                                              ch.last_update_ms))
        for group, channels in sorted(registry.producers.items()):
            for ch in channels.values():
                view.clients.append(ClientRow(group, "producer", ch.client_id, ch.addr, ch.language,
                                              ch.last_update_ms))
    return view


def _duration(ms: int) -> str:
    return f"{ms // 3_600_000}h" if ms >= 3_600_000 and ms % 3_600_000 == 0 else (
        f"{ms // 60_000}m" if ms >= 60_000 and ms % 60_000 == 0 else f"{ms / 1000:g}s")


def sections(view: BrokerView, now_ms: int) -> list[dict[str, Any]]:
    """The page's sections for one broker: topics and queues, consumer groups, clients, delayed messages."""
    topics: dict[str, list[QueueRow]] = {}
    for q in view.queues:
        topics.setdefault(q.topic, []).append(q)
    topic_rows = [[t, len(qs), sum(q.max_offset - q.min_offset for q in qs), sum(q.max_offset for q in qs)]
                  for t, qs in sorted(topics.items())]
    queue_rows = [[q.topic, q.queue_id, q.min_offset, q.max_offset] for q in view.queues]
    broker = section("rocketmq-topics", f"RocketMQ broker {view.broker_name} ({view.role}): topics and queues",
                     summary=[("cluster", view.cluster_name), ("role", view.role),
                              ("dispatch lag (bytes)", view.dispatch_lag_bytes),
                              ("dispatched up to index", view.dispatched_index), ("topics", len(topics)),
                              ("queues", len(view.queues))],
                     tables=[table("rocketmq-topic-list", "topics",
                                   ["topic", "queues", "messages kept", "max offsets (sum)"], topic_rows),
                             table("rocketmq-queues", "queues", ["topic", "queue", "min offset", "max offset"],
                                   queue_rows)])
    groups: dict[str, list[OffsetRow]] = {}
    for r in view.offsets:
        groups.setdefault(r.group, []).append(r)
    clients_per_group: dict[str, int] = {}
    for c in view.clients:
        if c.kind == "consumer":
            clients_per_group[c.group] = clients_per_group.get(c.group, 0) + 1
    names = sorted(set(groups) | set(clients_per_group))
    group_rows = [[g, clients_per_group.get(g, 0), ", ".join(view.subscriptions.get(g, [])) or None,
                   len(groups.get(g, [])), sum(r.lag for r in groups.get(g, []))] for g in names]
    worst = sorted(view.offsets, key=lambda r: (-r.lag, r.group, r.topic, r.queue_id))[:MAX_OFFSET_ROWS]
    offset_rows = [[r.group, r.topic, r.queue_id, r.offset, r.max_offset, r.lag] for r in worst]
    consumers = section("rocketmq-consumers", "RocketMQ consumer groups",
                        summary=[("groups", len(names)), ("total lag (messages)", sum(r.lag for r in view.offsets))],
                        tables=[table("rocketmq-groups", "groups",
                                      ["group", "clients", "subscriptions", "queues with offsets", "lag (messages)"],
                                      group_rows),
                                table("rocketmq-offsets", "offsets per queue (largest lag first)",
                                      ["group", "topic", "queue", "consumer offset", "max offset", "lag"],
                                      offset_rows),
                                table("rocketmq-clients", "clients",
                                      ["group", "kind", "client id", "address", "language",
                                       "last heartbeat (s ago)"],
                                      [[c.group, c.kind, c.client_id, c.addr, c.language,
                                        round(max(0, now_ms - c.last_heartbeat_ms) / 1000, 1)]
                                       for c in view.clients])])
    delayed_rows = [[level, _duration(ms), top, done, max(0, top - done)] for level, ms, top, done in view.delayed]
    delayed = section("rocketmq-delayed", "RocketMQ delayed messages",
                      summary=[("waiting", sum(r[4] for r in delayed_rows))],
                      tables=[table("rocketmq-delay-levels", "per delay level",
                                    ["level", "delay", "scheduled (max offset)", "delivered (offset)", "waiting"],
                                    delayed_rows)])
    return [broker, consumers, delayed]


def metric_families(view: BrokerView, group: str, self_id: str) -> list:
    """``rocketmq_*`` gauges of one broker (labels ``group``, ``self_id``, ``broker``, then per series)."""
    base = ["group", "self_id", "broker"]
    ids = [group, self_id, view.broker_name]

    def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
        g = GaugeMetricFamily(name, doc, labels=base)
        g.add_metric(ids, value)
        return g

    out = [gauge("rocketmq_dispatch_lag_bytes", "Committed bytes of the CommitLog not yet dispatched into consume "
                 "queues (RocketMQ's dispatchBehindBytes)", view.dispatch_lag_bytes),
           gauge("rocketmq_broker_is_master", "1 while this member's broker is the master", 1 if view.role == "MASTER"
                 else 0)]
    maxes = GaugeMetricFamily("rocketmq_queue_max_offset", "Max offset (next offset) of a consume queue",
                              labels=[*base, "topic", "queue_id"])
    for q in view.queues:
        maxes.add_metric([*ids, q.topic, str(q.queue_id)], q.max_offset)
    out.append(maxes)
    lag = GaugeMetricFamily("rocketmq_consumer_lag_messages", "Messages of a queue a consumer group has not "
                            "committed yet (max offset - consumer offset)",
                            labels=[*base, "consumer_group", "topic", "queue_id"])
    offsets = GaugeMetricFamily("rocketmq_consumer_offset", "A consumer group's committed offset in a queue",
                                labels=[*base, "consumer_group", "topic", "queue_id"])
    for r in view.offsets:
        lag.add_metric([*ids, r.group, r.topic, str(r.queue_id)], r.lag)
        offsets.add_metric([*ids, r.group, r.topic, str(r.queue_id)], r.offset)
    out += [lag, offsets]
    clients = GaugeMetricFamily("rocketmq_consumer_clients", "Clients of a consumer group connected to this broker",
                                labels=[*base, "consumer_group"])
    counts: dict[str, int] = {g: 0 for g in view.subscriptions}
    for c in view.clients:
        if c.kind == "consumer":
            counts[c.group] = counts.get(c.group, 0) + 1
    for g, n in sorted(counts.items()):
        clients.add_metric([*ids, g], n)
    out.append(clients)
    waiting = GaugeMetricFamily("rocketmq_delayed_messages", "Delayed messages scheduled and not delivered yet",
                                labels=[*base, "level"])
    for level, _ms, top, done in view.delayed:
        waiting.add_metric([*ids, str(level)], max(0, top - done))
    out.append(waiting)
    return out


def status_provider(server: Any, broker: Any, get_port: Any, get_gate: Any = lambda: None) -> Any:
    """The ``dledger_status_sections`` provider of ``server``'s broker (``get_gate``: its registration gate)."""

    def broker_sections() -> list[dict[str, Any]]:
        out = sections(read_view(broker, get_port()), int(server.clock.seconds() * 1000))
        gate = get_gate()
        if gate is not None:  # issue #23: registered, waiting for catch-up (and why), or withdrawn
            out[0]["summary"].append(["name-server registration", f"{gate.action.value} ({gate.reason})"])
        return out

    return broker_sections


def metrics_provider(server: Any, broker: Any, get_port: Any) -> Any:
    """The ``dledger_metric_families`` provider of ``server``'s broker."""

    def broker_metrics() -> list:
        return metric_families(read_view(broker, get_port()), server.config.group, server.config.self_id)

    return broker_metrics
