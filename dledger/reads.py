"""Reads of committed entries served by any member (``GetEntriesRequest.follower_read``).

Every member's committed prefix is final: a follower only adopts a commit index
bounded by the prefix it verified against the leader (``replication.follower``),
and committed entries never change.  So a follower may serve GETs below its own
committed index -- possibly a little behind the leader's -- and keep bulk readers
(Spark ingest, ``readFrom=follower``) off the leader.  What it must never do is
answer past that index: it cannot know whether later entries are committed.
"""

from __future__ import annotations

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError


def committed_read_error(begin: int, ledger_begin: int, committed: int, member: str) -> DLedgerError | None:
    """Why ``member`` cannot serve a committed read from ``begin`` (None: it can, from its own store).

    Below the member's first entry: INDEX_LESS_THAN_LOCAL_BEGIN (deleted by retention, or never held);
    past its committed index: INDEX_OUT_OF_RANGE (not committed *as far as this member knows*; the
    reader asks again later or asks the leader).
    """
    if begin < ledger_begin:
        return DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN,
                            f"index {begin} < begin index {ledger_begin} of {member}")
    if begin > committed:
        return DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE,
                            f"index {begin} > committed index {committed} of {member}")
    return None
