"""What the leader knows about one follower, as a pure state machine (SPEC §4 "Dispatcher per follower").

Modelled on etcd/raft's ``tracker/progress.go``: the state (which step the
dispatcher is in, where it compares or writes next, the watermark, the pushes
in flight) and every transition live here, with no clock, transport or store,
so each rule is one row of a table test (``tests/test_replication_progress.py``).
:class:`dledger.replication.leader.EntryDispatcher` builds on it and only
moves bytes and time.

Stale replies are refused by *generation*: every change of step bumps
``gen``, a request remembers the generation it was sent in, and a reply from
an older generation (a reordered or duplicated answer to a request the
dispatcher has given up on) changes nothing (:meth:`Progress.accepts`).
"""

from __future__ import annotations

from dledger.replication.rules import Step


class Progress:
    """One follower's replication state on the leader; every method is a decision or a transition."""

    def __init__(self) -> None:
        self.step = Step.COMPARE
        self.compare_index = -1
        self.write_index = -1
        self.watermark = -1  # the highest index the follower is known to store (SPEC §4 "Watermarks")
        self.in_flight: dict[int, int] = {}  # first index -> last index of APPENDs awaiting a reply
        self._flight_bytes: dict[int, int] = {}  # first index -> bytes of that APPEND
        self.in_flight_bytes = 0  # bytes of the APPENDs awaiting a reply
        self.outstanding = False  # a COMPARE / TRUNCATE / COMMIT awaits a reply
        self.told_commit = -1  # the committed index last sent in a COMMIT
        self.gen = 0  # bumps on every state change; replies to older generations are ignored
        self.stopped = False
        # Whether the follower answered its last request: while it does not, what it holds is unknown
        # (a restarted follower may come back with a wiped or recovered store).
        self.in_contact = False

    # -- transitions -----------------------------------------------------------------------
    def become(self, step: Step, index: int) -> None:
        """Enter ``step`` at ``index``: what was in flight no longer counts (its replies are refused)."""
        self.gen += 1
        self.step = step
        self.in_flight.clear()
        self._flight_bytes.clear()
        self.in_flight_bytes = 0
        self.outstanding = False
        if step is Step.COMPARE:
            self.compare_index = index
        elif step is Step.APPEND:
            self.write_index = index

    def stop(self) -> None:
        """Leadership ended: refuse every reply from now on."""
        self.stopped = True
        self.gen += 1

    def accepts(self, gen: int) -> bool:
        """A reply to a request sent in generation ``gen`` may still change this state (not stale, not stopped)."""
        return gen == self.gen and not self.stopped

    def matched(self, index: int) -> bool:
        """The follower holds the leader's entry ``index`` (a COMPARE or TRUNCATE succeeded); True if it moved up.

        Like etcd's ``MaybeUpdate``, the watermark only moves forward here.
        """
        if index > self.watermark:
            self.watermark = index
            return True
        return False

    def append_acked(self, first: int, last: int) -> bool:
        """SUCCESS for the APPEND of ``first..last``: it is no longer in flight; True if the watermark moved up."""
        self.settled(first)
        return self.matched(last)

    def settled(self, first: int) -> None:
        """The APPEND starting at ``first`` no longer awaits a reply (answered, or covered by another copy's)."""
        self.in_flight.pop(first, None)
        self.in_flight_bytes -= self._flight_bytes.pop(first, 0)

    def shrunk_to(self, end: int) -> bool:
        """The follower says it ends at ``end``: below the watermark, believe it (its store was wiped or cut).

        The only way the watermark comes down: a follower's log can shrink behind the leader's back only by
        losing its store, and a watermark left above it would count entries it lacks toward a commit.
        """
        if end < self.watermark:
            self.watermark = end
            return True
        return False

    def truncated(self, index: int) -> None:
        """The follower obeyed a TRUNCATE at ``index``: it now ends there, and APPENDs start after it."""
        self.watermark = index
        self.become(Step.APPEND, index + 1)

    def commit_lost(self) -> None:
        """A COMMIT got no answer: nothing awaits a reply, and the next heartbeat tells the commit again."""
        self.outstanding = False
        self.told_commit = -1

    def sent_append(self, first: int, last: int, nbytes: int = 0) -> None:
        """An APPEND of ``first..last`` (``nbytes`` of entries) went out; the next one starts after it."""
        self.in_flight[first] = last
        self._flight_bytes[first] = nbytes
        self.in_flight_bytes += nbytes
        self.write_index = last + 1

    # -- decisions -----------------------------------------------------------------------------
    def known_index(self) -> int:
        """The highest index this follower is known to hold: its watermark while it answers, else -1 (unknown)."""
        return self.watermark if self.in_contact else -1

    def may_append(self, leader_end: int, max_in_flight: int, max_bytes: int | None = None) -> bool:
        """Another APPEND may go out: entries are left to send and the pipeline has room.

        Room is counted in pushes (``maxPendingSize``) and, like etcd/raft's ``MaxInflightBytes``, in bytes
        (``max_bytes``; one push always may go): without the byte bound a leader with a far-behind follower
        read and sent up to ``maxPendingSize`` pushes of ``maxBatchPushSize`` -- 1,000 MiB -- in one reactor
        turn, missed its heartbeats and lost leadership to check-quorum, over and over (issue #23: a learner
        catching up 1 GiB never did).
        """
        if self.write_index > leader_end or len(self.in_flight) >= max_in_flight:
            return False
        return max_bytes is None or not self.in_flight or self.in_flight_bytes < max_bytes

    def idle(self) -> bool:
        """Nothing awaits a reply, so a COMMIT may go out."""
        return not self.in_flight and not self.outstanding

    def needs_commit(self, committed: int) -> bool:
        """An idle follower in APPEND has not been told the leader's committed index yet."""
        return self.step is Step.APPEND and self.idle() and committed > self.told_commit

    def repeated_settled(self, first: int, last: int) -> bool | None:
        """After REPEATED_PUSH and a wait: True if another copy's ack covered ``first..last``, False if not.

        None: the push is no longer in flight (answered meanwhile, or the state moved on), nothing to do.
        """
        if first not in self.in_flight:
            return None
        return self.watermark >= last
