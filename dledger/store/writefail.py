"""A store that failed to write: what it answers meanwhile and when it tries the disk again (issue 21).

A follower whose disk is full (or failing) receives the leader's pushes as
often as the leader sends them.  Trying every one of them for real made a
follower on a small tmpfs spend its reactor thread in ``fallocate`` (the
32 MiB data file it could not create, page by page, then undone), miss the
leader's heartbeats and stand for election about once a second, while every
refused push stayed in memory.  So the first failure is remembered: until its
retry time, appends are refused at once with the same code (DISK_FULL for
ENOSPC, DISK_ERROR for any other error) without touching the disk, and the
retry interval doubles from :data:`FIRST_RETRY` up to :data:`MAX_RETRY`
seconds while the failure lasts.  The first write that succeeds ends it, so a
member catches up by itself once space returns.

Nothing here touches a disk or a clock: :class:`WriteFailures` is told the
time, and each rule has a table test (``tests/test_store_writefail.py``).
"""

from __future__ import annotations

import errno
from dataclasses import dataclass

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError

#: Seconds before the first retry after a failed write, and the most a retry waits while the failure lasts.
FIRST_RETRY = 0.5
MAX_RETRY = 5.0


def failure_code(err: int | None) -> ResponseCode:
    """DISK_FULL for "no space" (ENOSPC, EDQUOT, EFBIG: nothing is wrong but room), DISK_ERROR for anything else."""
    return ResponseCode.DISK_FULL if err in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG) else ResponseCode.DISK_ERROR


def retry_delay(attempts: int) -> float:
    """How long the store refuses after its ``attempts``-th failure in a row: 0.5, 1, 2, 4, 5, 5 ... seconds."""
    return min(MAX_RETRY, FIRST_RETRY * 2 ** max(0, attempts - 1))


def room_for_file(free_bytes: int, file_size: int) -> bool:
    """A new store file of ``file_size`` bytes may be created: the disk has that much free.

    Checked before ``fallocate`` because on some file systems (tmpfs) a failing fallocate of a large
    file first allocates every page it can, then gives them back: slow, and on the reactor thread.
    """
    return free_bytes >= file_size


def problem_name(code: ResponseCode | None) -> str | None:
    """What ``dledger metadata`` and the leader's log call a member in this state (None: it writes)."""
    if code is ResponseCode.DISK_FULL:
        return "disk full"
    if code is ResponseCode.DISK_ERROR:
        return "disk error"
    return None


@dataclass
class WriteFailure:
    """The failure a store remembers: its code, its reason, since when, and until when it refuses."""

    code: ResponseCode
    why: str
    since: float
    retry_at: float
    attempts: int = 1

    def error(self) -> DLedgerError:
        """The refusal an append gets while it lasts (the same code as the failure)."""
        return DLedgerError(self.code, f"{problem_name(self.code)}: {self.why} (not retried before "
                                       f"{self.retry_at - self.since:.1f}s after the failure)")


class WriteFailures:
    """The store's current write failure, if any; each method is one transition."""

    def __init__(self) -> None:
        self.current: WriteFailure | None = None

    def failed(self, code: ResponseCode, why: str, now: float) -> bool:
        """A write failed at ``now``; True if this starts a failure (False: the same one goes on, retried later)."""
        cur = self.current
        if cur is None:
            self.current = WriteFailure(code, why, now, now + retry_delay(1))
            return True
        cur.attempts += 1
        cur.code, cur.why = code, why
        cur.retry_at = now + retry_delay(cur.attempts)
        return False

    def refusal(self, now: float) -> DLedgerError | None:
        """The error to refuse an append with at ``now`` without trying, or None: try the disk."""
        cur = self.current
        if cur is None or now >= cur.retry_at:
            return None
        return cur.error()

    def succeeded(self) -> WriteFailure | None:
        """A write succeeded: the failure (if any) is over; returns it, for the "appends resume" line."""
        cur, self.current = self.current, None
        return cur

    @property
    def code(self) -> ResponseCode | None:
        """DISK_FULL or DISK_ERROR while a failure lasts, else None."""
        return self.current.code if self.current is not None else None
