"""Client sessions of one broker port: producer/consumer groups, subscriptions, expiry (pure, no I/O).

What RocketMQ's ProducerManager / ConsumerManager keep, as data and
decisions the handlers in :mod:`~dledger_rocketmq.broker.port_clients` call: a
client registers its groups by HEART_BEAT (every 30 s), leaves by
UNREGISTER_CLIENT or by closing its connection, and is dropped 120 s after
its last heartbeat.  A consumer group's member set (and its subscriptions)
changing is what makes the broker tell every member to rebalance
(NOTIFY_CONSUMER_IDS_CHANGED), so every mutation answers *which groups
changed*.  A channel is the client's connection object (any hashable); the
registry never touches it.

Subscriptions are kept per group, as RocketMQ does: a heartbeat adds
topics, replaces a topic's subscription when its ``subVersion`` is newer,
and drops topics the heartbeat no longer lists.  A pull without the
SUBSCRIPTION flag is checked (and tag-filtered) against them
(:func:`pull_subscription_check`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from dledger_rocketmq.broker.port import FAQ
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.heartbeat import (  # noqa: F401 (re-exported: the client sessions' data model)
    ConsumerData,
    Heartbeat,
    HeartbeatError,
    Subscription,
    parse_heartbeat,
)

#: A channel without a heartbeat for this long is dropped (RocketMQ's channelExpiredTimeout).
CHANNEL_EXPIRED_MS = 120_000
SUBSCRIPTION_NOT_EXIST = 24
SUBSCRIPTION_NOT_LATEST = 25
NO_PERMISSION = 16
CONSUMER_NOT_ONLINE = 206


@dataclass
class ClientChannel:
    """One client connection as a group member: RocketMQ's ClientChannelInfo."""

    channel: Any
    client_id: str
    language: str = "JAVA"
    version: int = 0
    addr: str = ""
    last_update_ms: int = 0

    def to_json(self) -> dict[str, Any]:
        """A Connection bean of GET_CONSUMER_CONNECTION_LIST."""
        return {"clientAddr": self.addr, "clientId": self.client_id, "language": self.language,
                "version": self.version}


@dataclass
class ConsumerGroup:
    """RocketMQ's ConsumerGroupInfo: members (in arrival order) and the group's subscriptions."""

    name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    channels: dict[Any, ClientChannel] = field(default_factory=dict)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)

    def update_subscriptions(self, subs: tuple[Subscription, ...]) -> bool:
        """Apply a heartbeat's subscriptions; True if a topic was added or removed.

        A known topic is replaced only by a newer ``subVersion`` (a late
        heartbeat must not take a consumer back to an older subscription).
        """
        changed = False
        for sub in subs:
            old = self.subscriptions.get(sub.topic)
            if old is None:
                self.subscriptions[sub.topic] = sub
                changed = True
            elif sub.sub_version > old.sub_version:
                self.subscriptions[sub.topic] = sub
        wanted = {s.topic for s in subs}
        for topic in [t for t in self.subscriptions if t not in wanted]:
            del self.subscriptions[topic]
            changed = True
        return changed

    def connection_body(self) -> bytes:
        """GET_CONSUMER_CONNECTION_LIST's ConsumerConnection JSON (subscriptionTable in ConcurrentHashMap order)."""
        order = fastjson.java_map_order(self.subscriptions, 16)
        return fastjson.dumps({
            "connectionSet": [c.to_json() for c in self.channels.values()],
            "consumeFromWhere": self.consume_from_where, "consumeType": self.consume_type,
            "messageModel": self.message_model,
            "subscriptionTable": {t: self.subscriptions[t].to_json() for t in order}}).encode()


class ClientRegistry:
    """Producer and consumer groups of one broker port (see the module docstring)."""

    def __init__(self, expired_ms: int = CHANNEL_EXPIRED_MS):
        self.expired_ms = expired_ms
        self.producers: dict[str, dict[Any, ClientChannel]] = {}
        self.consumers: dict[str, ConsumerGroup] = {}

    # -- registration ----------------------------------------------------------------------
    def heartbeat(self, channel: Any, hb: Heartbeat, *, now_ms: int, addr: str = "", language: str = "JAVA",
                  version: int = 0) -> list[str]:
        """Register (or refresh) every group of a heartbeat; the consumer groups whose members or topics changed."""
        def info() -> ClientChannel:
            return ClientChannel(channel, hb.client_id, language, version, addr, now_ms)

        for group in hb.producer_groups:
            members = self.producers.setdefault(group, {})
            current = members.get(channel)
            if current is None or current.client_id != hb.client_id:
                members[channel] = info()
            else:
                current.last_update_ms = now_ms
        changed = []
        for data in hb.consumers:
            group = self.consumers.get(data.group)
            if group is None:
                group = self.consumers[data.group] = ConsumerGroup(data.group)
            group.consume_type, group.message_model = data.consume_type, data.message_model
            group.consume_from_where = data.consume_from_where
            current = group.channels.get(channel)
            joined = current is None
            if joined or current.client_id != hb.client_id:
                group.channels[channel] = info()
            else:
                current.last_update_ms = now_ms
            if group.update_subscriptions(data.subscriptions) or joined:
                changed.append(data.group)
        return changed

    def unregister(self, channel: Any, *, producer_group: str | None = None,
                   consumer_group: str | None = None) -> list[str]:
        """UNREGISTER_CLIENT: leave the named groups; the consumer groups that still have members to notify."""
        if producer_group:
            self._drop_producer(producer_group, channel)
        if consumer_group:
            return self._drop_consumer(consumer_group, channel)
        return []

    def channel_closed(self, channel: Any) -> list[str]:
        """A connection ended (or expired): it leaves every group; the consumer groups to notify."""
        for group in list(self.producers):
            self._drop_producer(group, channel)
        changed = []
        for group in list(self.consumers):
            changed += self._drop_consumer(group, channel)
        return changed

    def _drop_producer(self, group: str, channel: Any) -> None:
        members = self.producers.get(group)
        if members is not None and members.pop(channel, None) is not None and not members:
            del self.producers[group]

    def _drop_consumer(self, group: str, channel: Any) -> list[str]:
        info = self.consumers.get(group)
        if info is None or info.channels.pop(channel, None) is None:
            return []
        if not info.channels:
            del self.consumers[group]
            return []
        return [group]

    # -- expiry ------------------------------------------------------------------------------
    def expired(self, now_ms: int) -> list[Any]:
        """Channels whose last heartbeat (in any group) is ``expired_ms`` or more ago, each once."""
        out: dict[Any, None] = {}
        members = [m for g in self.producers.values() for m in g.values()]
        members += [m for g in self.consumers.values() for m in g.channels.values()]
        for m in members:
            if now_ms - m.last_update_ms >= self.expired_ms:
                out[m.channel] = None
        return list(out)

    def last_heartbeat_ms(self, channel: Any) -> int | None:
        """The channel's latest heartbeat time over its groups; None if it is in none."""
        times = [g[channel].last_update_ms for g in self.producers.values() if channel in g]
        times += [g.channels[channel].last_update_ms for g in self.consumers.values() if channel in g.channels]
        return max(times) if times else None

    # -- queries ------------------------------------------------------------------------------
    def consumer_channels(self, group: str) -> list[Any]:
        info = self.consumers.get(group)
        return list(info.channels) if info is not None else []

    def consumer_ids(self, group: str) -> list[str]:
        info = self.consumers.get(group)
        return [c.client_id for c in info.channels.values()] if info is not None else []

    def subscription(self, group: str, topic: str) -> Subscription | None:
        info = self.consumers.get(group)
        return info.subscriptions.get(topic) if info is not None else None


# -- pure replies ------------------------------------------------------------------------------------------

def consumer_list_reply(group: str, ids: list[str]) -> tuple[int, str | None, bytes]:
    """GET_CONSUMER_LIST_BY_GROUP: the ids, or SYSTEM_ERROR "no consumer for this group" (as recorded)."""
    if not ids:
        return 1, f"no consumer for this group, {group}", b""
    return 0, None, json.dumps({"consumerIdList": ids}, separators=(",", ":")).encode()


def pull_subscription_check(info: ConsumerGroup | None, topic: str, sub_version: int, *,
                            broadcast_enabled: bool = True) -> tuple[int, str] | Subscription:
    """PullMessageProcessor for a pull without the SUBSCRIPTION flag: the group's stored subscription, or
    the (code, remark) to answer: SUBSCRIPTION_NOT_EXIST (no group / no such topic), NO_PERMISSION
    (broadcasting while the group's consumeBroadcastEnable is off), SUBSCRIPTION_NOT_LATEST (the pull's
    subVersion is newer than the last heartbeat's)."""
    if info is None:
        return SUBSCRIPTION_NOT_EXIST, "the consumer's group info not exist" + FAQ
    if info.message_model == "BROADCASTING" and not broadcast_enabled:
        return NO_PERMISSION, f"the consumer group[{info.name}] can not consume by broadcast way"
    sub = info.subscriptions.get(topic)
    if sub is None:
        return SUBSCRIPTION_NOT_EXIST, "the consumer's subscription not exist" + FAQ
    if sub.sub_version < sub_version:
        return SUBSCRIPTION_NOT_LATEST, "the consumer's subscription not latest"
    return sub
