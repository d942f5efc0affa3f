"""What a member counts for monitoring: plain counters and fixed-bucket histograms, read on scrape.

The server only *records* here (a bisect and three additions per
observation, no locks, no exporter calls); :mod:`dledger.metrics` turns a
snapshot into Prometheus families when it is scraped.  Nothing is recorded
unless :meth:`dledger.server.DLedgerServer.enable_stats` was called, so a
member without metrics pays one ``is None`` test per append.

Latencies are in microseconds with Java DLedger's bucket bounds
(``DLedgerMetricsManager.registerMetricsView``: 1 µs ... 10 s), because
that is what Java records under the same metric names.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from dledger.codes import ResponseCode

#: Java DLedger's latency buckets, in microseconds.
LATENCY_BUCKETS_US: tuple[float, ...] = (
    1, 3, 5, 10, 30, 50, 100, 300, 500,
    1_000, 2_000, 3_000, 5_000, 10_000, 30_000, 50_000, 100_000, 300_000, 500_000,
    1_000_000, 3_000_000, 5_000_000, 10_000_000,
)
#: Entries per request / per push.
COUNT_BUCKETS: tuple[float, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 4096, 16384)
#: Bytes per request / per push.
BYTES_BUCKETS: tuple[float, ...] = tuple(float(1 << s) for s in range(6, 25, 2))  # 64 B .. 16 MiB


def lag_entries(leader_begin: int, leader_end: int, known: int) -> int:
    """Entries the leader holds that a follower is not known to hold (``dledger_lag_entries_count``).

    ``known`` is the highest index the follower is known to hold, -1 when unknown (it does not answer,
    or has not been compared yet): then every entry the leader holds counts, so a wiped or unreachable
    follower never reads as in sync.
    """
    if leader_end < 0:
        return 0
    return max(0, leader_end - max(known, leader_begin - 1))


class Histogram:
    """Counts per bucket (``value <= bound``; the last slot is +Inf), plus sum and count."""

    __slots__ = ("bounds", "counts", "sum", "count")

    def __init__(self, bounds: tuple[float, ...]):
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value
        self.count += 1

    def cumulative(self) -> list[tuple[float, int]]:
        """``[(upper bound, cumulative count), ...]`` ending with ``(inf, count)`` (Prometheus' shape)."""
        out, total = [], 0
        for bound, n in zip(self.bounds, self.counts):
            total += n
            out.append((float(bound), total))
        out.append((math.inf, total + self.counts[-1]))
        return out

    def copy(self) -> Histogram:
        h = Histogram(self.bounds)
        h.counts, h.sum, h.count = list(self.counts), self.sum, self.count
        return h


class ServerStats:
    """Counters and histograms of one member, updated on the reactor thread by the server and replication."""

    def __init__(self, clock: Any):
        self.clock = clock
        self.append_latency = Histogram(LATENCY_BUCKETS_US)
        self.append_batch_count = Histogram(COUNT_BUCKETS)
        self.append_batch_bytes = Histogram(BYTES_BUCKETS)
        self.read_latency = Histogram(LATENCY_BUCKETS_US)
        self.replicate_latency: dict[str, Histogram] = {}
        self.replicate_batch_count: dict[str, Histogram] = {}
        self.replicate_batch_bytes: dict[str, Histogram] = {}
        #: Finished client appends by result code name (SUCCESS, WAIT_QUORUM_ACK_TIMEOUT, TERM_CHANGED, ...).
        self.appends: dict[str, int] = {}
        #: Entries appended by this member as leader (NOOPs excluded).
        self.entries_appended = 0
        self.role_changes = 0

    # -- leader appends ----------------------------------------------------------------
    def append_accepted(self, d: Any, count: int, nbytes: int, started: float) -> None:
        """An append request of ``count`` bodies was stored; ``d`` fires with its response."""
        self.entries_appended += count
        self.append_batch_count.observe(count)
        self.append_batch_bytes.observe(nbytes)
        d.addCallback(self._append_done, started)

    def _append_done(self, response: Any, started: float) -> Any:
        name = ResponseCode.of(response.code).name
        self.appends[name] = self.appends.get(name, 0) + 1
        if name == "SUCCESS":
            self.append_latency.observe((self.clock.seconds() - started) * 1e6)
        return response

    def read_done(self, started: float) -> None:
        self.read_latency.observe((self.clock.seconds() - started) * 1e6)

    # -- replication ---------------------------------------------------------------------
    def timed_push(self, peer: str, count: int, nbytes: int, on_reply: Callable[[Any], None]) -> Callable[[Any], None]:
        """Wrap ``on_reply`` of an APPEND push to ``peer`` so that a SUCCESS reply records its round trip."""
        started = self.clock.seconds()

        def reply(resp: Any) -> None:
            if resp.code == ResponseCode.SUCCESS:
                h = self.replicate_latency.get(peer)
                if h is None:
                    h = self.replicate_latency[peer] = Histogram(LATENCY_BUCKETS_US)
                    self.replicate_batch_count[peer] = Histogram(COUNT_BUCKETS)
                    self.replicate_batch_bytes[peer] = Histogram(BYTES_BUCKETS)
                h.observe((self.clock.seconds() - started) * 1e6)
                self.replicate_batch_count[peer].observe(count)
                self.replicate_batch_bytes[peer].observe(nbytes)
            on_reply(resp)

        return reply

    def role_changed(self, term: int, role: Any) -> None:
        self.role_changes += 1
