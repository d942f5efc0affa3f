"""The Broker facade and the plugin wiring: pull statuses, tag filtering, options, inert unless enabled."""

from __future__ import annotations

import pytest
from dledger_rocketmq.broker.broker import GetStatus, next_offset_correction, parse_host, queue_status, tag_matches
from dledger_rocketmq.common.message import Address, decode_record
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.consumequeue import tag_hash
from rmq_cluster_util import broker_cluster, master, msg, put, settled

from dledger import plugins
from dledger.testing import Cluster


@pytest.mark.parametrize("offset, lo, hi, status, nxt", [
    (0, 0, 0, GetStatus.NO_MESSAGE_IN_QUEUE, 0),
    (5, 0, 0, GetStatus.NO_MESSAGE_IN_QUEUE, 0),
    (2, 3, 9, GetStatus.OFFSET_TOO_SMALL, 3),
    (9, 3, 9, GetStatus.OFFSET_OVERFLOW_ONE, 9),
    (12, 3, 9, GetStatus.OFFSET_OVERFLOW_BADLY, 9),
    (12, 0, 9, GetStatus.OFFSET_OVERFLOW_BADLY, 9),  # to max also from 0 (golden 011-...-pull-offset-moved)
    (3, 3, 9, None, 3),
    (8, 3, 9, None, 8),
])
def test_queue_status(offset, lo, hi, status, nxt):
    """Pull offsets outside a queue get RocketMQ's GetMessageStatus and corrected next offset."""
    assert queue_status(offset, lo, hi) == (status, nxt)


@pytest.mark.parametrize("is_master, check, expect", [(True, False, 7), (False, False, 3), (False, True, 7)])
def test_next_offset_correction(is_master, check, expect):
    """A master corrects a bad offset; a slave keeps the consumer's unless offsetCheckInSlave."""
    assert next_offset_correction(3, 7, is_master=is_master, offset_check_in_slave=check) == expect


@pytest.mark.parametrize("codes, code, ok", [(None, 5, True), (set(), 5, True), ({5, 6}, 5, True), ({6}, 5, False)])
def test_tag_matches(codes, code, ok):
    """Tag filtering by hash: no codes means every message."""
    assert tag_matches(codes, code) is ok


def test_parse_host():
    """storeHost is ip:port, IPv6 in brackets or not; anything else is refused."""
    assert parse_host("10.0.0.2:10911") == Address("10.0.0.2", 10911)
    assert parse_host("[::1]:9") == Address("::1", 9)
    with pytest.raises(ValueError):
        parse_host("nohost")


def test_get_messages_statuses_and_tag_filter(tmp_path):
    """Pulls answer FOUND with the records, the overflow statuses at and past the end, and filter by tag hash."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, [msg(body=b"a0", tags="A"), msg(body=b"b1", tags="B"), msg(body=b"a2", tags="A")])
    assert settled(cluster)
    for s in cluster.servers.values():
        br = broker_for(s)
        r = br.get_messages("g", "T", 0, 0, 32)
        assert r.status is GetStatus.FOUND and [decode_record(x).body for x in r.records] == [b"a0", b"b1", b"a2"]
        assert (r.next_begin_offset, r.min_offset, r.max_offset) == (3, 0, 3)
        r = br.get_messages("g", "T", 0, 0, 32, tag_codes={tag_hash("A")})
        assert [decode_record(x).body for x in r.records] == [b"a0", b"a2"] and r.next_begin_offset == 3
        r = br.get_messages("g", "T", 0, 1, 1)
        assert [decode_record(x).body for x in r.records] == [b"b1"] and r.next_begin_offset == 2
        r = br.get_messages("g", "T", 0, 1, 32, tag_codes={tag_hash("C")})
        assert r.status is GetStatus.NO_MATCHED_MESSAGE and r.next_begin_offset == 3
        assert br.get_messages("g", "T", 0, 3, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
        assert br.get_messages("g", "T", 0, 9, 32).status is GetStatus.OFFSET_OVERFLOW_BADLY
        assert br.get_messages("g", "nope", 0, 0, 32).status is GetStatus.NO_MATCHED_LOGIC_QUEUE
        assert (br.max_offset("T", 0), br.min_offset("T", 0), br.max_offset("nope", 1)) == (3, 0, 0)


def test_the_plugin_is_inert_unless_enabled(tmp_path):
    """Without rocketmq.enabled a member gets no broker, no hook, no handler, no listener and no service."""
    pm = plugins.make_plugin_manager()
    cluster = Cluster(3, seed=1, plugin_manager=pm, store_base_dir=str(tmp_path))
    cluster.start()
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    assert server.config.extras["rocketmq.enabled"] is False
    assert broker_for(server) is None
    ext = plugins.server_extensions(server, pm)
    groups = (ext.role_change_handlers, ext.append_hooks, ext.commit_listeners, ext.leader_ready_listeners)
    assert not any(type(x).__module__.startswith("dledger_rocketmq") for group in groups for x in group)
    assert not any(type(s).__module__.startswith("dledger_rocketmq") for s in server.services)
    out = []
    server.append(b"\x00\x00\x00\x10\xda\xa3\x20\xa7 raw record-looking bytes").addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10) and not hasattr(out[0], "value")  # no hook refuses it
    assert not (tmp_path / f"rocketmq-{leader}").exists()


def test_options_are_declared_with_types_and_defaults():
    """The broker's options appear with their defaults in every member's resolved config."""
    pm = plugins.make_plugin_manager()
    extras = plugins.resolve_extras({}, pm)
    assert extras["rocketmq.enabled"] is False and extras["rocketmq.masterWaitTimeout"] == 30.0
    assert extras["rocketmq.brokerName"] == "broker-a"
    with pytest.raises(Exception, match="rocketmq.maxMessageSize"):
        plugins.resolve_extras({"rocketmq": {"maxMessageSize": "big"}}, pm)


def test_store_dir_option_with_member_id(tmp_path):
    """rocketmq.storeDir with '{id}' puts each member's consume queues in its own directory."""
    cluster = broker_cluster(tmp_path, **{"rocketmq.storeDir": str(tmp_path / "rmq-{id}")})
    b = master(cluster)
    put(cluster, b, msg())
    assert settled(cluster)
    for mid, server in cluster.servers.items():
        broker_for(server).dispatcher.flush()  # units are written behind (every 1,024 entries, reads, flushes)
        assert (tmp_path / f"rmq-{mid}" / "consumequeue" / "T" / "0").is_dir()


@pytest.mark.parametrize("key, value, why", [
    ("storeHost", "localhost:10911", "not an IP address"),
    ("storeHost", "10.0.0.1", "expected ip:port"),
    ("mappedFileSizeConsumeQueue", 1001, "not a positive multiple of 20"),
    ("masterWaitTimeout", 0, "not a positive number of seconds"),
])
def test_bad_option_values_are_one_line_errors(key, value, why):
    """Bad broker option values fail when the config is read, naming the option and the reason."""
    pm = plugins.make_plugin_manager()
    with pytest.raises(Exception, match=f"rocketmq.{key}.*{why}") as info:
        plugins.resolve_extras({"rocketmq": {key: value}}, pm)
    assert "\n" not in str(info.value)
