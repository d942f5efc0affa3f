"""Broker CONTROL entries: consumer offset commits carried by the dledger log itself.

Why: in RocketMQ's DLedger mode consumer offsets live only in the master's
memory and reach the slaves by a 10 s pull, so a new master serves offsets up
to 10 s old and consumers see duplicates after every switch.  Here an offset
commit is appended to the dledger log as a CONTROL entry; every member applies
committed control entries in log order (see :mod:`dledger_rocketmq.store.offsets`),
so the new master knows every offset committed before the switch.

Layout (big-endian), one dledger entry body::

    b"RMQC" | kind uint8 | count uint16 | count x commit
    commit = group_len uint16 + group UTF-8 | topic_len uint16 + topic UTF-8 | queue_id int32 | offset int64

Kinds: 1 = offset commits (an offset never moves backwards), 2 = offset reset
(sets the offsets as given, e.g. an admin's resetOffsetByTime).

Kinds 3-6 carry broker metadata changes (topic and subscription-group
configs), so a new master knows every topic created before the switch
without RocketMQ's 10 s metadata sync::

    b"RMQC" | kind uint8 | count uint16 | timestamp int64 | count x (len uint32 + JSON object UTF-8)

3 = topic configs to create or replace (TopicConfig beans), 4 = topics to
delete (``{"topicName": ...}``), 5 = subscription-group configs
(SubscriptionGroupConfig beans), 6 = groups to delete (``{"groupName": ...}``),
7 = the whole ACL in effect (one object: ``{"acl": <plain_acl.yml as JSON>,
"source": ...}``, :mod:`dledger_rocketmq.common.acl`), so every master enforces the
same accounts.
``timestamp`` is the master's clock when it appended the change: every member
stamps its table's DataVersion with it, so the DataVersions agree.  Control
entries are never shown to consumers and get no queue offset; their first
four bytes cannot be a CommitLog record's magic, so the dispatcher tells them
apart by the prefix alone.
"""

from __future__ import annotations

import json
import struct
from typing import NamedTuple

from dledger_rocketmq.common.errors import CodecError

MAGIC = b"RMQC"
KIND_OFFSET_COMMIT = 1
KIND_OFFSET_RESET = 2
KIND_TOPIC_CONFIG = 3
KIND_TOPIC_DELETE = 4
KIND_GROUP_CONFIG = 5
KIND_GROUP_DELETE = 6
KIND_ACL_CONFIG = 7
#: The metadata kinds: kind -> (what, the bean field naming each item).
METADATA_KINDS = {KIND_TOPIC_CONFIG: ("topic config", "topicName"), KIND_TOPIC_DELETE: ("topic delete", "topicName"),
                  KIND_GROUP_CONFIG: ("subscription group config", "groupName"),
                  KIND_GROUP_DELETE: ("subscription group delete", "groupName"),
                  KIND_ACL_CONFIG: ("ACL config", None)}
KINDS = {KIND_OFFSET_COMMIT: "offset commit", KIND_OFFSET_RESET: "offset reset",
         **{k: what for k, (what, _) in METADATA_KINDS.items()}}

#: Longest group or topic name accepted (RocketMQ's CHARACTER_MAX_LENGTH).
MAX_NAME_LENGTH = 255
#: Most commits in one entry (one client request never carries more; bounds a hostile entry's cost).
MAX_COMMITS = 65535
#: Most configs in one metadata entry, and the longest one (a TopicConfig is ~200 bytes).
MAX_CONFIGS = 4096
MAX_CONFIG_LENGTH = 64 * 1024
#: The ACL is one object holding every account (a few hundred bytes each).
MAX_ACL_LENGTH = 1024 * 1024


def _limit(kind: int) -> int:
    return MAX_ACL_LENGTH if kind == KIND_ACL_CONFIG else MAX_CONFIG_LENGTH

_HEAD = struct.Struct(">4sBH")
_LEN = struct.Struct(">H")
_TAIL = struct.Struct(">iq")
_STAMP = struct.Struct(">q")
_ITEM = struct.Struct(">I")


class ControlError(CodecError):
    """A control entry (or a commit to encode) is malformed; the message says what and where."""


class OffsetCommit(NamedTuple):
    """One consumer offset: the next queue offset ``group`` will consume in (``topic``, ``queue_id``)."""

    group: str
    topic: str
    queue_id: int
    offset: int


class ControlEntry(NamedTuple):
    """A decoded control entry: its kind and the commits (kinds 1, 2) or configs (kinds 3-6) it carries."""

    kind: int
    commits: tuple[OffsetCommit, ...]
    #: Metadata kinds: the JSON objects, in order, and the master's clock (ms) when it appended them.
    configs: tuple[dict, ...] = ()
    timestamp: int = 0

    @property
    def is_reset(self) -> bool:
        return self.kind == KIND_OFFSET_RESET


def is_control(body: bytes | bytearray | memoryview) -> bool:
    """Whether an entry body is a broker control entry (starts with ``b"RMQC"``)."""
    return bytes(body[:4]) == MAGIC


def control_kind(body: bytes | bytearray | memoryview) -> int | None:
    """The kind byte of a control entry (None if ``body`` is not one): routing without a full decode."""
    return body[4] if len(body) > 4 and bytes(body[:4]) == MAGIC else None


def check_metadata_name(what: str, name: object) -> str:
    """``name`` if it can name a topic or group in a metadata entry, else ControlError saying why.

    Non-empty, at most MAX_NAME_LENGTH UTF-8 bytes, no '@' (RocketMQ's
    topic@group separator in consumerOffset.json) and no control characters.
    """
    if not isinstance(name, str) or not name:
        raise ControlError(f"{what}: empty or missing name")
    if len(name.encode("utf-8")) > MAX_NAME_LENGTH:
        raise ControlError(f"{what}: name of {len(name.encode())} bytes exceeds {MAX_NAME_LENGTH}")
    if "@" in name or any(ord(c) < 32 for c in name):
        raise ControlError(f"{what}: name {name!r:.60} contains '@' or a control character")
    return name


def acl_entry(config, source: str, file_source: str) -> dict:
    """One kind-7 (ACL) config: the ACL (an ``AclConfig``), who put it (``file:<sha256>`` or ``admin``) and the
    last file put in effect -- what ``AclTable.apply`` reads back on every member."""
    return {"acl": config.to_dict(), "source": source, "file": file_source}


def encode_metadata(kind: int, configs: list[dict], timestamp: int) -> bytes:
    """The body of one metadata control entry (kinds 3-6) carrying ``configs`` (JSON objects with their name)."""
    if kind not in METADATA_KINDS:
        raise ControlError(f"control entry: {kind} is not a metadata kind")
    what, name_key = METADATA_KINDS[kind]
    configs = list(configs)
    if not configs:
        raise ControlError(f"{what}: nothing to change")
    if len(configs) > MAX_CONFIGS:
        raise ControlError(f"{what}: {len(configs)} configs exceed {MAX_CONFIGS} per entry")
    if not -(1 << 63) <= timestamp < (1 << 63):
        raise ControlError(f"{what}: timestamp {timestamp} out of int64 range")
    parts = [_HEAD.pack(MAGIC, kind, len(configs)), _STAMP.pack(timestamp)]
    for config in configs:
        if not isinstance(config, dict):
            raise ControlError(f"{what}: {config!r:.60} is not an object")
        if name_key is not None:
            check_metadata_name(what, config.get(name_key))
        try:
            data = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False).encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise ControlError(f"{what}: not JSON: {exc}") from None
        if len(data) > _limit(kind):
            raise ControlError(f"{what}: one config of {len(data)} bytes exceeds {_limit(kind)}")
        parts += [_ITEM.pack(len(data)), data]
    return b"".join(parts)


def _decode_metadata(data: bytes, kind: int, count: int) -> ControlEntry:
    what, name_key = METADATA_KINDS[kind]
    pos = _HEAD.size
    if pos + _STAMP.size > len(data):
        raise ControlError(f"control entry: {what} truncated in its timestamp", pos)
    (timestamp,) = _STAMP.unpack_from(data, pos)
    pos += _STAMP.size
    if count > MAX_CONFIGS:
        raise ControlError(f"control entry: {count} configs exceed {MAX_CONFIGS}", 5)
    configs = []
    for n in range(count):
        if pos + _ITEM.size > len(data):
            raise ControlError(f"control entry: {what} {n} truncated in its length", pos)
        (length,) = _ITEM.unpack_from(data, pos)
        pos += _ITEM.size
        if length == 0 or length > _limit(kind) or pos + length > len(data):
            raise ControlError(f"control entry: {what} {n} length {length} out of range", pos)
        try:
            config = json.loads(data[pos:pos + length].decode("utf-8"))
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise ControlError(f"control entry: {what} {n} is not UTF-8 JSON", pos) from None
        if not isinstance(config, dict):
            raise ControlError(f"control entry: {what} {n} is not a JSON object", pos)
        try:
            if name_key is not None:
                check_metadata_name(what, config.get(name_key))
        except ControlError as exc:
            raise ControlError(f"control entry: {exc}", pos) from None
        configs.append(config)
        pos += length
    if pos != len(data):
        raise ControlError(f"control entry: {len(data) - pos} bytes after its {count} configs", pos)
    return ControlEntry(kind, (), tuple(configs), timestamp)


def _name(what: str, text: str) -> bytes:
    if not isinstance(text, str) or not text:
        raise ControlError(f"offset commit: empty {what}")
    if "@" in text:
        raise ControlError(f"offset commit: {what} {text!r} contains '@' (RocketMQ's topic@group separator)")
    data = text.encode("utf-8")
    if len(data) > MAX_NAME_LENGTH:
        raise ControlError(f"offset commit: {what} of {len(data)} bytes exceeds {MAX_NAME_LENGTH}")
    return _LEN.pack(len(data)) + data


def encode_offset_commits(commits: list[OffsetCommit], *, reset: bool = False) -> bytes:
    """The body of one control entry carrying ``commits`` (kind 2 with ``reset``)."""
    commits = list(commits)
    if not commits:
        raise ControlError("offset commit: no commits")
    if len(commits) > MAX_COMMITS:
        raise ControlError(f"offset commit: {len(commits)} commits exceed {MAX_COMMITS} per entry")
    parts = [_HEAD.pack(MAGIC, KIND_OFFSET_RESET if reset else KIND_OFFSET_COMMIT, len(commits))]
    for c in commits:
        if not -(1 << 31) <= c.queue_id < (1 << 31):
            raise ControlError(f"offset commit: queue id {c.queue_id} out of int32 range")
        if not -(1 << 63) <= c.offset < (1 << 63):
            raise ControlError(f"offset commit: offset {c.offset} out of int64 range")
        parts += [_name("group", c.group), _name("topic", c.topic), _TAIL.pack(c.queue_id, c.offset)]
    return b"".join(parts)


def decode_control(body: bytes | bytearray | memoryview) -> ControlEntry | None:
    """The control entry in ``body``; None if ``body`` is not one (no ``RMQC`` prefix).

    Strict: an unknown kind, a count that does not match, a short or long
    body, an empty or non-UTF-8 name all raise :class:`ControlError` with the
    byte position.
    """
    data = bytes(body)
    if data[:4] != MAGIC:
        return None
    if len(data) < _HEAD.size:
        raise ControlError(f"control entry: {len(data)} bytes, shorter than its {_HEAD.size}-byte header", 0)
    _, kind, count = _HEAD.unpack_from(data, 0)
    if kind not in KINDS:
        raise ControlError(f"control entry: unknown kind {kind}", 4)
    if count == 0:
        raise ControlError("control entry: no commits", 5)
    if kind in METADATA_KINDS:
        return _decode_metadata(data, kind, count)
    pos = _HEAD.size
    commits = []
    for n in range(count):
        names = []
        for what in ("group", "topic"):
            if pos + 2 > len(data):
                raise ControlError(f"control entry: commit {n} truncated in its {what} length", pos)
            (length,) = _LEN.unpack_from(data, pos)
            if length == 0 or length > MAX_NAME_LENGTH:
                raise ControlError(f"control entry: commit {n} {what} length {length} not in 1..{MAX_NAME_LENGTH}",
                                   pos)
            pos += 2
            if pos + length > len(data):
                raise ControlError(f"control entry: commit {n} truncated in its {what}", pos)
            try:
                name = data[pos:pos + length].decode("utf-8")
            except UnicodeDecodeError:
                raise ControlError(f"control entry: commit {n} {what} is not UTF-8", pos) from None
            if "@" in name:
                raise ControlError(f"control entry: commit {n} {what} contains '@'", pos)
            names.append(name)
            pos += length
        if pos + _TAIL.size > len(data):
            raise ControlError(f"control entry: commit {n} truncated in its queue id/offset", pos)
        queue_id, offset = _TAIL.unpack_from(data, pos)
        pos += _TAIL.size
        commits.append(OffsetCommit(names[0], names[1], queue_id, offset))
    if pos != len(data):
        raise ControlError(f"control entry: {len(data) - pos} bytes after its {count} commits", pos)
    return ControlEntry(kind, tuple(commits))
