"""Spark sessions for ingest: a local ``local[2]`` one by default, or whatever ``spark-submit`` set up.

Python data sources run in Python workers that Spark starts with ``PYSPARK_PYTHON`` (``python3`` from
PATH when unset) -- which would not have dledger installed.  :func:`ensure_python` points it at the
running interpreter (its environment has dledger-spark) unless the operator chose one; :func:`register`
does the same for the ``dledger`` source alone in a session someone else made.
"""

from __future__ import annotations

import os
import sys

#: A small local session: the UI off, few shuffle partitions (ingest has no shuffle worth more).
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
}

#: A local master's driver JVM (the driver is the executor there).  A 1M-row ingest measured 18.6 instead of
#: 27 us of JVM CPU per row with the client compiler only (C2's compilations cost more than they gain in a
#: run of a minute or two) and the parallel collector (cheaper write barriers than G1 on 2 cores):
#: docs/benchmarks.md "Spark ingest (perf-spark)".  A long-running stream may prefer C2:
#: ``--conf spark.driver.extraJavaOptions=`` (empty) restores the JVM's defaults.
LOCAL_JVM_CONF = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC",
}


def ensure_python() -> str:
    """Set ``PYSPARK_PYTHON`` (and the driver's) to this interpreter when unset; the value in force."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return os.environ["PYSPARK_PYTHON"]


def under_spark_submit() -> bool:
    """True when this process is a driver started by ``spark-submit`` (it decides the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def worker_python(spark, python: str | None = None) -> str | None:
    """The interpreter the ``dledger`` source's Python workers should run (None: leave the session's).

    In order: ``python``; the session's ``spark.pyspark.python``; ``PYSPARK_PYTHON`` (Spark's own choice,
    left alone); on a local master, this interpreter -- Spark's default, ``python3`` from PATH, is
    usually another environment, without dledger-spark (``ModuleNotFoundError: No module named
    'dledger_spark'``).  On a cluster Spark's choice stands: its hosts have their own interpreters.
    """
    if python:
        return python
    conf = spark.sparkContext.getConf()
    chosen = conf.get("spark.pyspark.python", None)
    if chosen:
        return chosen
    if os.environ.get("PYSPARK_PYTHON"):
        return None
    if (conf.get("spark.master", "") or "").startswith("local"):
        return sys.executable
    return None


def register(spark, python: str | None = None) -> None:
    """Register the ``dledger`` data source with ``spark``; its workers run :func:`worker_python`.

    A registered Python data source carries the interpreter its workers run (the SparkContext's
    ``pythonExec`` when registered), so this changes nothing for the session's other Python code.
    """
    from dledger_spark.source import DLedgerDataSource

    sc = getattr(spark, "sparkContext", None) if not _is_connect(spark) else None
    exe = worker_python(spark, python) if sc is not None else None
    if exe is None:
        spark.dataSource.register(DLedgerDataSource)
        return
    before = sc.pythonExec
    sc.pythonExec = exe
    try:
        spark.dataSource.register(DLedgerDataSource)
    finally:
        sc.pythonExec = before


def _is_connect(spark) -> bool:
    """A Spark Connect session: its server starts the workers, there is no SparkContext here."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def session_conf(master: str | None, submitted: bool, conf: dict | None = None) -> dict[str, str]:
    """The configuration :func:`get_session` gives a session of ``master`` (None: ``local[2]`` unless
    ``submitted``, i.e. under spark-submit, whose master and settings hold); ``conf`` (``--conf``) wins."""
    out: dict[str, str] = {}
    if master is not None or not submitted:
        out.update(LOCAL_CONF)
        if (master or "local[2]").startswith("local"):
            out.update(LOCAL_JVM_CONF)
    return {**out, **(conf or {})}


def get_session(master: str | None = None, app_name: str = "dledger-ingest", conf: dict | None = None):
    """A SparkSession with the ``dledger`` source registered.

    ``master`` None: ``local[2]``, unless running under ``spark-submit`` (then its ``--master`` holds).
    """
    ensure_python()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None or not under_spark_submit():
        builder = builder.master(master or "local[2]")
    for key, value in session_conf(master, under_spark_submit(), conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
