"""Consumer and delay offset tables (dledger_rocketmq.store.offsets) and RocketMQ's JSON dialect (fastjson)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from conftest import GOLDEN, STORE
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import OffsetCommit, decode_control, encode_offset_commits
from dledger_rocketmq.store.offsets import ConsumerOffsetTable, DelayOffsetTable
from hypothesis import given
from hypothesis import strategies as st

CONFIG = STORE / "config"
FRAMES = GOLDEN / "frames"


def frame_body(path: Path) -> bytes:
    """The body of a recorded remoting frame (after the header)."""
    data = path.read_bytes()
    total, word = struct.unpack_from(">ii", data)
    return data[8 + (word & 0xFFFFFF):4 + total]


# -- fastjson ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, value", [
    ('{"offsetTable":{0:2,1:-1}}', {"offsetTable": {"0": 2, "1": -1}}),
    ('{\n\t"a":{-3 :1\n\t}\n}', {"a": {"-3": 1}}),
    ('{"k":"{0:1,2:3}"}', {"k": "{0:1,2:3}"}),
    ('{"k":"a\\"{1:2}"}', {"k": 'a"{1:2}'}),
    ('[1,{2:3}]', [1, {"2": 3}]),
])
def test_loads_quotes_bare_integer_keys_only(text, value):
    """Unquoted integer keys parse; digits inside strings or in values are untouched."""
    assert fastjson.loads(text) == value


@pytest.mark.parametrize("text, message", [
    ("{", "not JSON"),
    ('{"a":1,}', "not JSON"),
    (b"\xff", "not UTF-8"),
])
def test_loads_errors_are_one_line(text, message):
    """Malformed text raises ValueError with a one-line reason."""
    with pytest.raises(ValueError, match=message) as info:
        fastjson.loads(text)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("value, compact, pretty", [
    ({"offsetTable": {}}, '{"offsetTable":{}}', '{\n\t"offsetTable":{}\n}'),
    ({"offsetTable": {1: 1, 2: 1}}, '{"offsetTable":{1:1,2:1}}', '{\n\t"offsetTable":{1:1,2:1\n\t}\n}'),
    ({"b": True, "s": "é"}, '{"b":true,"s":"é"}', '{\n\t"b":true,\n\t"s":"é"\n}'),
])
def test_dumps_table(value, compact, pretty):
    """Compact and pretty forms: tabs, newline before string keys only, int keys unquoted."""
    assert fastjson.dumps(value) == compact
    assert fastjson.dumps(value, pretty=True) == pretty


@pytest.mark.parametrize("capacity, count, concurrent, size", [
    (1024, 0, True, 2048), (512, 5, True, 1024), (32, 3, True, 64), (32, 48, True, 128),
    (16, 12, False, 16), (16, 13, False, 32), (0, 0, True, 1),
])
def test_table_size(capacity, count, concurrent, size):
    """Java table sizes: CHM(c) starts at tableSizeFor(1.5c+1) and grows at 3/4; HashMap grows above 3/4."""
    assert fastjson.table_size(capacity, count, concurrent=concurrent) == size


def test_java_map_order_matches_golden_files():
    """topics.json and subscriptionGroup.json keys are in ConcurrentHashMap(1024) order, offsets in (512)."""
    for name, capacity in (("topics.json", 1024), ("subscriptionGroup.json", 1024), ("consumerOffset.json", 512)):
        table = next(v for k, v in fastjson.loads((CONFIG / name).read_text()).items() if k != "dataVersion")
        keys = list(table)
        assert fastjson.java_map_order(sorted(keys), capacity) == keys, name


# -- ConsumerOffsetTable ----------------------------------------------------------------------------------

def test_query_unknown_is_minus_one():
    """An offset never committed reads as -1."""
    table = ConsumerOffsetTable()
    table.apply([OffsetCommit("g", "T", 0, 5)])
    assert table.query("g", "T", 0) == 5
    assert table.query("g", "T", 1) == -1 and table.query("h", "T", 0) == -1


@pytest.mark.parametrize("offsets, reset, final", [
    ([5, 7], False, 7),
    ([7, 5], False, 7),  # apache/rocketmq#1094: a late commit does not move it back
    ([7, 5], True, 5),  # an explicit reset does
    ([3, 3], False, 3),
    ([-1, 0], False, 0),
])
def test_never_backwards_unless_reset(offsets, reset, final):
    """apply keeps the highest offset; reset=True sets the given one."""
    table = ConsumerOffsetTable()
    table.apply([OffsetCommit("g", "T", 0, offsets[0])])
    table.apply([OffsetCommit("g", "T", 0, offsets[1])], reset=reset)
    assert table.query("g", "T", 0) == final


def test_version_moves_only_on_change():
    """version counts changes, so persisting can skip an unchanged table."""
    table = ConsumerOffsetTable()
    assert table.apply([OffsetCommit("g", "T", 0, 5)]) == 1 and table.version == 1
    assert table.apply([OffsetCommit("g", "T", 0, 4)]) == 0 and table.version == 1


def test_apply_entry_once_per_index():
    """A control entry replayed at or below applied_index is skipped: a replayed reset cannot undo later commits."""
    table = ConsumerOffsetTable()
    reset = decode_control(encode_offset_commits([OffsetCommit("g", "T", 0, 2)], reset=True))
    commit = decode_control(encode_offset_commits([OffsetCommit("g", "T", 0, 9)]))
    table.apply_entry(10, reset)
    table.apply_entry(11, commit)
    assert table.apply_entry(10, reset) == 0
    assert table.query("g", "T", 0) == 9 and table.applied_index == 11


def test_every_member_applying_the_log_agrees():
    """Members applying the same control entries in log order end with the same table (the failover point)."""
    entries = [decode_control(encode_offset_commits([OffsetCommit("g", "T", q, o)]))
               for q, o in [(0, 1), (1, 4), (0, 3), (0, 2), (1, 5)]]
    members = [ConsumerOffsetTable() for _ in range(3)]
    for m in members:
        for i, e in enumerate(entries):
            m.apply_entry(i, e)
    assert {m.to_json() for m in members} == {members[0].to_json()}
    assert members[0].query("g", "T", 0) == 3 and members[0].query("g", "T", 1) == 5


def test_bad_commit_changes_nothing():
    """A batch with one invalid commit (an '@' in a name) raises before changing any offset."""
    table = ConsumerOffsetTable()
    with pytest.raises(ValueError, match="containing '@'"):
        table.apply([OffsetCommit("g", "T", 0, 5), OffsetCommit("a@b", "T", 0, 1)])
    assert len(table) == 0 and table.version == 0


offset_names = st.text(alphabet="abcXYZ%_-0123456789", min_size=1, max_size=12)


@given(st.lists(st.builds(OffsetCommit, offset_names, offset_names, st.integers(0, 2000),
                          st.integers(-1, 1 << 62)), max_size=30))
def test_json_round_trip(commits):
    """to_json -> from_json gives the same offsets, in the same bytes (pretty and compact)."""
    table = ConsumerOffsetTable()
    table.apply(commits)
    for pretty in (True, False):
        again = ConsumerOffsetTable.from_json(table.to_json(pretty=pretty))
        assert sorted(again.items()) == sorted(table.items())
        assert again.to_json(pretty=pretty) == table.to_json(pretty=pretty)


def test_merge_never_backwards():
    """A sync from a master takes offsets that are ahead and keeps local ones that are ahead."""
    local, master = ConsumerOffsetTable(), ConsumerOffsetTable()
    local.apply([OffsetCommit("g", "T", 0, 9), OffsetCommit("g", "T", 1, 1)])
    master.apply([OffsetCommit("g", "T", 0, 4), OffsetCommit("g", "T", 1, 6), OffsetCommit("h", "U", 0, 2)])
    assert local.merge(master) == 2
    assert (local.query("g", "T", 0), local.query("g", "T", 1), local.query("h", "U", 0)) == (9, 6, 2)


def test_golden_consumer_offset_file_round_trips():
    """consumerOffset.json of the golden store loads and writes back byte for byte."""
    text = (CONFIG / "consumerOffset.json").read_text()
    table = ConsumerOffsetTable.from_json(text)
    assert table.query("golden_push_cg", "GoldenTopic", 2) == 8
    assert table.query("ons_test_cg_1795427018640", "GoldenTopic", 1) == -1
    assert table.query("golden_pull_cg", "GoldenTopic", 0) == -1
    assert table.to_json() == text


def test_golden_get_all_consumer_offset_body():
    """The GET_ALL_CONSUMER_OFFSET response body parses and re-serialises compactly byte for byte."""
    body = frame_body(FRAMES / "043-get-all-consumer-offset-end-of-run-with-data-response.bin")
    table = ConsumerOffsetTable.from_json(body)
    assert table.to_json(pretty=False).encode() == body
    assert table.to_json() == (CONFIG / "consumerOffset.json").read_text()


def test_reloaded_java_table_order_is_a_smaller_table():
    """The new master n2 (restarted, table loaded from its file) iterates offsets as a 32-bucket map.

    RocketMQ replaces its offset table with fastjson's map on load, so its
    order depends on history; ours is the fresh-table order (content equal).
    """
    body = frame_body(FRAMES / "043-get-all-consumer-offset-failover-rejoined-slave-syncs-from-new-master-response.bin")
    keys = list(fastjson.loads(body)["offsetTable"])

    def buckets(n):
        return [((h := fastjson.java_hash(k) & 0xFFFFFFFF) ^ (h >> 16)) & (n - 1) for k in keys]
    assert buckets(32) == sorted(buckets(32)) and buckets(1024) != sorted(buckets(1024))
    assert fastjson.table_size(16, len(keys)) == 32
    table = ConsumerOffsetTable.from_json(body)
    assert table.query("golden_failover_cg", "GoldenTopic", 2) == 98
    again = ConsumerOffsetTable.from_json(table.to_json(pretty=False))
    assert sorted(again.items()) == sorted(table.items())


def test_new_keys_written_in_java_order():
    """Keys inserted in any order come out in RocketMQ's order (the golden file's)."""
    golden = ConsumerOffsetTable.from_json((CONFIG / "consumerOffset.json").read_text())
    table = ConsumerOffsetTable()
    table.apply(sorted(golden.items(), reverse=True))
    assert table.to_json() == golden.to_json()


@pytest.mark.parametrize("text, message", [
    ('{"offsetTable":{"nogroup":{0:1}}}', "not topic@group"),
    ('{"offsetTable":{"T@g":{"x":1}}}', "queue id: 'x' is not an integer"),
    ('{"offsetTable":{"T@g":{0:"x"}}}', "is not an integer"),
    ('{"offsetTable":{"T@g":[1]}}', "expected an object"),
    ('[]', "expected"),
])
def test_malformed_tables_raise_one_line(text, message):
    """Bad shapes raise ValueError naming the key."""
    with pytest.raises(ValueError, match=message):
        ConsumerOffsetTable.from_json(text)


# -- DelayOffsetTable -------------------------------------------------------------------------------------

def test_golden_delay_offset_file_and_body():
    """delayOffset.json and the GET_ALL_DELAY_OFFSET body round-trip byte for byte."""
    text = (CONFIG / "delayOffset.json").read_text()
    table = DelayOffsetTable.from_json(text)
    assert table.items() == {1: 1, 2: 1, 3: 1} and table.to_json() == text
    body = frame_body(FRAMES / "045-get-all-delay-offset-end-of-run-with-data-response.bin")
    assert DelayOffsetTable.from_json(body).to_json(pretty=False).encode() == body


def test_delay_offsets_advance_only():
    """A delay level's offset only moves forward; merge takes the higher."""
    table = DelayOffsetTable({2: 5})
    assert not table.advance(2, 4) and table.get(2) == 5
    assert table.advance(2, 6) and table.get(2) == 6 and table.get(7) == 0
    assert table.merge(DelayOffsetTable({2: 3, 4: 1})) == 1 and table.items() == {2: 6, 4: 1}
