"""``dledger bench snapshot`` runs end to end on a tiny log (its figures are in docs/benchmarks.md, never asserted)."""

import json

from dledger.bench import snapshot as snap_bench
from dledger.cli import main


def test_restart_bench_restores_and_applies_only_the_tail(tmp_path):
    """The snapshot run applies only the tail; the plain run applies every entry."""
    r = snap_bench.run_restart(count=3000, tail=200, size=32, keys=500, runs=1, directory=str(tmp_path))
    assert (r.applied_plain, r.applied_snapshot) == (3000, 200)
    assert r.snapshot_bytes > 0 and len(r.plain) == len(r.snapshot) == 1


def test_bench_snapshot_command_prints_json(tmp_path, capsys):
    """The command prints the restart result as JSON with medians and a ratio; a bad --tail is a usage error."""
    assert main(["bench", "snapshot", "restart", "--count", "500", "--tail", "50", "--runs", "1", "--json",
                 "--dir", str(tmp_path)]) == 0
    out = json.loads(capsys.readouterr().out)["restart"]
    assert out["applied_snapshot"] == 50 and out["ratio"] > 0
    assert main(["bench", "snapshot", "restart", "--count", "50", "--tail", "50", "--dir", str(tmp_path / "x")]) == 2
    assert "--tail 50 must be below --count 50" in capsys.readouterr().err
