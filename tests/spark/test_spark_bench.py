"""``dledger bench ingest``, bounded: its fill and bulk-GET phases against its own 3-member group."""

import json

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.process]
pytest.importorskip("dledger_spark", reason="dledger-spark is not installed (pip install -e spark)")


def test_bench_ingest_get_phase_prints_progress_and_both_reply_forms(tmp_path, capsys):
    """The bench fills a group, reads it over one connection in binary and JSON, interleaved, and reports a ratio."""
    from dledger import cli

    status = cli.main(["bench", "ingest", "--count", "3000", "--size", "512", "--runs", "2", "--phases", "fill,get",
                       "--dir", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert status == 0
    lines = out.splitlines()
    assert any(line.startswith("fill: 3,000/3,000 entries") for line in lines)
    forms = [line.split()[3].rstrip(":") for line in lines if line.startswith("get: run ")]
    assert forms == ["binary", "json", "binary", "json"]  # interleaved
    result = json.loads(lines[-1])
    assert len(result["get"]["binary_entries_per_s"]) == 2 and result["get"]["median_ratio"] > 0
