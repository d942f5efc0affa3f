"""Spark sessions for ingest: a local ``local[2]`` one by default, or whatever ``spark-submit`` set up.

Python data sources run in Python workers that Spark starts with ``PYSPARK_PYTHON`` (``python3`` from
PATH when unset) -- which would not have dledger installed.  :func:`ensure_python` points it at the
running interpreter (its environment has dledger-spark) unless the operator chose one; :func:`register`
does the same for the ``dledger`` source alone in a session someone else made.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys

#: A small local session: the UI off, few shuffle partitions (ingest has no shuffle worth more).
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.session.timeZone": "UTC",
    # The file sink sorts each task's rows by the partition columns (group, date) before writing unless
    # it may keep a few files open at once: an ingest's task holds one group and usually one date, so
    # the sort only copied every row (1 KiB bodies) into sorter pages the heap then had to carry
    # (docs/benchmarks.md "Round 2c").  Past 4 open files a task sorts the rest, as before.
    "spark.sql.maxConcurrentOutputFileWriters": "4",
}

#: A local master's driver JVM (the driver is the executor there).  A 1M-row ingest measured 18.6 instead of
#: 27 us of JVM CPU per row with the client compiler only (C2's compilations cost more than they gain in a
#: run of a minute or two) and the parallel collector (cheaper write barriers than G1 on 2 cores):
#: docs/benchmarks.md "Spark ingest (perf-spark)".  A long-running stream may prefer C2:
#: ``--conf spark.driver.extraJavaOptions=`` (empty) restores the JVM's defaults.
#: ``-XX:MetaspaceSize=256m``: the class metadata an ingest's driver loads (Spark's classes, then Janino's
#: generated ones) passes the JVM's first metaspace threshold (~21 MB) several times before the first row,
#: and each crossing is a full collection ("Metadata GC Threshold": 4 of them, 1.8 s of pauses under
#: load 10, before the first row); a first threshold above what an ingest loads leaves them out
#: (docs/benchmarks.md "Round 2c").
LOCAL_JVM_CONF = {
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseParallelGC -XX:MetaspaceSize=256m",
}


#: Environment variable naming the local driver JVM's class archive (a path), or ``off``.
CLASS_ARCHIVE_ENV = "DLEDGER_SPARK_CLASS_ARCHIVE"
#: Only the archive's errors are shown: its dump warns of every class it cannot keep (hundreds of lines).
CLASS_ARCHIVE_QUIET = "-Xlog:cds=error,cds+dynamic=error"


#: What the JVM logs (``cds+dynamic``, warning) when it maps no class from the archive it was given.
CLASS_ARCHIVE_REFUSED = "Unable to use shared archive"


def class_archive_flags(path: str | None, exists: bool, refusals: str | None = None) -> str:
    """The JVM options for the class archive (AppCDS) at ``path``: use it if it ``exists``, else record it.

    A fresh driver JVM loads and verifies ~15,000 classes from Spark's jars; an archive of them, mapped at
    start, measured the session's start 23/20 s instead of 29/39 s and its first read 38/24 s instead of
    58/36 s (two interleaved pairs under load 12-18: docs/benchmarks.md "Round 2b").  Java 17 has no
    -XX:+AutoCreateSharedArchive, so the first run records the archive when its JVM exits
    (``-XX:ArchiveClassesAtExit``, a few seconds of the JVM's exit) and later runs map it.  A stale archive
    (other jars, another JDK) is refused by the JVM, which then starts without it and says so only in its
    log: ``refusals`` (a file, when mapping) receives that line (:func:`check_refusal`).
    """
    if not path:
        return ""
    quoted = f'"{path}"' if any(c.isspace() for c in path) else path
    flag = "SharedArchiveFile" if exists else "ArchiveClassesAtExit"
    out = f"-XX:{flag}={quoted} {CLASS_ARCHIVE_QUIET}"
    if exists and refusals and not any(c.isspace() for c in refusals):
        out += f" -Xlog:cds+dynamic=warning:file={refusals}::filecount=0"  # no rotation: one file, ours
    return out


def archive_refused(log_text: str) -> bool:
    """True if the JVM's ``cds+dynamic`` log says it mapped nothing from the archive it was given."""
    return CLASS_ARCHIVE_REFUSED in log_text


def check_refusal(archive: str, refusals: str, env=None) -> bool:
    """After the JVM started: did it refuse ``archive``?  The log file ``refusals`` is removed either way.

    A refused archive in the cache (no ``DLEDGER_SPARK_CLASS_ARCHIVE``) is removed, so the next recording
    command (``dledger ingest --once``, the bench) records one this JVM can map, instead of every session
    paying the mapping and getting nothing (what happened when an archive recorded by another virtualenv
    was found: docs/benchmarks.md "Round 2f").  An operator's own path is only reported.
    """
    env = os.environ if env is None else env
    try:
        with open(refusals, encoding="utf-8", errors="replace") as f:
            refused = archive_refused(f.read())
    except OSError:
        refused = False
    try:
        os.remove(refusals)
    except OSError:
        pass
    if not refused:
        return False
    import logging

    log = logging.getLogger("dledger_spark")
    if env.get(CLASS_ARCHIVE_ENV) is None:
        _remove_archive(archive)
        log.warning("dledger-spark: the JVM refused the class archive %s (recorded for other jars or another JDK): "
                    "removed; the next 'dledger ingest --once' records a new one", archive)
    else:
        log.warning("dledger-spark: the JVM refused the class archive %s (%s; recorded for other jars or another "
                    "JDK): this session runs without it", archive, CLASS_ARCHIVE_ENV)
    return True


def _stat_key(path: str) -> str:
    """``path`` as the JVM checks it against an archive: its real path, size and modification time."""
    real = os.path.realpath(path)
    try:
        st = os.stat(real)
    except OSError:
        return real
    return f"{real}:{st.st_size}:{st.st_mtime_ns}"


def class_archive_key(version: str, java: str, jars: str, names: list[str]) -> str:
    """What a class archive is only valid for: the JVM refuses (silently, then loads every class from the
    jars) an archive recorded with another JDK or another class path, and the class path is absolute.

    So the key holds the Spark version, the ``java`` it runs (real path, and the JDK's ``lib/modules``'s
    size and time: an upgrade in place) and every jar of the class path by real path, size and time -- not
    the jar names alone: an archive recorded by one virtualenv's pyspark was refused by every other
    (another directory, same names), which left the driver JVM without one (docs/benchmarks.md "Round 2f").
    """
    real_java = os.path.realpath(java)
    modules = os.path.join(os.path.dirname(os.path.dirname(real_java)), "lib", "modules")
    parts = [version, _stat_key(real_java), _stat_key(modules)]
    parts += [_stat_key(os.path.join(jars, name)) for name in names]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:12]


def class_archive_path(env=None) -> str | None:
    """Where the local driver JVM's class archive is kept (None: not used).

    ``DLEDGER_SPARK_CLASS_ARCHIVE``: a path, or ``off``; unset: one file per Spark version, ``java``
    and jar set (:func:`class_archive_key`) under ``$XDG_CACHE_HOME`` (``~/.cache``) ``/dledger-spark/``,
    so an upgrade or another virtualenv never meets an archive of other classes.
    """
    env = os.environ if env is None else env
    chosen = env.get(CLASS_ARCHIVE_ENV)
    if chosen is not None:
        return None if chosen.strip().lower() in ("", "off", "0", "false", "no") else chosen
    try:
        import pyspark
    except ImportError:  # pragma: no cover
        return None
    jars = os.path.join(os.path.dirname(pyspark.__file__), "jars")
    java_home = env.get("JAVA_HOME")
    java = os.path.join(java_home, "bin", "java") if java_home else shutil.which("java")
    try:
        names = sorted(os.listdir(jars))
    except OSError:
        return None  # a pyspark without its jars (spark-submit's own SPARK_HOME): leave the JVM alone
    key = class_archive_key(pyspark.__version__, java or "java", jars, names)
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "dledger-spark", f"spark-{pyspark.__version__}-{key}.jsa")


#: Beside a kept archive in the cache: the jars directory it was recorded from (:func:`prune_archives`).
CLASS_ARCHIVE_SOURCE = ".classpath"


def _remove_archive(path: str) -> None:
    """Remove a cache archive and its :data:`CLASS_ARCHIVE_SOURCE` note, whichever exist."""
    for victim in (path, path + CLASS_ARCHIVE_SOURCE):
        try:
            os.remove(victim)
        except OSError:
            pass


def prune_archives(directory: str, keep: str) -> list[str]:
    """Remove the cache's class archives other than ``keep`` that no JVM can map any more; the removed paths.

    An archive is ~180 MB and only valid for the jars it was recorded from (:func:`class_archive_key`), so
    one whose jars directory (its :data:`CLASS_ARCHIVE_SOURCE` file) is gone, or with no such file (made
    before archives were keyed by their jars' place), is dead weight.  Another live virtualenv's archive is
    kept.  Only ``spark-*.jsa`` files are touched.
    """
    removed = []
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return removed
    for name in names:
        path = os.path.join(directory, name)
        if not (name.startswith("spark-") and name.endswith(".jsa")) or path == keep:
            continue
        try:
            with open(path + CLASS_ARCHIVE_SOURCE, encoding="utf-8") as f:
                source = f.read().strip()
        except OSError:
            source = ""
        if source and os.path.isdir(source):
            continue
        _remove_archive(path)
        removed.append(path)
    return removed


def _note_source(final: str) -> bool:
    """Note the jars directory of the archive about to be kept in the default cache (before its rename, so
    another process's :func:`prune_archives` never sees it without its note); False: not the cache's."""
    if os.environ.get(CLASS_ARCHIVE_ENV) is not None:
        return False  # the operator's own path: nothing of ours around it
    try:
        import pyspark

        with open(final + CLASS_ARCHIVE_SOURCE, "w", encoding="utf-8") as f:
            f.write(os.path.realpath(os.path.join(os.path.dirname(pyspark.__file__), "jars")) + "\n")
    except (ImportError, OSError):
        return False
    return True


#: ``(recording, final)``: the archive this process's JVM records at its exit, and where it goes once whole.
_recording: tuple[str, str] | None = None


def _class_archive(record: bool) -> tuple[str, bool] | None:
    """``(path, exists)`` for :func:`class_archive_flags`, or None (no archive: unset, off, or not recorded here).

    A JVM mapping a half-written archive dies (SIGBUS), so an archive is recorded under a name of its own
    and renamed into place only after its JVM has exited (:func:`stop_session`).
    """
    global _recording
    path = class_archive_path()
    if path is None:
        return None
    if os.path.isfile(path):
        return path, True
    if not record:
        return None
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
    except OSError:
        return None  # an unwritable cache: start without the archive
    _recording = (f"{path}.{os.getpid()}.tmp", path)
    return _recording[0], False


def stop_session(spark, timeout: float = 120.0) -> None:
    """Stop ``spark``; if its JVM records a class archive (:func:`get_session`), stop the JVM and keep the archive.

    The JVM writes the archive as it exits, so it is asked to exit (its stdin closed, as when this process
    ends) and waited for up to ``timeout`` seconds; an archive whose JVM did not exit cleanly is removed.
    """
    global _recording
    spark.stop()
    if _recording is None:
        return
    recording, final = _recording
    _recording = None
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None) if SparkContext._gateway is not None else None
    ok = False
    if proc is not None and proc.stdin is not None:
        try:
            SparkContext._gateway.shutdown()
        except Exception:
            pass
        SparkContext._gateway = SparkContext._jvm = None  # a later session launches a JVM of its own
        try:
            proc.stdin.close()
            ok = proc.wait(timeout) == 0
        except Exception:
            ok = False
    try:
        if ok and os.path.getsize(recording) > 0:
            noted = _note_source(final)
            os.replace(recording, final)
            if noted:
                prune_archives(os.path.dirname(final), final)
        else:
            os.remove(recording)
    except OSError:
        pass


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


def session_conf(master: str | None, submitted: bool, conf: dict | None = None,
                 class_archive: tuple[str, bool] | None = None, refusals: str | None = None) -> dict[str, str]:
    """The configuration :func:`get_session` gives a session of ``master`` (None: ``local[2]`` unless
    ``submitted``, i.e. under spark-submit, whose master and settings hold); ``conf`` (``--conf``) wins.

    ``class_archive``: ``(path, exists)`` of the local driver JVM's class archive, ``refusals`` the file its
    refusal is logged to (:func:`class_archive_flags`).
    """
    out: dict[str, str] = {}
    if master is not None or not submitted:
        out.update(LOCAL_CONF)
        if (master or "local[2]").startswith("local"):
            out.update(LOCAL_JVM_CONF)
            if class_archive is not None:
                key = "spark.driver.extraJavaOptions"
                out[key] = f"{out[key]} {class_archive_flags(*class_archive, refusals)}".strip()
    return {**out, **(conf or {})}


def get_session(master: str | None = None, app_name: str = "dledger-ingest", conf: dict | None = None,
                record_archive: bool = False):
    """A SparkSession with the ``dledger`` source registered.

    ``master`` None: ``local[2]``, unless running under ``spark-submit`` (then its ``--master`` holds).
    ``record_archive``: with no class archive yet, have this JVM record one; :func:`stop_session` then
    stops the JVM and keeps the archive once it is whole (a command that ends its process: ``dledger
    ingest``, the bench).  Without it an existing archive is used, none is made.
    """
    ensure_python()
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app_name)
    if master is not None or not under_spark_submit():
        builder = builder.master(master or "local[2]")
    state = _class_archive(record_archive) if not under_spark_submit() else None
    refusals = _refusal_log() if state is not None and state[1] else None
    for key, value in session_conf(master, under_spark_submit(), conf, state, refusals).items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    finally:
        if refusals is not None:
            check_refusal(state[0], refusals)
    register(spark)
    return spark


def _refusal_log() -> str | None:
    """A fresh file for the JVM's archive refusal line (None if no temporary file can be made)."""
    import tempfile

    try:
        fd, path = tempfile.mkstemp(prefix="dledger-spark-cds-", suffix=".log")
    except OSError:
        return None
    os.close(fd)
    return path
