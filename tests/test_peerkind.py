"""What each peer is (dledger.replication.peerkind): learnt from METADATA detail and from UNSUPPORTED."""

import pytest
from twisted.internet import task
from twisted.internet.defer import Deferred, fail, succeed

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import MetadataResponse
from dledger.replication.peerkind import (
    PeerKind,
    PeerKinds,
    all_take_snapshots,
    kind_from_failure,
    kind_from_metadata,
    merged,
)

D, J, U = PeerKind.DLEDGER, PeerKind.JAVA, PeerKind.UNKNOWN

METADATA = [
    ("dledger_fills_role", MetadataResponse(role="FOLLOWER"), D),
    ("java_leaves_role_out", MetadataResponse(peers={"n0": "x"}), J),
    ("an_error_says_nothing", MetadataResponse(code=int(ResponseCode.UNKNOWN_GROUP)), U),
]


@pytest.mark.parametrize("rule, resp, kind", METADATA, ids=[m[0] for m in METADATA])
def test_kind_from_metadata(rule, resp, kind):
    """A METADATA detail reply with a role comes from dledger; one without from Java; an error from nobody known."""
    assert kind_from_metadata(resp) is kind


FAILURES = [
    ("unsupported_code_is_java", DLedgerError(ResponseCode.UNSUPPORTED, "remoting code 3"), J),
    ("timeout_says_nothing", DLedgerError(ResponseCode.TIMEOUT, "no reply"), U),
    ("other_exception_says_nothing", RuntimeError("x"), U),
]


@pytest.mark.parametrize("rule, exc, kind", FAILURES, ids=[f[0] for f in FAILURES])
def test_kind_from_failure(rule, exc, kind):
    """Only UNSUPPORTED (Java's REQUEST_CODE_NOT_SUPPORTED) tells a peer's kind from a failure."""
    assert kind_from_failure(exc) is kind


@pytest.mark.parametrize("old, new, out", [(U, D, D), (D, U, D), (J, U, J), (U, J, J), (D, J, J)])
def test_merged(old, new, out):
    """An answer that says nothing keeps what was known."""
    assert merged(old, new) is out


@pytest.mark.parametrize("kinds, expected", [({"a": D, "b": D}, True), ({"a": D, "b": U}, False),
                                             ({"a": D, "b": J}, False), ({"a": D}, False)])
def test_all_take_snapshots(kinds, expected):
    """Compaction may go on only when every peer is known to be dledger (a missing or unknown one may be Java)."""
    assert all_take_snapshots(kinds, ["a", "b"]) is expected


class FakeTransport:
    def __init__(self, answers):
        self.answers = answers
        self.sent = []

    def send(self, peer, request, timeout=None):
        self.sent.append((peer, request))
        answer = self.answers[peer]
        if isinstance(answer, Exception):
            return fail(answer)
        if isinstance(answer, Deferred):
            return answer
        return succeed(answer)


def test_probe_learns_kinds_and_stops_when_all_known():
    """Each peer is asked METADATA with detail; dledger peers are asked once, Java ones again a minute later."""
    clock = task.Clock()
    transport = FakeTransport({"n1": MetadataResponse(role="LEADER"), "n2": MetadataResponse(peers={})})
    kinds = PeerKinds("n0", "g", ["n0", "n1", "n2"], transport, clock, probe_interval=5)
    kinds.start()
    assert [(p, r.detail) for p, r in transport.sent] == [("n1", True), ("n2", True)]
    assert kinds.kind("n1") is D and kinds.kind("n2") is J
    assert kinds.may_install("n1") and not kinds.may_install("n2")
    assert not kinds.all_take_snapshots()
    clock.advance(5)
    assert len(transport.sent) == 2  # n2 is Java: not asked again before a minute
    transport.answers["n2"] = MetadataResponse(role="FOLLOWER")  # upgraded to dledger
    clock.advance(60)
    assert kinds.kind("n2") is D and kinds.all_take_snapshots()
    n = len(transport.sent)
    clock.advance(60)
    assert len(transport.sent) == n and not clock.getDelayedCalls()  # everything known: no more probes
    kinds.stop()


def test_unreachable_peer_is_asked_again_and_unsupported_marks_java():
    """A peer that does not answer stays unknown and is asked every interval; an UNSUPPORTED answer marks it Java."""
    clock = task.Clock()
    transport = FakeTransport({"n1": DLedgerError(ResponseCode.NETWORK_ERROR, "down")})
    kinds = PeerKinds("n0", "g", ["n0", "n1"], transport, clock, probe_interval=5)
    kinds.start()
    clock.advance(5)
    assert len(transport.sent) == 2 and kinds.kind("n1") is U and kinds.may_install("n1")
    kinds.saw_unsupported("n1")
    assert kinds.kind("n1") is J and not kinds.may_install("n1")
    kinds.stop()
    assert not clock.getDelayedCalls()


def test_all_dledger_is_announced_once():
    """When the last unknown peer turns out dledger, on_all_dledger runs (a snapshot taken before may compact)."""
    clock = task.Clock()
    calls = []
    transport = FakeTransport({"n1": MetadataResponse(role="LEADER"), "n2": DLedgerError(ResponseCode.TIMEOUT, "")})
    kinds = PeerKinds("n0", "g", ["n0", "n1", "n2"], transport, clock, probe_interval=1,
                      on_all_dledger=lambda: calls.append(clock.seconds()))
    kinds.start()
    assert calls == []
    transport.answers["n2"] = MetadataResponse(role="FOLLOWER")
    clock.advance(1)
    clock.advance(1)
    assert calls == [1.0]
    kinds.stop()


def test_set_peers_follows_the_configuration():
    """A member added by a configuration change is probed; a removed one is forgotten (issue #23)."""
    clock = task.Clock()
    transport = FakeTransport({"n1": MetadataResponse(role="LEADER"), "n3": MetadataResponse(peers={})})
    kinds = PeerKinds("n0", "g", ["n0", "n1"], transport, clock, probe_interval=5)
    kinds.start()
    assert kinds.all_take_snapshots() and not clock.getDelayedCalls()
    kinds.set_peers(["n0", "n1", "n3"])
    assert [p for p, _r in transport.sent] == ["n1", "n3"]
    assert kinds.java_members() == frozenset({"n3"}) and not kinds.all_take_snapshots()
    kinds.set_peers(["n0", "n1"])
    assert kinds.java_members() == frozenset() and kinds.all_take_snapshots()
    kinds.stop()
