"""Migration reading: every message of the golden migrated store is served at its recorded physical offset."""

from __future__ import annotations

import shutil

import pytest
from conftest import CQ_FILE_SIZE, FILE_SIZE, MIGRATION, index_rows
from dledger_rocketmq.common.errors import CorruptRecordError, StoreLayoutError, TruncatedRecordError
from dledger_rocketmq.common.message import decode_record
from dledger_rocketmq.store import consumequeue as cq
from dledger_rocketmq.store import migration as mg

PHASE2_INDEX = MIGRATION / "phase2-dledger" / "INDEX.md"
OLD_ROWS = index_rows(PHASE2_INDEX, "### `commitlog/00000000000000000000`")[:-1]  # the last row is the blank
DLEDGER_ROWS = index_rows(PHASE2_INDEX, "### `dledger-n0/data/00000000000000065536`")
#: (physical offset, TOTALSIZE, queue id, queue offset, tags, keys) of all 10 messages of the migration run.
MESSAGES = ([(int(r["PHYSICALOFFSET field"]), int(r["TOTALSIZE"]), int(r["queueId"]), int(r["queueOffset"]),
              r["tags"], r["keys"]) for r in OLD_ROWS]
            + [(int(r["PHYSICALOFFSET (= pos+48?)"].split()[0]), int(r["record TOTALSIZE"]), int(r["q"]),
                int(r["qoffset"]), r["tags"], r["keys"]) for r in DLEDGER_ROWS])


def test_the_index_lists_ten_messages():
    """5 messages before the switch to DLedger and 5 after (guards the tests below)."""
    assert len(MESSAGES) == 10 and [m[4] for m in MESSAGES] == ["TagPlain"] * 5 + ["TagDLedger"] * 5


@pytest.mark.parametrize("offset, divided, expected", [
    (0, 65536, (mg.Log.COMMITLOG, 0, 0)),
    (1048, 65536, (mg.Log.COMMITLOG, 0, 1048)),
    (65535, 65536, (mg.Log.COMMITLOG, 0, 65535)),
    (65536, 65536, (mg.Log.DLEDGER, 65536, 0)),
    (65584, 65536, (mg.Log.DLEDGER, 65536, 48)),
    (131072 + 10, 65536, (mg.Log.DLEDGER, 131072, 10)),
    (70000, 196608, (mg.Log.COMMITLOG, 65536, 4464)),
    (48, 0, (mg.Log.DLEDGER, 0, 48)),  # a pure DLedger store
    (65584, 0, (mg.Log.DLEDGER, 65536, 48)),
])
def test_locate(offset, divided, expected):
    """Below dividedCommitlogOffset: the old files; at or above: the DLedger files, which start there."""
    assert mg.locate(offset, divided, 65536, 65536) == expected


def test_locate_with_unaligned_dledger_start_and_bad_offsets():
    """DLedger files are counted from dividedCommitlogOffset even if it is not a multiple of their size."""
    assert mg.locate(1000 + 250, 1000, 4096, 100) == (mg.Log.DLEDGER, 1200, 50)
    with pytest.raises(ValueError, match="negative physical offset"):
        mg.locate(-1, 0, 10, 10)


@pytest.mark.parametrize("old, first_dledger, expected", [
    ([], None, 0), ([0], None, 65536), ([0, 65536], None, 131072), ([0], 65536, 65536), ([], 0, 0),
    ([0], 131072, 131072),
])
def test_divided_offset(old, first_dledger, expected):
    """First DLedger start: end of the last old file; afterwards: the first DLedger file's start."""
    assert mg.divided_offset(old, 65536, first_dledger) == expected


@pytest.mark.parametrize("offset, size, qid, qoffset, tags, keys", MESSAGES)
def test_every_migrated_message_at_its_offset(phase2_store, offset, size, qid, qoffset, tags, keys):
    """Each of the 10 messages is served at its recorded offset, from the old CommitLog below 65536, else DLedger."""
    reader = mg.StoreReader(phase2_store, commitlog_file_size=FILE_SIZE)
    assert reader.divided_commitlog_offset == 65536
    record = reader.get_record(offset)
    assert (record.physical_offset, record.size, record.queue_id, record.queue_offset, record.tags,
            " ".join(record.keys)) == (offset, size, qid, qoffset, tags, keys)
    assert reader.locate(offset).log is (mg.Log.COMMITLOG if offset < 65536 else mg.Log.DLEDGER)
    assert len(reader.get_message(offset)) == size == len(reader.get_message(offset, size))


def test_records_in_order_and_consume_queues_check(phase2_store):
    """The whole store reads in physical order, and every consume-queue unit (both kinds) checks against it."""
    reader = mg.StoreReader(phase2_store, commitlog_file_size=FILE_SIZE)
    records = list(reader.records())
    assert [r.physical_offset for r in records] == sorted(m[0] for m in MESSAGES)
    assert [i for i, _ in reader.dledger_records()] == [0, 1, 2, 3, 4]
    units = 0
    for qid in range(4):
        queue = cq.ConsumeQueue(phase2_store, "GoldenMigr", qid, file_size=CQ_FILE_SIZE)
        for q, unit in queue.read(0, 10):
            record = reader.get_record(unit.physical_offset)
            assert (record.queue_id, record.queue_offset) == (qid, q) and cq.check_unit(unit, record) == []
            units += 1
    assert units == 10


def test_plain_store_before_migration(phase1_store):
    """Before DLedger, the plain store has no DLedger files; dividedCommitlogOffset would be the old file's end."""
    reader = mg.StoreReader(phase1_store, commitlog_file_size=FILE_SIZE)
    assert reader.dledger_dir is None and reader.divided_commitlog_offset == 65536
    assert [r.physical_offset for r in reader.records()] == [0, 262, 524, 786, 1048]
    assert reader.get_record(1048).queue_offset == 1


def test_first_start_plan_writes_the_golden_blank(phase1_store, phase2_store):
    """The first DLedger start closes the old file exactly as RocketMQ did: a blank of 64226 bytes at 1310."""
    old = (phase1_store / "commitlog" / "00000000000000000000").read_bytes()
    plan = mg.plan_first_start(0, FILE_SIZE, old)
    assert (plan.write_position, plan.divided, len(plan.blank)) == (1310, 65536, 8)
    patched = old[:1310] + plan.blank + old[1310 + len(plan.blank):]
    assert patched == (phase2_store / "commitlog" / "00000000000000000000").read_bytes()
    again = mg.plan_first_start(0, FILE_SIZE, patched)
    assert (again.write_position, again.blank, again.divided) == (1310, b"", 65536)


def test_first_start_plan_for_a_full_or_empty_file():
    """A file with fewer than 8 bytes left needs no blank; an empty file is closed at position 0."""
    assert mg.plan_first_start(65536, 100, bytes(100)).blank == (100).to_bytes(4, "big") + b"\xcb\xd4\x31\x94"
    assert mg.plan_first_start(65536, 100, bytes(100)).divided == 65636


def test_pure_dledger_store(main_store):
    """A store with DLedger data only (the golden group master) serves every record at pos + 48."""
    reader = mg.StoreReader(main_store, commitlog_file_size=FILE_SIZE)
    assert reader.divided_commitlog_offset == 0 and reader.old_files == []
    entries = list(reader.dledger_records())
    assert len(entries) == 177
    assert reader.get_record(107360).topic == "%RETRY%golden_push_cg"
    assert mg.record_physical_offset(65536) == 65584 == reader.get_record(65584).physical_offset


def test_reading_where_no_record_is(phase2_store):
    """Offsets in the blank tail, past the last file, or inside a DLedger header are one-line errors."""
    reader = mg.StoreReader(phase2_store, commitlog_file_size=FILE_SIZE)
    with pytest.raises(CorruptRecordError, match="blank record"):
        reader.get_record(1310)
    with pytest.raises(TruncatedRecordError, match="no dledger file holds physical offset 131072"):
        reader.get_record(131072)
    with pytest.raises(CorruptRecordError, match="bad magic"):
        reader.get_record(65536)
    with pytest.raises(TruncatedRecordError, match="run past the end of its file"):
        reader.get_message(65500, 100)
    assert decode_record(reader.get_message(65902)).queue_offset == 2


def test_bad_store_layouts(phase2_store, tmp_path):
    """A file of the wrong size, a hole between files or two members' directories are refused."""
    store = tmp_path / "s"
    shutil.copytree(phase2_store, store)
    with pytest.raises(StoreLayoutError, match="expected the file size 4096"):
        mg.StoreReader(store, commitlog_file_size=4096)
    (store / "dledger-n1" / "data").mkdir(parents=True)
    with pytest.raises(StoreLayoutError, match="several DLedger members"):
        mg.StoreReader(store, commitlog_file_size=FILE_SIZE)
    assert mg.StoreReader(store, self_id="n0", commitlog_file_size=FILE_SIZE).divided_commitlog_offset == 65536
    shutil.copy(store / "commitlog" / "00000000000000000000", store / "commitlog" / "00000000000000131072")
    with pytest.raises(StoreLayoutError, match="not contiguous"):
        mg.StoreReader(store, self_id="n0", commitlog_file_size=FILE_SIZE)
    (store / "commitlog" / "00000000000000131072").rename(store / "commitlog" / "00000000000000065536")
    with pytest.raises(StoreLayoutError, match="reach past the first DLedger file"):
        mg.StoreReader(store, self_id="n0", commitlog_file_size=FILE_SIZE)


def test_misaligned_old_file_name(phase1_store, tmp_path):
    """An old CommitLog file whose name is not a multiple of the file size is refused."""
    store = tmp_path / "s"
    shutil.copytree(phase1_store, store)
    (store / "commitlog" / "00000000000000000000").rename(store / "commitlog" / "00000000000000000100")
    with pytest.raises(StoreLayoutError, match="not a multiple of the file size 65536"):
        mg.StoreReader(store, commitlog_file_size=FILE_SIZE)
