"""Table tests of the membership decisions (dledger.membership.rules) and the configuration codec."""

from __future__ import annotations

import pytest

from dledger.config import parse_peers
from dledger.membership import configuration as mc
from dledger.membership import rules as r
from dledger.membership.configuration import Configuration, ConfigurationError, MemberInfo, MemberRole

V, L = MemberRole.VOTER, MemberRole.LEARNER


def conf(spec: str, index: int = 0, term: int = 0) -> Configuration:
    """``"n0 n1 n2 n3:l n4:p"``: voters, a learner, a learner marked for promotion."""
    out = []
    for i, item in enumerate(spec.split()):
        mid, _, kind = item.partition(":")
        out.append(MemberInfo(mid, f"127.0.0.1:{20911 + i}", L if kind else V, promote=kind == "p"))
    return Configuration(tuple(out), index, term)


def test_codec_round_trip_and_json_shape():
    c = conf("n0 n1 n2:l n3:p", index=7, term=3)
    back = mc.decode(c.encode(), 7, 3)
    assert back == c
    assert back.voters == ("n0", "n1") and back.learners == ("n2", "n3") and back.quorum == 2
    assert b'"dledgerConfig":1' in c.encode()


@pytest.mark.parametrize("body, message", [
    (b"\xff", "not JSON"),
    (b"[]", "not a dledger configuration"),
    (b'{"dledgerConfig": 2, "members": []}', "format 1"),
    (b'{"dledgerConfig": 1, "members": []}', "non-empty list"),
    (b'{"dledgerConfig": 1, "members": [{"id": "n0", "address": "x"}]}', "is not 'host:port'"),
    (b'{"dledgerConfig": 1, "members": [{"id": "n 0", "address": "h:1"}]}', "may only contain"),
    (b'{"dledgerConfig": 1, "members": [{"id": "n0", "address": "h:1", "role": "boss"}]}', "unknown role"),
    (b'{"dledgerConfig": 1, "members": [{"id": "n0", "address": "h:1", "role": "learner"}]}', "no voter"),
    (b'{"dledgerConfig": 1, "members": [{"id": "n0", "address": "h:1"}, {"id": "n0", "address": "h:2"}]}',
     "twice"),
    (b'{"dledgerConfig": 1, "members": [{"id": "n0", "address": "h:70000"}]}', "out of range"),
])
def test_codec_refuses_bad_bodies_in_one_line(body, message):
    with pytest.raises(ConfigurationError, match=message) as info:
        mc.decode(body, index=5)
    assert "\n" not in str(info.value)


def test_bootstrap_from_peers_and_join_existing():
    peers = parse_peers("n0-127.0.0.1:1;n1-127.0.0.1:2;n2-[::1]:3")
    assert mc.bootstrap(peers, "n0").voters == ("n0", "n1", "n2")
    joined = mc.bootstrap(peers, "n2", join_existing=True)
    assert joined.voters == ("n0", "n1") and joined.learners == ("n2",)
    assert joined.addresses["n2"] == "[::1]:3"


@pytest.mark.parametrize("history, base_index, expected", [
    ([], 0, 0),
    ([5, 9, 3], 0, 9),
    ([5], 8, 8),  # a snapshot's base newer than every entry left
])
def test_in_force_is_the_newest(history, base_index, expected):
    base = conf("n0 n1 n2", index=base_index)
    assert r.in_force([conf("n0 n1", index=i) for i in history], base).index == expected


def test_truncation_and_compaction_keep_the_right_configuration():
    hist = [conf("n0 n1 n2 n3:p", 4), conf("n0 n1 n2 n3", 9)]
    assert [c.index for c in r.after_truncation(hist, 8)] == [4]
    assert r.in_force(r.after_truncation(hist, 3), conf("n0 n1 n2")).index == 0
    base, kept = r.after_compaction(hist, conf("n0 n1 n2"), begin_index=5)
    assert base.index == 4 and [c.index for c in kept] == [9]


@pytest.mark.parametrize("spec, acks, reached", [
    ("n0 n1 n2", {"n0", "n1"}, True),
    ("n0 n1 n2", {"n0"}, False),
    ("n0 n1 n2 n3:l", {"n0", "n3"}, False),  # a learner never counts
    ("n0 n1 n2 n3", {"n0", "n1"}, False),  # 4 voters: 3 needed
    ("n0 n1 n2", {"n0", "n9"}, False),  # outsiders never count
])
def test_quorum_counts_voters_only(spec, acks, reached):
    assert r.quorum_reached(conf(spec), acks) is reached


@pytest.mark.parametrize("spec, matches, expected", [
    ("n0 n1 n2", {"n0": 10, "n1": 7, "n2": 3}, 7),
    ("n0 n1 n2 n3:l", {"n0": 10, "n1": 2, "n2": 3, "n3": 10}, 3),  # the learner's 10 does not count
    ("n1 n2 n3", {"n0": 10, "n1": 4, "n2": 6, "n3": 1}, 4),  # leader n0 removed itself: it does not count
    ("n0 n1 n2", {"n0": 10}, -1),
])
def test_commit_index_of_a_configuration(spec, matches, expected):
    assert r.commit_index(conf(spec), matches) == expected


@pytest.mark.parametrize("spec, change, result", [
    ("n0 n1 n2", r.Change(r.Op.ADD, "n3", "127.0.0.1:30000"), ("ok", "n0 n1 n2 n3:p")),
    ("n0 n1 n2", r.Change(r.Op.ADD, "n3", "127.0.0.1:30000", learner=True), ("ok", "n0 n1 n2 n3:l")),
    ("n0 n1 n2 n3:l", r.Change(r.Op.PROMOTE, "n3"), ("ok", "n0 n1 n2 n3")),
    ("n0 n1 n2", r.Change(r.Op.REMOVE, "n1"), ("ok", "n0 n2")),
    ("n0 n1:l", r.Change(r.Op.REMOVE, "n1"), ("ok", "n0")),
    ("n0 n1 n2", r.Change(r.Op.ADD, "n1", "127.0.0.1:30000"), ("error", "already a member")),
    ("n0 n1 n2", r.Change(r.Op.ADD, "n3", "127.0.0.1:20912"), ("error", "already the address of n1")),
    ("n0 n1 n2", r.Change(r.Op.ADD, "n3", "nowhere"), ("error", "is not 'host:port'")),
    ("n0 n1 n2", r.Change(r.Op.PROMOTE, "n1"), ("error", "already a voter")),
    ("n0 n1 n2", r.Change(r.Op.PROMOTE, "n7"), ("error", "is not a member")),
    ("n0 n1 n2", r.Change(r.Op.REMOVE, "n7"), ("error", "is not a member")),
    ("n0 n1:l", r.Change(r.Op.REMOVE, "n0"), ("error", "last voter")),
])
def test_apply_change(spec, change, result):
    kind, what = result
    if kind == "error":
        with pytest.raises(ConfigurationError, match=what):
            r.apply_change(conf(spec), change)
        return
    got, expect = r.apply_change(conf(spec), change), conf(what)
    assert [(m.id, m.role, m.promote) for m in got.members] == [(m.id, m.role, m.promote) for m in expect.members]


ADD3 = r.Change(r.Op.ADD, "n3", "127.0.0.1:30000")


@pytest.mark.parametrize("view, change, reason", [
    (dict(), ADD3, None),
    (dict(java_members=frozenset({"n2"})), ADD3, "Java DLedger member(s) n2"),
    (dict(config=conf("n0 n1 n2 n3:p", index=12)), r.Change(r.Op.PROMOTE, "n3"), "entry 12) is not committed"),
    (dict(own_term_committed=False), ADD3, "own term"),
    # nothing committed yet: the bootstrap configuration is not a change in flight; the own-term rule says why
    (dict(committed_index=-1, own_term_committed=False), ADD3, "own term"),
    (dict(), r.Change(r.Op.REMOVE, "n9"), "n9 is not a member"),
    (dict(live=frozenset({"n0"})), ADD3, "no quorum"),
    (dict(live=frozenset({"n0", "n1"})), ADD3, None),  # a learner added: voters unchanged, 2 of 3 live
    # promoting n3 makes 4 voters: 3 needed, only n0, n1 (and the learner) live
    (dict(config=conf("n0 n1 n2 n3:l", index=3), live=frozenset({"n0", "n1", "n3"})),
     r.Change(r.Op.PROMOTE, "n3"), None),
    (dict(config=conf("n0 n1 n2 n3:l", index=3), live=frozenset({"n0", "n1"})),
     r.Change(r.Op.PROMOTE, "n3"), "no quorum for the new configuration (2 of 4 voters live, 3 needed"),
])
def test_refusal(view, change, reason):
    base = dict(self_id="n0", config=conf("n0 n1 n2", index=0), committed_index=10, own_term_committed=True,
                live=frozenset({"n0", "n1", "n2"}))
    base.update(view)
    why, new = r.refusal(r.LeaderView(**base), change)
    if reason is None:
        assert why is None and new is not None
    else:
        assert new is None and reason in why and "\n" not in why


@pytest.mark.parametrize("spec, matches, end, lag, expected", [
    ("n0 n1 n2 n3:p", {"n3": 95}, 100, 10, "n3"),
    ("n0 n1 n2 n3:p", {"n3": 80}, 100, 10, None),  # not caught up
    ("n0 n1 n2 n3:l", {"n3": 100}, 100, 10, None),  # stays a learner until promote
    ("n0 n1 n2 n3:p", {"n3": 100}, 100, -1, None),  # automatic promotion off
    ("n0 n1 n2 n3:p", {}, 100, 1000, None),  # never heard from
    ("n0 n1 n2 n3:p n4:p", {"n3": 10, "n4": 100}, 100, 5, "n4"),
])
def test_promotion(spec, matches, end, lag, expected):
    assert r.next_promotion(conf(spec), matches, end, lag) == expected


@pytest.mark.parametrize("spec, mid, standing, stands", [
    ("n0 n1 n2", "n1", r.Standing.VOTER, True),
    ("n0 n1 n2:l", "n2", r.Standing.LEARNER, False),
    ("n0 n1", "n2", r.Standing.REMOVED, False),
])
def test_standing(spec, mid, standing, stands):
    assert r.standing(conf(spec), mid) is standing
    assert r.may_stand(conf(spec), mid) is stands


@pytest.mark.parametrize("spec, index, committed, steps_down", [
    ("n1 n2", 9, 9, True),
    ("n1 n2", 9, 8, False),  # not committed yet: keep leading (without counting itself)
    ("n0 n1 n2", 9, 9, False),
    ("n0:l n1 n2", 9, 9, True),
])
def test_leader_steps_down_after_its_removal_commits(spec, index, committed, steps_down):
    assert r.leader_steps_down(conf(spec, index=index), committed, "n0") is steps_down


# -- the client's side ---------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, op, mid, address, done", [
    ("n0 n1 n2 n3:l", r.Op.ADD, "n3", "127.0.0.1:20914", True),  # added before the answer was lost
    ("n0 n1 n2 n3:l", r.Op.ADD, "n3", "127.0.0.1:9", False),  # there, at another address: not this change
    ("n0 n1 n2", r.Op.ADD, "n3", "127.0.0.1:20914", False),
    ("n0 n1 n2 n3:l", r.Op.PROMOTE, "n3", "", False),
    ("n0 n1 n2 n3", r.Op.PROMOTE, "n3", "", True),
    ("n0 n1 n2", r.Op.PROMOTE, "n3", "", False),  # gone: a promotion is not done by a removal
    ("n0 n1 n2", r.Op.REMOVE, "n2", "", False),
    ("n0 n1", r.Op.REMOVE, "n2", "", True),
])
def test_change_done(spec, op, mid, address, done):
    """A change whose answer was lost is settled by reading the configuration: is it already so?"""
    assert r.change_done(conf(spec), r.Change(op, mid, address)) is done


@pytest.mark.parametrize("old, new_id, new_address, spec, why", [
    ("n0", "n3", "127.0.0.1:20914", None, None),  # the arguments alone
    ("n0", "n0", "127.0.0.1:20914", None, "replace n0 by itself: give the new member another id"),
    ("n0", "n3", "nowhere", None, "address"),  # check_member's own line
    ("n0", "n3", "127.0.0.1:20914", "n0 n1 n2", None),  # to be added
    ("n0", "n3", "127.0.0.1:20914", "n0 n1 n2 n3:l", None),  # run again: already added
    ("n0", "n3", "127.0.0.1:20913", "n1 n2 n3", None),  # run again: already removed (n3 third: :20913)
    ("n7", "n3", "127.0.0.1:20914", "n0 n1 n2", "n7 is not a member (members: n0, n1, n2)"),
    ("n0", "n3", "127.0.0.1:9", "n0 n1 n2 n3:l", "n3 is already a member at 127.0.0.1:20914, not 127.0.0.1:9"),
])
def test_replacement_refusal(old, new_id, new_address, spec, why):
    """``replace`` refuses, in one line, what cannot be a replacement; a re-run after an interruption passes."""
    got = r.replacement_refusal(old, new_id, new_address, None if spec is None else conf(spec))
    if why is None:
        assert got is None
    else:
        assert got is not None and why in got
