"""The ingest's floor: the driver JVM's CPU per row of Spark writing the ingest's rows from an in-JVM source.

``python spark/ingest_floor.py [--rows N] [--rounds R] [--variants a,b] [--conf KEY=VALUE ...]``

What any reader of dledger's entries, however fast (a JVM-side data source included), still pays in Spark:
the rows of the ``raw`` schema (``group, index, term, pos``, a 1 KiB binary ``body``, ``ingest_time``) with
the ingest's ``date`` column, written as Parquet partitioned by ``group`` and ``date``, in a session with the
ingest's settings (:func:`dledger_spark.session.get_session`: ``local[2]``, its JVM options, the class
archive if one is recorded).  The rows come from ``spark.range``: each body is 1 KiB of a 4 MiB random
literal at a stride of 7,919 bytes, so no two bodies within a 64 KiB snappy block share bytes (as random
bodies do not) and Parquet's dictionary falls back to plain as it does on real bodies.

Variants, run interleaved round after round in one JVM (the first round pays class loading and JIT):

* ``noop``: the same rows into Spark's ``noop`` sink -- the source's own cost, to subtract;
* ``parquet``: the ingest's write (snappy, dictionaries, page checksums: Spark's and Parquet's defaults);
* ``lean``: the same without compression, dictionaries or page checksums;
* ``nopart``: ``parquet`` without ``partitionBy`` (the dynamic partition writer's share);
* ``nobody``: ``parquet`` without the ``body`` column (the small columns' and the partitioning's share).

Each line printed is one JSON object: variant, round, rows, the JVM's CPU seconds (``/proc``, every thread:
GC and JIT included), wall seconds, CPU us per row and the 1-minute load.  Figures: docs/benchmarks.md
"Round 2g: the ingest's floor (spark6)".  A measurement, never a test.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

#: The random literal the bodies are cut from, and one body's length.
BLOB_BYTES = 4 << 20
BODY_BYTES = 1024
#: The stride between consecutive rows' bodies in the literal (a prime larger than a body).
STRIDE = 7919
VARIANTS = ("noop", "parquet", "lean", "nopart", "nobody")


def parse(argv):
    p = argparse.ArgumentParser(prog="ingest_floor.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=300_000, help="rows per write (default 300000)")
    p.add_argument("--rounds", type=int, default=4, help="rounds of every variant (default 4; the first warms up)")
    p.add_argument("--variants", default="noop,parquet,lean", help=f"comma-separated of {', '.join(VARIANTS)}")
    p.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting (repeatable)")
    p.add_argument("--output", help="where the Parquet goes (default: a temporary directory)")
    args = p.parse_args(argv)
    args.variants = [v for v in args.variants.split(",") if v]
    unknown = set(args.variants) - set(VARIANTS)
    if unknown or args.rows < 1 or args.rounds < 1:
        p.error(f"bad arguments: {', '.join(sorted(unknown)) or 'rows/rounds'}")
    return args


def rows(spark, n: int):
    """``n`` rows of the ``raw`` schema plus ``date``, made in the JVM (module docstring)."""
    from pyspark.sql import functions as F

    blob = bytearray(os.urandom(BLOB_BYTES))
    start = F.expr(f"cast((id * {STRIDE}) % {BLOB_BYTES - BODY_BYTES} + 1 as int)")
    return (spark.range(0, n, 1, 2)
            .select(F.lit("default").alias("group"), F.col("id").alias("index"),
                    F.lit(1).cast("bigint").alias("term"), (F.col("id") * 1100).alias("pos"),
                    F.lit(blob).substr(start, F.lit(BODY_BYTES)).alias("body"),
                    F.current_timestamp().alias("ingest_time"))
            .withColumn("date", F.to_date("ingest_time")))


def write(df, variant: str, path: str) -> None:
    """Write ``df`` as ``variant`` does (module docstring)."""
    if variant == "noop":
        df.write.format("noop").mode("overwrite").save()
        return
    if variant == "nobody":
        df = df.drop("body")
    w = df.write.mode("overwrite")
    if variant != "nopart":
        w = w.partitionBy("group", "date")
    if variant == "lean":
        w = (w.option("compression", "none").option("parquet.enable.dictionary", "false")
             .option("parquet.page.write-checksum.enabled", "false"))
    w.parquet(path)


def jvm_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main(argv=None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    from dledger_spark.session import get_session, stop_session

    spark = get_session(app_name="dledger-ingest-floor", conf=dict(kv.split("=", 1) for kv in args.conf))
    pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
    out = args.output or tempfile.mkdtemp(prefix="dledger-floor-")
    df = rows(spark, args.rows)
    try:
        for r in range(args.rounds):
            for variant in args.variants:
                c0, t0 = jvm_cpu(pid), time.monotonic()
                write(df, variant, os.path.join(out, variant))
                cpu, wall = jvm_cpu(pid) - c0, time.monotonic() - t0
                print(json.dumps({"variant": variant, "round": r, "rows": args.rows, "jvm_cpu_s": round(cpu, 2),
                                  "wall_s": round(wall, 2), "jvm_us_per_row": round(cpu / args.rows * 1e6, 2),
                                  "load1": round(os.getloadavg()[0], 2)}), flush=True)
    finally:
        stop_session(spark)
        if args.output is None:
            import shutil

            shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
