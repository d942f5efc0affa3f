"""``dledger bench rocketmq`` keeps working: a tiny run of its load phases (figures printed, never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from dledger_rocketmq.bench import PHASES, format_results

from dledger.launcher import child_env, durable_store

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.process
@pytest.mark.skipif(durable_store() is None, reason="no durable store (mmap or lmdb) is installed")
def test_quick_rocketmq_benchmark_reports_each_phase(tmp_path):
    """A short run starts a broker group, sends batched and single messages, and reports rates and dispatch lag."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "rocketmq", "--duration", "0.5",
                          "--warmup", "0", "--json", "--preset", "fast", "--dir", str(tmp_path)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    for phase in ("batch", "single"):
        r = result[phase]
        assert r["msgs_per_s"] > 0 and r["errors"] == {}, r
        assert set(r["dispatch_lag_max_msgs"]) <= {"n0", "n1", "n2"} and len(r["dispatch_lag_max_msgs"]) == 2
        assert r["drain_s"] is not None
        cpu = r["cpu_us_per_msg"]  # every member's CPU per message: the master's work is the largest share
        assert set(cpu) == {"n0", "n1", "n2", "client"} and all(v >= 0 for v in cpu.values())
        assert cpu[result["master"]] == max(v for m, v in cpu.items() if m != "client") > 0
    assert result["batch"]["batch"] == 64 and result["single"]["batch"] == 1
    assert ".. batch:" in out.stderr  # progress lines while it runs
    assert "msg/s" in format_results(result)


def test_unknown_phase_is_refused():
    """Asking for a phase that does not exist fails with one line listing the known phases."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "rocketmq", "--phases", "warp"], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "unknown phase(s) warp" in out.stderr and all(p in out.stderr for p in PHASES)
    assert "Traceback" not in out.stderr
