"""How a GET is answered, as pure functions: committed reads, the leader's ReadIndex check, follower reads.

Every member's committed prefix is final: a follower only adopts a commit index
bounded by the prefix it verified against the leader (``replication.follower``),
and committed entries never change.  So any member may serve GETs below its own
committed index at once -- a follower possibly a little behind the leader's -- and
a follower serves them when asked to (``GetEntriesRequest.follower_read``), keeping
bulk readers (Spark ingest, ``readFrom=follower``) off the leader.  What a follower
must never do is answer past that index: it cannot know whether later entries are
committed.  The leader may say "not committed yet" only after a quorum confirmed it
still leads (Raft's ReadIndex), or a deposed leader would answer a stale
INDEX_OUT_OF_RANGE; and only once its own term's first entry is committed, as
until then its committed index may lag the group's.

:meth:`dledger.server.DLedgerServer.handle_get` asks :func:`read_decision`, runs
the heartbeat round when told to (``LeaderElector.confirm_leadership``), asks
:func:`confirmed_read_decision`, and reads the store.  Table tests:
``tests/test_read_rules.py``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError


class ReadAction(enum.Enum):
    """What the member does with a GET."""

    SERVE = "serve committed entries from the begin index, from this member's store"
    CONFIRM = "confirm leadership with a heartbeat quorum first, then decide again (ReadIndex)"
    REFUSE = "answer the code"


@dataclass(frozen=True)
class ReadDecision:
    """A :class:`ReadAction`, with the code and one-line reason when it is REFUSE."""

    action: ReadAction
    code: ResponseCode | None = None
    why: str = ""

    def error(self, leader_id: str | None) -> DLedgerError:
        """The refusal as the error the request is answered with, naming the leader a client may redirect to."""
        return DLedgerError(self.code, self.why, leader_id=leader_id)


SERVE = ReadDecision(ReadAction.SERVE)
CONFIRM = ReadDecision(ReadAction.CONFIRM)


def read_decision(leads: bool, follower_read: bool, begin: int, ledger_begin: int, committed: int,
                  member: str) -> ReadDecision:
    """How ``member`` answers a GET from ``begin`` before any round trip.

    A member that does not lead serves only GETs marked ``followerRead`` (else NOT_LEADER, so the
    client redirects).  Below the member's first entry: INDEX_LESS_THAN_LOCAL_BEGIN (deleted by
    retention, or never held).  At or below its committed index: served at once, leader or not.
    Past it: a follower refuses with INDEX_OUT_OF_RANGE (not committed *as far as it knows*; the
    reader asks again later or asks the leader); the leader first confirms it still leads.
    """
    C = ResponseCode
    if not leads and not follower_read:
        return ReadDecision(ReadAction.REFUSE, C.NOT_LEADER, f"{member} does not lead")
    if begin < ledger_begin:
        return ReadDecision(ReadAction.REFUSE, C.INDEX_LESS_THAN_LOCAL_BEGIN,
                            f"index {begin} < begin index {ledger_begin} of {member}")
    if begin <= committed:
        return SERVE
    if leads:
        return CONFIRM
    return _past_committed(begin, committed, member)


def confirmed_read_decision(confirmed: bool, same_leadership: bool, begin: int, committed: int,
                            term_start_index: int, member: str) -> ReadDecision:
    """How the leader answers a GET past its committed index once the heartbeat round is over (ReadIndex).

    ``confirmed``: a quorum answered a heartbeat of our term; ``same_leadership``: we still lead in
    the term the read started in.  Otherwise NOT_LEADER.  Until the first entry of our term
    (``term_start_index``) is committed, LEADER_NOT_READY: the committed index may still lag
    entries an earlier leader committed.  Then entries committed meanwhile are served, and only
    what is still past the committed index is INDEX_OUT_OF_RANGE.
    """
    if not confirmed or not same_leadership:
        return ReadDecision(ReadAction.REFUSE, ResponseCode.NOT_LEADER, f"{member} does not lead")
    if committed < term_start_index:
        return ReadDecision(ReadAction.REFUSE, ResponseCode.LEADER_NOT_READY,
                            "this term's first entry is not committed yet")
    if begin <= committed:
        return SERVE
    return _past_committed(begin, committed, member)


def _past_committed(begin: int, committed: int, member: str) -> ReadDecision:
    return ReadDecision(ReadAction.REFUSE, ResponseCode.INDEX_OUT_OF_RANGE,
                        f"index {begin} > committed index {committed} of {member}")



def committed_read_error(begin: int, ledger_begin: int, committed: int, member: str) -> DLedgerError | None:
    """Why ``member`` cannot serve a committed read from ``begin`` from its own store (None: it can).

    :func:`read_decision`'s follower-read rule as an error (``leader_id`` unset), for callers that only
    serve committed reads.
    """
    decision = read_decision(False, True, begin, ledger_begin, committed, member)
    return decision.error(None) if decision.action is ReadAction.REFUSE else None
