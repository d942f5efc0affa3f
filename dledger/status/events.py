"""The last elections and leadership changes of one member, each with the reason it happened.

The elector tells observers only ``(term, role)``; the reason is inferred from what changed (the
previous role, term and leader, whether a leadership transfer was under way) by
:func:`dledger.status.rules.change_reason`, a pure function with a table test.  :class:`RoleEvents`
keeps a bounded ring of them, so a member that flaps for days holds a few kilobytes, not its whole
history.
"""

from __future__ import annotations

from collections import deque
from dataclasses import asdict, dataclass
from typing import Any

from dledger.status.rules import Before, change_reason

#: Role changes kept per member (the page shows the newest first).
MAX_EVENTS = 50


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
