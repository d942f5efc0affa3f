"""The leader's side of InstallSnapshot: one snapshot streamed to one follower (docs/snapshots.md).

A :class:`SnapshotSend` belongs to a follower's dispatcher
(:class:`dledger.replication.leader.EntryDispatcher`) while it is in step
INSTALL.  It first asks the follower where it stands (a request without
data: a transfer resumes from the last chunk the follower wrote, even after
a restart of either side or a new leader with the same snapshot), then reads
chunks of ``snapshotChunkSize`` with ``SnapshotStore.read_file`` one at a
time and keeps at most ``window`` of them unanswered; the follower answers a
chunk once it is written, so the leader never holds more than ``window``
chunks and the follower's disk sets the pace.  Once every byte is in, the
follower verifies and installs; the leader polls until it says so, then
the dispatcher resumes PUSH from the snapshot's index + 1.  Any failure
gives the transfer up; the dispatcher compares again and a new transfer
resumes where the follower stands.  Every decision is
:mod:`dledger.replication.snapshot_rules`'.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import InstallSnapshotRequest, InstallSnapshotResponse
from dledger.replication import snapshot_rules as rules
from dledger.replication.snapshot_rules import Chunk, ReplyAction

log = Logger()


class SnapshotSend:
    """Streams ``manifest`` (of ``snapshot_store``) to ``peer``; then ``on_done(manifest)`` or ``on_failed(why,
    unsupported)``, once.

    ``send(request, timeout)`` is the transport's send to the peer (a Deferred of the reply); ``request_base``
    gives the base fields of every request (group, ids, term).
    """

    def __init__(self, *, peer: str, manifest, snapshot_store, send: Callable, request_base: Callable[[], dict],
                 clock, timeout: float, poll_interval: float, chunk_size: int = rules.DEFAULT_CHUNK_SIZE,
                 window: int = rules.DEFAULT_WINDOW, on_done: Callable, on_failed: Callable):
        self.peer = peer
        self.manifest = manifest
        self.store = snapshot_store
        self._send = send
        self._base = request_base
        self.clock = clock
        self.timeout = timeout
        self.poll_interval = poll_interval
        self.chunk_size = max(1, chunk_size)
        self.window = max(1, window)
        self.on_done = on_done
        self.on_failed = on_failed
        self.files = rules.files_of(manifest)
        self.total = rules.ordinal(self.files, None)
        self._text = manifest.to_bytes().decode("utf-8")
        #: The next place to send; None until the follower said where it stands, and once everything is sent.
        self.pos: rules.Position | None = None
        self.started = False
        self.installing = False
        self.in_flight = 0  # requests (chunks, polls) awaiting an answer in this round
        self.reading = False
        self.round = 0  # bumps when the transfer restarts from another place: older answers change nothing
        self.finished = False
        self.sent_bytes = 0
        self.started_at = clock.seconds()
        self._poll = None
        snapshot_store.hold(manifest)

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        """Ask the follower where it stands; the answer starts the stream."""
        self._request(None, None)

    def stop(self) -> None:
        """Give up (leadership lost, the dispatcher moved on): answers from now on change nothing."""
        if self.finished:
            return
        self.finished = True
        self.round += 1
        if self._poll is not None and self._poll.active():
            self._poll.cancel()
        self._poll = None
        self.store.release(self.manifest)

    def _fail(self, why: str, unsupported: bool = False) -> None:
        if not self.finished:
            self.stop()
            self.on_failed(why, unsupported)

    def _done(self) -> None:
        if not self.finished:
            self.stop()
            self.on_done(self.manifest)

    # -- sending ---------------------------------------------------------------------------------
    def _request(self, chunk: Chunk | None, data: bytes | None) -> None:
        m = self.manifest
        req = InstallSnapshotRequest(**self._base(), snapshot_index=m.index, snapshot_term=m.term,
                                     manifest=self._text, path=chunk.path if chunk else None,
                                     offset=chunk.offset if chunk else 0, data=data)
        self.in_flight += 1
        gen = self.round
        self._send(req, self.timeout).addCallbacks(self._answered, self._failed, callbackArgs=(gen, chunk),
                                                   errbackArgs=(gen,))

    def pump(self) -> None:
        """Read and send the next chunk while the window has room (one read at a time, so chunks go in order)."""
        if self.finished or not self.started or self.installing or self.reading or self.pos is None:
            return
        if not rules.may_send(self.in_flight, self.window):
            return
        chunk = rules.chunk_at(self.files, self.pos, self.chunk_size)
        if chunk is None:
            self.pos = None
            return
        self.reading = True
        gen = self.round
        self.store.read_file(self.manifest, chunk.path, chunk.offset, chunk.size).addCallbacks(
            self._read, self._read_failed, callbackArgs=(gen, chunk), errbackArgs=(chunk,))

    def _read(self, data: bytes, gen: int, chunk: Chunk) -> None:
        self.reading = False
        if self.finished:
            return
        if gen != self.round:  # the transfer moved elsewhere while reading: this chunk is not wanted now
            self._next_step()
            return
        if len(data) != chunk.size:
            self._fail(f"reading {chunk.path} of snapshot {self.manifest.dirname} at {chunk.offset} gave "
                       f"{len(data)} of {chunk.size} bytes")
            return
        self.pos = rules.after(self.files, chunk)
        self.sent_bytes += len(data)
        self._request(chunk, data)
        self.pump()

    def _read_failed(self, failure, chunk: Chunk) -> None:
        self.reading = False
        self._fail(f"cannot read {chunk.path} of snapshot {self.manifest.dirname}: {failure.getErrorMessage()}")

    # -- answers -------------------------------------------------------------------------------
    def _failed(self, failure, gen: int) -> None:
        if gen == self.round:
            exc = failure.value
            code = exc.code if isinstance(exc, DLedgerError) else None
            self._fail(f"InstallSnapshot request failed: {failure.getErrorMessage()}",
                       code is ResponseCode.UNSUPPORTED)

    def _answered(self, resp: InstallSnapshotResponse, gen: int, chunk: Chunk | None) -> None:
        if self.finished or gen != self.round:
            return
        self.in_flight -= 1
        code = resp.response_code
        if code is not ResponseCode.SUCCESS:
            self._fail(f"InstallSnapshot answered {code.name}", code is ResponseCode.UNSUPPORTED)
            return
        if (resp.snapshot_index, resp.snapshot_term) != (self.manifest.index, self.manifest.term):
            self._fail(f"the answer is about snapshot {resp.snapshot_index}-{resp.snapshot_term}, not "
                       f"{self.manifest.dirname}")
            return
        if resp.installed:
            self._done()
            return
        if resp.installing:
            self.installing = True
        elif not self.installing:  # once the follower has every byte, a late "next place" changes nothing
            wanted = (resp.next_path, resp.next_offset) if resp.next_path is not None else None
            try:
                wanted = rules.normalize(self.files, wanted)
                action = rules.reply_action(self.files, chunk, wanted, self.pos) if self.started \
                    else ReplyAction.SKIP
            except ValueError as exc:
                self._fail(f"the follower wants a place this snapshot does not have: {exc}")
                return
            if not self.started:
                self.started = True
                log.info("{id}: InstallSnapshot of {name} to {peer}: {have} of {total} bytes already there",
                         id=self._base().get("local_id"), name=self.manifest.dirname, peer=self.peer,
                         have=rules.ordinal(self.files, wanted), total=self.total)
            if action in (ReplyAction.REWIND, ReplyAction.SKIP):
                self.round += 1
                self.in_flight = 0
                self.pos = wanted
        self._next_step()

    def _next_step(self) -> None:
        """Send what comes next; with every byte sent (or the follower installing), poll once nothing is pending.

        Never a state with nothing in flight and nothing scheduled: the dispatcher would wait for good.
        """
        if self.finished:
            return
        if self.installing or self.pos is None:
            if self.in_flight == 0 and not self.reading:
                self._schedule_poll()
            return
        self.pump()

    def _schedule_poll(self) -> None:
        if self._poll is None and not self.finished:
            self._poll = self.clock.callLater(self.poll_interval, self._polled)

    def _polled(self) -> None:
        self._poll = None
        if not self.finished:
            self._request(None, None)
