"""Consume-queue dispatch from dledger's commit feed: routing, identical queues everywhere, recovery."""

from __future__ import annotations

import pytest
from dledger_rocketmq.common.message import Address, MessageRecord, encode_record
from dledger_rocketmq.plugin import broker_for
from dledger_rocketmq.store.commitlog import PutStatus
from dledger_rocketmq.store.dispatch import EntryKind, entry_kind, resume_physical
from hypothesis import given
from hypothesis import strategies as st
from rmq_cluster_util import broker_cluster, master, msg, put, queue_units, settled


@pytest.mark.parametrize("body, kind", [
    (encode_record(msg()), EntryKind.RECORD),
    (b"RMQC\x01whatever", EntryKind.CONTROL),
    (b"RMQC", EntryKind.CONTROL),
    (b"", EntryKind.FOREIGN),
    (b"hello world", EntryKind.FOREIGN),
    (b"\x00\x00\x00\x10\xcb\xd41\x94" + bytes(8), EntryKind.FOREIGN),  # a blank record is no message
])
def test_entry_kind(body, kind):
    """Entry bodies are told apart as the contract says: records by magic, control by b'RMQC', the rest foreign."""
    assert entry_kind(body) == kind


@pytest.mark.parametrize("queues_end, committed, expect", [(0, 0, 0), (500, 900, 500), (900, 500, 500)])
def test_resume_physical_never_past_the_committed_end(queues_end, committed, expect):
    """After a restart the queues keep units only below the log's committed position."""
    assert resume_physical(queues_end, committed) == expect


def _all_queues(cluster, topic, qid):
    return {mid: queue_units(broker_for(s), topic, qid) for mid, s in cluster.servers.items()}


def test_every_member_has_identical_queues_and_control_entries_go_to_the_callback(tmp_path):
    """Puts show up with identical physical and queue offsets on every member; RMQC entries reach on_control only."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    controls = {mid: [] for mid in cluster.servers}
    for mid, s in cluster.servers.items():
        broker_for(s).dispatcher.on_control = lambda i, body, mid=mid: controls[mid].append(body)
    put(cluster, b, [msg(queue_id=q, body=b"b%d" % q) for q in (0, 1, 0, 2)])
    done = []
    b.server.append(b"RMQC\x01offsets").addBoth(done.append)
    b.server.append(b"foreign bytes").addBoth(done.append)
    put(cluster, b, msg(queue_id=1, tags="tagA"))
    assert settled(cluster)
    for qid, count in ((0, 2), (1, 2), (2, 1)):
        seen = _all_queues(cluster, "T", qid)
        first = next(iter(seen.values()))
        assert len(first) == count and [o for o, _ in first] == list(range(count))
        assert all(units == first for units in seen.values()), seen
    assert all(c == [b"RMQC\x01offsets"] for c in controls.values()), controls
    assert all(broker_for(s).dispatcher.skipped == 1 for s in cluster.servers.values())


def test_restart_resumes_dispatch_and_rebuilds_damaged_queues(tmp_path):
    """A restarted member resumes after its last indexed record; a damaged queue directory is rebuilt from the log."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    for i in range(6):
        put(cluster, b, msg(body=b"m%d" % i))
    assert settled(cluster)
    follower = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    expected = queue_units(b, "T", 0)
    cluster.crash(follower)
    cluster.restart(follower)
    nb = broker_for(cluster.servers[follower])
    assert nb.dispatcher.start_index() > 0  # resumed, not replayed from the first entry
    cluster.crash(follower)
    qdir = tmp_path / f"rocketmq-{follower}" / "consumequeue" / "T" / "0"
    (qdir / "junk").write_bytes(b"x")  # not a consume-queue file: the directory no longer opens
    cluster.restart(follower)
    nb = broker_for(cluster.servers[follower])
    assert not (qdir / "junk").exists()
    assert cluster.run_until(lambda: queue_units(nb, "T", 0) == expected, 20), queue_units(nb, "T", 0)


def test_units_past_the_committed_end_are_dropped_at_start(tmp_path):
    """A unit whose record lies past the log's committed position is dropped on start (never served)."""
    from dledger_rocketmq.store.consumequeue import ConsumeQueue, Unit
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg())
    assert settled(cluster)
    follower = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    cluster.crash(follower)
    q = ConsumeQueue(tmp_path / f"rocketmq-{follower}", "T", 0, file_size=1000)
    q.append(q.max_offset, Unit(10 ** 9, 100, 0))  # a unit for a record the log never had
    cluster.restart(follower)
    nb = broker_for(cluster.servers[follower])
    assert all(u.physical_offset < 10 ** 9 for _, u in queue_units(nb, "T", 0))
    assert cluster.run_until(lambda: queue_units(nb, "T", 0) == queue_units(b, "T", 0), 20)


def test_a_new_leaders_noop_is_no_dispatch_lag(tmp_path):
    """After a leader change with no new message, the NOOP at the log's tail does not count as lag anywhere."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    put(cluster, b, msg())
    assert settled(cluster)
    cluster.crash(b.server.self_id)
    new = master(cluster)
    store = new.server.store
    assert store.get(store.committed_index).is_noop  # the new term's NOOP ends the committed log
    assert cluster.run_until(lambda: all(broker_for(s).server.store.committed_index == store.committed_index
                                         for s in cluster.servers.values()), 10)
    assert all(broker_for(s).lag() == 0 for s in cluster.servers.values())


def test_index_fields_agree_with_unit_for_on_every_golden_record():
    """The dispatch fast path gives exactly unit_for(decode_record(...)) for all 177 records of the golden store."""
    from conftest import STORE, golden_entries
    from dledger_rocketmq.common.message import decode_record
    from dledger_rocketmq.store.consumequeue import unit_for
    from dledger_rocketmq.store.dispatch import index_fields
    seen = 0
    for entry in golden_entries(STORE / "dledger-n1" / "data"):
        rec = decode_record(entry.body, verify_crc=False)
        assert index_fields(entry.body) == (rec.topic, rec.queue_id, rec.queue_offset, unit_for(rec))
        seen += 1
    assert seen == 177


@pytest.mark.parametrize("cut", [1, 10, 60])
def test_index_fields_refuses_a_cut_record(cut):
    """A record whose bytes do not add up to TOTALSIZE is refused with a CodecError, never mis-indexed."""
    from dledger_rocketmq.common.errors import CodecError
    from dledger_rocketmq.store.dispatch import index_fields
    raw = encode_record(msg(tags="A", body=b"0123456789" * 5))
    with pytest.raises(CodecError):
        index_fields(raw[:-cut])


class _FakeServer:
    """What a Dispatcher uses outside recovery."""

    def __init__(self):
        from twisted.internet.task import Clock
        self.clock = Clock()
        self.self_id = "n0"


def _dispatcher(tmp_path, file_size=20 * 10, drain_after=1):
    from dledger_rocketmq.store.consumequeue import ConsumeQueues
    from dledger_rocketmq.store.dispatch import Dispatcher
    d = Dispatcher(_FakeServer(), tmp_path, file_size=file_size, max_open_files=4, drain_after=drain_after)
    d.queues = ConsumeQueues(tmp_path, file_size=file_size, max_open_files=4)
    return d


def test_a_delivery_is_one_pwrite_per_queue_file(tmp_path, monkeypatch):
    """The units of one commit-feed delivery are written per queue with one pwrite per file (each was its own;
    ``drain_after=1``: written at the end of every delivery)."""
    from dledger_rocketmq.store import consumequeue as cq
    from dledger_rocketmq.tools.bench_dispatch import make_entries
    entries = make_entries(36, 3, 16)  # 12 units per queue; files of 10 units
    writes = []
    real = cq.write_at
    monkeypatch.setattr(cq, "write_at", lambda fd, data, off: (writes.append(len(data) // 20), real(fd, data, off)))
    d = _dispatcher(tmp_path)
    d.entries_committed(entries[:24])
    assert sorted(writes) == [8, 8, 8]
    writes.clear()
    d.entries_committed(entries[24:])
    assert sorted(writes) == [2, 2, 2, 2, 2, 2]  # 4 units per queue, across a file boundary
    assert d.dispatched_index == 35
    for qid in range(3):
        units = d.queues.queue("BenchTopic", qid).read(0, 100)
        assert [o for o, _ in units] == list(range(12))
        assert [u.physical_offset for _, u in units] == [e.pos + 48 for e in entries[qid::3]]
    d.close()
    assert len(d.queues.fds) == 0


def test_a_failed_write_puts_the_dispatched_position_back(tmp_path, monkeypatch):
    """If a delivery's units cannot be written, the dispatcher is where it was before it; a redelivery completes it."""
    from dledger_rocketmq.store import consumequeue as cq
    from dledger_rocketmq.tools.bench_dispatch import make_entries
    entries = make_entries(8, 2, 16)
    d = _dispatcher(tmp_path)
    d.entries_committed(entries[:4])
    before = (d.dispatched_index, d.dispatched_position)

    def fail(fd, data, off):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(cq, "write_at", fail)
    with pytest.raises(OSError):
        d.entries_committed(entries[4:])
    monkeypatch.undo()
    assert (d.dispatched_index, d.dispatched_position) == before == (3, entries[3].pos + entries[3].size)
    assert [q.max_offset for q in d.queues.queues()] == [2, 2]
    d.entries_committed(entries[4:])
    assert [q.max_offset for q in d.queues.queues()] == [4, 4] and d.dispatched_index == 7
    d.close()


def test_bench_dispatch_runs_on_a_tiny_workload(capsys):
    """python -m dledger_rocketmq.tools.bench_dispatch runs (tiny workload, few open files), refuses bad arguments."""
    from dledger_rocketmq.tools import bench_dispatch
    assert bench_dispatch.main(["--messages", "60", "--queues", "5", "--batch", "7", "--body", "10",
                                "--file-size", "100", "--max-open-files", "2"]) == 0
    assert "messages=60 queues=5 batch=7: dispatch " in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        bench_dispatch.main(["--queues", "0"])
    assert exc.value.code == 2 and "--queues must be at least 1" in capsys.readouterr().err


# -- the fast path (quick_unit) ------------------------------------------------------------------------------

def _quick_as_index_fields(body):
    """quick_unit's answer in index_fields' shape (None stays None)."""
    from dledger_rocketmq.store.consumequeue import Unit, tag_hash
    from dledger_rocketmq.store.dispatch import quick_unit
    found = quick_unit(body)
    if found is None:
        return None
    topic, qid, qoff, phys, size, tags = found
    return topic.decode(), qid, qoff, Unit(phys, size, tag_hash(tags.decode("utf-8", "replace") if tags else None))


def test_quick_unit_agrees_with_index_fields_on_every_golden_record():
    """Where the fast path answers for a golden record, it gives index_fields' unit; it answers for plain ones."""
    from conftest import STORE, golden_entries
    from dledger_rocketmq.store.dispatch import index_fields
    answered = 0
    for entry in golden_entries(STORE / "dledger-n1" / "data"):
        quick = _quick_as_index_fields(entry.body)
        if quick is not None:
            assert quick == index_fields(entry.body)
            answered += 1
    assert answered > 100  # the plain records of the recorded deployment take the fast path


def _props(raw: bytes) -> MessageRecord:
    return MessageRecord(topic="T", body=b"m", properties=raw, queue_id=3, queue_offset=7, physical_offset=4096)


@pytest.mark.parametrize("name, record, answers", [
    ("plain record with tags", msg(tags="TagA"), True),
    ("no properties at all", msg(), True),
    ("tags among other properties", _props(b"KEYS\x01k\x02TAGS\x01B\x02UNIQ_KEY\x01u"), True),
    ("a property merely ending in TAGS is no TAGS", _props(b"XTAGS\x01x"), False),
    ("two TAGS items: the full scan decides", _props(b"TAGS\x01a\x02TAGS\x01b"), False),
    ("an empty TAGS value: the full scan decides", _props(b"TAGS\x01"), False),
    ("schedule topic (delivery time, not a hash)", MessageRecord(topic="SCHEDULE_TOPIC_XXXX", body=b"m"), False),
    ("transaction prepared (no unit)", MessageRecord(topic="T", body=b"m", sys_flag=0x4), False),
    ("IPv6 born host (other layout)", MessageRecord(topic="T", body=b"m", sys_flag=0x10,
                                                     born_host=Address("::1", 1)),
     False),
])
def test_quick_unit_answers_only_where_it_is_certain(name, record, answers):
    """quick_unit answers plain records exactly as index_fields does, and leaves every special case to it."""
    from dledger_rocketmq.store.dispatch import index_fields, quick_unit
    body = encode_record(record)
    assert (quick_unit(body) is not None) is answers, name
    if answers:
        assert _quick_as_index_fields(body) == index_fields(body)


@pytest.mark.parametrize("cut", [1, 10, 60])
def test_quick_unit_leaves_a_cut_record_to_the_full_decode(cut):
    """A record whose bytes do not add up is never answered by the fast path (index_fields then refuses it)."""
    from dledger_rocketmq.store.dispatch import quick_unit
    raw = encode_record(msg(tags="A", body=b"0123456789" * 5))
    assert quick_unit(raw[:-cut]) is None
    assert quick_unit(raw + b"\0") is None


@given(props=st.lists(st.tuples(st.sampled_from(["TAGS", "KEYS", "XTAGS", "TAG"]),
                                st.text(alphabet="ab\u00e9", max_size=3)), max_size=4),
       body=st.binary(max_size=40), garbage=st.binary(max_size=6))
def test_quick_unit_never_disagrees_with_index_fields(props, body, garbage):
    """On any record (and any record with bytes appended), the fast path is silent or gives index_fields' unit."""
    from dledger_rocketmq.common.errors import CodecError
    from dledger_rocketmq.store.dispatch import index_fields
    raw_props = "\x02".join(f"{k}\x01{v}" for k, v in props).encode()
    for raw in (encode_record(MessageRecord(topic="T", body=body, properties=raw_props)),
                encode_record(_props(raw_props)) + garbage):
        quick = _quick_as_index_fields(raw)
        if quick is not None:
            try:
                assert quick == index_fields(raw)
            except CodecError:
                raise AssertionError("the fast path answered a record index_fields refuses") from None


def test_fast_and_full_dispatch_write_the_same_queues(tmp_path):
    """A dispatcher on the fast path and one decoding every record (verify_crc) build identical queues."""
    from dledger_rocketmq.store.consumequeue import ConsumeQueues
    from dledger_rocketmq.store.dispatch import Dispatcher
    from dledger_rocketmq.tools.bench_dispatch import make_entries
    entries = make_entries(50, 4, 16)
    views = []
    for verify in (False, True):
        root = tmp_path / str(verify)
        d = Dispatcher(_FakeServer(), root, file_size=20 * 8, verify_crc=verify)
        d.queues = ConsumeQueues(root, file_size=20 * 8)
        for i in range(0, len(entries), 7):
            d.entries_committed(entries[i:i + 7])
        views.append(([(q.topic, q.queue_id, q.read(0, 100)) for q in d.queues.queues()],
                      d.dispatched_index, d.dispatched_position))
        d.close()
    assert views[0] == views[1]
    assert views[0][1] == 49 and sum(len(units) for _, _, units in views[0][0]) == 50


@pytest.mark.parametrize("verify", [False, True])
def test_a_queue_restarts_after_records_the_log_no_longer_holds(tmp_path, verify):
    """Entries skipped because the log now starts after them (compaction, an installed snapshot): each queue whose
    units all lie before the log's begin restarts at its next unit; the old next offset goes to on_rebase."""
    from dledger_rocketmq.store.consumequeue import ConsumeQueues
    from dledger_rocketmq.store.dispatch import Dispatcher
    from dledger_rocketmq.tools.bench_dispatch import make_entries
    entries = make_entries(36, 3, 16)  # queue offsets 0..11 in each of 3 queues
    server = _FakeServer()
    begin = [0]
    server.store = type("Store", (), {"begin_position": lambda self: begin[0]})()
    d = Dispatcher(server, tmp_path, file_size=20 * 10, verify_crc=verify)
    d.queues = ConsumeQueues(tmp_path, file_size=20 * 10)
    rebased = []
    d.on_rebase = lambda topic, qid, nxt: rebased.append((topic, qid, nxt))
    d.entries_committed(entries[:12])  # offsets 0..3 per queue
    d.entries_committed(entries[24:27])  # 12..23 never delivered, the log still holds them: refused
    assert [q.max_offset for q in d.queues.queues()] == [4, 4, 4] and rebased == []
    begin[0] = entries[24].pos  # now the log starts at entry 24
    d.entries_committed(entries[24:])
    assert sorted(rebased) == [("BenchTopic", q, 4) for q in range(3)]
    for qid in range(3):
        q = d.queues.queue("BenchTopic", qid)
        assert (q.min_offset, q.max_offset) == (8, 12)
        assert [u.physical_offset for _, u in q.read(8, 100)] == [e.pos + 48 for e in entries[24 + qid::3]]
    d.close()


def _mixed_entries(keys, body_size=16):
    """Committed entries for ``keys`` [(topic, queue id), ...] in that order, with consistent queue offsets."""
    from dledger_rocketmq.common.message import patch_physical_offset
    from dledger_rocketmq.tools.bench_dispatch import _Entry

    from dledger.entry import HEADER_SIZE
    nxt, entries, pos = {}, [], 0
    for i, (topic, qid) in enumerate(keys):
        body = bytearray(encode_record(MessageRecord(topic, b"x" * body_size, b"TAGS\x01T%d" % (i % 3), qid,
                                                     queue_offset=nxt.get((topic, qid), 0))))
        patch_physical_offset(body, 0, pos + HEADER_SIZE)
        nxt[(topic, qid)] = nxt.get((topic, qid), 0) + 1
        entries.append(_Entry(i, pos, HEADER_SIZE + len(body), bytes(body)))
        pos += HEADER_SIZE + len(body)
    return entries


@pytest.mark.parametrize("keys", [
    [("A", 0)] * 5 + [("B", 0)] * 3 + [("A", 0)] * 2,  # runs of one queue id under two topics
    [("A", 0), ("A", 1), ("A", 1), ("A", 0), ("B", 1), ("A", 1)],  # one topic, queue ids alternating
    [("AB", 1), ("A", 1), ("B", 1), ("AB", 1), ("AB", 2), ("A", 2)],  # topic names that are prefixes of others
])
def test_runs_of_one_queue_dispatch_as_the_full_decode_does(tmp_path, keys):
    """The dispatcher's run shortcut (consecutive records of one topic and queue) puts every unit in its own
    queue: the same queues as a dispatcher decoding every record, whatever the deliveries' cuts."""
    from dledger_rocketmq.store.consumequeue import ConsumeQueues
    from dledger_rocketmq.store.dispatch import Dispatcher
    entries = _mixed_entries(keys)
    views = []
    for verify, cut in ((True, 100), (False, 100), (False, 3), (False, 1)):
        root = tmp_path / f"{verify}-{cut}"
        d = Dispatcher(_FakeServer(), root, verify_crc=verify)
        d.queues = ConsumeQueues(root)
        for i in range(0, len(entries), cut):
            d.entries_committed(entries[i:i + cut])
        views.append(sorted((q.topic, q.queue_id, q.read(0, 100)) for q in d.queues.queues()))
        d.close()
    assert all(v == views[0] for v in views)
    want = {}
    for e, key in zip(entries, keys):
        want.setdefault(key, []).append(e.pos + 48)
    assert {(t, q): [u.physical_offset for _, u in units] for t, q, units in views[0]} == want


# -- writing behind: the units of several deliveries in one pwrite per queue file ---------------------------------
def _queue_files(root):
    """Every consume-queue file under ``root`` with its bytes."""
    base = root / "consumequeue"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("drain_after, cut, writes", [
    (1, 7, 32),  # every delivery written at its end: 8 deliveries x 4 queues (minus empty ones, + file ends)
    (14, 7, 20),  # every second delivery: 3 writes + the flush's, x 4 queues, + each queue's file boundary
    (1024, 7, 8),  # only at the flush: one pwrite per queue file (two files per queue)
    (1024, 50, 8),
])
def test_writing_behind_keeps_the_files_byte_for_byte(tmp_path, monkeypatch, drain_after, cut, writes):
    """Units buffered over several deliveries (``drain_after`` entries) are written with fewer pwrites and give
    the same consume-queue files, byte for byte, as writing every delivery at its end; reads see every unit
    dispatched before any write."""
    from dledger_rocketmq.store import consumequeue as cq
    from dledger_rocketmq.tools.bench_dispatch import make_entries
    entries = make_entries(50, 4, 16)
    files = {}
    for run, after in enumerate((1, drain_after)):
        count: list[int] = []
        monkeypatch.setattr(cq, "write_at", lambda fd, data, off, count=count, real=cq.write_at: (
            count.append(1), real(fd, data, off)))
        d = _dispatcher(tmp_path / str(run), file_size=20 * 8, drain_after=after)
        for i in range(0, len(entries), cut):
            d.entries_committed(entries[i:i + cut])
        assert d.dispatched_index == 49
        q = d.queues.queue("BenchTopic", 1)  # a read writes that queue's buffered units first
        assert [u.physical_offset for _, u in q.read(0, 100)] == [e.pos + 48 for e in entries[1::4]]
        d.flush()
        monkeypatch.undo()
        if run == 1:
            assert len(count) == writes
        files[run] = _queue_files(tmp_path / str(run))
        d.close()
    assert files[1] == files[0] and len(files[0]) == 8


@pytest.mark.parametrize("how", ["delivery", "read", "flush", "flush_with"])
def test_a_failed_write_behind_puts_the_dispatcher_before_every_unwritten_delivery(tmp_path, monkeypatch, how):
    """Units of several deliveries wait in memory; if their write fails, whoever drained them (the delivery that
    reached drain_after, a consumer's read, a flush), the dispatched position goes back to before the oldest
    delivery not written (a redelivery completes the queues); a flush that fails errbacks instead of raising."""
    from dledger_rocketmq.store import consumequeue as cq
    from dledger_rocketmq.tools.bench_dispatch import make_entries

    from dledger.diskio import INLINE
    entries = make_entries(16, 2, 16)
    d = _dispatcher(tmp_path, drain_after=8)
    d.entries_committed(entries[:8])  # written: 8 entries delivered
    before = (d.dispatched_index, d.dispatched_position)
    d.entries_committed(entries[8:11])
    d.entries_committed(entries[11:14])  # buffered: 6 entries since the last write
    assert d.dispatched_index == 13

    def fail(fd, data, off):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(cq, "write_at", fail)
    if how == "delivery":
        with pytest.raises(OSError):
            d.entries_committed(entries[14:])
    elif how == "read":
        with pytest.raises(OSError):
            d.queues.queue("BenchTopic", 0).read(0, 100)
    elif how == "flush":
        with pytest.raises(OSError):
            d.flush()
    else:
        failures = []
        d.flush_with(INLINE).addErrback(failures.append)
        assert len(failures) == 1 and failures[0].check(OSError)
    monkeypatch.undo()
    assert (d.dispatched_index, d.dispatched_position) == before == (7, entries[7].pos + entries[7].size)
    d.drain()
    d.entries_committed(entries[8:])
    d.drain()
    assert [q.max_offset for q in d.queues.queues()] == [8, 8] and d.dispatched_index == 15
    for qid in range(2):
        assert ([u.physical_offset for _, u in d.queues.queue("BenchTopic", qid).read(0, 100)]
                == [e.pos + 48 for e in entries[qid::2]])
    d.close()


@pytest.mark.parametrize("trigger", ["read", "get", "replayed delivery"])
def test_whatever_drains_writes_every_queue_so_the_files_stay_a_prefix_of_the_dispatch(tmp_path, trigger):
    """A drain of one queue (a consumer's read, a get, a replay's comparison) writes every queue's buffered
    units: recovery resumes after the last record ANY queue's files index, so a crash after a one-queue write
    would otherwise lose the other queues' earlier units for good. The files, read afresh, hold every unit."""
    from dledger_rocketmq.store.consumequeue import ConsumeQueues
    from dledger_rocketmq.tools.bench_dispatch import make_entries
    entries = make_entries(30, 3, 16)
    d = _dispatcher(tmp_path, drain_after=1024)
    d.entries_committed(entries[:20])
    d.entries_committed(entries[20:29])
    q = d.queues.queue("BenchTopic", 2)
    if trigger == "read":
        q.read(0, 1)
    elif trigger == "get":
        q.get(3)
    else:
        d.entries_committed(entries[27:29])  # entries 27-28 again: compared with the stored units (a read)
    on_disk = ConsumeQueues(tmp_path, file_size=20 * 10)  # what a restart after a crash here would find
    assert [(x.topic, x.queue_id, x.max_offset) for x in on_disk.queues()] == [
        (x.topic, x.queue_id, x.max_offset) for x in d.queues.queues()] != []
    on_disk.close()
    d.close()


def test_a_killed_member_gets_its_buffered_units_back_from_the_log_and_a_new_master_continues(tmp_path):
    """Units still buffered when a member is killed (no stop: they never reach a file) are dispatched again from
    the log at its restart; after the master goes too, the new master's queues hold every unit and its next put
    takes the next queue offset (nothing handed out twice)."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    for i in range(6):
        put(cluster, b, msg(body=b"a%d" % i, queue_id=i % 2))
    assert settled(cluster)
    follower = next(mid for mid, s in cluster.servers.items() if broker_for(s) is not b)
    fb = broker_for(cluster.servers[follower])
    queue_units(fb, "T", 0)  # a consumer's read: every queue's units written
    for i in range(4):
        put(cluster, b, msg(body=b"b%d" % i, queue_id=i % 2))
    assert settled(cluster)
    queues = fb.dispatcher.queues
    assert any(q._pending for q in queues.queues())  # buffered, as a kill would find them
    for q in queues.queues():  # killed: what was buffered never reaches a file (stop then writes nothing)
        q._pending.clear()
    queues._buffered.clear()
    cluster.crash(follower)
    cluster.restart(follower)
    fb = broker_for(cluster.servers[follower])
    want = {qid: queue_units(b, "T", qid) for qid in (0, 1)}
    assert cluster.run_until(lambda: all(queue_units(fb, "T", qid) == want[qid] for qid in (0, 1)), 20)
    assert [len(units) for units in want.values()] == [5, 5]
    cluster.crash(b.server.self_id)
    nb = master(cluster)
    for qid in (0, 1):
        r = put(cluster, nb, msg(body=b"c", queue_id=qid))
        assert r.status is PutStatus.PUT_OK and r.queue_offset == 5, r
        assert cluster.run_until(lambda qid=qid: [o for o, _ in queue_units(nb, "T", qid)] == list(range(6)), 10)
