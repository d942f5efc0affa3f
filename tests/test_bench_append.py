"""tools.bench_append: the append microbenchmark runs against this tree (small sizes)."""

from tools import bench_append


def test_batch_append_microbenchmark_measures_every_path(capsys):
    """A run prints CPU per batch with and without a hook, for a follower's pushes and for a decoded push of 256,
    all positive."""
    bench_append.main(["--batches", "3", "--reps", "1"])
    out = capsys.readouterr().out
    figures = [float(part.split()[-2]) for part in out.strip().split(": ", 1)[1].split(", ")]
    assert len(figures) == 4 and min(figures) > 0, out


def test_group_benchmark_commits_every_batch():
    """The in-process group mode commits all it appended and reports its CPU seconds."""
    assert bench_append.group_cpu("memory", 512) > 0
