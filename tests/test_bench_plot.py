"""``dledger bench cluster --plot``: the time series a run records, and the plot drawn from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dledger.bench import plot, timeline
from dledger.errors import ConfigError
from dledger.launcher import child_env

ROOT = Path(__file__).resolve().parent.parent


def test_rate_series_counts_per_bucket_from_the_start():
    """Events land in 0.25 s buckets from the phase's start; rates are per second; empty buckets are 0."""
    s = timeline.RateSeries(start=100.0)
    for t, n in ((100.0, 1), (100.1, 2), (100.6, 4), (99.0, 1)):  # before the start counts in the first bucket
        s.add(t, n)
    assert s.to_dict() == {"bucket_s": 0.25, "t": [0.25, 0.5, 0.75], "per_s": [16.0, 0.0, 16.0]}


@pytest.mark.parametrize("values, q, expected", [
    ([], 50, None),
    ([1.0], 99, 1.0),
    ([1.0, 2.0, 3.0, 4.0], 50, 2.0),
    ([1.0, 2.0, 3.0, 4.0], 75, 3.0),
    ([float(i) for i in range(1, 101)], 99, 99.0),
    ([float(i) for i in range(1, 101)], 100, 100.0),
])
def test_percentile_is_the_nearest_rank(values, q, expected):
    """Nearest-rank percentiles: p50 of 1..4 is 2, p99 of 1..100 is 99, p100 the maximum."""
    assert timeline.percentile(values, q) == expected


def test_latency_series_gives_percentiles_per_bucket_and_gaps():
    """Each bucket gets its p50/p99/max in ms; a bucket without requests is a gap (None)."""
    s = timeline.LatencySeries(start=0.0)
    for t, lat in ((0.1, 0.001), (0.2, 0.003), (0.6, 0.010)):
        s.add(t, lat)
    d = s.to_dict()
    assert d["t"] == [0.25, 0.5, 0.75]
    assert d["p50_ms"] == [1.0, None, 10.0] and d["max_ms"] == [3.0, None, 10.0]
    assert timeline.percentile_curve(sorted([0.001, 0.002]))["ms"][-1] == 2.0


def test_failover_trial_keeps_the_window_around_the_kill_and_thins_long_runs():
    """Acks from 1 s before the kill to 1 s after recovery, times relative to the kill; at most MAX points."""
    succ = [8.9, 9.5, 10.2, 10.9, 11.8, 13.0]
    by = ["n0", "n0", "n0", "n1", "n1", "n1"]
    trial = timeline.failover_trial(succ, by, killed_at=10.0, ok=10.9)
    assert trial == {"recovered_s": 0.9, "acks_s": [-0.5, 0.2, 0.9, 1.8], "leaders": ["n0", "n0", "n1", "n1"]}
    many = [10.0 + i / 10000 for i in range(10000)]
    thin = timeline.failover_trial(many, ["n1"] * len(many), killed_at=10.0, ok=10.5)
    assert len(thin["acks_s"]) == timeline.MAX_TRIAL_POINTS and thin["acks_s"][0] == 0.0


def results() -> dict:
    rate = timeline.RateSeries(0.0)
    for i in range(40):
        rate.add(i * 0.05, 100)
    lat = timeline.LatencySeries(0.0)
    lats = sorted(0.001 * (1 + i % 7) for i in range(200))
    for i, v in enumerate(lats):
        lat.add(i * 0.01, v)
    trial = timeline.failover_trial([9.8, 9.9, 10.62, 10.7], ["n0", "n0", "n2", "n2"], killed_at=10.0, ok=10.62)
    return {"settings": {"members": 3, "store": "mmap", "flush": "sync", "preset": "default", "size": 1024,
                         "cpus": 2},
            "batch": {"entries_per_s": 2000.0, "timeline": {**rate.to_dict(), "warmup_s": 0.5}},
            "latency": {"offered_per_s": 500, "samples": 200, "timeline": {**lat.to_dict(), "warmup_s": 0.5},
                        "percentiles": timeline.percentile_curve(lats)},
            "failover": [{"preset": "fast", "timelines": [{"killed": "n0", **trial}]}]}


def test_plot_draws_every_panel_as_text_searchable_svg(tmp_path):
    """An SVG with the three panels' titles, the measured rate and each trial's recovery time as text."""
    pytest.importorskip("matplotlib", reason="the plot extra is not installed (pip install 'dledger[plot]')")
    out = tmp_path / "run.svg"
    assert plot.write(results(), out) == ["throughput", "latency", "failover"]
    svg = out.read_text()
    for text in ("Throughput over time", "Latency percentiles", "Failover timeline", "2,000 entries/s measured",
                 "0.62 s", "kill -9 of the leader"):
        assert text in svg, text
    assert "<dc:date>" not in svg  # no date: a committed plot changes only with its figures
    png = tmp_path / "run.png"
    plot.write(results(), png)
    assert png.read_bytes().startswith(b"\x89PNG")


def test_plot_draws_only_what_the_run_measured(tmp_path):
    """A run of the failover phase alone gives one panel; a run with nothing to draw is a clear error."""
    pytest.importorskip("matplotlib", reason="the plot extra is not installed (pip install 'dledger[plot]')")
    r = results()
    only = {"settings": r["settings"], "failover": r["failover"]}
    assert plot.write(only, tmp_path / "f.svg") == ["failover"]
    with pytest.raises(ConfigError, match="nothing to plot"):
        plot.write({"settings": r["settings"], "rss_mb": {}}, tmp_path / "none.svg")


def test_plot_without_matplotlib_is_one_line(monkeypatch):
    """Without the extra, --plot says how to install it."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ConfigError, match=r"pip install 'dledger\[plot\]'"):
        plot.require()


def test_plot_argument_needs_a_known_suffix(tmp_path):
    """--plot out.txt is refused by argparse in one line before anything starts."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", "--plot", str(tmp_path / "x.txt")],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "suffix: .svg, .png, .pdf" in out.stderr and "Traceback" not in out.stderr


def test_bench_plot_draws_a_saved_json_result_and_refuses_bad_input_in_one_line(tmp_path):
    """dledger bench plot RESULT.json FILE.svg draws a saved result; a missing or non-JSON file is one line (exit 2)."""
    pytest.importorskip("matplotlib", reason="the plot extra is not installed (pip install 'dledger[plot]')")
    import json

    saved = tmp_path / "result.json"
    saved.write_text(json.dumps(results()))
    cli = [sys.executable, "-m", "dledger.cli", "bench", "plot"]
    out = subprocess.run([*cli, str(saved), str(tmp_path / "p.svg")], cwd=ROOT, env=child_env(), capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "throughput, latency, failover" in out.stdout and "Failover timeline" in (tmp_path / "p.svg").read_text()
    (tmp_path / "bad.json").write_text("not json")
    for name, error in (("missing.json", "No such file"), ("bad.json", "not a 'dledger bench cluster --json'")):
        out = subprocess.run([*cli, str(tmp_path / name), str(tmp_path / "q.svg")], cwd=ROOT, env=child_env(),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 2 and error in out.stderr and "Traceback" not in out.stderr, out.stderr
