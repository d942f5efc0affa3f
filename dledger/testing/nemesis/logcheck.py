"""The log workload's verdict: the project's checker plus what a nemesis history adds.

* **lost / moved** -- an acknowledged append is not at its acknowledged index in the final committed log;
* **duplicated** -- a body is in the log more than once (clients never retry an append whose fate is unknown,
  so every body is sent in one request attempt that may or may not land: at most once);
* **divergent** -- two members' committed logs differ at an index;
* **unstable read** -- two reads of one index returned different bodies;
* **non-linearizable** -- :func:`dledger.testing.checker.linearizability_violations` (stale reads, a read of an
  uncommitted entry, an append acknowledged at an index older than one already visible).
"""

from __future__ import annotations

from collections import Counter

from dledger.testing.checker import History, linearizability_violations


def merge_committed(logs: dict[str, dict[int, bytes]]) -> tuple[dict[int, bytes], list[str]]:
    """One committed log from every member's (index -> body, NOOPs left out); the divergences found meanwhile."""
    merged: dict[int, bytes] = {}
    owner: dict[int, str] = {}
    problems = []
    for member in sorted(logs):
        for index, body in logs[member].items():
            seen = merged.setdefault(index, body)
            owner.setdefault(index, member)
            if seen != body:
                problems.append(f"divergent: {member} committed {body[:24]!r} at {index}, "
                                f"{owner[index]} committed {seen[:24]!r}")
    return merged, problems


def check_log_history(history: History, logs: dict[str, dict[int, bytes]], prefix: bytes = b"") -> list[str]:
    """Every anomaly of ``history`` against the members' final committed logs (empty: the run is linearizable).

    ``prefix``: only bodies starting with it are the workload's (probes and NOOPs are not counted as duplicates).
    """
    log, problems = merge_committed(logs)
    for op in history.acked:
        missing = sorted(m for m, lg in logs.items() if lg.get(op.index) != op.body)
        if missing:
            problems.append(f"lost: append {op.body[:24]!r} acknowledged at {op.index} is not there on "
                            f"{', '.join(missing)}")
    counts = Counter(b for b in log.values() if b.startswith(prefix))
    problems += [f"duplicated: {body[:24]!r} is in the log {n} times" for body, n in counts.items() if n > 1]
    reads: dict[int, bytes] = {}
    for op in history.ops:
        if op.kind == "get" and op.ok:
            first = reads.setdefault(op.index, op.result)
            if first != op.result:
                problems.append(f"unstable read: index {op.index} read as {first[:24]!r} and {op.result[:24]!r}")
    problems += [f"non-linearizable: {p}" for p in linearizability_violations(history, log)]
    return problems
