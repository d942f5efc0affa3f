"""``dledger ingest`` (and ``spark/ingest.py`` for ``spark-submit``): committed entries into Parquet, exactly once.

A Structured Streaming query: ``readStream.format("dledger")`` -> Parquet files partitioned by ``group`` and
``date`` (of ``ingest_time``), with a checkpoint.  Spark's file sink commits each micro-batch atomically
(``_spark_metadata``) and replays an unfinished batch with the offsets its offset log holds, so a killed
and restarted ingest writes every index exactly once.  The start offsets are pinned in the checkpoint
(``dledger-start.json``) the first time, so ``startingIndex=latest`` (or ``earliest`` after retention)
means the same indexes when the first batch is replayed.  ``--once`` runs ``Trigger.AvailableNow``:
everything committed when it starts, then exit.

Exit status: 0 done (or stopped by SIGTERM / Ctrl-C), 1 the query failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

START_FILE = "dledger-start.json"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--peers", help="members of the group: n0-host:port;n1-host:port;...")
    p.add_argument("--group", help="the group to read (default: 'default')")
    p.add_argument("--groups", help="several groups, read in parallel: JSON {group: peers}, or names sharing --peers")
    p.add_argument("--output", required=True, help="Parquet output directory (a path or URI Spark can write)")
    p.add_argument("--checkpoint", help="checkpoint directory (default: OUTPUT/../<name>.checkpoint)")
    p.add_argument("--master", help="Spark master (default local[2]; under spark-submit: its --master)")
    p.add_argument("--once", action="store_true",
                   help="Trigger.AvailableNow: ingest what is committed now, then exit")
    p.add_argument("--trigger-interval", type=float, default=1.0, metavar="SECONDS",
                   help="micro-batch interval (default 1.0)")
    p.add_argument("--starting-index", default="earliest",
                   help="earliest | latest | N | JSON {group: N} (first run only; the checkpoint wins later)")
    p.add_argument("--max-entries-per-trigger", type=int, help="at most this many indexes per micro-batch")
    p.add_argument("--read-from", default="leader", choices=("leader", "follower", "any"),
                   help="who serves the reads (default leader)")
    p.add_argument("--format", default="raw", choices=("raw", "rocketmq"), help="row layout (default raw)")
    p.add_argument("--no-fail-on-data-loss", dest="fail_on_data_loss", action="store_false",
                   help="skip entries deleted by retention (logged) instead of failing")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds a read may make no progress (default 60)")
    p.add_argument("--partition-bytes", type=int, help="target bytes per Spark task (default 16 MiB)")
    p.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between progress lines (default 5)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark configuration")


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "ingest", help="stream committed entries into Parquet with Spark (exactly once, restartable)",
        description="Stream a group's committed entries into Parquet (partitioned by group and date) with a "
                    "checkpoint; restart with the same --checkpoint to go on where it stopped. Needs dledger-spark "
                    "(pyspark). See README 'Spark ingest'.")
    add_arguments(p)
    p.set_defaults(func=run)


def source_options(args) -> dict[str, str]:
    """The data source options the arguments stand for (checked by :func:`dledger_spark.options.parse_options`)."""
    opts = {"readFrom": args.read_from, "format": args.format, "failOnDataLoss": str(args.fail_on_data_loss).lower(),
            "timeout": str(args.timeout), "startingIndex": args.starting_index}
    for key, value in (("peers", args.peers), ("group", args.group), ("groups", args.groups),
                       ("maxEntriesPerTrigger", args.max_entries_per_trigger),
                       ("partitionBytes", args.partition_bytes)):
        if value is not None:
            opts[key] = str(value)
    return opts


def checkpoint_dir(args) -> str:
    if args.checkpoint:
        return args.checkpoint
    out = args.output.rstrip("/")
    return out + ".checkpoint"


def pin_start(checkpoint: str, opts: dict[str, str], parsed) -> dict[str, int]:
    """The start offsets of this ingest: from the checkpoint's pin file, else resolved now and pinned there.

    Only for local checkpoints (a path); for a remote URI the start is resolved by the source each run.
    """
    from dledger_spark.source import Planner

    local = "://" not in checkpoint or checkpoint.startswith("file://")
    path = Path(checkpoint.removeprefix("file://")) / START_FILE
    if local and path.exists():
        pinned = json.loads(path.read_text(encoding="utf-8"))
        return {g: int(pinned[g]) for g in parsed.groups if g in pinned} | \
            {g: v for g, v in _resolve(parsed).items() if g not in pinned}
    planner = Planner(parsed)
    try:
        start = planner.initial()
    finally:
        planner.close()
    if local:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(start), encoding="utf-8")
        os.replace(tmp, path)
    return start


def _resolve(parsed) -> dict[str, int]:
    from dledger_spark.source import Planner

    planner = Planner(parsed)
    try:
        return planner.initial()
    finally:
        planner.close()


class Progress:
    """Turns the query's progress reports into one line each: rows, entries/s, offsets and lag."""

    def __init__(self, parsed, out=sys.stdout):
        self.parsed = parsed
        self.out = out
        self.seen = -1
        self.rows = 0
        self._clients: dict[str, object] = {}

    def committed(self, group: str) -> int | None:
        from dledger.blocking import BlockingClient
        from dledger.errors import DLedgerError

        try:
            client = self._clients.get(group)
            if client is None:
                client = self._clients[group] = BlockingClient(self.parsed.groups[group], group, timeout=5)
            return client.find_leader(timeout=5).committed_index
        except DLedgerError:
            return None

    def report(self, query) -> None:
        for p in query.recentProgress:
            batch = p.get("batchId", -1)
            if batch <= self.seen:
                continue
            self.seen = batch
            self.rows += int(p.get("numInputRows") or 0)
            rate = float(p.get("processedRowsPerSecond") or 0.0)
            try:
                end = json.loads((p.get("sources") or [{}])[0].get("endOffset") or "{}")
            except (TypeError, ValueError):
                end = {}
            parts = []
            for group in self.parsed.groups:
                nxt = end.get(group)
                committed = self.committed(group)
                lag = "?" if committed is None or nxt is None else max(committed + 1 - int(nxt), 0)
                parts.append(f"{group} next={nxt} committed={committed} lag={lag}")
            print(f"ingest: batch {batch}: {p.get('numInputRows', 0)} rows, {rate:,.0f} entries/s; "
                  + "; ".join(parts), file=self.out, flush=True)

    def close(self) -> None:
        for client in self._clients.values():
            client.close()


def run(args) -> int:
    from dledger.errors import DLedgerError
    from dledger_spark.options import OptionError, parse_options
    from dledger_spark.reader import SourceError

    opts = source_options(args)
    try:
        parsed = parse_options(opts)
    except OptionError as exc:
        print(f"dledger ingest: {exc}", file=sys.stderr)
        return 2
    if args.trigger_interval <= 0 or args.progress_interval <= 0:
        print("dledger ingest: --trigger-interval and --progress-interval must be more than 0", file=sys.stderr)
        return 2
    conf = {}
    for item in args.conf:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"dledger ingest: --conf {item!r}: expected KEY=VALUE", file=sys.stderr)
            return 2
        conf[key] = value
    checkpoint = checkpoint_dir(args)
    try:
        start = pin_start(checkpoint, opts, parsed)
    except (SourceError, DLedgerError) as exc:
        print(f"dledger ingest: {exc}", file=sys.stderr)
        return 1
    opts["startingIndex"] = json.dumps(start)
    from dledger_spark.session import get_session

    spark = get_session(args.master, conf=conf)
    from pyspark.sql import functions as F

    df = spark.readStream.format("dledger").options(**opts).load()
    writer = (df.withColumn("date", F.to_date("ingest_time")).writeStream.format("parquet")
              .option("path", args.output).option("checkpointLocation", checkpoint)
              .partitionBy("group", "date").queryName("dledger-ingest"))
    writer = writer.trigger(availableNow=True) if args.once else \
        writer.trigger(processingTime=f"{args.trigger_interval} seconds")
    progress = Progress(parsed)
    stopping = []

    def stop(signum, frame):
        stopping.append(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    print(f"ingest: {', '.join(parsed.groups)} -> {args.output} (checkpoint {checkpoint}, start {start}, "
          f"{'once' if args.once else 'every ' + str(args.trigger_interval) + ' s'})", flush=True)
    query = writer.start()
    started = time.monotonic()
    try:
        while query.isActive and not stopping:
            query.awaitTermination(args.progress_interval)
            progress.report(query)
        if stopping:
            query.stop()
        error = query.exception()
        if error is not None:
            first = str(error).strip().splitlines()
            line = next((ln for ln in first if "dledger source:" in ln), first[0] if first else repr(error))
            line = line[line.find("dledger source:"):] if "dledger source:" in line else line
            print(f"dledger ingest: the query failed: {line.strip()}", file=sys.stderr, flush=True)
            return 1
        took = time.monotonic() - started
        print(f"ingest: {'stopped' if stopping else 'done'}: {progress.rows} rows in {took:.1f} s", flush=True)
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        progress.close()
        spark.stop()


def main(argv: list[str] | None = None) -> int:
    """``python spark/ingest.py ...`` / ``spark-submit spark/ingest.py ...``: the same as ``dledger ingest``."""
    p = argparse.ArgumentParser(prog="ingest.py", description=add_parser.__doc__)
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
