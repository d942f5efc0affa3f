"""``dledger bench install-snapshot --quick`` still runs (its figures are in docs/benchmarks.md, never asserted)."""

import json
import subprocess
import sys

import pytest

from dledger.launcher import durable_store

pytestmark = [pytest.mark.process, pytest.mark.slow,
              pytest.mark.skipif(durable_store() != "mmap", reason="the mmap store is not installed")]


def test_quick_install_snapshot_bench_reports_its_figures(tmp_path):
    """An 8 MiB InstallSnapshot between real members: JSON with throughput and both sides' peak RSS."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "install-snapshot", "--quick", "--json",
                          "--dir", str(tmp_path / "b")], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["snapshot_bytes"] == 8 << 20
    assert result["transfer_seconds"] > 0 and result["follower_peak_rss"] > 0
