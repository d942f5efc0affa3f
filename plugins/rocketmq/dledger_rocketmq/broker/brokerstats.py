"""RocketMQ's runtime statistics, kept as a 4.9.8 broker keeps them (pure: every call takes the time).

Why a module of its own: ``mqadmin brokerStatus``, ``clusterList``,
``consumerProgress``, ``statsAll`` and the rocketmq-dashboard read figures a
RocketMQ broker keeps in two places, and they only mean the same thing here
if they are computed the same way:

- **BrokerStatsManager** (``StatsItemSet`` per name, ``StatsItem`` per key):
  ``TOPIC_PUT_NUMS`` / ``TOPIC_PUT_SIZE`` (key: topic),
  ``GROUP_GET_NUMS`` / ``GROUP_GET_SIZE`` / ``GROUP_GET_LATENCY`` (key:
  ``topic@group``), ``SNDBCK_PUT_NUMS`` (``topic@group``), ``BROKER_PUT_NUMS``
  / ``BROKER_GET_NUMS`` (key: the cluster name).  Each item counts a value and
  a number of calls; snapshots of both are taken every 10 s (7 kept: the
  last minute), every 10 min (7 kept: the last hour) and every hour (25 kept:
  the last day), the first one preceded by a zero snapshot one period
  earlier.  A window's ``sum`` is the value's growth between its first and
  last snapshot, ``tps`` that per second, ``avgpt`` the value per call.
  VIEW_BROKER_STATS_DATA answers these three windows; GET_CONSUME_STATS's
  ``consumeTps`` is the minute window's tps of ``GROUP_GET_NUMS`` ``topic@group``.
- **StoreStatsService**: messages put per topic (``putMessageTimesTotal``
  counts *messages*: a batch of 8 adds 8), bytes written, puts that failed,
  pulls that found messages or not and messages handed out; a snapshot of
  the counters every second (601 kept), from which ``putTps``,
  ``getFoundTps``, ``getMissTps``, ``getTotalTps`` and ``getTransferedTps``
  give the rate over the last 10, 60 and 600 seconds (an empty string while
  fewer snapshots exist: ``"0.0  "`` is a broker up 10 to 60 s); the put
  latency distribution of the current minute (13 ranges,
  ``putMessageDistributeTime``) and ``putLatency99`` / ``putLatency999``
  interpolated in fine buckets (1 ms steps to 20 ms, ... 1 s steps to 10 s)
  over the *previous* minute, both reset every 60 s.
- **BrokerStats**: ``msgPutTotalTodayNow`` (= putMessageTimesTotal),
  ``msgGetTotalTodayNow`` (messages handed out), and the same counters as
  they were at the last two midnights (``...TodayMorning``,
  ``...YesterdayMorning``; 0 before the first midnight, as a broker that
  started today shows).

The member feeds it (:meth:`BrokerStatsManager.on_put`, :meth:`on_get`,
:meth:`on_send_back`) and calls :meth:`BrokerStatsManager.tick` every second;
whatever sampling is due at that time is done.  The counters are the
member's own since it started (as each RocketMQ broker's are its own since
it started): they are not carried by the log.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, tzinfo
from decimal import Decimal

# -- BrokerStatsManager's item names ------------------------------------------------------------------------

TOPIC_PUT_NUMS = "TOPIC_PUT_NUMS"
TOPIC_PUT_SIZE = "TOPIC_PUT_SIZE"
GROUP_GET_NUMS = "GROUP_GET_NUMS"
GROUP_GET_SIZE = "GROUP_GET_SIZE"
GROUP_GET_LATENCY = "GROUP_GET_LATENCY"
SNDBCK_PUT_NUMS = "SNDBCK_PUT_NUMS"
BROKER_PUT_NUMS = "BROKER_PUT_NUMS"
BROKER_GET_NUMS = "BROKER_GET_NUMS"
STATS_NAMES = (TOPIC_PUT_NUMS, TOPIC_PUT_SIZE, GROUP_GET_NUMS, GROUP_GET_SIZE, GROUP_GET_LATENCY,
               SNDBCK_PUT_NUMS, BROKER_PUT_NUMS, BROKER_GET_NUMS)

#: (sampling period in ms, snapshots kept) of StatsItem's minute, hour and day windows.
MINUTE_WINDOW = (10_000, 7)
HOUR_WINDOW = (600_000, 7)
DAY_WINDOW = (3_600_000, 25)
#: StoreStatsService: a snapshot every second, 601 kept; rates over these many seconds.
STORE_SAMPLE_MS = 1000
STORE_SAMPLES = 601
TPS_SPANS = (10, 60, 600)
#: StoreStatsService's distribution and percentile buckets are reset every minute.
PRINT_INTERVAL_MS = 60_000

#: putMessageDistributeTime's 13 ranges (upper bounds, ms, exclusive; the first is "<= 0").
DISTRIBUTE_LABELS = ("[<=0ms]", "[0~10ms]", "[10~50ms]", "[50~100ms]", "[100~200ms]", "[200~500ms]",
                     "[500ms~1s]", "[1~2s]", "[2~3s]", "[3~4s]", "[4~5s]", "[5~10s]", "[10s~]")
DISTRIBUTE_BOUNDS = (10, 50, 100, 200, 500, 1000, 2000, 3000, 4000, 5000, 10000)


def _latency_bucket_bounds() -> tuple[int, ...]:
    """StoreStatsService's percentile buckets: (step, count) runs from 0, then one unbounded bucket."""
    bounds, at = [], 0
    for step, count in ((1, 20), (2, 15), (5, 10), (10, 10), (50, 6), (100, 5), (1000, 9)):
        for _ in range(count):
            at += step
            bounds.append(at)
    bounds.append((1 << 63) - 1)
    return tuple(bounds)


LATENCY_BOUNDS = _latency_bucket_bounds()


def distribute_index(elapsed_ms: int) -> int:
    """Which of the 13 putMessageDistributeTime ranges a put taking ``elapsed_ms`` falls in."""
    if elapsed_ms <= 0:
        return 0
    return 1 + bisect.bisect_right(DISTRIBUTE_BOUNDS, elapsed_ms)


def latency_bucket(elapsed_ms: int) -> int:
    """The percentile bucket of a put: the first whose upper bound is >= ``elapsed_ms`` (TreeMap.ceilingEntry)."""
    return bisect.bisect_left(LATENCY_BOUNDS, elapsed_ms)


def percentile(counts: list[int], px: float) -> float:
    """StoreStatsService.findPutMessageEntireTimePX: the latency below which ``px`` of the puts fell, in ms.

    Linear inside the bucket holding the ``int(total * px)``-th put, from
    the previous bucket's bound (0 for the first bucket).
    """
    total = sum(counts)
    target = int(total * px)
    passed = 0
    for i, count in enumerate(counts):
        if target <= passed + count:
            rest = target - passed
            if count == 0:
                return 0.0 if i == 0 else float(LATENCY_BOUNDS[i - 1])
            low = 0 if i == 0 else LATENCY_BOUNDS[i - 1]
            return low + (LATENCY_BOUNDS[i] - low) * rest / count
        passed += count
    return 0.0


def java_double(value: float) -> str:
    """``String.valueOf(double)``: ``0.0``, ``8.333333333333334``, ``1.0E-4``, ``1.2345678E7``, ``NaN``."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "Infinity" if value > 0 else "-Infinity"
    value = float(value)
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(value)
    sign, digits, exp = Decimal(repr(value)).as_tuple()
    text = "".join(map(str, digits)).rstrip("0") or "0"
    exponent = exp + len(digits) - 1
    return f"{'-' if sign else ''}{text[0]}.{text[1:] or '0'}E{exponent}"


# -- StatsItem -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Snapshot:
    """StatsSnapshot: a window's sum, its rate per second and the value per call."""

    sum: int = 0
    tps: float = 0.0
    avgpt: float = 0.0


def window_stats(snapshots: deque | list) -> Snapshot:
    """StatsItem.computeStatsData over ``[(time ms, times, value)]``, oldest first."""
    if not snapshots:
        return Snapshot()
    t0, c0, v0 = snapshots[0]
    t1, c1, v1 = snapshots[-1]
    total = v1 - v0
    tps = total * 1000.0 / (t1 - t0) if t1 != t0 else (float("nan") if total == 0 else float("inf"))
    calls = c1 - c0
    return Snapshot(total, tps, total / calls if calls > 0 else 0.0)


class StatsItem:
    """One key of a StatsItemSet: a value, a number of calls, and three windows of snapshots."""

    def __init__(self) -> None:
        self.value = 0
        self.times = 0
        self.windows: dict[tuple[int, int], deque] = {w: deque() for w in (MINUTE_WINDOW, HOUR_WINDOW, DAY_WINDOW)}

    def add(self, value: int, times: int = 1) -> None:
        self.value += value
        self.times += times

    def sample(self, window: tuple[int, int], now_ms: int) -> None:
        """StatsItem.samplingInSeconds / InMinutes / InHour: append a snapshot, keep the window's count."""
        period, keep = window
        snaps = self.windows[window]
        if not snaps:
            snaps.append((now_ms - period, 0, 0))
        snaps.append((now_ms, self.times, self.value))
        while len(snaps) > keep:
            snaps.popleft()

    def minute(self) -> Snapshot:
        return window_stats(self.windows[MINUTE_WINDOW])

    def hour(self) -> Snapshot:
        return window_stats(self.windows[HOUR_WINDOW])

    def day(self) -> Snapshot:
        return window_stats(self.windows[DAY_WINDOW])


# -- StoreStatsService --------------------------------------------------------------------------------------

@dataclass
class StoreStats:
    """The store's counters, their per-second snapshots and the put latency distribution."""

    put_times: dict[str, int] = field(default_factory=dict)  # messages put, per topic
    put_sizes: dict[str, int] = field(default_factory=dict)  # bytes written, per topic
    put_failed: int = 0
    get_found: int = 0
    get_miss: int = 0
    transferred: int = 0
    put_time_max: int = 0
    get_time_max: int = 0
    distribute: list[int] = field(default_factory=lambda: [0] * len(DISTRIBUTE_LABELS))
    buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BOUNDS))
    last_buckets: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BOUNDS))
    samples: dict[str, deque] = field(default_factory=lambda: {k: deque() for k in ("put", "found", "miss",
                                                                                     "transferred")})

    @property
    def put_total(self) -> int:
        return sum(self.put_times.values())

    @property
    def size_total(self) -> int:
        return sum(self.put_sizes.values())

    def sample(self, now_ms: int) -> None:
        for key, value in (("put", self.put_total), ("found", self.get_found), ("miss", self.get_miss),
                           ("transferred", self.transferred)):
            snaps = self.samples[key]
            snaps.append((now_ms, value))
            while len(snaps) > STORE_SAMPLES:
                snaps.popleft()

    def rate(self, key: str, span: int) -> float | None:
        """Per second over the last ``span`` snapshots' intervals; None while fewer snapshots exist."""
        snaps = self.samples[key]
        if len(snaps) <= span:
            return None
        (t0, v0), (t1, v1) = snaps[-(span + 1)], snaps[-1]
        return (v1 - v0) / (t1 - t0) * 1000 if t1 != t0 else float("nan")

    def rates_text(self, key: str) -> str:
        """``putTps``-style value: the 10/60/600 s rates separated by spaces, empty where unknown."""
        return " ".join("" if (r := self.rate(key, s)) is None else java_double(r) for s in TPS_SPANS)

    def total_rates_text(self) -> str:
        """``getTotalTps``: found + miss per span, each 0.0 where unknown."""
        return " ".join(java_double((self.rate("found", s) or 0.0) + (self.rate("miss", s) or 0.0))
                        for s in TPS_SPANS)

    def reset_minute(self) -> None:
        """StoreStatsService.printTps: a new distribution, and the percentile buckets move to ``last_buckets``."""
        self.distribute = [0] * len(DISTRIBUTE_LABELS)
        self.last_buckets, self.buckets = self.buckets, [0] * len(LATENCY_BOUNDS)

    def distribute_text(self) -> str:
        return "".join(f"{label}:{n} " for label, n in zip(DISTRIBUTE_LABELS, self.distribute, strict=True))


# -- the manager ---------------------------------------------------------------------------------------------

def next_midnight_ms(now_ms: int, tz: tzinfo | None) -> int:
    """The next midnight after ``now_ms`` in ``tz`` (None: local time; RocketMQ's computeNextMorningTimeMillis)."""
    now = datetime.fromtimestamp(now_ms / 1000, tz) if tz is not None else datetime.fromtimestamp(now_ms / 1000)
    midnight = (now + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    if tz is None:
        midnight = midnight.astimezone()
    return int(midnight.timestamp() * 1000)


class BrokerStatsManager:
    """All of a broker's runtime statistics (see the module docstring); ``now_ms`` is given to every call.

    ``cluster`` is the key of the BROKER_* items (RocketMQ uses the cluster
    name); ``tz`` the zone whose midnight starts a day (None: the local one).
    """

    def __init__(self, boot_ms: int, *, cluster: str = "DefaultCluster", tz: tzinfo | None = None) -> None:
        self.boot_ms = boot_ms
        self.cluster = cluster
        self.tz = tz
        self.sets: dict[str, dict[str, StatsItem]] = {name: {} for name in STATS_NAMES}
        self.store = StoreStats()
        self.put_today_morning = self.put_yesterday_morning = 0
        self.get_today_morning = self.get_yesterday_morning = 0
        # The next time each periodic task is due (RocketMQ's scheduleAtFixedRate, initial delay 0 for the
        # samplings: a first snapshot at boot).
        self.due = {MINUTE_WINDOW: boot_ms, HOUR_WINDOW: boot_ms, DAY_WINDOW: boot_ms, "store": boot_ms,
                    "print": boot_ms + PRINT_INTERVAL_MS, "morning": next_midnight_ms(boot_ms, tz)}

    # -- feeding -----------------------------------------------------------------------------------------
    def item(self, name: str, key: str) -> StatsItem:
        items = self.sets[name]
        found = items.get(key)
        if found is None:
            found = items[key] = StatsItem()
        return found

    def on_put(self, topic: str, messages: int, size: int, elapsed_ms: int, ok: bool) -> None:
        """A send request answered: ``messages`` stored (a batch's count) of ``size`` bytes, or a failed put."""
        self.on_puts(topic, 1, messages, size, elapsed_ms, ok)

    def on_puts(self, topic: str, sends: int, messages: int, size: int, elapsed_ms: int, ok: bool) -> None:
        """``sends`` send requests answered alike (one topic, one latency, all stored or all failed): what
        ``sends`` calls of :meth:`on_put` would count, in one update (the broker port's lean sends of one read);
        ``messages`` and ``size`` are their totals."""
        store = self.store
        store.put_time_max = max(store.put_time_max, elapsed_ms)
        store.distribute[distribute_index(elapsed_ms)] += sends
        store.buckets[latency_bucket(elapsed_ms)] += sends
        if not ok:
            store.put_failed += sends
            return
        store.put_times[topic] = store.put_times.get(topic, 0) + messages
        store.put_sizes[topic] = store.put_sizes.get(topic, 0) + size
        self.item(TOPIC_PUT_NUMS, topic).add(messages, sends)
        self.item(TOPIC_PUT_SIZE, topic).add(size, sends)
        self.item(BROKER_PUT_NUMS, self.cluster).add(messages, sends)

    def on_get(self, group: str, topic: str, messages: int, size: int, latency_ms: int = 0) -> None:
        """A pull answered: ``messages`` handed out (0: nothing found)."""
        store = self.store
        if messages <= 0:
            store.get_miss += 1
            return
        store.get_found += 1
        store.transferred += messages
        key = f"{topic}@{group}"
        self.item(GROUP_GET_NUMS, key).add(messages, 1)
        self.item(GROUP_GET_SIZE, key).add(size, 1)
        self.item(GROUP_GET_LATENCY, key).add(latency_ms, 1)
        self.item(BROKER_GET_NUMS, self.cluster).add(messages, 1)

    def on_send_back(self, group: str, topic: str) -> None:
        """A consumer sent a message back for a retry (CONSUMER_SEND_MSG_BACK)."""
        self.item(SNDBCK_PUT_NUMS, f"{topic}@{group}").add(1, 1)

    # -- time --------------------------------------------------------------------------------------------
    def tick(self, now_ms: int) -> None:
        """Do every sampling and reset that is due at ``now_ms`` (call about once a second)."""
        due = self.due
        if now_ms >= due["store"]:
            self.store.sample(now_ms)
            due["store"] = max(due["store"] + STORE_SAMPLE_MS, now_ms + 1)
        for window in (MINUTE_WINDOW, HOUR_WINDOW, DAY_WINDOW):
            if now_ms >= due[window]:
                for items in self.sets.values():
                    for item in items.values():
                        item.sample(window, now_ms)
                due[window] = max(due[window] + window[0], now_ms + 1)
        if now_ms >= due["print"]:
            self.store.reset_minute()
            due["print"] = max(due["print"] + PRINT_INTERVAL_MS, now_ms + 1)
        if now_ms >= due["morning"]:
            self.record_morning()
            due["morning"] = next_midnight_ms(now_ms, self.tz)

    def record_morning(self) -> None:
        """BrokerStats.record(): today's morning figures become yesterday's, now's become today's."""
        self.put_yesterday_morning = self.put_today_morning
        self.get_yesterday_morning = self.get_today_morning
        self.put_today_morning = self.store.put_total
        self.get_today_morning = self.store.transferred

    # -- reading ------------------------------------------------------------------------------------------
    def view(self, name: str, key: str) -> dict | None:
        """VIEW_BROKER_STATS_DATA's BrokerStatsData, or None when there is no such item."""
        item = self.sets.get(name, {}).get(key)
        if item is None:
            return None
        return {"statsDay": _item_body(item.day()), "statsHour": _item_body(item.hour()),
                "statsMinute": _item_body(item.minute())}

    def group_get_tps(self, group: str, topic: str) -> float:
        """BrokerStatsManager.tpsGroupGetNums: the minute window's tps of GROUP_GET_NUMS ``topic@group``."""
        item = self.sets[GROUP_GET_NUMS].get(f"{topic}@{group}")
        if item is None:
            return 0.0
        tps = item.minute().tps
        return tps if tps == tps else 0.0

    def runtime_values(self) -> dict[str, str]:
        """The GET_BROKER_RUNTIME_INFO keys these statistics give (StoreStatsService and BrokerStats)."""
        store = self.store
        total = store.put_total
        divisor = total or 1
        return {
            "putMessageEntireTimeMax": str(store.put_time_max),
            "putMessageTimesTotal": str(divisor),
            "putMessageFailedTimes": str(store.put_failed),
            "putMessageSizeTotal": str(store.size_total),
            "putMessageDistributeTime": store.distribute_text(),
            "putMessageAverageSize": java_double(store.size_total / divisor),
            "getMessageEntireTimeMax": str(store.get_time_max),
            "putTps": store.rates_text("put"),
            "getFoundTps": store.rates_text("found"),
            "getMissTps": store.rates_text("miss"),
            "getTotalTps": store.total_rates_text(),
            "getTransferedTps": store.rates_text("transferred"),
            "putLatency99": f"{percentile(store.last_buckets, 0.99):.2f}",
            "putLatency999": f"{percentile(store.last_buckets, 0.999):.2f}",
            "msgPutTotalYesterdayMorning": str(self.put_yesterday_morning),
            "msgPutTotalTodayMorning": str(self.put_today_morning),
            "msgPutTotalTodayNow": str(total),
            "msgGetTotalYesterdayMorning": str(self.get_yesterday_morning),
            "msgGetTotalTodayMorning": str(self.get_today_morning),
            "msgGetTotalTodayNow": str(store.transferred),
        }

    def items(self) -> Iterator[tuple[str, str, StatsItem]]:
        """Every (name, key, item), for the Prometheus export."""
        for name, items in self.sets.items():
            for key, item in items.items():
                yield name, key, item


def _item_body(s: Snapshot) -> dict:
    return {"avgpt": s.avgpt, "sum": s.sum, "tps": s.tps}


# -- Prometheus -------------------------------------------------------------------------------------------------

def metric_families(stats: BrokerStatsManager, group: str, self_id: str) -> list:
    """The statistics as Prometheus metric families (a ``dledger_metric_families`` provider), labelled as the core's.

    Counters since the member started: ``rocketmq_messages_put_total`` / ``rocketmq_message_bytes_put_total``
    (per topic), ``rocketmq_put_failures_total``, ``rocketmq_messages_pulled_total`` (per topic and consumer
    group), ``rocketmq_pulls_total`` (``result`` found / miss).  Gauges as mqadmin shows them:
    ``rocketmq_put_tps`` and ``rocketmq_get_transferred_tps`` (``window`` 10s / 60s / 600s, absent until
    known), ``rocketmq_put_latency_ms`` (``quantile`` 0.99 / 0.999, the previous minute),
    ``rocketmq_topic_put_tps`` and ``rocketmq_consume_tps`` (the last minute, per topic and per topic and
    group), ``rocketmq_messages_put_at_midnight`` / ``rocketmq_messages_pulled_at_midnight`` (``day`` today /
    yesterday).
    """
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    base, ids = ["group", "self_id"], [group, self_id]
    store = stats.store
    put = CounterMetricFamily("rocketmq_messages_put", "Messages stored by sends (a batch counts each message)",
                              labels=[*base, "topic"])
    put_bytes = CounterMetricFamily("rocketmq_message_bytes_put", "Bytes of the records stored by sends",
                                    labels=[*base, "topic"])
    for topic, n in sorted(store.put_times.items()):
        put.add_metric([*ids, topic], n)
        put_bytes.add_metric([*ids, topic], store.put_sizes.get(topic, 0))
    failed = CounterMetricFamily("rocketmq_put_failures", "Send requests whose put failed", labels=base)
    failed.add_metric(ids, store.put_failed)
    pulls = CounterMetricFamily("rocketmq_pulls", "Pull requests answered, by whether messages were found",
                                labels=[*base, "result"])
    pulls.add_metric([*ids, "found"], store.get_found)
    pulls.add_metric([*ids, "miss"], store.get_miss)
    pulled = CounterMetricFamily("rocketmq_messages_pulled", "Messages handed to consumers",
                                 labels=[*base, "topic", "consumer_group"])
    consume_tps = GaugeMetricFamily("rocketmq_consume_tps", "Messages per second handed to a consumer group "
                                    "over the last minute (mqadmin consumerProgress's Consume TPS)",
                                    labels=[*base, "topic", "consumer_group"])
    for key, item in sorted(stats.sets[GROUP_GET_NUMS].items()):
        topic, _, cgroup = key.rpartition("@")
        pulled.add_metric([*ids, topic, cgroup], item.value)
        tps = item.minute().tps
        consume_tps.add_metric([*ids, topic, cgroup], tps if tps == tps else 0.0)
    topic_tps = GaugeMetricFamily("rocketmq_topic_put_tps", "Messages per second put to a topic over the last "
                                  "minute (mqadmin statsAll's InTPS)", labels=[*base, "topic"])
    for topic, item in sorted(stats.sets[TOPIC_PUT_NUMS].items()):
        tps = item.minute().tps
        topic_tps.add_metric([*ids, topic], tps if tps == tps else 0.0)
    rates = []
    for name, key, doc in (("rocketmq_put_tps", "put", "Messages put per second (brokerStatus putTps)"),
                           ("rocketmq_get_transferred_tps", "transferred",
                            "Messages pulled per second (brokerStatus getTransferedTps)")):
        g = GaugeMetricFamily(name, doc, labels=[*base, "window"])
        for span in TPS_SPANS:
            rate = store.rate(key, span)
            if rate is not None and rate == rate:
                g.add_metric([*ids, f"{span}s"], rate)
        rates.append(g)
    latency = GaugeMetricFamily("rocketmq_put_latency_ms", "Put latency percentiles over the previous minute "
                                "(brokerStatus putLatency99 / putLatency999)", labels=[*base, "quantile"])
    for px in (0.99, 0.999):
        latency.add_metric([*ids, str(px)], percentile(store.last_buckets, px))
    midnight_put = GaugeMetricFamily("rocketmq_messages_put_at_midnight", "Messages put since start, as counted "
                                     "at the last two midnights (clusterList's #InTotalYest / #InTotalToday)",
                                     labels=[*base, "day"])
    midnight_put.add_metric([*ids, "today"], stats.put_today_morning)
    midnight_put.add_metric([*ids, "yesterday"], stats.put_yesterday_morning)
    midnight_get = GaugeMetricFamily("rocketmq_messages_pulled_at_midnight", "Messages pulled since start, as "
                                     "counted at the last two midnights", labels=[*base, "day"])
    midnight_get.add_metric([*ids, "today"], stats.get_today_morning)
    midnight_get.add_metric([*ids, "yesterday"], stats.get_yesterday_morning)
    return [put, put_bytes, failed, pulls, pulled, consume_tps, topic_tps, *rates, latency, midnight_put,
            midnight_get]
