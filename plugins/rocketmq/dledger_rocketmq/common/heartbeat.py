"""HEART_BEAT bodies (RocketMQ's HeartbeatData JSON) as data: producer groups, consumers, subscriptions.

Pure parsing, below everything that uses it: the client sessions (:mod:`~dledger_rocketmq.broker.clients`) register
what a heartbeat says, and the ACL (:mod:`~dledger_rocketmq.common.acl`) finds the groups and topics it names
without importing the broker port.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.errors import ArgumentError


class HeartbeatError(ArgumentError):
    """A HEART_BEAT body that is not HeartbeatData JSON (answered SYSTEM_ERROR with this one line)."""


@dataclass(frozen=True)
class Subscription:
    """A SubscriptionData as a client sends it (tagsSet/codeSet kept in the client's order)."""

    topic: str
    sub_string: str = "*"
    expression_type: str = "TAG"
    tags_set: tuple[str, ...] = ()
    code_set: tuple[int, ...] = ()
    sub_version: int = 0
    class_filter_mode: bool = False

    def to_json(self) -> dict[str, Any]:
        """The fastjson bean (fields in alphabetical order)."""
        return {"classFilterMode": self.class_filter_mode, "codeSet": list(self.code_set),
                "expressionType": self.expression_type, "subString": self.sub_string,
                "subVersion": self.sub_version, "tagsSet": list(self.tags_set), "topic": self.topic}

    @property
    def tag_codes(self) -> set[int] | None:
        """Tag hashes to keep when pulling; None for ``*`` (every message)."""
        if self.sub_string.strip() == "*" or not self.code_set:
            return None
        return set(self.code_set)


@dataclass(frozen=True)
class ConsumerData:
    group: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from_where: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: tuple[Subscription, ...] = ()
    unit_mode: bool = False


@dataclass(frozen=True)
class Heartbeat:
    client_id: str
    producer_groups: tuple[str, ...] = ()
    consumers: tuple[ConsumerData, ...] = ()


def _text(obj: dict, key: str, default: str | None = None) -> str:
    value = obj.get(key, default)
    if not isinstance(value, str):
        raise HeartbeatError(f"heartbeat: {key!r} must be a string, got {value!r:.40}")
    return value


def _int(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeartbeatError(f"heartbeat: {what} must be an integer, got {value!r:.40}")
    return value


def _subscription(obj: Any) -> Subscription:
    if not isinstance(obj, dict):
        raise HeartbeatError("heartbeat: a subscriptionDataSet item is not an object")
    tags = obj.get("tagsSet") or []
    codes = obj.get("codeSet") or []
    if not isinstance(tags, list) or not isinstance(codes, list):
        raise HeartbeatError("heartbeat: tagsSet/codeSet must be arrays")
    return Subscription(topic=_text(obj, "topic"), sub_string=_text(obj, "subString", "*"),
                        expression_type=_text(obj, "expressionType", "TAG"),
                        tags_set=tuple(str(t) for t in tags), code_set=tuple(_int(c, "codeSet") for c in codes),
                        sub_version=_int(obj.get("subVersion", 0), "subVersion"),
                        class_filter_mode=bool(obj.get("classFilterMode", False)))


def parse_heartbeat(body: bytes) -> Heartbeat:
    """HeartbeatData JSON (Java: alphabetical keys; ali-ons: its own order and no expressionType)."""
    try:
        obj = fastjson.loads(body)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HeartbeatError(f"heartbeat: body is not JSON: {str(exc)[:100]}") from None
    if not isinstance(obj, dict):
        raise HeartbeatError("heartbeat: body is not a JSON object")
    producers, consumers = obj.get("producerDataSet") or [], obj.get("consumerDataSet") or []
    if not isinstance(producers, list) or not isinstance(consumers, list):
        raise HeartbeatError("heartbeat: producerDataSet/consumerDataSet must be arrays")
    groups = []
    for p in producers:
        if not isinstance(p, dict):
            raise HeartbeatError("heartbeat: a producerDataSet item is not an object")
        groups.append(_text(p, "groupName"))
    datas = []
    for c in consumers:
        if not isinstance(c, dict):
            raise HeartbeatError("heartbeat: a consumerDataSet item is not an object")
        subs = c.get("subscriptionDataSet") or []
        if not isinstance(subs, list):
            raise HeartbeatError("heartbeat: subscriptionDataSet must be an array")
        datas.append(ConsumerData(group=_text(c, "groupName"),
                                  consume_type=_text(c, "consumeType", "CONSUME_PASSIVELY"),
                                  message_model=_text(c, "messageModel", "CLUSTERING"),
                                  consume_from_where=_text(c, "consumeFromWhere", "CONSUME_FROM_LAST_OFFSET"),
                                  subscriptions=tuple(_subscription(s) for s in subs),
                                  unit_mode=bool(c.get("unitMode", False))))
    return Heartbeat(_text(obj, "clientID"), tuple(groups), tuple(datas))
