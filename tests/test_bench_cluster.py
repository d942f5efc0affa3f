"""``dledger bench cluster`` keeps working: a tiny run of every phase (figures are printed, never asserted)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dledger.bench.cluster import PHASES, format_results
from dledger.launcher import child_env, durable_store

ROOT = Path(__file__).resolve().parent.parent
STORE = durable_store()


@pytest.mark.process
def test_quick_cluster_benchmark_reports_every_phase(tmp_path):
    """A --quick run starts its group, runs each phase and prints one JSON object with a figure per phase."""
    phases = ["batch", "pipeline", "latency", "rss", "pysyncobj"] + (["failover"] if STORE else [])
    try:
        import matplotlib  # noqa: F401 (the plot extra: make test installs it)
        plot = ["--plot", str(tmp_path / "run.svg")]
    except ImportError:
        plot = []
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", "--quick", "--json",
                          "--store", STORE or "memory", "--phases", ",".join(phases), "--dir", str(tmp_path), *plot,
                          "--member-option", "switchIntervalMs=0.5"],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["batch"]["entries_per_s"] > 0 and result["pipeline"]["entries_per_s"] > 0
    # the CPU per entry of each process: three members and the load generator (this benchmark's process)
    split = result["pipeline"]["cpu_ms_per_1k_entries_by_process"]
    assert set(split) == {"n0", "n1", "n2", "generator"} and split["generator"] > 0
    assert abs(sum(split[m] for m in ("n0", "n1", "n2")) - result["pipeline"]["member_cpu_ms_per_1k_entries"]) < 0.5
    assert result["latency"]["samples"] > 0 and result["latency"]["p99_ms"] > 0
    assert set(result["rss_mb"]) == {"n0", "n1", "n2"} and all(v > 0 for v in result["rss_mb"].values())
    assert "entries_per_s" in result["pysyncobj"] or "skipped" in result["pysyncobj"]
    if STORE:
        [fast] = result["failover"]
        assert fast["preset"] == "fast" and len(fast["trials_s"]) == 1 and fast["median_s"] > 0
    assert ".. " in out.stderr  # progress lines while it runs
    # --member-option reached the config file of the members the load phases started
    assert result["settings"]["member_options"] == {"switchIntervalMs": 0.5}
    assert "switchIntervalMs = 0.5" in (tmp_path / "load" / "dledger.toml").read_text()
    assert result["batch"]["timeline"]["per_s"] and result["latency"]["percentiles"]["q"][-1] == 100.0
    if plot:
        svg = (tmp_path / "run.svg").read_text()
        assert "Throughput over time" in svg and "Latency percentiles" in svg
        assert ("Failover timeline" in svg) == bool(STORE) and "written to" in out.stderr
    text = format_results(result)
    assert "entries/s" in text and "latency at" in text and "generator" in text


def test_unknown_phase_is_refused():
    """Asking for a phase that does not exist fails with the list of known phases."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", "--phases", "warp"], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "unknown phases" in out.stderr and all(p in out.stderr for p in PHASES)


def test_member_option_reads_its_value_as_toml():
    """--member-option NAME=VALUE: the value as TOML (number, boolean), else as text; no '=' is refused."""
    import argparse

    from dledger.bench.cluster import member_option

    assert member_option("switchIntervalMs=5") == ("switchIntervalMs", 5)
    assert member_option(" switchIntervalMs = 0.5 ") == ("switchIntervalMs", 0.5)
    assert member_option("enableBatchPush=false") == ("enableBatchPush", False)
    assert member_option('storeType="lmdb"') == member_option("storeType=lmdb") == ("storeType", "lmdb")
    for bad in ("switchIntervalMs", "=5", "switchIntervalMs="):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME=VALUE"):
            member_option(bad)


@pytest.mark.parametrize("argv, message", [
    (["--member-option", "switchIntervalMs=1", "--peers", "n0-127.0.0.1:1"], "not with --peers"),
    (["--member-option", "noSuchOption=1", "--phases", "latency"], "unknown option 'noSuchOption'"),
    (["--member-option", "switchIntervalMs=0", "--phases", "latency"], "switchIntervalMs: must be > 0"),
])
def test_member_option_errors_are_one_line(argv, message):
    """A member option the benchmark cannot use is one line before any member starts, not a traceback."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", *argv], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and message in out.stderr and "Traceback" not in out.stderr


def test_quick_tls_comparison_reports_plain_and_tls_with_ratio(tmp_path):
    """--tls runs the load phases on a plain and a mutual-TLS group and reports both medians and their ratio."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", "--quick", "--json", "--tls",
                          "--store", STORE or "memory", "--phases", "batch", "--dir", str(tmp_path)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    medians = result["tls_median"]["batch"]
    assert medians["plain"] > 0 and medians["tls"] > 0
    assert result["tls_ratio"]["batch"] == pytest.approx(medians["tls"] / medians["plain"])
    assert len(result["tls_rounds"]["plain"]) == len(result["tls_rounds"]["tls"]) == 1


KIT = Path(__import__("os").environ.get("DLEDGER_JAVAKIT", ROOT.parent / "shared" / "javakit"))


@pytest.mark.process
@pytest.mark.skipif(not (KIT / "bin" / "java-dledger").is_file(), reason=f"no Java kit at {KIT}")
@pytest.mark.skipif(__import__("shutil").which("java") is None, reason="java is not installed")
def test_quick_java_peer_comparison_runs_the_same_load_on_both_groups(tmp_path):
    """--java-peer starts Java DLedger 0.3.2 beside dledger and reports both sides' medians and their ratio."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", "--quick", "--json", "--java-peer",
                          "--flush", "async", "--store", STORE or "memory", "--phases", "pipeline",
                          "--dir", str(tmp_path)],
                         cwd=ROOT, env={**child_env(), "DLEDGER_JAVAKIT": str(KIT)}, capture_output=True, text=True,
                         timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert result["settings"]["frames"] == "java-json"
    medians = result["java_median"]["pipeline"]
    assert medians["dledger"] > 0 and medians["java"] > 0
    assert result["java_ratio"]["pipeline"] == pytest.approx(medians["dledger"] / medians["java"])
    assert len(result["java_rounds"]["dledger"]) == len(result["java_rounds"]["java"]) == 1
    assert set(result["java_rss_peak_mb"]) == {"n0", "n1", "n2"}
    assert result["java_cpu_median"]["dledger"] > 0 and result["java_cpu_median"]["java"] > 0
    assert "dledger/Java" in format_results(result)


def test_java_peer_summary_takes_medians_and_ratios():
    """Medians per side and the dledger/Java ratio from the rounds (a phase missing on one side: no ratio)."""
    from dledger.bench.javapeer import summarize

    rounds = {"dledger": [{"pipeline": {"entries_per_s": v, "member_cpu_ms_per_1k_entries": v / 10},
                           "latency": {"p99_ms": 2.0}} for v in (30.0, 10.0, 20.0)],
              "java": [{"pipeline": {"entries_per_s": v}} for v in (5.0, 15.0, 10.0)]}
    out = summarize(rounds, ("pipeline", "latency"))
    assert out["java_median"]["pipeline"] == {"dledger": 20.0, "java": 10.0}
    assert out["java_cpu_median"] == {"dledger": 2.0, "java": None}
    assert out["java_ratio"] == {"pipeline": 2.0}
    assert out["java_median"]["latency"] == {"dledger": 2.0, "java": None}


@pytest.mark.parametrize("extra", [["--tls"], ["--peers", "n0-127.0.0.1:1"], ["--phases", "batch"]])
def test_java_peer_refuses_what_it_cannot_compare(extra):
    """--java-peer with --tls, --peers or no phase Java can run: one line, no traceback."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "cluster", "--java-peer", *extra], cwd=ROOT,
                         env={**child_env(), "DLEDGER_JAVAKIT": str(KIT)}, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "--java-peer" in out.stderr and "Traceback" not in out.stderr


def test_load_connection_lost_answers_every_later_append_at_once():
    """A load connection the member closed answers what was waiting and every later send with None (the
    loop counts a NETWORK_ERROR and ends on time) instead of leaving them unanswered for ever."""
    from twisted.internet.testing import StringTransport

    from dledger.bench.load import RawAppends

    raw = RawAppends("g0", "n0", b"x" * 16)
    raw.makeConnection(StringTransport())
    replies = []
    raw.send(1, replies.append)
    assert replies == [] and raw.transport.value()
    raw.connectionLost(None)
    assert replies == [None]
    raw.send(1, replies.append)
    assert replies == [None, None]
