"""What a follower can tell about a push before it touches its store: pure decisions, table-tested.

Why (issue #9, item 13): a single forged PUSH TRUNCATE whose index lay 5,000 entries past a
follower's end, claiming the current leader and term, made the follower *reset* its log -- the
store's answer to "the leader's log starts after everything I hold" -- and delete every data file.
Members are not authenticated yet, so a follower cannot tell a forged frame from a real one; what
it can check is whether the frame is one a real leader would send *now*, given what this member
holds and what that leader asked before:

* a TRUNCATE inside our log, or right after its end, is routine (the store still refuses to drop a
  committed entry);
* a TRUNCATE that would reset the log (index past ``end + 1`` or below ``begin``) is only ever sent
  by a leader right after a COMPARE in the same term that showed our log does not reach it (SPEC §4:
  the dispatcher truncates at its begin when the ranges are disjoint).  Without such a COMPARE it
  is a protocol error, never a reset.  An empty log has nothing to lose and accepts it;
* an APPEND must carry consecutive indexes and start within the window a leader can have in
  flight (``maxPendingSize`` pushes of at most ``maxBatchPushSize`` bytes each); anything further
  is a protocol error, not something to park in the waiting table;
* a commit index is never a protocol error by itself (a lagging follower legitimately learns a
  commit index beyond its end): :class:`~dledger.replication.follower.EntryHandler` adopts at most
  the prefix it verified, so an absurd one commits nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from dledger.entry import HEADER_SIZE


def append_window(max_pending_size: int, max_batch_push_size: int) -> int:
    """How far past our end (in entries) a real leader's pipelined APPEND can start.

    A leader keeps at most ``max_pending_size`` pushes in flight to one follower, each of at most
    ``max_batch_push_size`` bytes of entries that are at least ``HEADER_SIZE`` bytes each (and at
    least one entry per push).
    """
    return max(1, max_pending_size) * max(1, max_batch_push_size // HEADER_SIZE + 1)


def check_append(indexes: Sequence[int], end: int, window: int, waiting: int = 0,
                 max_waiting: int | None = None) -> str | None:
    """Why an APPEND carrying entries ``indexes`` is a protocol error for a log ending at ``end``; None if fine.

    ``waiting`` pushes already wait for a gap; one more that would wait (it starts past ``end + 1``) is
    refused when ``max_waiting`` (the leader's in-flight limit, ``maxPendingSize``) are waiting already.
    """
    if not indexes:
        return None  # "APPEND without entries" is answered by the handler itself
    first = indexes[0]
    for offset, index in enumerate(indexes):
        if index != first + offset:
            return f"APPEND entries are not consecutive: entry #{offset} has index {index}, expected {first + offset}"
    if first > end + 1 + window:
        return (f"APPEND at index {first} is {first - end - 1} entries past our end {end}; a leader never "
                f"has more than {window} in flight (maxPendingSize x maxBatchPushSize)")
    if max_waiting is not None and first > end + 1 and waiting >= max_waiting:
        return (f"APPEND at index {first} would wait for a gap after our end {end}, but {waiting} pushes wait "
                f"already (maxPendingSize {max_waiting})")
    return None


def check_truncate(index: int, begin: int, end: int, compared: int | None) -> str | None:
    """Why a TRUNCATE at ``index`` is a protocol error for a log ``begin..end``; None if it may proceed.

    ``compared`` is the index of the last COMPARE this member received from the same leader in the
    same term (None if there was none).  Only a reset -- an index past ``end + 1`` or below
    ``begin`` of a non-empty log, which drops every entry we hold -- needs it: a real leader resets a
    follower only after a COMPARE at or above that index told it the follower's log does not match.
    """
    if end < 0 or begin <= index <= end + 1:
        return None
    if compared is not None and compared >= index:
        return None
    where = f"past our end {end}" if index > end + 1 else f"below our begin {begin}"
    after = f"the last COMPARE from this leader was at {compared}" if compared is not None else \
        "no COMPARE from this leader in this term preceded it"
    return (f"TRUNCATE at index {index} is {where} and would discard our whole log {begin}..{end}, "
            f"but {after}; refusing to reset")
