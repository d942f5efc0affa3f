"""Start the ``dledger`` source's Python processes beside a streaming query's start, not after it.

A stream's first micro-batch waits for Python processes Spark starts one after the other, each a fresh
interpreter importing pyspark and the source: ``create_data_source`` (the query's ``load()``), the
streaming runner (``start()``: the offsets), ``plan_data_source_read`` (the read function), then the
executor's ``pyspark.daemon`` and its worker (the read itself, with its client's reactor thread).  Spark
keeps the last two daemons, and their workers between tasks (``spark.python.worker.reuse``, on by
default), for the rest of the session.

:func:`prestart` runs, in a thread, a batch read of the same group(s) with the same options that reads
nothing (``startingIndex`` = ``endingIndex`` = 0: one empty task, planned without asking the members) into
the ``noop`` sink.  That read needs the same ``plan_data_source_read`` daemon and the same executor daemon
as the stream's read, so they start while the streaming runner starts and plans the first batch: the
stream's planning reuses the planner's worker, and its first task finds the executor's daemon up (and its
worker, with the source imported and the read's client built, when the prestart's task got there first).
Nothing is written and no entry is read; a failure is only logged at debug level (the stream's own read
reports the real problem).  docs/benchmarks.md "Round 2e" has the timeline and what it bought.
"""

from __future__ import annotations

import logging
import threading  # allowed: Spark driver code (one background batch read), not the reactor core

log = logging.getLogger("dledger_spark")


def prestart_options(options: dict[str, str]) -> dict[str, str]:
    """The options of the prestart read: the stream's, reading nothing (``[0, 0)`` of every group)."""
    out = {k: v for k, v in options.items() if k not in ("maxEntriesPerTrigger", "startingIndex", "endingIndex")}
    out["startingIndex"] = out["endingIndex"] = "0"  # empty by the options: the planner asks no member
    return out


def prestart(spark, options: dict[str, str]) -> threading.Thread:
    """Start the empty batch read of :func:`prestart_options` in a thread (join it before stopping ``spark``)."""
    def run():
        try:
            (spark.read.format("dledger").options(**prestart_options(options)).load()
             .write.format("noop").mode("overwrite").save())
        except Exception as exc:  # the stream reports its own errors; this read only warms processes up
            log.debug("dledger source: the prestart read failed: %s", (str(exc).strip().splitlines() or [""])[0])

    thread = threading.Thread(target=run, name="dledger-prestart", daemon=True)
    thread.start()
    return thread
