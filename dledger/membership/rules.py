"""Membership decisions as pure functions (issue #23), in the style of :mod:`dledger.election.rules`.

Single-server changes (Ongaro's dissertation §4.1): each change adds, promotes or removes one member,
so any majority of the old voters and any majority of the new voters overlap, and the new
configuration is in force on a member as soon as its entry is in the member's log.  Two rules keep
that safe:

* **one change at a time**: a leader proposes a change only once the configuration in force is
  committed (:func:`refusal`);
* **the leader's own term first** (the fix Ongaro posted to raft-dev in 2015 for the bug in the
  dissertation's algorithm): a new leader proposes a change only after it has committed an entry of
  its own term -- otherwise two leaders of different terms can each commit a different single-server
  change from the same old configuration, and the two new configurations need not overlap.

Nothing here touches a clock, a disk or a socket: every rule is a row of a table test
(tests/test_membership_rules.py); :mod:`dledger.membership.tracker` and the server apply them.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from dledger.membership.configuration import (
    Configuration,
    ConfigurationError,
    MemberInfo,
    MemberRole,
    check_member,
)

# -- which configuration applies ------------------------------------------------------------------------

def in_force(history: Iterable[Configuration], base: Configuration) -> Configuration:
    """The configuration a member uses: the newest (highest index) of its log's, else ``base``.

    ``history`` is every configuration entry the log holds (committed or not); ``base`` is the one
    before the log's first entry: a snapshot's, or the bootstrap ``--peers`` for a log that starts at 1.
    """
    newest = base
    for c in history:
        if c.index > newest.index:
            newest = c
    return newest


def after_truncation(history: Iterable[Configuration], end_index: int) -> list[Configuration]:
    """The configuration entries left once the log is cut back to ``end_index`` (a follower's truncation).

    A configuration whose entry is removed stops applying: the member falls back to the previous one.
    """
    return [c for c in history if c.index <= end_index]


def after_compaction(history: Iterable[Configuration], base: Configuration,
                     begin_index: int) -> tuple[Configuration, list[Configuration]]:
    """``(new base, kept history)`` once the log's entries before ``begin_index`` are gone.

    The newest configuration among the removed entries becomes the base (a snapshot records it), so
    compaction never changes the configuration in force.
    """
    history = list(history)
    gone = [c for c in history if c.index < begin_index]
    kept = [c for c in history if c.index >= begin_index]
    return in_force(gone, base), kept


# -- quorums -----------------------------------------------------------------------------------------------

def quorum_reached(config: Configuration, acks: Iterable[str]) -> bool:
    """The members in ``acks`` (the leader's own id included when it acknowledges) are a majority of the voters.

    Learners and members outside the configuration never count.
    """
    voters = set(config.voters)
    return len(voters.intersection(acks)) >= config.quorum


def commit_index(config: Configuration, matches: Mapping[str, int]) -> int:
    """The highest index stored on a majority of the voters; ``matches`` maps member -> last index it stored.

    The leader passes its own durable index under its own id; it counts only if it is a voter of
    ``config`` (a leader removing itself manages a group it is not part of until the change commits).
    A voter with no entry in ``matches`` counts as having stored nothing.
    """
    stored = sorted((matches.get(v, -1) for v in config.voters), reverse=True)
    return stored[config.quorum - 1]


# -- proposing a change --------------------------------------------------------------------------------------

class Op(enum.Enum):
    """The single-server changes an admin can ask for (``replace`` is add, promote, remove in turn)."""

    ADD = "add"  # a new member, as a learner (promoted by the leader once caught up unless it stays a learner)
    PROMOTE = "promote"  # a learner becomes a voter
    REMOVE = "remove"  # a member (voter or learner) leaves


@dataclass(frozen=True)
class Change:
    """One requested change. ``learner``: an added member stays a learner until ``promote``."""

    op: Op
    member_id: str
    address: str = ""
    learner: bool = False

    def describe(self) -> str:
        if self.op is Op.ADD:
            return f"add {self.member_id}={self.address}" + (" as a learner" if self.learner else "")
        return f"{self.op.value} {self.member_id}"


def apply_change(current: Configuration, change: Change) -> Configuration:
    """The configuration ``change`` makes of ``current`` (index/term unset); ConfigurationError if it cannot be made."""
    mid = change.member_id
    existing = current.get(mid)
    if change.op is Op.ADD:
        check_member(mid, change.address)
        if existing is not None:
            raise ConfigurationError(f"{mid} is already a member ({existing.role.value} at {existing.address})")
        for m in current.members:
            if m.address == change.address:
                raise ConfigurationError(f"{change.address} is already the address of {m.id}")
        return current.replace(MemberInfo(mid, change.address, MemberRole.LEARNER, promote=not change.learner))
    if existing is None:
        raise ConfigurationError(f"{mid} is not a member (members: {', '.join(current.ids)})")
    if change.op is Op.PROMOTE:
        if existing.voter:
            raise ConfigurationError(f"{mid} is already a voter")
        return current.replace(existing.as_voter())
    if change.op is Op.REMOVE:
        if existing.voter and len(current.voters) == 1:
            raise ConfigurationError(f"{mid} is the last voter: a group cannot remove its last voter")
        return current.without(mid)
    raise ConfigurationError(f"unknown change {change.op!r}")  # pragma: no cover - Op is closed


@dataclass(frozen=True)
class LeaderView:
    """What the leader knows when an admin asks for a change."""

    self_id: str
    config: Configuration  # in force (the newest in its log)
    committed_index: int
    #: The leader has committed an entry of its own term (its term-start NOOP, or any later entry).
    own_term_committed: bool
    #: Members that answered the leader within the last election timeout (the leader itself included).
    live: frozenset[str]
    #: Members known to run Java DLedger (they cannot read a configuration entry).
    java_members: frozenset[str] = frozenset()


def refusal(view: LeaderView, change: Change) -> tuple[str | None, Configuration | None]:
    """``(None, new configuration)`` if the leader may propose ``change`` now, else ``(one-line reason, None)``.

    In order: a Java DLedger member in the group; a change still in flight; no entry of the leader's
    term committed yet; the change itself invalid; no live majority of the new voters to commit it.
    """
    if view.java_members:
        return (f"refused: Java DLedger member(s) {', '.join(sorted(view.java_members))} cannot read a "
                "configuration entry; membership changes need a group of dledger members only"), None
    if view.config.index > max(view.committed_index, 0):  # index 0: the bootstrap --peers, never in flight
        return (f"refused: another configuration change (entry {view.config.index}) is not committed yet; "
                "retry once it is"), None
    if not view.own_term_committed:
        return "refused: the new leader has not committed an entry of its own term yet; retry in a moment", None
    try:
        new = apply_change(view.config, change)
    except ConfigurationError as e:
        return f"refused: {e}", None
    if not quorum_reached(new, view.live):
        missing = [v for v in new.voters if v not in view.live]
        return (f"refused: no quorum for the new configuration ({len(new.voters) - len(missing)} of "
                f"{len(new.voters)} voters live, {new.quorum} needed; unreachable: {', '.join(missing)})"), None
    return None, new


# -- promotion ----------------------------------------------------------------------------------------------

def promotion_due(member: MemberInfo, match_index: int, leader_end_index: int, lag: int) -> bool:
    """A learner marked for promotion has caught up to within ``lag`` entries (``lag`` < 0: never automatically)."""
    if member.voter or not member.promote or lag < 0 or match_index < 0:
        return False
    return leader_end_index - match_index <= lag


def next_promotion(config: Configuration, matches: Mapping[str, int], leader_end_index: int,
                   lag: int) -> str | None:
    """The first learner (in configuration order) the leader should promote now, if any."""
    for m in config.members:
        if promotion_due(m, matches.get(m.id, -1), leader_end_index, lag):
            return m.id
    return None


# -- what a member is ------------------------------------------------------------------------------------------

class Standing(enum.Enum):
    """A member's place in the configuration in force."""

    VOTER = "voter"  # votes, counts, may stand for election
    LEARNER = "learner"  # receives the log; never votes, never counts, never stands
    REMOVED = "removed"  # not in the configuration: never stands, refuses to serve as a member


def standing(config: Configuration, member_id: str) -> Standing:
    m = config.get(member_id)
    if m is None:
        return Standing.REMOVED
    return Standing.VOTER if m.voter else Standing.LEARNER


def may_stand(config: Configuration, member_id: str) -> bool:
    """Only a voter of the configuration in force times out into a candidate."""
    return standing(config, member_id) is Standing.VOTER


def leader_steps_down(config: Configuration, committed_index: int, self_id: str) -> bool:
    """A leader leaves once a configuration that no longer makes it a voter is committed (then hands over)."""
    return config.index <= committed_index and not config.is_voter(self_id)


# -- the client's side: a change already made, a replacement that cannot be ----------------------------

def change_done(config: Configuration, change: Change) -> bool:
    """``config`` already holds what ``change`` asks for (so asking again would be refused, and is not needed).

    How a client settles a change whose answer was lost: it reads the configuration instead of asking again.
    """
    m = config.get(change.member_id)
    if change.op is Op.ADD:
        return m is not None and m.address == change.address
    if change.op is Op.PROMOTE:
        return m is not None and m.voter
    return m is None


def replacement_refusal(old: str, new_id: str, new_address: str, config: Configuration | None = None) -> str | None:
    """Why ``replace OLD NEW=ADDRESS`` cannot be done (one line), or None.

    Without ``config`` only the arguments are checked (before anything is asked of the group); with the
    leader's configuration, also that there is something to replace: ``old`` or ``new_id`` is a member
    (either may be missing when a replacement is run again after an interruption), and ``new_id`` is not
    a member at another address.
    """
    try:
        check_member(new_id, new_address)
    except ConfigurationError as exc:
        return str(exc)
    if old == new_id:
        return f"replace {old} by itself: give the new member another id"
    if config is None:
        return None
    existing = config.get(new_id)
    if config.get(old) is None and existing is None:
        return f"{old} is not a member (members: {', '.join(config.ids)})"
    if existing is not None and existing.address != new_address:
        return f"{new_id} is already a member at {existing.address}, not {new_address}"
    return None
