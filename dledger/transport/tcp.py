"""The ``tcp`` transport: RocketMQ-remoting frames over TCP, one port per member for peers and clients.

The member's server plugs in as the :class:`~dledger.interfaces.IRequestHandler` given to
:meth:`TcpTransport.start`; every request arriving on the listening port (from peers, from the
``dledger`` CLI, from Java ``DLedgerClient``) is decoded, handed to ``handler.handle_request`` and
answered with the same ``opaque``.  Outgoing requests go through a :class:`RemotingClient`:
pipelined over one connection per peer, matched by ``opaque``, with per-request timeouts and
reconnect backoff.  PUSH requests to dledger members use the binary body unless
``binary_push=False`` (or the peer turned out not to understand it).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from twisted.internet.defer import Deferred, fail, gatherResults, maybeDeferred
from twisted.internet.endpoints import quoteStringArgument, serverFromString
from twisted.internet.interfaces import IListeningPort
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.config import DLedgerConfig, Peer
from dledger.errors import DLedgerError
from dledger.hookspecs import hookimpl
from dledger.interfaces import ITransport
from dledger.messages import InstallSnapshotRequest, PushEntryRequest, RequestOrResponse
from dledger.plugin_types import TransportType
from dledger.security.guard import ClientCredentials, ServerGuard, security_label
from dledger.transport.client import DEFAULT_CONNECT_TIMEOUT, DEFAULT_TIMEOUT, Backoff, RemotingClient
from dledger.transport.limits import AcceptGuard, ConnectionLimits
from dledger.transport.listener import ListenerGuard, ListenerLimits
from dledger.transport.protocol import DEFAULT_MAX_IN_FLIGHT, BinaryBodyRefused, RemotingServerFactory


def listen_endpoint_description(peer: Peer) -> str:
    """The default server endpoint of a member: its own port, on its own host's interface."""
    kind = "tcp6" if ":" in peer.host else "tcp"
    return f"{kind}:{peer.port}:interface={quoteStringArgument(peer.host)}"


def peer_address(peer: Peer) -> str:
    """``host:port`` of a member (``[v6]:port`` for IPv6 hosts)."""
    return f"[{peer.host}]:{peer.port}" if ":" in peer.host else f"{peer.host}:{peer.port}"


@implementer(ITransport)
class TcpTransport:
    """Serves this member's port and sends to the other members by id.

    ``addresses`` overrides where a member id is reached (``host:port`` or a client endpoint
    string); ``binary_push`` sends PUSH bodies to members in the binary form; ``backoff`` (with
    its injectable RNG), ``timeout`` (default per request, seconds) and ``connect_timeout`` tune
    the client side.
    """

    log = Logger()

    def __init__(self, config: DLedgerConfig, reactor: Any, *, binary_push: bool = True,
                 addresses: Mapping[str, str] | None = None, timeout: float = DEFAULT_TIMEOUT,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT, backoff: Backoff | None = None,
                 max_in_flight: int = DEFAULT_MAX_IN_FLIGHT):
        self.config = config
        self.reactor = reactor
        self.binary_push = binary_push
        self.addresses: dict[str, str] = {pid: peer_address(p) for pid, p in config.members.items()}
        if addresses:
            unknown = set(addresses) - set(self.addresses)
            if unknown:
                raise ValueError(f"address overrides for unknown members {sorted(unknown)}")
            self.addresses.update(addresses)
        self.listen = config.listen or listen_endpoint_description(config.self_peer)
        self.max_in_flight = max_in_flight
        # Security (issue #13): None, None with authMode=none and no tlsCert -- Java's plain port, unchanged.
        self.guard = ServerGuard.from_config(config, reactor)
        self.credentials = ClientCredentials.for_member(config)
        self.client = RemotingClient(reactor, timeout=timeout, connect_timeout=connect_timeout,
                                     max_frame_size=config.max_frame_size, max_in_flight=max_in_flight,
                                     backoff=backoff, credentials=self.credentials)
        self.client.expected_peers.update({address: pid for pid, address in self.addresses.items()})
        self.binary_refused: set[str] = set()
        self.port: IListeningPort | None = None
        self._factory: RemotingServerFactory | None = None
        self.accept_guard: AcceptGuard | None = None
        self.listener_guard: ListenerGuard | None = None

    # -- ITransport ---------------------------------------------------------------------
    def start(self, handler: Any) -> Deferred:
        """Listen on ``config.listen`` (default ``tcp:<own port>:interface=<own host>``); fires with the port."""
        if self.port is not None:
            return fail(RuntimeError("transport already started"))
        # One guard for every listener of the process (issue #21): caps, the shared descriptor budget, the
        # handshake and read timeouts; the factory keeps the frame-level limits (idle, buffered bytes).
        self.listener_guard = ListenerGuard("member port", ListenerLimits.from_config(self.config), self.reactor)
        self.listener_guard.budget.reserve_at_least(self.config.fd_reserve)
        self._factory = RemotingServerFactory(self.reactor, handler, max_frame_size=self.config.max_frame_size,
                                              max_in_flight=self.max_in_flight,
                                              limits=ConnectionLimits.from_config(self.config), guard=self.guard,
                                              admission=False)
        tls_options = self.guard.tls_options if self.guard is not None else None
        try:
            serverFromString(self.reactor, self.listen)
        except (ValueError, KeyError, TypeError) as exc:
            return fail(ValueError(f"listen: bad endpoint {self.listen!r}: {exc}"))
        d = self.listener_guard.listen(self.reactor, self.listen, self._factory, tls_options)

        def listening(port: IListeningPort) -> IListeningPort:
            self.port = port
            self.accept_guard = self.listener_guard.accept_guard
            self.log.info("{member} of group {group} serving remoting on {address}{security}",
                          member=self.config.self_id, group=self.config.group, address=port.getHost(),
                          security=security_label(self.config))
            return port

        return d.addCallback(listening)

    def stop(self) -> Deferred:
        """Stop listening, fail outstanding requests, close every connection; fires when all are closed.

        A stopped transport stays stopped (later sends fail with NETWORK_ERROR); build a new one to restart.
        """
        waits = [self.client.close()]
        if self.listener_guard is not None:
            self.listener_guard.stop()
        if self.port is not None:
            port, self.port = self.port, None
            waits.append(maybeDeferred(port.stopListening))
        if self._factory is not None:
            for proto in list(self._factory.connections):
                proto.fail_pending("transport stopped")
                waits.append(proto.close())
        return gatherResults(waits, consumeErrors=True).addCallback(lambda _: None)

    def send(self, peer_id: str, request: RequestOrResponse, timeout: float | None = None) -> Deferred:
        """Send to member ``peer_id``; DLedgerError(UNKNOWN_MEMBER) at once for an id not in ``peers``."""
        address = self.addresses.get(peer_id)
        if address is None:
            return fail(DLedgerError(ResponseCode.UNKNOWN_MEMBER,
                                     f"{peer_id!r} is not a member of group {self.config.group!r} "
                                     f"(members: {', '.join(self.addresses)})"))
        if isinstance(request, InstallSnapshotRequest):  # dledger members only: always the binary body
            return self.client.send(address, request, timeout, binary=True)
        binary = self.binary_push and isinstance(request, PushEntryRequest) and peer_id not in self.binary_refused
        d = self.client.send(address, request, timeout, binary=binary)
        if binary:
            d.addErrback(self._binary_refused, peer_id)
        return d

    # -- beyond ITransport --------------------------------------------------------------
    def send_to_address(self, address: str, request: RequestOrResponse, timeout: float | None = None) -> Deferred:
        """Send to an address that is not (known to be) a member, always in Java's JSON form."""
        return self.client.send(address, request, timeout)

    def set_address(self, peer_id: str, address: str) -> None:
        """Reach member ``peer_id`` at ``address`` from now on (tests that listen on port 0 use this)."""
        if peer_id not in self.addresses:
            raise KeyError(f"{peer_id!r} is not a member")
        self.addresses[peer_id] = address
        self.client.expected_peers[address] = peer_id

    def set_members(self, addresses: Mapping[str, str]) -> None:
        """The configuration in force changed (issue #23): reach each member at its address, and let the
        security guard know exactly these ids as members (a peer claiming another id is refused)."""
        for pid, address in addresses.items():
            if self.addresses.get(pid) != address:
                self.addresses[pid] = address
                self.client.expected_peers[address] = pid
        if self.guard is not None:
            self.guard.members = frozenset(addresses)

    @property
    def server_factory(self) -> RemotingServerFactory | None:
        """The factory of the accepted connections once listening (their ``connections``, ``refused``, ``budget``)."""
        return self._factory

    @property
    def listening_address(self) -> Any:
        """The bound address (``IAddress``) once started, else None."""
        return self.port.getHost() if self.port is not None else None

    def _binary_refused(self, failure: Failure, peer_id: str) -> Failure:
        if failure.check(BinaryBodyRefused) and peer_id not in self.binary_refused:
            self.binary_refused.add(peer_id)
            self.log.warn("{peer} refused a binary PUSH ({error}); sending it JSON from now on",
                          peer=peer_id, error=failure.value)
        return failure


def make_transport(config: DLedgerConfig, reactor: Any = None, **kwargs: Any) -> TcpTransport:
    """The ``tcp`` transport type's factory (``reactor`` defaults to the global one)."""
    if reactor is None:
        from twisted.internet import reactor as global_reactor
        reactor = global_reactor
    return TcpTransport(config, reactor, **kwargs)


@hookimpl
def dledger_transport_types() -> list[TransportType]:
    return [TransportType(
        name="tcp",
        make_transport=make_transport,
        description="RocketMQ-remoting frames over TCP (Java DLedger compatible; binary PUSH between dledger peers)",
    )]


__all__ = ["Backoff", "RemotingClient", "TcpTransport", "listen_endpoint_description", "make_transport", "peer_address"]
