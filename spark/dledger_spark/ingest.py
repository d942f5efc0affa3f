"""``dledger ingest`` (and ``spark/ingest.py`` for ``spark-submit``): committed entries into Parquet, exactly once.

A Structured Streaming query: ``readStream.format("dledger")`` -> Parquet files partitioned by ``group`` and
``date`` (of ``ingest_time``), with a checkpoint.  Spark's file sink commits each micro-batch atomically
(``_spark_metadata``) and replays an unfinished batch with the offsets its offset log holds, so a killed
and restarted ingest writes every index exactly once.  The start offsets are pinned in the checkpoint
(``dledger-start.json``) the first time, so ``startingIndex=latest`` (or ``earliest`` after retention)
means the same indexes when the first batch is replayed.  ``--once`` runs ``Trigger.AvailableNow``:
everything committed when it starts, then exit.

A secured group (``authMode`` tls or secret, docs/security.md) is read with the ``dledger`` CLI's
credential options: ``--tls-ca``/``--tls-cert``/``--tls-key`` or ``--client-name``/``--token-file``.

Exit status: 0 done (or stopped by SIGTERM / Ctrl-C), 1 the query failed or could not start (one line on
stderr; a wrong group, a checkpoint of other groups, an unwritable output, unreachable members are
found before anything is written), 2 bad arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

from dledger.commands.argtypes import add_secret_options, add_tls_options

START_FILE = "dledger-start.json"
#: Seconds the end of an ingest waits for the prestart read (an empty read: long done by then).
PRESTART_JOIN_S = 60.0


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
    p.add_argument("--partition-bytes", type=int, help="target bytes per Spark task (default 128 MiB)")
    p.add_argument("--progress-interval", type=float, default=5.0, metavar="SECONDS",
                   help="seconds between progress lines (default 5)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="extra Spark configuration")
    p.add_argument("--no-prestart", dest="prestart", action="store_false",
                   help="do not start the source's Python processes beside the query's start (an empty batch read "
                        "that makes the first rows come sooner; see docs/operations.md)")
    # The same names, defaults and meaning as the dledger client commands' (dledger/commands/client.py).
    sec = p.add_argument_group("security (members with TLS or authMode tls/secret; docs/security.md)")
    add_tls_options(sec)
    add_secret_options(sec)


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
                       ("partitionBytes", args.partition_bytes), ("tlsCa", args.tls_ca), ("tlsCert", args.tls_cert),
                       ("tlsKey", args.tls_key), ("clientName", args.client_name), ("tokenFile", args.token_file)):
        if value is not None:
            opts[key] = str(value)
    return opts


def checkpoint_dir(args) -> str:
    if args.checkpoint:
        return args.checkpoint
    out = args.output.rstrip("/")
    return out + ".checkpoint"


class IngestError(RuntimeError):
    """The ingest cannot start: one line, exit status 1."""


def local_path(location: str) -> Path | None:
    """The local path of a directory location (a path or ``file://``), None for any other URI."""
    if location.startswith("file://"):
        return Path(location.removeprefix("file://"))
    return None if "://" in location else Path(location)


def unwritable(location: str, what: str) -> str | None:
    """Why Spark could not create or write the local directory ``location``; None if it can (or a remote URI).

    Only looks: nothing is created, so a refused ingest leaves no trace.
    """
    path = local_path(location)
    if path is None:
        return None
    path = path.absolute()
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        return f"{what} {location} cannot be created: {probe} is not a directory"
    if not os.access(probe, os.W_OK | os.X_OK):
        return f"{what} {location} is not writable: no write permission on {probe}" if probe == path else \
            f"{what} {location} cannot be created: no write permission on {probe}"
    return None


def pin_start(checkpoint: str, opts: dict[str, str], parsed) -> dict[str, int]:
    """The start offsets of this ingest: from the checkpoint's pin file, else resolved now and pinned there.

    The pin file names the groups the checkpoint was started with: one of other groups is refused
    (IngestError) before anything is read or written.  Only for local checkpoints (a path); for a
    remote URI the start is resolved by the source each run (and the source refuses offsets of other
    groups when the query plans its first batch).
    """
    from dledger_spark.planning import foreign_groups
    from dledger_spark.source import Planner

    local = local_path(checkpoint) is not None
    path = Path(checkpoint.removeprefix("file://")) / START_FILE
    if local and path.exists():
        try:
            pinned = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(pinned, dict):
                raise ValueError("not a JSON object")
            pinned = {str(g): int(v) for g, v in pinned.items()}
        except (OSError, ValueError, TypeError) as exc:
            raise IngestError(f"checkpoint {checkpoint}: {START_FILE} is unreadable ({exc}): restore it, or start "
                              "a new checkpoint") from None
        problem = foreign_groups(pinned, parsed.groups)
        if problem is not None:
            raise IngestError(f"checkpoint {checkpoint}: {problem}")
        return {g: pinned[g] for g in parsed.groups if g in pinned} | \
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

    def __init__(self, parsed, out=None):
        self.parsed = parsed
        self.out = out  # None: sys.stdout when a line is printed (not the one at import)
        self.seen = -1
        self.rows = 0
        self._clients: dict[str, object] = {}

    def committed(self, group: str) -> int | None:
        from dledger.blocking import BlockingClient
        from dledger.errors import ConfigError, DLedgerError

        try:
            client = self._clients.get(group)
            if client is None:
                client = self._clients[group] = BlockingClient(self.parsed.groups[group], group, timeout=5,
                                                               credentials=self.parsed.credentials.build(group))
            return client.find_leader(timeout=5).committed_index
        except (DLedgerError, ConfigError):
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
                  + "; ".join(parts), file=self.out or sys.stdout, flush=True)

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
    fresh = [p for p in (local_path(args.output), local_path(checkpoint)) if p is not None and not p.exists()]
    try:
        for location, what in ((args.output, "output"), (checkpoint, "checkpoint")):
            problem = unwritable(location, what)
            if problem is not None:
                raise IngestError(problem)
        start = pin_start(checkpoint, opts, parsed)
    except (IngestError, SourceError, DLedgerError) as exc:
        print(f"dledger ingest: {exc}", file=sys.stderr)
        return 1
    opts["startingIndex"] = json.dumps(start)
    try:
        spark, query, progress, warming = start_query(args, opts, parsed, conf, checkpoint, start)
    except Exception as exc:  # Spark could not start it (a remote output it cannot write, a bad --conf ...)
        for path in fresh:  # what this run created: nothing ran, nothing to keep
            shutil.rmtree(path, ignore_errors=True)
        print(f"dledger ingest: the query could not start: {one_line(exc)}", file=sys.stderr, flush=True)
        return 1
    return watch(args, spark, query, progress, warming)


def one_line(exc: BaseException) -> str:
    """The line of a (Py4J, Spark) error that says what went wrong: a ``dledger source:`` line, or the first
    line of the Java exception, or of the message."""
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    lines = [ln.strip().lstrip(": ").strip() for ln in text.strip().splitlines()]
    lines = [ln for ln in lines if ln and not ln.startswith("An error occurred while calling")]
    line = next((ln for ln in lines if "dledger source:" in ln), lines[0] if lines else repr(exc))
    return line[line.find("dledger source:"):] if "dledger source:" in line else line


def start_query(args, opts: dict[str, str], parsed, conf: dict[str, str], checkpoint: str, start: dict):
    """The SparkSession, the started streaming query into Parquet, its Progress, and the prestart thread (or None)."""
    from dledger_spark.prestart import prestart
    from dledger_spark.session import get_session

    # --once records the driver JVM's class archive the first time (session.stop_session keeps it): a
    # continuous ingest is stopped by a signal, whose grace period the archive's write should not eat.
    spark = get_session(args.master, conf=conf, record_archive=args.once)
    warming = None
    try:
        from pyspark.sql import functions as F

        df = spark.readStream.format("dledger").options(**opts).load()
        if getattr(args, "prestart", True):  # after load(): its create_data_source worker is then idle, reused
            warming = prestart(spark, opts)  # the source's other Python processes start beside the query's
        writer = (df.withColumn("date", F.to_date("ingest_time")).writeStream.format("parquet")
                  .option("path", args.output).option("checkpointLocation", checkpoint)
                  .partitionBy("group", "date").queryName("dledger-ingest"))
        writer = writer.trigger(availableNow=True) if args.once else \
            writer.trigger(processingTime=f"{args.trigger_interval} seconds")
        print(f"ingest: {', '.join(parsed.groups)} -> {args.output} (checkpoint {checkpoint}, start {start}, "
              f"{'once' if args.once else 'every ' + str(args.trigger_interval) + ' s'})", flush=True)
        return spark, writer.start(), Progress(parsed), warming
    except BaseException:
        if warming is not None:
            warming.join(PRESTART_JOIN_S)
        spark.stop()
        raise


def watch(args, spark, query, progress: Progress, warming=None) -> int:
    """Report progress until the query ends (or SIGTERM / Ctrl-C stops it); the exit status."""
    stopping = []

    def stop(signum, frame):
        stopping.append(signum)

    old = {s: signal.signal(s, stop) for s in (signal.SIGTERM, signal.SIGINT)}
    started = time.monotonic()
    try:
        while query.isActive and not stopping:
            query.awaitTermination(args.progress_interval)
            progress.report(query)
        if stopping:
            query.stop()
        error = query.exception()
        if error is not None:
            print(f"dledger ingest: the query failed: {one_line(error)}", file=sys.stderr, flush=True)
            return 1
        took = time.monotonic() - started
        print(f"ingest: {'stopped' if stopping else 'done'}: {progress.rows} rows in {took:.1f} s", flush=True)
        return 0
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
        progress.close()
        if warming is not None:
            warming.join(PRESTART_JOIN_S)
        from dledger_spark.session import stop_session

        stop_session(spark)


def main(argv: list[str] | None = None) -> int:
    """``python spark/ingest.py ...`` / ``spark-submit spark/ingest.py ...``: the same as ``dledger ingest``."""
    p = argparse.ArgumentParser(prog="ingest.py", description=add_parser.__doc__)
    add_arguments(p)
    args = p.parse_args(argv)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
