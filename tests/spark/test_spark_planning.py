"""The data source's pure parts: option parsing, planning decisions, and the executor read loop on a fake client."""

import json

import pytest

from dledger.codes import ResponseCode
from dledger.entry import Entry
from dledger.errors import DLedgerError

pytest.importorskip("dledger_spark", reason="dledger-spark is not installed (pip install -e spark)")

from dledger_spark import planning
from dledger_spark.options import OptionError, parse_options
from dledger_spark.reader import Partition, SourceError, read_entries

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"


def test_options_defaults():
    """peers + group: one group, earliest to latest, leader reads, raw rows, failOnDataLoss on."""
    o = parse_options({"peers": PEERS, "group": "g0"})
    assert o.groups == {"g0": PEERS} and o.starting == {"g0": "earliest"} and o.ending == {"g0": "latest"}
    assert (o.read_from, o.format, o.fail_on_data_loss, o.max_entries_per_trigger) == ("leader", "raw", True, None)


def test_options_are_case_insensitive_and_groups_take_json():
    """Spark lower-cases option names; groups as JSON {group: peers} with per-group startingIndex JSON."""
    groups = json.dumps({"b": PEERS, "a": PEERS})
    o = parse_options({"groups": groups, "startingindex": '{"a": 5}',
                       "maxentriespertrigger": "100", "readfrom": "ANY", "failondataloss": "false"})
    assert list(o.groups) == ["a", "b"] and o.starting == {"a": 5, "b": "earliest"}
    assert (o.max_entries_per_trigger, o.read_from, o.fail_on_data_loss) == (100, "any", False)
    assert parse_options({"groups": "x, y", "peers": PEERS}).groups == {"x": PEERS, "y": PEERS}


@pytest.mark.parametrize("options, message", [
    ({}, "option 'peers' is required"),
    ({"peers": "nonsense"}, "peers of group 'default'"),
    ({"peers": PEERS, "group": "g", "groups": "h"}, "exclude each other"),
    ({"groups": "g0,g1"}, "'peers' is needed too"),
    ({"groups": "{not json"}, "option 'groups': invalid JSON"),
    ({"peers": PEERS, "readFrom": "nearest"}, "option 'readFrom': expected leader | follower | any"),
    ({"peers": PEERS, "format": "avro"}, "option 'format'"),
    ({"peers": PEERS, "startingIndex": "-3"}, "an index is >= 0"),
    ({"peers": PEERS, "startingIndex": "soon"}, "expected earliest | latest or an index"),
    ({"peers": PEERS, "startingIndex": '{"zz": 1}'}, "unknown group"),
    ({"peers": PEERS, "endingIndex": "earliest"}, "option 'endingIndex': expected latest or an index"),
    ({"peers": PEERS, "maxEntriesPerTrigger": "0"}, "must be more than 0"),
    ({"peers": PEERS, "failOnDataLoss": "maybe"}, "expected true or false"),
    ({"peers": PEERS, "timeout": "x"}, "option 'timeout': expected a positive number"),
])
def test_bad_options_are_one_line_errors(options, message):
    """Each malformed option raises OptionError naming it."""
    with pytest.raises(OptionError, match=message) as err:
        parse_options(options)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("spec, begin, committed, start", [
    ("earliest", 0, 10, 0), ("earliest", 7, 10, 7), ("earliest", -1, -1, 0),
    ("latest", 0, 10, 11), (4, 7, 10, 4),
])
def test_resolve_start(spec, begin, committed, start):
    """earliest is the log's first entry, latest the first uncommitted index, N itself."""
    assert planning.resolve_start(spec, begin, committed) == start


@pytest.mark.parametrize("spec, committed, end", [("latest", 10, 11), (5, 10, 5), (50, 10, 11), ("latest", -1, 0)])
def test_resolve_end_never_passes_the_commit(spec, committed, end):
    """A batch read ends at endingIndex, but never past the committed index + 1."""
    assert planning.resolve_end(spec, committed) == end


@pytest.mark.parametrize("start, latest, limit, end", [
    ({"a": 0}, {"a": 100}, None, {"a": 100}),
    ({"a": 0}, {"a": 100}, 30, {"a": 30}),
    ({"a": 0, "b": 0}, {"a": 90, "b": 10}, 50, {"a": 45, "b": 5}),      # shared in proportion
    ({"a": 0, "b": 0, "c": 0}, {"a": 1, "b": 1, "c": 1}, 2, {"a": 1, "b": 1, "c": 0}),  # remainder by name
    ({"a": 10}, {"a": 5}, None, {"a": 10}),                            # never backwards
    ({"a": 10, "b": 3}, {"a": 10, "b": 3}, 7, {"a": 10, "b": 3}),       # nothing new
])
def test_admit(start, latest, limit, end):
    """maxEntriesPerTrigger caps a micro-batch, shared out deterministically; offsets never go back."""
    got = planning.admit(start, latest, limit)
    assert got == end
    assert limit is None or sum(got[g] - start[g] for g in start) <= limit


def test_split_and_partition_size():
    """Ranges cover [start, end) exactly; a partition holds partition_bytes worth of entries (at least one)."""
    ranges = planning.split("g", 5, 23, 7)
    assert [(r.start, r.end) for r in ranges] == [(5, 12), (12, 19), (19, 23)]
    assert planning.split("g", 5, 5, 7) == []
    assert planning.entries_per_partition(4 << 20, 1072) == 3912 and planning.entries_per_partition(10, 1072) == 1


class FakeClient:
    """Serves GETs from a list of entries (NOOP-free reads), scripted errors first."""

    def __init__(self, entries, begin=0, errors=(), follower_committed=None):
        self.entries = {e.index: e for e in entries}
        self.begin = begin
        self.errors = list(errors)
        self.follower_committed = follower_committed
        self.calls = []

    def get(self, index, count=1, member=None):
        self.calls.append((index, count, member))
        if self.errors:
            raise self.errors.pop(0)
        if index < self.begin:
            raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, "gone")
        top = max(self.entries)
        if member is not None and self.follower_committed is not None:
            if index > self.follower_committed:
                raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, "behind")
            top = self.follower_committed
        return [self.entries[i] for i in range(index, min(index + 3, top + 1)) if i in self.entries]

    def find_leader(self):
        class Meta:
            ledger_begin_index = self.begin
        return Meta()


def log(n, noops=()):
    return [Entry(b"%d" % i, index=i, term=1, pos=i * 50) for i in range(n) if i not in noops]


def indexes(batches):
    return [e.index for batch in batches for e in batch]


def test_read_stops_at_the_range_end_even_if_the_member_has_more():
    """Entries at or past the partition's end are never returned (the end was the committed index + 1)."""
    client = FakeClient(log(20))
    assert indexes(read_entries(Partition("g", PEERS, 2, 9), client)) == list(range(2, 9))


def test_read_skips_noops_and_ends_when_the_rest_are_noops():
    """NOOP indexes are absent from the rows; a range whose tail is NOOPs ends without waiting."""
    client = FakeClient(log(12, noops={3, 7, 8, 9}))
    assert indexes(read_entries(Partition("g", PEERS, 0, 10), client)) == [0, 1, 2, 4, 5, 6]


def test_deleted_range_fails_loudly_by_default_and_is_skipped_otherwise():
    """INDEX_LESS_THAN_LOCAL_BEGIN from the leader: SourceError naming the lost indexes, or (no failOnDataLoss) skip."""
    with pytest.raises(SourceError, match=r"entries 2\.\.4 of group 'g' were deleted by retention"):
        list(read_entries(Partition("g", PEERS, 2, 9), FakeClient(log(10), begin=5)))
    got = read_entries(Partition("g", PEERS, 2, 9, fail_on_data_loss=False), FakeClient(log(10), begin=5))
    assert indexes(got) == [5, 6, 7, 8]


def test_lagging_follower_hands_over_to_the_leader_with_readFrom_any():
    """readFrom=any: a follower behind the range is left at once for the leader; every index is read once."""
    client = FakeClient(log(10), follower_committed=4)
    part = Partition("g", PEERS, 0, 10, members=("n1", "n2"), read_from="any")
    assert indexes(read_entries(part, client)) == list(range(10))
    assert any(member is None for _, _, member in client.calls) and client.calls[0][2] == "n1"


def test_unreachable_group_gives_up_after_timeout_without_progress():
    """Errors with no progress for `timeout` seconds end the read with a SourceError naming the last error."""
    now = [0.0]

    def clock():
        now[0] += 1.0
        return now[0]

    client = FakeClient(log(5), errors=[DLedgerError(ResponseCode.NETWORK_ERROR, "refused")] * 100)
    with pytest.raises(SourceError, match="no progress reading group 'g' at index 0 for 3s"):
        list(read_entries(Partition("g", PEERS, 0, 5, timeout=3.0), client, clock=clock))


def test_ingest_bad_option_is_one_line_and_exit_2(tmp_path, capsys):
    """dledger ingest with a malformed option prints one line naming it and exits 2 (no Spark started)."""
    from dledger import cli

    status = cli.main(["ingest", "--peers", PEERS, "--group", "g0", "--output", str(tmp_path / "o"),
                       "--starting-index", "soon"])
    err = capsys.readouterr().err
    assert status == 2
    assert err.strip() == ("dledger ingest: option 'startingIndex': expected earliest | latest or an index, "
                           "got 'soon'")


def test_ingest_unreachable_group_is_one_line_and_exit_1(tmp_path, capsys):
    """dledger ingest against a group nobody answers for fails in --timeout seconds with one line, exit 1."""
    from dledger import cli
    from dledger.launcher import free_ports

    port = free_ports(1)[0]
    status = cli.main(["ingest", "--peers", f"n0-127.0.0.1:{port}", "--group", "g0", "--output",
                       str(tmp_path / "o"), "--timeout", "1.5", "--once"])
    err = capsys.readouterr().err.strip()
    assert status == 1 and "\n" not in err
    assert err.startswith("dledger ingest: dledger source: no leader of group 'g0'")


def test_planning_waits_out_an_election():
    """The driver asks again while no leader answers (an election), and gives up with one line after `timeout`."""
    from dledger_spark.source import Planner

    class Electing:
        def __init__(self, failures):
            self.failures = failures

        def find_leader(self):
            if self.failures:
                self.failures -= 1
                raise DLedgerError(ResponseCode.NOT_LEADER, "no leader found")

            class Meta:
                committed_index, ledger_begin_index, leader_id = 41, 0, "n1"
            return Meta()

    planner = Planner(parse_options({"peers": PEERS, "group": "g0", "timeout": "5"}))
    planner._clients["g0"] = Electing(failures=3)
    assert planner.latest() == {"g0": 42}
    planner = Planner(parse_options({"peers": PEERS, "group": "g0", "timeout": "0.3"}))
    planner._clients["g0"] = Electing(failures=10**6)
    with pytest.raises(SourceError, match=r"no leader of group 'g0' at .* answered within 0.3s"):
        planner.latest()
