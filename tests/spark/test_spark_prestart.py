"""The prestart read (dledger_spark.prestart): what it asks Spark for, on fakes (no SparkSession here).

The stream's own ingest runs it for real in test_spark_source / test_spark_cluster (``dledger ingest``).
"""

import json
from types import SimpleNamespace

import pytest

pytest.importorskip("dledger_spark", reason="dledger-spark is not installed (pip install -e spark)")

from dledger_spark.options import Credentials, parse_options
from dledger_spark.prestart import prestart, prestart_options

PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"


@pytest.fixture(name="token")
def token_fixture(tmp_path):
    """A client token file (secret-mode credentials)."""
    path = tmp_path / "reader.token"
    path.write_text("0123456789abcdef0123456789abcdef\n")
    return str(path)


@pytest.mark.parametrize("options", [
    {"peers": PEERS, "group": "g0", "readFrom": "any"},
    {"peers": PEERS, "group": "g0", "startingIndex": '{"g0": 17}', "maxEntriesPerTrigger": "100",
     "endingIndex": "5", "clientName": "reader", "tokenFile": "{token}", "timeout": "7"},
    {"groups": json.dumps({"a": PEERS, "b": PEERS}), "startingIndex": '{"a": 3, "b": 9}', "format": "rocketmq"},
])
def test_prestart_reads_nothing_with_the_streams_options(options, token):
    """Every group from its end to its end (an empty range), with the stream's members, format and credentials."""
    options = {k: v.replace("{token}", token) for k, v in options.items()}
    before = dict(options)
    stream, warm = parse_options(options), parse_options(prestart_options(options))
    assert options == before  # the stream's options are not changed
    assert warm.starting == warm.ending == {g: 0 for g in stream.groups}
    assert (warm.groups, warm.read_from, warm.format, warm.timeout, warm.credentials) == \
        (stream.groups, stream.read_from, stream.format, stream.timeout, stream.credentials)
    assert warm.max_entries_per_trigger is None


class FakePlanner:
    """Every group's committed index is 41: a read from ``latest`` to ``latest`` is empty."""

    def metas(self):
        return {"g0": SimpleNamespace(ledger_begin_index=0, committed_index=41)}

    def partitions(self, start, end):
        assert start == end == {"g0": 42}
        return []

    def close(self):
        pass


class Unasked(FakePlanner):
    def metas(self):
        raise AssertionError("the members were asked")


@pytest.mark.parametrize("bounds, planner", [
    ({"startingIndex": "latest", "endingIndex": "latest"}, FakePlanner()),  # empty once the leader answered
    ({"startingIndex": "0", "endingIndex": "0"}, Unasked()),                # the prestart's: empty by its options
])
def test_an_empty_batch_read_task_carries_the_reads_options(token, bounds, planner):
    """The one task of a read with nothing to read is made with the read's options, so its worker builds the
    client (same members, timeout and credentials) that the stream's tasks then reuse."""
    from dledger_spark.source import DLedgerBatchReader

    opts = parse_options({"peers": PEERS, "group": "g0", "readFrom": "follower", "timeout": "7",
                          "clientName": "reader", "tokenFile": token, **bounds})
    reader = DLedgerBatchReader(opts)
    reader._planner = planner
    [part] = reader.partitions()
    assert (part.group, part.start, part.end) == ("g0", 0, 0)
    assert (part.read_from, part.timeout, part.credentials, part.format) == \
        ("follower", 7.0, Credentials(client_name="reader", token_file=token), "raw")


@pytest.mark.parametrize("starting, ending, empty", [
    ({"g": 0}, {"g": 0}, True),
    ({"g": 5}, {"g": 3}, True),
    ({"g": 5}, {"g": 6}, False),
    ({"g": "earliest"}, {"g": 0}, False),   # the log's begin is known only to the members
    ({"g": 0}, {"g": "latest"}, False),
    ({"a": 0, "b": 0}, {"a": 0, "b": 1}, False),
    ({"a": 2, "b": 9}, {"a": 2, "b": 1}, True),
])
def test_empty_by_options(starting, ending, empty):
    from dledger_spark.planning import empty_by_options

    assert empty_by_options(starting, ending) is empty


class Recorder:
    """A stand-in for a SparkSession's read -> load -> write chain that records each call."""

    def __init__(self, fail=False):
        self.calls, self.fail = [], fail

    def __getattr__(self, name):
        def call(*args, **kwargs):
            self.calls.append((name, args, kwargs))
            if self.fail and name == "load":
                raise RuntimeError("no leader\nat java ...")
            return self
        return call

    @property
    def read(self):
        return self

    @property
    def write(self):
        return self


def test_prestart_runs_an_empty_read_into_noop_in_a_thread():
    spark = Recorder()
    prestart(spark, {"peers": PEERS, "group": "g0"}).join(10)
    names = [c[0] for c in spark.calls]
    assert names == ["format", "options", "load", "format", "mode", "save"]
    assert spark.calls[0][1] == ("dledger",) and spark.calls[3][1] == ("noop",)
    assert spark.calls[1][2]["startingIndex"] == spark.calls[1][2]["endingIndex"] == "0"


def test_a_failed_prestart_only_logs(caplog):
    """A prestart read that fails ends its thread with one debug line (the stream reports its own errors)."""
    caplog.set_level("DEBUG", logger="dledger_spark")
    spark = Recorder(fail=True)
    thread = prestart(spark, {"peers": PEERS, "group": "g0"})
    thread.join(10)
    assert not thread.is_alive() and [c[0] for c in spark.calls] == ["format", "options", "load"]
    assert [r.getMessage() for r in caplog.records] == ["dledger source: the prestart read failed: no leader"]


@pytest.mark.parametrize("argv, on", [([], True), (["--no-prestart"], False)])
def test_ingest_and_its_bench_take_no_prestart(argv, on):
    from dledger.cli import build_parser

    assert build_parser().parse_args(["ingest", "--peers", PEERS, "--output", "o", *argv]).prestart is on
    assert build_parser().parse_args(["bench", "ingest", *argv]).prestart is on
