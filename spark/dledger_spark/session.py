"""Spark sessions for ingest: a local ``local[2]`` one by default, or whatever ``spark-submit`` set up.

Python data sources run in Python workers that Spark starts with ``PYSPARK_PYTHON`` (``python3`` from
PATH when unset) -- which would not have dledger installed.  :func:`ensure_python` points it at the
running interpreter (its environment has dledger-spark) unless the operator chose one.
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


def ensure_python() -> str:
    """Set ``PYSPARK_PYTHON`` (and the driver's) to this interpreter when unset; the value in force."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    return os.environ["PYSPARK_PYTHON"]


def under_spark_submit() -> bool:
    """True when this process is a driver started by ``spark-submit`` (it decides the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def register(spark) -> None:
    """Register the ``dledger`` data source with ``spark``."""
    from dledger_spark.source import DLedgerDataSource

    spark.dataSource.register(DLedgerDataSource)


def get_session(master: str | None = None, app_name: str = "dledger-ingest", conf: dict | None = None):
    """A SparkSession with the ``dledger`` source registered.

    ``master`` None: ``local[2]``, unless running under ``spark-submit`` (then its ``--master`` holds).
    """
    ensure_python()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None or not under_spark_submit():
        builder = builder.master(master or "local[2]")
        for key, value in LOCAL_CONF.items():
            builder = builder.config(key, value)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
