"""RocketMQ's runtime statistics (dledger_rocketmq.broker.brokerstats): windows, rates, latency figures, daily totals,
and the admin codes that report them through the broker port."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import pytest
from dledger_rocketmq.broker import admin, brokerstats
from dledger_rocketmq.broker.brokerstats import (
    BROKER_PUT_NUMS,
    GROUP_GET_NUMS,
    TOPIC_PUT_NUMS,
    TOPIC_PUT_SIZE,
    BrokerStatsManager,
    distribute_index,
    java_double,
    latency_bucket,
    percentile,
)
from dledger_rocketmq.broker.port import BrokerPort, encode_command
from dledger_rocketmq.common import fastjson
from test_rmq_admin_port import ask, golden, group, replay

from dledger.transport.remoting import Header

UTC = UTC


def ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


# -- the pure parts, table by table ------------------------------------------------------------------------

@pytest.mark.parametrize("elapsed, index", [(-1, 0), (0, 0), (1, 1), (9, 1), (10, 2), (49, 2), (50, 3), (199, 4),
                                            (500, 6), (999, 6), (1000, 7), (4999, 10), (9999, 11), (10000, 12),
                                            (10 ** 9, 12)])
def test_distribute_ranges(elapsed, index):
    """putMessageDistributeTime's 13 ranges: <=0, then upper bounds 10, 50, 100 ... 10 000 ms exclusive."""
    assert distribute_index(elapsed) == index


@pytest.mark.parametrize("elapsed, bound", [(0, 1), (1, 1), (2, 2), (20, 20), (21, 22), (50, 50), (51, 55),
                                            (101, 110), (201, 250), (501, 600), (1001, 2000), (10000, 10000),
                                            (10001, (1 << 63) - 1)])
def test_latency_buckets(elapsed, bound):
    """The percentile buckets (1 ms steps to 20, 2 to 50, 5 to 100, 10 to 200, 50 to 500, 100 to 1 000, 1 000 to
    10 000, then one unbounded): a put lands in the first bucket whose bound is >= its time."""
    assert brokerstats.LATENCY_BOUNDS[latency_bucket(elapsed)] == bound


def _counts(**by_bound):
    counts = [0] * len(brokerstats.LATENCY_BOUNDS)
    for bound, n in by_bound.items():
        counts[brokerstats.LATENCY_BOUNDS.index(int(bound[1:]))] = n
    return counts


@pytest.mark.parametrize("counts, px, want", [
    (_counts(), 0.99, 0.0),                     # no puts
    (_counts(b3=60), 0.99, 2 + 59 / 60),        # all in (2, 3]: 59th of 60, linear from 2
    (_counts(b1=100), 0.99, 0.99),              # the first bucket interpolates from 0
    (_counts(b1=99, b600=1), 0.99, 1.0),        # the 99th put is the first bucket's last
    (_counts(b1=98, b600=2), 0.99, 550.0),      # ... and here in (500, 600]: 1 of 2
    (_counts(b1=998, b2000=2), 0.999, 1500.0),
])
def test_percentile(counts, px, want):
    """findPutMessageEntireTimePX: linear inside the bucket holding the int(total * px)-th put."""
    assert percentile(counts, px) == pytest.approx(want)


@pytest.mark.parametrize("value, text", [(0.0, "0.0"), (15.0, "15.0"), (0.1, "0.1"), (8.333333333333334,
                                         "8.333333333333334"), (0.001, "0.001"), (1e-4, "1.0E-4"),
                                         (0.00055, "5.5E-4"), (12345678.0, "1.2345678E7"), (1e7, "1.0E7"),
                                         (9999999.0, "9999999.0"), (float("nan"), "NaN")])
def test_java_double(value, text):
    """String.valueOf(double): plain between 10^-3 and 10^7, else d.dddE[-]n."""
    assert java_double(value) == text


def test_windows_sum_rate_and_value_per_call():
    """A StatsItem: 10 s snapshots (7 kept) give the last minute, 10 min ones the hour, hourly ones the day;
    sum = value growth over the window, tps per second, avgpt = value per call."""
    stats = BrokerStatsManager(0)
    for t in range(0, 120_001, 1000):   # 2 minutes: a batch of 3 messages (300 bytes) every second
        stats.on_put("T", 3, 300, 2, True)
        stats.tick(t)
    view = stats.view(TOPIC_PUT_NUMS, "T")
    # the minute window: snapshots at 60 s .. 120 s (7 kept), 60 puts of 3 between them
    assert view["statsMinute"] == {"sum": 180, "tps": 3.0, "avgpt": 3.0}
    # the hour window: a zero snapshot 10 min before boot and the one at boot (one put of 3 by then)
    assert view["statsHour"] == {"sum": 3, "tps": 3 / 600, "avgpt": 3.0}
    assert stats.view(TOPIC_PUT_SIZE, "T")["statsMinute"]["avgpt"] == 300.0
    assert stats.view(BROKER_PUT_NUMS, "DefaultCluster")["statsMinute"]["sum"] == 180
    assert stats.view(TOPIC_PUT_NUMS, "nope") is None and stats.view("NO_SUCH_STATS", "T") is None


def test_put_totals_count_messages_and_failures_apart():
    """putMessageTimesTotal counts messages (a batch of 8 is 8), RocketMQ's 1 when there is none; a failed put
    counts in putMessageFailedTimes and the latency figures only."""
    stats = BrokerStatsManager(0)
    assert stats.runtime_values()["putMessageTimesTotal"] == "1"
    stats.on_put("T", 8, 800, 4, True)
    stats.on_put("T", 1, 100, 70, False)
    values = stats.runtime_values()
    assert (values["putMessageTimesTotal"], values["msgPutTotalTodayNow"], values["putMessageFailedTimes"],
            values["putMessageSizeTotal"], values["putMessageAverageSize"]) == ("8", "8", "1", "800", "100.0")
    assert values["putMessageEntireTimeMax"] == "70"
    assert values["putMessageDistributeTime"].startswith("[<=0ms]:0 [0~10ms]:1 [10~50ms]:0 [50~100ms]:1 ")
    assert values["putMessageDistributeTime"].endswith("[10s~]:0 ")


def test_rates_over_10_60_600_seconds():
    """putTps and friends: rates over the last 10, 60, 600 one-second snapshots, blank while too few exist
    (mqadmin clusterList reads the first word, 0 when there is none)."""
    stats = BrokerStatsManager(0)
    stats.tick(0)
    assert stats.runtime_values()["putTps"] == "  "
    assert stats.runtime_values()["getTotalTps"] == "0.0 0.0 0.0"
    for t in range(1000, 10_001, 1000):
        stats.on_put("T", 5, 50, 1, True)
        stats.on_get("g", "T", 2, 20)
        stats.on_get("g", "T", 0, 0)
        stats.tick(t)
    values = stats.runtime_values()
    assert values["putTps"] == "5.0  "
    assert (values["getFoundTps"], values["getMissTps"], values["getTransferedTps"]) == ("1.0  ", "1.0  ", "2.0  ")
    assert values["getTotalTps"] == "2.0 0.0 0.0"
    for t in range(11_000, 600_001, 1000):
        stats.tick(t)
    assert stats.runtime_values()["putTps"] == f"0.0 0.0 {java_double(50 / 600)}"


def test_latency_percentiles_are_the_previous_minutes():
    """putLatency99/999 come from the buckets of the minute before the last reset; the distribution is the
    current minute's."""
    stats = BrokerStatsManager(0)
    stats.tick(0)
    for _ in range(99):
        stats.on_put("T", 1, 10, 1, True)
    stats.on_put("T", 1, 10, 1500, True)
    assert stats.runtime_values()["putLatency99"] == "0.00"  # nothing before the first reset
    stats.tick(60_000)
    values = stats.runtime_values()
    assert (values["putLatency99"], values["putLatency999"]) == ("1.00", "1.00")  # the 99th of 100: <= 1 ms
    assert values["putMessageDistributeTime"].startswith("[<=0ms]:0 [0~10ms]:0 ")  # a new minute
    for _ in range(1000):
        stats.on_put("T", 1, 10, 1500, True)
    stats.tick(120_000)
    assert stats.runtime_values()["putLatency99"] == "1990.00"  # (1000, 2000]: 990 of 1000


def test_today_and_yesterday_totals_move_at_midnight():
    """msg{Put,Get}Total{Yesterday,Today}Morning: the counters at the last two midnights (0 before them)."""
    boot = ms("2026-11-26T23:59:00")
    stats = BrokerStatsManager(boot, tz=UTC)
    stats.tick(boot)
    stats.on_put("T", 5, 50, 1, True)
    stats.on_get("g", "T", 4, 40)
    stats.tick(ms("2026-11-26T23:59:59"))
    assert [stats.runtime_values()[k] for k in ("msgPutTotalTodayMorning", "msgPutTotalTodayNow")] == ["0", "5"]
    stats.tick(ms("2026-11-27T00:00:00"))
    stats.on_put("T", 2, 20, 1, True)
    values = stats.runtime_values()
    assert [values[k] for k in ("msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning", "msgPutTotalTodayNow",
                                "msgGetTotalTodayMorning", "msgGetTotalTodayNow")] == ["0", "5", "7", "4", "4"]
    stats.tick(ms("2026-11-28T00:00:01"))
    values = stats.runtime_values()
    assert [values[k] for k in ("msgPutTotalYesterdayMorning", "msgPutTotalTodayMorning",
                                "msgGetTotalYesterdayMorning")] == ["5", "7", "4"]
    # clusterList's #InTotalYest / #InTotalToday
    assert int(values["msgPutTotalTodayMorning"]) - int(values["msgPutTotalYesterdayMorning"]) == 2


def test_consume_tps_is_the_groups_minute_rate():
    """GET_CONSUME_STATS's consumeTps = GROUP_GET_NUMS topic@group's minute tps; 0 for a group never served."""
    stats = BrokerStatsManager(0)
    for t in range(0, 60_001, 1000):
        stats.on_get("g", "T", 6, 60)
        stats.tick(t)
    assert stats.group_get_tps("g", "T") == 6.0
    assert stats.group_get_tps("g", "U") == 0.0 and stats.group_get_tps("h", "T") == 0.0
    assert stats.view(GROUP_GET_NUMS, "T@g")["statsMinute"]["sum"] == 360


# -- bodies and mqadmin's arithmetic ----------------------------------------------------------------------------

def test_bodies():
    """GroupList, BrokerStatsData and ProducerConnection as fastjson writes them; RocketMQ's disk ratio."""
    assert admin.group_list_body(["b", "a", "a"]) == b'{"groupList":["a","b"]}'
    body = admin.broker_stats_body({k: {"sum": 3, "tps": 0.005, "avgpt": 1.0}
                                    for k in ("statsDay", "statsHour", "statsMinute")})
    assert body.startswith(b'{"statsDay":{"avgpt":1.0,"sum":3,"tps":0.005},"statsHour":')
    assert fastjson.loads(body)["statsMinute"]["tps"] == 0.005
    conn = admin.producer_connection_body([{"clientId": "c", "clientAddr": "1.2.3.4:5", "language": "JAVA",
                                            "version": 401}])
    assert conn == (b'{"connectionSet":[{"clientAddr":"1.2.3.4:5","clientId":"c","language":"JAVA",'
                    b'"version":401}]}')
    assert admin.disk_ratio(1000, 250) == "0.75" and admin.disk_ratio(0, 0) == "-1"
    assert admin.disk_ratio(3, 2) == "0.3333333333333333"
    assert admin.hours_since(ms("2026-11-27T03:30:00"), ms("2026-11-27T00:00:00")) == "3.50"


# -- through the broker port ------------------------------------------------------------------------------------

def _request(code: int, ext: dict, opaque: int = 900) -> bytes:
    return encode_command(Header(code, opaque, 0, "JAVA", 401, None, ext, 0), b"")


def test_port_reports_what_it_served(tmp_path):
    """Sends and pulls through the port show in GET_BROKER_RUNTIME_INFO (messages, not requests),
    VIEW_BROKER_STATS_DATA, GET_CONSUME_STATS's consumeTps, QUERY_TOPIC_CONSUME_BY_WHO,
    GET_PRODUCER_CONNECTION_LIST and GET_BROKER_CONSUME_STATS."""
    cluster, b, _ = group(tmp_path)
    port = BrokerPort(b, "tcp:0", now_ms=lambda: int(cluster.clock.seconds() * 1000))
    port.start_stats(cluster.clock)
    try:
        replay(cluster, port, "017-update-and-create-topic")
        cluster.run(11.0)   # the 10 s rate exists after 11 one-second snapshots
        batch = replay(cluster, port, "320-send-batch-message")
        assert batch.header.code == 0, batch.header.remark
        single = replay(cluster, port, "310-send-message-v2")
        assert single.header.code == 0, single.header.remark
        n_batch = len(batch.header.ext_fields["msgId"].split(","))
        assert n_batch > 1
        cluster.run(1.5)
        table = fastjson.loads(replay(cluster, port, "028-get-broker-runtime-info").body)["table"]
        assert table["putMessageTimesTotal"] == table["msgPutTotalTodayNow"] == str(n_batch + 1)
        assert float(table["putTps"].split()[0]) > 0
        assert re.fullmatch(r"\d+\.\d{2}", table["putLatency99"])

        cluster.run(10.0)   # the items are sampled every 10 s
        topic = golden("310-send-message-v2-request").header.ext_fields["b"]
        view = ask(cluster, port, _request(315, {"statsName": "TOPIC_PUT_NUMS", "statsKey": topic}))
        assert view.header.code == 0
        assert fastjson.loads(view.body)["statsMinute"]["sum"] == n_batch + 1
        missing = ask(cluster, port, _request(315, {"statsName": "TOPIC_PUT_NUMS", "statsKey": "nope"}))
        assert (missing.header.code, missing.header.remark) == (1, "The stats <TOPIC_PUT_NUMS> <nope> not exist")

        pull = replay(cluster, port, "011-pull-message-sysflag-subscription-found")
        group_name = golden("011-pull-message-sysflag-subscription-found-request").header.ext_fields["consumerGroup"]
        pulled_topic = golden("011-pull-message-sysflag-subscription-found-request").header.ext_fields["topic"]
        assert pull.header.code == 0, pull.header.remark
        cluster.run(10.0)
        stats = ask(cluster, port, _request(208, {"consumerGroup": group_name, "topic": pulled_topic}))
        assert fastjson.loads(stats.body.split(b',"offsetTable"')[0] + b"}")["consumeTps"] > 0

        replay(cluster, port, "034-heart-beat-producer")
        producer = golden("034-heart-beat-producer-request")
        pgroup = fastjson.loads(producer.body)["producerDataSet"][0]["groupName"]
        conns = ask(cluster, port, _request(204, {"producerGroup": pgroup}))
        assert conns.header.code == 0 and fastjson.loads(conns.body)["connectionSet"][0]["clientId"]
        none = ask(cluster, port, _request(204, {"producerGroup": "nobody"}))
        assert (none.header.code, none.header.remark) == (1, "the producer group[nobody] not exist")

        replay(cluster, port, "034-heart-beat-consumer-consume-passively")
        hb = fastjson.loads(golden("034-heart-beat-consumer-consume-passively-request").body)
        cgroup = hb["consumerDataSet"][0]["groupName"]
        ctopic = hb["consumerDataSet"][0]["subscriptionDataSet"][0]["topic"]
        who = ask(cluster, port, _request(300, {"topic": ctopic}))
        assert cgroup in fastjson.loads(who.body)["groupList"]
        empty = ask(cluster, port, _request(300, {"topic": "NobodyReadsThis"}))
        assert fastjson.loads(empty.body) == {"groupList": []}

        all_stats = ask(cluster, port, _request(317, {"isOrder": "false"}))
        assert all_stats.header.code == 0
        assert all_stats.body.startswith(b'{"brokerAddr":"') and b'"totalDiff":' in all_stats.body
    finally:
        port._stats_loop.stop()



# -- Prometheus ---------------------------------------------------------------------------------------------------

def test_metric_families_carry_the_statistics():
    """The statistics as Prometheus families: counters per topic / group, rates by window, percentiles."""
    from prometheus_client import CollectorRegistry, generate_latest

    stats = BrokerStatsManager(0)
    for t in range(0, 61_000, 1000):
        stats.on_put("T", 2, 20, 3, True)
        stats.on_get("g", "T", 1, 10)
        stats.tick(t)
    stats.on_put("T", 1, 10, 5, False)

    class One:
        def collect(self):
            return brokerstats.metric_families(stats, "g0", "n1")
    registry = CollectorRegistry()
    registry.register(One())
    text = generate_latest(registry).decode()
    assert 'rocketmq_messages_put_total{group="g0",self_id="n1",topic="T"} 122.0' in text
    assert 'rocketmq_message_bytes_put_total{group="g0",self_id="n1",topic="T"} 1220.0' in text
    assert 'rocketmq_put_failures_total{group="g0",self_id="n1"} 1.0' in text
    assert 'rocketmq_messages_pulled_total{consumer_group="g",group="g0",self_id="n1",topic="T"} 61.0' in text
    assert 'rocketmq_consume_tps{consumer_group="g",group="g0",self_id="n1",topic="T"} 1.0' in text
    assert 'rocketmq_put_tps{group="g0",self_id="n1",window="10s"} 2.0' in text
    assert 'window="600s"' not in text  # not known yet after a minute
    assert 'rocketmq_put_latency_ms{group="g0",quantile="0.99",self_id="n1"} 2.98' in text
