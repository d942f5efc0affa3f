"""The nemesis's short run (``make test``): real members in network namespaces, seeded faults, checked histories.

Each run is ``python -m dledger.testing.nemesis run`` in a process of its own (it moves into the clients'
namespace). The log's history is checked twice: by the project's checker inside the run, and here by
:func:`independent_violations`, a second implementation written from the definitions (pairwise over the
history, no shared code). Every test checks that nothing is left behind: no namespace with the run's tag, no
process mentioning it. Without root or network namespaces they skip, saying why.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import pytest

from dledger.launcher import processes_mentioning
from dledger.testing.nemesis.history import read_ops
from dledger.testing.nemesis.members import faketime_lib
from dledger.testing.nemesis.net import leftovers, unavailable

WHY = unavailable()
pytestmark = [pytest.mark.process, pytest.mark.skipif(WHY is not None, reason=WHY or "")]


def nemesis(tmp_path, tag, *args, timeout=180):
    """Run ``python -m dledger.testing.nemesis run --keep ...``; its result dict, and what it printed."""
    out = tmp_path / "out"
    links = root_links()
    proc = subprocess.run([sys.executable, "-m", "dledger.testing.nemesis", "run", "--out", str(out), "--tag", tag,
                           "--keep", *args], capture_output=True, text=True, timeout=timeout)
    assert leftovers(tag) == [], "namespaces left behind"
    assert root_links() <= links, "links left behind in the root namespace"
    assert processes_mentioning(f"nemesis-{tag}-") == [], "processes left behind"
    results = list(out.glob("*.json"))
    assert len(results) == 1, proc.stdout + proc.stderr
    return json.loads(results[0].read_text()), proc.stdout + proc.stderr


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


def test_log_under_a_seeded_schedule_is_linearizable(tmp_path):
    """Three members, four clients; seed 12's schedule: kill-in-partition, heal-in-election, clock-jump, oneway
    (without libfaketime other kinds take the clock's place). No anomaly by either checker, and the run did
    something."""
    result, printed = nemesis(tmp_path, f"nt{os.getpid() % 1000}", "--workload", "log", "--seed", "12",
                              "--seconds", "12")
    run_dir = tmp_path / "out" / "log-seed12"
    history = read_ops(run_dir / "history.jsonl")
    assert result["anomalies"] == [] and result["stuck"] is None, printed
    assert independent_violations(history, _committed(run_dir)) == []
    assert result["ok"] > 0 and result["faults"] >= 3 and result["failed"] > 0, result
    assert (run_dir / "n0.log").exists() and (run_dir / "schedule.json").exists()


def test_broker_under_a_seeded_schedule_loses_nothing(tmp_path):
    """Three broker members and a name server: no lost acknowledged message, no duplicate beyond resends, no
    queue-offset gap, no consumer offset going backwards."""
    result, printed = nemesis(tmp_path, f"nb{os.getpid() % 1000}", "--workload", "broker", "--seed", "21",
                              "--seconds", "14")
    assert result["anomalies"] == [] and result["stuck"] is None, printed
    events = [json.loads(line) for line in (tmp_path / "out" / "broker-seed21" / "events.jsonl").open()]
    kinds = Counter(e["t"] for e in events)
    assert kinds["send"] > 0 and kinds["pull"] > 0 and result["faults"] >= 3, kinds


def test_a_broken_build_fails_both_checkers(tmp_path):
    """``lonely-commit`` (the leader counts an entry committed once it holds it) with the leader cut off (seed 5's
    first isolate targets the leader): what it acknowledges alone is lost at the heal, and both checkers say so."""
    result, printed = nemesis(tmp_path, f"nm{os.getpid() % 1000}m", "--workload", "log", "--seed", "5",
                              "--seconds", "6", "--kinds", "isolate", "--mutation", "lonely-commit")
    assert any(a.startswith("lost") for a in result["anomalies"]), printed
    run_dir = tmp_path / "out" / "log-seed5-lonely-commit"
    assert independent_violations(read_ops(run_dir / "history.jsonl"), _committed(run_dir)) != []


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


def test_kv_under_a_seeded_schedule_is_linearizable(tmp_path):
    """The example kv map (issue #22's state machine) under seed 31's faults: kv_violations finds nothing."""
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
