"""What a leader does about a follower that answers DISK_FULL or DISK_ERROR (issue 21), as pure rules.

A follower whose disk is full refuses every push until space returns.  The
leader used to treat that like any failed push: compare again 50 ms later
and send its whole pipeline (up to ``maxPendingSize`` pushes of up to
``maxBatchPushSize`` each) into the refusal, with only a debug line, so
neither its log nor ``dledger metadata`` said why a follower stood still.
Now it logs one line (then one a minute), shows the follower as ``disk full``
(or ``disk error``), retries once a heartbeat with one push in flight, and
logs again when the follower stores entries again.  Each rule has a table
test in ``tests/test_peer_disk.py``.
"""

from __future__ import annotations

from dledger.codes import ResponseCode
from dledger.store.writefail import problem_name

#: Follower answers that say its disk, not our entries, is the problem.
DISK_CODES = (ResponseCode.DISK_FULL, ResponseCode.DISK_ERROR)


def peer_disk_problem(code: ResponseCode) -> str | None:
    """``disk full`` / ``disk error`` for a follower's answer that says so, else None."""
    return problem_name(code) if code in DISK_CODES else None


def in_flight_limit(disk_problem: str | None, max_in_flight: int) -> int:
    """How many APPENDs may be in flight to a follower: one while its disk refuses them (a probe), else the limit."""
    return 1 if disk_problem is not None else max_in_flight


def retry_after(disk_problem: str | None, retry_delay: float, heartbeat: float) -> float:
    """How long after a refused push the dispatcher compares again: a heartbeat for a disk problem.

    A full disk does not clear in 50 ms, and the follower refuses at once without trying its disk
    for a while anyway (:mod:`dledger.store.writefail`).
    """
    return max(retry_delay, heartbeat) if disk_problem is not None else retry_delay
