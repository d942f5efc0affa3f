"""The simulator command line: summary line, replay of one seed, exit status."""

from tools import simulate


def test_replication_summary_line(capsys):
    """`python -m tools.simulate replication` prints the summary line and exits 0 when all is safe."""
    assert simulate.main(["replication", "--seeds", "3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()[-1]
    assert out.startswith("seeds=3, faults=") and "lost=0, divergent=0, nonlinearizable=0" in out


def test_election_replay_one_seed(capsys):
    """`--seed N --verbose` replays exactly one schedule and reports it."""
    assert simulate.main(["election", "--seed", "5", "--verbose"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("seed 5: members=") and lines[-1].startswith("seeds=1,")


def test_failing_seed_prints_replay_command(capsys, monkeypatch):
    """A schedule with a safety problem makes the tool exit 1 and print how to replay it."""
    from dledger.testing import replication_sim
    real = replication_sim.run_replication_seed

    def broken(seed, duration=8.0, store="simdisk"):
        result = real(seed, duration=1.0, store=store)
        result.lost.append("synthetic")
        return result

    monkeypatch.setattr(replication_sim, "run_replication_seed", broken)
    assert simulate.main(["replication", "--seeds", "1", "--start", "9"]) == 1
    out = capsys.readouterr().out
    assert "replay: python -m tools.simulate replication --seed 9" in out and "lost=1" in out
