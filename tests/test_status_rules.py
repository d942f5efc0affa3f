"""The status page's decisions (:mod:`dledger.status.rules`), one table each, one row per rule."""

from __future__ import annotations

import pytest

from dledger.status.rules import (
    Before,
    applied_index,
    change_reason,
    configuration_committed,
    member_role,
    membership_label,
    seconds_since,
)


@pytest.mark.parametrize("before, role, term, leader, transfer, reason", [
    (Before(None, -1, None), "CANDIDATE", 0, None, False, "started"),
    (Before("CANDIDATE", 1, None), "LEADER", 1, "n0", False, "won the vote in term 1"),
    (Before("FOLLOWER", 3, "n1"), "LEADER", 4, "n0", True, "leadership transfer in term 4"),
    (Before("CANDIDATE", 1, None), "FOLLOWER", 1, "n1", False, "heartbeat from leader n1 in term 1"),
    (Before("FOLLOWER", 1, "n1"), "CANDIDATE", 1, None, False, "leader n1 silent: heartbeat timeout"),
    (Before("FOLLOWER", 1, "n1"), "CANDIDATE", 2, None, False, "saw term 2 (was following n1)"),
    (Before("LEADER", 2, "n0"), "CANDIDATE", 3, None, False, "stepped down: saw term 3"),
    (Before("LEADER", 2, "n0"), "CANDIDATE", 2, None, False, "stepped down: lost contact with a quorum"),
    (Before("LEADER", 2, "n0"), "FOLLOWER", 3, "n2", False, "stepped down: n2 leads term 3"),
    (Before("FOLLOWER", 2, "n0"), "FOLLOWER", 3, "n2", False, "new leader n2 (was n0)"),
    (Before("CANDIDATE", 2, None), "CANDIDATE", 3, None, False, "new vote round in term 3"),
])
def test_change_reason(before, role, term, leader, transfer, reason):
    """Each role transition gets the reason an operator reads on the page."""
    assert change_reason(before, role, term, leader, transfer=transfer) == reason


@pytest.mark.parametrize("member, role, leader, in_contact, expected", [
    ("n0", "FOLLOWER", "n1", {}, "FOLLOWER"),  # its own role, always
    ("n0", "CANDIDATE", None, {}, "CANDIDATE"),
    ("n1", "FOLLOWER", "n1", {}, "LEADER"),  # the leader it follows
    ("n2", "FOLLOWER", "n1", {}, "?"),  # a follower cannot vouch for another follower
    ("n2", "CANDIDATE", None, {}, "?"),
    ("n1", "LEADER", "n0", {"n1": True}, "FOLLOWER"),  # on the leader: in contact, so following
    ("n2", "LEADER", "n0", {"n1": True, "n2": False}, "UNREACHABLE"),
    ("n3", "LEADER", "n0", {}, "UNREACHABLE"),  # no dispatcher yet (a member just added)
])
def test_member_role(member, role, leader, in_contact, expected):
    assert member_role(member, self_id="n0", role=role, leader=leader, in_contact=in_contact) == expected


@pytest.mark.parametrize("role, voter, promote, expected", [
    ("voter", True, False, "voter"),
    ("voter", True, True, "voter"),  # promoted already: nothing left to say
    ("learner", False, False, "learner"),  # added with --learner: stays one
    ("learner", False, True, "learner, to be promoted"),
])
def test_membership_label(role, voter, promote, expected):
    assert membership_label(role, voter=voter, promote=promote) == expected


@pytest.mark.parametrize("committed, nexts, expected", [
    (10, [], 10),  # no listener: what is committed counts as applied
    (10, [11, 4], 3),  # the slowest listener was given up to 3
    (10, [20], 10),  # never past the committed index
    (-1, [0], -1),  # nothing committed, nothing applied
])
def test_applied_index(committed, nexts, expected):
    assert applied_index(committed, nexts) == expected


@pytest.mark.parametrize("config_index, committed, expected", [
    (0, 0, True),  # the bootstrap configuration (index 0) once the group committed its first entry
    (0, -1, False),  # ... and before: the page says "not committed yet" until then (as it always did)
    (7, 7, True),
    (7, 6, False),  # a change in flight
])
def test_configuration_committed(config_index, committed, expected):
    assert configuration_committed(config_index, committed) is expected


@pytest.mark.parametrize("now, last, expected", [
    (10.0, None, None),  # never in contact
    (10.0, 9.25, 0.75),
    (10.0, 10.5, 0.0),  # the clock stepped back: never negative
    (10.0, 8.12345, 1.877),
])
def test_seconds_since(now, last, expected):
    assert seconds_since(now, last) == expected


def test_a_section_provider_is_the_one_seam_of_the_page():
    """A plain provider (``IStatusSectionProvider``) is rendered from ``plugin_sections`` like the core's own."""
    from zope.interface import implementer
    from zope.interface.verify import verifyObject

    from dledger.interfaces import IStatusSectionProvider
    from dledger.status.model import plugin_sections, section

    @implementer(IStatusSectionProvider)
    class Topics:
        def __call__(self):
            return section("topics", "Topics", summary=[("topics", 2)])

    provider = Topics()
    assert verifyObject(IStatusSectionProvider, provider)
    assert plugin_sections([provider, lambda: None], on_error=lambda p, e: None) == [
        {"id": "topics", "title": "Topics", "summary": [["topics", 2]], "tables": []}]
