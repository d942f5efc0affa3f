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


def test_bench_ingest_phase_times_the_first_rows_and_the_cost_against_the_plain_read(tmp_path, capsys):
    """The ingest phase writes exactly the filled entries, reports the first rows' time, and the CPU per row of
    Spark's processes beside the plain client's read of the same entries (members counted in both)."""
    from dledger import cli

    status = cli.main(["bench", "ingest", "--count", "3000", "--size", "256", "--runs", "1", "--reply", "binary",
                       "--dir", str(tmp_path), "--json"])
    out = capsys.readouterr().out
    assert status == 0, out[-2000:]
    lines = out.splitlines()
    result = json.loads(lines[-1])
    ingest = result["ingest"]
    assert ingest["rows"] == 3000 and ingest["batches"] >= 1
    assert 0 < ingest["first_row_s"] and ingest["session_start_s"] <= ingest["first_row_s"]
    assert ingest["spark_cpu_us_per_row"] > 0 and set(ingest["spark_cpu_split_us_per_row"]) >= {"driver", "jvm"}
    # the members' CPU is counted (their own group); /proc counts 10 ms ticks, so a short read may show 0
    assert ingest["members_cpu_us_per_row"] >= 0 and result["get"]["members_cpu_us_per_row"] >= 0
    assert result["cost_ratio"] > 0 and result["cost_ratio_with_members"] > 0
    assert any(line.startswith("cost per row: ingest ") for line in lines)
    assert result["get"]["json_entries_per_s"] == []  # --reply binary: the plain client's read only
    # the driver JVM's collections, cumulative: none lost between the session's start, the first rows, the end
    gc = ingest["jvm_gc"]
    assert set(gc) == {"session", "first_row", "end"} and None not in gc.values()
    assert 0 <= gc["session"][0] <= gc["first_row"][0] <= gc["end"][0]
    assert 0 <= gc["session"][1] <= gc["first_row"][1] <= gc["end"][1]


@pytest.mark.parametrize("argv", [["--member-pids", "12,x"], ["--conf", "spark.ui.enabled"]])
def test_bench_ingest_bad_arguments_are_one_line(argv, capsys):
    """Bad --member-pids or --conf: one line, exit 2, before any group is started."""
    from dledger import cli

    assert cli.main(["bench", "ingest", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dledger bench ingest: ")
