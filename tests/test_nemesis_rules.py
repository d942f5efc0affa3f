"""The nemesis's pure parts: fault shapes, seeded schedules, the checkers' verdicts, the summary table."""

from __future__ import annotations

import random

import pytest

from dledger.testing.checker import History
from dledger.testing.nemesis import faults as F
from dledger.testing.nemesis.brokercheck import broker_anomalies
from dledger.testing.nemesis.cli import summarize
from dledger.testing.nemesis.logcheck import check_log_history, merge_committed
from dledger.testing.nemesis.mutations import MUTATIONS, bootstrap

FIVE = ["n0", "n1", "n2", "n3", "n4"]


def _links(cuts, members):
    return {m: {o for o in members if o != m and (m, o) not in cuts} for m in members}


def test_the_majorities_ring_gives_every_member_a_majority_and_no_two_the_same():
    cuts = F.ring_cuts(FIVE)
    links = _links(cuts, FIVE)
    views = [frozenset(links[m] | {m}) for m in FIVE]
    assert all(len(v) == 3 for v in views)  # itself and its two ring neighbours: a majority of 5
    assert len(set(views)) == 5
    assert all((b, a) in cuts for a, b in cuts)  # symmetric


@pytest.mark.parametrize("a, b, expect", [
    (["n0"], ["n1", "n2"], {("n0", "n1"), ("n1", "n0"), ("n0", "n2"), ("n2", "n0")}),
    (["n0", "n1"], ["n2"], {("n0", "n2"), ("n2", "n0"), ("n1", "n2"), ("n2", "n1")}),
])
def test_a_split_cuts_every_link_across_both_ways(a, b, expect):
    assert F.split_cuts(a, b) == expect


@pytest.mark.parametrize("outgoing, expect", [
    (True, {("n0", "n1"), ("n0", "n2")}),
    (False, {("n1", "n0"), ("n2", "n0")}),
])
def test_one_way_cuts_only_one_direction(outgoing, expect):
    assert F.oneway_cuts("n0", ["n1", "n2"], outgoing) == expect


@pytest.mark.parametrize("n", [3, 4, 5])
def test_halves_are_a_majority_and_the_rest(n):
    members = [f"n{i}" for i in range(n)]
    major, minor = F.halves(members, random.Random(n))
    assert len(major) == n // 2 + 1 and sorted(major + minor) == members


def test_a_schedule_is_a_function_of_its_seed_and_tries_every_kind_first():
    kinds = F.available_kinds(5, clock=True)
    a = F.schedule(7, 120, FIVE, kinds)
    assert a == F.schedule(7, 120, FIVE, kinds)
    assert a != F.schedule(8, 120, FIVE, kinds)
    assert {s.kind for s in a[:len(kinds)]} == set(kinds)
    starts = [s.start for s in a]
    assert starts == sorted(starts) and starts[-1] < 120
    for s, nxt in zip(a, a[1:]):
        assert nxt.start >= s.start + s.duration  # one fault at a time, healed before the next
        assert max(x.at for x in s.actions) <= s.duration


@pytest.mark.parametrize("kind", F.KINDS)
def test_every_kind_undoes_what_it_does(kind):
    step = F.make_step(kind, 0.0, random.Random(3), FIVE)
    ops = [a.op for a in sorted(step.actions, key=lambda a: a.at)]
    undo = {"cut": "heal", "stop": "cont", "kill": "restart", "clock": "clock-reset", "drift": "clock-reset"}
    for op, back in undo.items():
        if op in ops:
            assert back in ops[ops.index(op):], (kind, ops)


@pytest.mark.parametrize("members, clock, has, lacks", [
    (3, True, {"clock-jump", "kill"}, {"ring"}),
    (5, True, {"ring"}, set()),
    (5, False, {"ring"}, {"clock-jump", "clock-drift"}),
])
def test_available_kinds(members, clock, has, lacks):
    kinds = set(F.available_kinds(members, clock))
    assert has <= kinds and not lacks & kinds


@pytest.mark.parametrize("text, error", [("isolate,bogus", "unknown fault kind 'bogus'"),
                                         ("ring", "not available here")])
def test_bad_kinds_are_one_line_errors(text, error):
    with pytest.raises(ValueError, match=error):
        F.parse_kinds(text, F.available_kinds(3, clock=True))


def test_mutations_are_reachable_only_through_the_members_command_line():
    program = bootstrap("stale-read", "TWISTD")
    assert program.startswith("from dledger.testing.nemesis import mutations; mutations.install('stale-read')")
    assert bootstrap(None, "TWISTD") == "TWISTD"
    with pytest.raises(ValueError, match="unknown mutation"):
        bootstrap("nope", "TWISTD")
    import dledger.config as config
    source = open(config.__file__, encoding="utf-8").read()
    assert not any(m in source for m in MUTATIONS) and "mutation" not in source


@pytest.mark.parametrize("leads, committed, begin, real, mutant", [
    (False, 10, 5, "NOT_LEADER", "SERVE"),                 # a follower serves what it holds committed...
    (False, 10, 12, "NOT_LEADER", "INDEX_OUT_OF_RANGE"),   # ...and says "not there yet" past it: stale after a pause
    (True, 10, 12, "CONFIRM", "CONFIRM"),                  # the leader's path is untouched (ReadIndex)
])
def test_the_follower_read_mutation_answers_plain_gets_on_a_follower(monkeypatch, leads, committed, begin, real,
                                                                      mutant):
    """``follower-read``: a member that does not lead answers a GET not marked followerRead itself."""
    from dledger import reads
    from dledger.testing.nemesis.mutations import install

    def outcome(decision):
        return decision.code.name if decision.action is reads.ReadAction.REFUSE else decision.action.name
    assert outcome(reads.read_decision(leads, False, begin, 0, committed, "n1")) == real
    monkeypatch.setattr(reads, "read_decision", reads.read_decision)  # restored after the test
    install("follower-read")
    assert outcome(reads.read_decision(leads, False, begin, 0, committed, "n1")) == mutant


# -- the log's verdict ---------------------------------------------------------------------------------------------

def _history(*ops):
    h = History()
    for kind, client, inv, done, kw in ops:
        op = h.invoke(kind, client, inv, **{k: v for k, v in kw.items() if k in ("body", "index")})
        History.complete(op, done, ok=kw.get("ok", True), index=kw.get("index"), result=kw.get("result"),
                         error=kw.get("error"))
    return h


LOG = {"n0": {1: b"nemesis a", 2: b"nemesis b"}, "n1": {1: b"nemesis a", 2: b"nemesis b"}}


@pytest.mark.parametrize("ops, logs, expect", [
    ([("append", "c0", 0, 1, {"body": b"nemesis a", "index": 1})], LOG, []),
    ([("append", "c0", 0, 1, {"body": b"nemesis c", "index": 3})], LOG, ["lost", "non-linearizable"]),
    ([], {"n0": {1: b"nemesis a"}, "n1": {1: b"nemesis x"}}, ["divergent"]),
    ([], {"n0": {1: b"nemesis a", 2: b"nemesis a"}}, ["duplicated"]),
    ([("get", "c0", 0, 1, {"index": 1, "result": b"nemesis a"}),
      ("get", "c1", 2, 3, {"index": 1, "result": b"nemesis b"})], LOG, ["unstable read", "non-linearizable"]),
    # index 2 was acknowledged (visible) before a read of it began: "not there yet" is a stale read
    ([("append", "c0", 0, 1, {"body": b"nemesis b", "index": 2}),
      ("get", "c1", 2, 3, {"index": 2, "ok": False, "error": "INDEX_OUT_OF_RANGE"})], LOG, ["non-linearizable"]),
    # ... but not if the read began before the append was acknowledged (concurrent)
    ([("append", "c0", 0, 2, {"body": b"nemesis b", "index": 2}),
      ("get", "c1", 1, 3, {"index": 2, "ok": False, "error": "INDEX_OUT_OF_RANGE"})], LOG, []),
])
def test_log_verdicts(ops, logs, expect):
    found = check_log_history(_history(*ops), logs, prefix=b"nemesis ")
    assert sorted({p.split(":")[0] for p in found}) == sorted(expect), found


def test_merge_committed_takes_each_index_once():
    merged, problems = merge_committed({"n0": {1: b"a"}, "n1": {1: b"a", 2: b"b"}})
    assert merged == {1: b"a", 2: b"b"} and problems == []


# -- the broker's verdict ------------------------------------------------------------------------------------------

def send(body, queue=None, offset=None, ok=True, attempt=0, inv=0.0, done=0.1):
    return {"t": "send", "body": body, "attempt": attempt, "inv": inv, "done": done, "ok": ok, "queue": queue,
            "offset": offset}


FINAL = {"b/0": {0: "m0", 1: "m1", 2: "m2"}}


@pytest.mark.parametrize("events, final, expect", [
    ([send("m0", "b/0", 0), send("m1", "b/0", 1), send("m2", "b/0", 2)], FINAL, []),
    ([send("m0", "b/0", 0), send("m9", "b/0", 1)], FINAL, ["lost"]),
    ([send("m0", "b/0", 0)], {"b/0": {0: "m0", 1: "m0"}}, ["duplicated"]),
    ([send("m0", "b/0", 0), send("m0", None, None, ok=False, attempt=1)], {"b/0": {0: "m0", 1: "m0"}}, []),
    ([send("m0", "b/0", 0)], {"b/0": {0: "m0", 2: "m2"}}, ["gap"]),
    ([{"t": "pull", "session": 1, "queue": "b/0", "from": 0, "offsets": [0, 2], "bodies": ["m0", "m2"],
       "next": 3}], FINAL, ["gap"]),
    ([{"t": "pull", "session": 1, "queue": "b/0", "from": 0, "offsets": [0], "bodies": ["zz"], "next": 1}],
     FINAL, ["changed"]),
    ([{"t": "commit", "queue": "b/0", "offset": 2, "inv": 1.0, "done": 1.1, "ok": True},
      {"t": "query", "queue": "b/0", "offset": 1, "inv": 2.0, "done": 2.1}], FINAL, ["offset backwards"]),
    # a resume that began before the commit was acknowledged may see the older offset
    ([{"t": "commit", "queue": "b/0", "offset": 2, "inv": 1.0, "done": 1.1, "ok": True},
      {"t": "query", "queue": "b/0", "offset": 1, "inv": 1.05, "done": 1.2}], FINAL, []),
    # redelivery after a resume from the committed offset is at-least-once, not a gap
    ([{"t": "pull", "session": 1, "queue": "b/0", "from": 0, "offsets": [0, 1], "bodies": ["m0", "m1"], "next": 2},
      {"t": "pull", "session": 2, "queue": "b/0", "from": 1, "offsets": [1, 2], "bodies": ["m1", "m2"], "next": 3}],
     FINAL, []),
])
def test_broker_verdicts(events, final, expect):
    found = broker_anomalies(events, final)
    assert sorted({p.split(":")[0] for p in found}) == sorted(expect), found


def test_the_summary_has_a_row_per_fault_kind_and_says_fail():
    results = [{"ops": 10, "failed": 2, "timeouts": 1, "faults": 2, "anomalies": [], "stuck": None,
                "kinds": {"isolate": {"injected": 1, "ops": 4, "failed": 1, "timeouts": 1},
                          "kill": {"injected": 1, "ops": 5, "failed": 1, "timeouts": 0}}},
               {"ops": 7, "failed": 0, "timeouts": 0, "faults": 1, "anomalies": ["lost: x"], "stuck": None,
                "kinds": {"kill": {"injected": 1, "ops": 7, "failed": 0, "timeouts": 0}}}]
    table = summarize(results).splitlines()
    rows = {line.split()[0]: line for line in table[1:]}
    assert rows["isolate"].split()[1:5] == ["1", "4", "1", "1"] and rows["isolate"].endswith("ok")
    assert rows["kill"].split()[1:3] == ["2", "12"] and "FAIL in 1 run(s)" in rows["kill"]
    assert "runs=2 anomalies=1 stuck=0" in rows["all"]


@pytest.mark.parametrize("module, name", [
    ("dledger.testing.nemesis.logload", "LogWorkload"),
    ("dledger.testing.nemesis.kvload", "KVWorkload"),
    ("dledger.testing.nemesis.brokerload", "BrokerWorkload"),
])
def test_every_workload_is_an_inemesisworkload(module, name):
    """The runner drives each workload through the one seam (start, stop, finish; spans for the tally)."""
    import importlib

    from zope.interface.verify import verifyClass

    from dledger.interfaces import INemesisWorkload

    cls = getattr(importlib.import_module(module), name)
    assert INemesisWorkload.implementedBy(cls) and verifyClass(INemesisWorkload, cls)
