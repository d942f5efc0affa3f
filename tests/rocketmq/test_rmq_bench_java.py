"""``dledger bench rocketmq-java`` keeps working: the stock Java producer against both groups (figures printed,
never asserted).  The run against both peers starts four JVMs and runs with -m slow or DLEDGER_SLOW=1; `make
test` runs the dledger side, the skip without a kit and the pure parts."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from dledger_rocketmq.tools.bench_java import WORKLOADS, missing_java, ratios

from dledger.launcher import child_env, durable_store

ROOT = Path(__file__).resolve().parent.parent.parent
no_java = missing_java(Path(os.environ.get("DLEDGER_JAVAKIT", ROOT.parent / "shared" / "javakit")))


def bench(tmp_path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "rocketmq-java", *args],
                          cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=timeout)


def check_workload(w: dict, master: str) -> None:
    assert w["msgs_per_s"] > 0 and w["errors"] == 0 and w["messages"] > 0, w
    assert 0 < w["p50_ms"] <= w["p99_ms"], w
    cpu = w["cpu_us_per_msg"]
    assert set(cpu) == {"n0", "n1", "n2"} and cpu[master] > 0, w


@pytest.mark.process
@pytest.mark.skipif(no_java is not None or durable_store() is None, reason=no_java or "no durable store")
def test_quick_java_producer_against_dledger(tmp_path):
    """The Java producer's single sends against a dledger broker group: rate, latencies and CPU per message."""
    out = bench(tmp_path, "--quick", "--peers", "dledger", "--workloads", "single16", "--json", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    ours = r["rounds"][0]["async"]["dledger"]
    check_workload(ours["single16"], ours["master"])
    assert ours["single16"]["threads"] == 16 and ours["single16"]["batch"] == 1
    assert r["ratios"] == {"async": {"single16": [None]}}  # no RocketMQ run: no ratio


@pytest.mark.process
@pytest.mark.slow
@pytest.mark.skipif(no_java is not None or durable_store() is None, reason=no_java or "no durable store")
def test_quick_java_producer_against_rocketmq_and_dledger(tmp_path, request):
    """--quick: both groups, single and batched sends, a ratio for each workload.  Four JVMs (about 70 s): only
    with -m slow (make soak) or DLEDGER_SLOW=1; `make test` runs the dledger side above."""
    if "slow" not in (request.config.getoption("markexpr") or "") and not os.environ.get("DLEDGER_SLOW"):
        pytest.skip("four JVMs: select with -m slow or DLEDGER_SLOW=1")
    out = bench(tmp_path, "--quick", "--json", "--dir", str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout)
    for peer in ("rocketmq", "dledger"):
        per = r["rounds"][0]["async"][peer]
        for wl in ("single16", "batch32"):
            check_workload(per[wl], per["master"])
        assert per["batch32"]["batch"] == 32 and per["batch32"]["threads"] == 4
    assert all(v > 0 for v in r["ratios"]["async"]["single16"] + r["ratios"]["async"]["batch32"])


def test_skips_with_the_reason_without_the_kit(tmp_path):
    """No kit: one line saying why, exit status 0, no traceback."""
    out = bench(tmp_path, "--quick", "--kit", str(tmp_path / "no-kit"), timeout=60)
    assert out.returncode == 0 and "skipped" in out.stdout and "no-kit" in out.stdout, out
    assert "Traceback" not in out.stderr


def test_unknown_workload_is_refused(tmp_path):
    out = bench(tmp_path, "--workloads", "single16,warp", timeout=60)
    assert out.returncode != 0 and "unknown workload(s) warp" in out.stderr and all(w in out.stderr for w in WORKLOADS)
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("rounds, expected", [
    ([{"async": {"rocketmq": {"master": "n0", "single64": {"msgs_per_s": 5000}},
                 "dledger": {"master": "n1", "single64": {"msgs_per_s": 12500}}}}], {"async": {"single64": [2.5]}}),
    ([{"sync": {"rocketmq": {"batch32": {"msgs_per_s": 0}}, "dledger": {"batch32": {"msgs_per_s": 10}}}},
      {"sync": {"dledger": {"batch32": {"msgs_per_s": 10}}, "rocketmq": {"batch32": {"msgs_per_s": 4}}}}],
     {"sync": {"batch32": [None, 2.5]}}),  # a failed peer gives no ratio; rounds keep their order
    ([{"async": {"rocketmq": {"error": "no master"}, "dledger": {"single16": {"error": "exit 2"}}}}],
     {"async": {"single16": [None]}}),  # a workload that failed: None, not left out
])
def test_ratios_per_round(rounds, expected):
    """dledger / RocketMQ per durability and workload, one value per round, None where a side has no rate."""
    assert ratios({"rounds": rounds}) == expected
