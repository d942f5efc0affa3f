"""The dledger client: Deferred API that finds the leader, follows redirects and retries.

Delivery of appends is **at least once** by default: an append that timed
out, lost its leader (TERM_CHANGED) or waited too long for the quorum
(WAIT_QUORUM_ACK_TIMEOUT) may still commit, so retrying it may store the
body twice.  Pass ``at_least_once=False`` to get those outcomes back as
errors instead (the caller then knows the append is *ambiguous*: maybe
committed, maybe not), and so is a connection lost after the request was
written (:class:`~dledger.errors.OutcomeUnknown`, code NETWORK_ERROR).
Refusals that guarantee nothing was appended (NOT_LEADER,
LEADER_PENDING_FULL, LEADER_TRANSFERRING, a refused connection) are always
retried.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet.defer import Deferred, fail, inlineCallbacks, succeed
from twisted.internet.task import deferLater
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.config import parse_peers
from dledger.errors import DLedgerError, OutcomeUnknown
from dledger.messages import (
    AppendEntryRequest,
    GetEntriesRawRequest,
    GetEntriesRequest,
    LeadershipTransferRequest,
    MembersRequest,
    MetadataRequest,
    PluginRequest,
    SnapshotRequest,
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
                 max_attempts: int = 30, retry_delay: float = 0.05, at_least_once: bool = True,
                 owns_transport: bool = False, give_up_unreachable: bool = False):
        if not members:
            raise ValueError("a client needs at least one member id")
        # Checked here, not deep in the reactor: callLater(-1) fails with a bare AssertionError much later.
        if not request_timeout > 0:
            raise ValueError(f"request_timeout must be more than 0 seconds, got {request_timeout!r}")
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {max_attempts!r}")
        self.transport = transport
        self.owns_transport = owns_transport
        self.group = group
        #: The member ids this client asks (grows when :meth:`members` shows new ones).
        self.member_ids = list(members)
        self.clock = clock
        self.request_timeout = request_timeout
        self.max_attempts = max_attempts
        self.retry_delay = retry_delay
        self.at_least_once = at_least_once
        #: Stop at once (NETWORK_ERROR "cannot connect to any of ...") when every member refused a
        #: connection in a row, instead of retrying ``max_attempts`` times (the ``dledger`` CLI does).
        self.give_up_unreachable = give_up_unreachable
        self.leader: str | None = None
        self._next = 0
        #: member -> why its latest attempt could not connect; cleared when it answers.
        self._unreachable: dict[str, str] = {}

    def _guess(self) -> str:
        if self.leader is not None:
            return self.leader
        member = self.member_ids[self._next % len(self.member_ids)]
        self._next += 1
        return member

    def _note_reachability(self, member: str, error: DLedgerError | None) -> DLedgerError | None:
        """Record whether ``member`` could be reached; the error to give up with when no member can be."""
        if error is None or error.code is not ResponseCode.NETWORK_ERROR:
            self._unreachable.pop(member, None)
            return None
        self._unreachable[member] = error.message
        if not all(m in self._unreachable for m in self.member_ids):
            return None
        return DLedgerError(ResponseCode.NETWORK_ERROR, unreachable_message(self.transport, self.member_ids,
                                                                            self._unreachable))

    @inlineCallbacks
    def _call(self, make: Callable[[str], object], *, retry_ambiguous: bool):
        last_error: DLedgerError | None = None
        for attempt in range(self.max_attempts):
            target = self._guess()
            try:
                resp = yield self.transport.send(target, make(target), timeout=self.request_timeout)
                code = resp.response_code
                self._note_reachability(target, None)
            except DLedgerError as exc:
                code, resp = exc.code, None
                if code is ResponseCode.APPEND_REFUSED:  # a plugin refused the body: its reason, no retry
                    raise DLedgerError(code, f"from {target} (attempt {attempt + 1}): {exc.message}",
                                       leader_id=exc.leader_id) from None
                nobody = self._note_reachability(target, exc)
                if isinstance(exc, OutcomeUnknown) and not retry_ambiguous:  # sent, then the connection went
                    raise OutcomeUnknown(code, f"from {target} (attempt {attempt + 1}): {exc.message}") from None
                if nobody is not None and (self.give_up_unreachable or attempt + 1 == self.max_attempts):
                    raise nobody from None
            if code is ResponseCode.SUCCESS:
                return resp
            # a plugin's one-line reason (PluginResponse), a member's refusal (MembersResponse)
            reason = getattr(resp, "reason", None) or getattr(resp, "error", None)
            last_error = DLedgerError(code, f"from {target} (attempt {attempt + 1})"
                                      + (f": {reason}" if reason else ""), leader_id=getattr(resp, "leader_id", None))
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
    def close(self) -> Deferred:
        """Close the connections if this client owns its transport (clients made by :func:`connect` do)."""
        if self.owns_transport:
            return self.transport.close()
        return succeed(None)

    def append(self, body: bytes) -> Deferred:
        """Append one body; fires with the AppendEntryResponse (``index``, ``pos``) once committed."""
        return self._call(lambda m: AppendEntryRequest(group=self.group, remote_id=m, body=body),
                          retry_ambiguous=self.at_least_once)

    def append_batch(self, bodies: list[bytes]) -> Deferred:
        """Append several bodies as consecutive entries; the response carries the last one's index."""
        bodies = list(bodies)
        return self._call(lambda m: AppendEntryRequest(group=self.group, remote_id=m, batch_msgs=bodies),
                          retry_ambiguous=self.at_least_once)

    def get(self, index: int, count: int = 1, *, member: str | None = None) -> Deferred:
        """Committed entries from ``index`` (at most ``count``; NOOP entries are skipped by the server).

        With ``member`` the request goes to that member only, once, marked ``followerRead``: a follower
        answers from its own committed prefix (never past its committed index: INDEX_OUT_OF_RANGE), the
        leader as usual; any refusal is raised as a :class:`DLedgerError` for the caller to decide.
        """
        return self._get(GetEntriesRequest, index, count, member).addCallback(lambda resp: resp.entries)

    def get_raw(self, index: int, count: int = 1, *, member: str | None = None) -> Deferred:
        """:meth:`get` for bulk readers: a :class:`~dledger.messages.GetEntriesRawResponse` whose entries are
        left as the binary reply's bytes (``section``, ``count``; ``entries`` instead if the member answered
        JSON).  The reply's prefix and section CRC are checked; each entry is the caller's to check
        (``dledger_spark.columns`` decodes them into Arrow columns with the checks :meth:`get` makes).
        """
        return self._get(GetEntriesRawRequest, index, count, member)

    @inlineCallbacks
    def _get(self, kind: type, index: int, count: int, member: str | None):
        """One GET of ``kind`` (the request class: plain or raw); the whole response."""
        if member is not None:
            req = kind(group=self.group, remote_id=member, begin_index=index, max_size=count, follower_read=True)
            resp = yield self.transport.send(member, req, timeout=self.request_timeout)
            if resp.response_code is not ResponseCode.SUCCESS:
                raise DLedgerError(resp.response_code, f"GET {index} from {member}", leader_id=resp.leader_id)
            return resp
        return (yield self._call(lambda m: kind(group=self.group, remote_id=m, begin_index=index, max_size=count),
                                 retry_ambiguous=True))

    @inlineCallbacks
    def request(self, code: int, body: bytes = b"", *, retry_ambiguous: bool = False, member: str | None = None):
        """Send a plugin's request (``code`` in ``codes.PLUGIN_REQUEST_CODES``); fires with the reply's bytes.

        Sent to the leader, following NOT_LEADER redirects and retrying the refusals that mean nothing
        was done (:data:`SAFE_RETRY`); an outcome that may or may not have been done (TIMEOUT,
        TERM_CHANGED, ...) fails unless ``retry_ambiguous`` (pass it for requests that only read, or
        are idempotent).  Any other code fails with a :class:`DLedgerError` carrying the plugin's
        reason.  ``member``: ask that member only, once (whatever its role; the plugin decides).
        """
        if member is not None:
            req = PluginRequest(group=self.group, remote_id=member, request_code=code, body=body)
            resp = yield self.transport.send(member, req, timeout=self.request_timeout)
            if resp.response_code is not ResponseCode.SUCCESS:
                raise DLedgerError(resp.response_code, f"from {member}" + (f": {resp.reason}" if resp.reason else ""),
                                   leader_id=resp.leader_id)
            return resp.body or b""
        resp = yield self._call(lambda m: PluginRequest(group=self.group, remote_id=m, request_code=code, body=body),
                                retry_ambiguous=retry_ambiguous)
        return resp.body or b""

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
    def snapshot(self, member: str):
        """Ask ``member`` to take a snapshot now (admin role); fires with the SnapshotResponse.

        DLedgerError with the member's one-line reason if it cannot (no state machine, a failed write).
        """
        req = SnapshotRequest(group=self.group, remote_id=member)
        resp = yield self.transport.send(member, req, timeout=self.request_timeout)
        if resp.response_code is not ResponseCode.SUCCESS:
            raise DLedgerError(resp.response_code, resp.error or f"snapshot on {member}",
                               leader_id=resp.leader_id)
        return resp

    # -- membership (issue #23; docs/operations.md "Replacing a member") ---------------------------
    @inlineCallbacks
    def members(self, member: str | None = None):
        """The group's configuration: a :class:`dledger.member_changes.MembersView` (members with roles, committed?).

        Asked of the leader when one is known, else of any member (``op`` list is answered by every
        member, from its own log); ``member``: ask that member only, once.  The addresses of members the
        client did not know (added since it was made) are learnt, so it can follow a leader there.
        """
        from dledger.member_changes import MembersView

        if member is not None:
            req = MembersRequest(group=self.group, remote_id=member, op="list")
            resp = yield self.transport.send(member, req, timeout=self.request_timeout)
            if resp.response_code is not ResponseCode.SUCCESS:
                raise DLedgerError(resp.response_code, resp.error or f"members from {member}",
                                   leader_id=resp.leader_id)
            answered = member
        else:
            asked: list[str] = []

            def make(m: str) -> MembersRequest:
                asked.append(m)
                return MembersRequest(group=self.group, remote_id=m, op="list")

            resp = yield self._call(make, retry_ambiguous=True)
            answered = asked[-1]
            leader = resp.leader_id
            if leader and leader != answered and leader in getattr(self.transport, "members", {}):
                # A follower's copy may lag behind by a change in flight: the leader's is the one in force.
                try:
                    mine = yield self.transport.send(leader, MembersRequest(group=self.group, remote_id=leader,
                                                                            op="list"),
                                                     timeout=self.request_timeout)
                    if mine.response_code is ResponseCode.SUCCESS:
                        resp, answered = mine, leader
                except DLedgerError:
                    pass  # the follower's answer stands
        view = MembersView.from_response(resp, answered)
        self.learn(view.configuration)
        return view

    def learn(self, configuration) -> None:
        """Add the members of ``configuration`` this client does not know yet (their id and address)."""
        known = getattr(self.transport, "members", None)
        for m in configuration.members:
            if isinstance(known, dict) and m.id not in known:
                known[m.id] = m.address
                remoting = getattr(self.transport, "remoting", None)
                if remoting is not None:
                    remoting.expected_peers[m.address] = m.id
            if m.id not in self.member_ids and (not isinstance(known, dict) or m.id in known):
                self.member_ids.append(m.id)

    def add_member(self, member_id: str, address: str, learner: bool = False) -> Deferred:
        """Add ``member_id`` at ``address`` (``host:port``) as a learner; fires with the new MembersView once committed.

        The leader promotes it to voter by itself once it is within ``learnerPromoteLag`` entries,
        unless ``learner`` (then only :meth:`promote_member` does).  The new member must be running
        with ``joinExisting`` (``twistd dledger --join``).  A refusal is a DLedgerError with the leader's
        one-line reason.
        """
        return self._change("add", member_id, address=address, learner=learner)

    def promote_member(self, member_id: str) -> Deferred:
        """Make learner ``member_id`` a voter; fires with the new MembersView once committed."""
        return self._change("promote", member_id)

    def remove_member(self, member_id: str) -> Deferred:
        """Remove ``member_id`` (voter or learner; the leader itself steps down and hands over)."""
        return self._change("remove", member_id)

    def replace_member(self, old: str, new_id: str, new_address: str, *, progress=None,
                       catch_up_timeout: float = 600.0, poll: float = 0.2) -> Deferred:
        """Add ``new_id``, wait until it is a voter (promoting it if the leader does not), then remove ``old``.

        One change at a time; ``progress(line)`` is called with each step (the CLI prints them).
        Fires with the final MembersView.  See :class:`dledger.member_changes.Replacement`.
        """
        from dledger.member_changes import Replacement

        return Deferred.fromCoroutine(Replacement(self, progress=progress, catch_up_timeout=catch_up_timeout,
                                                  poll=poll).run(old, new_id, new_address))

    def _change(self, op: str, member_id: str, *, address: str | None = None,
                learner: bool | None = None) -> Deferred:
        from dledger.member_changes import change_call

        return Deferred.fromCoroutine(change_call(self, op, member_id, address=address, learner=learner))

    def find_leader(self) -> Deferred:
        """The leader's detailed metadata (asks around until a member says it is the leader)."""
        return self._find_leader()

    @inlineCallbacks
    def _find_leader(self):
        for attempt in range(self.max_attempts):
            member = self._guess()
            try:
                meta = yield self.transport.send(member, MetadataRequest(group=self.group, remote_id=member,
                                                                         detail=True),
                                                 timeout=self.request_timeout)
                self._note_reachability(member, None)
            except DLedgerError as exc:
                meta = None
                nobody = self._note_reachability(member, exc)
                if nobody is not None and (self.give_up_unreachable or attempt + 1 == self.max_attempts):
                    raise nobody from None
            if meta is not None and meta.leader_id:
                # A Java DLedger member sends no role: naming itself leader is what every member says.
                if meta.leader_id == member and meta.role in (None, "LEADER"):
                    self.leader = member
                    return meta
                self.leader = meta.leader_id
                continue
            self.leader = None
            yield deferLater(self.clock, self.retry_delay * min(attempt + 1, 10), lambda: None)
        raise DLedgerError(ResponseCode.NOT_LEADER, "no leader found")


def unreachable_message(transport: Any, members: list[str], why: Mapping[str, str]) -> str:
    """``cannot connect to any of n0 (127.0.0.1:20911), n1 (...): <the last reason>``."""
    addresses = getattr(transport, "members", {})
    listed = ", ".join(f"{m} ({addresses[m]})" if m in addresses else m for m in members)
    reason = why.get(members[-1]) or next(iter(why.values()), "")
    return f"cannot connect to any of {listed}" + (f": {reason}" if reason else "")


class RemoteTransport:
    """The send side of a transport, for clients: member id -> ``host:port``, one pooled connection each.

    Requests use Java's JSON remoting form, so any DLedger member (Java or dledger) understands them,
    except APPENDs with ``binary_append`` (the default): their bodies travel raw in dledger's binary
    APPEND body (no Base64, no JSON for the payload; see docs/transport.md).  A member that answers one
    with a remoting error (a Java member cannot read it, so it appended nothing) gets the request again
    at once in JSON, and only JSON from then on.  GETs with ``binary_get`` (the default) ask for a binary
    reply (entries raw, as stored); a Java member ignores the request's marker and answers JSON, which
    is read as well.
    """

    log = Logger()

    def __init__(self, reactor: Any, members: Mapping[str, str], *, timeout: float = 3.0,
                 connect_timeout: float = 3.0, binary_append: bool = True, binary_get: bool = True,
                 credentials: Any = None):
        from dledger.transport.client import RemotingClient

        self.members = dict(members)
        self.remoting = RemotingClient(reactor, timeout=timeout, connect_timeout=connect_timeout,
                                       credentials=credentials)
        self.remoting.expected_peers.update({address: pid for pid, address in self.members.items()})
        self.binary_append = binary_append
        self.binary_get = binary_get
        #: Addresses that refused a binary APPEND: they get JSON.
        self.binary_refused: set[str] = set()

    def send(self, peer_id: str, request, timeout: float | None = None) -> Deferred:
        address = self.members.get(peer_id)
        if address is None:
            return fail(DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{peer_id!r} is not a member "
                                                                  f"(members: {', '.join(self.members)})"))
        if address not in self.binary_refused and (
                (self.binary_append and isinstance(request, AppendEntryRequest))
                or (self.binary_get and isinstance(request, GetEntriesRequest))):
            d = self.remoting.send(address, request, timeout, binary=True)
            return d.addErrback(self._binary_refused, address, request, timeout)
        return self.remoting.send(address, request, timeout)

    def _binary_refused(self, failure, address: str, request, timeout: float | None) -> Deferred:
        from dledger.transport.protocol import BinaryBodyRefused

        failure.trap(BinaryBodyRefused)
        if address not in self.binary_refused:
            self.binary_refused.add(address)
            self.log.warn("{address} refused a binary {kind} ({error}); sending it JSON from now on",
                          kind="GET" if isinstance(request, GetEntriesRequest) else "APPEND",
                          address=address, error=failure.value)
        return self.remoting.send(address, request, timeout)

    def close(self) -> Deferred:
        return self.remoting.close()


def connect(peers: str, group: str, *, reactor: Any = None, request_timeout: float = 3.0,
            connect_timeout: float = 3.0, binary_append: bool = True, binary_get: bool = True,
            credentials: Any = None, **client_options: Any) -> DLedgerClient:
    """A client of the group whose members are ``peers`` (``n0-host:port;n1-host:port``), over TCP.

    ``binary_append=False`` sends appends in Java's JSON form, ``binary_get=False`` asks for JSON GET replies
    (see :class:`RemoteTransport`).
    ``credentials`` (:meth:`dledger.security.guard.ClientCredentials.for_client`) for members with TLS or
    authentication (docs/security.md).
    ``client_options`` go to :class:`DLedgerClient` (``max_attempts``, ``retry_delay``,
    ``at_least_once``, ``members`` to restrict which members are tried).  Call ``close()`` when done.
    """
    if reactor is None:
        from twisted.internet import reactor
    if not connect_timeout > 0:
        raise ValueError(f"connect_timeout must be more than 0 seconds, got {connect_timeout!r}")
    addresses = {pid: p.address for pid, p in parse_peers(peers).items()}
    members = client_options.pop("members", None) or list(addresses)
    unknown = [m for m in members if m not in addresses]
    if unknown:
        raise DLedgerError(ResponseCode.UNKNOWN_MEMBER, f"{', '.join(unknown)} not in peers {peers!r}")
    transport = RemoteTransport(reactor, addresses, timeout=request_timeout, connect_timeout=connect_timeout,
                                binary_append=binary_append, binary_get=binary_get, credentials=credentials)
    return DLedgerClient(transport, group, members, clock=reactor, request_timeout=request_timeout,
                         owns_transport=True, **client_options)
