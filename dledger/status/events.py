"""The last elections and leadership changes of one member, each with the reason it happened.

The elector tells observers only ``(term, role)``; the reason is inferred from what changed (the
previous role, term and leader, whether a leadership transfer was under way) by :func:`change_reason`,
a pure function with a table test.  :class:`RoleEvents` keeps a bounded ring of them, so a member
that flaps for days holds a few kilobytes, not its whole history.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

#: Role changes kept per member (the page shows the newest first).
MAX_EVENTS = 50


@dataclass(frozen=True)
class Before:
    """What the member was just before a role change."""

    role: str | None  # None: the first change after start
    term: int
    leader: str | None


@dataclass(frozen=True)
class RoleEvent:
    """One role change as the status page shows it."""

    at: float  # clock seconds (wall clock in a running member)
    term: int
    role: str
    leader: str | None
    reason: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def change_reason(before: Before, role: str, term: int, leader: str | None, *, transfer: bool = False,
                  self_id: str = "") -> str:
    """Why the member became ``role`` in ``term`` (one short phrase an operator can read)."""
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


class RoleEvents:
    """A bounded ring of :class:`RoleEvent`; :meth:`role_changed` is an elector observer.

    ``state`` is the member's :class:`~dledger.election.state.MemberState` (read for the leader and
    whether a transfer is being taken); ``clock`` gives the time of each change.
    """

    def __init__(self, state: Any, clock: Any, *, limit: int = MAX_EVENTS):
        self.state = state
        self.clock = clock
        self.events: deque[RoleEvent] = deque(maxlen=limit)
        self._before = Before(None, -1, None)
        #: Role changes seen since start (the ring forgets; this does not).
        self.count = 0

    def role_changed(self, term: int, role: Any) -> None:
        name = getattr(role, "name", str(role))
        leader = self.state.leader_id
        transfer = bool(getattr(self.state, "taking_leadership", False))
        reason = change_reason(self._before, name, term, leader, transfer=transfer)
        self.events.append(RoleEvent(self.clock.seconds(), term, name, leader, reason))
        self._before = Before(name, term, leader)
        self.count += 1

    def newest_first(self) -> list[RoleEvent]:
        return list(reversed(self.events))
