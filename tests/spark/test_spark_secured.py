"""The dledger source and `dledger ingest` on secured groups (authMode tls and secret), and their one-line errors.

Real twistd groups; one local[2] session for the module (reads, and reading the ingests' Parquet back).
The `dledger ingest` error cases run the command as a user would; each fails before Spark starts.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from spark_util import Group, spark_fixture, wait_until  # noqa: F401 (the fixture)

pytestmark = [pytest.mark.spark, pytest.mark.process]

INGEST = str(Path(__file__).resolve().parents[2] / "spark" / "ingest.py")
CLI_FLAGS = {"tlsCa": "--tls-ca", "tlsCert": "--tls-cert", "tlsKey": "--tls-key", "clientName": "--client-name",
             "tokenFile": "--token-file"}


def read(spark, group: Group, **options):
    reader = spark.read.format("dledger").option("peers", group.peers).option("group", group.name)
    for key, value in options.items():
        reader = reader.option(key, str(value))
    return reader.load()


def as_tuples(rows):
    return sorted((r["index"], r["term"], r["pos"], bytes(r["body"])) for r in rows)


def entry_tuples(entries):
    return sorted((e.index, e.term, e.pos, e.body) for e in entries)


def ingest(*argv: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLEDGER_")}
    return subprocess.run([sys.executable, INGEST, "--progress-interval", "0.5", *argv], capture_output=True,
                          text=True, timeout=300, env=env)


@pytest.fixture(name="secured", params=["tls", "secret"])
def secured_fixture(request, tmp_path):
    """A started 3-member group g0 with authMode tls or secret, killed at the end."""
    g = Group(tmp_path / request.param, auth=request.param)
    try:
        yield g.start()
    finally:
        g.close()


def test_batch_read_of_a_secured_group(spark, secured):
    """With a read-role client's credentials the rows equal the committed log; without, one line names the options."""
    bodies = [os.urandom(n % 700) for n in range(600)]
    secured.append(bodies)
    rows = read(spark, secured, partitionBytes=50_000, **secured.reader).collect()
    assert as_tuples(rows) == entry_tuples(secured.committed())
    assert sorted(bytes(r["body"]) for r in rows) == sorted(bodies)
    anonymous = {"secret": r"dledger source: group 'g0' at .* needs credentials with the read role",
                 "tls": r"dledger source: no leader of group 'g0' .* answered within 3s: .*; the "
                        r"members closed the connection at once: if they speak TLS, pass tlsCa"}
    with pytest.raises(Exception, match=anonymous[secured.auth]):
        read(spark, secured, timeout=3).collect()


def test_ingest_of_a_secret_group_and_its_one_line_errors(spark, tmp_path):
    """`dledger ingest --client-name/--token-file` ingests a secret group exactly; a wrong group, a checkpoint of
    another group, an unwritable output and unreachable members each give one line, exit 1, and write nothing."""
    g0 = Group(tmp_path / "g0", auth="secret")
    g1 = Group(tmp_path / "g1", name="g1")
    try:
        g0.start()
        g1.start()
        g0.append([b"s%d" % i for i in range(400)])
        creds = [a for k, v in g0.reader.items() for a in (CLI_FLAGS[k], v)]
        out, ck = tmp_path / "out", tmp_path / "ck"
        done = ingest("--peers", g0.peers, "--group", "g0", "--output", str(out), "--checkpoint", str(ck),
                      "--once", *creds)
        assert done.returncode == 0, done.stderr[-2000:]
        rows = spark.read.parquet(str(out)).select("index", "term", "pos", "body").collect()
        assert as_tuples(rows) == entry_tuples(g0.committed())

        before = {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()}
        (tmp_path / "afile").write_text("x")
        cases = {
            "wrong group": (["--peers", g1.peers, "--group", "g0"],
                            f"dledger ingest: dledger source: the members at {g1.peers} do not serve group 'g0'"),
            "wrong group of a secret group": (["--peers", g0.peers, "--group", "g1", *creds],
                                              f"dledger ingest: dledger source: group 'g1' at {g0.peers}: "
                                              "NETWORK_ERROR"),
            "another group's checkpoint": (["--peers", g1.peers, "--group", "g1", "--checkpoint", str(ck)],
                                           f"dledger ingest: checkpoint {ck}: the checkpoint holds offsets of "
                                           "group(s) g0, which this query does not read (it reads g1)"),
            "unwritable output": (["--peers", g0.peers, "--group", "g0", *creds, "--output",
                                   str(tmp_path / "afile" / "out")],
                                  f"dledger ingest: output {tmp_path / 'afile' / 'out'} cannot be created"),
            "unreachable members": (["--peers", "n0-127.0.0.1:1;n1-127.0.0.1:2", "--group", "g0", "--timeout", "2"],
                                    "dledger ingest: dledger source: no leader of group 'g0'"),
            "no credentials": (["--peers", g0.peers, "--group", "g0"],
                               "dledger ingest: dledger source: group 'g0' at"),
        }
        for what, (argv, line) in cases.items():
            fresh = tmp_path / what.replace(" ", "-").replace("'", "")
            if "--output" not in argv:
                argv = [*argv, "--output", str(fresh / "out")]
            if "--checkpoint" not in argv:
                argv = [*argv, "--checkpoint", str(fresh / "ck")]
            got = ingest(*argv, "--once")
            err = got.stderr.strip()
            assert (got.returncode, err.count("\n")) == (1, 0), f"{what}: {got.returncode} {err[-3000:]}"
            assert err.startswith(line), what
            assert not fresh.exists(), f"{what}: wrote {list(fresh.rglob('*'))}"
        assert {p: p.read_bytes() for p in ck.rglob("*") if p.is_file()} == before
        assert sorted(p.name for p in (tmp_path / "afile").parent.iterdir() if p.name == "afile") == ["afile"]
    finally:
        g0.close()
        g1.close()


def test_a_streaming_query_refuses_a_checkpoint_of_another_group(spark, tmp_path):
    """A user's own streaming query given the checkpoint of a query of g0 fails in one line when it reads g1."""
    g0, g1 = Group(tmp_path / "g0"), Group(tmp_path / "g1", name="g1")
    try:
        g0.start()
        g1.start()
        g0.append([b"a"] * 50)
        g1.append([b"b"] * 50)
        ck = str(tmp_path / "ck")

        def run(group):
            q = (spark.readStream.format("dledger").option("peers", group.peers).option("group", group.name)
                 .load().writeStream.format("noop").option("checkpointLocation", ck).trigger(availableNow=True)
                 .start())
            q.awaitTermination(120)
            return q

        assert run(g0).exception() is None
        offsets = sorted(os.listdir(Path(ck) / "offsets"))
        with pytest.raises(Exception, match=r"dledger source: the checkpoint holds offsets of group\(s\) g0, which "
                                            r"this query does not read \(it reads g1\)"):
            run(g1)  # awaitTermination raises the query's exception
        assert sorted(os.listdir(Path(ck) / "offsets")) == offsets  # no batch of g1 was planned into it
    finally:
        g0.close()
        g1.close()
