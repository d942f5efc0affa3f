"""Helpers for in-process broker clusters: 3 members on virtual time with the rocketmq plugin enabled."""

from __future__ import annotations

from dledger_rocketmq.common.message import MessageRecord, encode_properties
from dledger_rocketmq.plugin import broker_for

from dledger import plugins
from dledger.testing import Cluster


def broker_cluster(tmp_path, *, seed: int = 1, n: int = 3, **extras) -> Cluster:
    """A started Cluster whose members run the broker (store dirs under ``tmp_path``)."""
    opts = {"rocketmq.enabled": True, "rocketmq.mappedFileSizeConsumeQueue": 1000}
    opts.update(extras)
    cluster = Cluster(n, seed=seed, plugin_manager=plugins.make_plugin_manager(), store_base_dir=str(tmp_path),
                      extras=opts)
    cluster.start()
    return cluster


def master(cluster: Cluster, timeout: float = 30.0):
    """The broker of the member that became MASTER (waits on virtual time)."""
    found = []

    def check():
        found[:] = [broker_for(s) for s in cluster.servers.values() if broker_for(s).role == "MASTER"]
        return len(found) == 1
    assert cluster.run_until(check, timeout), "no master"
    return found[0]


def msg(topic: str = "T", body: bytes = b"m", queue_id: int = 0, tags: str | None = None) -> MessageRecord:
    props = encode_properties({"TAGS": tags}) if tags else b""
    return MessageRecord(topic=topic, body=body, queue_id=queue_id, properties=props, born_timestamp=1)


def put(cluster: Cluster, broker, records, timeout: float = 10.0):
    """Put ``records`` (a list: one batch; one record: put_message) and run until answered; the PutResult."""
    out = []
    d = broker.put_messages(records) if isinstance(records, list) else broker.put_message(records)
    d.addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), timeout), "put never answered"
    return out[0]


def queue_units(broker, topic: str, queue_id: int) -> list:
    q = broker.dispatcher.queues.find(topic, queue_id)
    return q.read(q.min_offset, 1 << 20) if q is not None else []


def settled(cluster: Cluster, timeout: float = 20.0) -> bool:
    """Run until every running member committed the leader's whole log, dispatched it and applied it (metadata)."""
    def check():
        servers = list(cluster.servers.values())
        ends = {s.store.ledger_end_index for s in servers}
        committed = {s.store.committed_index for s in servers}
        return (len(ends) == 1 and committed == ends
                and all(broker_for(s).lag() == 0 and broker_for(s).machine.caught_up(s.store.committed_index)
                        for s in servers))
    return cluster.run_until(check, timeout)
