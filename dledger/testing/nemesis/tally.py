"""Counting a run's operations under the faults they overlapped (the summary table's rows).

Its own module, below the runner and the workloads, because both use it (the workloads count their
operations; the runner prints the table).
"""

from __future__ import annotations


def attribute(result, op_spans: list[tuple[float, float | None, str]]) -> None:
    """Count each operation under every fault kind whose window it overlapped (failures and timeouts too)."""
    for invoked, completed, outcome in op_spans:
        end = completed if completed is not None else invoked
        for kind, lo, hi in result.windows:
            if lo is not None and invoked <= hi and end >= lo:
                k = result.kinds[kind]
                k["ops"] += 1
                k["failed"] += outcome != "ok"
                k["timeouts"] += outcome == "timeout"

