"""The status page: the role-change ring, the sample ring, the JSON document, the HTML and the endpoint.

Its decisions (role-change reasons, roles a page vouches for, labels) are tested in test_status_rules.py.
"""

from __future__ import annotations

import json

import pytest
import pytest_twisted
from twisted.internet import task

from dledger.stats import LATENCY_BUCKETS_US
from dledger.status import model, page
from dledger.status.board import StatusBoard
from dledger.status.events import RoleEvents
from dledger.status.history import History, Sample, quantile, series
from dledger.testing.cluster import Cluster


def test_role_events_keep_the_newest_within_their_bound():
    """The ring keeps the last N changes, newest first, and counts every change."""
    class State:
        leader_id = None
        taking_leadership = False

    clock = task.Clock()
    events = RoleEvents(State(), clock, limit=3)
    for term in range(5):
        clock.advance(1)
        events.role_changed(term, "CANDIDATE")
    assert [e.term for e in events.newest_first()] == [4, 3, 2]
    assert events.count == 5 and events.newest_first()[0].at == 5


@pytest.mark.parametrize("counts, q, expected", [
    ([0, 0, 0, 0], 0.5, None),
    ([0, 10, 0, 0], 0.5, 5.5),      # all in (1, 10]: the middle of it
    ([10, 0, 0, 0], 0.99, 0.99),    # (0, 1]
    ([0, 0, 0, 4], 0.5, 100.0),     # +Inf answers the highest bound
    ([5, 0, 5, 0], 0.9, 82.0),      # rank 9 of 10: 4/5 of the way through (10, 100]
])
def test_quantile_interpolates_like_histogram_quantile(counts, q, expected):
    """Histogram quantiles interpolate within the bucket holding the rank, as Prometheus does."""
    got = quantile((1, 10, 100), counts, q)
    assert got == (None if expected is None else pytest.approx(expected))


def test_series_turns_samples_into_rates_and_latency_per_interval():
    """Consecutive samples give entries/s and the interval's latency mean and percentiles (None: no append)."""
    bounds = (1000, 10000)
    samples = [Sample(0, 10, 0, (0, 0, 0), 0.0), Sample(2, 30, 20, (0, 4, 0), 20000.0),
               Sample(3, 30, 20, (0, 4, 0), 20000.0)]
    s = series(samples, bounds)
    assert s["t"] == [2, 3]
    assert s["commits_per_s"] == [10.0, 0.0] and s["appends_per_s"] == [10.0, 0.0]
    assert s["latency_mean_ms"] == [5.0, None]
    assert s["latency_p50_ms"][0] == pytest.approx(5.5) and s["latency_p99_ms"][1] is None


def test_history_is_bounded_and_forgets_a_restarted_member():
    """The ring never holds more than its limit; a committed index going back starts a new history."""
    h = History(LATENCY_BUCKETS_US, limit=4)
    for i in range(10):
        h.add(Sample(i, i, 0))
    assert [s.at for s in h.samples] == [6, 7, 8, 9]
    h.add(Sample(10, 0, 0))
    assert [s.at for s in h.samples] == [10]


@pytest.fixture
def cluster():
    c = Cluster(3, seed=11, handlers=lambda mid, server: (server.enable_stats(), [])[1])
    c.start()
    yield c
    c.stop()


def _board(cluster, mid):
    return StatusBoard(lambda: cluster.servers.get(mid), cluster.clock)


def test_leader_document_shows_every_follower_and_the_election(cluster):
    """The leader's document names each follower's lag and last contact, and its own election with a reason."""
    leader = cluster.wait_for_leader()
    cluster.append_committed([b"a", b"b", b"c"])
    board = _board(cluster, leader)
    doc = board.document()
    json.dumps(doc)  # JSON-able as served
    m = doc["member"]
    assert m["role"] == "LEADER" and m["leader"] == leader and m["committed"] >= 3
    assert m["applied"] == m["committed"] and m["begin"] == 0 and m["end"] >= 3
    rows = {r["id"]: r for r in doc["members"]}
    assert set(rows) == set(cluster.ids) and rows[leader]["self"] and rows[leader]["lag"] == 0
    for peer in cluster.servers[leader].state.peers:
        assert rows[peer]["role"] == "FOLLOWER" and rows[peer]["in_contact"] is True
        assert rows[peer]["last_contact_s"] is not None and rows[peer]["last_contact_s"] < 2
    assert doc["events"][0]["role"] == "LEADER" and doc["events"][0]["reason"].startswith("won the vote")


def test_follower_document_vouches_only_for_what_it_knows(cluster):
    """A follower's document shows its leader and itself; the other members' roles read '?'."""
    leader = cluster.wait_for_leader()
    follower = next(m for m in cluster.ids if m != leader)
    other = next(m for m in cluster.ids if m not in (leader, follower))
    assert cluster.run_until(lambda: cluster.servers[follower].state.leader_id == leader)
    doc = _board(cluster, follower).document()
    roles = {r["id"]: r["role"] for r in doc["members"]}
    assert roles == {leader: "LEADER", follower: "FOLLOWER", other: "?"}
    assert doc["events"][0]["role"] == "FOLLOWER" and leader in doc["events"][0]["reason"]


def test_leader_change_appears_on_a_followers_page_with_its_reason(cluster):
    """After the leader crashes, a surviving member's document names the new leader and why it changed."""
    old = cluster.wait_for_leader()
    survivor = next(m for m in cluster.ids if m != old)
    board = _board(cluster, survivor)
    assert cluster.run_until(lambda: cluster.servers[survivor].state.leader_id == old)
    cluster.crash(old)
    assert cluster.run_until(lambda: cluster.servers[survivor].state.leader_id not in (None, old))
    doc = board.document()
    assert doc["member"]["leader"] not in (None, old)
    reasons = [e["reason"] for e in doc["events"]]
    assert any("silent: heartbeat timeout" in r or "saw term" in r for r in reasons), reasons
    rows = {r["id"]: r for r in _board(cluster, cluster.leader()).document()["members"]}
    assert rows[old]["role"] == "UNREACHABLE" and rows[old]["in_contact"] is False


def test_sampler_fills_the_sparkline_series(cluster):
    """Samples taken once a second turn into commit and append rates with append latencies."""
    leader = cluster.wait_for_leader()
    board = _board(cluster, leader)
    board.start()
    try:
        for _ in range(3):
            cluster.append_committed([b"x"] * 10)
            cluster.run(1.0)
    finally:
        board.stop()
    s = board.document()["series"]
    assert len(s["t"]) >= 3 and sum(s["appends_per_s"]) > 0 and sum(s["commits_per_s"]) > 0
    assert any(v is not None for v in s["latency_p99_ms"])


def test_a_failing_section_provider_is_shown_not_raised():
    """A plugin provider that raises becomes a section saying so; the others still show."""
    errors = []

    def broken():
        raise RuntimeError("boom")

    ok = model.section("ok", "fine", summary=[("k", 1)])
    out = model.plugin_sections([broken, lambda: ok, lambda: None], lambda p, e: errors.append(e))
    assert [s["id"] for s in out] == ["error", "ok"] and "boom" in out[0]["summary"][0][1]
    assert len(errors) == 1


def _doc(sections=()):
    return {"group": "g<0>", "self_id": "n0", "now": 10.0, "running": True,
            "member": {"role": "LEADER", "term": 2, "leader": "n0", "begin": 0, "end": 5, "end_term": 2,
                       "committed": 5, "applied": 5, "pending": 0, "store_type": "memory", "store_bytes": 100,
                       "disk_used_ratio": 0.5, "disk_problem": None, "store_damaged": None, "scrub": None},
            "members": [{"id": "n0", "address": "127.0.0.1:1", "self": True, "role": "LEADER", "lag": 0,
                         "last_contact_s": None, "in_contact": None, "disk_problem": None}],
            "events": [{"at": 9.0, "term": 2, "role": "LEADER", "leader": "n0", "reason": "won the vote in term 2"}],
            "series": {"t": [1, 2], "commits_per_s": [1.0, 2.0], "appends_per_s": [0, 1.0],
                       "latency_mean_ms": [None, 1.0], "latency_p50_ms": [None, 1.0], "latency_p99_ms": [None, 2.0]},
            "sections": list(sections)}


def test_page_escapes_everything_and_pages_long_tables():
    """Names from the wire are escaped; a 1,000-row table shows 25 rows and says how many there are."""
    rows = [[f"<script>t{i}", i] for i in range(1000)]
    sec = model.section("q", "queues", tables=[model.table("queues", "queues", ["topic", "queue"], rows)])
    html = page.render_page(_doc([sec]))
    assert "<script>t" not in html and "&lt;script&gt;t0" in html and "g&lt;0&gt;" in html
    assert html.count("&lt;script&gt;t") == page.PAGE_ROWS and "rows 1\u201325 of 1000" in html
    assert '<script src="status.js">' in html and "http" not in html.split("<body>")[1].split("status.json")[0]


def test_static_files_are_served_from_the_package():
    """The script and the style sheet ship in the package (no CDN): the script polls status.json."""
    assert b'fetch("status.json"' in page.static_file("status.js")
    assert b"table" in page.static_file("status.css")


@pytest.mark.network
@pytest_twisted.ensureDeferred
async def test_endpoint_serves_page_json_static_and_metrics(reactor):
    """One port: / and /status are the page, /status.json the document, /metrics Prometheus, others 404."""
    from twisted.internet.defer import gatherResults
    from twisted.web.client import Agent, readBody

    from dledger.config import make_config
    from dledger.launcher import free_ports
    from dledger.metrics import MetricsService, make_registry
    from dledger.server import DLedgerServer

    [port] = free_ports(1)
    cfg = make_config(preset="fast", group="gs", self_id="n0", peers=f"n0-127.0.0.1:{port}")
    server = DLedgerServer.build(cfg, clock=reactor)
    server.enable_stats()
    board = StatusBoard(lambda: server, reactor)
    svc = MetricsService("tcp:0:interface=127.0.0.1", make_registry(lambda: server, reactor, "gs", "n0"), reactor,
                         status=board)
    await server.start()
    svc.startService()
    try:
        bound = await svc.listening
        base = f"http://127.0.0.1:{bound.getHost().port}"

        async def get(path):
            resp = await Agent(reactor).request(b"GET", (base + path).encode())
            return resp, await readBody(resp)

        for path in ("/", "/status"):
            resp, body = await get(path)
            assert resp.code == 200 and b"dledger group" in body and b'id="members"' in body, path
            assert resp.headers.getRawHeaders(b"content-security-policy")[0].startswith(b"default-src 'self'")
        resp, body = await get("/status.json")
        doc = json.loads(body)
        assert resp.code == 200 and doc["group"] == "gs" and doc["members"][0]["id"] == "n0"
        resp, body = await get("/status.js")
        assert resp.code == 200 and b"status.json" in body
        resp, body = await get("/metrics")
        assert resp.code == 200 and b"dledger_up" in body
        resp, _ = await get("/nothing-here")
        assert resp.code == 404
    finally:
        await gatherResults([svc.stopService(), server.stop()])
    assert not board.sampler.loop.running


def test_applied_index_is_the_slowest_commit_listener():
    """Applied is the committed index without listeners, else one below the slowest listener's next index."""
    class Feed:
        def __init__(self, nexts):
            self.nexts = nexts

        def next_indexes(self):
            return self.nexts

    class Store:
        committed_index = 10

    class Server:
        store = Store()

    for nexts, applied in (([], 10), ([11, 4], 3), ([20], 10)):
        Server.commit_feed = Feed(nexts)
        assert model.applied_index(Server) == applied


def test_members_are_the_configuration_in_force_with_each_ones_membership(cluster):
    """The members table lists the configuration (learners marked), not the bootstrap --peers."""
    from types import SimpleNamespace

    from dledger.membership.configuration import Configuration, MemberInfo, MemberRole

    leader = cluster.wait_for_leader()
    doc = _board(cluster, leader).document()
    assert {r["membership"] for r in doc["members"]} == {"voter"}
    server = cluster.servers[leader]
    config = Configuration(tuple(MemberInfo(mid, server.config.members[mid].address) for mid in cluster.ids)
                           + (MemberInfo("n9", "127.0.0.1:9", MemberRole.LEARNER, promote=True),), index=7)
    stand_in = SimpleNamespace(config=server.config, membership=SimpleNamespace(configuration=config))
    rows, index = model.configuration_members(stand_in)
    assert rows[-1] == ("n9", "127.0.0.1:9", "learner, to be promoted") and index == 7
    html = page.render_page({**_doc(), "configuration": {"index": 7, "committed": False},
                             "members": [{**_doc()["members"][0], "membership": "learner, to be promoted"}]})
    assert "configuration entry 7 (not committed yet: a change is in flight)" in html
    assert "<td>learner, to be promoted</td>" in html
