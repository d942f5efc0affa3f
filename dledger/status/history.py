"""A member's own recent history: a small bounded ring of samples, turned into sparkline series.

Once a second (:class:`Sampler`, on the reactor's clock) the member's counters are copied into a
:class:`Sample`: the committed index, entries appended as leader, and the append-latency histogram's
counts.  :func:`series` turns consecutive samples into rates and latency percentiles per interval --
pure arithmetic, table-tested.  :data:`MAX_SAMPLES` bounds the memory (about 40 bytes per bucket per
sample: a few hundred kilobytes at most) and what the page sends.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

log = Logger()

#: Samples kept (one a second: the last five minutes).
MAX_SAMPLES = 300
SAMPLE_INTERVAL = 1.0


@dataclass(frozen=True)
class Sample:
    """The member's counters at one moment."""

    at: float
    committed: int
    appended: int  # entries appended as leader since start
    latency_counts: tuple[int, ...] = ()  # append-latency histogram slots (not cumulative), µs buckets
    latency_sum: float = 0.0


def quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float | None:
    """The ``q`` quantile of a histogram's slot ``counts`` (``len(bounds) + 1`` slots, the last +Inf).

    Prometheus' ``histogram_quantile``: linear interpolation inside the bucket holding the rank; the
    +Inf slot answers the highest finite bound.  None for an empty histogram.
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i >= len(bounds):
                return float(bounds[-1])
            lo = float(bounds[i - 1]) if i > 0 else 0.0
            return lo + (float(bounds[i]) - lo) * (rank - seen) / n
        seen += n
    return float(bounds[-1])


def series(samples: Sequence[Sample], bounds: Sequence[float]) -> dict[str, list]:
    """Per-interval points between consecutive samples: ``t`` (end of the interval), committed entries/s,
    appended entries/s, and the append latency's mean, p50 and p99 in milliseconds (None: no append then).
    """
    out: dict[str, list] = {"t": [], "commits_per_s": [], "appends_per_s": [], "latency_mean_ms": [],
                            "latency_p50_ms": [], "latency_p99_ms": []}
    for a, b in zip(samples, samples[1:]):
        dt = b.at - a.at
        if dt <= 0:
            continue
        out["t"].append(round(b.at, 3))
        out["commits_per_s"].append(round(max(0, b.committed - a.committed) / dt, 2))
        out["appends_per_s"].append(round(max(0, b.appended - a.appended) / dt, 2))
        counts = [max(0, y - x) for x, y in zip(a.latency_counts, b.latency_counts)] if a.latency_counts else []
        n = sum(counts)
        if n and len(b.latency_counts) == len(a.latency_counts):
            out["latency_mean_ms"].append(round((b.latency_sum - a.latency_sum) / n / 1000.0, 3))
            out["latency_p50_ms"].append(_ms(quantile(bounds, counts, 0.5)))
            out["latency_p99_ms"].append(_ms(quantile(bounds, counts, 0.99)))
        else:
            for key in ("latency_mean_ms", "latency_p50_ms", "latency_p99_ms"):
                out[key].append(None)
    return out


def _ms(us: float | None) -> float | None:
    return None if us is None or math.isinf(us) else round(us / 1000.0, 3)


def take_sample(server: Any, now: float) -> Sample:
    """Copy the counters of ``server`` (a :class:`~dledger.server.DLedgerServer`); on the reactor thread."""
    stats = server.stats
    if stats is None:
        return Sample(now, server.store.committed_index, 0)
    h = stats.append_latency
    return Sample(now, server.store.committed_index, stats.entries_appended, tuple(h.counts), h.sum)


class History:
    """The ring of samples; ``bounds`` are the latency histogram's bucket bounds (µs)."""

    def __init__(self, bounds: Sequence[float], limit: int = MAX_SAMPLES):
        self.bounds = tuple(bounds)
        self.samples: deque[Sample] = deque(maxlen=limit)

    def add(self, sample: Sample) -> None:
        if self.samples and sample.committed < self.samples[-1].committed:
            self.samples.clear()  # a new server (restarted in process): rates across it mean nothing
        self.samples.append(sample)

    def series(self) -> dict[str, list]:
        return series(list(self.samples), self.bounds)


class Sampler:
    """Samples ``get_server()`` into ``history`` every ``interval`` seconds of ``clock`` (a LoopingCall)."""

    def __init__(self, get_server: Callable[[], Any], history: History, clock: Any,
                 interval: float = SAMPLE_INTERVAL):
        self.get_server = get_server
        self.history = history
        self.clock = clock
        self.loop = LoopingCall(self.tick)
        self.loop.clock = clock
        self.interval = interval

    def start(self) -> None:
        if not self.loop.running:
            self.loop.start(self.interval, now=True)

    def stop(self) -> None:
        if self.loop.running:
            self.loop.stop()

    def tick(self) -> None:
        server = self.get_server()
        if server is None or not server.running:
            return
        try:
            self.history.add(take_sample(server, self.clock.seconds()))
        except Exception:  # a store mid-change must not end the loop (LoopingCall stops on an error)
            log.failure("status sample failed")
