"""Broker registration with RocketMQ name servers, and the slave's fetches from its master (SlaveSync's ``fetch``).

A :class:`Registration` service (added by the plugin when
``rocketmq.namesrvAddr`` is set) sends REGISTER_BROKER to every name server
of the semicolon-separated list: at start, every
``rocketmq.registerNameServerPeriod`` ms (30 s), and *at once* when the
member becomes master or slave (or the master changes) and when the topic
table changes -- always as request/response.  RocketMQ sends the
registration after a role change oneway, so a slave learns its new master's
address only from the next periodic registration, 30 s later
(apache/rocketmq#7790); here the answer's ``masterAddr`` arrives with the
registration, and a slave whose answer names no master yet (the new master
has not registered) asks again every ``retry`` seconds (2 s) until one does.
The master registers as brokerId 0, a slave with its own id
(``broker.broker_id``); ``brokerAddr`` is ``rocketmq.storeHost`` (brokerIP1:
listenPort: it must be the address of ``rocketmq.listen``); the body is the
member's topic table exactly as a 4.9.8 broker encodes it (JSON, or zlib with
``rocketmq.compressedRegister``), ``bodyCrc32`` set.  A graceful stop sends
UNREGISTER_BROKER; a killed member just drops its connections, which the name
servers notice at once.

:class:`MasterFetcher` is the slave side of SlaveSynchronize: ``fetch(kind)``
sends GET_ALL_TOPIC_CONFIG (21) / GET_ALL_CONSUMER_OFFSET (43) /
GET_ALL_DELAY_OFFSET (45) / GET_ALL_SUBSCRIPTIONGROUP_CONFIG (201) to the
master's broker port and fires with the body.  The master's address is the
``masterAddr`` of the latest registration answer, and only counts for the
dledger term and leader it was asked in: after a role or leader change a
fetch waits (up to ``timeout``) for the answer to the registration the change
triggers, so it never asks the previous master.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.broker.broker import parse_host
from dledger_rocketmq.broker.port import SUCCESS
from dledger_rocketmq.client import client as rmq_client
from dledger_rocketmq.namesrv import routes

log = Logger(namespace="dledger_rocketmq.namesrv.registration")

REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
DEFAULT_PERIOD_MS = 30_000
#: Seconds between registrations of a slave whose answer named no master yet.
DEFAULT_RETRY = 2.0
#: RocketMQ's registerBrokerTimeoutMills (6 s).
DEFAULT_TIMEOUT = 6.0

#: How the service connects (``connect(reactor, host, port, timeout=...)`` -> Deferred of a RocketMQClient);
#: tests replace it with an in-memory network.
connect_client: Callable[..., defer.Deferred] = rmq_client.connect


# -- pure decisions --------------------------------------------------------------------------------------------

def parse_namesrv_addrs(text: str) -> list[str]:
    """``rocketmq.namesrvAddr``: ``host:port;host:port`` (RocketMQ's form) -> the list; ValueError if malformed."""
    addrs = [a.strip() for a in str(text).split(";") if a.strip()]
    for addr in addrs:
        host, _, port = addr.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"{addr!r} is not host:port (namesrvAddr is a ';'-separated list of host:port)")
    return addrs


def ha_server_addr(broker_addr: str) -> str:
    """The haServerAddr a 4.9.8 broker reports: brokerIP2:(listenPort + 1) (unused in DLedger mode)."""
    addr = parse_host(broker_addr)
    host = f"[{addr.host}]" if ":" in addr.host else addr.host
    return f"{host}:{addr.port + 1}"


def register_request(*, cluster: str, broker_name: str, broker_addr: str, broker_id: int,
                     data_version: dict[str, int], topics: Sequence[dict[str, Any]], compressed: bool = False
                     ) -> tuple[dict[str, str], bytes]:
    """The extFields and body of a REGISTER_BROKER as a 4.9.8 broker sends it (``topics`` in its map order)."""
    body = routes.encode_register_body(data_version, topics, compressed=compressed)
    ext = {"brokerId": str(broker_id), "bodyCrc32": str(routes.body_crc32(body)), "clusterName": cluster,
           "brokerAddr": broker_addr, "haServerAddr": ha_server_addr(broker_addr),
           "compressed": "true" if compressed else "false", "brokerName": broker_name}
    return ext, body


def unregister_ext(*, cluster: str, broker_name: str, broker_addr: str, broker_id: int) -> dict[str, str]:
    return {"brokerId": str(broker_id), "clusterName": cluster, "brokerAddr": broker_addr, "brokerName": broker_name}


def next_delay(*, is_master: bool, master_known: bool, period: float, retry: float = DEFAULT_RETRY) -> float:
    """Seconds to the next registration: the period, or ``retry`` for a slave that has no (current) master yet."""
    if not is_master and not master_known:
        return min(period, retry)
    return period


# -- the master's address and the slave's fetches ----------------------------------------------------------------

class MasterFetcher:
    """SlaveSync's ``fetch``: GET_ALL_* from the master the name servers named (see the module docstring)."""

    def __init__(self, server: Any, *, reactor: Any = None, timeout: float = 10.0, credentials: Any = None,
                 tls_options: Any = None) -> None:
        self.server = server
        #: The member's own ACL credentials (rocketmq.accessKey): the fetches are signed with them.
        self.credentials = credentials
        #: TLS with the member's certificate to a master whose port has rocketmq.tlsClientAuth (role "member").
        self.tls_options = tls_options
        self.reactor = reactor
        self.timeout = timeout
        self.master_addr: str | None = None
        self._tag: Any = None
        self._waiters: list[defer.Deferred] = []
        self._client: Any = None
        self._client_addr: str | None = None
        self._gave_up: Any = None  # the tag under which a wait for the address timed out
        self.stopped = False

    def current_tag(self) -> tuple[int, Any]:
        """What a learned address is valid for: the member's dledger term and leader when it asked."""
        state = self.server.state
        return state.curr_term, state.leader_id

    def known(self) -> bool:
        """True when the master's address was learned for the current term and leader."""
        return self.master_addr is not None and self._tag == self.current_tag()

    def learned(self, master_addr: str | None, tag: Any) -> None:
        """A registration answer (asked under ``tag``) named ``master_addr`` (None: no master registered)."""
        if tag != self.current_tag():
            return  # asked before a role or leader change: the registration that change triggered will answer
        self.master_addr, self._tag, self._gave_up = master_addr, tag, None
        if master_addr is not None:
            waiters, self._waiters = self._waiters, []
            for d in waiters:
                d.callback(master_addr)

    def address(self) -> defer.Deferred:
        """Fires with the current master's address (at once if known), fails after ``timeout`` seconds.

        Once a wait timed out, later calls under the same term and leader fail at
        once until an answer comes (a sync round of four fetches does not wait four
        times); after :meth:`stop` every call fails at once.
        """
        if self.stopped:
            return defer.fail(rmq_client.RocketMQError(-1, "the member is stopping"))
        if self.known():
            return defer.succeed(self.master_addr)
        if self._gave_up is not None and self._gave_up == self.current_tag():
            return defer.fail(rmq_client.RocketMQError(-1, "no master address from the name servers yet"))
        d = defer.Deferred(lambda d: self._waiters.remove(d) if d in self._waiters else None)
        self._waiters.append(d)
        d.addTimeout(self.timeout, self._clock())
        d.addErrback(self._no_master)
        return d

    def _no_master(self, f: Any) -> Any:
        if f.check(defer.TimeoutError):
            self._gave_up = self.current_tag()
            raise rmq_client.RocketMQError(-1, f"no master address from the name servers within {self.timeout:g}s")
        return f

    def _clock(self) -> Any:
        return self.reactor or self.server.clock

    def client(self) -> defer.Deferred:
        """A connected client to the current master's broker port, or a failure at once if it is not known
        (a forwarded send must not wait for an address; see :mod:`dledger_rocketmq.broker.forward`)."""
        if self.stopped or not self.known():
            return defer.fail(rmq_client.RocketMQError(-1, "the master's address is not known here"))
        return self._connected(self.master_addr)

    def fetch(self, kind: int) -> defer.Deferred:
        """GET_ALL_* of ``kind`` (a SyncKind) from the master's broker port; fires with the body bytes."""
        d = self.address()
        d.addCallback(self._connected)
        d.addCallback(lambda c: c.request(int(kind), {}))

        def body(reply: Any) -> bytes:
            header, data = reply
            if header.code != SUCCESS:
                raise rmq_client.RocketMQError(header.code, header.remark)
            return data
        return d.addCallback(body)

    def _connected(self, addr: str) -> defer.Deferred:
        if self._client is not None and self._client_addr == addr and self._client.connected:
            return defer.succeed(self._client)
        self.close()
        a = parse_host(addr)

        def made(c: Any) -> Any:
            self._client, self._client_addr = c, addr
            return c
        kw = {"tls_options": self.tls_options} if self.tls_options is not None else {}
        return connect_client(self._clock(), a.host, a.port, timeout=self.timeout, credentials=self.credentials,
                              **kw).addCallback(made)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._client_addr = None

    def stop(self) -> None:
        """The member stops: close the connection; waiting and later fetches fail at once."""
        self.stopped = True
        self.close()
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(rmq_client.RocketMQError(-1, "the member is stopping"))


# -- the registration service ------------------------------------------------------------------------------------

class Registration(service.Service):
    """Registers the member's broker with every name server (see the module docstring)."""

    name = "rocketmq-registration"

    def __init__(self, broker: Any, namesrv_addrs: Sequence[str], *, period: float = DEFAULT_PERIOD_MS / 1000,
                 compressed: bool = False, reactor: Any = None, timeout: float = DEFAULT_TIMEOUT,
                 retry: float = DEFAULT_RETRY, fetcher: MasterFetcher | None = None, credentials: Any = None) -> None:
        self.broker = broker
        #: The member's own ACL credentials (rocketmq.accessKey): registrations are signed with them, for name
        #: servers with ACL (an admin account there).
        self.credentials = credentials
        self.namesrv_addrs = list(namesrv_addrs)
        self.period = period
        self.compressed = compressed
        self.reactor = reactor
        self.timeout = timeout
        self.retry = retry
        self.fetcher = fetcher or MasterFetcher(broker.server, reactor=reactor)
        self.clients: dict[str, Any] = {}
        self.registrations = 0  # answered registrations (tests, stats)
        self._timer: Any = None
        self._soon: Any = None
        self._log = RateLimitedLog(log, self._clock(), interval=60.0)
        self._hooked = False
        #: Whether to register now (:class:`dledger_rocketmq.broker.membership.MemberRegistration` sets it: a new member
        #: waits for catch-up, a removed one withdraws); a closed gate unregisters a broker that was registered.
        self.gate: Callable[[], bool] = lambda: True
        self.registered = False  # REGISTER_BROKER sent and not withdrawn since
        self.on_stop: Callable[[], object] = lambda: None  # the gate's clean-up (its timers)

    def _clock(self) -> Any:
        return self.reactor or self.broker.server.clock

    # -- service ------------------------------------------------------------------------------
    def startService(self) -> None:
        super().startService()
        if not self._hooked:
            self._hooked = True
            self.broker.master_callbacks.append(self._role_changed)
            self.broker.slave_callbacks.append(self._role_changed)
            self.broker.meta.topics.listeners.append(self.register_soon)
        self.register_all()

    def stopService(self) -> defer.Deferred:
        """Graceful stop: UNREGISTER_BROKER everywhere (bounded by ``timeout``), then close; a crash just closes."""
        super().stopService()
        for timer in (self._timer, self._soon):
            if timer is not None and timer.active():
                timer.cancel()
        self._timer = self._soon = None
        self.on_stop()
        self.fetcher.stop()
        server = self.broker.server
        if not getattr(server, "running", True):  # crash(): a killed process says no goodbye
            self._close_all(abort=True)
            return defer.succeed(None)
        return self.unregister_all().addBoth(lambda _: self._close_all())

    def unregister_all(self) -> defer.Deferred:
        """UNREGISTER_BROKER to every name server this member is connected to (bounded by ``timeout``)."""
        self.registered = False
        b = self.broker
        ext = unregister_ext(cluster=b.options.cluster_name, broker_name=b.options.broker_name,
                             broker_addr=b.options.store_host, broker_id=b.broker_id)
        sends = []
        for addr, c in self.clients.items():
            if c is not None and c.connected:
                d = c.request(UNREGISTER_BROKER, ext)
                d.addErrback(lambda f, a=addr: log.info("UNREGISTER_BROKER to {a} failed: {e}", a=a,
                                                        e=f.getErrorMessage()))
                sends.append(d)
        return defer.DeferredList(sends)

    def _close_all(self, *, abort: bool = False) -> None:
        clients, self.clients = self.clients, {}
        for c in clients.values():
            if c is None or c.protocol is None or c.protocol.transport is None:
                continue
            if abort and hasattr(c.protocol.transport, "abortConnection"):
                c.protocol.transport.abortConnection()
            else:
                c.close()

    # -- triggers ---------------------------------------------------------------------------
    def _role_changed(self, broker: Any) -> None:
        if self.running:
            self.register_all()

    def register_soon(self) -> None:
        """The topic table changed: register once this turn of the reactor is over (changes coalesce)."""
        if self.running and (self._soon is None or not self._soon.active()):
            self._soon = self._clock().callLater(0, self._register_soon)

    def _register_soon(self) -> None:
        self._soon = None
        if self.running:
            self.register_all()

    def _schedule(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        if not self.running:
            return
        delay = next_delay(is_master=self.broker.role == "MASTER", master_known=self.fetcher.known(),
                           period=self.period, retry=self.retry)
        self._timer = self._clock().callLater(delay, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.running:
            self.register_all()

    # -- registering ------------------------------------------------------------------------
    def request(self) -> tuple[dict[str, str], bytes]:
        """This broker's REGISTER_BROKER now (extFields, body)."""
        b = self.broker
        table = b.meta.topics.to_dict()
        return register_request(cluster=b.options.cluster_name, broker_name=b.options.broker_name,
                                broker_addr=b.options.store_host, broker_id=b.broker_id,
                                data_version=table["dataVersion"], topics=list(table["topicConfigTable"].values()),
                                compressed=self.compressed)

    def register_all(self) -> defer.Deferred:
        """REGISTER_BROKER to every name server now; fires when every answer (or failure) is in.

        With the gate closed nothing is sent and nothing scheduled (whoever closed it re-opens it by calling
        here), and a broker that was registered unregisters: a removed member stops its heartbeat.
        """
        if not self.gate():
            if self._timer is not None and self._timer.active():
                self._timer.cancel()
            self._timer = None
            return self.unregister_all() if self.registered else defer.succeed([])
        self.registered = True
        ext, body = self.request()
        tag = self.fetcher.current_tag()
        is_master = ext["brokerId"] == "0"
        sends = [self._register(addr, ext, body, tag, is_master) for addr in self.namesrv_addrs]
        self._schedule()
        return defer.DeferredList(sends)

    def _client(self, addr: str) -> defer.Deferred:
        """The connection to name server ``addr`` (made at first use, kept; a Deferred of the client)."""
        c = self.clients.get(addr)
        if c is not None and c.connected:
            return defer.succeed(c)
        a = parse_host(addr)

        def made(client: Any) -> Any:
            self.clients[addr] = client
            return client
        return connect_client(self._clock(), a.host, a.port, timeout=self.timeout,
                              credentials=self.credentials).addCallback(made)

    namesrv_client = _client

    def _register(self, addr: str, ext: dict[str, str], body: bytes, tag: Any, is_master: bool) -> defer.Deferred:
        d = self._client(addr)
        d.addCallback(lambda c: c.request(REGISTER_BROKER, ext, body))

        def answered(reply: Any) -> None:
            header, _ = reply
            if header.code != SUCCESS:
                self._log.warn(("refused", addr), "name server {a} refused the registration: code {c} {r}", a=addr,
                               c=header.code, r=header.remark)
                return
            self.registrations += 1
            if not is_master:
                master = (header.ext_fields or {}).get("masterAddr") or None
                if master == self.broker.options.store_host:
                    master = None  # ourselves, from before a step-down: not a master to copy from
                known = self.fetcher.known()
                self.fetcher.learned(master, tag)
                if self.fetcher.known() and not known and self.running:
                    self._schedule()  # back to the normal period

        def failed(f: Any) -> None:
            self._log.warn(("failed", addr), "registration with name server {a} failed: {e}", a=addr,
                           e=f.getErrorMessage())
        return d.addCallbacks(answered, failed)
