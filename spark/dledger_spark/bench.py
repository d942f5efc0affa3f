"""``dledger bench ingest``: committed entries into Parquet through Spark, and the bulk GET under it.

Phases (a 3-member group of ``twistd dledger`` processes on 127.0.0.1 unless ``--peers`` names one):

``fill``    append ``--count`` entries of ``--size`` random bytes (skipped with ``--peers``: the group's log is read)
``get``     the bulk read alone: every entry over ONE connection (``BlockingClient.get``), with the binary GET
            reply and with Java's JSON reply, interleaved ``--runs`` times; entries/s and the ratio
``ingest``  ``readStream.format("dledger")`` -> Parquet (``Trigger.AvailableNow``) on a ``local[2]`` session
            (``--master``): rows/s from the session being up to the query's end (only the session's own
            start -- the JVM's -- left out), the time to the first committed rows from the ingest's start,
            and the CPU seconds per row of Spark's processes against the plain client's read (``get``); the
            driver JVM's garbage collections (count, seconds) at the session's start, the first rows and the end;
            with the prestart read as ``dledger ingest`` runs it (``--no-prestart``: without, for A/B runs)

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
    p.add_argument("--reply", default="both", choices=("both", "binary"),
                   help="GET reply forms the get phase times (default both; binary: the plain client's read only)")
    p.add_argument("--master", default="local[2]", help="Spark master (default local[2])")
    p.add_argument("--read-from", default="leader", choices=("leader", "follower", "any"),
                   help="who serves the ingest's reads (default leader)")
    p.add_argument("--batches", type=int, default=1,
                   help="micro-batches the ingest is cut into with maxEntriesPerTrigger (default 1: as dledger "
                        "ingest --once cuts it)")
    p.add_argument("--warm-up", action="store_true",
                   help="read 2000 indexes into Parquet before the ingest and leave that out of its time "
                        "(the figures of round 1; default: the ingest is timed from the session's start)")
    p.add_argument("--member-pids", default="",
                   help="with --peers: comma-separated pids of its members, whose CPU is then counted")
    p.add_argument("--partition-bytes", type=int, default=None, help="bytes per Spark task (default 128 MiB)")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                   help="extra Spark configuration of the ingest's session (as dledger ingest --conf)")
    p.add_argument("--no-prestart", dest="prestart", action="store_false",
                   help="the ingest without its prestart read (dledger ingest --no-prestart), for A/B runs")
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


def bulk_get(peers: str, group: str, begin: int, end: int, binary: bool, members=()) -> dict:
    """Read ``[begin, end]`` over one connection: entries/s, and CPU seconds per entry of this process and the members.

    ``members``: pids of the group's members (their CPU is counted too; none for a group the bench did not start).
    """
    from dledger.blocking import BlockingClient
    from dledger_spark.proctree import cpu_of

    with BlockingClient(peers, group, timeout=60, binary_get=binary) as c:
        c.find_leader()  # connect first: the timing is the reads
        started, cpu0, members0 = time.monotonic(), time.process_time(), cpu_of(members)
        index = begin
        n = 0
        while index <= end:
            got = c.get(index, 16384)
            if not got:
                break
            n += len(got)
            index = got[-1].index + 1
        wall = time.monotonic() - started
        cpu, members_cpu = time.process_time() - cpu0, cpu_of(members) - members0
    return {"entries_per_s": n / wall, "rows": n, "client_cpu_us_per_row": cpu / max(n, 1) * 1e6,
            "members_cpu_us_per_row": members_cpu / max(n, 1) * 1e6 if members else None}


def jvm_gc(spark) -> list | None:
    """``[collections, seconds]`` of the driver JVM's garbage collectors since it started (None if unknown).

    On a local master the driver is the executor too, so this is every collection of the ingest's JVM;
    pauses are part of its CPU figure, this says how much (docs/benchmarks.md "Round 2c").
    """
    try:
        beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
        return [sum(int(b.getCollectionCount()) for b in beans),
                round(sum(int(b.getCollectionTime()) for b in beans) / 1000.0, 2)]
    except Exception:  # a session without a local gateway (Spark Connect): no figure
        return None


def gc_text(gc: list | None) -> str:
    return "unknown" if gc is None else f"{gc[0]} collections, {gc[1]} s"


def ingest(peers: str, group: str, count: int, args, work: Path, members=()) -> dict:
    """The ingest as ``dledger ingest --once`` runs it, timed from the session being up (the JVM start apart).

    ``first_row_s``: from the ingest's start (before the session) to the first micro-batch committed with
    rows; ``rows_per_s``: rows over the time from the session being up to the query's end (every batch,
    planning and the Python workers' start included).  CPU: every process below this one (the driver JVM,
    its Python workers, this process) except the members, whose CPU is counted apart.
    """
    from dledger_spark.ingest import PRESTART_JOIN_S, Progress
    from dledger_spark.options import parse_options
    from dledger_spark.prestart import prestart
    from dledger_spark.proctree import cpu_of, tree_cpu_split
    from dledger_spark.session import get_session, stop_session

    opts = {"peers": peers, "group": group, "readFrom": args.read_from}
    if args.batches > 1:
        opts["maxEntriesPerTrigger"] = str(max(1, count // args.batches))
    if args.partition_bytes:
        opts["partitionBytes"] = str(args.partition_bytes)
    t0 = time.monotonic()
    conf = dict(item.split("=", 1) for item in args.conf if "=" in item)
    spark = get_session(args.master, app_name="dledger-bench-ingest", conf=conf, record_archive=True)
    up = time.monotonic()
    session_s = up - t0
    gc = {"session": jvm_gc(spark)}
    say(f"ingest: Spark session ({args.master}) up in {session_s:.1f} s (JVM GC so far: {gc_text(gc['session'])})")
    warming = None
    try:
        warm_s = None
        if args.warm_up:
            warm = spark.read.format("dledger").options(**opts).option("endingIndex", "2000").load()
            warm.write.mode("overwrite").parquet(str(work / "warm-up"))
            warm_s = time.monotonic() - up
            say(f"ingest: warm-up read of 2000 indexes into Parquet in {warm_s:.1f} s (not counted)")
        from pyspark.sql import functions as F

        out, ck = work / "parquet", work / "checkpoint"
        split0, members0 = tree_cpu_split(set(members)), cpu_of(members)
        started = time.monotonic()
        stream = spark.readStream.format("dledger").options(**opts).load()
        if args.prestart:  # as dledger ingest does (dledger_spark.prestart)
            warming = prestart(spark, opts)
        query = (stream.withColumn("date", F.to_date("ingest_time")).writeStream.format("parquet")
                 .option("path", str(out)).option("checkpointLocation", str(ck)).partitionBy("group", "date")
                 .trigger(availableNow=True).start())
        progress = Progress(parse_options(opts))
        first_row = None
        last_report = started
        while query.isActive:
            query.awaitTermination(0.2)
            now = time.monotonic()
            if first_row is None and any(p.get("numInputRows") for p in query.recentProgress):
                first_row = now - t0
                gc["first_row"] = jvm_gc(spark)
                say(f"ingest: first rows committed {first_row:.1f} s after the ingest's start (JVM GC so far: "
                    f"{gc_text(gc['first_row'])})")
            if now - last_report >= 1.0:
                progress.report(query)
                last_report = now
        ended = time.monotonic()
        gc["end"] = jvm_gc(spark)
        progress.report(query)
        split1, members_cpu = tree_cpu_split(set(members)), cpu_of(members) - members0
        split = {k: v - split0.get(k, 0.0) for k, v in split1.items()}
        cpu = sum(split.values())
        progress.close()
        if query.exception() is not None:
            raise RuntimeError(f"the ingest query failed: {str(query.exception()).splitlines()[0]}")
        batches = [p for p in query.recentProgress if p.get("numInputRows")]
        rows = sum(int(p["numInputRows"]) for p in batches)
        rest = batches[1:]
        rest_ms = sum(int(p["durationMs"].get("triggerExecution", 0)) for p in rest)
        steady = sum(int(p["numInputRows"]) for p in rest) / (rest_ms / 1000.0) if rest_ms else None
        wall = ended - (started if args.warm_up else up)
        return {"rows": rows, "wall_s": round(wall, 2), "rows_per_s": round(rows / wall), "batches": len(batches),
                "query_s": round(ended - started, 2), "first_row_s": round(first_row, 1) if first_row else None,
                "steady_rows_per_s": round(steady) if steady else None, "session_start_s": round(session_s, 1),
                "warm_up_s": round(warm_s, 1) if warm_s is not None else None,
                "spark_cpu_us_per_row": round(cpu / max(rows, 1) * 1e6, 1),
                "spark_cpu_split_us_per_row": {k: round(v / max(rows, 1) * 1e6, 1) for k, v in sorted(split.items())},
                "members_cpu_us_per_row": round(members_cpu / max(rows, 1) * 1e6, 1) if members else None,
                "jvm_gc": gc, "prestart": bool(args.prestart)}
    finally:
        if warming is not None:
            warming.join(PRESTART_JOIN_S)
        stop_session(spark)  # and keeps the JVM's class archive it recorded, if any (session.get_session)


def run(args) -> int:
    from dledger.blocking import BlockingClient
    from dledger.launcher import LocalGroup, durable_store

    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"fill", "get", "ingest"}
    pids = [x.strip() for x in args.member_pids.split(",") if x.strip()]
    if not all(x.isdigit() for x in pids) or not all("=" in item for item in args.conf):
        print("dledger bench ingest: --member-pids takes pids separated by commas, --conf KEY=VALUE",
              file=sys.stderr)
        return 2
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
        members = [m.pid for m in local.members.values()] if local is not None else \
            [int(x) for x in pids]
        if "get" in phases:
            runs: dict[str, list[dict]] = {"binary": [], "json": []}
            for r in range(args.runs):
                forms = ("binary", "json") if args.reply == "both" else ("binary",)
                for form in forms:  # interleaved: the machine's load hits both alike
                    got = bulk_get(peers, args.group, begin, end, form == "binary", members)
                    runs[form].append(got)
                    say(f"get: run {r + 1}/{args.runs} {form}: {got['entries_per_s']:,.0f} entries/s over one "
                        f"connection, {got['client_cpu_us_per_row']:.1f} us CPU per entry in the client")
            b = statistics.median(g["entries_per_s"] for g in runs["binary"])
            j = statistics.median(g["entries_per_s"] for g in runs["json"]) if runs["json"] else b
            cpu = statistics.median(g["client_cpu_us_per_row"] for g in runs["binary"])
            mcpu = [g["members_cpu_us_per_row"] for g in runs["binary"] if g["members_cpu_us_per_row"] is not None]
            results["get"] = {"binary_entries_per_s": [round(g["entries_per_s"]) for g in runs["binary"]],
                              "json_entries_per_s": [round(g["entries_per_s"]) for g in runs["json"]],
                              "median_ratio": round(b / j, 2), "client_cpu_us_per_row": round(cpu, 1),
                              "members_cpu_us_per_row": round(statistics.median(mcpu), 1) if mcpu else None}
            say(f"get: median binary {b:,.0f} entries/s, JSON {j:,.0f} entries/s: {b / j:.2f}x")
        if "ingest" in phases:
            results["ingest"] = ingest(peers, args.group, end - begin + 1, args, work, members)
            i = results["ingest"]
            say(f"ingest (readFrom={args.read_from}): {i['rows']:,} rows into Parquet in {i['wall_s']} s after the "
                f"session's start: {i['rows_per_s']:,} rows/s (target {TARGET_ROWS_PER_S:,}; {i['batches']} batches; "
                f"without the first: {i['steady_rows_per_s'] or 0:,} rows/s); first rows {i['first_row_s']} s "
                f"after the start (session {i['session_start_s']} s); {i['spark_cpu_us_per_row']} us CPU per row "
                f"in Spark's processes; JVM GC: {gc_text(i['jvm_gc']['end'])}")
            if "get" in phases:
                read = results["get"]
                ratio = i["spark_cpu_us_per_row"] / max(read["client_cpu_us_per_row"], 1e-9)
                results["cost_ratio"] = round(ratio, 2)
                line = (f"cost per row: ingest {i['spark_cpu_us_per_row']} us in Spark's processes vs "
                        f"{read['client_cpu_us_per_row']} us in the plain client reading the same entries: "
                        f"{ratio:.2f}x")
                if i["members_cpu_us_per_row"] is not None and read["members_cpu_us_per_row"] is not None:
                    both = (i["spark_cpu_us_per_row"] + i["members_cpu_us_per_row"]) / \
                        max(read["client_cpu_us_per_row"] + read["members_cpu_us_per_row"], 1e-9)
                    results["cost_ratio_with_members"] = round(both, 2)
                    line += f"; members included: {both:.2f}x"
                say(line)
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
