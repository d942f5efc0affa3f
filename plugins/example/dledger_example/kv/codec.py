"""The kv map's bytes: log entries, request and reply bodies.  Pure functions, table-tested.

An entry body (also the body of a write request, which the leader appends as it is)::

    b"\xffKV" version(1) op(1) op_id(8) key_len(u16) key flags(1) [expected_len(u32) expected] [value_len(u32) value]

``op`` is ``P`` (put), ``D`` (delete) or ``C`` (compare-and-set); ``flags`` bit 0: an expected value
follows (cas: the key must hold it; without it a cas requires the key to be absent), bit 1: a new value
follows (put; cas: set it, without it a cas deletes).  ``op_id`` is chosen by the client and kept
across its retries: the machine applies an operation once even when the entry is in the log twice
(a retried write, a duplicated request), and answers the retry with the first outcome.

The magic starts with a byte no UTF-8 text (JSON, the example counters' bodies) and no RocketMQ record
(whose first field is a positive size) starts with, so other applications' entries are never taken for
kv entries.  Versioned: a member applying an entry of a version it does not know skips it with a log line (a newer
member wrote it), as it skips any body that is not a kv entry.  Big-endian throughout.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

MAGIC = b"\xffKV"
VERSION = 1
PUT, DELETE, CAS = b"P", b"D", b"C"
OPS = {PUT: "put", DELETE: "delete", CAS: "cas"}
HAS_EXPECTED, HAS_VALUE = 1, 2
OP_ID_SIZE = 8
#: Keys are UTF-8 text of 1..MAX_KEY bytes.
MAX_KEY = 1024
#: The largest value the format can carry; the leader's limit is the ``kv.max_value`` option.
MAX_VALUE = 2 ** 32 - 1

_HEAD = struct.Struct(">3sBc8sH")  # magic, version, op, op_id, key length
_LEN = struct.Struct(">I")
_REPLY = struct.Struct(">BqB")  # status, index, has value

#: Reply statuses.
OK, FAILED = 0, 1


class NotKV(ValueError):
    """The body is not a kv entry at all (written by another application): skipped silently."""


@dataclass(frozen=True)
class Op:
    """One write: ``kind`` ``put``/``delete``/``cas``; ``expected`` only for a cas (None: the key must be absent)."""

    kind: str
    op_id: bytes
    key: str
    value: bytes | None = None
    expected: bytes | None = None


@dataclass(frozen=True)
class Reply:
    """What a get or a write answers.

    ``ok``: a write took effect (put: always; delete: the key was there; cas: it matched), a get found
    the key.  ``index``: the write's entry, or the applied index the get read at.  ``value``: a get's
    value; after a failed cas the value the key holds (None: absent); after a delete the value removed.
    """

    ok: bool
    index: int
    value: bytes | None = None


def check_key(key: str) -> bytes:
    """The key's bytes; ValueError saying what is wrong with it."""
    if not isinstance(key, str):
        raise ValueError(f"a key is text, not {type(key).__name__}")
    raw = key.encode("utf-8", "surrogatepass")
    if not raw:
        raise ValueError("a key must not be empty")
    if len(raw) > MAX_KEY:
        raise ValueError(f"a key is at most {MAX_KEY} bytes of UTF-8, this one is {len(raw)}")
    return raw


def _check_value(value: object, what: str) -> bytes:
    if not isinstance(value, (bytes, bytearray)):
        raise ValueError(f"{what} must be bytes, not {type(value).__name__}")
    if len(value) > MAX_VALUE:
        raise ValueError(f"{what} of {len(value)} bytes is too large")
    return bytes(value)


def encode_op(op: Op) -> bytes:
    """The entry body of ``op`` (ValueError for a key or value the format cannot carry)."""
    code = {"put": PUT, "delete": DELETE, "cas": CAS}.get(op.kind)
    if code is None:
        raise ValueError(f"unknown operation {op.kind!r}")
    if len(op.op_id) != OP_ID_SIZE:
        raise ValueError(f"an operation id is {OP_ID_SIZE} bytes")
    key = check_key(op.key)
    flags, tail = 0, []
    if op.kind == "cas" and op.expected is not None:
        flags |= HAS_EXPECTED
        expected = _check_value(op.expected, "the expected value")
        tail += [_LEN.pack(len(expected)), expected]
    if op.kind == "put" and op.value is None:
        raise ValueError("a put needs a value")
    if op.kind in ("put", "cas") and op.value is not None:
        flags |= HAS_VALUE
        value = _check_value(op.value, "the value")
        tail += [_LEN.pack(len(value)), value]
    return b"".join([_HEAD.pack(MAGIC, VERSION, code, op.op_id, len(key)), key, bytes([flags]), *tail])


def decode_op(body: bytes) -> Op:
    """The operation an entry body holds; :class:`NotKV` if it is not a kv entry, ValueError if it is a broken one."""
    body = bytes(body)
    if body[:3] != MAGIC:
        raise NotKV("not a kv entry")
    if len(body) < _HEAD.size + 1:
        raise ValueError(f"truncated: {len(body)} bytes")
    _, version, code, op_id, key_len = _HEAD.unpack_from(body)
    if version != VERSION:
        raise ValueError(f"format version {version}, this member reads version {VERSION}")
    kind = OPS.get(code)
    if kind is None:
        raise ValueError(f"unknown operation {code!r}")
    pos = _HEAD.size
    raw_key = body[pos:pos + key_len]
    pos += key_len
    if len(raw_key) != key_len or pos >= len(body):
        raise ValueError("truncated key")
    if not 0 < key_len <= MAX_KEY:
        raise ValueError(f"key length {key_len}")
    try:
        key = raw_key.decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValueError("the key is not UTF-8") from None
    flags = body[pos]
    pos += 1
    if flags & ~(HAS_EXPECTED | HAS_VALUE):
        raise ValueError(f"unknown flags {flags:#x}")
    expected = value = None
    if flags & HAS_EXPECTED:
        expected, pos = _read_bytes(body, pos, "expected value")
    if flags & HAS_VALUE:
        value, pos = _read_bytes(body, pos, "value")
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} bytes after the operation")
    if kind == "put" and value is None or kind == "delete" and flags or kind != "cas" and expected is not None:
        raise ValueError(f"flags {flags:#x} do not fit a {kind}")
    return Op(kind, op_id, key, value, expected)


def _read_bytes(body: bytes, pos: int, what: str) -> tuple[bytes, int]:
    if pos + _LEN.size > len(body):
        raise ValueError(f"truncated {what} length")
    (n,) = _LEN.unpack_from(body, pos)
    pos += _LEN.size
    if pos + n > len(body):
        raise ValueError(f"truncated {what}")
    return body[pos:pos + n], pos + n


def encode_get(key: str) -> bytes:
    """A get request's body: the key."""
    return check_key(key)


def decode_get(body: bytes) -> str:
    """The key of a get request (ValueError if it is not one)."""
    try:
        key = bytes(body).decode("utf-8", "surrogatepass")
    except UnicodeDecodeError:
        raise ValueError("the key is not UTF-8") from None
    check_key(key)
    return key


def encode_reply(reply: Reply) -> bytes:
    has = reply.value is not None
    return _REPLY.pack(OK if reply.ok else FAILED, reply.index, int(has)) + (reply.value if has else b"")


def decode_reply(body: bytes) -> Reply:
    """A reply body (ValueError if it is not one: a member of another version answered)."""
    if len(body) < _REPLY.size:
        raise ValueError(f"a kv reply is at least {_REPLY.size} bytes, got {len(body)}")
    status, index, has = _REPLY.unpack_from(body)
    if status not in (OK, FAILED) or has not in (0, 1) or (not has and len(body) > _REPLY.size):
        raise ValueError("not a kv reply")
    return Reply(status == OK, index, bytes(body[_REPLY.size:]) if has else None)
