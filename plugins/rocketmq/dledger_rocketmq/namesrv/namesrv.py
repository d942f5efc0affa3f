"""A RocketMQ 4.x-compatible name server: ``twistd rocketmq-namesrv`` or a service inside a member.

Brokers register (REGISTER_BROKER 103, JSON or zlib-compressed body,
``bodyCrc32`` checked; QUERY_DATA_VERSION 322; UNREGISTER_BROKER 104) and
clients and ``mqadmin`` ask for routes (GET_ROUTEINFO_BY_TOPIC 105),
clusters (GET_BROKER_CLUSTER_INFO 106) and topics
(GET_ALL_TOPIC_LIST_FROM_NAMESERVER 206); mqadmin deleteTopic removes a topic's route
(DELETE_TOPIC_IN_NAMESRV 216, an admin code with ACL); any other code is answered
REQUEST_CODE_NOT_SUPPORTED.  The decisions and the table are
:mod:`dledger_rocketmq.namesrv.routes`; this module moves frames (the broker port's
protocol and header codec, :mod:`dledger_rocketmq.broker.port`) and time: a broker
is removed the moment its connection closes, and after ``expiry`` (120 s)
without a registration otherwise (checked every ``scan_interval``, 10 s,
on the injected IReactorTime).

Run it::

    twistd -n rocketmq-namesrv --listen tcp:9876:interface=127.0.0.1

or inside a member with the plugin option ``rocketmq.namesrvListen``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from twisted.application import service
from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python import usage
from twisted.python.failure import Failure

from dledger.ratelog import RateLimitedLog
from dledger.transport.listener import ListenerGuard, ListenerLimits
from dledger.transport.remoting import Header
from dledger_rocketmq.broker.port import (
    FAQ,
    SUCCESS,
    SYSTEM_ERROR,
    TOPIC_NOT_EXIST,
    ArgumentError,
    BrokerPortFactory,
    Reply,
    Request,
    ext_bool,
    ext_int,
    ext_str,
    unsupported_reply,
)
from dledger_rocketmq.namesrv import routes

log = Logger(namespace="dledger_rocketmq.namesrv.namesrv")

REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
GET_ROUTEINFO_BY_TOPIC = 105
GET_BROKER_CLUSTER_INFO = 106
GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
DELETE_TOPIC_IN_NAMESRV = 216
QUERY_DATA_VERSION = 322

DEFAULT_LISTEN = "tcp:9876"
SCAN_INTERVAL = 10.0
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024


def topic_not_exist(topic: str) -> Reply:
    """The name server's answer for a topic without a route (remark as RocketMQ's, FAQ link included)."""
    return Reply(TOPIC_NOT_EXIST, f"No topic route info in name server for the topic: {topic}{FAQ}")


def register_reply(result: routes.RegisterResult) -> Reply:
    """REGISTER_BROKER's answer: ``{}`` for a master; a slave's carries masterAddr and haServerAddr when known."""
    ext = {}
    if result.master_addr is not None:
        ext = {"haServerAddr": result.ha_server_addr or "", "masterAddr": result.master_addr}
    return Reply(SUCCESS, None, ext)


class NameServer(service.Service):
    """The name server's endpoint and table (see the module docstring).

    It has what :class:`~dledger_rocketmq.broker.port.BrokerPortProtocol` needs of
    a port (``max_frame_size``, ``connections``, ``connection_lost_callbacks``,
    ``handle``), so the broker port's framing and header codec serve it too.
    """

    name = "rocketmq-namesrv"

    def __init__(self, endpoint: str = DEFAULT_LISTEN, *, reactor: Any = None, clock: Any = None,
                 max_frame_size: int = DEFAULT_MAX_FRAME_SIZE, expiry: float = routes.BROKER_EXPIRY,
                 scan_interval: float = SCAN_INTERVAL, acl: Callable[[], Any] | None = None,
                 limits: ListenerLimits | None = None, tls_options: Any = None):
        if reactor is None:
            from twisted.internet import reactor as default_reactor

            reactor = default_reactor
        self.endpoint = endpoint
        self.reactor = reactor
        self.clock = clock if clock is not None else reactor
        self.max_frame_size = max_frame_size
        self.expiry = expiry
        self.scan_interval = scan_interval
        self.table = routes.RouteTable()
        #: ``acl() -> AclConfig`` (RocketMQ ACL: every request signed by a known account; registrations by an
        #: admin one), or None: anyone may register and read (RocketMQ's name server has no ACL).
        self.acl = acl
        self._refusal_log = RateLimitedLog(log, self.clock)
        self.factory = BrokerPortFactory(self)
        #: dledger's connection guard for the port (caps, descriptor budget, timeouts, rate-limited lines).
        self.limits = limits if limits is not None else ListenerLimits()
        self.tls_options = tls_options
        self.listener_guard: ListenerGuard | None = None
        self.connections: set = set()
        self.connection_lost_callbacks: list[Callable[[Any], None]] = [self._connection_lost]
        self.listening_port = None
        #: Fires with the listening port once bound (or fails).
        self.listening: Deferred = Deferred()
        self._scan_timer = None
        self.handlers: dict[int, Callable[[Request], Reply]] = {
            REGISTER_BROKER: self._register, UNREGISTER_BROKER: self._unregister,
            GET_ROUTEINFO_BY_TOPIC: self._route, GET_BROKER_CLUSTER_INFO: self._cluster_info,
            GET_ALL_TOPIC_LIST_FROM_NAMESERVER: self._topic_list, QUERY_DATA_VERSION: self._query_data_version,
            DELETE_TOPIC_IN_NAMESRV: self._delete_topic,
        }

    # -- service ------------------------------------------------------------------------------
    def startService(self) -> None:
        """Listen (a bind that fails at once raises: the start fails with one line) and start the expiry scan."""
        outcome: list = []
        self.listener_guard = ListenerGuard("name server", self.limits, self.clock)
        self.listener_guard.listen(self.reactor, self.endpoint, self.factory, self.tls_options).addBoth(
            outcome.append)
        if outcome and isinstance(outcome[0], Failure):
            self.listening.errback(outcome[0])
            self.listening.addErrback(lambda _: None)
            outcome[0].raiseException()
        super().startService()
        if outcome:
            self._bound(outcome[0])
        else:  # an endpoint that binds later
            self.listening.addErrback(lambda f: log.error("name server: cannot listen on {ep}: {err}",
                                                          ep=self.endpoint, err=f.getErrorMessage()))
        self._schedule_scan()

    def _bound(self, port: Any) -> None:
        self.listening_port = port
        host = port.getHost()
        log.info("RocketMQ name server on {host}:{port}", host=host.host, port=host.port)
        self.listening.callback(port)

    def stopService(self) -> Deferred | None:
        super().stopService()
        if self._scan_timer is not None and self._scan_timer.active():
            self._scan_timer.cancel()
        self._scan_timer = None
        for conn in list(self.connections):
            conn.closed = True
            conn.transport.loseConnection()
        if self.listener_guard is not None:
            self.listener_guard.stop()
        port, self.listening_port = self.listening_port, None
        return maybeDeferred(port.stopListening) if port is not None else None

    # -- time ---------------------------------------------------------------------------------
    def _schedule_scan(self) -> None:
        self._scan_timer = self.clock.callLater(self.scan_interval, self._scan)

    def _scan(self) -> None:
        self._scan_timer = None
        if not self.running:
            return
        self.scan()
        self._schedule_scan()

    def scan(self) -> list[str]:
        """Drop brokers silent for more than ``expiry`` and close their connections; the addresses dropped."""
        dropped = self.table.expire(self.clock.seconds(), self.expiry)
        for addr, conn in dropped:
            log.warn("name server: broker {addr} expired ({s:g} s without a registration)", addr=addr, s=self.expiry)
            transport = getattr(conn, "transport", None)
            if transport is not None:
                transport.loseConnection()
        return [addr for addr, _ in dropped]

    def _connection_lost(self, conn: Any) -> None:
        for addr in self.table.connection_closed(conn):
            log.info("name server: broker {addr} removed (its connection closed)", addr=addr)

    # -- dispatch -------------------------------------------------------------------------------
    def handle(self, conn: Any, header: Header, body: bytes) -> None:
        """Answer one request frame (responses are ignored: the name server sends no requests)."""
        if header.is_response:
            return
        try:
            reply = self.process(Request(header.code, header.ext_fields or {}, body, conn, header))
        except (ArgumentError, routes.RegisterBodyError) as exc:
            reply = Reply(SYSTEM_ERROR, str(exc))
        except Exception as exc:  # a bug must not leave the client waiting: answer and log
            log.failure("name server: request {code} failed", code=header.code)
            reply = Reply(SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        conn.answer(header, reply)

    def process(self, request: Request) -> Reply:
        if self.acl is not None:
            refused = self.refuse(request)
            if refused is not None:
                return refused
        handler = self.handlers.get(request.code)
        if handler is None:
            return unsupported_reply(request.code)
        return handler(request)

    def refuse(self, request: Request) -> Reply | None:
        """The ACL's answer to a request (None: go on); routes are changed only by admin accounts."""
        from dledger_rocketmq.common import acl

        host = request.conn.born_host.host if request.conn is not None else None
        refusal = acl.decide(self.acl() or acl.AclConfig({}), request.code, request.ext, request.body, host,
                             admin_codes=acl.NAMESRV_ADMIN_CODES, resources=False)
        if refusal is None:
            return None
        self._refusal_log.warn(("refused", host, request.code), "name server refused request {code} from {host}: "
                               "{why}", code=request.code, host=host, why=refusal.message)
        return Reply(SYSTEM_ERROR, refusal.remark)

    # -- handlers -------------------------------------------------------------------------------
    def _register(self, req: Request) -> Reply:
        ext = req.ext
        if not routes.crc_matches(ext_int(ext, "bodyCrc32", 0), req.body):
            return Reply(SYSTEM_ERROR, "crc32 not match")
        body = routes.decode_register_body(req.body, compressed=ext_bool(ext, "compressed"))
        addr, name, broker_id = ext_str(ext, "brokerAddr"), ext_str(ext, "brokerName"), ext_int(ext, "brokerId",
                                                                                              bits=64)
        before = self.table.masters(name)
        result = self.table.register(ext_str(ext, "clusterName"), addr, name, broker_id,
                                     ext.get("haServerAddr") or "", body, req.conn, self.clock.seconds())
        after = self.table.masters(name)
        if before != after:
            log.info("name server: master of {name} changed from {old} to {new}", name=name,
                     old=before[0] if before else None, new=after[0] if after else None)
        return register_reply(result)

    def _unregister(self, req: Request) -> Reply:
        ext = req.ext
        self.table.unregister(ext_str(ext, "clusterName"), ext_str(ext, "brokerAddr"), ext_str(ext, "brokerName"),
                              ext_int(ext, "brokerId", bits=64))
        log.info("name server: broker {addr} ({name}, id {id}) unregistered", addr=ext.get("brokerAddr"),
                 name=ext.get("brokerName"), id=ext.get("brokerId"))
        return Reply(SUCCESS)

    def _route(self, req: Request) -> Reply:
        topic = ext_str(req.ext, "topic")
        route = self.table.route(topic)
        if route is None:
            return topic_not_exist(topic)
        version = req.header.version if req.header is not None else routes.STANDARD_JSON_VERSION
        return Reply(SUCCESS, None, None, routes.route_body(route, version))

    def _cluster_info(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, None, routes.cluster_info_body(self.table.cluster_info()))

    def _topic_list(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, None, routes.topic_list_body(self.table.topic_list()))

    def _delete_topic(self, req: Request) -> Reply:
        topic = req.ext.get("topic")
        if not topic:
            return Reply(SYSTEM_ERROR, "the request lacks the field 'topic'")
        if self.table.delete_topic(topic):
            log.info("name server: topic {t} deleted (mqadmin)", t=topic)
        return Reply(SUCCESS)

    def _query_data_version(self, req: Request) -> Reply:
        version = routes.parse_data_version(req.body)
        changed, stored = self.table.query_data_version(ext_str(req.ext, "brokerAddr"), version,
                                                        self.clock.seconds())
        return Reply(SUCCESS, None, {"changed": "true" if changed else "false"},
                     routes.data_version_body(stored) if stored is not None else b"")


# -- twistd rocketmq-namesrv ---------------------------------------------------------------------------------

def check_listen(endpoint: str) -> str:
    """A server endpoint description that parses and can be bound now; ValueError with one line if not."""
    from twisted.internet import reactor
    from twisted.internet.defer import Deferred as _D

    from dledger.tap import listen_reason, probe_endpoint

    try:
        d: _D = probe_endpoint(reactor, endpoint)
    except (ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"--listen {endpoint!r} is not a server endpoint (e.g. tcp:9876:interface=127.0.0.1): "
                         f"{exc}") from None
    errors: list = []
    d.addErrback(errors.append)
    if errors:
        raise ValueError(f"cannot listen on {endpoint}: {listen_reason(errors[0].value)}")
    return endpoint


class Options(usage.Options):
    """``twistd rocketmq-namesrv`` options."""

    synopsis = "[--listen ENDPOINT] [--max-frame-size BYTES] [--acl-file plain_acl.yml]"
    longdesc = ("A RocketMQ 4.x-compatible name server: brokers (dledger's and Apache RocketMQ's) register, "
                "clients and mqadmin ask for routes.  A broker is dropped when its connection closes or after "
                "120 s without a registration.")
    optParameters = [
        ["listen", "l", DEFAULT_LISTEN, "server endpoint to listen on (RocketMQ's default port is 9876)"],
        ["max-frame-size", None, str(DEFAULT_MAX_FRAME_SIZE), "largest request frame in bytes (bigger: closed)"],
        ["acl-file", None, "", "RocketMQ ACL: a plain_acl.yml; every request must be signed by one of its accounts "
         "(AclClientRPCHook), registrations by an admin account (default: no ACL)"],
    ]

    def postOptions(self) -> None:
        try:
            self["max-frame-size"] = int(self["max-frame-size"])
            if self["max-frame-size"] <= 0:
                raise ValueError
        except ValueError:
            raise usage.UsageError(f"--max-frame-size must be a positive integer, got {self['max-frame-size']!r}"
                                   ) from None
        try:
            check_listen(self["listen"])
        except ValueError as exc:
            raise usage.UsageError(str(exc)) from None
        self["acl"] = None
        if self["acl-file"]:
            from dledger_rocketmq.common.acl import AclConfigError, load_acl_file

            try:
                self["acl"] = load_acl_file(self["acl-file"])
            except AclConfigError as exc:
                raise usage.UsageError(f"--acl-file: {exc}") from None


class _Top(service.MultiService):
    """twistd's top service: a bind that fails at start ends the process with one line and status 1."""

    def __init__(self, namesrv: NameServer):
        super().__init__()
        self.namesrv = namesrv
        namesrv.setServiceParent(self)

    def startService(self) -> None:
        try:
            super().startService()
        except Exception as exc:
            from dledger.tap import listen_reason

            log.error("name server: cannot listen on {ep}: {err}", ep=self.namesrv.endpoint, err=listen_reason(exc))
            reactor = self.namesrv.reactor
            reactor.addSystemEventTrigger("after", "shutdown", lambda: sys.exit(1))
            reactor.callWhenRunning(reactor.stop)


def makeService(options: Options) -> service.MultiService:
    """The ``twistd rocketmq-namesrv`` service."""
    config = options.get("acl")
    return _Top(NameServer(options["listen"], max_frame_size=options["max-frame-size"],
                           acl=(lambda: config) if config is not None else None))
