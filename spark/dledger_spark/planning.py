"""Planning decisions of the data source, as pure functions (table-tested without Spark or a group).

Offsets are ``{group: next index}``: the first index a batch has *not* read.  A batch reads the
half-open ranges ``[start[g], end[g])``; every ``end[g]`` is at most the group's committed index + 1 as
a member reported it while planning, so no row ever carries an uncommitted entry.  Given the same
``(start, end)`` -- what Spark's offset log holds -- the same entries are read again after a restart.
"""

from __future__ import annotations

from dataclasses import dataclass


def resolve_start(spec: str | int, begin: int, committed: int) -> int:
    """The first index to read for ``startingIndex`` ``spec``, given the log's ``begin`` and ``committed`` indexes.

    ``earliest``: the first entry the member still holds (0 for an empty log); ``latest``: the first entry
    not committed yet (only what is appended from now on); an index: itself (checked when read: below the
    log's begin it was deleted by retention).
    """
    if spec == "earliest":
        return max(begin, 0)
    if spec == "latest":
        return committed + 1
    return int(spec)


def resolve_end(spec: str | int, committed: int) -> int:
    """The exclusive end of a batch read for ``endingIndex`` ``spec``: never past the committed index + 1."""
    if spec == "latest":
        return committed + 1
    return min(int(spec), committed + 1)


def admit(start: dict[str, int], latest: dict[str, int], limit: int | None) -> dict[str, int]:
    """The end offsets of the next micro-batch: ``latest`` capped so that at most ``limit`` indexes are read.

    Like Kafka's ``maxOffsetsPerTrigger`` the limit is shared out in proportion to what each group has
    waiting (floor), the remainder going to groups in name order, so a busy group cannot starve a quiet
    one and the result depends on the inputs only.  A group never moves backwards.
    """
    waiting = {g: max(latest.get(g, start[g]) - start[g], 0) for g in start}
    total = sum(waiting.values())
    if limit is None or total <= limit:
        return {g: start[g] + waiting[g] for g in start}
    share = {g: waiting[g] * limit // total for g in start}
    left = limit - sum(share.values())
    for g in sorted(start):
        if left <= 0:
            break
        if share[g] < waiting[g]:
            share[g] += 1
            left -= 1
    return {g: start[g] + share[g] for g in start}


def entries_per_partition(partition_bytes: int, entry_size: int) -> int:
    """How many entries of about ``entry_size`` bytes (header included) make ``partition_bytes`` (at least 1)."""
    return max(1, partition_bytes // max(entry_size, 1))


@dataclass(frozen=True)
class Range:
    """Indexes ``[start, end)`` of one group: what one Spark task reads."""

    group: str
    start: int
    end: int


def split(group: str, start: int, end: int, per_partition: int) -> list[Range]:
    """``[start, end)`` cut into consecutive ranges of ``per_partition`` indexes (the last one shorter)."""
    if per_partition < 1:
        raise ValueError(f"per_partition must be at least 1, got {per_partition}")
    return [Range(group, lo, min(lo + per_partition, end)) for lo in range(start, end, per_partition)]


def data_loss_message(group: str, wanted: int, begin: int) -> str:
    """The one line a read fails with when retention deleted entries it must read."""
    return (f"dledger source: entries {wanted}..{begin - 1} of group {group!r} were deleted by retention "
            f"(the log now begins at index {begin}); set failOnDataLoss=false to skip them, or start at "
            f"startingIndex >= {begin}")
