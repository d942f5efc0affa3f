"""tools.bench_gil_handback: the GIL hand-back micro-benchmark runs (tiny sizes; figures printed, never asserted)."""

import subprocess
import sys
from pathlib import Path

from dledger.launcher import child_env

ROOT = Path(__file__).resolve().parent.parent


def test_gil_handback_reports_each_interval_idle_and_busy(tmp_path):
    """A run prints one row per switch interval and reactor state with positive times, and cleans up its file."""
    out = subprocess.run([sys.executable, "-m", "tools.bench_gil_handback", "--intervals", "5,0.5", "--count", "5",
                          "--rounds", "1", "--busy-ms", "0.5", "--period-ms", "1", "--dir", str(tmp_path)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = [line.split() for line in out.stdout.splitlines()[1:]]
    assert [(r[0], r[1]) for r in rows] == [("5", "idle"), ("5", "busy"), ("0.5", "idle"), ("0.5", "busy")]
    assert all(float(v) > 0 for r in rows for v in r[2:])
    assert list(tmp_path.iterdir()) == []  # its fsync file went with its temporary directory

