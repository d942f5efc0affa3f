"""The example plugin's application tests: replicated counters under partitions, crashes, loss and duplication.

They use ``dledger.testing``: whole groups in one process, on virtual time, deterministic for a seed.
Copy them with the plugin.
"""

from __future__ import annotations

import json
import random

import pytest
from dledger_example import plugin
from dledger_example.counters import Counters, check_add, encode_add, parse_add
from twisted.web.test.requesthelper import DummyRequest

from dledger.codes import ResponseCode, Role
from dledger.errors import DLedgerError
from dledger.testing import Cluster, isolated_plugin_manager
from dledger.transport.inprocess import FaultSettings


def counters_cluster(seed=1, n=3, **options):
    """A group whose members run dledger's own plugins and this one only (whatever else is installed)."""
    options.setdefault("extras", {"example.enabled": True, "example.max_add": 100})
    return Cluster(n, seed=seed, plugin_manager=isolated_plugin_manager(plugin), **options)


def counters_of(cluster, mid):
    return plugin.example_of(cluster.servers[mid]).counters.values


# -- the pure part, table-tested ---------------------------------------------------------------------
@pytest.mark.parametrize("body, problem", [
    (b"nope", "not JSON"),
    (b'{"add": "a"}', 'expected {"add": NAME, "by": N}'),
    (b'{"add": "", "by": 1}', "non-empty string"),
    (b'{"add": "a", "by": 0}', "positive integer"),
    (b'{"add": "a", "by": true}', "positive integer"),
    (b'{"add": "a", "by": 101}', "more than example.max_add (100)"),
])
def test_check_add_refuses_with_a_reason(body, problem):
    with pytest.raises(ValueError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        check_add(body, 100)


def test_counters_apply_adds_and_skip_foreign_bodies():
    counters = Counters()
    for index, body in enumerate([encode_add("a", 2), b"written by something else", encode_add("a", 3)]):
        counters.apply(index, body)
    assert counters.values == {"a": 5} and counters.applied_index == 2
    assert parse_add(encode_add("b", 7)) == ("b", 7)


# -- the plugin in a group -----------------------------------------------------------------------------
def test_every_member_applies_the_same_counters():
    cluster = counters_cluster()
    cluster.start()
    cluster.append_committed([encode_add("apples", 3), encode_add("pears", 1), encode_add("apples", 2)])
    assert {mid: counters_of(cluster, mid) for mid in cluster.ids} == \
        {mid: {"apples": 5, "pears": 1} for mid in cluster.ids}


def test_the_leader_refuses_a_bad_add_with_its_reason():
    cluster = counters_cluster()
    cluster.start()
    cluster.wait_for_leader()
    client = cluster.client(at_least_once=False)
    results = []
    client.append(encode_add("apples", 1000)).addErrback(results.append)
    cluster.wait_until(lambda: results, 10, "the refusal")
    error = results[0].value
    assert isinstance(error, DLedgerError) and error.code is ResponseCode.APPEND_REFUSED
    assert "example: 'by' is 1000, more than example.max_add (100)" in error.message
    cluster.wait_applied()
    assert all(counters_of(cluster, mid) == {} for mid in cluster.ids)


def test_role_tracker_knows_who_leads():
    cluster = counters_cluster()
    cluster.start()
    leader = cluster.wait_for_leader()
    cluster.wait_applied()
    roles = {mid: plugin.example_of(cluster.servers[mid]).role for mid in cluster.ids}
    assert roles == {mid: Role.LEADER if mid == leader else Role.FOLLOWER for mid in cluster.ids}


@pytest.mark.parametrize("seed", range(5))
def test_counters_converge_under_partitions_crashes_loss_and_duplication(seed):
    """Adds go on while the network loses, duplicates and reorders messages, splits and members crash.

    Every member ends with the counters of the committed log, and every acknowledged add is in it.  (The
    client retries ambiguous answers, so an add may be committed twice: delivery is at least once.)
    """
    rng = random.Random(seed)
    cluster = counters_cluster(seed=seed, n=5,
                               faults=FaultSettings(min_delay=0.001, max_delay=0.03, loss=0.05, duplicate=0.05))
    cluster.start()
    client = cluster.client()
    acknowledged = []
    for step in range(30):
        body = encode_add(rng.choice(["a", "b", "c"]), rng.randint(1, 9))
        client.append(body).addCallbacks(lambda r, body=body: acknowledged.append((r.index, body)),
                                         lambda f: None)
        cluster.run(0.2)
        if step % 10 == 3:
            victim = rng.choice(sorted(cluster.servers))
            cluster.crash(victim)
            cluster.run(1.0)
            cluster.restart(victim)
        if step % 10 == 7:
            ids = list(cluster.ids)
            rng.shuffle(ids)
            cluster.partition(ids[:2], ids[2:])
            cluster.run(1.0)
            cluster.heal()
    cluster.network.faults = FaultSettings()
    log = cluster.converged(timeout=120)
    expected = Counters()
    for entry in log:
        expected.apply(entry.index, entry.body)
    assert all(counters_of(cluster, mid) == expected.values for mid in cluster.ids)
    committed = {(e.index, e.body) for e in log}
    assert acknowledged and set(acknowledged) <= committed


def test_a_restarted_member_rebuilds_its_counters_from_the_log():
    cluster = counters_cluster()
    cluster.start()
    leader = cluster.append_committed([encode_add("a", 1)])
    follower = next(mid for mid in cluster.ids if mid != leader)
    cluster.crash(follower)
    cluster.append_committed([encode_add("a", 2)])
    cluster.restart(follower)
    cluster.wait_applied()
    assert counters_of(cluster, follower) == {"a": 3}


def test_the_http_page_shows_the_members_counters():
    cluster = counters_cluster()
    cluster.start()
    leader = cluster.append_committed([encode_add("a", 4)])
    example = plugin.example_of(cluster.servers[leader])
    page = json.loads(plugin.CountersPage(example).render_GET(DummyRequest([b""])))
    assert page["counters"] == {"a": 4} and page["role"] == "LEADER" and page["member"] == leader


def test_nothing_runs_unless_enabled():
    cluster = counters_cluster(extras={})
    cluster.start()
    cluster.append_committed([b"any body at all"])
    assert all(plugin.example_of(s) is None for s in cluster.servers.values())
