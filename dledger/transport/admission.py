"""The security half of a remoting connection: who the peer is, what it may ask, and the session's MACs.

:class:`ConnectionAuth` is one connection's authentication state (issue #13, docs/security.md).  Serving
side (a :class:`~dledger.security.guard.ServerGuard`): the AUTH login, every request frame's MAC and
sequence, the code's permission before decoding (:meth:`ConnectionAuth.admitted`) and the ids the request
names after it (:meth:`ConnectionAuth.authorised`).  Connecting side (a
:class:`~dledger.security.guard.ClientCredentials`): the server's certificate, the login, and the waiters
of :meth:`ConnectionAuth.when_ready`.  It moves no bytes itself: it asks its connection (the
:class:`~dledger.transport.protocol.RemotingProtocol`) to write, call or close, so the one authorisation
check reads in one place, apart from framing and dispatch (issue #26 item 3).
"""

from __future__ import annotations

from typing import Any, Protocol

from twisted.internet.defer import Deferred, fail, succeed
from twisted.python.failure import Failure

from dledger import messages
from dledger.codes import PLUGIN_REQUEST_CODES, ResponseCode
from dledger.errors import DLedgerError
from dledger.interfaces import ILeaderAware, IPluginRequests
from dledger.security import policy as auth_policy
from dledger.security import secret as auth_secret
from dledger.transport import remoting
from dledger.transport.remoting import Frame, Header


class AuthHost(Protocol):
    """What :class:`ConnectionAuth` uses of its connection (a ``RemotingProtocol``), named here rather than
    imported: ``protocol`` imports this module, and a type-only import back would be a circle
    (tests/test_import_graph.py)."""

    transport: Any
    handler: Any
    peer: str
    peer_host: str
    expected_peer: Any

    def raw_call(self, code: int, body: bytes, timeout: float) -> Deferred: ...

    def _abandon(self) -> None: ...


class ConnectionAuth:
    """One connection's authentication: the serving side's checks, the connecting side's login.

    ``guard`` (serving side, None: no checks) and ``credentials`` (connecting side, None: nothing to present)
    come from the connection; ``session`` is the HMAC key once a secret-mode login succeeded (None before and
    in the other modes), which the connection uses to sign and check frames.
    """

    def __init__(self, proto: AuthHost, guard: Any = None, credentials: Any = None):
        self.proto = proto
        self.guard = guard
        self.credentials = credentials
        #: Who the peer proved to be (serving side; set on its first request).
        self.identity: auth_policy.Identity | None = None
        #: The connection's HMAC key (secret mode, after the login).
        self.session: bytes | None = None
        self.send_seq = 0
        self.recv_seq = 0
        self._ready_waiters: list[Deferred] = []  # connecting side with credentials: fired once they were accepted
        #: Why the peer did not accept our credentials (connecting side; None: it did, or not answered yet).
        self.ready_error: DLedgerError | None = None
        self.ready_done = credentials is None

    # -- connecting side ----------------------------------------------------------------
    def connection_made(self) -> None:
        if self.credentials is not None and self.credentials.tls_options is None:
            self.present_credentials()  # else after the TLS handshake (handshake_completed)

    def handshake_completed(self) -> None:
        """TLS is up: the connecting side checks the server's certificate, then logs in (secret mode)."""
        if self.credentials is None or self.ready_done:
            return
        from dledger.security import tls

        proto = self.proto
        why = self.credentials.check_server(tls.subject_of(proto.transport), proto.expected_peer)
        if why is not None:
            self.not_ready(f"refusing to talk to {proto.peer}: {why}")
            return
        self.present_credentials()

    def present_credentials(self) -> None:
        creds, proto = self.credentials, self.proto
        if creds.secret is None:
            self._set_ready()
            return
        body, nonce = creds.hello()

        def welcomed(frame: Frame) -> None:
            if self.ready_done:
                return
            try:
                code, server_nonce, proof = auth_secret.parse_welcome(frame.body)
            except auth_secret.AuthError as exc:
                self.not_ready(f"login to {proto.peer} failed: {exc}")
                return
            if code != 200:
                self.not_ready(f"{proto.peer} refused the login of {creds.kind} {creds.name!r}: "
                               f"{frame.header.remark or ResponseCode.of(code).name}")
                return
            key = creds.session(nonce, server_nonce)
            if not auth_secret.macs_equal(auth_secret.server_proof(key), proof):
                self.not_ready(f"{proto.peer} does not know our secret (wrong proof); refusing to talk to it")
                return
            self.session = key
            self._set_ready()

        def failed(f: Failure) -> None:
            self.not_ready(f"login to {proto.peer} failed: {f.getErrorMessage()}")

        proto.raw_call(auth_secret.AUTH_CODE, body, creds.handshake_timeout).addCallbacks(welcomed, failed)

    def _set_ready(self) -> None:
        self.ready_done = True
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.callback(None)

    def not_ready(self, message: str) -> None:
        """The login failed (or the connection went first): close, and fail every :meth:`when_ready` waiter."""
        if self.ready_done:
            return
        self.ready_done = True
        self.ready_error = DLedgerError(ResponseCode.NETWORK_ERROR, message)
        self.proto._abandon(abort=True)
        waiters, self._ready_waiters = self._ready_waiters, []
        for d in waiters:
            d.errback(self.ready_error)

    def when_ready(self) -> Deferred:
        """Fires once the peer accepted our credentials (at once without any); DLedgerError if it did not."""
        if self.ready_done:
            return fail(self.ready_error) if self.ready_error is not None else succeed(None)
        d: Deferred = Deferred()
        self._ready_waiters.append(d)
        return d

    # -- serving side ----------------------------------------------------------------
    def admitted(self, frame: Frame) -> bool:
        """The one authorisation check (before decoding): log-in, frame MAC, the code's permission.

        False if the request was answered here (refused, redacted, or the AUTH login itself).
        """
        header, guard, proto = frame.header, self.guard, self.proto
        if header.code == auth_secret.AUTH_CODE:
            self._login(frame)
            return False
        if self.session is not None:
            from dledger.security.guard import request_authentic

            seq, self.recv_seq = self.recv_seq, self.recv_seq + 1
            if not request_authentic(frame, self.session, seq):
                self.refuse(header, f"request {header.opaque} (code {header.code}) does not authenticate (wrong "
                                    "or missing MAC, replayed or reordered); closing the connection")
                proto._abandon()
                return False
        if self.identity is None:
            if guard.auth_mode == "tls":
                self.identity = guard.identify_tls(proto.transport, proto.peer_host)
            else:
                self.identity = guard.anonymous()
        decision = guard.decide(header.code, self.identity, self._plugin_role(header.code))
        if decision.verdict is auth_policy.Verdict.ALLOW:
            return True
        if decision.verdict is auth_policy.Verdict.REDACT:
            reply = messages.MetadataResponse(group=guard.group)
            proto._write_reply(header, remoting.encode_body(reply))
            return False
        self.refuse(header, decision.reason)
        return False

    def authorised(self, header: Header, request: Any) -> bool:
        """The check after decoding: the ids ``request`` names (its group, its leader) are this member's.

        False if the request was refused here (answered NOT_AUTHORIZED).
        """
        handler = self.proto.handler
        leader = handler.current_leader() if ILeaderAware.providedBy(handler) else None
        decision = auth_policy.decide_request(self.guard.auth_mode, header.code, self.identity,
                                              auth_policy.request_ids(header.code, request), leader,
                                              self._plugin_role(header.code))
        if not decision.allowed:
            self.refuse(header, decision.reason)
            return False
        return True

    def _plugin_role(self, code: int) -> str | None:
        """The role a plugin's request ``code`` needs on this member (None: a core code, or no plugin serves it)."""
        handler = self.proto.handler
        if code in PLUGIN_REQUEST_CODES and IPluginRequests.providedBy(handler):
            return handler.plugin_role(code)
        return None

    def refuse(self, header: Header, reason: str) -> None:
        """Answer NOT_AUTHORIZED with the reason, and log it (rate-limited per address and code)."""
        proto = self.proto
        self.guard.refused(proto.peer_host, header.code, reason)
        proto._write_reply(header, remoting.error_body(header, ResponseCode.NOT_AUTHORIZED), reason[:500])

    def _login(self, frame: Frame) -> None:
        """Serve an AUTH request (secret mode): on success the connection has an identity and a session key."""
        header, guard, proto = frame.header, self.guard, self.proto
        if guard.auth_mode != "secret" or self.session is not None:
            why = "this member does not use authMode=secret" if guard.auth_mode != "secret" else "already logged in"
            proto._write_reply(header, auth_secret.refusal_body(int(ResponseCode.UNSUPPORTED)), why)
            return
        try:
            identity, key, body = guard.login(frame.body)
        except auth_secret.AuthError as exc:
            guard.refused(proto.peer_host, header.code, f"login refused: {exc}")
            proto._write_reply(header, auth_secret.refusal_body(int(ResponseCode.NOT_AUTHORIZED)), str(exc)[:500])
            return
        proto._write_reply(header, body)  # unsigned: the client has no key before reading it
        self.identity = identity
        self.session = key

    # -- frames of a session (secret mode) ---------------------------------------------------
    def sign_request(self, data: bytes, max_frame_size: int) -> bytes:
        """``data`` (one encoded request frame) with the session's MAC and the next sequence number."""
        from dledger.security.guard import sign_request

        data = sign_request(data, self.session, self.send_seq, max_frame_size)
        self.send_seq += 1
        return data

    def reply_authentic(self, frame: Frame) -> bool:
        from dledger.security.guard import reply_authentic

        return reply_authentic(frame, self.session)

    def sign_reply(self, opaque: int, body: bytes, remark: str | None, binary: bool) -> bytes:
        from dledger.security.guard import sign_reply

        return sign_reply(opaque, body, remark, self.session, binary=binary)
