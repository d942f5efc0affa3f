"""Prometheus metrics: cheap histograms, the per-member collector, and the HTTP endpoint of a running member."""

from types import SimpleNamespace

import pytest
import pytest_twisted
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from twisted.internet.defer import gatherResults

from dledger.metrics import MetricsService, make_registry, take_snapshot
from dledger.stats import LATENCY_BUCKETS_US, Histogram
from dledger.testing.cluster import Cluster


def samples(text):
    """``{(name, frozenset(labels)): value}`` of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(parsed, name, **labels):
    matches = [v for (n, ls), v in parsed.items() if n == name and set(labels.items()) <= set(ls)]
    assert len(matches) == 1, (name, labels, matches)
    return matches[0]


def test_histogram_buckets_are_upper_inclusive_and_cumulative():
    """A value equal to a bound counts in that bucket; buckets are cumulative and end with +Inf == count."""
    h = Histogram((1, 10, 100))
    for v in (0.5, 1, 2, 10, 11, 1000):
        h.observe(v)
    assert h.cumulative() == [(1, 2), (10, 4), (100, 5), (float("inf"), 6)]
    assert (h.count, h.sum) == (6, 1024.5)
    copy = h.copy()
    h.observe(1)
    assert copy.count == 6


def test_latency_buckets_are_java_dledgers():
    """Latency buckets are Java DLedger's: 1 us up to 10 s, in microseconds."""
    assert LATENCY_BUCKETS_US[0] == 1 and LATENCY_BUCKETS_US[-1] == 10_000_000 and len(LATENCY_BUCKETS_US) == 23


@pytest.fixture
def cluster():
    c = Cluster(3, seed=7)
    c.start()
    yield c
    c.stop()


def test_collector_reports_dledger_metric_names_and_member_state(cluster):
    """A scrape of the leader names Java's metrics, counts every append and reports role, term, indexes and lag."""
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    server.enable_stats()
    client = cluster.client()
    ds = [client.append(b"x" * 100) for _ in range(5)] + [client.append_batch([b"y" * 10] * 4)]
    assert cluster.run_until(lambda: all(d.called for d in ds))
    end = server.store.ledger_end_index
    # Each follower's ack for the last entry comes once its flush completes (simulated disks take virtual time).
    assert cluster.run_until(lambda: all(server.replicator.peer_known(p) == end for p in server.state.peers))
    registry = make_registry(lambda: server, cluster.clock, "g0", leader)
    parsed = samples(generate_latest(registry).decode())
    ids = {"group": "g0", "self_id": leader}
    assert value(parsed, "dledger_up", **ids) == 1
    assert value(parsed, "dledger_role", role="LEADER", **ids) == 1
    assert value(parsed, "dledger_role", role="FOLLOWER", **ids) == 0
    assert value(parsed, "dledger_term", **ids) == server.state.curr_term
    assert value(parsed, "dledger_ledger_end_index", **ids) == end
    assert value(parsed, "dledger_committed_index", **ids) == server.store.committed_index
    assert value(parsed, "dledger_entries_count", **ids) == end - server.store.ledger_begin_index + 1
    assert value(parsed, "dledger_entry_store_size", **ids) > 5 * 148
    assert value(parsed, "dledger_append_entry_latency_count", **ids) == 6
    assert value(parsed, "dledger_append_entry_batch_count_sum", **ids) == 9
    assert value(parsed, "dledger_append_entry_batch_bytes_sum", **ids) == 540
    assert value(parsed, "dledger_appends_total", code="SUCCESS", **ids) == 6
    assert value(parsed, "dledger_entries_appended_total", **ids) == 9
    for peer in server.state.peers:
        assert value(parsed, "dledger_lag_entries_count", remote_id=peer, **ids) == 0
        assert value(parsed, "dledger_replicate_entry_latency_count", remote_id=peer, **ids) >= 1
        assert value(parsed, "dledger_replica_entry_batch_count_sum", remote_id=peer, **ids) >= 9


def test_lag_grows_for_a_follower_that_is_cut_off(cluster):
    """The leader's dledger_lag_entries_count shows how far an isolated follower is behind."""
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    lagging = server.state.peers[0]
    cluster.partition([lagging], [m for m in cluster.ids if m != lagging])
    client = cluster.client()
    ds = [client.append(b"z") for _ in range(7)]
    assert cluster.run_until(lambda: all(d.called for d in ds))
    snap = take_snapshot(server)
    assert snap.lag[lagging] >= 7
    assert min(snap.lag.values()) == 0


def test_followers_report_no_lag_and_stats_are_off_by_default(cluster):
    """A follower has no lag series, and a member without enable_stats() records nothing (no histograms)."""
    leader = cluster.wait_for_leader()
    follower = next(s for m, s in cluster.servers.items() if m != leader)
    # A member becomes a follower at the leader's first heartbeat, which may come after wait_for_leader returns.
    assert cluster.run_until(lambda: follower.state.role.value == "FOLLOWER")
    assert follower.stats is None
    snap = take_snapshot(follower)
    assert snap.role == "FOLLOWER" and snap.lag == {} and snap.histograms == {}
    parsed = samples(generate_latest(make_registry(lambda: follower, cluster.clock, "g0", "nX")).decode())
    assert not any(name.startswith("dledger_append_entry_latency") for name, _ in parsed)


def test_registry_before_the_server_exists_reports_down():
    """Before the member is built the collector reports dledger_up 0 and nothing else."""
    parsed = samples(generate_latest(make_registry(lambda: None, None, "g0", "n0")).decode())
    assert parsed == {("dledger_up", frozenset({("group", "g0"), ("self_id", "n0")})): 0}


@pytest.mark.network
@pytest.mark.filterwarnings("ignore:Using readBody with a transport")
@pytest_twisted.ensureDeferred
async def test_metrics_endpoint_serves_prometheus_text(reactor):
    """A member's metrics endpoint answers HTTP GET with Prometheus text that parses and names the member."""
    from twisted.web.client import Agent, readBody

    from dledger.config import make_config
    from dledger.launcher import free_ports
    from dledger.server import DLedgerServer

    [port] = free_ports(1)
    cfg = make_config(preset="fast", group="gm", self_id="n0", peers=f"n0-127.0.0.1:{port}")
    server = DLedgerServer.build(cfg, clock=reactor)
    server.enable_stats()
    svc = MetricsService("tcp:0:interface=127.0.0.1", make_registry(lambda: server, reactor, "gm", "n0"), reactor)
    await server.start()
    svc.startService()
    try:
        bound = await svc.listening
        resp = await Agent(reactor).request(b"GET", f"http://127.0.0.1:{bound.getHost().port}/metrics".encode())
        assert resp.code == 200
        text = (await readBody(resp)).decode()
        parsed = samples(text)
        assert value(parsed, "dledger_up", group="gm", self_id="n0") == 1
        assert "dledger_append_entry_latency_bucket" in text and 'le="1e+07"' in text and 'le="+Inf"' in text
    finally:
        await gatherResults([svc.stopService(), server.stop()])


def test_members_gauge_reports_the_configuration_in_force(cluster):
    """dledger_members{member,role}: 1 per member (the bootstrap --peers: every one a voter, index 0)."""
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    parsed = samples(generate_latest(make_registry(lambda: server, cluster.clock, "g0", leader)).decode())
    ids = {"group": "g0", "self_id": leader}
    for mid in cluster.servers:
        assert value(parsed, "dledger_members", member=mid, role="voter", **ids) == 1
    assert sum(1 for name, _labels in parsed if name == "dledger_members") == len(cluster.servers)
    assert value(parsed, "dledger_members_config_index", **ids) == getattr(
        getattr(server, "membership", None), "configuration", SimpleNamespace(index=0)).index


def test_members_gauge_shows_learners_and_the_ones_to_be_promoted():
    """A configuration with a learner to promote and one kept a learner: roles and the pending promotion."""
    from dledger.membership.configuration import Configuration, MemberInfo, MemberRole
    from dledger.metrics import Snapshot, _member_metrics, configuration_rows

    config = Configuration((MemberInfo("n0", "h:1"), MemberInfo("n3", "h:4", MemberRole.LEARNER, promote=True),
                            MemberInfo("n4", "h:5", MemberRole.LEARNER)), index=42, term=3)
    server = SimpleNamespace(membership=SimpleNamespace(configuration=config), config=None)
    rows, index = configuration_rows(server)
    assert rows == [("n0", "voter", False), ("n3", "learner", True), ("n4", "learner", False)] and index == 42
    snap = Snapshot("g0", "n0", members=rows, config_index=index)
    families = {f.name: f for f in _member_metrics(snap, ["group", "self_id"], ["g0", "n0"])}
    got = {(s.labels["member"], s.labels["role"]) for s in families["dledger_members"].samples}
    assert got == {("n0", "voter"), ("n3", "learner"), ("n4", "learner")}
    assert [s.labels["member"] for s in families["dledger_member_promotion_pending"].samples] == ["n3"]
    assert families["dledger_members_config_index"].samples[0].value == 42
