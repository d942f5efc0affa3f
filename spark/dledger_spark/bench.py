"""``dledger bench ingest``: committed entries into Parquet through Spark, and the bulk GET under it.

Phases (a 3-member group of ``twistd dledger`` processes on 127.0.0.1 unless ``--peers`` names one):

``fill``    append ``--count`` entries of ``--size`` random bytes (skipped with ``--peers``: the group's log is read)
``get``     the bulk read alone: every entry over ONE connection (``BlockingClient.get``), with the binary GET
            reply and with Java's JSON reply, interleaved ``--runs`` times; entries/s and the ratio
``ingest``  ``readStream.format("dledger")`` -> Parquet (``Trigger.AvailableNow``) on a ``local[2]`` session
            (``--master``), after a warm-up batch read into Parquet; rows/s from the query's start to its end,
            and without its first batch (which also starts Spark's Python streaming runner): steady state

Progress lines go to stdout while it runs; figures are printed, never asserted (docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

TARGET_ROWS_PER_S = 50_000


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "ingest", help="Spark ingest into Parquet, and the bulk GET (binary vs JSON) under it",
        description="Fill a 3-member group (or read --peers), time the bulk GET over one connection (binary and "
                    "JSON replies, interleaved) and a Spark ingest into Parquet; see docs/benchmarks.md.")
    p.add_argument("--peers", help="a running group to read instead of starting one")
    p.add_argument("--group", default="g0")
    p.add_argument("--count", type=int, default=200_000, help="entries to append (default 200000)")
    p.add_argument("--size", type=int, default=1024, help="body bytes (default 1024)")
    p.add_argument("--runs", type=int, default=3, help="interleaved bulk GET runs per reply form (default 3)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--read-from", default="leader", choices=("leader", "follower", "any"),
                   help="who serves the ingest's reads (default leader)")
    p.add_argument("--batches", type=int, default=2, help="micro-batches the ingest is cut into (default 2)")
    p.add_argument("--partition-bytes", type=int, default=None, help="bytes per Spark task (default 16 MiB)")
    p.add_argument("--phases", default="fill,get,ingest", help="comma-separated subset of fill,get,ingest")
    p.add_argument("--dir", dest="directory", help="working directory (default: a temporary one, removed)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON object at the end")
    p.set_defaults(func=run)


def say(text: str) -> None:
    print(text, flush=True)


def fill(client, count: int, size: int) -> float:
    """Append ``count`` random bodies in requests of 256; entries/s."""
    pool = os.urandom(size + 4096)
    started = last = time.monotonic()
    done = 0
    while done < count:
        n = min(256, count - done)
        client.append_batch([pool[(done + i) % 4096:(done + i) % 4096 + size] for i in range(n)], timeout=60)
        done += n
        now = time.monotonic()
        if now - last >= 1.0 or done == count:
            say(f"fill: {done:,}/{count:,} entries ({done / (now - started):,.0f}/s)")
            last = now
    return count / (time.monotonic() - started)


def bulk_get(peers: str, group: str, begin: int, end: int, binary: bool) -> float:
    """Read ``[begin, end]`` over one connection; entries/s."""
    from dledger.blocking import BlockingClient

    with BlockingClient(peers, group, timeout=60, binary_get=binary) as c:
        c.find_leader()  # connect first: the timing is the reads
        started = time.monotonic()
        index = begin
        n = 0
        while index <= end:
            got = c.get(index, 16384)
            if not got:
                break
            n += len(got)
            index = got[-1].index + 1
        return n / (time.monotonic() - started)


def ingest(peers: str, group: str, count: int, args, work: Path) -> dict:
    from dledger_spark.ingest import Progress
    from dledger_spark.options import parse_options
    from dledger_spark.session import get_session

    opts = {"peers": peers, "group": group, "maxEntriesPerTrigger": str(max(1, count // max(args.batches, 1))),
            "readFrom": args.read_from}
    if args.partition_bytes:
        opts["partitionBytes"] = str(args.partition_bytes)
    t0 = time.monotonic()
    spark = get_session(args.master, app_name="dledger-bench-ingest")
    session_s = time.monotonic() - t0
    say(f"ingest: Spark session ({args.master}) up in {session_s:.1f} s")
    try:
        t0 = time.monotonic()
        warm = spark.read.format("dledger").options(**opts).option("endingIndex", "2000").load()
        warm.write.mode("overwrite").parquet(str(work / "warm-up"))
        say(f"ingest: warm-up read of 2000 indexes into Parquet in {time.monotonic() - t0:.1f} s "
            "(Python workers started, the JVM's Parquet writer compiled)")
        from pyspark.sql import functions as F

        out, ck = work / "parquet", work / "checkpoint"
        query = (spark.readStream.format("dledger").options(**opts).load()
                 .withColumn("date", F.to_date("ingest_time")).writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(ck)).partitionBy("group", "date")
                 .trigger(availableNow=True).start())
        progress = Progress(parse_options(opts))
        started = time.monotonic()
        while query.isActive:
            query.awaitTermination(1.0)
            progress.report(query)
        wall = time.monotonic() - started
        progress.close()
        if query.exception() is not None:
            raise RuntimeError(f"the ingest query failed: {str(query.exception()).splitlines()[0]}")
        batches = [p for p in query.recentProgress if p.get("numInputRows")]
        rows = sum(int(p["numInputRows"]) for p in batches)
        rest = batches[1:]
        rest_ms = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in rest)
        steady = sum(int(p["numInputRows"]) for p in rest) / (rest_ms / 1000.0) if rest_ms else None
        return {"rows": rows, "wall_s": round(wall, 2), "rows_per_s": round(rows / wall), "batches": len(batches),
                "steady_rows_per_s": round(steady) if steady else None, "session_start_s": round(session_s, 1)}
    finally:
        spark.stop()


def run(args) -> int:
    from dledger.blocking import BlockingClient
    from dledger.launcher import LocalGroup, durable_store

    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"fill", "get", "ingest"}
    if unknown or args.count < 1 or args.size < 0 or args.runs < 1:
        print(f"dledger bench ingest: bad arguments ({', '.join(sorted(unknown)) or 'count/size/runs'})",
              file=sys.stderr)
        return 2
    work = Path(args.directory) if args.directory else Path(tempfile.mkdtemp(prefix="dledger-bench-ingest-"))
    work.mkdir(parents=True, exist_ok=True)
    local = None
    results: dict = {"count": args.count, "size": args.size, "read_from": args.read_from,
                     "load_average_start": round(os.getloadavg()[0], 1)}
    try:
        peers = args.peers
        if peers is None:
            local = LocalGroup(work / "group", n=3, group=args.group, store=durable_store() or "mmap",
                               preset="fast", options={"mappedFileSizeForEntryData": 256 << 20})
            local.start()
            peers = local.peers
            say(f"group: 3 members ({local.store}) on {peers}")
        with BlockingClient(peers, args.group, timeout=60) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    meta = client.find_leader(timeout=5)
                    break
                except Exception:  # members still starting
                    if time.monotonic() > deadline:
                        raise
            if "fill" in phases and args.peers is None:
                results["fill_entries_per_s"] = round(fill(client, args.count, args.size))
            meta = client.find_leader()
        begin, end = max(meta.ledger_begin_index, 0), meta.committed_index
        say(f"log: indexes {begin}..{end} committed")
        if "get" in phases:
            runs: dict[str, list[float]] = {"binary": [], "json": []}
            for r in range(args.runs):
                for form in ("binary", "json"):  # interleaved: the machine's load hits both alike
                    rate = bulk_get(peers, args.group, begin, end, form == "binary")
                    runs[form].append(rate)
                    say(f"get: run {r + 1}/{args.runs} {form}: {rate:,.0f} entries/s over one connection")
            b, j = statistics.median(runs["binary"]), statistics.median(runs["json"])
            results["get"] = {"binary_entries_per_s": [round(x) for x in runs["binary"]],
                              "json_entries_per_s": [round(x) for x in runs["json"]],
                              "median_ratio": round(b / j, 2)}
            say(f"get: median binary {b:,.0f} entries/s, JSON {j:,.0f} entries/s: {b / j:.2f}x")
        if "ingest" in phases:
            results["ingest"] = ingest(peers, args.group, end - begin + 1, args, work)
            i = results["ingest"]
            say(f"ingest (readFrom={args.read_from}): {i['rows']:,} rows into Parquet in {i['wall_s']} s: "
                f"{i['rows_per_s']:,} rows/s "
                f"({i['batches']} batches; without the first: {i['steady_rows_per_s'] or 0:,} rows/s; "
                f"target {TARGET_ROWS_PER_S:,})")
    finally:
        if local is not None:
            local.close()
        if not args.directory:
            shutil.rmtree(work, ignore_errors=True)
    results["load_average_end"] = round(os.getloadavg()[0], 1)
    say(f"load average (1 min): {results['load_average_start']} at the start, {results['load_average_end']} at the "
        f"end, on {os.cpu_count()} cores (other processes' load slows every figure)")
    if args.json:
        print(json.dumps(results, sort_keys=True))
    return 0
