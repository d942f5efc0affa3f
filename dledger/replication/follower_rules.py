"""The follower's replication decisions as pure functions (SPEC §4 "Entry handler").

:class:`dledger.replication.follower.EntryHandler` applies them: it reads and
writes the store, waits for durability and answers.  Each rule has a table
test in ``tests/test_follower_rules.py``, one row per SPEC sentence.

The follower trusts an entry only once it is known to match the current
leader's log (a COMPARE that found it equal, a TRUNCATE that made it equal, an
APPEND that wrote or re-confirmed it): :class:`MatchedPrefix` remembers how far
that goes, per leadership.
"""

from __future__ import annotations

import enum

from dledger.timing import due

#: A leadership as the follower sees it: (term, leader id).
Epoch = tuple[int, "str | None"]


class MatchedPrefix:
    """The highest index known to match the current leader's log, for one leadership at a time."""

    def __init__(self) -> None:
        self.epoch: Epoch = (-1, None)
        self.index = -1

    def match(self, epoch: Epoch, index: int) -> None:
        """Entries up to ``index`` match the log of the leader of ``epoch`` (a new epoch forgets the old prefix)."""
        if epoch != self.epoch:
            self.epoch, self.index = epoch, -1
        self.index = max(self.index, index)

    def of(self, epoch: Epoch) -> int:
        """The matched prefix for ``epoch``'s leader: -1 if nothing was verified against it."""
        return self.index if epoch == self.epoch else -1

    def known(self, epoch: Epoch) -> bool:
        """Something was verified against ``epoch``'s leader."""
        return epoch == self.epoch

    def reset(self) -> None:
        """The term or leader changed: nothing is verified any more."""
        self.epoch, self.index = (-1, None), -1


def leader_log_changed(index: int, same: bool, matched: int) -> bool:
    """A leader's entry at ``index`` differs from ours although we verified ``index`` against that leadership.

    Within one leadership *incarnation* a leader's log only grows and we store only its entries past what
    we verified, so this cannot happen -- unless the (term, leader id) we verified against is another
    incarnation: a leader that restarted and leads the same term again (Java DLedger allows it; dledger
    members never do, see election.rules.bumps_term).  The prefix verified against the old incarnation
    proves nothing about the new one and must be forgotten, or every TRUNCATE the new one sends is refused
    as stale (:func:`stale_truncate`) and the follower is never repaired (issue #29).
    """
    return not same and 0 <= index <= matched


def commit_to_adopt(leader_commit: int, matched: int, durable: int) -> int:
    """The committed index a follower adopts: ``min(leader's commit, matched prefix, durable end)``.

    SPEC §4 says ``min(leaderCommit, ledgerEndIndex)``; we also bound it by the prefix known to match
    the leader (an unverified tail may hold entries of a deposed leader) and by what is durable here
    (a crash must not forget an entry this member reported committed).
    """
    return min(leader_commit, matched, durable)


def commit_needs_compare(leader_commit: int, matched: int, end: int) -> bool:
    """A COMMIT is answered INCONSISTENT_STATE (so the leader re-compares) rather than SUCCESS.

    Either the leader has committed entries we do not hold (a wiped or recovered store: SUCCESS would
    leave us empty until the next client write), or it has committed past what we verified while we
    hold an unverified tail (after a restart it may hold entries truncated before the crash).
    """
    return leader_commit > end or (matched < end and leader_commit > matched)


def stale_truncate(index: int, matched: int) -> bool:
    """A TRUNCATE at ``index`` below the prefix verified against this same leader is old or duplicated.

    Within one term a leader's log only grows, so such a TRUNCATE was reordered behind later appends;
    obeying it would drop entries we acknowledged and the leader may have counted toward a commit.
    ``matched`` is the prefix verified against the TRUNCATE's own leadership (-1 if none).
    """
    return index < matched


class AppendKind(enum.Enum):
    """How an APPEND's range ``first..last`` relates to the follower's end (SPEC §4 "Entry handler")."""

    DUPLICATE = "every entry is already held: it must agree, then ack it again"
    OVERLAP = "a retry after a lost ack: the held part must agree, the rest is appended"
    NEW = "every entry is after the end: wait for its turn at end + 1"


def classify_append(first: int, last: int, end: int) -> AppendKind:
    """Where an APPEND of ``first..last`` falls against the follower's ``end``."""
    if last <= end:
        return AppendKind.DUPLICATE
    if first <= end:
        return AppendKind.OVERLAP
    return AppendKind.NEW


def overdue_push(waiting: dict[int, float], now: float, timeout: float) -> int | None:
    """The first index of the earliest waiting APPEND that waited ``timeout`` for a gap, or None.

    ``waiting`` maps each waiting push's first index to its arrival time.  That push is answered
    INCONSISTENT_STATE so the leader re-compares (DLedger's "fast-forward" check).
    """
    stale = [first for first, arrived in waiting.items() if due(arrived + timeout, now)]
    return min(stale) if stale else None
