"""Authentication and authorisation on a member's port, over real sockets on 127.0.0.1 (issue #13).

A serving :class:`TcpTransport` with ``authMode`` tls or secret and a recording handler; members,
clients and outsiders connect with and without credentials.  What the handler never sees cannot
change anything: every refused request must stop before it.
"""

import pytest
import pytest_twisted
from twisted.internet.defer import succeed
from twisted.internet.task import deferLater
from zope.interface import implementer

from dledger import messages
from dledger.codes import PushType, ResponseCode
from dledger.config import make_config
from dledger.entry import Entry
from dledger.errors import DLedgerError
from dledger.interfaces import IPluginRequests, IRequestHandler
from dledger.launcher import free_ports
from dledger.security import certs
from dledger.security.guard import ClientCredentials
from dledger.security.secret import AUTH_CODE
from dledger.transport import remoting
from dledger.transport.client import RemotingClient
from dledger.transport.tcp import TcpTransport

pytestmark = pytest.mark.network


@pytest.fixture(scope="module")
def certdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("certs")
    certs.init_group(d, "g0", ["n0", "n1", "n2"], [certs.ClientSpec("app1", "write"),
                                                    certs.ClientSpec("reader", "read"),
                                                    certs.ClientSpec("ops", "admin")])
    other = tmp_path_factory.mktemp("other-ca")
    certs.init_group(other, "g0", ["n0", "n1", "n2"])
    return d, other


@implementer(IRequestHandler)
class Recorder:
    """Answers every request with its response type and remembers it (what got past the guard)."""

    def __init__(self):
        self.seen = []

    def handle_request(self, request):
        self.seen.append(request)
        cls = messages.RESPONSE_TYPES[type(request)]
        return succeed(request.base_reply(cls))


def member_config(d, mid, port, peers, mode="tls", **kw):
    opts = dict(tls_cert=str(d / f"{mid}.crt"), tls_key=str(d / f"{mid}.key"), tls_ca=str(d / "ca.crt"))
    if mode == "secret":
        opts = dict(group_secret_file=str(d / "group.secret"))
    return make_config(group="g0", self_id=mid, peers=peers, auth_mode=mode, clients_file=str(d / "clients.txt"),
                       listen=f"tcp:{port}:interface=127.0.0.1", **{**opts, **kw})


class Member:
    """A serving transport for n0 plus helpers to reach it."""

    def __init__(self, reactor, d, mode="tls", **kw):
        ports = free_ports(3)
        self.peers = ";".join(f"n{i}-127.0.0.1:{p}" for i, p in enumerate(ports))
        self.address = f"127.0.0.1:{ports[0]}"
        self.reactor, self.d, self.mode = reactor, d, mode
        self.config = member_config(d, "n0", ports[0], self.peers, mode, **kw)
        self.transport = TcpTransport(self.config, reactor)
        self.handler = Recorder()
        self.clients = []

    async def start(self):
        await self.transport.start(self.handler)
        return self

    def client(self, credentials=None, expected="n0"):
        c = RemotingClient(self.reactor, timeout=3.0, connect_timeout=3.0, credentials=credentials)
        if expected:
            c.expected_peers[self.address] = expected
        self.clients.append(c)
        return c

    def peer_transport(self, mid, d=None, mode=None):
        """Member ``mid``'s transport (not started) with its own credentials, sending to n0."""
        cfg = member_config(d or self.d, mid, 1, self.peers, mode or self.mode)
        t = TcpTransport(cfg, self.reactor)
        t.set_address("n0", self.address)
        self.clients.append(t)
        return t

    async def close(self):
        for c in self.clients:
            await (c.stop() if isinstance(c, TcpTransport) else c.close())
        await self.transport.stop()


def vote(leader="n1", term=5):
    return messages.VoteRequest(group="g0", remote_id="n0", local_id=leader, leader_id=leader, term=term,
                                ledger_end_index=10, ledger_end_term=4)


def forged_truncate():
    return messages.PushEntryRequest(group="g0", remote_id="n0", local_id="n1", leader_id="n1", term=5,
                                     commit_index=10, type=PushType.TRUNCATE,
                                     entry=Entry(b"forged", 5000, 5, 10 ** 6).sealed())


async def refused_with(d, code=ResponseCode.NOT_AUTHORIZED):
    resp = await d
    assert resp.code == code, resp
    return resp


async def network_error(d):
    with pytest.raises(DLedgerError) as err:
        await d
    assert err.value.code in (ResponseCode.NETWORK_ERROR, ResponseCode.TIMEOUT), err.value
    return err.value


# -- mutual TLS ---------------------------------------------------------------------------------

@pytest_twisted.ensureDeferred
async def test_tls_member_with_its_own_certificate_is_served(reactor, certdir):
    """A member presenting its certificate gets VOTE, HEART_BEAT and PUSH through to the handler."""
    m = await Member(reactor, certdir[0]).start()
    try:
        n1 = m.peer_transport("n1")
        resp = await n1.send("n0", vote())
        assert resp.code == ResponseCode.SUCCESS
        await n1.send("n0", messages.HeartBeatRequest(group="g0", remote_id="n0", local_id="n1", leader_id="n1",
                                                      term=5))
        await n1.send("n0", forged_truncate())  # binary PUSH over TLS
        assert [type(r).__name__ for r in m.handler.seen] == ["VoteRequest", "HeartBeatRequest", "PushEntryRequest"]
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_tls_member_cannot_speak_for_another_member(reactor, certdir):
    """n1's certificate carrying a VOTE or PUSH that claims to come from n2 is refused before the handler."""
    m = await Member(reactor, certdir[0]).start()
    try:
        n1 = m.peer_transport("n1")
        await refused_with(n1.send("n0", vote(leader="n2")))
        push = forged_truncate()
        push.leader_id = push.local_id = "n2"
        await refused_with(n1.send("n0", push))
        assert m.handler.seen == []
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_tls_port_refuses_plain_frames_and_anonymous_member_codes(reactor, certdir):
    """A plain-TCP forger gets no answer; a TLS client without a certificate gets NOT_AUTHORIZED for member codes."""
    m = await Member(reactor, certdir[0]).start()
    try:
        plain = m.client()
        await network_error(plain.send(m.address, vote(), timeout=1.0))
        anon = m.client(ClientCredentials.for_client("g0", tls_ca=str(certdir[0] / "ca.crt")))
        await refused_with(anon.send(m.address, vote()))
        await refused_with(anon.send(m.address, forged_truncate()))
        await refused_with(anon.send(m.address, messages.AppendEntryRequest(group="g0", remote_id="n0", body=b"x")))
        await refused_with(anon.send(m.address, messages.LeadershipTransferRequest(
            group="g0", remote_id="n0", transfer_id="n0", transferee_id="n1")))
        meta = await anon.send(m.address, messages.MetadataRequest(group="g0", remote_id="n0"))
        assert meta.code == ResponseCode.SUCCESS and meta.peers is None and meta.leader_id is None
        assert m.handler.seen == []
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_tls_certificate_from_another_ca_is_refused(reactor, certdir):
    """A member certificate signed by another CA (same group and id) does not complete the handshake."""
    m = await Member(reactor, certdir[0]).start()
    try:
        outsider = m.peer_transport("n1", d=certdir[1])
        await network_error(outsider.send("n0", vote()))
        assert m.handler.seen == []
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_tls_client_roles(reactor, certdir):
    """read may GET and see the peer map, write may APPEND but not transfer, admin may transfer."""
    d = certdir[0]
    m = await Member(reactor, d).start()

    def creds(name):
        return ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / f"client-{name}.crt"),
                                            tls_key=str(d / f"client-{name}.key"))
    append = messages.AppendEntryRequest(group="g0", remote_id="n0", body=b"x")
    transfer = messages.LeadershipTransferRequest(group="g0", remote_id="n0", transfer_id="n0", transferee_id="n1")
    try:
        reader, writer, admin = m.client(creds("reader")), m.client(creds("app1")), m.client(creds("ops"))
        meta = await reader.send(m.address, messages.MetadataRequest(group="g0", remote_id="n0"))
        assert meta.code == ResponseCode.SUCCESS
        assert (await reader.send(m.address, messages.GetEntriesRequest(group="g0", begin_index=0))).code == 200
        await refused_with(reader.send(m.address, append))
        assert (await writer.send(m.address, append)).code == ResponseCode.SUCCESS
        await refused_with(writer.send(m.address, transfer))
        await refused_with(writer.send(m.address, vote()))
        assert (await admin.send(m.address, transfer)).code == ResponseCode.SUCCESS
        await refused_with(admin.send(m.address, vote()))
        kinds = [type(r).__name__ for r in m.handler.seen]
        assert kinds == ["MetadataRequest", "GetEntriesRequest", "AppendEntryRequest", "LeadershipTransferRequest"]
    finally:
        await m.close()


@implementer(IPluginRequests)
class PluginRecorder(Recorder):
    """A Recorder serving two plugin request codes: 55000 needs the read role, 55001 the write role."""

    ROLES = {55000: "read", 55001: "write"}

    def plugin_role(self, code):
        return self.ROLES.get(code)


@pytest_twisted.ensureDeferred
async def test_tls_plugin_request_codes_need_their_handlers_role(reactor, certdir):
    """A plugin's request code is checked like a core one: read may send a read code, not a write one; no
    credentials, a code no plugin serves, or a client naming a member are refused before the handler."""
    d = certdir[0]
    m = Member(reactor, d)
    m.handler = PluginRecorder()
    await m.start()

    def creds(name):
        return ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / f"client-{name}.crt"),
                                            tls_key=str(d / f"client-{name}.key"))

    def plugin(code, **ids):
        return messages.PluginRequest(group="g0", remote_id="n0", request_code=code, body=b"k", **ids)
    try:
        reader, writer = m.client(creds("reader")), m.client(creds("app1"))
        anon = m.client(ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt")))
        assert (await reader.send(m.address, plugin(55000))).code == ResponseCode.SUCCESS
        await refused_with(reader.send(m.address, plugin(55001)))
        assert (await writer.send(m.address, plugin(55001))).code == ResponseCode.SUCCESS
        await refused_with(anon.send(m.address, plugin(55000)))
        await refused_with(writer.send(m.address, plugin(55002)))  # served by no plugin: member-only
        await refused_with(writer.send(m.address, plugin(55001, leader_id="n1")))
        assert [(type(r).__name__, r.request_code, r.body) for r in m.handler.seen] == \
            [("PluginRequest", 55000, b"k"), ("PluginRequest", 55001, b"k")]
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_client_refuses_a_server_that_is_not_the_expected_member(reactor, certdir):
    """A member's link to "n0" refuses a server whose certificate names n2 (no request is sent to it)."""
    m = await Member(reactor, certdir[0]).start()
    try:
        c = m.client(ClientCredentials.for_client("g0", tls_ca=str(certdir[0] / "ca.crt")), expected="n2")
        err = await network_error(c.send(m.address, messages.MetadataRequest(group="g0")))
        assert "names member 'n0', not 'n2'" in str(err)
        assert m.handler.seen == []
    finally:
        await m.close()


# -- group secret ---------------------------------------------------------------------------------

@pytest_twisted.ensureDeferred
async def test_secret_member_logs_in_and_is_served(reactor, certdir):
    """A member with the group secret logs in; its MAC'd requests and the signed replies go through."""
    m = await Member(reactor, certdir[0], mode="secret").start()
    try:
        n1 = m.peer_transport("n1")
        assert (await n1.send("n0", vote())).code == ResponseCode.SUCCESS
        assert (await n1.send("n0", forged_truncate())).code == ResponseCode.SUCCESS
        assert len(m.handler.seen) == 2
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_secret_mode_refuses_unauthenticated_and_wrong_secret(reactor, certdir, tmp_path):
    """Without a login member codes are refused; with a wrong secret the login itself fails."""
    m = await Member(reactor, certdir[0], mode="secret").start()
    try:
        plain = m.client()
        await refused_with(plain.send(m.address, vote()))
        await refused_with(plain.send(m.address, forged_truncate()), ResponseCode.NOT_AUTHORIZED)
        wrong = tmp_path / "wrong.secret"
        wrong.write_text("x" * 40 + "\n")
        bad = m.client(ClientCredentials("g0", "member", "n1", (b"x" * 40)))
        err = await network_error(bad.send(m.address, vote()))
        assert "does not know" in str(err) or "refused the login" in str(err)
        assert m.handler.seen == []
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_secret_mode_replayed_frame_is_refused(reactor, certdir):
    """A MAC'd VOTE sent again on the same connection (replay) is refused and the connection closed."""
    m = await Member(reactor, certdir[0], mode="secret").start()
    try:
        n1 = m.peer_transport("n1")
        assert (await n1.send("n0", vote())).code == ResponseCode.SUCCESS
        proto = n1.client.links[m.address].protocol
        captured = []
        write = proto.transport.write
        proto.transport.write = lambda data: (captured.append(data), write(data))[1]
        assert (await n1.send("n0", vote(term=6))).code == ResponseCode.SUCCESS
        proto.transport.write = write
        write(captured[-1])  # the same signed bytes again: its sequence number is stale
        deadline = reactor.seconds() + 5
        while not proto.lost and reactor.seconds() < deadline:
            await deferLater(reactor, 0.02, lambda: None)
        assert proto.lost, "the member kept a connection that replayed a frame"
        assert [r.term for r in m.handler.seen] == [5, 6]
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_secret_client_token_and_role(reactor, certdir):
    """A client logging in with its token from clientsFile gets its role (write: APPEND yes, VOTE no)."""
    d = certdir[0]
    token = next(line.split()[2] for line in (d / "clients.txt").read_text().splitlines()
                 if line.startswith("app1 "))
    tf = d / "app1.token"
    tf.write_text(token + "\n")
    m = await Member(reactor, d, mode="secret").start()
    try:
        c = m.client(ClientCredentials.for_client("g0", name="app1", token_file=str(tf)))
        append = messages.AppendEntryRequest(group="g0", remote_id="n0", body=b"x")
        assert (await c.send(m.address, append)).code == ResponseCode.SUCCESS
        await refused_with(c.send(m.address, vote()))
        assert [type(r).__name__ for r in m.handler.seen] == ["AppendEntryRequest"]
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_unknown_request_code_is_refused_to_unauthenticated_peers(reactor, certdir):
    """A code no table knows (here 52000) needs the member permission: NOT_AUTHORIZED, not UNSUPPORTED."""
    m = await Member(reactor, certdir[0], mode="secret").start()
    try:
        import socket
        port = int(m.address.rsplit(":", 1)[1])
        s = socket.create_connection(("127.0.0.1", port), timeout=3)
        try:
            s.sendall(remoting.encode_frame(remoting.Header(52000, 7, 0), b"{}"))
            from twisted.internet.threads import deferToThread
            data = await deferToThread(s.recv, 65536)
        finally:
            s.close()
        frame = remoting.decode_frame(data)
        assert frame.header.opaque == 7 and b'"code":430' in frame.body
        assert AUTH_CODE != 52000
    finally:
        await m.close()


@pytest_twisted.ensureDeferred
async def test_tls_port_closes_connections_that_never_finish_the_handshake(reactor, certdir):
    """A connection to a TLS port that sends nothing, or half a handshake, is closed after connectionIdleTimeoutMs."""
    import socket

    m = await Member(reactor, certdir[0], connection_idle_timeout_ms=300).start()
    socks = []
    try:
        port = int(m.address.rsplit(":", 1)[1])
        for data in (b"", b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"):  # nothing; a ClientHello's first bytes
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.setblocking(False)
            if data:
                s.sendall(data)
            socks.append(s)

        def closed(s):
            try:
                return s.recv(65536) == b""
            except BlockingIOError:
                return False
            except OSError:
                return True

        deadline = reactor.seconds() + 5
        while not all(closed(s) for s in socks) and reactor.seconds() < deadline:
            await deferLater(reactor, 0.05, lambda: None)
        assert all(closed(s) for s in socks), "a connection stuck in the TLS handshake was kept open"
    finally:
        for s in socks:
            s.close()
        await m.close()


def test_signed_binary_get_reply_keeps_its_binary_marker():
    """In secret mode a binary GET reply is signed and still marked binary (else the client parses it as JSON)."""
    from dledger.security.guard import reply_authentic, sign_reply

    key = b"k" * 32
    frame = next(iter(remoting.FrameSplitter().feed(sign_reply(7, b"\x00binary", None, key, binary=True))))
    assert frame.header.body_encoding == "bin" and reply_authentic(frame, key)
    plain = next(iter(remoting.FrameSplitter().feed(sign_reply(8, b"{}", None, key))))
    assert plain.header.body_encoding is None and reply_authentic(plain, key)
