"""Index records (dledger.store.indexlog) and their repair from the data, shared by recovery and reads."""

import pytest

from dledger.entry import HEADER_SIZE, INDEX_UNIT_SIZE, Entry
from dledger.store.indexlog import RecordVerdict, conflict_line, judge_record, record_ok

GOOD = (1, 4096, 100, 7, 3)  # magic, pos, size, index, term

RECORD_OK = [
    # (rule, record, index, expected)
    ("a_well_formed_record", GOOD, 7, True),
    ("a_noop_entry_record", (2, 0, HEADER_SIZE, 7, 0), 7, True),
    ("record_of_another_index_is_stale", GOOD, 8, False),
    ("zeroed_record_is_missing", (0, 0, 0, 0, 0), 0, False),
    ("unknown_magic_is_torn", (9, 4096, 100, 7, 3), 7, False),
    ("negative_pos_is_torn", (1, -1, 100, 7, 3), 7, False),
    ("size_below_a_header_is_torn", (1, 4096, HEADER_SIZE - 1, 7, 3), 7, False),
    ("negative_term_is_torn", (1, 4096, 100, 7, -1), 7, False),
]


@pytest.mark.parametrize("rule, rec, index, expected", RECORD_OK, ids=[r[0] for r in RECORD_OK])
def test_record_ok(rule, rec, index, expected):
    """A record is believed only if it can be record ``index`` at all; anything else is rebuilt from the data."""
    assert record_ok(rec, index) is expected


ENTRY = Entry(body=bytes(100 - HEADER_SIZE), index=7, term=3, pos=4096, magic=1)

JUDGE = [
    # (rule, record, expected)
    ("record_agrees_with_the_entry", GOOD, RecordVerdict.AGREES),
    ("missing_record_is_rewritten", None, RecordVerdict.REWRITE),
    ("record_elsewhere_is_stale_and_rewritten", (1, 8192, 100, 7, 3), RecordVerdict.REWRITE),
    ("record_of_another_size_is_stale_and_rewritten", (1, 4096, 120, 7, 3), RecordVerdict.REWRITE),
    ("same_place_other_term_is_a_conflict", (1, 4096, 100, 7, 4), RecordVerdict.CONFLICT),
    ("same_place_other_magic_is_a_conflict", (2, 4096, 100, 7, 3), RecordVerdict.CONFLICT),
]


@pytest.mark.parametrize("rule, rec, expected", JUDGE, ids=[r[0] for r in JUDGE])
def test_judge_record(rule, rec, expected):
    """A verified entry's record agrees, is rewritten, or contradicts the entry in place (reported, not repaired)."""
    assert judge_record(rec, ENTRY) is expected


def test_conflict_line_names_both_copies():
    """A conflict is reported with the entry's and the record's term and magic."""
    line = conflict_line((1, 4096, 100, 7, 4), ENTRY)
    assert line == "entry 7 at pos 4096 says term 3 magic 1 but its index record says term 4 magic 1"


def _store(tmp_path, n=40):
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState

    def open_():
        store = MmapLogStore(tmp_path / "m", FakeMemberState(), data_file_size=1024, index_file_size=256)
        store.startup()
        return store
    store = open_()
    entries = store.append_batch_as_leader([Entry(body=b"%03d" % i * 20, term=1) for i in range(n)])
    store.abandon()  # reopened: reads go to the files (a running store holds the entries it just wrote)
    return open_(), entries


def _record_file(store, index):
    off = index * INDEX_UNIT_SIZE
    path = next(p for p in store.index_files if int(p.name) <= off < int(p.name) + 256)
    return path, off - int(path.name)


def _overwrite_record(store, index, rec):
    """Damage a record through the file (the store's shared mapping sees it)."""
    from dledger.entry import INDEX_RECORD
    path, rel = _record_file(store, index)
    with open(path, "r+b") as fh:
        fh.seek(rel)
        fh.write(INDEX_RECORD.pack(*rec))


def _read_record(store, index):
    from dledger.entry import INDEX_RECORD
    path, rel = _record_file(store, index)
    return INDEX_RECORD.unpack(path.read_bytes()[rel:rel + INDEX_UNIT_SIZE])


def test_a_read_repairs_a_torn_record_by_the_rule_recovery_uses(tmp_path):
    """A record with a negative term (torn by recovery's rule) is rebuilt from the data on read, not an error."""
    store, entries = _store(tmp_path)
    e = entries[21]
    _overwrite_record(store, 21, (e.magic, e.pos, e.size, e.index, -1))
    assert store.get(21) == e
    assert _read_record(store, 21) == (e.magic, e.pos, e.size, e.index, e.term)
    store.abandon()


def test_a_read_reports_a_record_contradicting_its_entry(tmp_path):
    """A valid record at the entry's place but with another term is damage a read reports (DISK_ERROR)."""
    from dledger.codes import ResponseCode
    from dledger.testing.store_contract import expect_code

    store, entries = _store(tmp_path)
    e = entries[21]
    _overwrite_record(store, 21, (e.magic, e.pos, e.size, e.index, e.term + 1))
    expect_code(ResponseCode.DISK_ERROR, store.get, 21)
    store.abandon()
