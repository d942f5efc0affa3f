"""The CommitLog on dledger: put statuses, the queue-offset rule, the append hook, committed reads."""

from __future__ import annotations

import dataclasses

import pytest
from dledger_rocketmq.common.message import (
    TRANSACTION_PREPARED_TYPE,
    Address,
    MessageRecord,
    decode_record,
    encode_record,
)
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.commitlog import (
    PutStatus,
    advance_offsets,
    plan_offsets,
    put_status_for,
    store_timestamp_position,
)
from rmq_cluster_util import broker_cluster, master, msg, put, queue_units
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.interfaces import IAppendHook


@pytest.mark.parametrize("code, status", [
    (ResponseCode.SUCCESS, PutStatus.PUT_OK),
    (ResponseCode.NOT_LEADER, PutStatus.SERVICE_NOT_AVAILABLE),
    (ResponseCode.INCONSISTENT_LEADER, PutStatus.SERVICE_NOT_AVAILABLE),
    (ResponseCode.LEADER_NOT_READY, PutStatus.SERVICE_NOT_AVAILABLE),
    (ResponseCode.DISK_FULL, PutStatus.SERVICE_NOT_AVAILABLE),
    (ResponseCode.WAIT_QUORUM_ACK_TIMEOUT, PutStatus.OS_PAGECACHE_BUSY),
    (ResponseCode.LEADER_PENDING_FULL, PutStatus.OS_PAGECACHE_BUSY),
    (ResponseCode.TERM_CHANGED, PutStatus.UNKNOWN_ERROR),
    (ResponseCode.INTERNAL_ERROR, PutStatus.UNKNOWN_ERROR),
    (ResponseCode.UNEXPECTED_ARGUMENT, PutStatus.UNKNOWN_ERROR),
    (12345, PutStatus.UNKNOWN_ERROR),
])
def test_put_status_mapping(code, status):
    """dledger response codes map to RocketMQ's PutMessageStatus as DLedgerCommitLog maps them."""
    assert put_status_for(code) is status


def R(topic, qid, sys_flag=0):
    return MessageRecord(topic=topic, body=b"x", queue_id=qid, sys_flag=sys_flag)


@pytest.mark.parametrize("table, records, offsets", [
    ({}, [R("a", 0)], [0]),
    ({("a", 0): 7}, [R("a", 0), R("a", 0), R("a", 0)], [7, 8, 9]),
    ({("a", 0): 2, ("b", 1): 5}, [R("a", 0), R("b", 1), R("a", 0)], [2, 5, 3]),
    ({("a", 0): 4}, [R("a", 0, TRANSACTION_PREPARED_TYPE), R("a", 0)], [0, 4]),
])
def test_plan_offsets_is_consecutive_per_queue_and_pure(table, records, offsets):
    """Planned offsets are consecutive per (topic, queue), skip prepared transactions, and leave the table alone."""
    before = dict(table)
    assert plan_offsets(table, records) == offsets
    assert table == before


@pytest.mark.parametrize("stored, expect", [(0, {("a", 0): 7}), (2, {("a", 0): 9}), (3, {("a", 0): 10})])
def test_advance_offsets_only_by_what_was_stored(stored, expect):
    """The table advances by the records the store accepted only: a refused put leaves no hole."""
    table = {("a", 0): 7}
    records = [R("a", 0)] * 3
    advance_offsets(table, records, plan_offsets(table, records), stored)
    assert table == expect


def test_store_timestamp_position_follows_the_born_host():
    """STORETIMESTAMP sits after an 8-byte IPv4 or 20-byte IPv6 BORNHOST, where the codec writes it."""
    for born in (Address("10.0.0.1", 5), Address("::1", 5)):
        rec = MessageRecord(topic="t", body=b"b", born_host=born, store_timestamp=0x0102030405060708,
                            sys_flag=0x10 if born.is_v6 else 0)
        raw = encode_record(rec)
        pos = store_timestamp_position(rec.sys_flag)
        assert raw[pos:pos + 8] == bytes.fromhex("0102030405060708")


def test_batch_offsets_contiguous_and_physical_offsets_are_entry_positions(tmp_path):
    """A batch gets contiguous queue offsets; each record's PHYSICALOFFSET is its entry pos + 48 and reads back."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    r1 = put(cluster, b, [msg(body=b"a%d" % i) for i in range(5)])
    put_at = cluster.clock.seconds()
    r2 = put(cluster, b, msg(body=b"single"))
    assert r1.status is PutStatus.PUT_OK and r2.status is PutStatus.PUT_OK
    assert (r1.queue_offset, r1.count, r2.queue_offset) == (0, 5, 5)
    assert len(r1.msg_ids) == 5
    store = b.server.store
    last = store.get(store.ledger_end_index)
    assert r2.physical_offset == last.pos + 48
    raw = b.get_message(r2.physical_offset, len(last.body))
    rec = decode_record(raw)
    assert (rec.body, rec.queue_offset, rec.physical_offset) == (b"single", 5, r2.physical_offset)
    assert rec.store_timestamp == int(put_at * 1000)  # written by the append hook when the leader stored it
    assert rec.message_id == r2.msg_id
    batch = [decode_record(b.get_message(int(mid[16:], 16), _size(b, int(mid[16:], 16)))) for mid in r1.msg_ids]
    assert [r.queue_offset for r in batch] == [0, 1, 2, 3, 4]
    assert len({r.store_timestamp for r in batch}) == 1  # one store time per put, as RocketMQ stamps a batch


def _size(broker, phys):
    return int.from_bytes(broker.get_message(phys, 4), "big")


def test_reads_never_return_uncommitted_bytes(tmp_path):
    """get_message past the committed position fails; max_physical_offset is the committed position."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg())
    end = b.commitlog.max_physical_offset()
    assert end == b.server.store.committed_position()
    with pytest.raises(DLedgerError) as info:
        b.get_message(end - 10, 20)
    assert info.value.code is ResponseCode.INDEX_OUT_OF_RANGE


def test_a_slave_refuses_puts_and_leaves_no_offsets(tmp_path):
    """A put on a slave answers SERVICE_NOT_AVAILABLE and the master's offsets stay contiguous."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    assert put(cluster, slave, msg()).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert put(cluster, b, msg()).queue_offset == 0


def test_a_refused_put_consumes_no_queue_offset(tmp_path):
    """A put the member refuses at once (pending queue full) does not advance the queue-offset table."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg())
    b.server.pending.limit, saved = 0, b.server.pending.limit
    refused = put(cluster, b, [msg(), msg()])
    b.server.pending.limit = saved
    assert refused.status is PutStatus.OS_PAGECACHE_BUSY
    assert put(cluster, b, msg()).queue_offset == 1


def test_raw_dledger_appends_of_records_are_refused(tmp_path):
    """A RocketMQ record appended by a plain dledger client is refused: only the broker assigns queue offsets."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    out = []
    b.server.append(encode_record(msg())).addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10)
    assert isinstance(out[0].value, DLedgerError)
    assert "through the broker" in str(out[0].value)
    ok = []
    b.server.append(b"RMQC\x01payload").addBoth(ok.append)  # control entries pass
    assert cluster.run_until(lambda: bool(ok), 10) and not hasattr(ok[0], "value")


def _put_batch(cluster, broker, template, items):
    out = []
    broker.put_batch(template, items).addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10), "put_batch never answered"
    return out[0]


@pytest.mark.parametrize("sys_flag", [0, TRANSACTION_PREPARED_TYPE])
def test_put_batch_stores_what_put_messages_stores(tmp_path, sys_flag):
    """A batch encoded together is stored byte for byte as its records put one by one, with the same answer."""
    from dledger_rocketmq.common.batch import BatchItem, batch_records
    from dledger_rocketmq.common.message import encode_properties
    items = [BatchItem(b"body-%d" % i, encode_properties({"TAGS": f"t{i % 2}"}), i) for i in range(6)]
    template = MessageRecord(topic="T", body=b"", queue_id=1, sys_flag=sys_flag, born_timestamp=5,
                             born_host=Address("10.0.0.9", 4000))
    results, logs = [], []
    for way in ("records", "batch"):
        cluster = broker_cluster(tmp_path / way)
        b = master(cluster)
        put(cluster, b, msg(queue_id=1))  # the queue does not start at 0
        if way == "records":
            result = put(cluster, b, batch_records(items, template))
        else:
            result = _put_batch(cluster, b, template, items)
        store = b.server.store
        results.append(result)
        logs.append([store.get(i).body for i in range(store.ledger_end_index + 1)])
    assert results[0] == results[1] and results[0].status is PutStatus.PUT_OK
    assert logs[0] == logs[1]
    assert results[1].queue_offset == (1 if sys_flag == 0 else 0) and results[1].count == 6


def test_put_batch_refuses_what_put_refuses(tmp_path):
    """An empty batch, a slave, a message too large: the same refusals as put, and no queue offset consumed."""
    from dledger_rocketmq.common.batch import BatchItem
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    template = msg()
    assert _put_batch(cluster, b, template, []).status is PutStatus.MESSAGE_ILLEGAL
    assert _put_batch(cluster, slave, template, [BatchItem(b"x")]).status is PutStatus.SERVICE_NOT_AVAILABLE
    huge = _put_batch(cluster, b, template, [BatchItem(b"x"), BatchItem(b"y" * (b.commitlog.max_message_size + 1))])
    assert huge.status is PutStatus.MESSAGE_ILLEGAL and "exceeds the maximum message size" in huge.error
    assert put(cluster, b, msg()).queue_offset == 0


def test_a_batch_with_a_delay_level_is_rewritten_as_put_messages_does(tmp_path):
    """Broker.put_batch leaves a batch with a DELAY property to put_messages: the delayed message goes to the
    schedule topic, the others stay in their topic, as one put of the records would store them."""
    from dledger_rocketmq.common.message import encode_properties
    from dledger_rocketmq.store.consumequeue import SCHEDULE_TOPIC
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    items = [(b"now", encode_properties({"TAGS": "a"}), 0), (b"later", encode_properties({"DELAY": "2"}), 0)]
    out = []
    b.put_batch(msg(), items).addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10) and out[0].status is PutStatus.PUT_OK
    store = b.server.store
    stored = [decode_record(store.get(i).body) for i in range(store.ledger_end_index - 1, store.ledger_end_index + 1)]
    assert [(r.topic, r.body) for r in stored] == [("T", b"now"), (SCHEDULE_TOPIC, b"later")]


@pytest.mark.parametrize("born", [Address("10.0.0.1", 5), Address("::1", 5)])
def test_the_append_hook_stamps_the_store_time_after_either_born_host(tmp_path, born):
    """The hook writes STORETIMESTAMP where the codec put it (after an IPv4 or IPv6 BORNHOST); BORNHOST stays."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    record = dataclasses.replace(msg(body=b"hosted"), born_host=born, sys_flag=0x10 if born.is_v6 else 0)
    put_at = cluster.clock.seconds()
    r = put(cluster, b, record)
    assert r.status is PutStatus.PUT_OK
    rec = decode_record(b.get_message(r.physical_offset, _size(b, r.physical_offset)))
    assert (rec.born_host, rec.body, rec.store_timestamp) == (born, b"hosted", int(put_at * 1000))


def test_a_put_the_quorum_never_acknowledged_is_not_put_ok(tmp_path):
    """Found by the nemesis (broker workload, seed 1): a master cut off from its followers answered PUT_OK for a
    message no quorum ever held, and the next master gave its queue offset to another message.

    dledger answers a pending append that does not commit with a *response* carrying WAIT_QUORUM_ACK_TIMEOUT or
    TERM_CHANGED (its Deferred fires, it does not fail); the put must read that code, not the firing alone.
    """
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg())
    cluster.isolate(b.server.self_id)
    result = put(cluster, b, msg(body=b"never held by a quorum"), timeout=30)
    assert result.status is not PutStatus.PUT_OK, result
    assert result.status in (PutStatus.OS_PAGECACHE_BUSY, PutStatus.UNKNOWN_ERROR, PutStatus.SERVICE_NOT_AVAILABLE)


def _gathered(cluster, b, records, calls):
    """Put ``records`` one by one between gather() and flush_gathered(); run until all are answered."""
    server = b.server
    real = server.handle_requests_answering
    server.handle_requests_answering = lambda reqs, *a: calls.extend(len(r.bodies()) for r in reqs) or real(reqs, *a)
    out = [None] * len(records)
    b.commitlog.gather()
    for k, r in enumerate(records):
        b.put_message(r).addBoth(lambda result, k=k: out.__setitem__(k, result))
    held = server.store.ledger_end_index
    b.commitlog.flush_gathered()
    assert cluster.run_until(lambda: None not in out, 10), "gathered puts never answered"
    return out, held  # in the order of the puts


def test_gathered_single_puts_are_one_store_batch_with_an_answer_each(tmp_path):
    """The single sends of one read: held until the flush, then ONE append request of all their records (one
    pending append); each answered with its own queue offset (consecutive per queue), physical offset (its
    entry's pos + 48) and message id."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg(body=b"before"))
    end = b.server.store.ledger_end_index
    calls = []
    records = [msg(body=b"g0"), msg(body=b"g1", queue_id=3), msg(body=b"g2"), msg(body=b"g3")]
    out, held = _gathered(cluster, b, records, calls)
    assert held == end  # nothing was appended before the flush
    assert calls == [4]
    assert len(b.server.pending) <= 1  # one pending append for the four (none once it committed)
    assert all(r.status is PutStatus.PUT_OK for r in out), out
    assert [(r.queue_id, r.queue_offset, r.count) for r in out] == [(0, 1, 1), (3, 0, 1), (0, 2, 1), (0, 3, 1)]
    assert len({r.physical_offset for r in out}) == 4
    for r, sent in zip(out, records, strict=True):
        rec = decode_record(b.get_message(r.physical_offset, _size(b, r.physical_offset)))
        assert (rec.body, rec.queue_id, rec.queue_offset, rec.physical_offset) == (
            sent.body, sent.queue_id, r.queue_offset, r.physical_offset)
        assert rec.message_id == r.msg_id and r.msg_ids == (r.msg_id,)
    assert put(cluster, b, msg(body=b"after")).queue_offset == 4


def test_gathered_puts_refused_by_the_member_are_each_answered_and_consume_no_offset(tmp_path):
    """Pending appends full: the gathered puts are one request, refused as one; each answers OS_PAGECACHE_BUSY
    and the queue's next offset is where it was."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg())
    b.server.pending.limit, saved = len(b.server.pending), b.server.pending.limit
    out, _ = _gathered(cluster, b, [msg(body=b"a"), msg(body=b"b"), msg(body=b"c")], [])
    b.server.pending.limit = saved
    assert [r.status for r in out] == [PutStatus.OS_PAGECACHE_BUSY] * 3
    assert put(cluster, b, msg()).queue_offset == 1


def test_a_gathered_batch_refused_midway_by_another_hook_leaves_no_offset_gap(tmp_path):
    """Another plugin's append hook refuses the second of three gathered records: the request fails (every put
    answered, none PUT_OK), the stored first record keeps queue offset 0, and the next put gets offset 1 -- no
    gap (one request per read; with one request per put the third was stored at offset 2 after a hole at 1)."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)

    @implementer(IAppendHook)
    class RefuseB:
        def before_append(self, entry, buffer, body_offset):
            if b"refuse me" in bytes(buffer[body_offset:]):
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "no bb here")
    b.server.add_append_hook(RefuseB())
    out, held = _gathered(cluster, b, [msg(body=b"aa"), msg(body=b"refuse me"), msg(body=b"cc")], [])
    assert not any(r.ok for r in out), out
    assert b.server.store.ledger_end_index == held + 1  # the first record was stored before the refusal
    assert put(cluster, b, msg(body=b"dd")).queue_offset == 1
    assert cluster.run_until(lambda: len(queue_units(b, "T", 0)) >= 2, 10)
    units = queue_units(b, "T", 0)
    assert [(q, decode_record(b.get_message(u.physical_offset, u.size)).body) for q, u in units] == [
        (0, b"aa"), (1, b"dd")]


def test_a_gathered_put_too_large_fails_alone_and_consumes_no_offset(tmp_path):
    """A record over maxMessageSize answers MESSAGE_ILLEGAL; the puts around it get consecutive offsets."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    big = msg(body=bytes(b.commitlog.max_message_size + 1))
    out, _ = _gathered(cluster, b, [msg(body=b"a"), big, msg(body=b"c")], [])
    assert [r.status for r in out] == [PutStatus.PUT_OK, PutStatus.MESSAGE_ILLEGAL, PutStatus.PUT_OK]
    assert [out[0].queue_offset, out[2].queue_offset] == [0, 1]


def test_gathered_puts_on_a_slave_are_refused_each(tmp_path):
    """A slave holds nothing: every gathered put answers SERVICE_NOT_AVAILABLE, no append is tried."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    slave = next(broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b)
    calls = []
    out, _ = _gathered(cluster, slave, [msg(), msg()], calls)
    assert [r.status for r in out] == [PutStatus.SERVICE_NOT_AVAILABLE] * 2 and calls == []


def test_a_gathered_put_over_the_members_entry_size_fails_alone_and_leaves_no_gap(tmp_path):
    """A record within maxMessageSize but over the member's maxEntrySize is refused before the append (the member
    would refuse it after its queue offset was planned): the puts after it get the next offsets, no gap."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    object.__setattr__(b.server.config, "max_entry_size", 1024)
    out, _ = _gathered(cluster, b, [msg(body=b"a"), msg(body=bytes(2000)), msg(body=b"c")], [])
    assert [r.status for r in out] == [PutStatus.PUT_OK, PutStatus.UNKNOWN_ERROR, PutStatus.PUT_OK]
    assert [out[0].queue_offset, out[2].queue_offset] == [0, 1]
    assert "maxEntrySize" in out[1].error
