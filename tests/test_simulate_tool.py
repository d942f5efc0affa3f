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

    def broken(seed, duration=8.0, store="simdisk", **options):
        result = real(seed, duration=1.0, store=store, **options)
        result.lost.append("synthetic")
        return result

    monkeypatch.setattr(replication_sim, "run_replication_seed", broken)
    assert simulate.main(["replication", "--seeds", "1", "--start", "9"]) == 1
    out = capsys.readouterr().out
    assert "replay: python -m tools.simulate replication --seed 9" in out and "lost=1" in out


def test_failing_seed_replay_repeats_the_mix_and_latencies(capsys, monkeypatch):
    """A failing seed's replay line carries --mix, --flush-latency, --term-latency and --no-tear (issue #29)."""
    from dledger.testing import replication_sim
    seen = {}

    def broken(seed, duration=8.0, store="simdisk", **options):
        seen.update(options)
        result = replication_sim.SimResult(seed, 3)
        result.lost.append("synthetic")
        return result

    monkeypatch.setattr(replication_sim, "run_replication_seed", broken)
    args = ["replication", "--seeds", "1", "--start", "4", "--mix", "crash_leader_quick=0.5",
            "--flush-latency", "0.002-0.01", "--term-latency", "0.001", "--no-tear"]
    assert simulate.main(args) == 1
    out = capsys.readouterr().out
    assert ("replay: python -m tools.simulate replication --seed 4 --mix crash_leader_quick=0.5 "
            "--flush-latency 0.002-0.01 --term-latency 0.001 --no-tear") in out
    assert seen["flush_latency"] == (0.002, 0.01) and seen["term_write_latency"] == 0.001
    assert seen["tear"] is False and seen["mix"].crash_leader_quick == 0.5


def test_bad_mix_and_latency_are_one_line_errors(capsys):
    """An unknown fault name or a negative latency is refused by argparse with one line naming it."""
    import pytest
    for args, needle in ((["election", "--mix", "partiton=1"], "unknown fault mix entry 'partiton=1'"),
                         (["election", "--flush-latency", "0.008-0.001"], "LOW <= HIGH"),
                         (["election", "--flush-latency", "-1"], "is not seconds"),
                         (["replication", "--term-latency", "fast"], "is not seconds")):
        with pytest.raises(SystemExit) as exc:
            simulate.main(args)
        assert exc.value.code == 2
        assert needle in capsys.readouterr().err


def test_membership_replay_line_and_summary(capsys, monkeypatch):
    """--membership: the summary adds the change figures; a failing seed's replay repeats --duration and the mode."""
    from dledger.testing import replication_sim
    from dledger.testing.membership_sim import ChangeStats
    seen = {}

    def broken(seed, duration=8.0, store="simdisk", **options):
        seen.update(options, duration=duration)
        result = replication_sim.SimResult(seed, 3, changes=ChangeStats())
        result.changes.proposed["add"] += 2
        result.changes.committed["add"] += 1
        result.changes.refused["another configuration change"] += 1
        result.membership.append("synthetic")
        return result

    monkeypatch.setattr(replication_sim, "run_replication_seed", broken)
    assert simulate.main(["replication", "--membership", "--seeds", "1", "--start", "6", "--duration", "3"]) == 1
    out = capsys.readouterr().out
    assert "replay: python -m tools.simulate replication --seed 6 --membership --duration 3" in out
    assert "membership: synthetic" in out and "changes_proposed=2, changes_committed=1, refused=1" in out
    assert "membership=1" in out and "refusals: another configuration change=1" in out
    assert seen["membership"] is True and seen["duration"] == 3.0


def test_mutation_needs_membership(capsys):
    import pytest
    with pytest.raises(SystemExit):
        simulate.main(["replication", "--mutation", "own-term"])
    assert "use it with --membership" in capsys.readouterr().err
