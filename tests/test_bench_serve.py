"""tools.bench_serve: the connection micro-benchmark runs on this tree and against another (small sizes)."""

from pathlib import Path

from tools import bench_serve

ROOT = Path(__file__).resolve().parent.parent


def test_serve_microbenchmark_answers_every_request(capsys):
    """A run reports a positive CPU per request; against a tree (this one) it prints both medians and a ratio."""
    assert bench_serve.serve_cpu_us(300) > 0
    bench_serve.main(["--requests", "300", "--runs", "1", "--against", str(ROOT)])
    out = capsys.readouterr().out
    assert "this tree" in out and "ratio" in out
