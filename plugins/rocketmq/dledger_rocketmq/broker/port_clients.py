"""Broker-port extension: client sessions, long polling, ordered-consumer locks and send-back.

Installed on every :class:`~dledger_rocketmq.broker.port.BrokerPort` (one line in
``port.EXTENSIONS``), it answers HEART_BEAT (34), UNREGISTER_CLIENT (35),
CONSUMER_SEND_MSG_BACK (36), END_TRANSACTION (37, refused: no transactional
messages), GET_CONSUMER_LIST_BY_GROUP (38), LOCK_BATCH_MQ (41),
UNLOCK_BATCH_MQ (42), GET_CONSUMER_CONNECTION_LIST (203) and
GET_CONSUMER_RUNNING_INFO (307, forwarded to the client and its answer
passed back), sends
NOTIFY_CONSUMER_IDS_CHANGED (40, oneway) to every member of a consumer
group whose members or subscriptions changed, and replaces the
PULL_MESSAGE handler with one that checks a push consumer's pull against
the group's subscription (as stored from its heartbeats; tag filtering on
the broker) and holds pulls with the SUSPEND flag that find nothing
(:mod:`~dledger_rocketmq.broker.longpoll`).

The state (:class:`ClientSessions`, ``port.sessions``) is per port and in
memory, as in RocketMQ: clients heartbeat every 30 s, so a restarted or new
master learns them again within that time.  Decisions live in
:mod:`~dledger_rocketmq.broker.clients`, :mod:`~dledger_rocketmq.broker.longpoll` and
:mod:`~dledger_rocketmq.broker.retry`; this module moves frames and time.
"""

from __future__ import annotations

import itertools
from typing import Any

from twisted.internet.defer import Deferred, gatherResults, succeed
from twisted.logger import Logger

from dledger.errors import DLedgerError
from dledger.transport.remoting import FLAG_ONEWAY, Header
from dledger_rocketmq.broker.clients import (
    CONSUMER_NOT_ONLINE,
    NO_PERMISSION,
    ClientRegistry,
    consumer_list_reply,
    parse_heartbeat,
    pull_subscription_check,
)
from dledger_rocketmq.broker.longpoll import PullHolds, hold_seconds, should_hold
from dledger_rocketmq.broker.port import (
    PULL_MESSAGE,
    PULL_NOT_FOUND,
    SEND_BATCH_MESSAGE,
    SEND_EXTRA,
    SEND_MESSAGE,
    SEND_MESSAGE_V2,
    SUCCESS,
    SYSFLAG_SUBSCRIPTION,
    SYSFLAG_SUSPEND,
    SYSTEM_ERROR,
    VERSION,
    Reply,
    Request,
    encode_command,
    ext_str,
    pull_args,
    subscription_codes,
)
from dledger_rocketmq.broker.retry import (
    DEFAULT_MAX_RECONSUME_TIMES,
    LockTable,
    max_reconsume_times,
    mq_json,
    parse_lock_body,
    retry_topic,
    send_back,
    send_back_args,
)
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.errors import CodecError
from dledger_rocketmq.common.message import TRANSACTION_PREPARED_TYPE, TRANSACTION_TYPE_MASK, decode_record, peek_record
from dledger_rocketmq.store.metadata import PERM_READ, PERM_WRITE, subscription_group_config, topic_config

log = Logger()

HEART_BEAT = 34
UNREGISTER_CLIENT = 35
CONSUMER_SEND_MSG_BACK = 36
END_TRANSACTION = 37
GET_CONSUMER_LIST_BY_GROUP = 38
NOTIFY_CONSUMER_IDS_CHANGED = 40
LOCK_BATCH_MQ = 41
UNLOCK_BATCH_MQ = 42
GET_CONSUMER_CONNECTION_LIST = 203
GET_CONSUMER_RUNNING_INFO = 307
CONSUME_MSG_TIMEOUT = 207
#: How long the broker waits for a client's answer to a forwarded request (RocketMQ's callClient: 10 s).
CALL_CLIENT_TIMEOUT = 10.0
TRANSACTION_REMARK = ("transactional messages are not supported by this broker (dledger): request code {code} "
                      "refused; send ordinary messages")


class ClientSessions:
    """The per-port state and handlers (see the module docstring); ``port.sessions``."""

    def __init__(self, port):
        self.port = port
        self.broker = port.broker
        self.clock = port.broker.server.clock
        self.registry = ClientRegistry()
        self.holds = PullHolds(self.clock)
        self.locks = LockTable()
        self._expiry: dict[Any, Any] = {}  # channel -> IDelayedCall (its heartbeat deadline)
        self._opaque = itertools.count(1)
        self.notified = 0
        self._calls: dict[tuple[Any, int], Deferred] = {}  # (channel, opaque) -> the client's answer

    # -- time and frames ----------------------------------------------------------------------
    def now_ms(self) -> int:
        return int(self.clock.seconds() * 1000)

    def notify_group(self, group: str) -> None:
        """NOTIFY_CONSUMER_IDS_CHANGED (oneway) to every member of ``group`` over its own connection."""
        for conn in self.registry.consumer_channels(group):
            transport = getattr(conn, "transport", None)
            if transport is None or getattr(conn, "closed", False):
                continue
            header = Header(NOTIFY_CONSUMER_IDS_CHANGED, next(self._opaque), FLAG_ONEWAY, "JAVA", VERSION, None,
                            {"consumerGroup": group}, "JSON")
            transport.write(encode_command(header))
            self.notified += 1

    def call_client(self, conn: Any, code: int, ext: dict[str, str], body: bytes = b"",
                    timeout: float = CALL_CLIENT_TIMEOUT) -> Deferred:
        """Send a two-way request to a client over its connection; fires with (Header, body) of its answer,
        fails with TimeoutError after ``timeout`` or ConnectionError if the connection closes first."""
        opaque = next(self._opaque)
        key = (conn, opaque)
        d = Deferred(lambda _: self._calls.pop(key, None))
        self._calls[key] = d
        timer = self.clock.callLater(timeout, self._call_timed_out, key, timeout)
        d.addBoth(lambda r: (timer.cancel() if timer.active() else None, r)[1])
        conn.transport.write(encode_command(Header(code, opaque, 0, "JAVA", VERSION, None, ext, "JSON"), body))
        return d

    def _call_timed_out(self, key, timeout: float) -> None:
        d = self._calls.pop(key, None)
        if d is not None and not d.called:
            d.errback(TimeoutError(f"no answer within {timeout:g} s"))

    def response_received(self, conn: Any, header: Header, body: bytes) -> None:
        """A client's response: completes the matching :meth:`call_client` (late or unknown ones are dropped)."""
        d = self._calls.pop((conn, header.opaque), None)
        if d is not None and not d.called:
            d.callback((header, body))

    def _fail_calls(self, conn: Any = None) -> None:
        for key in [k for k in self._calls if conn is None or k[0] is conn]:
            d = self._calls.pop(key)
            if not d.called:
                d.errback(ConnectionError("the client's connection closed"))

    def _changed(self, groups: list[str]) -> None:
        for group in groups:
            self.notify_group(group)

    def _touch(self, conn: Any) -> None:
        """(Re)arm the channel's expiry: 120 s after this heartbeat, unless another comes."""
        timer = self._expiry.get(conn)
        delay = self.registry.expired_ms / 1000.0
        if timer is not None and timer.active():
            timer.reset(delay)
        else:
            self._expiry[conn] = self.clock.callLater(delay, self._expire, conn)

    def _expire(self, conn: Any) -> None:
        """A channel's deadline passed: drop it from every group (as RocketMQ's scanNotActiveChannel) and close it."""
        self._expiry.pop(conn, None)
        now = self.now_ms()
        if conn not in self.registry.expired(now):
            last = self.registry.last_heartbeat_ms(conn)
            if last is not None:  # still registered (the clock rounded the other way): check again when due
                left = max(last + self.registry.expired_ms - now, 1)
                self._expiry[conn] = self.clock.callLater(left / 1000.0, self._expire, conn)
            return
        log.info("rocketmq port: client {c} sent no heartbeat for {s:g} s; dropping it",
                 c=str(getattr(conn, "born_host", conn)), s=self.registry.expired_ms / 1000.0)
        self._changed(self.registry.channel_closed(conn))
        self.holds.drop_connection(conn)
        transport = getattr(conn, "transport", None)
        if transport is not None:
            transport.loseConnection()

    def connection_lost(self, conn: Any) -> None:
        """The client's registrations and held pulls end with its connection."""
        timer = self._expiry.pop(conn, None)
        if timer is not None and timer.active():
            timer.cancel()
        self.holds.drop_connection(conn)
        self._fail_calls(conn)
        self._changed(self.registry.channel_closed(conn))

    def stopped(self) -> None:
        """The port stops: answer held pulls (their connections close next), drop timers and sessions."""
        self.holds.answer_all()
        self._fail_calls()
        for timer in self._expiry.values():
            if timer.active():
                timer.cancel()
        self._expiry.clear()
        self.registry = ClientRegistry(self.registry.expired_ms)
        self.locks.clear()

    def role_changed(self, _broker=None) -> None:
        """Master <-> slave: answer held pulls now (clients re-route at once); locks belong to a master."""
        self.holds.answer_all()
        self.locks.clear()

    # -- metadata helpers ---------------------------------------------------------------------------
    def _group_config(self, group: str, pending: list[Deferred] | None = None) -> dict:
        """The subscription group's config; RocketMQ's defaults when unknown (autoCreateSubscriptionGroup).

        A master creates it through the log (every member applies it, so it
        survives a master switch; the creation's Deferred goes to ``pending``);
        a slave only answers with the defaults.
        """
        config = self.broker.meta.groups.get(group)
        if config is not None:
            return config
        config = subscription_group_config(group)
        d = self._create(self.broker.create_group, "group", group, config)
        if pending is not None:
            pending.append(d)
        return config

    def _ensure_topic(self, config: dict) -> Deferred:
        """Fires once the topic exists here: at once if known, else after its creation entry commits (master)."""
        if self.broker.meta.topics.get(config["topicName"]) is not None:
            return succeed(None)
        return self._create(self.broker.create_topic, "topic", config["topicName"], config)

    def _create(self, create, what: str, name: str, config: dict) -> Deferred:
        """``create(config)`` on a master (concurrent creations of one name share one log entry); logged."""
        if self.broker.role != "MASTER":
            return succeed(None)
        d = create(config)

        def created(_):
            log.info("rocketmq port: {what} {n} created", what=what, n=name)

        def failed(f):
            log.info("rocketmq port: creating {what} {n} failed: {e}", what=what, n=name, e=f.getErrorMessage())
        return d.addCallbacks(created, failed)

    # -- handlers ---------------------------------------------------------------------------------
    def heart_beat(self, req: Request) -> Reply:
        hb = parse_heartbeat(req.body)
        conn = req.conn
        header = req.header
        # As ClientManageProcessor: the group's config and its retry topic exist before the answer (clients
        # pull %RETRY% right after their first heartbeat), here once their creation entries are committed.
        pending: list[Deferred] = []
        for data in hb.consumers:
            config = self._group_config(data.group, pending)
            queues = int(config.get("retryQueueNums", 1))
            if queues > 0:
                pending.append(self._ensure_topic(topic_config(retry_topic(data.group), queues, queues,
                                                               PERM_READ | PERM_WRITE)))
        changed = self.registry.heartbeat(conn, hb, now_ms=self.now_ms(), addr=str(req.born_host),
                                          language=header.language if header else "JAVA",
                                          version=header.version if header else 0)
        if conn is not None:
            self._touch(conn)
        self._changed(changed)
        if any(not d.called for d in pending):
            return gatherResults(pending).addCallback(lambda _: Reply(SUCCESS))
        return Reply(SUCCESS)

    def unregister_client(self, req: Request) -> Reply:
        changed = self.registry.unregister(req.conn, producer_group=req.ext.get("producerGroup") or None,
                                           consumer_group=req.ext.get("consumerGroup") or None)
        self._changed(changed)
        return Reply(SUCCESS, None, {})

    def consumer_list(self, req: Request) -> Reply:
        group = ext_str(req.ext, "consumerGroup")
        code, remark, body = consumer_list_reply(group, self.registry.consumer_ids(group))
        return Reply(code, remark, {}, body)

    def connection_list(self, req: Request) -> Reply:
        group = ext_str(req.ext, "consumerGroup")
        info = self.registry.consumers.get(group)
        if info is None:
            return Reply(CONSUMER_NOT_ONLINE, f"the consumer group[{group}] not online")
        return Reply(SUCCESS, None, None, info.connection_body())

    def consumer_running_info(self, req: Request) -> Reply | Deferred:
        """GET_CONSUMER_RUNNING_INFO from mqadmin: forwarded to the client over its connection, its answer
        passed back as is (RocketMQ's callConsumer)."""
        group, client_id = ext_str(req.ext, "consumerGroup"), ext_str(req.ext, "clientId")
        info = self.registry.consumers.get(group)
        conn = next((c.channel for c in info.channels.values() if c.client_id == client_id), None) if info else None
        if conn is None or getattr(conn, "transport", None) is None:
            return Reply(SYSTEM_ERROR, f"The Consumer <{group}> <{client_id}> not online")

        def answered(result) -> Reply:
            header, body = result
            return Reply(header.code, header.remark, header.ext_fields, body)

        def failed(f) -> Reply:
            if f.check(TimeoutError):
                return Reply(CONSUME_MSG_TIMEOUT, f"consumer <{group}> <{client_id}> Timeout: {f.getErrorMessage()}")
            return Reply(SYSTEM_ERROR, f"invoke consumer <{group}> <{client_id}> Exception: {f.getErrorMessage()}")
        ext = {k: str(v) for k, v in req.ext.items()}
        return self.call_client(conn, req.code, ext, req.body).addCallbacks(answered, failed)

    def lock_batch(self, req: Request) -> Reply:
        group, client, mqs = parse_lock_body(req.body)
        ok = self.locks.lock(group, mqs, client, self.now_ms())
        return Reply(SUCCESS, None, None, fastjson.dumps({"lockOKMQSet": [mq_json(m) for m in ok]}).encode())

    def unlock_batch(self, req: Request) -> Reply:
        group, client, mqs = parse_lock_body(req.body)
        self.locks.unlock(group, mqs, client)
        return Reply(SUCCESS)

    def transaction(self, req: Request) -> Reply:
        return Reply(NO_PERMISSION, TRANSACTION_REMARK.format(code=req.code))

    def send_msg_back(self, req: Request) -> Reply | Deferred:
        args = send_back_args(req.ext)
        broker = self.broker
        if broker.role != "MASTER":
            return Reply(SYSTEM_ERROR, "SERVICE_NOT_AVAILABLE: send the message back to the master")
        config = broker.meta.groups.get(args.group)
        if config is None:
            config = self._group_config(args.group)
        if int(config.get("retryQueueNums", 1)) <= 0:
            return Reply(SUCCESS)  # RocketMQ: a group without retry queues drops failed messages
        try:
            head = broker.get_message(args.offset, 8)
            size, _magic = peek_record(head)
            if not 0 < size <= broker.options.max_message_size:
                raise CodecError(f"no record at {args.offset}")
            original = decode_record(broker.get_message(args.offset, size), max_size=broker.options.max_message_size)
        except (DLedgerError, CodecError, ValueError) as exc:
            return Reply(SYSTEM_ERROR, f"look message by offset failed, {args.offset} ({exc})")
        version = req.header.version if req.header is not None else VERSION
        max_times = max_reconsume_times(args, int(config.get("retryMaxTimes", DEFAULT_MAX_RECONSUME_TIMES)),
                                        version)
        back = send_back(original, args, max_times=max_times, retry_queue_nums=int(config.get("retryQueueNums", 1)))
        if back.dead:
            log.info("rocketmq port: message {id} of group {g} goes to {t} after {n} attempts",
                     id=original.message_id, g=args.group, t=back.record.topic, n=original.reconsume_times)
            put = broker.put_as_is  # straight to the DLQ, even if an old DELAY property is left
        else:
            put = broker.put_message  # DELAY > 0: through SCHEDULE_TOPIC_XXXX
        d = self._ensure_topic(back.topic).addCallback(lambda _: put(back.record))

        def done(result):
            if getattr(result, "ok", False):
                self.port.broker_stats.on_send_back(args.group, original.topic)
                return Reply(SUCCESS)
            return Reply(SYSTEM_ERROR, result.status.name)
        return d.addCallback(done)

    # -- PULL_MESSAGE with subscriptions and long polling -------------------------------------------------
    def pull(self, req: Request, *, allow_suspend: bool = True) -> Reply | Deferred:
        """PullMessageProcessor: checks, subscription, commit offset (first attempt), read, maybe hold."""
        port = self.port
        args = pull_args(req.ext)
        error = port.pull_precheck(args)
        if error is not None:
            return error
        if args.sys_flag & SYSFLAG_SUBSCRIPTION:
            expression_type, codes = args.expression_type, subscription_codes(args)
        else:
            config = self.broker.meta.groups.get(args.group) or {}
            found = pull_subscription_check(self.registry.consumers.get(args.group), args.topic, args.sub_version,
                                            broadcast_enabled=bool(config.get("consumeBroadcastEnable", True)))
            if isinstance(found, tuple):
                return Reply(found[0], found[1], {})
            expression_type, codes = found.expression_type, found.tag_codes
        if expression_type.upper() != "TAG":  # SQL92 (enablePropertyFilter): not served rather than unfiltered
            return Reply(SYSTEM_ERROR, f"The broker does not support consumer to filter message by {expression_type}",
                         {})
        if allow_suspend:
            port.commit_pulled(args)
        reply = port.read_pull(args, codes)
        if should_hold(reply.code, args.sys_flag, allow_suspend, pull_not_found=PULL_NOT_FOUND,
                       suspend_flag=SYSFLAG_SUSPEND) and req.conn is not None:
            return self.holds.hold(args.topic, args.queue_id, args.offset, hold_seconds(args.suspend_timeout_ms),
                                   req.conn, lambda: self.pull(req, allow_suspend=False))
        return reply


def install(port) -> None:
    """Add the client-session handlers, the long-polling pull and the hooks to a BrokerPort."""
    sessions = ClientSessions(port)
    port.sessions = sessions
    port.handlers.update({
        HEART_BEAT: sessions.heart_beat, UNREGISTER_CLIENT: sessions.unregister_client,
        GET_CONSUMER_LIST_BY_GROUP: sessions.consumer_list, GET_CONSUMER_CONNECTION_LIST: sessions.connection_list,
        LOCK_BATCH_MQ: sessions.lock_batch, UNLOCK_BATCH_MQ: sessions.unlock_batch,
        CONSUMER_SEND_MSG_BACK: sessions.send_msg_back, END_TRANSACTION: sessions.transaction,
        PULL_MESSAGE: sessions.pull, GET_CONSUMER_RUNNING_INFO: sessions.consumer_running_info,
    })
    port.response_callbacks.append(sessions.response_received)
    for code in (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE):
        if code in port.handlers:
            port.handlers[code] = _refusing_prepared(port.handlers[code])
    port.connection_lost_callbacks.append(sessions.connection_lost)
    port.stop_callbacks.append(sessions.stopped)
    # Kept for the port's life (a stopped port has nothing held: both are no-ops then), so a port that is
    # started again still long-polls.
    broker = port.broker
    dispatcher = getattr(broker, "dispatcher", None)
    if dispatcher is not None and hasattr(dispatcher, "arrival_listeners"):
        dispatcher.arrival_listeners.append(sessions.holds.arrived)
    for callbacks in (getattr(broker, "master_callbacks", None), getattr(broker, "slave_callbacks", None)):
        if callbacks is not None:
            callbacks.append(sessions.role_changed)


def is_prepared(sys_flag: int) -> bool:
    """A transaction half message (sysFlag TRANSACTION_PREPARED): stored but never delivered without END_TRANSACTION."""
    return sys_flag & TRANSACTION_TYPE_MASK == TRANSACTION_PREPARED_TYPE


def _refusing_prepared(handler):
    """A send handler that refuses transaction half messages (they would be stored and never delivered)."""
    def send(req: Request) -> Reply | Deferred:
        if is_prepared(req.sending.sys_flag):
            return Reply(NO_PERMISSION, TRANSACTION_REMARK.format(code=req.code), dict(SEND_EXTRA))
        return handler(req)
    return send




