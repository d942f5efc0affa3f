"""A slave's copy of its master's metadata (RocketMQ's SlaveSynchronize), with two fixes.

Every ``interval`` (10 s) a slave fetches the master's topic configs
(GET_ALL_TOPIC_CONFIG 21), consumer offsets (GET_ALL_CONSUMER_OFFSET 43),
delay offsets (GET_ALL_DELAY_OFFSET 45) and subscription groups
(GET_ALL_SUBSCRIPTIONGROUP_CONFIG 201), each independently (one failing kind
does not stop the others).  Differences from RocketMQ:

- it also syncs *at once* when the member becomes a slave or the master
  changes; RocketMQ first needs its next 30 s registration to learn the
  master's address (apache/rocketmq#7790), and in the golden failover run a
  slave with ``forceRegister=false`` never synchronised at all;
- a sync never moves a consumer or delay offset backwards
  (apache/rocketmq#1094: RocketMQ's ``putAll`` copies the master's older
  values over newer ones); topic and group tables are copied wholesale when
  the master's DataVersion differs, as RocketMQ does.

Consumer offsets normally arrive through the log (control entries) already;
the sync is the fallback for offsets committed some other way and for the
other three tables.  How the bytes are fetched is the broker port's business:
``fetch(kind)`` returns a Deferred firing with the parsed JSON body (a dict),
or the raw fastjson text.  Results of a fetch that started before a role or
master change, or before ``stop``, are discarded.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import IntEnum
from typing import Any

from twisted.application import service
from twisted.internet import defer
from twisted.logger import Logger

from dledger.ratelog import RateLimitedLog
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.store.metadata import BrokerMetadata, subscription_group_table, topic_table
from dledger_rocketmq.store.offsets import ConsumerOffsetTable, DelayOffsetTable

log = Logger(namespace="dledger_rocketmq.broker.sync")

DEFAULT_INTERVAL = 10.0


class SyncKind(IntEnum):
    """What to fetch, by the RocketMQ request code that fetches it."""

    TOPIC_CONFIG = 21
    CONSUMER_OFFSET = 43
    DELAY_OFFSET = 45
    SUBSCRIPTION_GROUP = 201


#: RocketMQ's order in ``syncAll``.
ORDER = (SyncKind.TOPIC_CONFIG, SyncKind.CONSUMER_OFFSET, SyncKind.DELAY_OFFSET, SyncKind.SUBSCRIPTION_GROUP)


def apply_sync(meta: BrokerMetadata, kind: SyncKind, body: Any) -> bool:
    """Merge one fetched table into ``meta``; True if anything changed.  ValueError if the body is malformed.

    Pure with respect to time and I/O: the rule of the sync in one place.
    """
    data = fastjson.loads(body) if isinstance(body, (bytes, bytearray, str)) else body
    if kind == SyncKind.TOPIC_CONFIG:
        return meta.topics.replace(topic_table(data))
    if kind == SyncKind.SUBSCRIPTION_GROUP:
        return meta.groups.replace(subscription_group_table(data))
    if kind == SyncKind.CONSUMER_OFFSET:
        return meta.offsets.merge(ConsumerOffsetTable.from_dict(data)) > 0
    if kind == SyncKind.DELAY_OFFSET:
        return meta.delay_offsets.merge(DelayOffsetTable.from_dict(data)) > 0
    raise ValueError(f"unknown sync kind {kind!r}")


def master_body(meta: BrokerMetadata, kind: SyncKind) -> bytes:
    """The body a master answers a GET_ALL_* request of ``kind`` with: the table's compact fastjson."""
    table = {SyncKind.TOPIC_CONFIG: meta.topics, SyncKind.CONSUMER_OFFSET: meta.offsets,
             SyncKind.DELAY_OFFSET: meta.delay_offsets, SyncKind.SUBSCRIPTION_GROUP: meta.groups}[SyncKind(kind)]
    return table.to_json(pretty=False).encode()


class SlaveSync(service.Service):
    """Pulls the master's metadata into ``meta`` while this member is a slave.

    Wiring: call :meth:`become_slave` on FOLLOWER/CANDIDATE (with the master's
    id when known), :meth:`master_changed` when the leader id changes, and
    :meth:`become_master` on LEADER.  ``clock`` is an IReactorTime.
    """

    def __init__(self, meta: BrokerMetadata, fetch: Callable[[SyncKind], defer.Deferred], *, clock: Any,
                 interval: float = DEFAULT_INTERVAL) -> None:
        self.meta = meta
        self.fetch = fetch
        self.clock = clock
        self.interval = interval
        self.master: Any = None
        self.syncing = False
        self.rounds = 0  # completed rounds (tests, stats)
        self.errors = 0
        self._generation = 0
        self._timer: Any = None
        self._running: defer.Deferred | None = None
        self._again = False
        self._log = RateLimitedLog(log, clock, interval=60.0)

    # -- role events ------------------------------------------------------

    def become_slave(self, master: Any = None) -> None:
        """Start (or restart) syncing: a round at once, then every ``interval``."""
        self.master = master
        self.syncing = True
        self._restart()

    def master_changed(self, master: Any) -> None:
        """A new master: sync from it at once (no-op unless syncing and the master really changed)."""
        if self.syncing and master != self.master:
            self.master = master
            self._restart()

    def become_master(self) -> None:
        """Stop syncing; a round in flight is discarded."""
        self.syncing = False
        self.master = None
        self._generation += 1
        self._cancel_timer()

    def _restart(self) -> None:
        self._generation += 1
        self._cancel_timer()
        if self.running:
            self.sync_now()
            self._schedule()

    def _cancel_timer(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _schedule(self) -> None:
        self._timer = self.clock.callLater(self.interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.running and self.syncing:
            self.sync_now()
            self._schedule()

    # -- rounds -----------------------------------------------------------

    def sync_now(self) -> defer.Deferred:
        """Run a round now (or right after the one in flight); fires when the metadata is merged."""
        if self._running is not None:
            self._again = True
            done = defer.Deferred()
            self._running.addBoth(lambda r: (done.callback(None), r)[1])
            return done
        self._running = self._round(self._generation)

        def finished(result: Any) -> Any:
            self._running = None
            if self._again and self.running and self.syncing:
                self._again = False
                return self.sync_now()
            self._again = False
            return result
        return self._running.addBoth(finished)

    @defer.inlineCallbacks
    def _round(self, generation: int):
        changed = False
        for kind in ORDER:
            try:
                body = yield self.fetch(kind)
            except Exception as exc:
                self.errors += 1
                self._log.warn(("fetch", kind), "metadata sync from master {master}: {kind} failed: {err}",
                               master=self.master, kind=kind.name, err=exc)
                continue
            if generation != self._generation or not self.syncing:
                return  # the role or master changed meanwhile: this master's answer no longer counts
            try:
                changed |= apply_sync(self.meta, kind, body)
            except ValueError as exc:
                self.errors += 1
                self._log.warn(("body", kind), "metadata sync from master {master}: bad {kind} body: {err}",
                               master=self.master, kind=kind.name, err=exc)
        self.rounds += 1
        if changed:
            try:
                yield self.meta.persist()
            except Exception as exc:
                self._log.error("persist", "metadata sync: persisting failed: {err}", err=exc)

    # -- service ----------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        if self.syncing:
            self._restart()

    def stopService(self) -> defer.Deferred:
        """Stop the timer; fires once a round in flight has ended (its results are discarded)."""
        super().stopService()
        self._generation += 1
        self._cancel_timer()
        running = self._running
        if running is None:
            return defer.succeed(None)
        done = defer.Deferred()
        running.addBoth(lambda r: (done.callback(None), None)[1])
        return done
