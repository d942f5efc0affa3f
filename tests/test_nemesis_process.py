"""The nemesis's short run (``make test``): real members in network namespaces, seeded faults, checked histories.

Each run is ``python -m dledger.testing.nemesis run`` in a process of its own (it moves into the clients'
namespace). The log's history is checked twice: by the project's checker inside the run, and here by
:func:`independent_violations`, a second implementation written from the definitions (pairwise over the
history, no shared code). Every test checks that nothing is left behind: no namespace with the run's tag, no
process mentioning it. Without root or network namespaces they skip, saying why.

``make test`` runs the short runs of :data:`SHORT` (log, broker and a broken build, started together), the
SIGTERM clean-up and the clock check: about 35 s. The kv run and the broken builds that show pause-follower and
kill-in-partition failing the checker are longer: marked slow, they run with ``-m slow`` or ``DLEDGER_SLOW=1``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from dledger.launcher import processes_mentioning
from dledger.testing.nemesis.history import read_ops
from dledger.testing.nemesis.members import faketime_lib
from dledger.testing.nemesis.net import leftovers, unavailable

WHY = unavailable()
pytestmark = [pytest.mark.process, pytest.mark.skipif(WHY is not None, reason=WHY or "")]


def slow_requested(request) -> bool:
    """Whether the long nemesis tests run: with ``-m slow`` (``make soak``) or ``DLEDGER_SLOW=1``."""
    return "slow" in (request.config.getoption("markexpr") or "") or bool(os.environ.get("DLEDGER_SLOW"))


def only_when_slow(request) -> None:
    if not slow_requested(request):
        pytest.skip("a long nemesis run: runs with -m slow or DLEDGER_SLOW=1 (make test runs the short ones)")


def launch(out, tag, *args) -> subprocess.Popen:
    """Start ``python -m dledger.testing.nemesis run --keep ...`` (its own namespaces, tagged ``tag``)."""
    return subprocess.Popen([sys.executable, "-m", "dledger.testing.nemesis", "run", "--out", str(out), "--tag", tag,
                             "--keep", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def collect(proc: subprocess.Popen, out, tag, links: set[str], timeout: float = 180):
    """Wait for a launched run; check it left nothing behind; its result dict and what it printed."""
    try:
        printed, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.terminate()
        printed, _ = proc.communicate(timeout=60)
    assert leftovers(tag) == [], "namespaces left behind"
    assert root_links() <= links, "links left behind in the root namespace"
    assert processes_mentioning(f"nemesis-{tag}-") == [], "processes left behind"
    results = list(out.glob("*.json"))
    assert len(results) == 1, printed
    return json.loads(results[0].read_text()), printed


def nemesis(tmp_path, tag, *args, timeout=180):
    """Run ``python -m dledger.testing.nemesis run --keep ...`` to its end; its result dict, and what it printed."""
    out = tmp_path / "out"
    links = root_links()
    return collect(launch(out, tag, *args), out, tag, links, timeout)


def root_links() -> set[str]:
    """The link names of the namespace the tests run in (the nemesis creates none here)."""
    out = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    return {line.split(":")[1].strip().split("@")[0] for line in out.splitlines()}


def independent_violations(history, logs: dict[str, dict[int, bytes]]) -> list[str]:
    """The log's linearizability conditions, checked pairwise from their definitions.

    The final log is what every member committed (they must agree). Then: an acknowledged append is at its
    index, and no body is there twice; a read returned what the log holds at its index and what was appended
    before the read ended; two reads of an index agree; and for every pair of operations where A completed
    before B was invoked, where A showed index ``k`` exists (an acknowledged append at ``k``, a read of ``k``):
    B, an acknowledged append, landed after ``k``; B, a read that found nothing at ``j``, asked for ``j > k``.
    """
    out = []
    final: dict[int, bytes] = {}
    for log in logs.values():
        for index, body in log.items():
            if final.setdefault(index, body) != body:
                out.append(f"members disagree at {index}")
    out += [f"{b!r} {n} times" for b, n in Counter(final.values()).items() if n > 1 and b.startswith(b"nemesis")]
    ops = [op for op in history.ops if op.completed is not None]
    appended_at = {}
    for op in history.ops:
        if op.kind == "append":
            appended_at[op.body] = min(appended_at.get(op.body, op.invoked), op.invoked)
    reads: dict[int, set] = {}
    for op in ops:
        if op.kind == "append" and op.ok and final.get(op.index) != op.body:
            out.append(f"acknowledged {op.body!r} not at {op.index}")
        if op.kind == "get" and op.ok:
            reads.setdefault(op.index, set()).add(op.result)
            if final.get(op.index) != op.result or appended_at.get(op.result, float("inf")) > op.completed:
                out.append(f"read {op.result!r} at {op.index}")
    out += [f"reads of {i} disagree" for i, seen in reads.items() if len(seen) > 1]
    shown = [(op.completed, op.index) for op in ops if op.ok]
    for b in ops:
        if b.kind == "append" and b.ok:
            bad = [k for done, k in shown if done < b.invoked and k >= b.index]
        elif b.kind == "get" and b.error == "INDEX_OUT_OF_RANGE":
            bad = [k for done, k in shown if done < b.invoked and k >= b.index]
        else:
            continue
        if bad:
            out.append(f"{b.kind} at {b.index} by {b.client} after index {max(bad)} was shown to exist")
    return out


def _committed(run_dir):
    raw = json.loads((run_dir / "committed.json").read_text())
    return {m: {int(i): b.encode("latin-1") for i, b in log.items()} for m, log in raw.items()}


#: What ``make test`` runs, all three at once (each in namespaces of its own; they share nothing but the CPU), so
#: the short run costs the longest of them (about 25 s idle) rather than their sum. Seeds chosen for coverage:
#: the log's seed 37 is pause-follower then kill-in-partition; the broker's seed 27 heal-in-election, clock-jump
#: (another kind without libfaketime) and pause-leader; the mutant's seed 5 isolates the leader first.
SHORT = {
    "log": ("--workload", "log", "--seed", "37", "--seconds", "8"),
    "broker": ("--workload", "broker", "--seed", "27", "--seconds", "8"),
    "mutant": ("--workload", "log", "--seed", "5", "--seconds", "5", "--kinds", "isolate",
               "--mutation", "lonely-commit", "--converge-timeout", "10"),
}


@pytest.fixture(scope="module")
def short_runs(tmp_path_factory):
    """The short runs of :data:`SHORT`, started together; name -> (result, printed, run folder)."""
    base = tmp_path_factory.mktemp("nemesis")
    links = root_links()
    procs, done, errors = {}, {}, []
    try:
        for name, args in SHORT.items():
            tag = f"n{name[0]}{os.getpid() % 1000}"
            procs[name] = (launch(base / name, tag, *args), tag)
    finally:
        for name, (proc, tag) in procs.items():  # every one waited for and checked, whatever the others did
            try:
                result, printed = collect(proc, base / name, tag, links)
            except BaseException as exc:
                errors.append(exc)
            else:
                done[name] = (result, printed, base / name / Path(result["dir"]).name if result["dir"] else None)
    if errors:
        raise errors[0]
    return done


def test_log_under_a_seeded_schedule_is_linearizable(short_runs):
    """Three members, four clients; seed 37's schedule: pause-follower, then kill-in-partition (without
    libfaketime the same). No anomaly by either checker, and the run did something."""
    result, printed, run_dir = short_runs["log"]
    assert result["anomalies"] == [] and result["stuck"] is None, printed
    history = read_ops(run_dir / "history.jsonl")
    assert independent_violations(history, _committed(run_dir)) == []
    assert result["ok"] > 0 and result["faults"] >= 2 and result["failed"] > 0, result
    assert set(result["kinds"]) == {"pause-follower", "kill-in-partition"}
    assert (run_dir / "n0.log").exists() and (run_dir / "schedule.json").exists()


def test_broker_under_a_seeded_schedule_loses_nothing(short_runs):
    """Three broker members and a name server: no lost acknowledged message, no duplicate beyond resends, no
    queue-offset gap, no consumer offset going backwards."""
    result, printed, run_dir = short_runs["broker"]
    assert result["anomalies"] == [] and result["stuck"] is None, printed
    events = [json.loads(line) for line in (run_dir / "events.jsonl").open()]
    kinds = Counter(e["t"] for e in events)
    assert kinds["send"] > 0 and kinds["pull"] > 0 and result["faults"] >= 2, kinds


def test_a_broken_build_fails_both_checkers(short_runs, tmp_path):
    """``lonely-commit`` (the leader counts an entry committed once it holds it) with the leader cut off (seed 5's
    first isolate targets the leader): what it acknowledges alone is lost at the heal, and both checkers say so.
    (It never converges -- its members' logs diverge -- so the run gives it 3 s, not 60.)

    Whether the isolated leader acknowledges anything alone depends on the interleaving of real processes: it
    steps down (check-quorum) about 0.75 s after the cut, and in one CI run every client request of that window
    was answered NOT_LEADER, so nothing was lost.  A miss is therefore run once more (the same schedule); the
    test fails when neither run is caught by both checkers.  (The same holds for the independent checker: in
    one CI run the checker's "acknowledged at 38 is not there on n2" had no counterpart in the members' final
    logs as read after the run: which of the diverged members' entries the final logs hold is timing too.)"""
    result, printed, run_dir = short_runs["mutant"]
    verdicts = [printed]

    def caught(result, run_dir) -> bool:
        return (any(a.startswith("lost") for a in result["anomalies"])
                and independent_violations(read_ops(run_dir / "history.jsonl"), _committed(run_dir)) != [])

    if not caught(result, run_dir):
        result, printed = nemesis(tmp_path, f"nr{os.getpid() % 1000}", *SHORT["mutant"])
        run_dir = tmp_path / "out" / "log-seed5-lonely-commit"
        verdicts.append(printed)
    assert any(a.startswith("lost") for a in result["anomalies"]), "\n".join(verdicts)
    assert independent_violations(read_ops(run_dir / "history.jsonl"), _committed(run_dir)) != [], "\n".join(verdicts)


def stale_reads(history) -> list:
    """The reads that said "not there yet" at an index some operation had shown to exist before they began."""
    shown = [(op.completed, op.index) for op in history.ops if op.ok and op.completed is not None]
    return [op for op in history.ops if op.kind == "get" and op.error == "INDEX_OUT_OF_RANGE"
            and any(done < op.invoked and k >= op.index for done, k in shown)]


@pytest.mark.slow
def test_pause_follower_fails_a_build_whose_followers_read_alone(tmp_path, request):
    """``follower-read`` (a member that does not lead answers GETs from its own log, without ReadIndex) under
    pause-follower only (seed 1: three pauses of one follower): reads the stopped follower received while
    stopped are answered at its SIGCONT from what it knew before the pause -- stale, and the checkers say so.
    (A follower a heartbeat behind answers stale too: in three runs 6 of 14, 3 of 11 and 0 of 3 of the stale
    reads were sent during a pause; docs/testing.md "Nemesis".)"""
    only_when_slow(request)
    result, printed = nemesis(tmp_path, f"np{os.getpid() % 1000}", "--workload", "log", "--seed", "1",
                              "--seconds", "15", "--kinds", "pause-follower", "--mutation", "follower-read",
                              "--converge-timeout", "10")
    assert any("stale read" in a for a in result["anomalies"]), printed
    run_dir = tmp_path / "out" / "log-seed1-follower-read"
    history = read_ops(run_dir / "history.jsonl")
    assert independent_violations(history, _committed(run_dir)) != []
    assert stale_reads(history), "the second check sees no stale read"


@pytest.mark.slow
def test_kill_in_partition_fails_a_lonely_commit_build(tmp_path, request):
    """``lonely-commit`` under kill-in-partition only: a leader left alone -- its majority-side follower killed
    mid-partition (when nobody leads at that moment the kill falls on a random majority member), or itself on
    the minority side -- acknowledges appends by itself, a later majority elects without it and those appends
    are lost. Whether the window opens depends on the interleaving of real processes (seed 4 caught it in 2 of
    3 runs, seed 6 in 1 of 1), so seed 4 and then seed 6 are tried: the test fails when neither is caught."""
    only_when_slow(request)
    verdicts = []
    for seed in (4, 6):
        result, printed = nemesis(tmp_path / f"s{seed}", f"nq{os.getpid() % 1000}", "--workload", "log",
                                  "--seed", str(seed), "--seconds", "15", "--kinds", "kill-in-partition",
                                  "--mutation", "lonely-commit", "--converge-timeout", "10")
        verdicts.append(printed)
        if any(a.startswith("lost") for a in result["anomalies"]):
            return
    pytest.fail("kill-in-partition did not catch lonely-commit with seed 4 or 6:\n" + "\n".join(verdicts))


def test_sigterm_mid_run_removes_everything(tmp_path):
    """A run stopped with SIGTERM while its faults run kills its members and deletes its namespaces."""
    tag = f"ns{os.getpid() % 1000}"
    proc = subprocess.Popen([sys.executable, "-m", "dledger.testing.nemesis", "run", "--tag", tag, "--seconds", "60",
                             "--out", str(tmp_path)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while len(processes_mentioning(f"nemesis-{tag}-")) < 3 or len(leftovers(tag)) < 5:
            assert time.monotonic() < deadline and proc.poll() is None, "the run did not start its members"
            time.sleep(0.2)
        assert len(leftovers(tag)) == 5  # hub, three members, the clients
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) != 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert leftovers(tag) == []
    assert processes_mentioning(f"nemesis-{tag}-") == []


@pytest.mark.slow
def test_kv_under_a_seeded_schedule_is_linearizable(tmp_path, request):
    """The example kv map (issue #22's state machine) under seed 31's faults: kv_violations finds nothing."""
    only_when_slow(request)
    from dledger.plugins import get_plugin_manager
    from dledger.testing.nemesis.kvload import available
    why = available()
    if why is None and not any(name == "kv" for name, _ in get_plugin_manager().list_name_plugin()):
        why = "the example distribution's kv entry point is not installed (make .venv/.installed reinstalls it)"
    if why is not None:
        pytest.skip(why)
    result, printed = nemesis(tmp_path, f"nk{os.getpid() % 1000}", "--workload", "kv", "--seed", "31",
                              "--seconds", "10")
    assert result["anomalies"] == [] and result["stuck"] is None, printed
    assert result["ok"] > 0 and result["faults"] >= 2, result


@pytest.mark.skipif(faketime_lib() is None, reason="libfaketime is not installed (make nemesis-deps installs it)")
def test_a_clock_fault_reaches_only_its_members_processes(tmp_path):
    """What a member process starts with makes its wall clock the one its timestamp file says, and only its own."""
    from dledger.testing.nemesis.members import Processes

    procs = Processes(None, tmp_path, clock=True)
    probe = [sys.executable, "-c", "import time; print(time.time())"]

    def offset(name):
        return float(subprocess.run(probe, env=procs.env(name), capture_output=True, text=True, check=True,
                                    timeout=60).stdout) - time.time()
    procs.set_clock("n0", -30.0)
    procs.set_clock("n1", 0.0)
    assert -33 < offset("n0") < -27
    assert -3 < offset("n1") < 3
    procs.set_clock("n0", 12.5)
    assert 9.5 < offset("n0") < 15.5
