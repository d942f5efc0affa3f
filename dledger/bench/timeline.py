"""What a benchmark run looked like over time (for ``--plot``): rates and latencies per time bucket.

The load phases note each acknowledged append here as it happens (an index and an addition: cheap
next to a network round trip); the results carry the series as plain lists, so ``--json`` output
can be plotted later too.  Pure arithmetic, table-tested (tests/test_bench_plot.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

#: Width of a time bucket, seconds.
BUCKET_S = 0.25
#: Percentiles of the latency curve.
PERCENTILES = (50.0, 75.0, 90.0, 95.0, 99.0, 99.9, 99.99, 100.0)
#: At most this many acknowledged appends are kept per failover trial (thinned evenly beyond it).
MAX_TRIAL_POINTS = 2000


def _bucket(t: float, start: float, width: float) -> int:
    return max(0, int((t - start) / width))


class RateSeries:
    """Events per second in buckets of ``width`` seconds from ``start``."""

    def __init__(self, start: float, width: float = BUCKET_S):
        self.start, self.width = start, width
        self.counts: list[int] = []

    def add(self, t: float, n: int = 1) -> None:
        i = _bucket(t, self.start, self.width)
        if i >= len(self.counts):
            self.counts.extend([0] * (i + 1 - len(self.counts)))
        self.counts[i] += n

    def to_dict(self) -> dict[str, Any]:
        w = self.width
        return {"bucket_s": w, "t": [round((i + 1) * w, 3) for i in range(len(self.counts))],
                "per_s": [round(c / w, 1) for c in self.counts]}


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """The ``q``-th percentile (0..100) of sorted values: the nearest rank (None when empty)."""
    if not sorted_values:
        return None
    rank = math.ceil(q / 100.0 * len(sorted_values) - 1e-9)
    return sorted_values[min(len(sorted_values), max(1, rank)) - 1]


class LatencySeries:
    """Latencies in buckets of ``width`` seconds (by when the request was due); p50/p99/max per bucket."""

    def __init__(self, start: float, width: float = BUCKET_S):
        self.start, self.width = start, width
        self.bins: list[list[float]] = []

    def add(self, t: float, latency_s: float) -> None:
        i = _bucket(t, self.start, self.width)
        if i >= len(self.bins):
            self.bins.extend([] for _ in range(i + 1 - len(self.bins)))
        self.bins[i].append(latency_s)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"bucket_s": self.width, "t": [], "p50_ms": [], "p99_ms": [], "max_ms": []}
        for i, values in enumerate(self.bins):
            values = sorted(values)
            out["t"].append(round((i + 1) * self.width, 3))
            for key, q in (("p50_ms", 50.0), ("p99_ms", 99.0), ("max_ms", 100.0)):
                v = percentile(values, q)
                out[key].append(None if v is None else round(v * 1e3, 3))
        return out


def percentile_curve(sorted_latencies_s: Sequence[float]) -> dict[str, list]:
    """``{"q": [...], "ms": [...]}``: the latency at each of :data:`PERCENTILES`."""
    qs = [q for q in PERCENTILES if sorted_latencies_s]
    return {"q": qs, "ms": [round(percentile(sorted_latencies_s, q) * 1e3, 3) for q in qs]}


def failover_trial(successes: Sequence[float], answered_by: Sequence[str | None], killed_at: float, ok: float,
                   *, before: float = 1.0, after: float = 1.0) -> dict[str, Any]:
    """One failover trial as a timeline: acknowledged appends from ``before`` s before the kill to ``after``
    s after the first one acknowledged by a new leader, times relative to the kill."""
    lo, hi = killed_at - before, ok + after
    points = [(round(t - killed_at, 4), by) for t, by in zip(successes, answered_by) if lo <= t <= hi]
    if len(points) > MAX_TRIAL_POINTS:
        step = len(points) / MAX_TRIAL_POINTS
        points = [points[int(i * step)] for i in range(MAX_TRIAL_POINTS)]
    return {"recovered_s": round(ok - killed_at, 4), "acks_s": [t for t, _ in points],
            "leaders": [by for _, by in points]}
