"""etc/grafana/dledger.json and etc/prometheus/dledger-rules.yml: importable, valid, and over real metrics.

Every PromQL expression of the dashboard and the rules names only metrics a member exports: a real
3-member ``twistd dledger`` group with the broker plugin is scraped (leader and follower) and each name is
looked up.  ``promtool check rules`` and ``promtool test rules`` (Debian's prometheus package, installed
by ``make systools``) run where promtool is installed; the PromQL name extraction here runs everywhere.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import pytest_twisted

yaml = pytest.importorskip("yaml")

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "etc" / "grafana" / "dledger.json"
RULES = ROOT / "etc" / "prometheus" / "dledger-rules.yml"
RULE_TESTS = ROOT / "etc" / "prometheus" / "dledger-rules.test.yml"
PROMTOOL = shutil.which("promtool")

#: PromQL words that are not metric names (keywords, modifiers, binary operators).
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset",
            "atan2", "inf", "nan",
            # aggregation operators (followed by a grouping clause rather than a parenthesis)
            "sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk",
            "quantile", "limitk", "limit_ratio"}
#: What the issue asks the rules to watch.
REQUIRED_ALERTS = {"DLedgerNoLeader", "DLedgerFollowerLag", "DLedgerDiskFull", "DLedgerStoreDamaged",
                   "DLedgerFrequentElections", "RocketMQDispatchLag", "RocketMQConsumerLag",
                   "DLedgerLearnerNotPromoted"}


def metric_names(expr: str) -> set[str]:
    """The metric (and recording-rule) names an expression selects: identifiers that are not functions,
    aggregations, keywords, label names in matchers or grouping clauses, durations or numbers."""
    s = re.sub(r'"(?:\\.|[^"\\])*"', '""', expr)
    s = re.sub(r"\{[^}]*\}", " ", s)
    s = re.sub(r"\[[^\]]*\]", " ", s)
    s = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", r" \1 ", s)
    out = set()
    for m in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", s):
        tok, before = m.group(0), s[m.start() - 1] if m.start() else " "
        if before.isdigit() or before in ".$":
            continue  # 1e6, $group
        if s[m.end():].lstrip().startswith("(") or tok.lower() in KEYWORDS:
            continue
        out.add(tok)
    return out


@pytest.mark.parametrize("expr, names", [
    ("dledger_up == 0", {"dledger_up"}),
    ('max by (group) (dledger_is_leader{group=~"$group"}) < 1 and max by (group) (dledger_up) == 1',
     {"dledger_is_leader", "dledger_up"}),
    ("histogram_quantile(0.99, sum by (le) (rate(dledger_append_entry_latency_bucket[1m]))) / 1e6",
     {"dledger_append_entry_latency_bucket"}),
    ("sum by (t) (a_total * on (group, self_id) group_left rocketmq_broker_is_master)",
     {"a_total", "rocketmq_broker_is_master"}),
    ('dledger:elections_per_minute >= 3', {"dledger:elections_per_minute"}),
    ('x{label="by (y) z"} offset 5m', {"x"}),
])
def test_metric_names_of_an_expression(expr, names):
    """The extraction keeps metric names and drops functions, keywords, labels, numbers and variables."""
    assert metric_names(expr) == names


def rules() -> list[dict]:
    return [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]


def dashboard_exprs(dash: dict) -> list[str]:
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", ())]


def test_rules_cover_what_operators_need_and_parse():
    """Each required alert is there with a severity and a summary; recording rules are named level:metric."""
    rs = rules()
    alerts = {r["alert"]: r for r in rs if "alert" in r}
    assert REQUIRED_ALERTS <= set(alerts)
    for name, r in alerts.items():
        assert r["labels"]["severity"] in ("warning", "critical") and r["annotations"]["summary"], name
    for r in rs:
        if "record" in r:
            assert re.fullmatch(r"[a-z]+:[a-z0-9_]+", r["record"]), r["record"]
        assert metric_names(r["expr"]), r


def test_grafana_dashboard_is_importable_as_is():
    """Plain dashboard JSON: a datasource variable (no __inputs to fill), unique panel ids, every query on it."""
    dash = json.loads(DASHBOARD.read_text())
    assert dash["uid"] and dash["title"] == "dledger" and isinstance(dash["schemaVersion"], int)
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    for p in dash["panels"]:
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        for t in p.get("targets", ()):
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"], p["title"]
    assert len(dashboard_exprs(dash)) >= 20


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (make systools installs Debian's prometheus)")
def test_promtool_checks_and_unit_tests_the_rules():
    """promtool accepts the rules file, and its unit tests fire each alert on the series that should fire it."""
    check = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    unit = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS.name], capture_output=True, text=True, timeout=60,
                          cwd=RULE_TESTS.parent)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr
    tested = set(re.findall(r"alertname: (\w+)", RULE_TESTS.read_text()))
    assert REQUIRED_ALERTS <= tested


def exported_names(text: str) -> set[str]:
    """Family and sample names of a Prometheus text exposition (``_bucket``/``_total``... included)."""
    from prometheus_client.parser import text_string_to_metric_families

    out = set()
    for family in text_string_to_metric_families(text):
        out.add(family.name)
        out.update(s.name for s in family.samples)
    return out


@pytest.mark.process
@pytest.mark.network
@pytest_twisted.ensureDeferred
async def test_every_expression_names_metrics_a_member_and_its_broker_export(tmp_path, reactor):
    """Scrape the leader and a follower of a real broker group: every name of the rules and dashboard is there."""
    pytest.importorskip("dledger_rocketmq")
    from dledger_rocketmq.client.client import connect
    from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master
    from twisted.web.client import Agent, readBody

    from dledger.launcher import LocalGroup, durable_store, free_ports

    store = durable_store()
    if store is None:
        pytest.skip("no durable store (mmap or lmdb) is installed")
    ids = ["n0", "n1", "n2"]
    ports = dict(zip(ids, free_ports(3), strict=True))
    group = LocalGroup(tmp_path / "group", n=3, store=store, preset="fast", metrics=True,
                       member_args=broker_port_args(ports), options={"plugins.rocketmq.enabled": True,
                                                                     "plugins.rocketmq.masterWaitTimeout": 10.0})
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)
        leader = await wait_for_master(group, admin, ports, topic="Orders", queues=4)
        c = await connect(reactor, "127.0.0.1", ports[leader], timeout=5.0)
        try:
            for i in range(8):
                await c.send("Orders", b"o", queue_id=i % 4)
            await c.send("Orders", b"later", queue_id=0, properties={"DELAY": "3"})
            await c.commit_offset("billing", "Orders", 0, 1)
        finally:
            c.close()
        follower = next(m for m in ids if m != leader)
        names: set[str] = set()
        for mid in (leader, follower):
            url = f"http://127.0.0.1:{group.members[mid].metrics_port}/metrics".encode()
            names |= exported_names((await readBody(await Agent(reactor).request(b"GET", url))).decode())
    finally:
        await admin.close()
        await group.stop_all()
        group.close()
    recorded = {r["record"] for r in rules() if "record" in r}
    wanted = {(where, n) for r in rules() for n in metric_names(r["expr"])
              for where in [r.get("alert") or r["record"]]}
    wanted |= {(f"dashboard: {e[:40]}", n) for e in dashboard_exprs(json.loads(DASHBOARD.read_text()))
               for n in metric_names(e)}
    missing = sorted((where, n) for where, n in wanted if n not in names and n not in recorded)
    assert not missing, missing
    assert {"rocketmq_consumer_lag_messages", "rocketmq_dispatch_lag_bytes", "dledger_lag_entries_count",
            "dledger_append_entry_latency_bucket"} <= names
