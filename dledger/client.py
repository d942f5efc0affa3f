"""The dledger client: Deferred API that finds the leader, follows redirects and retries.

Delivery of appends is **at least once** by default: an append that timed
out, lost its leader (TERM_CHANGED) or waited too long for the quorum
(WAIT_QUORUM_ACK_TIMEOUT) may still commit, so retrying it may store the
body twice.  Pass ``at_least_once=False`` to get those outcomes back as
errors instead (the caller then knows the append is *ambiguous*: maybe
committed, maybe not).  Refusals that guarantee nothing was appended
(NOT_LEADER, LEADER_PENDING_FULL, LEADER_TRANSFERRING, a refused
connection) are always retried.
"""

from __future__ import annotations

from collections.abc import Callable

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.internet.task import deferLater
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import (
    AppendEntryRequest,
    GetEntriesRequest,
    LeadershipTransferRequest,
    MetadataRequest,
)

log = Logger()

#: Nothing was appended: always safe to retry (after a pause for the ones that need time).
SAFE_RETRY = {ResponseCode.NOT_LEADER, ResponseCode.LEADER_PENDING_FULL, ResponseCode.LEADER_TRANSFERRING,
              ResponseCode.LEADER_NOT_READY, ResponseCode.NETWORK_ERROR, ResponseCode.UNKNOWN_MEMBER}
#: The append may or may not have happened.
AMBIGUOUS = {ResponseCode.TIMEOUT, ResponseCode.TERM_CHANGED, ResponseCode.WAIT_QUORUM_ACK_TIMEOUT}


class DLedgerClient:
    """Talks to a group through any ``ITransport`` (in-process or TCP)."""

    def __init__(self, transport, group: str, members: list[str], *, clock, request_timeout: float = 3.0,
                 max_attempts: int = 30, retry_delay: float = 0.05, at_least_once: bool = True):
        if not members:
            raise ValueError("a client needs at least one member id")
        self.transport = transport
        self.group = group
        self.members = list(members)
        self.clock = clock
        self.request_timeout = request_timeout
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.at_least_once = at_least_once
        self.leader: str | None = None
        self._next = 0

    def _guess(self) -> str:
        if self.leader is not None:
            return self.leader
        member = self.members[self._next % len(self.members)]
        self._next += 1
        return member

    @inlineCallbacks
    def _call(self, make: Callable[[str], object], *, retry_ambiguous: bool):
        last_error: DLedgerError | None = None
        for attempt in range(self.max_attempts):
            target = self._guess()
            try:
                resp = yield self.transport.send(target, make(target), timeout=self.request_timeout)
                code = resp.response_code
            except DLedgerError as exc:
                code, resp = exc.code, None
            if code is ResponseCode.SUCCESS:
                return resp
            last_error = DLedgerError(code, f"from {target} (attempt {attempt + 1})",
                                      leader_id=getattr(resp, "leader_id", None))
            if code is ResponseCode.NOT_LEADER and resp is not None and resp.leader_id not in (None, target):
                self.leader = resp.leader_id
                continue
            self.leader = None
            if code in SAFE_RETRY or (code in AMBIGUOUS and retry_ambiguous):
                yield deferLater(self.clock, self.retry_delay * min(attempt + 1, 10), lambda: None)
                continue
            raise last_error
        raise last_error or DLedgerError(ResponseCode.TIMEOUT, "no attempt made")

    # -- API ---------------------------------------------------------------------------------
    def append(self, body: bytes) -> Deferred:
        """Append one body; fires with the AppendEntryResponse (``index``, ``pos``) once committed."""
        return self._call(lambda m: AppendEntryRequest(group=self.group, remote_id=m, body=body),
                          retry_ambiguous=self.at_least_once)

    def append_batch(self, bodies: list[bytes]) -> Deferred:
        """Append several bodies as consecutive entries; the response carries the last one's index."""
        bodies = list(bodies)
        return self._call(lambda m: AppendEntryRequest(group=self.group, remote_id=m, batch_msgs=bodies),
                          retry_ambiguous=self.at_least_once)

    @inlineCallbacks
    def get(self, index: int, count: int = 1):
        """Committed entries from ``index`` (at most ``count``; NOOP entries are skipped by the server)."""
        resp = yield self._call(lambda m: GetEntriesRequest(group=self.group, remote_id=m, begin_index=index,
                                                            max_size=count), retry_ambiguous=True)
        return resp.entries

    def metadata(self, member: str | None = None) -> Deferred:
        """Metadata with role, term and log indexes from ``member`` (any member by default)."""
        if member is not None:
            req = MetadataRequest(group=self.group, remote_id=member, detail=True)
            d = self.transport.send(member, req, timeout=self.request_timeout)
            return d
        return self._call(lambda m: MetadataRequest(group=self.group, remote_id=m, detail=True),
                          retry_ambiguous=True)

    @inlineCallbacks
    def transfer(self, to: str):
        """Move leadership to member ``to``; fires with the LeadershipTransferResponse (new term)."""
        meta = yield self._find_leader()
        leader = meta.leader_id
        req = LeadershipTransferRequest(group=self.group, remote_id=leader, term=meta.term, transfer_id=leader,
                                        transferee_id=to)
        resp = yield self.transport.send(leader, req, timeout=self.request_timeout * 3)
        if resp.response_code is not ResponseCode.SUCCESS:
            raise DLedgerError(resp.response_code, f"transfer {leader} -> {to}")
        self.leader = to
        return resp

    @inlineCallbacks
    def _find_leader(self):
        for attempt in range(self.max_attempts):
            member = self._guess()
            try:
                meta = yield self.transport.send(member, MetadataRequest(group=self.group, remote_id=member,
                                                                         detail=True),
                                                 timeout=self.request_timeout)
            except DLedgerError:
                meta = None
            if meta is not None and meta.leader_id:
                if meta.leader_id == member and meta.role == "LEADER":
                    self.leader = member
                    return meta
                self.leader = meta.leader_id
                continue
            self.leader = None
            yield deferLater(self.clock, self.retry_delay * min(attempt + 1, 10), lambda: None)
        raise DLedgerError(ResponseCode.NOT_LEADER, "no leader found")
