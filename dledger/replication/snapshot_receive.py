"""The follower's side of InstallSnapshot: chunks written in order, then verified, installed, answered.

Only the current leader of the current term may install (the same check as a
PUSH's writes, :func:`dledger.store.guard.check_follower`); the request code is
member-only in :mod:`dledger.security.policy` and its ids are checked like a
PUSH's (``ID_RULES``), so with authentication on only an authenticated member
naming itself gets here.  A member that committed past the snapshot refuses it
(:func:`~dledger.replication.snapshot_rules.install_refusal`).

Chunks are written with ``SnapshotStore.receive(manifest).write`` strictly in
order, at most :data:`~dledger.replication.snapshot_rules.MAX_QUEUED_CHUNKS`
ahead of the disk; a chunk is answered once written, with the next place
wanted, so the leader's window is paced by this disk.  A chunk at any other
place is answered with the place wanted (the leader resends from there).
The ``.install-<index>-<term>`` directory survives a restart and a change of
leader, so a transfer resumes; a leader with another snapshot restarts it.
When every byte is in: ``receiver.finish()`` (CRCs, fsync, rename), then
``server.snapshots.install(manifest)`` (restore the machines, reset the log to
the snapshot); the leader polls meanwhile and is told ``installed``.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, maybeDeferred, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import InstallSnapshotRequest, InstallSnapshotResponse
from dledger.ratelog import RateLimitedLog
from dledger.replication import snapshot_rules as rules
from dledger.store.guard import check_follower

log = Logger()

RECEIVING, INSTALLING, INSTALLED = "receiving", "installing", "installed"


class _Transfer:
    """One snapshot arriving: its receiver, the next place wanted, the writes queued, its phase."""

    def __init__(self, manifest, receiver):
        self.manifest = manifest
        self.key = (manifest.index, manifest.term)
        self.files = rules.files_of(manifest)
        self.receiver = receiver
        self.expected: rules.Position | None = None
        self.queued = 0
        self.tail: Deferred = succeed(None)
        self.phase = RECEIVING
        self.bytes = 0
        #: Chunks that arrived ahead of their turn: place -> (data, Deferred of their answer).
        self.parked: dict[rules.Position, tuple[bytes, Deferred]] = {}

    def unpark(self, reply) -> None:
        """Answer every parked chunk with ``reply()`` now (a new round of the sender, or the transfer ends)."""
        parked, self.parked = self.parked, {}
        for _data, d in parked.values():
            try:
                d.callback(reply())
            except DLedgerError as exc:
                d.errback(exc)


class SnapshotReceive:
    """Answers INSTALL_SNAPSHOT requests for one member.

    ``machines()`` gives the member's :class:`~dledger.snapshot.machines.StateMachines` (``server.snapshots``,
    with its ``snapshot_store``: the :class:`~dledger.snapshot.store.SnapshotStore`), or None on a member without
    snapshots (the request is then UNSUPPORTED).  ``on_installed(index, leader_term, leader_id)`` runs once the log
    was reset to a snapshot (the entry handler forgets what it waited for and what it verified).
    """

    def __init__(self, state, store, clock, machines: Callable[[], object], *,
                 on_installed: Callable[[int, int, str | None], None] = lambda i, t, leader: None):
        self.state = state
        self.store = store
        self.clock = clock
        self.machines = machines
        self.on_installed = on_installed
        self.current: _Transfer | None = None
        self.refusals = RateLimitedLog(log, clock, interval=30.0)

    # -- replies -----------------------------------------------------------------------------
    def _reply(self, req: InstallSnapshotRequest, t: _Transfer | None, *, installed: bool = False
               ) -> InstallSnapshotResponse:
        store = self.store
        resp = InstallSnapshotResponse(group=req.group, term=req.term, leader_id=req.leader_id,
                                       local_id=self.state.self_id, remote_id=req.local_id,
                                       snapshot_index=req.snapshot_index, snapshot_term=req.snapshot_term,
                                       begin_index=store.ledger_begin_index, end_index=store.ledger_end_index)
        if installed or (t is not None and t.phase == INSTALLED):
            resp.installed = True
        elif t is not None and t.phase == INSTALLING:
            resp.installing = True
        elif t is not None and t.expected is not None:
            resp.next_path, resp.next_offset = t.expected
        return resp

    def _refuse(self, req: InstallSnapshotRequest, code: ResponseCode, why: str) -> DLedgerError:
        self.refusals.warn(("install refused", req.leader_id, code), "{id}: refusing InstallSnapshot {index}-{term} "
                           "from {leader} (term {lterm}): {why}", id=self.state.self_id, index=req.snapshot_index,
                           term=req.snapshot_term, leader=req.leader_id, lterm=req.term, why=why)
        return DLedgerError(code, why)

    # -- entry point --------------------------------------------------------------------------
    def handle(self, req: InstallSnapshotRequest):
        """The answer to one request (an InstallSnapshotResponse, or a Deferred of one); DLedgerError to refuse."""
        machines = self.machines()
        if machines is None:
            raise DLedgerError(ResponseCode.UNSUPPORTED, f"{self.state.self_id} keeps no snapshots")
        check_follower(self.state, req.term, req.leader_id)
        manifest = self._manifest(req)
        key = (manifest.index, manifest.term)
        why = rules.install_refusal(self.store.committed_index, manifest.index)
        if why is not None:
            raise self._refuse(req, ResponseCode.INCONSISTENT_STATE, why)
        t = self.current
        if t is None or t.key != key:
            if t is not None and t.phase == INSTALLING:
                raise DLedgerError(ResponseCode.INCONSISTENT_STATE, f"installing snapshot {t.manifest.dirname}")
            if getattr(self.store, "snapshot_base", (-1, -1)) == key and self.store.ledger_end_index == manifest.index:
                return self._reply(req, None, installed=True)  # installed already (an answer was lost)
            if t is not None:
                t.unpark(lambda: self._reply(req, None))
            if t is not None and t.phase == RECEIVING:
                log.info("{id}: leader {leader} sends snapshot {new}: giving up receiving {old}",
                         id=self.state.self_id, leader=req.leader_id, new=manifest.dirname, old=t.manifest.dirname)
            t = self.current = self._begin(machines, manifest, req)
        if t.phase != RECEIVING or req.path is None:
            t.unpark(lambda: self._reply(req, t))  # a new round (or a poll): what was parked is not coming
            return self._reply(req, t)
        data = req.data or b""
        error = rules.chunk_error(t.files, req.path, req.offset, len(data))
        if error is not None:
            raise self._refuse(req, ResponseCode.UNEXPECTED_ARGUMENT, error)
        place = rules.normalize(t.files, (req.path, req.offset))
        action = rules.chunk_disposition(t.files, t.expected, req.path, req.offset, t.queued + len(t.parked),
                                         place in t.parked)
        if action is rules.Disposition.ANSWER:
            return self._reply(req, t)
        if action is rules.Disposition.PARK:
            d: Deferred = Deferred()
            t.parked[place] = (data, d)
            return d.addCallback(lambda resp: resp if resp is not None else self._reply(req, t))
        answer = self._accept(req, t, machines, rules.Chunk(req.path, req.offset, len(data)), data)
        while t.expected in t.parked and t.queued < rules.MAX_QUEUED_CHUNKS:  # its successors that arrived early
            path, offset = t.expected
            parked, waiting = t.parked.pop(t.expected)
            self._accept(req, t, machines, rules.Chunk(path, offset, len(parked)), parked).chainDeferred(waiting)
        return answer

    def _manifest(self, req: InstallSnapshotRequest):
        from dledger.snapshot.manifest import Manifest, ManifestError

        where = f"InstallSnapshot manifest from {req.leader_id}"
        try:
            manifest = Manifest.from_bytes((req.manifest or "").encode("utf-8"), where)
        except (ManifestError, ValueError, UnicodeError) as exc:
            raise self._refuse(req, ResponseCode.UNEXPECTED_ARGUMENT, str(exc)[:300]) from None
        if (manifest.index, manifest.term) != (req.snapshot_index, req.snapshot_term):
            raise self._refuse(req, ResponseCode.UNEXPECTED_ARGUMENT,
                               f"the request names snapshot {req.snapshot_index}-{req.snapshot_term} but its "
                               f"manifest is {manifest.dirname}")
        return manifest

    def _begin(self, machines, manifest, req: InstallSnapshotRequest) -> _Transfer:
        """A transfer of ``manifest``: from the snapshot store if it is there complete, else received (resumed)."""
        snapshots = machines.snapshot_store
        local = next((m for m in snapshots.manifests if (m.index, m.term) == (manifest.index, manifest.term)), None)
        if local is not None:
            t = _Transfer(local, None)
            self._install(t, machines, req, local)
            return t
        try:
            receiver = snapshots.receive(manifest)
        except OSError as exc:
            raise self._refuse(req, ResponseCode.DISK_ERROR, f"cannot receive into {snapshots.directory}: {exc}") \
                from None
        t = _Transfer(manifest, receiver)
        path, offset = receiver.resume_point()
        t.expected = rules.normalize(t.files, (path, offset) if path is not None else None)
        have = rules.ordinal(t.files, t.expected)
        log.info("{id}: receiving snapshot {name} ({total} bytes) from leader {leader}{resume}",
                 id=self.state.self_id, name=manifest.dirname, total=rules.ordinal(t.files, None),
                 leader=req.leader_id, resume=f", resuming at byte {have}" if have else "")
        if t.expected is None:
            self._finish(t, machines, req)
        return t

    # -- chunks ---------------------------------------------------------------------------------
    def _accept(self, req, t: _Transfer, machines, chunk: rules.Chunk, data: bytes) -> Deferred:
        """Queue the chunk's write behind the ones before it; answer once it is written, with the next place."""
        t.expected = rules.after(t.files, chunk)
        t.queued += 1
        outcome: Deferred = Deferred()

        def settle(result):
            if isinstance(result, Failure):
                outcome.errback(result)
            else:
                outcome.callback(result)
            return None  # the next write waits for this one, not for its outcome

        t.tail = t.tail.addBoth(lambda _: t.receiver.write(chunk.path, chunk.offset, data)).addBoth(settle)

        def done(_):
            t.queued -= 1
            t.bytes += chunk.size
            if t.expected is None and t.queued == 0 and t.phase == RECEIVING and self.current is t:
                self._finish(t, machines, req)
            return self._reply(req, t)

        def failed(failure):
            t.queued -= 1
            if self.current is t and t.phase == RECEIVING:
                path, offset = t.receiver.resume_point()
                t.expected = rules.normalize(t.files, (path, offset) if path is not None else None)
            self.refusals.error(("install write", t.key), "{id}: cannot write snapshot {name} ({path} at {offset}): "
                                "{why}", id=self.state.self_id, name=t.manifest.dirname, path=chunk.path,
                                offset=chunk.offset, why=failure.getErrorMessage())
            raise DLedgerError(ResponseCode.DISK_ERROR, f"writing the snapshot failed: {failure.getErrorMessage()}")

        return outcome.addCallbacks(done, failed)

    # -- finishing --------------------------------------------------------------------------------
    def _finish(self, t: _Transfer, machines, req) -> None:
        """Every byte is in: create the empty files, verify and rename (``finish``), then install."""
        t.phase = INSTALLING
        receiver = t.receiver
        d = t.tail
        for path in rules.empty_files(t.manifest):
            d = d.addCallback(lambda _, p=path: receiver.write(p, 0, b""))
        d.addCallback(lambda _: receiver.finish())

        def damaged(failure):
            from dledger.snapshot.store import SnapshotDamaged

            if not failure.check(SnapshotDamaged) or self.current is not t:
                return failure
            log.warn("{id}: snapshot {name} arrived damaged: {why}", id=self.state.self_id, name=t.manifest.dirname,
                     why=failure.getErrorMessage())
            t.phase = RECEIVING
            t.tail = succeed(None)
            path, offset = receiver.resume_point()
            t.expected = rules.normalize(t.files, (path, offset) if path is not None else None)
            return None

        def finished(manifest):
            if manifest is None:
                return None
            self._install(t, machines, req, manifest)
            return None

        d.addCallbacks(finished, damaged).addErrback(self._failed, t)

    def _install(self, t: _Transfer, machines, req, manifest) -> None:
        t.phase = INSTALLING
        t.manifest = manifest
        log.info("{id}: installing snapshot {name} (index {index}, term {term})", id=self.state.self_id,
                 name=manifest.dirname, index=manifest.index, term=manifest.term)

        def installed(_):
            t.phase = INSTALLED
            self.on_installed(manifest.index, req.term, req.leader_id)

        maybeDeferred(machines.install, manifest).addCallback(installed).addErrback(self._failed, t)

    def _failed(self, failure, t: _Transfer) -> None:
        log.error("{id}: InstallSnapshot of {name} failed: {why}", id=self.state.self_id, name=t.manifest.dirname,
                  why=failure.getErrorMessage())
        if self.current is t:
            self.current = None
            t.unpark(_stopped)
            if t.receiver is not None and t.phase == RECEIVING:
                t.receiver.abort()

    def stop(self) -> None:
        """The member stops: forget the transfer (its directory stays, so the next incarnation resumes it)."""
        t, self.current = self.current, None
        if t is not None:
            t.unpark(_stopped)


def _stopped():
    raise DLedgerError(ResponseCode.NETWORK_ERROR, "the member stopped")
