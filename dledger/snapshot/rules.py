"""The decisions about snapshots, as small pure functions (table-tested in tests/test_snapshot_rules.py).

- :func:`snapshot_due`: when to take one (entries or bytes since the last one);
- :func:`compact_limit`: what the log may lose after one (``trailingEntries``, the committed index,
  Java peers that could never be sent a snapshot);
- :func:`restore_plan`: which snapshot to restore at start-up, or a one-line refusal;
- :func:`prune_victims`, :func:`stale_install`: which snapshot directories to delete.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


def snapshot_due(applied: int, last_index: int, bytes_since: int, threshold: int, threshold_bytes: int) -> bool:
    """Whether enough has been applied since the last snapshot (at ``last_index``, -1: none) to take a new one.

    ``threshold`` entries (0: off) or ``threshold_bytes`` bytes of entries (0: off), whichever comes
    first, as Java DLedger's ``snapshotThreshold`` and hashicorp/raft's ``SnapshotThreshold``.
    Nothing new applied never makes a snapshot due.
    """
    if applied < 0 or applied <= last_index:
        return False
    if threshold > 0 and applied - last_index >= threshold:
        return True
    return threshold_bytes > 0 and bytes_since >= threshold_bytes


def compact_limit(snapshot_index: int, trailing: int, committed: int, peers_take_snapshots: bool) -> int | None:
    """The index below which the log may be deleted after a snapshot at ``snapshot_index``; None: nothing may go.

    Keeps ``trailing`` entries below the snapshot (a follower slightly behind catches up by PUSH, not
    by a whole snapshot), never reaches past the committed index, and deletes nothing while a peer
    may be a Java DLedger member (it can never be sent a snapshot, so it must find every entry it
    lacks in the log).
    """
    if not peers_take_snapshots or snapshot_index < 0:
        return None
    below = min(snapshot_index - trailing, committed + 1, snapshot_index + 1)
    return below if below > 0 else None


class RestoreAction(enum.Enum):
    RESTORE = "restore"  # restore ``index`` and apply the entries after it
    FRESH = "fresh"  # no snapshot needed: the log reaches back to index 0 (or is empty)
    REFUSE = "refuse"  # no intact snapshot and the log does not reach back far enough


@dataclass(frozen=True)
class RestorePlan:
    action: RestoreAction
    #: The snapshot to restore (its index), -1 unless RESTORE.
    index: int = -1
    #: The log ends before the snapshot (it lost unflushed entries, or is empty): reset it to the snapshot.
    reset_log: bool = False
    #: The damaged snapshots passed over, newest first (each gets one log line).
    skipped: tuple[int, ...] = ()
    #: REFUSE: the one line that says why and how to fix it.
    why: str = ""


def restore_plan(snapshots: list[tuple[int, bool]], log_begin: int, log_end: int, has_machines: bool,
                 where: str = "the snapshot directory") -> RestorePlan:
    """Which snapshot a starting member restores.

    ``snapshots`` are ``(index, intact)`` newest first; ``log_begin``/``log_end`` the log's first and
    last index (-1/-1 empty; an empty log reset to a snapshot at ``b`` has ``b + 1``/``b``).  The
    newest intact snapshot is restored if the log continues right after it (or starts no later);
    damaged ones are skipped.  A snapshot with a gap between it and the log is of no use (nor is an
    older one).  With no state machine nothing needs restoring.
    """
    if not has_machines:
        return RestorePlan(RestoreAction.FRESH)
    skipped: list[int] = []
    newest_intact = None
    for index, intact in snapshots:
        if not intact:
            skipped.append(index)
            continue
        newest_intact = index
        if log_begin <= index + 1:
            return RestorePlan(RestoreAction.RESTORE, index, reset_log=index > log_end, skipped=tuple(skipped))
        break
    if log_begin <= 0:
        return RestorePlan(RestoreAction.FRESH, skipped=tuple(skipped))
    if newest_intact is None:
        have = "no intact snapshot" if not snapshots else f"no intact snapshot ({len(snapshots)} damaged)"
    else:
        have = f"the newest intact snapshot ends at index {newest_intact}"
    why = (f"cannot start: the log starts at index {log_begin} and {have} in {where}, so entries "
           f"{max(newest_intact if newest_intact is not None else -1, -1) + 1}..{log_begin - 1} are missing; "
           f"fix: wipe this member's store directory so that it is rebuilt from the leader (InstallSnapshot), "
           f"or copy an intact snapshot at or after index {log_begin - 1} from another member into {where}")
    return RestorePlan(RestoreAction.REFUSE, skipped=tuple(skipped), why=why)


def prune_victims(indexes: list[int], reserved: int, in_use: frozenset[int] | set[int] = frozenset()) -> list[int]:
    """The snapshots to delete: all but the newest ``reserved`` (``maxSnapshotReservedNum``), never one in use.

    ``indexes`` newest first.  A snapshot being sent to a follower (InstallSnapshot reads it) is in use.
    At least one is always kept.
    """
    keep = max(reserved, 1)
    return [i for i in indexes[keep:] if i not in in_use]


def stale_install(install_index: int, newest_index: int) -> bool:
    """A partly received snapshot (``.install-*``) no newer than the newest complete one is of no use."""
    return install_index <= newest_index
