"""The status page's decisions as small pure functions (table-tested in tests/test_status_rules.py).

In the style of :mod:`dledger.election.rules`: what a page says about a role change, about another
member's role, about a member's place in the configuration and about how far the state machines got
is decided here, from plain values; :mod:`dledger.status.model` reads the member and
:mod:`dledger.status.events` keeps the ring.  A page must only say what this member can vouch for, so
each rule names where its knowledge stops.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Before:
    """What the member was just before a role change."""

    role: str | None  # None: the first change after start
    term: int
    leader: str | None


def change_reason(before: Before, role: str, term: int, leader: str | None, *, transfer: bool = False,
                  self_id: str = "") -> str:
    """Why the member became ``role`` in ``term`` (one short phrase an operator can read).

    The elector tells observers only ``(term, role)``, so the reason is inferred from what changed.
    """
    if role == "LEADER":
        how = "leadership transfer" if transfer else "won the vote"
        return f"{how} in term {term}"
    if role == "FOLLOWER":
        if before.leader not in (None, leader) and before.role == "FOLLOWER":
            return f"new leader {leader} (was {before.leader})"
        if before.role == "LEADER":
            return f"stepped down: {leader} leads term {term}"
        return f"heartbeat from leader {leader} in term {term}"
    # CANDIDATE
    if before.role is None:
        return "started"
    if before.role == "LEADER":
        if term > before.term:
            return f"stepped down: saw term {term}"
        return "stepped down: lost contact with a quorum"
    if before.role == "FOLLOWER":
        if term > before.term:
            return f"saw term {term} (was following {before.leader})"
        return f"leader {before.leader} silent: heartbeat timeout"
    return f"new vote round in term {term}"


def member_role(member: str, *, self_id: str, role: str, leader: str | None, in_contact: dict[str, bool]) -> str:
    """The role one member's page can vouch for: its own, the leader's, and (on the leader) its followers'.

    A follower does not know the other followers' roles (``?``); the leader knows a follower it is in
    contact with follows it, and calls the others UNREACHABLE.
    """
    if member == self_id:
        return role
    if member == leader:
        return "LEADER"
    if role == "LEADER":
        return "FOLLOWER" if in_contact.get(member) else "UNREACHABLE"
    return "?"


def membership_label(role: str, *, voter: bool, promote: bool) -> str:
    """A member's place in the configuration: ``voter``, ``learner``, or ``learner, to be promoted``.

    ``role`` is the configuration's role name; a learner added without ``--learner`` is promoted by the
    leader once caught up, which the page says so the operator does not promote it by hand.
    """
    return role + (", to be promoted" if promote and not voter else "")


def applied_index(committed: int, listener_nexts: Sequence[int]) -> int:
    """The highest index every commit listener has been given: one below the slowest listener's next
    index, never past the committed index; the committed index when there is no listener."""
    if not listener_nexts:
        return committed
    return min(committed, min(listener_nexts) - 1)


def configuration_committed(config_index: int, committed: int) -> bool:
    """The configuration in force is committed (no membership change in flight)."""
    return config_index <= committed


def seconds_since(now: float, last: float | None) -> float | None:
    """Seconds since the last contact, to the millisecond, never negative (a clock step back); None: never."""
    return None if last is None else round(max(0.0, now - last), 3)
