"""Mixed groups with Java brokers (issue #27): the mode decisions, the term-start record, local control entries."""

from __future__ import annotations

import pytest
from dledger_rocketmq.broker.mixed import (
    TERM_START_TOPIC,
    Mode,
    group_mode,
    read_mode,
    resume_bodies,
    term_start_record,
    transition,
)
from dledger_rocketmq.client.migrate_check import SCHEDULE_TOPIC, BrokerView, assess
from dledger_rocketmq.common.control import (
    KIND_TOPIC_CONFIG,
    OffsetCommit,
    decode_control,
    encode_metadata,
    encode_offset_commits,
)
from dledger_rocketmq.common.message import Address, decode_record
from dledger_rocketmq.plugin import broker_for
from rmq_cluster_util import broker_cluster, master, msg, put
from twisted.python.failure import Failure

from dledger.replication.peerkind import PeerKind

D, J, U = PeerKind.DLEDGER, PeerKind.JAVA, PeerKind.UNKNOWN
M, L = Mode.MIXED, Mode.DLEDGER


@pytest.mark.parametrize("kinds, probing, keep, previous, expect", [
    ({"n1": D, "n2": D}, True, False, None, L),       # every peer dledger
    ({"n1": D, "n2": J}, True, False, None, M),       # a Java broker
    ({"n1": J, "n2": J}, True, False, L, M),          # Java brokers, whatever was before
    ({"n1": D, "n2": U}, True, False, None, None),    # not known yet, nothing decided: undecided (acts MIXED)
    ({"n1": D, "n2": U}, True, False, L, L),          # a dledger peer down: stays DLEDGER
    ({"n1": D, "n2": U}, True, False, M, M),          # a Java peer down: stays MIXED (it may come back)
    ({"n1": J, "n2": U}, True, False, L, M),          # a Java one known and one down: MIXED
    ({"n1": D, "n2": D}, True, True, None, M),        # keepJavaCompatible: the way back stays open
    ({"n1": D, "n2": D}, False, True, L, M),
    ({}, False, False, None, L),                      # no probing (no state machines): as before
    ({"n1": U, "n2": U}, False, False, M, L),
])
def test_group_mode(kinds, probing, keep, previous, expect):
    assert group_mode(kinds, ["n1", "n2"], probing=probing, keep_java_compatible=keep, previous=previous) is expect


@pytest.mark.parametrize("old, new, is_master, expect", [
    (None, None, False, None),
    (L, L, True, None),
    (M, M, True, None),
    (None, M, False, "log-mixed"),
    (L, M, True, "log-mixed"),
    (M, L, True, "resume"),          # the last Java broker left: the master writes its tables through the log
    (M, L, False, "log-dledger"),
    (None, L, True, "resume"),       # decided while master: commits made while undecided were local
    (L, None, True, None),
])
def test_transition(old, new, is_master, expect):
    assert transition(old, new, is_master=is_master) == expect


def test_term_start_record_is_a_plain_commitlog_record():
    body = term_start_record(Address("127.0.0.1", 10911), 1_795_000_000_000)
    rec = decode_record(body)
    assert rec.topic == TERM_START_TOPIC and rec.queue_offset == 0 and rec.physical_offset == 0
    assert rec.size == len(body)  # TOTALSIZE is the body size, as Java's checkMessageAndReturnSize wants
    assert not body.startswith(b"RMQC")


def test_mode_file_round_trip(tmp_path):
    path = tmp_path / "groupMode"
    assert read_mode(path) is None
    path.write_text("mixed\n")
    assert read_mode(path) is M
    path.write_text("garbage")
    assert read_mode(path) is None


def test_resume_bodies_carry_every_offset_topic_and_group(tmp_path):
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    b.meta.offsets.apply([OffsetCommit("cg", "T", q, 10 + q) for q in range(3)], from_log=False)
    bodies = resume_bodies(b.meta, 1000)
    entries = [decode_control(x) for x in bodies]
    commits = {c for e in entries for c in e.commits}
    assert {OffsetCommit("cg", "T", q, 10 + q) for q in range(3)} <= commits
    topics = {c["topicName"] for e in entries if e.kind == KIND_TOPIC_CONFIG for c in e.configs}
    assert topics == set(b.meta.topics.table)


def test_resume_bodies_carry_the_acl_in_effect(tmp_path):
    """An ACL a master put in effect while the mode was undecided (its own table only) reaches the log on
    the move to DLEDGER, first, as the slaves' ACL (CI: a secured group's slaves never got the aclFile)."""
    from dledger_rocketmq.common.acl import parse_acl
    from dledger_rocketmq.common.control import KIND_ACL_CONFIG

    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    assert not [e for e in map(decode_control, resume_bodies(b.meta, 1000)) if e.kind == KIND_ACL_CONFIG]
    config = parse_acl({"accounts": [{"accessKey": "rocketmq2", "secretKey": "12345678", "admin": True}]})
    b.meta.acl.apply({"acl": config.to_dict(), "source": "file:abc", "file": "abc"}, 5)
    first = decode_control(resume_bodies(b.meta, 1000)[0])
    assert first.kind == KIND_ACL_CONFIG
    assert [dict(c) for c in first.configs] == [{"acl": config.to_dict(), "source": "file:abc", "file": "abc"}]


def run(cluster, d, timeout=10.0):
    out = []
    d.addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), timeout), "never answered"
    return out[0]


def test_mixed_master_applies_control_entries_locally_and_writes_no_control_entry(tmp_path):
    """A master that sees a Java peer keeps offsets and topics in its own tables: the log gets records only,
    and the term-start NOOP of a leader carries the record a Java broker can index."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    java = next(p for p in b.server.peer_kinds.peers)
    b.server.peer_kinds.learn(java, J)
    end = b.server.store.ledger_end_index
    assert run(cluster, b.commit_offsets([OffsetCommit("cg", "T", 0, 7)])) == -1
    assert b.query_offset("cg", "T", 0) == 7
    cfg = {"topicName": "NewT", "readQueueNums": 4, "writeQueueNums": 4, "perm": 6}
    run(cluster, b.change_metadata(KIND_TOPIC_CONFIG, [cfg]))
    assert b.meta.topics.table["NewT"]["readQueueNums"] == 4
    assert put(cluster, b, [msg(body=b"plain")]).ok
    store = b.server.store
    bodies = [store.get(i).body for i in range(end + 1, store.ledger_end_index + 1)]
    assert bodies and not any(x.startswith(b"RMQC") for x in bodies)
    assert b.mixed.mode is M and b.mixed.noop_body().startswith(term_start_record(b.store_host, 0)[:4])
    # the Java broker is replaced by a dledger member: control entries resume, the tables go through the log
    b.server.peer_kinds.kinds[java] = D
    assert b.mixed.check() is L
    assert cluster.run_until(lambda: b.mixed._resuming is None, 10)
    others = [broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b]
    assert cluster.run_until(lambda: all(o.query_offset("cg", "T", 0) == 7 and "NewT" in o.meta.topics.table
                                         for o in others), 10)
    assert run(cluster, b.commit_offsets([OffsetCommit("cg", "T", 0, 9)])) >= 0  # through the log again
    assert b.mixed.noop_body() == b""


def test_undecided_master_asks_its_peers_before_the_first_control_entry(tmp_path):
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    b.mixed.mode = None
    for p in b.server.peer_kinds.peers:
        b.server.peer_kinds.kinds[p] = U
    index = run(cluster, b.commit_offsets([OffsetCommit("cg", "T", 1, 3)]))
    assert index >= 0 and b.mixed.mode is L


def test_control_entries_in_the_log_round_trip_through_local_apply(tmp_path):
    from dledger_rocketmq.broker.mixed import apply_locally

    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    apply_locally(b.machine, encode_offset_commits([OffsetCommit("g", "T", 0, 5)]))
    apply_locally(b.machine, encode_offset_commits([OffsetCommit("g", "T", 0, 2)]))  # never backwards
    assert b.query_offset("g", "T", 0) == 5
    apply_locally(b.machine, encode_offset_commits([OffsetCommit("g", "T", 0, 2)], reset=True))
    assert b.query_offset("g", "T", 0) == 2
    apply_locally(b.machine, encode_metadata(KIND_TOPIC_CONFIG, [{"topicName": "X", "perm": 6}], 1))
    assert "X" in b.meta.topics.table
    with pytest.raises(ValueError):
        apply_locally(b.machine, b"not a control entry")


def view(i, maxes=None, consumer=None, delay=None, error=None, topics=None):
    return BrokerView(i, f"127.0.0.1:{10911 + i}", dict(maxes or {}), dict(consumer or {}), dict(delay or {}), error,
                      topics)


Q = {("T", 0): 10, ("T", 1): 12}


@pytest.mark.parametrize("brokers, members, lag, safe, words", [
    ({0: view(0, Q), 2: view(2, Q), 3: view(3, {("T", 0): 11, ("T", 1): 12})}, 3, 0, True, "safe: G: master"),
    ({2: view(2, Q)}, None, 0, False, "no master registered"),
    ({0: view(0, Q, error="refused")}, None, 0, False, "did not answer: refused"),
    ({0: view(0, Q), 2: view(2, Q)}, 3, 0, False, "2 of 3 brokers registered"),
    ({0: view(0, Q), 2: view(2, {("T", 0): 9, ("T", 1): 12})}, None, 0, False, "behind on T/0 (9 < 10)"),
    ({0: view(0, Q, {"T@g": {0: 8}}), 2: view(2, Q, {"T@g": {0: 5}})}, None, 2, False, "3 behind"),
    ({0: view(0, Q, {"T@g": {0: 8}}), 2: view(2, Q, {"T@g": {0: 5}})}, None, 3, True, "largest lag 3"),
    ({0: view(0, Q, {"T@g": {0: 8}}), 2: view(2, Q, {})}, None, 100, False, "T@g/0 missing"),
    ({0: view(0, {**Q, (SCHEDULE_TOPIC, 2): 7}, delay={3: 5}), 2: view(2, {**Q, (SCHEDULE_TOPIC, 2): 7},
                                                                      delay={3: 6})},
     None, 0, False, "ahead of the master's 5"),
    ({0: view(0, {**Q, (SCHEDULE_TOPIC, 2): 7}, delay={3: 5}), 2: view(2, {**Q, (SCHEDULE_TOPIC, 2): 7},
                                                                      delay={3: 4})},
     None, 0, True, "2 delayed message(s) pending"),
    ({0: view(0, Q), 2: view(2, error="timeout")}, None, 0, False, "slave 2 (127.0.0.1:10913) did not answer"),
    # a slave whose slave sync never copied a topic (a Java slave under a dledger master without vipListen)
    ({0: view(0, Q, topics={"T", "Late"}), 2: view(2, Q, topics={"T"})}, None, 0, False,
     "slave 2 (127.0.0.1:10913) does not know topic(s) Late of the master's"),
    ({0: view(0, Q, topics={"T", "BenchmarkTest"}), 2: view(2, Q, topics={"T", "Other"})}, None, 0, True, "safe"),
    ({0: view(0, Q, topics={"T", "Late"}), 2: view(2, Q)}, None, 0, True, "safe"),  # not asked: not judged
])
def test_assess(brokers, members, lag, safe, words):
    v = assess("G", brokers, members=members, max_offset_lag=lag)
    assert v.safe is safe and words in v.line, v.line
    assert v.line.startswith("safe: " if safe else "not safe: ") and "\n" not in v.line


def test_assess_says_how_many_more_reasons():
    slave = view(2, {("T", q): 0 for q in range(5)})
    v = assess("G", {0: view(0, {("T", q): 1 for q in range(5)}), 2: slave})
    assert v.line.endswith("and 2 more") and len(v.reasons) == 5


class FakeHeader:
    def __init__(self, code, ext=None):
        self.code, self.ext_fields = code, ext


class FakeBroker:
    """A broker port answering the codes migrate-check asks (canned tables)."""

    def __init__(self, topics=None, maxes=None, consumer=None, delay=None, cluster=None):
        self.topics, self.maxes, self.consumer, self.delay, self.cluster = topics, maxes or {}, consumer, delay, cluster
        self.asked: list[int] = []

    def request(self, code, ext):
        from dledger_rocketmq.common import fastjson
        from twisted.internet.defer import succeed
        self.asked.append(code)
        if code == 106:
            return succeed((FakeHeader(0), fastjson.dumps({"brokerAddrTable": self.cluster}).encode()))
        if code == 21:
            return succeed((FakeHeader(0), fastjson.dumps({"topicConfigTable": self.topics}).encode()))
        if code == 30:
            return succeed((FakeHeader(0, {"offset": str(self.maxes.get((ext["topic"], ext["queueId"]), 0))}), b""))
        if code == 43:
            return succeed((FakeHeader(0), fastjson.dumps({"offsetTable": self.consumer or {}}).encode()))
        if code == 45:
            return succeed((FakeHeader(0), fastjson.dumps({"offsetTable": self.delay or {}}).encode()))
        return succeed((FakeHeader(3), b""))

    def close(self):
        pass


def test_gather_asks_the_name_server_then_the_master_first_then_the_slaves():
    from dledger_rocketmq.client.migrate_check import gather
    from twisted.internet.defer import ensureDeferred, succeed

    topics = {"T": {"topicName": "T", "readQueueNums": 2}, "BenchmarkTest": {"readQueueNums": 1024},
              "G": {"topicName": "G", "readQueueNums": 1}}
    cluster = {"G": {"brokerName": "G", "brokerAddrs": {"0": "m:1", "2": "s:2"}}}
    order: list[str] = []
    brokers = {"ns:0": FakeBroker(cluster=cluster),
               "m:1": FakeBroker(topics, {("T", 0): 5, ("T", 1): 0}, {"T@g": {"0": 4}}, {"3": 1}),
               "s:2": FakeBroker(topics, {("T", 0): 5}, {"T@g": {"0": 4}}, {"3": 1})}

    def dial(addr):
        order.append(addr)
        return succeed(brokers[addr])
    got = []
    ensureDeferred(gather(dial, "ns:0", "G")).addBoth(got.append)
    views = got[0]
    assert order[0] == "ns:0" and order.index("m:1") < order.index("s:2")
    assert views[0].max_offsets == {("T", 0): 5, ("T", 1): 0}  # BenchmarkTest and the group's own topic not asked
    assert views[2].max_offsets == {("T", 0): 5}  # a slave is asked only where the master has messages
    assert views[2].consumer_offsets == {"T@g": {0: 4}} and views[2].delay_offsets == {3: 1}
    assert views[0].topics == views[2].topics == set(topics)
    assert assess("G", views, members=2).safe


def test_migrate_check_cli_one_line_errors(capsys):
    from dledger import cli
    from dledger.launcher import free_ports

    port = free_ports(1)[0]
    assert cli.main(["rocketmq", "migrate-check", f"127.0.0.1:{port}", "G", "--timeout", "2"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("dledger rocketmq: error: cannot check G through 127.0.0.1:") and "\n" not in err
    assert cli.main(["rocketmq", "migrate-check", f"127.0.0.1:{port}", "G", "--access-key", "a"]) == 2
    assert "--access-key and --secret-key-file go together" in capsys.readouterr().err


def _undecided_master(cluster):
    """The master, its mode not decided and one peer that does not answer (as one killed before it did)."""
    b = master(cluster)
    kinds = b.server.peer_kinds
    kinds.stop()
    peer = kinds.peers[0]
    saved, kinds.kinds[peer] = kinds.kinds[peer], U
    b.mixed.mode = None
    b.mixed._asked_at = b.server.clock.seconds()  # just asked: the next control entry does not ask again
    return b, peer, saved


def test_a_commit_applied_while_undecided_is_acknowledged_once_the_log_holds_it(tmp_path):
    """Regression (the failover test's re-deliveries below an acknowledged commit): a master whose peers had
    not all answered applied a commit to its own table and acknowledged it at once; killed before the mode was
    decided, the next master answered the older offset.  Now the commit is applied here but answered only once
    the mode is decided and the tables went through the log, so an acknowledged commit is on every member."""
    cluster = broker_cluster(tmp_path)
    b, peer, saved = _undecided_master(cluster)
    others = [broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b]
    out = []
    b.commit_offsets([OffsetCommit("cg", "T", 2, 11)]).addBoth(out.append)
    cluster.run_until(lambda: bool(out), 3)
    assert out == []  # only this member holds it: not acknowledged yet
    assert b.query_offset("cg", "T", 2) == 11 and all(o.query_offset("cg", "T", 2) == -1 for o in others)
    b.server.peer_kinds.kinds[peer] = saved  # the peer answers: every peer is a dledger member
    assert cluster.run_until(lambda: bool(out), 10) and out == [-1]
    assert b.mixed.mode is L
    assert cluster.run_until(lambda: all(o.query_offset("cg", "T", 2) == 11 for o in others), 10)


def test_a_commit_applied_while_undecided_is_not_acknowledged_if_the_mode_stays_undecided(tmp_path):
    """The peer never answers: the commit is answered as not acknowledged (the client commits again later), never
    as stored; the master's own table keeps it meanwhile."""
    from dledger_rocketmq.broker.mixed import UNDECIDED_ACK_TIMEOUT

    cluster = broker_cluster(tmp_path)
    b, _, _ = _undecided_master(cluster)
    out = []
    b.commit_offsets([OffsetCommit("cg", "T", 2, 11)]).addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), UNDECIDED_ACK_TIMEOUT + 3)
    assert isinstance(out[0], Failure) and "not acknowledged" in out[0].getErrorMessage(), out
    assert b.mixed.mode is None and b.query_offset("cg", "T", 2) == 11


def test_route_control_says_where_a_control_entry_goes(tmp_path):
    """MixedGroup.route_control: None (the broker appends it) in a dledger-only group; applied to this member's
    tables (fires with -1, nothing appended) once a Java peer is known."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    body = encode_offset_commits([OffsetCommit("cg", "T", 2, 5)])
    assert b.mixed.mode is L and b.mixed.route_control(body) is None
    b.server.peer_kinds.learn(next(iter(b.server.peer_kinds.peers)), J)
    end = b.server.store.ledger_end_index
    assert run(cluster, b.mixed.route_control(body)) == -1
    assert b.query_offset("cg", "T", 2) == 5 and b.server.store.ledger_end_index == end


@pytest.mark.parametrize("gone, before, now, expect", [
    (set(), {"A", "B"}, {"A", "B"}, set()),          # nothing left
    (set(), {"A", "B"}, {"A"}, {"B"}),               # B deleted
    ({"B"}, {"A"}, {"A", "B"}, set()),               # B created again: its config goes, not a delete
    ({"B"}, {"A", "C"}, {"C"}, {"A", "B"}),          # deletes add up
    (set(), set(), {"N"}, set()),                    # a new name is no delete
])
def test_gone_after(gone, before, now, expect):
    from dledger_rocketmq.broker.mixed import gone_after

    assert gone_after(gone, before, now) == expect


def test_deletes_made_while_mixed_reach_the_log_on_the_move_back(tmp_path):
    """A topic and a group put through the log, then deleted on the master while a Java peer was in the group
    (its own tables only): on the move back to DLEDGER the master writes the deletes too, so the members that
    hold them from the log lose them (they came back on a member replaying the log before)."""
    from dledger_rocketmq.broker.mixed import GONE_FILE, read_gone
    from dledger_rocketmq.common.control import KIND_GROUP_CONFIG, KIND_GROUP_DELETE, KIND_TOPIC_DELETE

    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    others = [broker_for(s) for s in cluster.servers.values() if broker_for(s) is not b]
    topic = {"topicName": "Doomed", "readQueueNums": 2, "writeQueueNums": 2, "perm": 6}
    group = {"groupName": "doomed_cg", "consumeEnable": True}
    run(cluster, b.change_metadata(KIND_TOPIC_CONFIG, [topic]))
    run(cluster, b.change_metadata(KIND_GROUP_CONFIG, [group]))
    assert cluster.run_until(lambda: all("Doomed" in o.meta.topics.table and "doomed_cg" in o.meta.groups.table
                                         for o in others), 10)
    java = next(p for p in b.server.peer_kinds.peers)
    b.server.peer_kinds.learn(java, J)
    assert b.mixed.check() is M
    assert run(cluster, b.change_metadata(KIND_TOPIC_DELETE, [{"topicName": "Doomed"}])) == -1  # local only
    assert run(cluster, b.change_metadata(KIND_GROUP_DELETE, [{"groupName": "doomed_cg"}])) == -1
    assert "Doomed" not in b.meta.topics.table
    gone = {"topics": {"Doomed"}, "groups": {"doomed_cg"}}
    assert cluster.run_until(lambda: b.mixed.gone == gone, 3), b.mixed.gone  # the member's ticks notice them
    assert cluster.run_until(lambda: read_gone(b.mixed.gone_path) == gone, 3)  # kept across restarts
    assert b.mixed.gone_path.name == GONE_FILE
    b.server.peer_kinds.kinds[java] = D
    assert b.mixed.check() is L
    assert cluster.run_until(lambda: b.mixed._resuming is None, 10)
    assert cluster.run_until(lambda: all("Doomed" not in o.meta.topics.table and "doomed_cg" not in o.meta.groups.table
                                         for o in others), 10), [sorted(o.meta.topics.table) for o in others]
    assert b.mixed.gone == {"topics": set(), "groups": set()}


def test_a_mixed_member_without_vip_listen_says_what_java_slaves_miss(tmp_path):
    """A member with a broker port but no rocketmq.vipListen that goes MIXED says (once per move) that Java slaves
    under it learn no new topic; with vipListen set it does not."""
    import dataclasses

    from twisted.logger import formatEvent, globalLogPublisher

    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    java = next(p for p in b.server.peer_kinds.peers)
    events: list[dict] = []
    globalLogPublisher.addObserver(events.append)
    try:
        for vip, expect in (("", True), ("tcp:10909", False)):
            b.options = dataclasses.replace(b.options, listen="tcp:10911", vip_listen=vip)
            b.server.peer_kinds.kinds[java] = D
            b.mixed.check()
            events.clear()
            b.server.peer_kinds.learn(java, J)
            assert b.mixed.check() is M
            said = [formatEvent(e) for e in events if "no rocketmq.vipListen" in formatEvent(e)]
            assert bool(said) is expect, said
    finally:
        globalLogPublisher.removeObserver(events.append)


def test_gone_file_round_trip(tmp_path):
    """groupMode.deleted: what a restarted member reads back; missing or damaged: nothing gone (never an error)."""
    from dledger_rocketmq.broker.mixed import read_gone

    path = tmp_path / "groupMode.deleted"
    assert read_gone(path) == {"topics": set(), "groups": set()}
    path.write_text('{"topics": ["A", "", 3], "groups": ["g"]}\n')
    assert read_gone(path) == {"topics": {"A"}, "groups": {"g"}}
    path.write_text("not json")
    assert read_gone(path) == {"topics": set(), "groups": set()}
