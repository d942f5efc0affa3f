"""The RocketMQ-remoting frame codec: the only module that knows the wire layout of an RPC.

A frame is ``int32 totalLen`` (bytes after itself) + ``int32 (serializeType << 24 | headerLen)``
+ a JSON header + a body.  Java DLedger 0.3.2 writes the header as compact JSON with sorted keys
(``{"code":..,"flag":..,"language":"JAVA","opaque":..,"serializeTypeCurrentRPC":"JSON","version":0}``,
null ``remark``/``extFields`` omitted) and the body as the message's fastjson object; both are
reproduced here byte for byte (see ``tests/golden/java-dledger-0.3.2``).

Decoding never returns garbage: every malformed input raises one of the :class:`FrameError`
subclasses below with a message that says what was wrong, so a protocol can decide between
answering with an error (the header was readable) and closing the connection (it was not).

dledger peers may send PUSH requests with a *binary body* (entries in the entry codec's layout,
no Base64, no JSON for the entries), marked by ``extFields = {"dledger.body": "bin"}`` so that it
can never be mistaken for a JSON body.  See :func:`encode_push_binary` for the layout.
"""

from __future__ import annotations

import binascii
import json
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields, replace
from typing import Any

import crc32c as _crc32c

from dledger import messages
from dledger.codes import PLUGIN_REQUEST_CODES, RequestCode, ResponseCode
from dledger.entry import HEADER_SIZE, CodecError, EntryList, decode_entries, encode_entry_into, encoded_size
from dledger.messages import (
    AppendEntryRequest,
    AppendEntryResponse,
    GetEntriesResponse,
    InstallSnapshotRequest,
    PushEntryRequest,
    RequestOrResponse,
)

SERIALIZE_JSON = 0
SERIALIZE_ROCKETMQ = 1
FLAG_RESPONSE = 1  # bit 0
FLAG_ONEWAY = 2  # bit 1
#: header ``code`` of every reply: the DLedger result travels in the body's ``code``
REMOTING_SUCCESS = 200
#: RocketMQ remoting's own header codes a Java server may answer with
REMOTING_SYSTEM_ERROR = 1
REMOTING_SYSTEM_BUSY = 2
REMOTING_REQUEST_CODE_NOT_SUPPORTED = 3

BODY_ENCODING_KEY = "dledger.body"
BODY_BINARY = "bin"
BINARY_EXT_FIELDS = {BODY_ENCODING_KEY: BODY_BINARY}
#: On a GET request: "answer me with a binary body" (dledger clients; Java members ignore extFields they do
#: not know and answer JSON, which the client reads as well).
REPLY_ENCODING_KEY = "dledger.reply"
BINARY_REPLY_EXT_FIELDS = {REPLY_ENCODING_KEY: BODY_BINARY}

DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024  # Java remoting's FRAME_MAX_LENGTH
_LENGTHS = struct.Struct(">iI")
_unpack_int32 = struct.Struct(">i").unpack_from
_unpack_uint32 = struct.Struct(">I").unpack_from
_INT32_MIN, _INT32_MAX = -(2 ** 31), 2 ** 31 - 1

_dumps = json.JSONEncoder(separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode


def _utf8(text: str) -> bytes:
    """UTF-8, with unpaired surrogates (only hostile JSON produces them) written as '?' like Java's encoder."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "replace")


# -- errors -------------------------------------------------------------------

class FrameError(ValueError):
    """Bytes are not a valid remoting frame (or message); the message says why."""


class FrameLengthError(FrameError):
    """The length fields are impossible (negative, too short, header longer than the frame). Fatal to a stream."""


class FrameTooLargeError(FrameLengthError):
    """The frame announces more bytes than the configured ``max_frame_size``. Fatal to a stream."""


class UnsupportedSerializeTypeError(FrameError):
    """The header is not JSON (RocketMQ's binary header, serializeType 1, or an unknown type)."""


class HeaderError(FrameError):
    """The header is not UTF-8 JSON, not an object, or lacks/mistypes a required key."""


class BodyError(FrameError):
    """The header was fine but the body is not the message it should be. ``header`` is set, so one can reply."""

    def __init__(self, message: str, header: Header | None = None):
        super().__init__(message)
        self.header = header


class BinaryBodyError(BodyError):
    """A binary PUSH body is malformed or a transported entry failed its CRC check."""


class UnknownRequestCodeError(FrameError):
    """A request carries a code we have no message for. ``header`` is set, so one can reply UNSUPPORTED."""

    def __init__(self, message: str, header: Header):
        super().__init__(message)
        self.header = header


# -- header ---------------------------------------------------------------------

@dataclass(slots=True)
class Header:
    """A RemotingCommand header; field names are Java's (``serializeTypeCurrentRPC`` is ``serialize_type``)."""

    code: int
    opaque: int
    flag: int = 0
    language: str = "JAVA"
    version: int = 0
    remark: str | None = None
    ext_fields: dict[str, str] | None = None
    serialize_type: str = "JSON"

    @property
    def is_response(self) -> bool:
        return bool(self.flag & FLAG_RESPONSE)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & FLAG_ONEWAY)

    @property
    def body_encoding(self) -> str | None:
        """``"bin"`` for a dledger binary body, None for Java's JSON body."""
        return self.ext_fields.get(BODY_ENCODING_KEY) if self.ext_fields else None

    @property
    def reply_encoding(self) -> str | None:
        """``"bin"`` when a GET request asks for dledger's binary reply body, None for Java's JSON."""
        return self.ext_fields.get(REPLY_ENCODING_KEY) if self.ext_fields else None

    def to_json(self) -> bytes:
        """The header exactly as Java writes it: compact, keys sorted, null fields omitted."""
        if self.remark is None and self.language == "JAVA" and self.serialize_type == "JSON":
            if self.ext_fields is None:  # what _dumps writes, without building and sorting a dict
                return _PLAIN_HEADER % (self.code, self.flag, self.opaque, self.version)
            if self.ext_fields == BINARY_EXT_FIELDS:
                return _BINARY_HEADER % (self.code, self.flag, self.opaque, self.version)
        obj: dict[str, Any] = {"code": self.code, "flag": self.flag, "language": self.language,
                               "opaque": self.opaque, "serializeTypeCurrentRPC": self.serialize_type,
                               "version": self.version}
        if self.remark is not None:
            obj["remark"] = self.remark
        if self.ext_fields is not None:
            obj["extFields"] = self.ext_fields
        return _utf8(_dumps(obj))

    @classmethod
    def from_json(cls, data: bytes | bytearray | memoryview, start: int = 0, end: int | None = None) -> Header:
        """Parse and validate the header in ``data[start:end]``; :class:`HeaderError` says what is wrong."""
        if end is None:
            end = len(data)
        m = _FAST_HEADER(data, start, end)  # the two shapes dledger and Java write; anything else: the long way
        if m is not None:
            code, binary, flag, opaque, version = m.groups()
            opaque = int(opaque)  # the one field the pattern lets reach 10 digits: the only range check
            if _INT32_MIN <= opaque <= _INT32_MAX:
                return cls(int(code), opaque, int(flag), "JAVA", int(version), None,
                           {BODY_ENCODING_KEY: BODY_BINARY} if binary else None, "JSON")
        if start or end != len(data):
            data = bytes(data[start:end])
        obj = _loads(data, HeaderError, "header")
        if not isinstance(obj, dict):
            raise HeaderError(f"header: expected a JSON object, got {type(obj).__name__}")
        return cls(code=_int32(obj, "code", required=True), opaque=_int32(obj, "opaque", required=True),
                   flag=_int32(obj, "flag", required=True), language=_str(obj, "language", "JAVA"),
                   version=_int32(obj, "version", default=0), remark=_str(obj, "remark", None),
                   ext_fields=_ext_fields(obj), serialize_type=_str(obj, "serializeTypeCurrentRPC", "JSON"))


#: A header with no remark and no extFields, as ``Header.to_json`` (and Java) writes it.
_PLAIN_HEADER = b'{"code":%d,"flag":%d,"language":"JAVA","opaque":%d,"serializeTypeCurrentRPC":"JSON","version":%d}'
#: The same with the binary-body marker (dledger's PUSH and APPEND), keys still in sorted order.
_BINARY_HEADER = _PLAIN_HEADER.replace(b'"flag"', b'"extFields":{"dledger.body":"bin"},"flag"')
#: JSON integers of at most 9 digits always fit a Java int: no range check for code, flag and version.  The
#: opaque (a counter that may wrap) gets 10 digits and one check; longer numbers take the long way.
_SMALL_INT = rb"(-?(?:0|[1-9][0-9]{0,8}))"
_OPAQUE_INT = rb"(-?(?:0|[1-9][0-9]{0,9}))"


def _header_pattern() -> re.Pattern[bytes]:
    """One regex for ``_PLAIN_HEADER`` and ``_BINARY_HEADER``: the binary marker is an optional (captured) group.

    Groups: code, the marker (None when absent), flag, opaque, version.  One match per frame instead of one
    per template, and no range check on the small fields (issue #28, Round 2e).
    """
    marker = re.escape(b'"extFields":{"dledger.body":"bin"},')
    text = re.escape(_PLAIN_HEADER).replace(re.escape(b'"flag"'), b"(" + marker + b')?"flag"', 1)
    fields = iter((_SMALL_INT, _SMALL_INT, _OPAQUE_INT, _SMALL_INT))  # code, flag, opaque, version
    return re.compile(re.sub(re.escape(re.escape(b"%d")), lambda _: next(fields), text))


_FAST_HEADER = _header_pattern().fullmatch


def _loads(data: bytes | bytearray | memoryview, error: type[FrameError], what: str) -> Any:
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{what}: invalid UTF-8 at byte {exc.start}") from None
    try:
        return json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise error(f"{what}: invalid JSON: {exc}") from None
    except (ValueError, RecursionError) as exc:  # NaN/Infinity, huge integers, absurd nesting
        raise error(f"{what}: unacceptable JSON: {str(exc)[:120] or type(exc).__name__}") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def _int32(obj: dict, key: str, *, required: bool = False, default: int = 0) -> int:
    if key not in obj:
        if required:
            raise HeaderError(f"header: missing key {key!r}")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise HeaderError(f"header: {key!r} must be an integer, got {value!r:.40}")
    if not _INT32_MIN <= value <= _INT32_MAX:
        raise HeaderError(f"header: {key!r} = {value} does not fit a Java int")
    return value


def _str(obj: dict, key: str, default: str | None) -> Any:
    value = obj.get(key, default)
    if value is not None and not isinstance(value, str):
        raise HeaderError(f"header: {key!r} must be a string, got {value!r:.40}")
    return value


def _ext_fields(obj: dict) -> dict[str, str] | None:
    value = obj.get("extFields")
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise HeaderError(f"header: 'extFields' must be an object of strings, got {value!r:.60}")
    return value


# -- frames ---------------------------------------------------------------------

@dataclass(slots=True)
class Frame:
    """One decoded frame: its header and its raw body bytes."""

    header: Header
    body: bytes


def encode_frame(header: Header, body: bytes = b"") -> bytes:
    """Length prefix + header word + header + body."""
    head = header.to_json()
    return b"".join((_LENGTHS.pack(4 + len(head) + len(body), len(head)), head, body))


def frame_size(data: bytes | bytearray | memoryview) -> int:
    """Total size of the frame at the start of ``data`` (length field included)."""
    return 4 + struct.unpack_from(">i", data)[0]


#: A frame still missing at least this many bytes is collected chunk by chunk and joined once it is
#: complete (:class:`FrameSplitter`); smaller remainders are appended to the buffer as they arrive.
COLLECT_FRAME_BYTES = 64 * 1024
#: Reads smaller than this, while a large frame is collected, are gathered into shared buffers of up to
#: COLLECT_FRAME_BYTES (a peer trickling a frame byte by byte must not make the member hold an object per byte).
_SMALL_READ = 16 * 1024


class FrameSplitter:
    """Cuts a byte stream that arrives in arbitrary chunks into frames.

    :meth:`feed` buffers the chunk and returns an iterator over the frames now complete.
    A length error (negative, too small, over ``max_frame_size``, header longer than the
    frame) desynchronises the stream for good: it raises and so does every later call.
    A frame whose header cannot be parsed raises after the frame was consumed, so the
    stream itself stays usable (a protocol closes the connection anyway: it cannot reply
    without an ``opaque``).
    """

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 header_decoder: Callable[[int, bytes], Header] | None = None):
        if max_frame_size < 8:
            raise ValueError(f"max_frame_size must be at least 8, got {max_frame_size}")
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._pos = 0  # frames before this offset are consumed; trimmed on the next feed (one memmove per read)
        # A large frame still arriving: its chunks so far (the buffered bytes first) and how many bytes it
        # still misses.  Collected as a list and joined once, instead of growing the buffer chunk by chunk
        # (each growth of a ~1 MiB buffer may copy all of it: 8x the frame's bytes copied, measured).
        self._parts: list[bytes | bytearray] | None = None
        self._missing = 0
        # A read whose first ``head`` bytes completed the buffered frame: ``(read, head)``, its other frames
        # are cut from it in place once the buffer's frame is out.
        self._rest: tuple[bytes, int] | None = None
        self._broken: FrameError | None = None
        #: ``header_decoder(serializeType, header bytes) -> Header`` replaces the JSON-only header parsing
        #: (other RemotingCommand speakers, e.g. the RocketMQ broker port: both serialize types, lenient
        #: extFields); it raises a :class:`FrameError` for a header it cannot use (the frame is consumed).
        self.header_decoder = header_decoder

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a complete frame."""
        if self._parts is not None:
            return sum(map(len, self._parts))
        rest = self._rest
        return len(self._buf) - self._pos + (len(rest[0]) - rest[1] if rest is not None else 0)

    @property
    def unfinished(self) -> int:
        """Bytes the frame now arriving will have (its length field once read); 0 when no frame is unfinished.

        What a listener's read timeout needs (:mod:`dledger.transport.listener`): a large frame gets longer.
        """
        if self._parts is not None:
            return self.buffered + self._missing
        n = len(self._buf) - self._pos
        if n >= 4:
            return max(n, 4 + _unpack_int32(self._buf, self._pos)[0])
        return n

    @property
    def collecting(self) -> bool:
        """True while a large frame is arriving (its chunks are kept as they came, joined once it is complete)."""
        return self._parts is not None

    def feed(self, data: bytes) -> Iterator[Frame]:
        """Add ``data`` and iterate over the complete frames (consume the iterator before feeding again)."""
        if self._broken is not None:
            raise self._broken
        parts = self._parts
        if parts is not None:
            if len(data) >= _SMALL_READ:
                parts.append(data)
            elif type(parts[-1]) is bytearray and len(parts[-1]) < COLLECT_FRAME_BYTES:
                parts[-1] += data  # small reads share a buffer: a part per read would cost ~40 bytes per byte
            else:
                parts.append(bytearray(data))
            self._missing -= len(data)
            if self._missing > 0:
                return iter(())
            self._buf, self._pos = bytearray().join(self._parts), 0  # the frame is complete: one copy
            self._parts = None
            return self._frames()
        buf = self._keep_rest()
        if type(data) is not bytes:
            data = bytes(data)
        if not buf:  # nothing buffered: the read's frames are cut from it in place (no copy into the buffer)
            self._buf = data
            return self._frames()
        head = self._completing(buf, data)
        if head:  # complete the buffered frame with the read's head only; its other frames are cut in place
            buf += data[:head]
            self._rest = (data, head)
        else:
            buf += data
        return self._frames()

    def _keep_rest(self) -> bytearray:
        """The unconsumed bytes as the buffer to add a read to (a read cut in place leaves its tail here)."""
        buf, pos, rest = self._buf, self._pos, self._rest
        if rest is not None:  # the last iteration stopped before reaching the read it had put aside
            self._rest = None
            data, head = rest
            with memoryview(data) as view:
                buf = bytearray(buf[pos:]) if type(buf) is bytes else buf[pos:]
                buf += view[head:]
        elif type(buf) is bytes:
            with memoryview(buf) as view:
                buf = bytearray(view[pos:])
        elif pos:
            del buf[:pos]
        self._buf, self._pos = buf, 0
        return buf

    def _completing(self, buf: bytearray, data: bytes) -> int:
        """How many bytes of ``data`` complete the frame begun in ``buf``; 0 if it cannot be told or they do not."""
        if len(buf) < 4:
            return 0
        total_len = _unpack_int32(buf, 0)[0]
        if total_len < 4 or total_len + 4 > self.max_frame_size:
            return 0  # the length error is raised where the frames are cut
        head = total_len + 4 - len(buf)
        return head if 0 < head < len(data) else 0

    def _frames(self) -> Iterator[Frame]:
        """The complete frames from ``_pos`` on: of the buffer, then of the read put aside in ``_rest``.

        The buffer is a ``bytearray`` (bytes carried over between reads) or the read itself (``bytes``, cut
        in place: a frame's body is then one slice, with no copy of the read into the buffer first).
        """
        while True:
            buf = self._buf
            in_place = type(buf) is bytes
            size = len(buf)
            while size - self._pos >= 4:
                pos = self._pos
                total_len = _unpack_int32(buf, pos)[0]
                if total_len < 4:
                    self._fail(FrameLengthError(f"frame length field {total_len} is below the minimum 4"))
                if total_len + 4 > self.max_frame_size:
                    self._fail(FrameTooLargeError(f"frame of {total_len + 4} bytes exceeds the limit of "
                                                  f"{self.max_frame_size} bytes (maxFrameSize)"))
                if size - pos < 8:
                    return
                word = _unpack_uint32(buf, pos + 4)[0]
                serialize_type, header_len = word >> 24, word & 0xFFFFFF
                if header_len > total_len - 4:
                    self._fail(FrameLengthError(f"header length {header_len} exceeds the {total_len - 4} bytes "
                                                f"the frame has after its header-length word"))
                end = pos + 4 + total_len
                if size < end:
                    if end - size >= COLLECT_FRAME_BYTES:  # a large frame: collect its chunks, join them once
                        if in_place:
                            self._parts = [buf[pos:]]
                        else:
                            with memoryview(buf) as view:
                                self._parts = [bytes(view[pos:])]
                        self._missing = end - size
                        self._buf, self._pos = bytearray(), 0
                    return
                header_end = pos + 8 + header_len
                if in_place:
                    body = buf[header_end:end]
                else:
                    with memoryview(buf) as view:
                        body = bytes(view[header_end:end])
                self._pos = end
                if self.header_decoder is not None:
                    yield Frame(self.header_decoder(serialize_type, bytes(buf[pos + 8:header_end])), body)
                    continue
                if serialize_type != SERIALIZE_JSON:
                    kind = "ROCKETMQ binary headers" if serialize_type == SERIALIZE_ROCKETMQ else "it"
                    raise UnsupportedSerializeTypeError(f"serializeType {serialize_type} is not supported "
                                                        f"(only 0, JSON; {kind} cannot be decoded)")
                yield Frame(Header.from_json(buf, pos + 8, header_end), body)
            rest = self._rest
            if rest is None:
                return
            self._rest = None  # the buffered frame is done (_completing made it end where the buffer ends)
            self._buf, self._pos = rest

    def _fail(self, error: FrameError):
        self._broken = error
        raise error


def split_frames(data: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> list[Frame]:
    """All frames of a complete byte string; :class:`FrameLengthError` if bytes are left over."""
    splitter = FrameSplitter(max_frame_size)
    frames = list(splitter.feed(data))
    if splitter.buffered:
        raise FrameLengthError(f"{splitter.buffered} trailing bytes do not form a complete frame")
    return frames


def decode_frame(data: bytes, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE) -> Frame:
    """Exactly one frame."""
    frames = split_frames(data, max_frame_size)
    if len(frames) != 1:
        raise FrameLengthError(f"expected one frame, found {len(frames)}")
    return frames[0]


# -- JSON bodies ------------------------------------------------------------------

def encode_body(msg: RequestOrResponse) -> bytes:
    """A message as Java's fastjson writes it (compact, keys sorted, nulls omitted, bytes as Base64)."""
    if type(msg) is AppendEntryResponse and _APPEND_REPLY_TEMPLATED:
        body = _append_reply_body(msg)
        if body is not None:
            return body
    flat = _FLAT_KEYS.get(type(msg))
    if flat is None and type(msg) not in _FLAT_KEYS:
        spec = messages.flat_wire_fields(type(msg))
        flat = _FLAT_KEYS[type(msg)] = spec and tuple((_utf8(_dumps(key)) + b":", name) for key, name in spec)
    if flat:
        body = _flat_body(msg, flat)
        if body is not None:
            return body
    return _utf8(_dumps(messages.to_wire(msg)))


#: class -> (b'"wireKey":', attribute) in key order, for messages whose fields are all ints and strings
_FLAT_KEYS: dict[type, tuple[tuple[bytes, str], ...] | None] = {}
#: JSON text of the strings replies repeat (group, member ids)
_JSON_STRINGS: dict[str, bytes] = {}


def _flat_body(msg: RequestOrResponse, keys: tuple[tuple[bytes, str], ...]) -> bytes | None:
    """What ``_dumps(to_wire(msg))`` writes, for a flat message, without building a dict; None for the odd value.

    Small replies (APPEND, PUSH, heartbeat, vote ...) are a large share of a busy member's work.
    """
    parts = []
    for key, name in keys:
        value = getattr(msg, name)
        kind = type(value)
        if kind is int:
            parts.append(b"%s%d" % (key, value))
        elif kind is str:
            text = _JSON_STRINGS.get(value)
            if text is None:
                text = _utf8(_dumps(value))
                if len(_JSON_STRINGS) < 1024:
                    _JSON_STRINGS[value] = text
            parts.append(key + text)
        elif value is not None:  # an enum, a bool ...: the general path decides how it looks
            return None
    return b"{%s}" % b",".join(parts)


def _append_reply_body(msg: AppendEntryResponse) -> bytes | None:
    """``encode_body`` of an APPEND reply, from a template per (group, member ids); None for the odd value.

    The leader writes one per client request: the flat path costs ~4.6 us a reply
    (a getattr, a type check and a format per field), a template ~1 us (issue #28
    target 2).  The template is what the flat path writes, its ints left as ``%d``.
    """
    code, index, pos, term = msg.code, msg.index, msg.pos, msg.term
    if not (type(code) is int and type(index) is int and type(pos) is int and type(term) is int):
        return None  # an enum, a bool or None: the general path decides how it looks
    key = (msg.group, msg.leader_id, msg.local_id, msg.remote_id)
    template = _APPEND_REPLY_TEMPLATES.get(key)
    if template is None:
        if len(_APPEND_REPLY_TEMPLATES) >= 64 or not all(v is None or type(v) is str for v in key):
            return None
        template = _APPEND_REPLY_TEMPLATES[key] = _append_reply_template(*key)
    return template % (code, index, pos, term)


def _append_reply_template(group: str | None, leader_id: str | None, local_id: str | None,
                           remote_id: str | None) -> bytes:
    """The body of an AppendEntryResponse with these strings and ``%d`` for code, index, pos and term."""

    def text(key: bytes, value: str | None) -> bytes:  # a string field, its '%' doubled for the template
        return b"" if value is None else b'"%s":%s,' % (key, _utf8(_dumps(value)).replace(b"%", b"%%"))

    return (b'{"code":%d,' + text(b"group", group) + b'"index":%d,' + text(b"leaderId", leader_id)
            + text(b"localId", local_id) + b'"pos":%d,' + text(b"remoteId", remote_id) + b'"term":%d}')


#: (group, leaderId, localId, remoteId) -> an APPEND reply's body template (a member sees a handful)
_APPEND_REPLY_TEMPLATES: dict[tuple[str | None, ...], bytes] = {}
#: The template writes these keys; should AppendEntryResponse gain a field, it is not used (the flat path is).
_APPEND_REPLY_TEMPLATED = tuple(key for key, _ in messages.flat_wire_fields(AppendEntryResponse) or ()) == (
    "code", "group", "index", "leaderId", "localId", "pos", "remoteId", "term")


def decode_body(cls: type[RequestOrResponse], body: bytes, header: Header | None = None) -> RequestOrResponse:
    """Parse a JSON body into ``cls``; :class:`BodyError` if it is not one."""
    try:
        obj = _loads(body, BodyError, f"{cls.__name__} body")
    except BodyError as exc:
        exc.header = header
        raise
    try:
        return messages.from_wire(cls, obj)
    except (ValueError, TypeError, KeyError, AttributeError, RecursionError, binascii.Error) as exc:
        raise BodyError(f"{cls.__name__} body: {str(exc)[:200]}", header) from None


# -- binary PUSH bodies -------------------------------------------------------------

BINARY_VERSION = 1
_FLAG_BATCH = 1
_BIN_PREFIX = struct.Struct(">BBIII")  # version, flags, metaLen, count, crc32c(entries)


def encode_push_binary(request: PushEntryRequest) -> bytes:
    """The dledger binary body of a PUSH request.

    Layout (big-endian): ``u8 version=1 | u8 flags (bit 0: entries are batchEntry) | u32 metaLen
    | u32 count | u32 crc32c(entries section) | meta | entries``; ``meta`` is the JSON body without
    ``entry``/``batchEntry``; the entries section is ``count`` entries in the entry codec's layout,
    back to back.  The section CRC covers entry headers as well as bodies, so any corruption in
    transit is detected even for entries whose own ``bodyCrc`` is 0 (written by Java).
    """
    body = _PushBody(request)
    buf = bytearray(body.size)
    body.write_into(buf, 0)
    return bytes(buf)


class _PushBody:
    """A binary PUSH body measured first, then written straight into the frame buffer (no extra copies).

    The entries section comes from :meth:`EntryList.section` when the request carries an EntryList (the
    leader's pushes do), so entries pushed to several followers are encoded and CRC'd once.
    """

    __slots__ = ("entries", "meta", "batch", "size", "section")

    def __init__(self, request: PushEntryRequest):
        if request.entry is not None and request.batch_entry:
            raise ValueError("a PUSH request carries either entry or batch_entry, not both")
        entries = request.batch_entry or ([request.entry] if request.entry is not None else [])
        self.entries = entries
        self.section = entries.section() if type(entries) is EntryList else None
        self.batch = bool(request.batch_entry)
        meta_obj = messages.to_wire(replace(request, entry=None, batch_entry=[]))
        for key in ("batchEntry", "batch", "count", "firstEntryIndex", "lastEntryIndex"):
            meta_obj.pop(key, None)
        self.meta = _utf8(_dumps(meta_obj))
        entries_size = len(self.section[0]) if self.section is not None else encoded_size(entries)
        self.size = _BIN_PREFIX.size + len(self.meta) + entries_size

    def parts(self) -> tuple[bytes, bytes, bytes | memoryview]:
        """``(prefix, meta, entries section)`` for a body whose section is known: joined with the frame's
        other parts in one copy (a leader's pushes of ~1 MiB are copied once, not into a buffer and out)."""
        section, crc = self.section
        prefix = _BIN_PREFIX.pack(BINARY_VERSION, _FLAG_BATCH if self.batch else 0, len(self.meta),
                                  len(self.entries), crc)
        return prefix, self.meta, section

    def write_into(self, buf: bytearray, offset: int) -> None:
        start = offset + _BIN_PREFIX.size + len(self.meta)
        with memoryview(buf) as view:  # slice assignment through a view: one copy (a bytearray's copies twice)
            view[offset + _BIN_PREFIX.size:start] = self.meta
            if self.section is not None:
                section, crc = self.section
                view[start:start + len(section)] = section
            else:
                off = start
                for e in self.entries:
                    off += encode_entry_into(buf, off, e)
                crc = _crc32c.crc32c(view[start:off])
        _BIN_PREFIX.pack_into(buf, offset, BINARY_VERSION, _FLAG_BATCH if self.batch else 0,
                              len(self.meta), len(self.entries), crc)


def _encode_push_frame(header: Header, request: PushEntryRequest) -> bytes:
    body = _PushBody(request)
    head = header.to_json()
    if body.section is not None:
        return b"".join((_LENGTHS.pack(4 + len(head) + body.size, len(head)), head, *body.parts()))
    buf = bytearray(8 + len(head) + body.size)
    _LENGTHS.pack_into(buf, 0, 4 + len(head) + body.size, len(head))
    buf[8:8 + len(head)] = head
    body.write_into(buf, 8 + len(head))
    return bytes(buf)  # Twisted transports take bytes only


def decode_push_binary(body: bytes, header: Header | None = None) -> PushEntryRequest:
    """Inverse of :func:`encode_push_binary`; every entry is CRC-checked (:class:`BinaryBodyError`)."""
    flags, meta_bytes, section, count, crc = _binary_parts(body, "PUSH", header)
    if count * 48 > len(section):
        raise BinaryBodyError(f"binary PUSH announces {count} entries but has only {len(section)} bytes", header)
    try:
        meta = _loads(meta_bytes, BinaryBodyError, "binary PUSH meta")
    except BinaryBodyError as exc:
        exc.header = header
        raise
    if isinstance(meta, dict) and ("entry" in meta or "batchEntry" in meta):
        raise BinaryBodyError("binary PUSH meta must not carry entries", header)
    try:
        request = messages.from_wire(PushEntryRequest, meta)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BinaryBodyError(f"binary PUSH meta: {str(exc)[:200]}", header) from None
    entries = _decode_entry_section(body, len(body) - len(section), count, "PUSH", header)
    if flags & _FLAG_BATCH:
        if not entries:
            raise BinaryBodyError("binary PUSH marked batch but carries no entries", header)
        request.batch_entry = EntryList(entries, (section, crc), crc_checked=True,  # stored byte for byte
                                        largest=entries.largest, irecs=entries.irecs)
    elif count > 1:
        raise BinaryBodyError(f"binary PUSH carries {count} entries but is not marked batch", header)
    elif entries:
        request.entry = entries[0]
    return request


def _decode_entry_section(body: bytes, off: int, count: int, what: str, header: Header | None) -> EntryList:
    """The ``count`` entries from ``off`` to the end of a binary body, each decoded, CRC-checked and bounded."""
    end = len(body)
    try:
        entries, off = decode_entries(body, off, end, count, accept_zero_crc=True)
    except CodecError as exc:
        raise BinaryBodyError(f"binary {what} entry #{exc.number}: {exc}", header) from None
    if off != end:
        raise BinaryBodyError(f"binary {what} body has {end - off} bytes after its {count} entries", header)
    if not messages.decoded_entries_in_bounds(entries):
        for i, entry in enumerate(entries):
            if messages.decoded_entry_bounds_error(entry) is not None:
                raise BinaryBodyError(messages.entry_bounds_error(entry, f"binary {what} entry #{i}"), header)
    return entries


# -- binary GET replies ----------------------------------------------------------------

def encode_get_reply_binary(response: GetEntriesResponse) -> bytes:
    """The dledger binary body of a GET reply: the binary PUSH layout with the reply's fields as meta.

    ``u8 version=1 | u8 flags=0 | u32 metaLen | u32 count | u32 crc32c(entries) | meta | entries``; ``meta`` is
    the reply's JSON without ``entries``, the entries are in the entry codec's layout (header then body, as
    stored).  A bulk reader then gets a 4 MiB reply without Base64 on either side, and the section CRC
    catches damage in transit.
    """
    entries = response.entries
    meta_obj = messages.to_wire(replace(response, entries=[]))
    meta_obj.pop("entries", None)
    meta = _utf8(_dumps(meta_obj))
    start = _BIN_PREFIX.size + len(meta)
    buf = bytearray(start + encoded_size(entries))
    buf[_BIN_PREFIX.size:start] = meta
    off = start
    for e in entries:
        off += encode_entry_into(buf, off, e)
    with memoryview(buf) as view:
        crc = _crc32c.crc32c(view[start:])
    _BIN_PREFIX.pack_into(buf, 0, BINARY_VERSION, 0, len(meta), len(entries), crc)
    return bytes(buf)


def decode_get_reply_binary(body: bytes, header: Header | None = None) -> GetEntriesResponse:
    """Inverse of :func:`encode_get_reply_binary`; every entry is CRC-checked (:class:`BinaryBodyError`)."""
    meta_bytes, section, count = _get_reply_parts(body, header)
    response = _get_reply_meta(meta_bytes, header)
    response.entries = _decode_entry_section(body, len(body) - len(section), count, "GET reply", header)
    return response


def _get_reply_parts(body: bytes, header: Header | None) -> tuple[bytes, Any, int]:
    """A binary GET reply's meta, entry section and entry count, with the checks both decoders make first."""
    flags, meta_bytes, section, count, _ = _binary_parts(body, "GET reply", header)
    if flags:
        raise BinaryBodyError(f"binary GET reply has flags {flags:#x} (none are defined)", header)
    if count * HEADER_SIZE > len(section):
        raise BinaryBodyError(f"binary GET reply announces {count} entries but has only {len(section)} bytes",
                              header)
    return meta_bytes, section, count


def _get_reply_meta(meta_bytes: bytes, header: Header | None) -> GetEntriesResponse:
    meta = _loads(meta_bytes, BinaryBodyError, "binary GET reply meta")
    if not isinstance(meta, dict) or "entries" in meta:
        raise BinaryBodyError("binary GET reply meta must be an object without entries", header)
    try:
        return messages.from_wire(GetEntriesResponse, meta)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BinaryBodyError(f"binary GET reply meta: {str(exc)[:200]}", header) from None


def decode_get_reply_raw(body: bytes, header: Header | None = None) -> messages.GetEntriesRawResponse:
    """:func:`decode_get_reply_binary` with the entries left as bytes (``section``, ``count``) for a bulk
    reader to decode into columns: the prefix, the meta and the section CRC are checked here, each entry
    (its header, its body's CRC) by that decoder."""
    meta_bytes, section, count = _get_reply_parts(body, header)
    meta = _get_reply_meta(meta_bytes, header)
    return messages.GetEntriesRawResponse(**{f: getattr(meta, f) for f in _GET_REPLY_FIELDS},
                                          section=section, count=count)


def _raw_json_get_reply(response: GetEntriesResponse) -> messages.GetEntriesRawResponse:
    """A JSON GET reply as the raw form: its entries decoded, no section."""
    return messages.GetEntriesRawResponse(**{f: getattr(response, f) for f in _GET_REPLY_FIELDS},
                                          entries=response.entries)


_GET_REPLY_FIELDS = tuple(f.name for f in fields(GetEntriesResponse) if f.name != "entries")


# -- binary APPEND bodies -------------------------------------------------------------

_LEN = struct.Struct(">I")
_unpack_len = _LEN.unpack_from
#: Parsed meta of recent binary APPENDs: a client sends the same meta with every append (its group and
#: target), so the JSON is parsed once.  Bounded: cleared when full.
_APPEND_META: dict[bytes, dict[str, Any]] = {}
_APPEND_META_MAX = 256


def encode_append_binary(request: AppendEntryRequest) -> bytes:
    """The dledger binary body of an APPEND request (dledger clients to dledger members).

    Layout (big-endian), the PUSH body's prefix: ``u8 version=1 | u8 flags (bit 0: batchMsgs) | u32 metaLen
    | u32 count | u32 crc32c(bodies section) | meta | bodies``; ``meta`` is the JSON body without ``body`` /
    ``batchMsgs``; the bodies section is ``count`` times ``u32 length + the body's bytes``.  No Base64, no
    JSON for the payload; the section CRC catches damage in transit before anything is appended.
    """
    batch = request.batch_msgs is not None
    payloads = request.bodies()
    meta = _utf8(_dumps(messages.to_wire(replace(request, body=None, batch_msgs=None))))
    parts = [b""]
    for body in payloads:
        parts.append(_LEN.pack(len(body)))
        parts.append(body)
    section = b"".join(parts)
    prefix = _BIN_PREFIX.pack(BINARY_VERSION, _FLAG_BATCH if batch else 0, len(meta), len(payloads),
                              _crc32c.crc32c(section))
    return b"".join((prefix, meta, section))


def decode_append_binary(body: bytes, header: Header | None = None) -> AppendEntryRequest:
    """Inverse of :func:`encode_append_binary` (:class:`BinaryBodyError` for anything malformed or damaged)."""
    flags, meta, section, count, _ = _binary_parts(body, "APPEND", header)
    kwargs = _APPEND_META.get(meta)
    if kwargs is None:
        try:
            obj = _loads(meta, BinaryBodyError, "binary APPEND meta")
        except BinaryBodyError as exc:
            exc.header = header
            raise
        if not isinstance(obj, dict) or "body" in obj or "batchMsgs" in obj:
            raise BinaryBodyError("binary APPEND meta must be an object without bodies", header)
        try:
            kwargs = _kwargs(messages.from_wire(AppendEntryRequest, obj))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise BinaryBodyError(f"binary APPEND meta: {str(exc)[:200]}", header) from None
        if len(_APPEND_META) >= _APPEND_META_MAX:
            _APPEND_META.clear()
        _APPEND_META[meta] = kwargs
    if count == 1 and not flags & _FLAG_BATCH and len(section) >= 4 and _unpack_len(section)[0] == len(section) - 4:
        return AppendEntryRequest(**kwargs, body=bytes(section[4:]))  # one body filling the section: most APPENDs
    payloads = []
    off, end = 0, len(section)
    for _ in range(count):
        if end - off < 4:
            raise BinaryBodyError(f"binary APPEND body #{len(payloads)} is cut short", header)
        n = _unpack_len(section, off)[0]
        off += 4
        if n > end - off:
            raise BinaryBodyError(f"binary APPEND body #{len(payloads)} of {n} bytes runs past the frame", header)
        payloads.append(bytes(section[off:off + n]))
        off += n
    if off != end:
        raise BinaryBodyError(f"binary APPEND body has {end - off} bytes after its {count} bodies", header)
    if flags & _FLAG_BATCH:
        return AppendEntryRequest(**kwargs, batch_msgs=payloads)
    if count != 1:
        raise BinaryBodyError(f"binary APPEND carries {count} bodies but is not marked batch", header)
    return AppendEntryRequest(**kwargs, body=payloads[0])


# -- binary INSTALL_SNAPSHOT bodies -----------------------------------------------------

def encode_install_binary(request: InstallSnapshotRequest) -> bytes:
    """The dledger binary body of an INSTALL_SNAPSHOT request (only ever sent between dledger members).

    The APPEND/PUSH prefix (``u8 version=1 | u8 flags=0 | u32 metaLen | u32 count | u32 crc32c(data)``),
    ``meta`` = the JSON body without ``data``, then the chunk's bytes as they are (``count`` 1 with data,
    0 without).  No Base64: a chunk is up to ``snapshotChunkSize`` bytes; the CRC catches damage in transit
    before a byte is written (the manifest's per-file CRC checks the whole file once it is complete).
    """
    data = request.data
    meta = _utf8(_dumps(messages.to_wire(replace(request, data=None))))
    section = data if data is not None else b""
    prefix = _BIN_PREFIX.pack(BINARY_VERSION, 0, len(meta), 0 if data is None else 1, _crc32c.crc32c(section))
    return b"".join((prefix, meta, section))


def decode_install_binary(body: bytes, header: Header | None = None) -> InstallSnapshotRequest:
    """Inverse of :func:`encode_install_binary` (:class:`BinaryBodyError` for anything malformed or damaged)."""
    flags, meta, section, count, _ = _binary_parts(body, "INSTALL_SNAPSHOT", header)
    if flags:
        raise BinaryBodyError(f"binary INSTALL_SNAPSHOT body has flags {flags:#x} (none are defined)", header)
    if count not in (0, 1) or (count == 0 and len(section)):
        raise BinaryBodyError(f"binary INSTALL_SNAPSHOT announces {count} chunks with {len(section)} bytes "
                              "(expected 1 chunk, or 0 and no bytes)", header)
    obj = _loads(meta, BinaryBodyError, "binary INSTALL_SNAPSHOT meta")
    if not isinstance(obj, dict) or "data" in obj:
        raise BinaryBodyError("binary INSTALL_SNAPSHOT meta must be an object without data", header)
    try:
        request = messages.from_wire(InstallSnapshotRequest, obj)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise BinaryBodyError(f"binary INSTALL_SNAPSHOT meta: {str(exc)[:200]}", header) from None
    request.data = bytes(section) if count else None
    return request


def _kwargs(request: AppendEntryRequest) -> dict[str, Any]:
    """The constructor arguments that rebuild ``request`` (its base fields)."""
    return {"group": request.group, "remote_id": request.remote_id, "local_id": request.local_id,
            "code": request.code, "leader_id": request.leader_id, "term": request.term}


def _binary_parts(body: bytes, what: str, header: Header | None) -> tuple[int, bytes, memoryview, int, int]:
    """``(flags, meta, section, count, crc)`` of a binary body, its prefix checked and its section CRC verified."""
    if len(body) < _BIN_PREFIX.size:
        raise BinaryBodyError(f"binary {what} body of {len(body)} bytes is shorter than its "
                              f"{_BIN_PREFIX.size}-byte prefix", header)
    version, flags, meta_len, count, crc = _BIN_PREFIX.unpack_from(body)
    if version != BINARY_VERSION:
        raise BinaryBodyError(f"binary {what} body version {version} is not supported (only {BINARY_VERSION})",
                              header)
    if flags & ~_FLAG_BATCH:
        raise BinaryBodyError(f"binary {what} body has unknown flags {flags:#x}", header)
    start = _BIN_PREFIX.size + meta_len
    if start > len(body):
        raise BinaryBodyError(f"binary {what} meta length {meta_len} runs past the {len(body)}-byte body", header)
    section = memoryview(body)[start:]
    actual = _crc32c.crc32c(section)
    if actual != crc:
        raise BinaryBodyError(f"binary {what} body failed its crc32c check (sent {crc:#010x}, "
                              f"received {actual:#010x}): corrupted in transit", header)
    return flags, body[_BIN_PREFIX.size:start], section, count, crc


# -- messages <-> frames ---------------------------------------------------------------

def encode_request(request: RequestOrResponse, opaque: int, *, binary: bool = False, oneway: bool = False) -> bytes:
    """A request frame as Java writes it; ``binary`` selects the dledger binary body (PUSH and APPEND).

    For a GET, ``binary`` keeps the JSON body and asks for a binary *reply* (``extFields`` ``dledger.reply``).
    """
    code = int(messages.request_code(request))
    flag = FLAG_ONEWAY if oneway else 0
    if binary and isinstance(request, messages.GetEntriesRequest):
        return encode_frame(Header(code, opaque, flag, ext_fields=dict(BINARY_REPLY_EXT_FIELDS)), encode_body(request))
    if binary:
        header = Header(code, opaque, flag, ext_fields=dict(BINARY_EXT_FIELDS))
        if isinstance(request, PushEntryRequest):
            return _encode_push_frame(header, request)
        if isinstance(request, AppendEntryRequest):
            return encode_frame(header, encode_append_binary(request))
        if isinstance(request, InstallSnapshotRequest):
            return encode_frame(header, encode_install_binary(request))
        raise TypeError(f"only PUSH, APPEND, INSTALL_SNAPSHOT and GET requests have a binary form, "
                        f"not {type(request).__name__}")
    return encode_frame(Header(code, opaque, flag), encode_body(request))


def encode_response(response: RequestOrResponse, opaque: int, *, remark: str | None = None) -> bytes:
    """A reply frame: flag 1, header code 200, the DLedger result in the body's ``code``."""
    return encode_reply(opaque, encode_body(response), remark)


def encode_reply(opaque: int, body: bytes, remark: str | None = None, *, binary: bool = False,
                 ext_fields: dict[str, str] | None = None) -> bytes:
    """The reply frame carrying ``body`` for request ``opaque`` (the header straight from its template).

    ``binary`` marks ``body`` as a dledger binary body (a GET reply from :func:`encode_get_reply_binary`);
    ``ext_fields`` go into the header too (a signed reply's MAC).
    """
    if remark is not None or binary or ext_fields:
        ext = {**(ext_fields or {}), **(BINARY_EXT_FIELDS if binary else {})} or None
        return encode_frame(Header(REMOTING_SUCCESS, opaque, FLAG_RESPONSE, remark=remark, ext_fields=ext), body)
    head = _PLAIN_HEADER % (REMOTING_SUCCESS, FLAG_RESPONSE, opaque, 0)
    return b"".join((_LENGTHS.pack(4 + len(head) + len(body), len(head)), head, body))


_REQUEST_CLASSES = {int(code): request for code, (request, _) in messages.RPCS.items()}


def request_class(header: Header) -> type[RequestOrResponse]:
    """The request class of a request header; :class:`UnknownRequestCodeError` if there is none."""
    cls = _REQUEST_CLASSES.get(header.code)
    if cls is None and header.code in PLUGIN_REQUEST_CODES:
        return messages.PluginRequest
    if cls is None:
        raise UnknownRequestCodeError(f"request code {header.code} is not supported", header)
    return cls


def decode_request(frame: Frame) -> RequestOrResponse:
    """The request object a request frame carries (JSON or dledger binary body)."""
    header = frame.header
    if header.is_response:
        raise BodyError("expected a request, got a response frame", header)
    cls = request_class(header)
    encoding = header.body_encoding
    if encoding is None:
        request = decode_body(cls, frame.body, header)
        if cls is messages.PluginRequest:
            request.request_code = header.code  # the header's code is the one the guard checked
        return request
    if encoding != BODY_BINARY:
        raise BodyError(f"body encoding {encoding!r} is not supported", header)
    if cls is PushEntryRequest:
        return decode_push_binary(frame.body, header)
    if cls is AppendEntryRequest:
        return decode_append_binary(frame.body, header)
    if cls is InstallSnapshotRequest:
        return decode_install_binary(frame.body, header)
    raise BodyError(f"a binary body is only defined for PUSH, APPEND and INSTALL_SNAPSHOT, "
                    f"not request code {header.code}", header)


def decode_response(frame: Frame, cls: type[RequestOrResponse]) -> RequestOrResponse:
    """The response object a reply frame carries, as ``cls`` (known from the request with the same opaque)."""
    header = frame.header
    if not header.is_response:
        raise BodyError("expected a response, got a request frame", header)
    if header.code != REMOTING_SUCCESS:
        raise BodyError(f"remoting error {header.code}: {header.remark or 'no remark'}", header)
    if header.body_encoding is not None:
        if header.body_encoding == BODY_BINARY and cls is GetEntriesResponse:
            return decode_get_reply_binary(frame.body, header)
        if header.body_encoding == BODY_BINARY and cls is messages.GetEntriesRawResponse:
            return decode_get_reply_raw(frame.body, header)
        raise BodyError(f"body encoding {header.body_encoding!r} is not supported in replies", header)
    if cls is messages.GetEntriesRawResponse:  # a member that answers GETs in JSON
        return _raw_json_get_reply(decode_body(GetEntriesResponse, frame.body, header))
    return decode_body(cls, frame.body, header)


def error_body(header: Header, code: ResponseCode) -> bytes:
    """A reply body for a request we could not even decode: the response class's defaults with ``code``."""
    try:
        cls = messages.RPCS[RequestCode(header.code)][1]
    except (ValueError, KeyError):
        cls = messages.PluginResponse if header.code in PLUGIN_REQUEST_CODES else RequestOrResponse
    return encode_body(cls(code=int(code)))


__all__ = [
    "BINARY_EXT_FIELDS", "BINARY_REPLY_EXT_FIELDS", "BODY_BINARY", "BODY_ENCODING_KEY", "DEFAULT_MAX_FRAME_SIZE",
    "FLAG_ONEWAY", "FLAG_RESPONSE", "REMOTING_SUCCESS", "REPLY_ENCODING_KEY", "SERIALIZE_JSON", "SERIALIZE_ROCKETMQ",
    "BinaryBodyError", "BodyError", "Frame", "FrameError", "FrameLengthError", "FrameSplitter",
    "FrameTooLargeError", "Header", "HeaderError", "UnknownRequestCodeError", "UnsupportedSerializeTypeError",
    "decode_append_binary", "decode_body", "decode_frame", "decode_get_reply_binary", "decode_install_binary",
    "decode_get_reply_raw",
    "decode_push_binary", "encode_install_binary",
    "decode_request", "decode_response", "encode_append_binary", "encode_body", "encode_frame",
    "encode_get_reply_binary", "encode_push_binary", "encode_reply", "encode_request", "encode_response",
    "error_body", "frame_size", "request_class", "split_frames",
]
