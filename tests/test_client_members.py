"""The client's membership calls against a fake group that follows the contract (issue #23 item 4).

The fake leader applies :func:`dledger.membership.rules.refusal` like a real one, answers MEMBERS and
METADATA, redirects with NOT_LEADER from followers, and can be told to lose an answer (the change made
but the reply lost) or to move leadership.  Time is a ``task.Clock``.
"""

from __future__ import annotations

import pytest
from twisted.internet import task
from twisted.internet.defer import Deferred, fail, succeed

from dledger.client import DLedgerClient
from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.member_changes import MembersView, Replacement, done
from dledger.membership.configuration import Configuration, MemberInfo, MemberRole
from dledger.membership.rules import Change, LeaderView, Op, refusal
from dledger.messages import MembersRequest, MembersResponse, MetadataRequest, MetadataResponse

BASE = Configuration(tuple(MemberInfo(f"n{i}", f"127.0.0.1:{20911 + i}") for i in range(3)))


class FakeGroup:
    """Members that answer from one shared state; ``leader`` answers changes, the others redirect."""

    def __init__(self, *, auto_promote: bool = True, down: tuple[str, ...] = ()):
        self.config = BASE
        self.committed = 5
        self.end = 5
        self.leader = "n0"
        self.auto_promote = auto_promote
        self.down = set(down)
        self.sent: list[tuple[str, object]] = []
        self.lose_next_answer = False  # the change is made, the answer is lost (a timeout)
        self.refuse_next: str | None = None  # a passing refusal once
        self.learner_end: dict[str, int] = {}
        self.members = {m.id: m.address for m in BASE.members}
        self.stale: dict[str, Configuration] = {}  # members whose copy lags behind the leader's

    def live(self) -> frozenset[str]:
        return frozenset(m for m in self.config.ids if m not in self.down) | {"n3", "n4"} - self.down

    def send(self, peer: str, req, timeout=None) -> Deferred:
        self.sent.append((peer, req))
        if peer in self.down or peer not in self.members:
            return fail(DLedgerError(ResponseCode.NETWORK_ERROR, f"{peer} is down"))
        if isinstance(req, MetadataRequest):
            end = self.learner_end.get(peer, self.end)
            return succeed(MetadataResponse(group="g0", leader_id=self.leader, term=1,
                                            role="LEADER" if peer == self.leader else "FOLLOWER",
                                            ledger_begin_index=0, ledger_end_index=end, committed_index=end))
        assert isinstance(req, MembersRequest)
        if req.op == "list":
            if peer in self.stale:
                old = self.stale[peer]
                return succeed(MembersResponse(leader_id=self.leader, configuration=old.to_json(),
                                               config_index=old.index, committed_index=old.index))
            return succeed(self.answer())
        if peer != self.leader:
            return succeed(MembersResponse(code=ResponseCode.NOT_LEADER, leader_id=self.leader))
        if self.refuse_next:
            why, self.refuse_next = self.refuse_next, None
            return succeed(MembersResponse(code=ResponseCode.CONFIG_CHANGE_REFUSED, leader_id=self.leader, error=why))
        change = Change(Op(req.op), req.member_id, req.address or "", bool(req.learner))
        view = LeaderView(self.leader, self.config, self.committed, True, self.live())
        why, new = refusal(view, change)
        if why is not None:
            return succeed(MembersResponse(code=ResponseCode.CONFIG_CHANGE_REFUSED, leader_id=self.leader, error=why))
        self.end += 1
        self.committed = self.end
        self.config = new.at(self.end, 1)
        if req.op == "remove" and req.member_id == self.leader:
            self.leader = next(v for v in self.config.voters if v not in self.down)
        if self.lose_next_answer:
            self.lose_next_answer = False
            return fail(DLedgerError(ResponseCode.TIMEOUT, "answer lost"))
        return succeed(self.answer())

    def answer(self) -> MembersResponse:
        return MembersResponse(leader_id=self.leader, configuration=self.config.to_json(),
                               config_index=self.config.index, committed_index=self.committed)

    def tick(self) -> None:
        """The leader's automatic promotion of a caught-up learner marked for it."""
        for m in self.config.members:
            if self.auto_promote and not m.voter and m.promote and self.learner_end.get(m.id, self.end) >= self.end - 1:
                self.end += 1
                self.committed = self.end
                self.config = self.config.replace(m.as_voter()).at(self.end, 1)


def client_of(group: FakeGroup, clock: task.Clock) -> DLedgerClient:
    return DLedgerClient(group, "g0", ["n0", "n1", "n2"], clock=clock, retry_delay=0.05)


def run(clock: task.Clock, d: Deferred, group: FakeGroup | None = None, steps: int = 5000):
    """Advance the clock until ``d`` fires (bounded); its result, or its exception raised."""
    out: list = []
    d.addBoth(out.append)
    for _ in range(steps):
        if out:
            break
        if group is not None:
            group.tick()
        clock.advance(0.05)
    assert out, "the call did not finish"
    if isinstance(out[0], Exception) or hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def test_list_returns_the_configuration_with_roles_and_whether_it_is_committed():
    clock, group = task.Clock(), FakeGroup()
    view = run(clock, client_of(group, clock).members())
    assert [m.id for m in view.configuration.members] == ["n0", "n1", "n2"]
    assert view.committed and view.role("n1") == "voter" and view.role("n9") is None
    assert view.to_json()["members"][0] == {"id": "n0", "address": "127.0.0.1:20911", "role": "voter"}


def test_list_answered_by_a_lagging_follower_is_asked_again_of_the_leader():
    clock, group = task.Clock(), FakeGroup()
    group.leader = "n2"
    run(clock, client_of(group, clock).add_member("n3", "127.0.0.1:20914"))
    group.stale["n0"] = BASE
    view = run(clock, client_of(group, clock).members())  # a new client asks n0 first
    assert [peer for peer, req in group.sent[-2:]] == ["n0", "n2"]
    assert view.member == "n2" and view.role("n3") == "learner"


def test_add_follows_the_leader_and_the_client_learns_the_new_address():
    clock, group = task.Clock(), FakeGroup()
    group.leader = "n2"
    client = client_of(group, clock)
    client.leader = "n1"  # stale guess: the client finds n2
    view = run(clock, client.add_member("n3", "127.0.0.1:20914", learner=True))
    assert view.role("n3") == "learner" and not view.configuration.get("n3").promote
    assert [peer for peer, req in group.sent if isinstance(req, MembersRequest) and req.op == "add"] == ["n2"]
    assert group.members["n3"] == "127.0.0.1:20914" and "n3" in client.member_ids


def test_a_refusal_is_a_one_line_error_with_the_leaders_reason():
    clock, group = task.Clock(), FakeGroup()
    with pytest.raises(DLedgerError) as err:
        run(clock, client_of(group, clock).remove_member("n7"))
    assert "n7 is not a member" in err.value.message and "\n" not in err.value.message
    with pytest.raises(DLedgerError) as err:
        run(clock, client_of(group, clock).add_member("n3", "no-port"))
    assert err.value.code is ResponseCode.UNEXPECTED_ARGUMENT and "host:port" in err.value.message


def test_a_passing_refusal_is_retried_and_a_lost_answer_is_settled_by_reading_the_configuration():
    clock, group = task.Clock(), FakeGroup()
    group.refuse_next = "refused: another configuration change (entry 9) is not committed yet; retry once it is"
    view = run(clock, client_of(group, clock).add_member("n3", "127.0.0.1:20914"))
    assert view.role("n3") == "learner"
    group.lose_next_answer = True
    view = run(clock, client_of(group, clock).promote_member("n3"))
    adds = [req for _, req in group.sent if isinstance(req, MembersRequest) and req.op == "promote"]
    assert view.role("n3") == "voter" and len(adds) == 1, "the promotion was made once, not asked twice"


@pytest.mark.parametrize("auto_promote", [True, False])
def test_replace_adds_waits_for_a_voter_then_removes_and_reports_each_step(auto_promote):
    clock, group = task.Clock(), FakeGroup(auto_promote=auto_promote)
    lines: list[str] = []
    client = client_of(group, clock)
    view = run(clock, client.replace_member("n0", "n3", "127.0.0.1:20914", progress=lines.append, poll=0.1),
               group)
    assert view.configuration.ids == ("n1", "n2", "n3") and view.configuration.voters == ("n1", "n2", "n3")
    ops = [(req.op, req.member_id) for _, req in group.sent if isinstance(req, MembersRequest) and req.op != "list"]
    expected = [("add", "n3")] + ([] if auto_promote else [("promote", "n3")]) + [("remove", "n0")]
    assert ops == expected
    assert lines[0].startswith("adding n3=127.0.0.1:20914") and lines[-1].startswith("replaced n0 by n3")
    assert any("is a voter" in line or "promoting it" in line for line in lines)
    assert group.leader != "n0"


def test_replace_run_again_picks_up_where_the_group_is():
    clock, group = task.Clock(), FakeGroup()
    client = client_of(group, clock)
    run(clock, client.add_member("n3", "127.0.0.1:20914"))
    group.tick()
    lines: list[str] = []
    view = run(clock, client.replace_member("n1", "n3", "127.0.0.1:20914", progress=lines.append), group)
    ops = [req.op for _, req in group.sent if isinstance(req, MembersRequest) and req.op != "list"]
    assert ops == ["add", "remove"] and view.configuration.ids == ("n0", "n2", "n3")
    assert any("not added again" in line for line in lines)
    with pytest.raises(DLedgerError, match="already a member at"):
        run(clock, client.replace_member("n2", "n3", "127.0.0.1:1"))


def test_replace_with_the_old_member_down_still_completes():
    clock, group = task.Clock(), FakeGroup(down=("n1",))
    view = run(clock, client_of(group, clock).replace_member("n1", "n3", "127.0.0.1:20914"), group)
    assert view.configuration.voters == ("n0", "n2", "n3")


def test_replace_gives_up_on_a_learner_that_never_catches_up():
    clock, group = task.Clock(), FakeGroup(auto_promote=False)
    group.learner_end["n3"] = 1
    with pytest.raises(DLedgerError, match="did not become a voter within 5s"):
        run(clock, Deferred.fromCoroutine(Replacement(client_of(group, clock), catch_up_timeout=5)
                                          .run("n0", "n3", "127.0.0.1:20914")), group)


@pytest.mark.parametrize("op,mid,addr,config_has,expected", [
    (Op.ADD, "n3", "h:1", MemberInfo("n3", "h:1", MemberRole.LEARNER), True),
    (Op.ADD, "n3", "h:1", MemberInfo("n3", "h:2", MemberRole.LEARNER), False),
    (Op.ADD, "n3", "h:1", None, False),
    (Op.PROMOTE, "n3", "", MemberInfo("n3", "h:1", MemberRole.LEARNER), False),
    (Op.PROMOTE, "n3", "", MemberInfo("n3", "h:1"), True),
    (Op.REMOVE, "n3", "", MemberInfo("n3", "h:1"), False),
    (Op.REMOVE, "n3", "", None, True),
])
def test_done_says_whether_a_change_is_already_in_the_configuration(op, mid, addr, config_has, expected):
    config = BASE if config_has is None else BASE.replace(config_has)
    assert done(config, Change(op, mid, addr)) is expected


def test_a_bad_configuration_in_a_reply_is_one_line():
    resp = MembersResponse(configuration={"dledgerConfig": 9}, config_index=3, committed_index=3)
    with pytest.raises(DLedgerError, match="n1 answered a bad configuration"):
        MembersView.from_response(resp, "n1")
