"""The dledger data source on a local[2] session against live 3-member groups (real twistd processes)."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from spark_util import Group, group_fixture, spark_fixture, wait_until  # noqa: F401 (the fixtures)

pytestmark = [pytest.mark.spark, pytest.mark.process]


def read(spark, group: Group, **options):
    reader = spark.read.format("dledger").option("peers", group.peers).option("group", group.name)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def as_tuples(rows):
    return sorted((r["index"], r["term"], r["pos"], bytes(r["body"])) for r in rows)


def entry_tuples(entries):
    return sorted((e.index, e.term, e.pos, e.body) for e in entries)


def test_batch_read_equals_the_committed_log(spark, group):
    """A batch read (several partitions) returns exactly the committed entries: indexes, terms, positions, bodies."""
    bodies = [os.urandom(n % 3000) for n in range(1500)]
    group.append(bodies)
    df = read(spark, group, partitionBytes=200_000)
    assert df.rdd.getNumPartitions() > 3
    rows = df.collect()
    assert as_tuples(rows) == entry_tuples(group.committed())
    assert sorted(bytes(r["body"]) for r in rows) == sorted(bodies)
    assert {r["group"] for r in rows} == {"g0"} and all(r["ingest_time"] is not None for r in rows)


@pytest.mark.parametrize("read_from", ["follower", "any"])
def test_reads_served_by_followers_equal_the_committed_log(spark, group, read_from):
    """readFrom=follower/any: the followers' committed prefixes give the same rows as the leader's log."""
    group.append([b"f%d" % i for i in range(800)])
    rows = read(spark, group, readFrom=read_from, partitionBytes=10_000).collect()
    assert as_tuples(rows) == entry_tuples(group.committed())


def test_starting_and_ending_index_bound_a_batch_read(spark, group):
    """startingIndex N and endingIndex M read exactly the committed entries with N <= index < M."""
    group.append([b"r%d" % i for i in range(300)])
    rows = read(spark, group, startingIndex=100, endingIndex=200).collect()
    assert as_tuples(rows) == entry_tuples(e for e in group.committed() if 100 <= e.index < 200)
    latest = read(spark, group, startingIndex="latest").collect()
    assert latest == []


def test_bad_option_fails_the_read_with_a_one_line_reason(spark, group):
    """A malformed option fails at planning with the option named (no task runs)."""
    with pytest.raises(Exception, match="option 'readFrom': expected leader | follower | any"):
        read(spark, group, readFrom="nearest").collect()


def test_no_streamed_row_is_past_the_committed_index_at_planning(spark, group, tmp_path):
    """Micro-batches while appends run: every row's index is below its batch's end offset, which was committed."""
    group.append([b"s%d" % i for i in range(100)])
    stop = threading.Event()
    appended = []

    def writer():
        from dledger.blocking import BlockingClient

        with BlockingClient(group.peers, group.name, timeout=20) as c:
            while not stop.is_set() and len(appended) < 3000:
                appended.append(c.append_batch([b"w"] * 50).index)

    seen: dict[int, tuple[int, int]] = {}  # batch id -> (its highest index, leader's committed index after it)

    def batch(df, batch_id):
        top = max((r["index"] for r in df.select("index").collect()), default=-1)
        seen[batch_id] = (top, group.wait_leader().committed_index)

    thread = threading.Thread(target=writer)
    stream = (spark.readStream.format("dledger").option("peers", group.peers).option("group", "g0")
              .option("maxEntriesPerTrigger", 400).load())
    query = stream.writeStream.foreachBatch(batch).option("checkpointLocation", str(tmp_path / "ck")) \
        .trigger(processingTime="0.2 seconds").start()
    thread.start()
    try:
        wait_until(lambda: len(seen) >= 6 and appended, 120, "six micro-batches during appends")
    finally:
        stop.set()
        thread.join(30)
        query.stop()
    checked = 0
    for p in query.recentProgress:
        if p["batchId"] not in seen:
            continue
        source = p["sources"][0]
        start = json.loads(source["startOffset"] or "null")
        end = json.loads(source["endOffset"])["g0"]
        top, committed_after = seen[p["batchId"]]
        assert top < end <= committed_after + 1  # every row below the batch's end, itself committed
        if start is not None:
            assert end - start["g0"] <= 400  # maxEntriesPerTrigger holds
        checked += 1
    assert checked >= 3


def test_planned_end_offsets_never_pass_the_committed_index(group):
    """latestOffset during appends is at most the committed index + 1 read right after; partitions stay below it."""
    from dledger_spark.options import parse_options
    from dledger_spark.reader import read_entries
    from dledger_spark.source import DLedgerStreamReader
    from pyspark.sql.streaming.datasource import ReadAllAvailable

    reader = DLedgerStreamReader(parse_options({"peers": group.peers, "group": "g0"}))
    stop = threading.Event()

    def writer():
        from dledger.blocking import BlockingClient

        with BlockingClient(group.peers, group.name, timeout=20) as c:
            while not stop.is_set():
                c.append_batch([b"p"] * 20)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        start = reader.initialOffset()
        for _ in range(20):
            end = reader.latestOffset(start, ReadAllAvailable())
            assert end["g0"] <= group.wait_leader().committed_index + 1
            for part in reader.partitions(start, end):
                for entries in read_entries(part):
                    assert all(start["g0"] <= e.index < end["g0"] for e in entries)
            start = end
    finally:
        stop.set()
        thread.join(30)
        reader.stop()


def test_retention_past_the_start_fails_loudly_unless_failOnDataLoss_is_false(spark, tmp_path):
    """Entries deleted by retention: the read fails naming them; failOnDataLoss=false skips to the log's begin."""
    g = Group(tmp_path / "ret", options={"mappedFileSizeForEntryData": 64 << 10, "fileReservedHours": 0,
                                         "deleteWhen": ";".join(f"{h:02d}" for h in range(24))})
    try:
        g.start()
        g.append([os.urandom(1000) for _ in range(300)])
        begin = wait_until(lambda: (m := g.leader_meta()) is not None and m.ledger_begin_index > 0
                           and m.ledger_begin_index, 30, "retention to delete the first data files")
        with pytest.raises(Exception, match=r"dledger source: entries 0\.\.\d+ of group 'g0' were deleted by "
                                            r"retention"):
            read(spark, g, startingIndex=0).collect()
        rows = read(spark, g, startingIndex=0, failOnDataLoss="false").collect()
        assert rows and min(r["index"] for r in rows) >= begin
        assert as_tuples(rows) == entry_tuples(e for e in g.committed() if e.index >= min(r["index"] for r in rows))
    finally:
        g.close()


INGEST = str(Path(__file__).resolve().parents[2] / "spark" / "ingest.py")


def ingest_argv(group: Group, out: Path, checkpoint: Path, *extra: str) -> list[str]:
    return [sys.executable, INGEST, "--peers", group.peers, "--group", group.name, "--output", str(out),
            "--checkpoint", str(checkpoint), "--progress-interval", "0.5", *extra]


def count_files(path: Path) -> int:
    return len([p for p in path.glob("[0-9]*") if p.is_file()]) if path.exists() else 0


def test_ingest_killed_and_restarted_writes_every_index_exactly_once(spark, group, tmp_path):
    """SIGKILL of the ingest driver mid-stream, then a restart (--once): Parquet holds each committed index once."""
    group.append([b"k%d" % i for i in range(300)])
    out, ck = tmp_path / "out", tmp_path / "ck"
    stop = threading.Event()

    def writer():
        from dledger.blocking import BlockingClient

        wait_until(lambda: count_files(ck / "commits") >= 1 or stop.is_set(), 120, "the first micro-batch")
        with BlockingClient(group.peers, group.name, timeout=20) as c:
            for i in range(40):  # while the query runs
                if stop.is_set():
                    break
                c.append_batch([b"a%d-%d" % (i, j) for j in range(25)])

    log = (tmp_path / "ingest.log").open("wb")
    proc = subprocess.Popen(ingest_argv(group, out, ck, "--trigger-interval", "0.2",
                                        "--max-entries-per-trigger", "200"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    thread = threading.Thread(target=writer)
    thread.start()
    try:
        wait_until(lambda: count_files(ck / "commits") >= 3, 120, "three committed micro-batches")
        try:  # best effort: kill while a planned batch is not committed yet
            wait_until(lambda: count_files(ck / "offsets") > count_files(ck / "commits"), 10, "a batch in flight",
                       interval=0.005)
        except TimeoutError:
            pass
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        stop.set()
        thread.join(60)
        log.close()
    first_run = (tmp_path / "ingest.log").read_text(errors="replace")
    assert "lag=" in first_run and "entries/s" in first_run  # progress lines while it ran
    done = subprocess.run(ingest_argv(group, out, ck, "--once"), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = spark.read.parquet(str(out)).select("index", "term", "pos", "body").collect()
    indexes = [r["index"] for r in rows]
    assert len(indexes) == len(set(indexes)), "an index was written twice"
    assert as_tuples(rows) == entry_tuples(group.committed())
    assert len(rows) > 300 + 25  # entries appended while the query ran arrived too


def test_leader_kill_during_a_streaming_query_only_delays_it(spark, group, tmp_path):
    """SIGKILL of the leader during micro-batches: the query goes on under a new leader, no index lost or doubled."""
    group.append([b"l%d" % i for i in range(500)])
    got: list[int] = []

    def batch(df, batch_id):
        got.extend(r["index"] for r in df.select("index").collect())

    query = (spark.readStream.format("dledger").option("peers", group.peers).option("group", "g0")
             .option("maxEntriesPerTrigger", 200).load()
             .writeStream.foreachBatch(batch).option("checkpointLocation", str(tmp_path / "ck"))
             .trigger(processingTime="0.2 seconds").start())
    try:
        wait_until(lambda: len(got) >= 200, 60, "the first micro-batches")
        leader = group.wait_leader().leader_id
        group.local.kill(leader)
        group.append([b"m%d" % i for i in range(300)])  # through the new leader
        group.local.start(leader)
        expected = [e.index for e in group.committed()]
        wait_until(lambda: len(got) >= len(expected) or query.exception() is not None, 120,
                   "every committed entry to arrive")
        assert query.exception() is None
    finally:
        query.stop()
    assert sorted(got) == expected


class BrokerGroup(Group):
    """A group whose members run the RocketMQ broker layer, each member's broker port on 127.0.0.1."""

    def __init__(self, base_dir):
        super().__init__(base_dir, options={"plugins.rocketmq.enabled": True})
        from dledger.launcher import free_ports

        self.broker_ports = dict(zip(self.local.ids, free_ports(3)))
        argv = self.local.argv
        self.local.argv = lambda mid: [*argv(mid), "--plugin-opt",
                                       f"rocketmq.listen=tcp:{self.broker_ports[mid]}:interface=127.0.0.1"]

    def master_client(self):
        """A blocking RocketMQ client of the member whose broker accepts sends (the leader's)."""
        from dledger_rocketmq.client.client import BlockingRocketMQClient, RocketMQError
        from twisted.internet.error import ConnectError

        def attempt():
            for port in self.broker_ports.values():
                try:
                    c = BlockingRocketMQClient("127.0.0.1", port, timeout=5)
                except (RocketMQError, OSError, ConnectError):  # a member not listening yet: refused
                    continue
                try:
                    c.send("Probe", b"probe")
                    return c
                except RocketMQError:
                    c.close()
            return None

        return wait_until(attempt, 60, "a broker master that accepts sends", interval=0.2)


def test_rocketmq_rows_equal_what_the_broker_consumer_pulls(spark, tmp_path):
    """format=rocketmq: one row per message with the fields a consumer's PULL returns; offset commits left out."""
    pytest.importorskip("dledger_rocketmq")
    g = BrokerGroup(tmp_path / "rmq")
    try:
        g.start()
        c = g.master_client()
        try:
            for i in range(20):
                c.send("TopicS", b"body-%d" % i, tags=f"T{i % 3}", keys=[f"k{i}", "shared"],
                       properties={"custom": str(i)})
            c.send_batch("TopicS", [b"batch-1", b"batch-2"], tags="B")
            c.commit_offset("cg", "TopicS", 0, 5)  # a CONTROL entry in the log: no row
            pulled = c.pull("cg", "TopicS", 0, 0, 100).messages
        finally:
            c.close()
        assert len(pulled) == 22
        rows = [r for r in read(spark, g, format="rocketmq").collect() if r["topic"] == "TopicS"]

        def row_fields(r):
            return (r["topic"], r["queue_id"], r["queue_offset"], r["physical_offset"], r["msg_id"], r["tags"],
                    r["keys"], dict(r["properties"]), r["born_timestamp"], r["store_timestamp"], r["born_host"],
                    bytes(r["body"]))

        def pulled_fields(m):
            props = m.property_map
            return (m.topic, m.queue_id, m.queue_offset, m.physical_offset, m.message_id, props.get("TAGS"),
                    props.get("KEYS"), props, m.born_timestamp, m.store_timestamp, str(m.born_host), m.body)

        assert sorted(map(row_fields, rows)) == sorted(map(pulled_fields, pulled))
        assert {r["properties"]["custom"] for r in rows if r["tags"] != "B"} == {str(i) for i in range(20)}
    finally:
        g.close()
