"""Consume queues: the golden units check against their records, rebuilds match the golden files byte for byte,
and a ConsumeQueue over files appends, reads, truncates and reopens."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest
from conftest import CQ_FILE_SIZE, FILE_SIZE, STORE, index_rows
from dledger_rocketmq.common.errors import CodecError, CorruptRecordError, StoreLayoutError
from dledger_rocketmq.common.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_ROLLBACK_TYPE, MessageRecord
from dledger_rocketmq.store import consumequeue as cq
from dledger_rocketmq.store.migration import StoreReader
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.testing.handio import HandIO


def golden_queue_files(root: Path) -> dict[tuple[str, int], list[Path]]:
    out: dict[tuple[str, int], list[Path]] = {}
    base = root / "consumequeue"
    for topic in sorted(os.listdir(base)):
        for qid in sorted(os.listdir(base / topic)):
            out[(topic, int(qid))] = sorted((base / topic / qid).iterdir())
    return out


@pytest.mark.parametrize("text, expected", [
    ("TagA", 2598919), ("TagB", 2598920), ("TagBig", -1797401818), ("TagV1", 80567189),
    ("TagRmqSer", -578139388), ("golden_pull_cg", 1221190504), ("TagPlain", -713277840),
    ("TagDLedger", -1237937645), ("", 0), ("a", 97), ("\u00e9", 233), ("\U0001F600", 1772899),
])
def test_java_string_hash(text, expected):
    """Java's String.hashCode over UTF-16 units as an int32 (golden tag codes, non-ASCII, a surrogate pair)."""
    assert cq.java_string_hash(text) == expected


def test_tag_hash_without_tags_is_zero():
    """A message without TAGS (or with an empty one) has tagsCode 0."""
    assert cq.tag_hash(None) == cq.tag_hash("") == 0


@pytest.mark.parametrize("level, store, expected", [(1, 1000, 2000), (2, 0, 5000), (3, 0, 10000),
                                                    (18, 0, 7_200_000), (19, 0, 7_200_000), (99, 5, 7_200_005)])
def test_deliver_timestamp(level, store, expected):
    """Delay levels 1s 5s 10s ... 2h; a level above the last counts as the last."""
    assert cq.deliver_timestamp(level, store) == expected


def test_parse_delay_levels():
    """messageDelayLevel syntax: 18 default levels; bad words are a one-line error."""
    assert len(cq.DELAY_LEVELS_MS) == 18 and cq.DELAY_LEVELS_MS[4] == 60_000
    assert cq.parse_delay_levels("1s 2d") == (1000, 172_800_000)
    with pytest.raises(ValueError, match="bad level '5x'"):
        cq.parse_delay_levels("1s 5x")
    with pytest.raises(ValueError, match="no levels"):
        cq.parse_delay_levels(" ")


def test_schedule_topic_unit_is_the_delivery_time():
    """In SCHEDULE_TOPIC_XXXX the third field is store time + delay; DELAY elsewhere does not matter."""
    props = b"DELAY\x012\x02TAGS\x01TagA"
    delayed = MessageRecord(cq.SCHEDULE_TOPIC, b"", props, store_timestamp=1_000)
    assert cq.tags_code(delayed) == 6_000
    assert cq.tags_code(MessageRecord("OFFSET_MOVED_EVENT", b"", props)) == 2598919
    assert cq.tags_code(MessageRecord(cq.SCHEDULE_TOPIC, b"", b"DELAY\x01x\x02TAGS\x01TagA")) == 2598919


@pytest.mark.parametrize("sys_flag, dispatched", [(0, True), (0x8, True), (TRANSACTION_PREPARED_TYPE, False),
                                                  (TRANSACTION_ROLLBACK_TYPE, False), (0x301, True)])
def test_is_dispatched(sys_flag, dispatched):
    """Prepared and rolled-back transaction messages get no consume-queue unit."""
    assert cq.is_dispatched(MessageRecord("T", b"", sys_flag=sys_flag)) is dispatched


# -- the golden store ---------------------------------------------------------------------------------------

def test_every_golden_unit_checks_against_its_record(main_store):
    """Each of the 177 golden units points at a record of its queue and offset, with its size and tags code."""
    reader = StoreReader(main_store, commitlog_file_size=FILE_SIZE)
    seen = 0
    for (topic, qid), files in golden_queue_files(main_store).items():
        queue = cq.ConsumeQueue(main_store, topic, qid, file_size=CQ_FILE_SIZE)
        assert queue.files == files and queue.min_offset == 0
        for q, unit in queue.read(0, 1000):
            record = reader.get_record(unit.physical_offset)
            assert (record.topic, record.queue_id, record.queue_offset) == (topic, qid, q)
            assert cq.check_unit(unit, record) == []
            seen += 1
        assert queue.max_offset == q + 1
    assert seen == 177


def test_golden_units_match_index_md(main_store):
    """The units read back are the ones INDEX.md lists (GoldenTopic queue 2, with the TagBig/TagRmqSer codes)."""
    rows = index_rows(STORE / "INDEX.md", "### `consumequeue/GoldenTopic/2/")
    queue = cq.ConsumeQueue(main_store, "GoldenTopic", 2, file_size=CQ_FILE_SIZE)
    assert [(q, tuple(u)) for q, u in queue.read(0, 100)] == [
        (int(r["queue offset"]), (int(r["commitLogOffset"]), int(r["size"]), int(r["tagsCode"]))) for r in rows]


def test_rebuild_from_the_log_gives_the_golden_files(main_store, tmp_path):
    """Rebuilding every queue from the CommitLog writes files byte-identical to RocketMQ's (names included)."""
    reader = StoreReader(main_store, commitlog_file_size=FILE_SIZE)
    records = list(reader.records())
    for (topic, qid), files in golden_queue_files(main_store).items():
        queue = cq.ConsumeQueue(tmp_path, topic, qid, file_size=CQ_FILE_SIZE)
        written = cq.rebuild(queue, records)
        assert written == queue.max_offset
        assert [p.name for p in queue.files] == [p.name for p in files]
        for mine, golden in zip(queue.files, files, strict=True):
            assert mine.read_bytes() == golden.read_bytes(), mine


def test_changing_the_tags_code_is_caught(main_store):
    """check_unit names the field that disagrees with the record."""
    reader = StoreReader(main_store, commitlog_file_size=FILE_SIZE)
    unit = cq.ConsumeQueue(main_store, "GoldenTopic", 1, file_size=CQ_FILE_SIZE).get(1)
    record = reader.get_record(unit.physical_offset)
    assert cq.check_unit(unit._replace(tags_code=1), record) == ["tags_code 1 != -1797401818"]
    assert cq.check_unit(unit._replace(size=5), record) == ["size 5 != 511"]


# -- pure placement decisions -------------------------------------------------------------------------------

@pytest.mark.parametrize("next_offset, q, empty, expected", [
    (0, 0, True, cq.Placement.APPEND), (5, 5, False, cq.Placement.APPEND), (5, 9, True, cq.Placement.APPEND),
    (5, 3, False, cq.Placement.REPEAT), (5, 6, False, cq.Placement.GAP),
])
def test_place(next_offset, q, empty, expected):
    """A unit appends at the next offset (anywhere on an empty queue), repeats below it, leaves a gap above."""
    assert cq.place(next_offset, q, empty) is expected


@pytest.mark.parametrize("q, size, expected", [(0, 1000, (0, 0)), (49, 1000, (0, 980)), (50, 1000, (1000, 0)),
                                               (151, 1000, (3000, 20)), (7, 6_000_000, (0, 140))])
def test_locate_unit(q, size, expected):
    """A unit's file is named by the byte offset of its first unit; positions are q * 20 within it."""
    assert cq.locate_unit(q, size) == expected


def test_file_names_and_sizes():
    """20-digit names; file sizes round up to whole units as RocketMQ does."""
    assert cq.file_name(2000) == "00000000000000002000"
    assert cq.file_size_for(1000) == 1000 and cq.file_size_for(1001) == 1020
    with pytest.raises(ValueError, match="smaller than one unit"):
        cq.file_size_for(10)
    with pytest.raises(ValueError, match="cannot name a directory"):
        cq.queue_dir("/x", "a/b", 0)


def test_unit_codec():
    """Units are 20 big-endian bytes; out-of-range values and negative fields are refused."""
    unit = cq.Unit(48, 249, -5)
    assert cq.decode_unit(cq.encode_unit(unit)) == unit and len(cq.encode_unit(unit)) == 20
    with pytest.raises(CodecError, match="does not fit"):
        cq.encode_unit(cq.Unit(0, 2**31, 0))
    assert cq.decode_units(cq.encode_unit(unit) + bytes(40)) == [unit]
    with pytest.raises(CorruptRecordError, match="negative field"):
        cq.decode_units(cq.encode_unit(cq.Unit(-1, 5, 0)))


# -- ConsumeQueue over files --------------------------------------------------------------------------------

def unit(q: int) -> cq.Unit:
    return cq.Unit(1000 + 100 * q, 100, q)


def filled(tmp_path: Path, n: int, start: int = 0) -> cq.ConsumeQueue:
    queue = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)  # 5 units per file
    for q in range(start, start + n):
        assert queue.append(q, unit(q)) is True
    return queue


def test_append_and_read_across_files(tmp_path):
    """Units append in order across pre-allocated files and read back from any offset."""
    queue = filled(tmp_path, 12)
    assert [p.name for p in queue.files] == [cq.file_name(s) for s in (0, 100, 200)]
    assert all(p.stat().st_size == 100 for p in queue.files)
    assert queue.read(3, 5) == [(q, unit(q)) for q in range(3, 8)]
    assert queue.get(11) == unit(11) and queue.get(12) is None and queue.get(-1) is None
    assert (queue.min_offset, queue.max_offset, queue.max_physical_offset) == (0, 12, 1000 + 1100 + 100)
    queue.flush()


def test_reopen_recovers_the_queue(tmp_path):
    """A queue reopened from its files has the same offsets and units."""
    filled(tmp_path, 7).flush()
    again = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    assert (again.min_offset, again.max_offset, again.max_physical_offset) == (0, 7, 1700)
    assert again.read(0, 10) == [(q, unit(q)) for q in range(7)]
    assert again.append(7, unit(7))


def test_replay_is_idempotent_but_a_different_unit_is_an_error(tmp_path):
    """Dispatching a unit again (after a restart) is a no-op; a different unit or a gap is refused."""
    queue = filled(tmp_path, 3)
    assert queue.append(1, unit(1)) is False
    with pytest.raises(CodecError, match="queue offset 1 holds"):
        queue.append(1, unit(2))
    with pytest.raises(CodecError, match="queue ends at 3 \\(units missing\\)"):
        queue.append(5, unit(5))
    with pytest.raises(CodecError, match="below the queue's last record end"):
        queue.append(3, cq.Unit(0, 10, 0))
    with pytest.raises(CodecError, match="invalid unit"):
        queue.append(3, cq.Unit(5000, 0, 0))
    assert queue.max_offset == 3


def test_queue_starting_past_zero_gets_filler_units(tmp_path):
    """An empty queue whose first unit is at offset 7 fills 7 - 5 = 2 filler units in file 100, as RocketMQ."""
    queue = filled(tmp_path, 3, start=7)
    assert [p.name for p in queue.files] == [cq.file_name(100)]
    raw = queue.files[0].read_bytes()
    assert cq.decode_units(raw)[:2] == [cq.FILLER, cq.FILLER]
    assert (queue.min_offset, queue.max_offset) == (7, 10)
    again = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    assert (again.min_offset, again.max_offset) == (7, 10) and again.get(6) is None and again.get(7) == unit(7)
    assert again.append(5, unit(5)) is False  # below the retained range: nothing to do


def test_truncate_physical_drops_units_beyond_the_log_end(tmp_path):
    """Units whose record is not wholly below the committed end go; emptied files are deleted; reopen agrees."""
    queue = filled(tmp_path, 12)
    assert queue.truncate_physical(1000 + 100 * 6 + 50) == 6  # unit 6 ends at 1700 > 1650
    assert (queue.max_offset, queue.max_physical_offset) == (6, 1600)
    assert [p.name for p in queue.files] == [cq.file_name(0), cq.file_name(100)]
    assert queue.truncate_physical(10**9) == 0
    again = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    assert again.max_offset == 6 and again.get(5) == unit(5)
    assert again.append(6, unit(6))


def test_truncate_at_a_file_boundary_and_to_empty(tmp_path):
    """Truncating to a file's first unit deletes that file; truncating everything leaves an empty queue."""
    queue = filled(tmp_path, 10)
    assert queue.truncate_to(5) == 5 and len(queue.files) == 1
    assert queue.truncate_physical(0) == 5
    assert queue.empty and queue.files == [] and queue.max_physical_offset == 0
    assert queue.append(0, unit(0))


def test_rebuild_replaces_a_damaged_queue(tmp_path):
    """rebuild() drops what is there and writes the units of this queue's records only, in log order."""
    queue = filled(tmp_path, 4)
    records = [MessageRecord("T", b"x", queue_id=qid, queue_offset=qo, physical_offset=po)
               for qid, qo, po in [(0, 0, 10), (1, 0, 200), (0, 1, 400), (0, 2, 600)]]
    records.append(MessageRecord("T", b"x", queue_id=0, queue_offset=3, physical_offset=800,
                                 sys_flag=TRANSACTION_PREPARED_TYPE))
    assert cq.rebuild(queue, records) == 3
    assert [u.physical_offset for _, u in queue.read(0, 10)] == [10, 400, 600]


def test_bad_layouts_are_refused(tmp_path):
    """Misnamed or non-contiguous files, a short middle file and a wrong file size are one-line errors."""
    d = cq.queue_dir(tmp_path, "T", 0)
    d.mkdir(parents=True)
    (d / "00000000000000000050").write_bytes(bytes(100))
    with pytest.raises(StoreLayoutError, match="not a consume-queue file name"):
        cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    (d / "00000000000000000050").unlink()
    (d / "00000000000000000000").write_bytes(bytes(100))
    (d / "00000000000000000200").write_bytes(bytes(100))
    with pytest.raises(StoreLayoutError, match="not contiguous"):
        cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    (d / "00000000000000000200").rename(d / "00000000000000000100")
    with pytest.raises(StoreLayoutError, match="in the middle of the queue is not full"):
        cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    with pytest.raises(ValueError, match="not a multiple of 20"):
        cq.ConsumeQueue(tmp_path, "T", 0, file_size=110)


_ops = st.lists(st.one_of(st.tuples(st.just("append"), st.integers(1, 12)),
                          st.tuples(st.just("truncate"), st.integers(0, 40)),
                          st.tuples(st.just("reopen"), st.just(0))), max_size=12)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 12), _ops)
def test_consume_queue_matches_a_list_model(start, ops):
    """Any mix of appends, truncations and reopenings leaves the files holding exactly the model's units."""
    with tempfile.TemporaryDirectory() as root:
        queue = cq.ConsumeQueue(root, "T", 3, file_size=60)  # 3 units per file
        model: list[cq.Unit] = []  # units from queue offset `start` on
        first = start
        for op, arg in ops:
            if op == "append":
                for _ in range(arg):
                    q = first + len(model)
                    u = unit(q)
                    assert queue.append(q, u)
                    model.append(u)
            elif op == "truncate":
                end = 1000 + 100 * arg
                keep = [u for u in model if u.physical_offset + u.size <= end]
                assert queue.truncate_physical(end) == len(model) - len(keep)
                model = keep
            else:
                queue = cq.ConsumeQueue(root, "T", 3, file_size=60)
            if model:
                assert (queue.min_offset, queue.max_offset) == (first, first + len(model))
                assert [u for _, u in queue.read(0, 1000)] == model
                assert queue.max_physical_offset == model[-1].physical_offset + model[-1].size
            else:
                assert queue.empty and queue.read(0, 10) == [] and queue.max_physical_offset == 0
                first = queue.max_offset


def test_consume_queues_of_the_golden_store(main_store):
    """All 13 golden queues open; the topic-queue table gives each queue's next offset; dispatch resumes after."""
    queues = cq.ConsumeQueues(main_store, file_size=CQ_FILE_SIZE)
    table = queues.topic_queue_table()
    assert len(queues.queues()) == 13 and sum(table.values()) == 177
    assert table["GoldenTopic-2"] == 8 and table["GoldenBulk-0"] == 150 and table["SCHEDULE_TOPIC_XXXX-1"] == 1
    assert queues.max_physical_offset() == 107360 + 413


def test_dispatching_the_golden_log_rebuilds_every_queue(main_store, tmp_path):
    """Dispatching every record in log order writes all queues as RocketMQ did; a replay adds nothing."""
    records = list(StoreReader(main_store, commitlog_file_size=FILE_SIZE).records())
    queues = cq.ConsumeQueues(tmp_path, file_size=CQ_FILE_SIZE)
    assert sum(queues.dispatch(r) for r in records) == 177
    assert sum(queues.dispatch(r) for r in records) == 0
    queues.flush()
    golden = golden_queue_files(main_store)
    for (topic, qid), files in golden.items():
        mine = queues.queue(topic, qid).files
        assert [p.read_bytes() for p in mine] == [p.read_bytes() for p in files]
    reopened = cq.ConsumeQueues(tmp_path, file_size=CQ_FILE_SIZE)
    assert reopened.topic_queue_table() == cq.ConsumeQueues(main_store, file_size=CQ_FILE_SIZE).topic_queue_table()
    assert reopened.truncate_physical(65536) == 177 - 110
    assert reopened.max_physical_offset() <= 65536
    assert reopened.topic_queue_table()["GoldenBulk-0"] == 90
    assert not cq.ConsumeQueues(tmp_path, file_size=CQ_FILE_SIZE).dispatch(
        MessageRecord("T", b"", sys_flag=TRANSACTION_PREPARED_TYPE))


def test_consume_queues_refuse_a_bad_queue_directory(tmp_path):
    """A queue directory whose name is not a queue id is a one-line layout error; stray files are ignored."""
    (tmp_path / "consumequeue").mkdir()
    (tmp_path / "consumequeue" / "stray.txt").write_text("x")
    assert cq.ConsumeQueues(tmp_path).queues() == []
    (tmp_path / "consumequeue" / "T" / "x1").mkdir(parents=True)
    with pytest.raises(StoreLayoutError, match="not a queue id"):
        cq.ConsumeQueues(tmp_path)


# -- open files and batched writes (issue #10: cheap dispatch) -------------------------------------------

def test_appends_reuse_one_open_file_instead_of_opening_it_per_unit(tmp_path, monkeypatch):
    """100 units into one file open that file once (each unit used to be its own open + pwrite + close)."""
    opened = []
    real_open = os.open
    monkeypatch.setattr(os, "open", lambda path, *a, **k: (opened.append(str(path)), real_open(path, *a, **k))[1])
    queue = cq.ConsumeQueue(tmp_path, "T", 0, file_size=20 * 200)
    for q in range(100):
        queue.append(q, unit(q))
    monkeypatch.setattr(os, "open", real_open)
    assert opened.count(str(queue.files[0])) == 1, opened
    assert queue.read(0, 200) == [(q, unit(q)) for q in range(100)]
    queue.close()


@pytest.mark.parametrize("steps, expect", [
    # (queue, queue offset) appends into ConsumeQueues holding at most 2 open files; then every queue reads back
    ([("a", 0), ("b", 0), ("c", 0), ("a", 1)], {"a": 2, "b": 1, "c": 1}),  # a evicted by c, then appended again
    ([("a", 0), ("a", 1), ("b", 0), ("c", 0), ("b", 1), ("a", 2), ("c", 1)], {"a": 3, "b": 2, "c": 2}),
    ([("a", q) for q in range(7)] + [("b", 0), ("c", 0), ("a", 7)], {"a": 8, "b": 1, "c": 1}),  # across files
])
def test_a_unit_appended_after_its_file_was_evicted_lands_in_place(tmp_path, steps, expect):
    """The LRU of open files stays bounded; an evicted queue's next unit goes to the right file and position."""
    queues = cq.ConsumeQueues(tmp_path, file_size=60, max_open_files=2)  # 3 units per file
    for name, q in steps:
        queues.queue(name, 0).append(q, unit(q))
        assert len(queues.fds) <= 2
    queues.flush()
    queues.close()
    assert len(queues.fds) == 0
    again = cq.ConsumeQueues(tmp_path, file_size=60)
    for name, count in expect.items():
        assert again.queue(name, 0).read(0, 100) == [(q, unit(q)) for q in range(count)]
    again.close()


_multi_ops = st.lists(st.tuples(st.sampled_from("abcd"),
                                st.sampled_from(["append", "defer", "drain", "truncate", "flush", "reopen"]),
                                st.integers(1, 5)), max_size=25)


@settings(max_examples=80, deadline=None)
@given(_multi_ops)
def test_consume_queues_with_few_open_files_match_a_model(ops):
    """Appends (direct and deferred), drains, truncations, flushes and reopenings over 4 queues sharing 2 open
    files leave every queue, read live and reopened from its files, holding exactly the model's units."""
    with tempfile.TemporaryDirectory() as root:
        queues = cq.ConsumeQueues(root, file_size=60, max_open_files=2)
        model: dict[str, list[cq.Unit]] = {name: [] for name in "abcd"}
        for name, op, n in ops:
            queue = queues.queue(name, 0)
            if op in ("append", "defer"):
                for _ in range(n):
                    q = len(model[name])
                    assert queue.append(q, unit(q), defer=op == "defer")
                    model[name].append(unit(q))
            elif op == "drain":
                queues.drain()
            elif op == "truncate":
                keep = max(len(model[name]) - n, 0)
                assert queue.truncate_to(keep) == len(model[name]) - keep
                model[name] = model[name][:keep]
            elif op == "flush":
                queues.flush()
                assert all(not q.dirty for q in queues.queues())
            else:
                queues.close()
                queues = cq.ConsumeQueues(root, file_size=60, max_open_files=2)
            assert len(queues.fds) <= 2
            assert queue.max_offset == len(model[name])
        for name, units in model.items():
            assert [u for _, u in queues.queue(name, 0).read(0, 100)] == units
        queues.close()
        reopened = cq.ConsumeQueues(root, file_size=60)
        for name, units in model.items():
            assert [u for _, u in reopened.queue(name, 0).read(0, 100)] == units
        reopened.close()


def test_deferred_units_are_one_pwrite_per_file(tmp_path, monkeypatch):
    """Deferred appends are written at drain: one pwrite per file they span, none before."""
    writes = []
    real = cq.write_at
    monkeypatch.setattr(cq, "write_at", lambda fd, data, off: (writes.append((len(data), off)), real(fd, data, off)))
    queue = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)  # 5 units per file
    for q in range(8):
        queue.append(q, unit(q), defer=True)
    assert writes == [] and queue.pending == 8
    queue.drain()
    assert writes == [(100, 0), (60, 0)] and queue.pending == 0
    assert cq.ConsumeQueue(tmp_path, "T", 0, file_size=100).read(0, 10) == [(q, unit(q)) for q in range(8)]


def test_reads_and_truncation_see_deferred_units(tmp_path):
    """A deferred unit reads back at once, and truncating below it removes it rather than resurrecting it."""
    queue = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    for q in range(4):
        queue.append(q, unit(q), defer=True)
    assert queue.get(3) == unit(3) and queue.pending == 0
    queue.append(4, unit(4), defer=True)
    assert queue.truncate_to(2) == 3 and queue.pending == 0
    queue.drain()
    assert cq.ConsumeQueue(tmp_path, "T", 0, file_size=100).read(0, 10) == [(0, unit(0)), (1, unit(1))]


def drain_failing(queue, monkeypatch):
    """Drain ``queue`` with every write failing for lack of space (the OSError is expected)."""
    def fail(fd, data, off):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(cq, "write_at", fail)
    with pytest.raises(OSError, match="No space"):
        queue.drain()
    monkeypatch.undo()


def test_a_failed_drain_leaves_the_queue_as_before_the_batch(tmp_path, monkeypatch):
    """If the batch's write fails, the queue ends where it ended before the batch, so the batch can come again."""
    queue = filled(tmp_path, 2)
    for q in (2, 3):
        queue.append(q, unit(q), defer=True)
    drain_failing(queue, monkeypatch)
    assert (queue.max_offset, queue.max_physical_offset, queue.pending) == (2, 1200, 0)
    assert queue.append(2, unit(2)) and queue.append(3, unit(3))
    assert queue.read(0, 10) == [(q, unit(q)) for q in range(4)]


def test_the_first_unit_of_a_delivery_taken_inline_is_buffered_as_append_buffers_it(tmp_path, monkeypatch):
    """append_next's inline path also takes a delivery's first unit for a queue (nothing buffered yet): the
    queue is marked buffered once (so ConsumeQueues.drain writes it), and a failed drain restores the queue as
    it was before that unit, exactly as after append(defer=True)."""
    marks = []
    for how in ("append_next", "append"):
        queue = filled(tmp_path / how, 2)
        queue._on_change = lambda q, buffered, how=how: marks.append((how, buffered))
        for q in (2, 3):
            if how == "append_next":
                assert queue.append_next(q, *unit(q)) is True
            else:
                assert queue.append(q, unit(q), defer=True) is True
        assert queue.pending == 2 and queue.get(3) == unit(3) and queue.pending == 0  # the read drained them
        queue.append_next(4, *unit(4)) if how == "append_next" else queue.append(4, unit(4), defer=True)
        drain_failing(queue, monkeypatch)
        assert (queue.max_offset, queue.max_physical_offset, queue.pending) == (4, 1400, 0)
    flags = {how: [b for h, b in marks if h == how] for how in ("append_next", "append")}
    assert flags["append_next"] == flags["append"] and flags["append"].count(True) == 2  # once per buffered run


def test_append_next_leaves_an_empty_queue_and_misplaced_units_to_append(tmp_path):
    """An empty queue (it may start anywhere) and a unit that is not the next one take append and its checks."""
    queue = cq.ConsumeQueue(tmp_path, "T", 0, file_size=100)
    assert queue.append_next(7, *unit(7)) is True and queue.min_offset == 7  # an empty queue starts at the unit
    with pytest.raises(CodecError, match="units missing"):
        queue.append_next(9, *unit(9))
    with pytest.raises(CodecError, match="below"):
        queue.append_next(8, 1000, 100, 0)  # a physical offset behind the queue's last record


def test_truncation_closes_the_fds_of_deleted_files(tmp_path):
    """Files deleted by a truncation lose their cached fd; appends after it recreate them in place."""
    queue = filled(tmp_path, 12)  # files 0, 100, 200
    deleted = queue.files[1:]
    assert deleted[1] in queue._fds
    assert queue.truncate_to(5) == 7
    assert all(p not in queue._fds and not p.exists() for p in deleted)
    for q in range(5, 9):
        assert queue.append(q, unit(q))
    queue.close()
    assert cq.ConsumeQueue(tmp_path, "T", 0, file_size=100).read(0, 20) == [(q, unit(q)) for q in range(9)]


def test_flush_syncs_only_what_changed_since(tmp_path, monkeypatch):
    """A flush fsyncs the files written since the last one, and the directory only when files came or went."""
    queues = cq.ConsumeQueues(tmp_path, file_size=100)
    a, b = queues.queue("A", 0), queues.queue("B", 0)
    a.append(0, unit(0))
    b.append(0, unit(0))
    queues.flush()
    synced, dirs = [], []
    monkeypatch.setattr(cq, "fsync_fd", synced.append)
    monkeypatch.setattr(cq, "fsync_dir", dirs.append)
    a.append(1, unit(1))
    queues.flush()
    assert len(synced) == 1 and dirs == []
    queues.flush()
    assert len(synced) == 1 and dirs == []
    for q in range(2, 6):  # reaches a second file
        a.append(q, unit(q))
    queues.flush()
    assert len(synced) == 3 and dirs == [a.dir]
    queues.close()


def test_a_flush_off_the_reactor_syncs_duplicates_while_the_queue_goes_on(tmp_path, monkeypatch):
    """flush_with takes the files to sync at once (fds duplicated); the queue keeps writing and evicting meanwhile."""
    queues = cq.ConsumeQueues(tmp_path, file_size=100, max_open_files=1)
    a = queues.queue("A", 0)
    a.append(0, unit(0))
    synced = []
    monkeypatch.setattr(cq, "fsync_fd", lambda fd: synced.append(os.fstat(fd).st_ino))
    io = HandIO()
    done = []
    queues.flush_with(io).addCallback(done.append)
    assert len(io.calls) == 1 and synced == [] and not done  # nothing synced on this thread
    queues.queue("B", 0).append(0, unit(0))  # evicts A's cached fd (one open file): the job's dup stays valid
    assert len(queues.fds) == 1
    io.step()
    assert done == [None] and synced == [os.stat(a._path(0)).st_ino]
    queues.flush()  # B is still unflushed: the next flush syncs it
    assert len(synced) == 2
    queues.close()


def test_a_failed_flush_off_the_reactor_counts_as_unflushed(tmp_path, monkeypatch):
    """If the pool thread's fsync fails, the flush errbacks and the next flush syncs the same files again."""
    queues = cq.ConsumeQueues(tmp_path, file_size=100)
    queues.queue("A", 0).append(0, unit(0))
    io = HandIO()

    def broken(fd):
        raise OSError(5, "Input/output error")
    monkeypatch.setattr(cq, "fsync_fd", broken)
    failures = []
    open_before = len(os.listdir("/proc/self/fd"))
    queues.flush_with(io).addErrback(failures.append)
    assert len(os.listdir("/proc/self/fd")) == open_before + 1  # the job's duplicate of the cached fd
    io.step()
    assert len(failures) == 1 and failures[0].check(OSError)
    assert len(os.listdir("/proc/self/fd")) == open_before  # closed although the sync failed
    synced = []
    monkeypatch.setattr(cq, "fsync_fd", synced.append)
    queues.flush()
    assert len(synced) == 1
    queues.close()
