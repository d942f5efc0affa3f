"""``spark-submit spark/ingest.py`` on a standalone Spark cluster (a master and two workers on 127.0.0.1).

The pyspark wheel ships no ``sbin/start-master.sh``; it ships ``bin/spark-class``, which is what those scripts
run (``org.apache.spark.deploy.master.Master`` / ``...worker.Worker``), so the test starts them directly and
owns their processes (stopped in teardown, also on failure).
"""

import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from spark_util import Group, wait_until

from dledger.launcher import free_ports

pytestmark = [pytest.mark.spark, pytest.mark.process]

ROOT = Path(__file__).resolve().parents[2]


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).parent


class StandaloneCluster:
    """A Spark master and ``workers`` workers (1 core each) as child processes; ``stop()`` kills them all."""

    def __init__(self, base: Path, workers: int = 2):
        self.base = base
        base.mkdir(parents=True, exist_ok=True)
        self.home = spark_home()
        self.port, self.ui, *self.worker_uis = free_ports(2 + workers)
        self.env = {**os.environ, "SPARK_HOME": str(self.home), "SPARK_LOCAL_IP": "127.0.0.1",
                    "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable,
                    "SPARK_LOG_DIR": str(base / "logs"), "SPARK_NO_DAEMONIZE": "1"}
        self.procs: list[subprocess.Popen] = []
        self.n = workers

    @property
    def url(self) -> str:
        return f"spark://127.0.0.1:{self.port}"

    def _run(self, name: str, *args: str) -> None:
        log = (self.base / f"{name}.log").open("ab")
        self.procs.append(subprocess.Popen([str(self.home / "bin" / "spark-class"), *args], env=self.env,
                                           stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        log.close()

    def alive_workers(self) -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except (OSError, ValueError):
            return 0

    def start(self) -> "StandaloneCluster":
        self._run("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port",
                  str(self.port), "--webui-port", str(self.ui))
        for i, ui in enumerate(self.worker_uis):
            work = self.base / f"worker{i}"
            work.mkdir(parents=True, exist_ok=True)
            self._run(f"worker{i}", "org.apache.spark.deploy.worker.Worker", "--host", "127.0.0.1", "--cores", "1",
                      "--memory", "1g", "--webui-port", str(ui), "--work-dir", str(work), self.url)
        wait_until(lambda: self.alive_workers() == self.n, 90, f"{self.n} workers to register with the master",
                   interval=0.5)
        return self

    def executor_dirs(self) -> list[Path]:
        return [p for i in range(self.n) for p in (self.base / f"worker{i}").glob("app-*/*") if p.is_dir()]

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        for proc in self.procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


def committed_parquet(out: Path):
    """The rows of the Parquet files the file sink committed (its ``_spark_metadata`` log), as a pyarrow table."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = set()
    for log in sorted(p for p in (out / "_spark_metadata").iterdir() if not p.name.startswith(".")):
        for line in log.read_text().splitlines()[1:]:
            entry = json.loads(line)
            if entry.get("action") == "add":
                files.add(entry["path"].removeprefix("file://"))
    return pa.concat_tables([pq.read_table(f, columns=["index", "term", "pos", "body"]) for f in sorted(files)])


def test_ingest_runs_unchanged_on_a_standalone_cluster_with_two_workers(tmp_path):
    """spark-submit --master spark://... spark/ingest.py --once: executors on both workers; Parquet equals the log."""
    group = Group(tmp_path / "g0")
    cluster = StandaloneCluster(tmp_path / "spark")
    try:
        group.start()
        group.append([os.urandom(700) for _ in range(3000)])
        cluster.start()
        out = tmp_path / "out"
        done = subprocess.run(
            [str(cluster.home / "bin" / "spark-submit"), "--master", cluster.url,
             "--conf", "spark.executor.memory=512m", "--conf", "spark.executor.cores=1",
             "--conf", "spark.cores.max=2", "--conf", "spark.ui.enabled=false",
             str(ROOT / "spark" / "ingest.py"), "--peers", group.peers, "--group", "g0", "--output", str(out),
             "--checkpoint", str(tmp_path / "ck"), "--once", "--partition-bytes", "200000",
             "--progress-interval", "1"],
            env=cluster.env, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-3000:]
        assert "ingest: done: 3000 rows" in done.stdout
        assert len(cluster.executor_dirs()) == 2  # one executor on each worker
        table = committed_parquet(out)
        got = sorted(zip(*(table.column(c).to_pylist() for c in ("index", "term", "pos", "body"))))
        assert got == sorted((e.index, e.term, e.pos, e.body) for e in group.committed())
    finally:
        cluster.stop()
        group.close()
