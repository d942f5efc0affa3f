"""A small Python client for the broker port (:mod:`dledger_rocketmq.broker.port`): Deferred and blocking forms.

    d = connect(reactor, "127.0.0.1", 10911)          # Deferred of a RocketMQClient
    d.addCallback(lambda c: c.send("T", b"hi", tags="A"))  # SendResult(msg_id, queue_id, queue_offset)

    with BlockingRocketMQClient("127.0.0.1", 10911) as c:
        r = c.send("T", b"hi")
        p = c.pull("g", "T", 0, 0, 32)                 # PullResult: code, messages, next_begin_offset, ...

It speaks RocketMQ remoting (JSON headers, SEND_MESSAGE_V2 field names) on one
connection, matching replies by ``opaque`` (requests time out after
``timeout`` seconds).  A reply with an error code fails the Deferred with
:class:`RocketMQError` (``code``, ``remark``); pulls that find nothing are
results (``PullResult.code`` 19/20/21), not errors.  No name server: it talks
to one broker port; a slave answers sends with SERVICE_NOT_AVAILABLE (14).
"""

from __future__ import annotations

import itertools
import json
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from twisted.internet import protocol
from twisted.internet.defer import Deferred, fail, maybeDeferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.endpoints import TCP4ClientEndpoint, TCP6ClientEndpoint

from dledger.transport.remoting import FLAG_ONEWAY, FrameError, FrameSplitter, Header
from dledger.transport.sockopts import set_no_delay
from dledger_rocketmq.broker.port import (
    GET_MAX_OFFSET,
    GET_MIN_OFFSET,
    PULL_MESSAGE,
    QUERY_CONSUMER_OFFSET,
    SEND_BATCH_MESSAGE,
    SEND_MESSAGE_V2,
    SUCCESS,
    SYSFLAG_SUBSCRIPTION,
    SYSFLAG_SUSPEND,
    UPDATE_CONSUMER_OFFSET,
    VERSION,
    decode_header,
    encode_command,
)
from dledger_rocketmq.common.batch import BatchItem, encode_batch
from dledger_rocketmq.common.message import MessageRecord, decode_record, encode_properties

_I32 = struct.Struct(">i")


class RocketMQError(Exception):
    """The broker answered with an error code (or the request failed / timed out: code -1)."""

    def __init__(self, code: int, remark: str | None):
        super().__init__(f"code {code}: {remark or 'no remark'}")
        self.code = code
        self.remark = remark


@dataclass(frozen=True)
class SendResult:
    msg_id: str  # offsetMsgId (comma-separated for a batch)
    queue_id: int
    queue_offset: int


@dataclass(frozen=True)
class PullResult:
    code: int  # 0 FOUND, 19 PULL_NOT_FOUND, 20 PULL_RETRY_IMMEDIATELY, 21 PULL_OFFSET_MOVED
    status: str  # the remark: FOUND, OFFSET_OVERFLOW_ONE, NO_MATCHED_MESSAGE, ...
    next_begin_offset: int
    min_offset: int
    max_offset: int
    suggest_broker_id: int
    messages: list[MessageRecord]


def split_records(body: bytes) -> list[MessageRecord]:
    """The CommitLog records of a PULL body, in order."""
    out, pos = [], 0
    while pos + 4 <= len(body):
        size = _I32.unpack_from(body, pos)[0]
        if size <= 0 or pos + size > len(body):
            raise RocketMQError(-1, f"malformed pull body at byte {pos}")
        out.append(decode_record(body, pos))
        pos += size
    return out


def message_properties(tags: str | None = None, keys: str | Sequence[str] | None = None,
                       properties: dict[str, str] | None = None) -> str:
    """A property string with TAGS / KEYS (keys joined by spaces, as Java) and any others."""
    props = dict(properties or {})
    if tags:
        props["TAGS"] = tags
    if keys:
        props["KEYS"] = keys if isinstance(keys, str) else " ".join(keys)
    return encode_properties(props).decode("utf-8") if props else ""


class _ClientProtocol(protocol.Protocol):
    def __init__(self, client: RocketMQClient):
        self.client = client
        self.splitter = FrameSplitter(client.max_frame_size, header_decoder=decode_header)

    def connectionMade(self):
        set_no_delay(self.transport)  # as RocketMQ's NettyRemotingClient: a request never waits for an ACK

    def dataReceived(self, data: bytes):
        try:
            for frame in self.splitter.feed(data):
                self.client._reply(frame.header, frame.body)
        except FrameError as exc:
            self.client._fail_all(RocketMQError(-1, f"bad frame from the broker: {exc}"))
            self.transport.loseConnection()

    def connectionLost(self, reason=None):
        self.connected = 0  # RocketMQClient.connected: a cached client is replaced, not reused
        if self.client.protocol is self:  # later requests fail at once instead of waiting for their timeout
            self.client.protocol = None
        self.client._fail_all(RocketMQError(-1, "connection lost"))


class RocketMQClient:
    """Requests to one broker port over one connection (made by :func:`connect`)."""

    def __init__(self, reactor: Any, *, timeout: float = 10.0, producer_group: str = "dledger_producer",
                 max_frame_size: int = 16 * 1024 * 1024, default_topic_queue_nums: int = 4,
                 credentials: Any = None):
        self.reactor = reactor
        #: A :class:`dledger_rocketmq.common.acl.Credentials`: every request is signed as AclClientRPCHook signs it
        #: (brokers with RocketMQ ACL); None: unsigned.
        self.credentials = credentials
        self.timeout = timeout
        self.producer_group = producer_group
        self.max_frame_size = max_frame_size
        #: Queues of a topic the broker auto-creates on this client's first send (defaultTopicQueueNums).
        self.default_topic_queue_nums = default_topic_queue_nums
        self.protocol: _ClientProtocol | None = None
        self._opaque = itertools.count(1)
        self._pending: dict[int, Deferred] = {}

    # -- plumbing -------------------------------------------------------------------------------
    @property
    def connected(self) -> bool:
        """True while the connection is up (a request now can be sent)."""
        return self.protocol is not None and self.protocol.transport is not None and bool(self.protocol.connected)

    def request(self, code: int, ext: dict[str, Any], body: bytes = b"", *, oneway: bool = False,
                timeout: float | None = None, signed: bool = True) -> Deferred:
        """Send a request; fires with (Header, body) of the reply (None for oneway); ``timeout`` overrides the
        client's for this request (a long-polling pull waits longer); ``signed=False`` sends ``ext`` as given
        (a relayed request keeps its client's signature)."""
        if self.protocol is None or self.protocol.transport is None:
            return fail(RocketMQError(-1, "not connected"))
        opaque = next(self._opaque)
        fields = {k: str(v) for k, v in ext.items() if v is not None}
        if self.credentials is not None and signed:
            fields = self.credentials.sign(fields, body)
        header = Header(code, opaque, FLAG_ONEWAY if oneway else 0, "JAVA", VERSION, None, fields)
        self.protocol.transport.write(encode_command(header, body))
        if oneway:
            return _fired(None)
        d = Deferred(lambda _: self._pending.pop(opaque, None))
        self._pending[opaque] = d
        limit = self.timeout if timeout is None else timeout
        d.addTimeout(limit, self.reactor)
        d.addErrback(self._timed_out, opaque, limit)
        return d

    def _timed_out(self, f, opaque, limit):
        self._pending.pop(opaque, None)
        if f.check(DeferredTimeout):
            raise RocketMQError(-1, f"no answer within {limit:g}s")
        return f

    def _reply(self, header: Header, body: bytes) -> None:
        """A response completes the request with its opaque; a request from the broker (e.g. the oneway
        NOTIFY_CONSUMER_IDS_CHANGED) has an opaque of the broker's own counter and must not touch ours."""
        if not header.is_response:
            return
        d = self._pending.pop(header.opaque, None)
        if d is not None:
            d.callback((header, body))

    def _fail_all(self, exc: Exception) -> None:
        pending, self._pending = self._pending, {}
        for d in pending.values():
            d.errback(exc)

    @staticmethod
    def _ok(reply) -> Header:
        header, _ = reply
        if header.code != SUCCESS:
            raise RocketMQError(header.code, header.remark)
        return header

    def close(self) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.loseConnection()

    # -- API ------------------------------------------------------------------------------------------
    def _send_ext(self, topic: str, queue_id: int, properties: str, batch: bool) -> dict[str, Any]:
        return {"a": self.producer_group, "b": topic, "c": "TBW102", "d": self.default_topic_queue_nums,
                "e": queue_id, "f": 0,
                "g": int(time.time() * 1000), "h": 0, "i": properties, "j": 0, "k": "false",
                "m": "true" if batch else "false"}

    def _send_result(self, reply) -> SendResult:
        ext = self._ok(reply).ext_fields or {}
        return SendResult(ext.get("msgId", ""), int(ext.get("queueId", -1)), int(ext.get("queueOffset", -1)))

    def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | Sequence[str] | None = None,
             queue_id: int = 0, properties: dict[str, str] | None = None, oneway: bool = False) -> Deferred:
        """SEND_MESSAGE_V2 of one message; fires with a :class:`SendResult` (None when ``oneway``)."""
        ext = self._send_ext(topic, queue_id, message_properties(tags, keys, properties), False)
        d = self.request(SEND_MESSAGE_V2, ext, body, oneway=oneway)
        return d if oneway else d.addCallback(self._send_result)

    def send_batch(self, topic: str, bodies: Sequence[bytes], *, tags: str | None = None, queue_id: int = 0
                   ) -> Deferred:
        """SEND_BATCH_MESSAGE; fires with a :class:`SendResult` (msg_id: comma-separated ids)."""
        props = message_properties(tags).encode("utf-8")
        return self.send_encoded_batch(topic, encode_batch([BatchItem(b, props) for b in bodies]), queue_id=queue_id)

    def send_encoded_batch(self, topic: str, body: bytes, *, queue_id: int = 0) -> Deferred:
        """SEND_BATCH_MESSAGE of a body already encoded with :func:`~dledger_rocketmq.common.batch.encode_batch` (a load
        generator sends one body many times); fires with a :class:`SendResult`."""
        return self.request(SEND_BATCH_MESSAGE, self._send_ext(topic, queue_id, "", True), body
                            ).addCallback(self._send_result)

    def pull(self, group: str, topic: str, queue_id: int, offset: int, max_nums: int = 32, *,
             subscription: str = "*", suspend: float = 0.0) -> Deferred:
        """PULL_MESSAGE; fires with a :class:`PullResult` (found or not).

        ``suspend`` > 0 (seconds): long polling; at the end of the queue the
        broker holds the pull until a message arrives or that time passes
        (the request then waits ``suspend`` + the client's timeout).
        """
        suspend_ms = int(suspend * 1000) if suspend > 0 else 0
        ext = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "queueOffset": offset,
               "maxMsgNums": max_nums, "sysFlag": SYSFLAG_SUBSCRIPTION | (SYSFLAG_SUSPEND if suspend_ms else 0),
               "commitOffset": 0, "suspendTimeoutMillis": suspend_ms, "subscription": subscription,
               "subVersion": 0, "expressionType": "TAG"}

        def result(reply):
            header, body = reply
            if header.code not in (0, 19, 20, 21):
                raise RocketMQError(header.code, header.remark)
            e = header.ext_fields or {}
            return PullResult(header.code, header.remark or "", int(e.get("nextBeginOffset", offset)),
                              int(e.get("minOffset", 0)), int(e.get("maxOffset", 0)),
                              int(e.get("suggestWhichBrokerId", 0)), split_records(body) if header.code == 0 else [])
        return self.request(PULL_MESSAGE, ext, timeout=self.timeout + suspend_ms / 1000.0).addCallback(result)

    def commit_offset(self, group: str, topic: str, queue_id: int, offset: int, *, oneway: bool = False
                      ) -> Deferred:
        """UPDATE_CONSUMER_OFFSET; fires (None) once the master stored it (at once when ``oneway``)."""
        ext = {"consumerGroup": group, "topic": topic, "queueId": queue_id, "commitOffset": offset}
        d = self.request(UPDATE_CONSUMER_OFFSET, ext, oneway=oneway)
        return d if oneway else d.addCallback(lambda r: self._ok(r) and None)

    def _offset(self, code: int, ext: dict[str, Any]) -> Deferred:
        return self.request(code, ext).addCallback(lambda r: int((self._ok(r).ext_fields or {})["offset"]))

    def query_offset(self, group: str, topic: str, queue_id: int) -> Deferred:
        """QUERY_CONSUMER_OFFSET: the group's stored offset (0 when none and the queue starts at 0)."""
        return self._offset(QUERY_CONSUMER_OFFSET, {"consumerGroup": group, "topic": topic, "queueId": queue_id})

    def max_offset(self, topic: str, queue_id: int) -> Deferred:
        return self._offset(GET_MAX_OFFSET, {"topic": topic, "queueId": queue_id})

    def min_offset(self, topic: str, queue_id: int) -> Deferred:
        return self._offset(GET_MIN_OFFSET, {"topic": topic, "queueId": queue_id})


def _fired(value: Any) -> Deferred:
    d: Deferred = Deferred()
    d.callback(value)
    return d


class _Factory(protocol.Factory):
    noisy = False

    def __init__(self, client: RocketMQClient):
        self.client = client

    def buildProtocol(self, addr):
        p = _ClientProtocol(self.client)
        self.client.protocol = p
        return p


def client_factory(client: RocketMQClient) -> protocol.Factory:
    """The protocol factory of ``client`` (for tests that connect it over an in-memory transport)."""
    return _Factory(client)


def connect(reactor: Any, host: str, port: int, *, timeout: float = 10.0, tls_options: Any = None,
            **kw: Any) -> Deferred:
    """Connect to a broker port; fires with a :class:`RocketMQClient`.

    ``credentials`` (:class:`dledger_rocketmq.common.acl.Credentials`) signs every
    request (RocketMQ ACL); ``tls_options`` (:func:`tls_options`) speaks TLS
    (a broker port with ``ssl:`` or ``rocketmq.tlsClientAuth``).
    """
    client = RocketMQClient(reactor, timeout=timeout, **kw)
    ep_class = TCP6ClientEndpoint if ":" in host else TCP4ClientEndpoint
    endpoint = ep_class(reactor, host, port, timeout=timeout)
    if tls_options is not None:
        from dledger.security.tls import wrap_client_endpoint

        endpoint = wrap_client_endpoint(tls_options, endpoint)
    d = endpoint.connect(_Factory(client))
    return d.addCallback(lambda _: client)


def tls_options(tls_ca: str, tls_cert: str | None = None, tls_key: str | None = None) -> Any:
    """TLS options for :func:`connect`: the broker's certificate must chain to ``tls_ca``; a client certificate
    (the group CA's, e.g. from ``dledger certs init --clients``) proves a role to ``rocketmq.tlsClientAuth``."""
    from dledger.security import tls

    private = tls.load_private_certificate(tls_cert, tls_key or "") if tls_cert else None
    return tls.client_options(private, tls.load_ca_certs(tls_ca))


class BlockingRocketMQClient:
    """Blocking calls on a private reactor thread (:class:`dledger.blocking.ReactorThread`, as
    :class:`dledger.blocking.BlockingClient`)."""

    def __init__(self, host: str, port: int, *, timeout: float = 10.0, **kw: Any):
        from dledger.blocking import ReactorThread

        self.timeout = timeout
        self._thread = ReactorThread("rocketmq-blocking-client")
        self._closed = False
        try:
            self.client: RocketMQClient = self._call(lambda: connect(self._thread.reactor, host, port,
                                                                     timeout=timeout, **kw))
        except BaseException:
            self._stop()
            raise

    def _call(self, fn, timeout: float | None = None) -> Any:
        if self._closed:
            raise RocketMQError(-1, "client is closed")
        limit = self.timeout if timeout is None else timeout
        try:
            return self._thread.call(fn, limit + 1)
        except DeferredTimeout:
            raise RocketMQError(-1, f"no answer within {limit:g}s") from None

    def send(self, topic, body, **kw) -> SendResult:
        return self._call(lambda: self.client.send(topic, body, **kw))

    def send_batch(self, topic, bodies, **kw) -> SendResult:
        return self._call(lambda: self.client.send_batch(topic, bodies, **kw))

    def pull(self, group, topic, queue_id, offset, max_nums=32, **kw) -> PullResult:
        return self._call(lambda: self.client.pull(group, topic, queue_id, offset, max_nums, **kw),
                          timeout=self.timeout + float(kw.get("suspend", 0.0) or 0.0))

    def commit_offset(self, group, topic, queue_id, offset, **kw) -> None:
        return self._call(lambda: self.client.commit_offset(group, topic, queue_id, offset, **kw))

    def query_offset(self, group, topic, queue_id) -> int:
        return self._call(lambda: self.client.query_offset(group, topic, queue_id))

    def max_offset(self, topic, queue_id) -> int:
        return self._call(lambda: self.client.max_offset(topic, queue_id))

    def min_offset(self, topic, queue_id) -> int:
        return self._call(lambda: self.client.min_offset(topic, queue_id))

    def _stop(self) -> None:
        self._closed = True
        self._thread.stop()

    def close(self) -> None:
        if self._closed:
            return
        try:
            self._thread.call(self.client.close)
        finally:
            self._stop()

    def __enter__(self) -> BlockingRocketMQClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- route-aware client: name servers, several broker groups ------------------------------------------------------

GET_ROUTEINFO_BY_TOPIC = 105
TOPIC_NOT_EXIST = 17
DEFAULT_TOPIC = "TBW102"
DEFAULT_TOPIC_QUEUE_NUMS = 4


def route_masters(route: dict[str, Any]) -> dict[str, str]:
    """brokerName -> the master's address (brokerId 0) of a TopicRouteData; groups without a master left out."""
    out = {}
    for data in route.get("brokerDatas", []):
        addrs = {str(k): v for k, v in (data.get("brokerAddrs") or {}).items()}
        if "0" in addrs:
            out[data["brokerName"]] = addrs["0"]
    return out


def message_queues(route: dict[str, Any], *, write: bool = True, max_queues: int | None = None
                   ) -> list[tuple[str, int]]:
    """The (brokerName, queueId) a producer may send to (``write``) or a consumer reads, in a stable order.

    Only groups whose route names a master and whose queue data allows it
    (perm bit 2 write, 4 read); ``max_queues`` caps the queues per group (the
    default topic's route is used with at most defaultTopicQueueNums, as Java).
    """
    masters = route_masters(route)
    out = []
    for q in sorted(route.get("queueDatas", []), key=lambda q: q["brokerName"]):
        if q["brokerName"] not in masters or not int(q.get("perm", 6)) & (2 if write else 4):
            continue
        n = int(q["writeQueueNums"] if write else q["readQueueNums"])
        if max_queues is not None:
            n = min(n, max_queues)
        out.extend((q["brokerName"], i) for i in range(n))
    return out


@dataclass(frozen=True)
class RoutedSendResult:
    """A send through the routes: where it went and what the broker answered."""

    broker_name: str
    msg_id: str
    queue_id: int
    queue_offset: int


class RouteClient:
    """A producer/consumer that finds brokers through RocketMQ name servers (Deferreds).

        rc = RouteClient(reactor, "127.0.0.1:9876")
        r = yield rc.send("T", b"hi")          # RoutedSendResult: broker_name, msg_id, queue_id, queue_offset
        p = yield rc.pull("g", "T", r.broker_name, r.queue_id, 0)

    Sends go round-robin over every writable queue of every group with a
    master (a topic unknown to the name servers is sent through the default
    topic's route and auto-created by the broker, as the Java producer does);
    a send that fails on one group (no connection, a slave's 14) refreshes
    the route and goes to the next queue, up to ``retries`` times.  Pulls go
    to the group's master.  Routes are cached for ``route_ttl`` seconds.
    """

    def __init__(self, reactor: Any, namesrv_addrs: str | Sequence[str], *, timeout: float = 10.0,
                 retries: int = 2, route_ttl: float = 30.0, connect_fn: Any = None, credentials: Any = None,
                 tls_options: Any = None):
        self.reactor = reactor
        #: What every connection (name servers and brokers) gets: signing (RocketMQ ACL) and TLS options.
        self.client_kw: dict[str, Any] = {k: v for k, v in (("credentials", credentials),
                                                            ("tls_options", tls_options)) if v is not None}
        addrs = namesrv_addrs.split(";") if isinstance(namesrv_addrs, str) else list(namesrv_addrs)
        self.namesrv_addrs = [a.strip() for a in addrs if a.strip()]
        if not self.namesrv_addrs:
            raise ValueError("no name server address")
        self.timeout = timeout
        self.retries = retries
        self.route_ttl = route_ttl
        self._connect = connect_fn or connect
        self._clients: dict[str, RocketMQClient] = {}
        self._routes: dict[str, tuple[float, dict[str, Any]]] = {}
        self._next = itertools.count()

    def _client(self, addr: str) -> Deferred:
        c = self._clients.get(addr)
        if c is not None and c.connected:
            return _fired(c)
        host, _, port = addr.rpartition(":")

        def made(client: RocketMQClient) -> RocketMQClient:
            self._clients[addr] = client
            return client
        d = maybeDeferred(self._connect, self.reactor, host.strip("[]"), int(port), timeout=self.timeout,
                          **self.client_kw)
        return d.addCallback(made)

    def _ask_namesrv(self, topic: str, index: int = 0) -> Deferred:
        addr = self.namesrv_addrs[index % len(self.namesrv_addrs)]
        d = self._client(addr).addCallback(lambda c: c.request(GET_ROUTEINFO_BY_TOPIC, {"topic": topic}))

        def answered(reply: Any) -> dict[str, Any]:
            header, body = reply
            if header.code != SUCCESS:
                raise RocketMQError(header.code, header.remark)
            return json.loads(body)

        def failed(f: Any) -> Any:
            if f.check(RocketMQError) and f.value.code == TOPIC_NOT_EXIST:
                return f
            if index + 1 < len(self.namesrv_addrs):
                return self._ask_namesrv(topic, index + 1)
            return f
        return d.addCallback(answered).addErrback(failed)

    def route(self, topic: str, *, fresh: bool = False) -> Deferred:
        """The topic's TopicRouteData (standard JSON parsed; cached); RocketMQError 17 if no route."""
        cached = self._routes.get(topic)
        if cached is not None and not fresh and self.reactor.seconds() - cached[0] < self.route_ttl:
            return _fired(cached[1])

        def keep(route: dict[str, Any]) -> dict[str, Any]:
            self._routes[topic] = (self.reactor.seconds(), route)
            return route
        return self._ask_namesrv(topic).addCallback(keep)

    def _send_route(self, topic: str, fresh: bool, broker_name: str | None = None) -> Deferred:
        """(route, max queues): the topic's, or the default topic's for a topic not created (on that group) yet."""
        def default(f: Any = None) -> Any:
            if f is not None:
                f.trap(RocketMQError)
                if f.value.code != TOPIC_NOT_EXIST:
                    return f
            return self.route(DEFAULT_TOPIC, fresh=fresh).addCallback(lambda r: (r, DEFAULT_TOPIC_QUEUE_NUMS))

        def found(route: dict[str, Any]) -> Any:
            if broker_name is not None and broker_name not in route_masters(route):
                return default()
            return route, None
        return self.route(topic, fresh=fresh).addCallback(found).addErrback(default)

    def send(self, topic: str, body: bytes, *, tags: str | None = None, keys: str | Sequence[str] | None = None,
             broker_name: str | None = None) -> Deferred:
        """Send one message to the next queue of the topic's route; fires with a :class:`RoutedSendResult`.

        ``broker_name`` sends to that group only (through the default topic's
        route if the topic does not exist there yet: the broker creates it, as
        a first send does; how a topic gets onto every group without an admin
        command).
        """
        def attempt(n: int, fresh: bool) -> Deferred:
            def go(found: Any) -> Deferred:
                route, cap = found
                queues = [q for q in message_queues(route, max_queues=cap)
                          if broker_name is None or q[0] == broker_name]
                if not queues:
                    raise RocketMQError(TOPIC_NOT_EXIST, f"no writable queue with a master for {topic}")
                name, queue_id = queues[next(self._next) % len(queues)]
                addr = route_masters(route)[name]
                d = self._client(addr).addCallback(lambda c: c.send(topic, body, tags=tags, keys=keys,
                                                                   queue_id=queue_id))
                return d.addCallback(lambda r: RoutedSendResult(name, r.msg_id, r.queue_id, r.queue_offset))

            def retry(f: Any) -> Any:
                if n >= self.retries or (f.check(RocketMQError) and f.value.code == TOPIC_NOT_EXIST):
                    return f
                return attempt(n + 1, True)
            return self._send_route(topic, fresh, broker_name).addCallback(go).addErrback(retry)
        return attempt(0, False)

    def pull(self, group: str, topic: str, broker_name: str, queue_id: int, offset: int, max_nums: int = 32
             ) -> Deferred:
        """PULL_MESSAGE from ``broker_name``'s master; fires with a :class:`PullResult`."""
        def go(route: dict[str, Any]) -> Deferred:
            addr = route_masters(route).get(broker_name)
            if addr is None:
                raise RocketMQError(14, f"no master for {broker_name} in the route of {topic}")
            return self._client(addr).addCallback(lambda c: c.pull(group, topic, queue_id, offset, max_nums))
        return self.route(topic).addCallback(go)

    def close(self) -> None:
        clients, self._clients = self._clients, {}
        for c in clients.values():
            c.close()
