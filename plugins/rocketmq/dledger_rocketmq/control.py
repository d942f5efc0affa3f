"""Broker CONTROL entries: consumer offset commits carried by the dledger log itself.

Why: in RocketMQ's DLedger mode consumer offsets live only in the master's
memory and reach the slaves by a 10 s pull, so a new master serves offsets up
to 10 s old and consumers see duplicates after every switch.  Here an offset
commit is appended to the dledger log as a CONTROL entry; every member applies
committed control entries in log order (see :mod:`dledger_rocketmq.offsets`),
so the new master knows every offset committed before the switch.

Layout (big-endian), one dledger entry body::

    b"RMQC" | kind uint8 | count uint16 | count x commit
    commit = group_len uint16 + group UTF-8 | topic_len uint16 + topic UTF-8 | queue_id int32 | offset int64

Kinds: 1 = offset commits (an offset never moves backwards), 2 = offset reset
(sets the offsets as given, e.g. an admin's resetOffsetByTime).  Control
entries are never shown to consumers and get no queue offset; their first
four bytes cannot be a CommitLog record's magic, so the dispatcher tells them
apart by the prefix alone.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from dledger_rocketmq.errors import CodecError

MAGIC = b"RMQC"
KIND_OFFSET_COMMIT = 1
KIND_OFFSET_RESET = 2
KINDS = {KIND_OFFSET_COMMIT: "offset commit", KIND_OFFSET_RESET: "offset reset"}

#: Longest group or topic name accepted (RocketMQ's CHARACTER_MAX_LENGTH).
MAX_NAME_LENGTH = 255
#: Most commits in one entry (one client request never carries more; bounds a hostile entry's cost).
MAX_COMMITS = 65535

_HEAD = struct.Struct(">4sBH")
_LEN = struct.Struct(">H")
_TAIL = struct.Struct(">iq")


class ControlError(CodecError):
    """A control entry (or a commit to encode) is malformed; the message says what and where."""


class OffsetCommit(NamedTuple):
    """One consumer offset: the next queue offset ``group`` will consume in (``topic``, ``queue_id``)."""

    group: str
    topic: str
    queue_id: int
    offset: int


class ControlEntry(NamedTuple):
    """A decoded control entry: its kind and the commits it carries, in order."""

    kind: int
    commits: tuple[OffsetCommit, ...]

    @property
    def is_reset(self) -> bool:
        return self.kind == KIND_OFFSET_RESET


def is_control(body: bytes | bytearray | memoryview) -> bool:
    """Whether an entry body is a broker control entry (starts with ``b"RMQC"``)."""
    return bytes(body[:4]) == MAGIC


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
