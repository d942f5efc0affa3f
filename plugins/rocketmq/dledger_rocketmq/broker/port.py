"""The broker port: RocketMQ 4.x remoting for the core producer/consumer request codes.

One :class:`BrokerPort` service per member (added by the plugin's
``dledger_services`` hook when ``rocketmq.enabled`` and ``rocketmq.listen``
are set) listens on its own endpoint and answers SEND_MESSAGE (10),
SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320), PULL_MESSAGE (11),
QUERY_CONSUMER_OFFSET (14), UPDATE_CONSUMER_OFFSET (15, two-way and oneway),
GET_MAX_OFFSET (30) and GET_MIN_OFFSET (31) through the
:class:`~dledger_rocketmq.broker.Broker` facade.  Every other code is answered
by the handler an extension module (``EXTENSIONS``: admin and query codes,
client sessions, forwarding from a slave) put in ``BrokerPort.handlers``, or
with REQUEST_CODE_NOT_SUPPORTED (3) when none did.

The decisions are pure functions (``*_args``: extFields -> call arguments;
``*_reply``: broker result -> :class:`Reply`), table-tested; the protocol only
moves frames.  Framing is dledger's :class:`~dledger.transport.remoting.FrameSplitter`
(bounded by ``rocketmq.maxFrameSize``) with this module's header decoder:
both serialize types (0 JSON, 1 ROCKETMQ binary) and lenient extFields
(ali-ons sends numbers and booleans where Java sends strings).  A reply uses
the request's serialize type.

Client sessions (heartbeats, consumer groups, subscription checks, long
polling, locks, send-back) are the extension :mod:`~dledger_rocketmq.broker.port_clients`,
which replaces the PULL_MESSAGE handler with one composed of this module's
``pull_precheck`` / ``commit_pulled`` / ``read_pull``.
"""

from __future__ import annotations

import importlib
import json
import re
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from twisted.application import service
from twisted.internet import protocol, task
from twisted.internet.defer import Deferred, gatherResults, maybeDeferred
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from dledger.interfaces import ANSWER_LATER
from dledger.transport.listener import TLS_AT_PLAIN_PORT, ListenerGuard, ListenerLimits, tls_hello, warn_peer
from dledger.transport.outbox import send_written, sendable_connection, wrote
from dledger.transport.remoting import (
    FLAG_RESPONSE,
    SERIALIZE_JSON,
    SERIALIZE_ROCKETMQ,
    FrameError,
    FrameSplitter,
    Header,
    HeaderError,
    UnsupportedSerializeTypeError,
)
from dledger.transport.sockopts import set_no_delay
from dledger_rocketmq.broker.broker import GetResult, GetStatus
from dledger_rocketmq.broker.brokerstats import BrokerStatsManager
from dledger_rocketmq.common.batch import batch_records, batch_views, decode_batch, stored_batch_size
from dledger_rocketmq.common.control import OffsetCommit
from dledger_rocketmq.common.errors import ArgumentError, CodecError
from dledger_rocketmq.common.message import PROPERTY_DELAY_TIME_LEVEL, Address, MessageRecord, SendRecord
from dledger_rocketmq.store.commitlog import PutResult, PutStatus
from dledger_rocketmq.store.consumequeue import tag_hash
from dledger_rocketmq.store.metadata import PERM_READ, PERM_WRITE, topic_config

log = Logger()

# -- request and response codes (RocketMQ's RequestCode / ResponseCode) ---------------------------------------
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
GET_MAX_OFFSET = 30
GET_MIN_OFFSET = 31
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
#: Modules that add request handlers to every BrokerPort: ``"module:function"``, called with the port as it is
#: made (``port.handlers[code] = fn``; ``port.connection_lost_callbacks.append(...)``).  One line per module.
EXTENSIONS: list[str] = [
    "dledger_rocketmq.broker.port_admin:install",
    "dledger_rocketmq.broker.port_clients:install",
    "dledger_rocketmq.broker.port_acl:install",
    "dledger_rocketmq.broker.forward:install",  # last: it wraps the send handlers the others installed
]

SUCCESS = 0
SYSTEM_ERROR = 1
SYSTEM_BUSY = 2
REQUEST_CODE_NOT_SUPPORTED = 3
FLUSH_DISK_TIMEOUT = 10
SLAVE_NOT_AVAILABLE = 11
FLUSH_SLAVE_TIMEOUT = 12
MESSAGE_ILLEGAL = 13
SERVICE_NOT_AVAILABLE = 14
TOPIC_NOT_EXIST = 17
PULL_NOT_FOUND = 19
PULL_RETRY_IMMEDIATELY = 20
PULL_OFFSET_MOVED = 21
QUERY_NOT_FOUND = 22

#: The version a 4.9.8 broker writes in every header (MQVersion V4_9_8 ordinal).
VERSION = 409
MASTER_ID = 0
DEFAULT_MAX_FRAME_SIZE = 16 * 1024 * 1024
FAQ = "\nSee http://rocketmq.apache.org/docs/faq/ for further details."
#: SEND_MESSAGE_V2's short field names -> SEND_MESSAGE's.
V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic", "d": "defaultTopicQueueNums",
            "e": "queueId", "f": "sysFlag", "g": "bornTimestamp", "h": "flag", "i": "properties",
            "j": "reconsumeTimes", "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}
#: What RocketMQ adds to every send response header.
SEND_EXTRA = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP", "GO", "PHP", "OMS")


@dataclass(frozen=True)
class Reply:
    """A response: code, remark, extFields (None: no custom header) and body."""

    code: int
    remark: str | None = None
    ext: dict[str, str] | None = None
    body: bytes = b""


# -- headers: both serialize types, lenient extFields ----------------------------------------------------------

def _ext_text(value: Any) -> str:
    """An extFields value as the string Java would have sent (ali-ons: numbers and booleans)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def _int_field(obj: dict, key: str, default: int | None = None) -> int:
    value = obj.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not -(1 << 31) <= value < (1 << 31):
        raise HeaderError(f"header: {key!r} must be a Java int, got {value!r:.40}")
    return value


_scan_json = json.JSONDecoder().scan_once


def _loads(text: str) -> Any:
    """``json.loads(text)`` for a header: an object filling the whole text goes straight to the C scanner.

    ``json.loads`` wraps the same scanner in two Python calls and two
    whitespace matches (a third of its time on a producer's header); anything
    else (whitespace around, a non-object, an error) takes ``json.loads``, so
    what is accepted and every error message are ``json.loads``'s.
    """
    if text[:1] == "{":
        try:
            obj, end = _scan_json(text, 0)
        except (StopIteration, ValueError, RecursionError):
            pass
        else:
            if end == len(text):
                return obj
    return json.loads(text)


def decode_json_header(data: bytes) -> Header:
    """A JSON RemotingCommand header, any key order, extFields values of any JSON type (made strings).

    The stock producer's send header (:func:`fast_send_header`) is read by one pattern, with its send
    arguments; any other header, or one the pattern does not take, by the general rules
    (:func:`general_json_header`), which give every error.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise HeaderError(f"header: invalid JSON: {str(exc)[:120]}") from None
    return fast_send_header(text) or general_json_header(text)


def general_json_header(text: str) -> Header:
    """:func:`decode_json_header` of a header's text by the general rules: any key order, any JSON value types."""
    try:
        obj = _loads(text)
    except (ValueError, RecursionError) as exc:
        raise HeaderError(f"header: invalid JSON: {str(exc)[:120]}") from None
    if not isinstance(obj, dict):
        raise HeaderError("header: expected a JSON object")
    ext = obj.get("extFields")
    if ext is not None and not isinstance(ext, dict):
        raise HeaderError("header: 'extFields' must be an object")
    remark = obj.get("remark")
    if ext is not None:  # a Java client's values are all strings already: the dict as parsed (JSON keys are str)
        ext = ext if _ONLY_STR >= set(map(type, ext.values())) else {str(k): _ext_text(v) for k, v in ext.items()}
    code, opaque, flag, version = (obj.get("code"), obj.get("opaque"), obj.get("flag", 0), obj.get("version", 0))
    if not (type(code) is type(opaque) is type(flag) is type(version) is int
            and _INT_MIN <= min(code, opaque, flag, version) and max(code, opaque, flag, version) <= _INT_MAX):
        code, opaque = _int_field(obj, "code"), _int_field(obj, "opaque")  # the error naming the field
        flag, version = _int_field(obj, "flag", 0), _int_field(obj, "version", 0)
    language = obj.get("language", "JAVA")
    return Header(code, opaque, flag, language if type(language) is str else str(language), version,
                  remark if isinstance(remark, str) else None, ext, "JSON")


_ONLY_STR = frozenset((str,))
_INT_MIN, _INT_MAX = -(1 << 31), (1 << 31) - 1


class SendFields(dict):
    """The extFields of a send header read by :func:`fast_send_header`: a plain dict to every reader, with its
    :class:`SendArgs` in ``args`` (for the request ``code``), which :func:`send_args` returns instead of
    reading the fields again.  Nothing changes a request's extFields after decoding (a relay copies them)."""

    __slots__ = ("code", "args")


def _send_header_pattern() -> re.Pattern[str]:
    """The JSON header of a SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE as the stock 4.x Java producer writes it.

    Keys in fastjson's order (sorted; extFields ``a``..``n`` as a HashMap of one-letter keys iterates them),
    ``l`` (maxReconsumeTimes) and ``n`` (brokerName) optional, every extFields value a string.  Strings
    without escapes, except the properties (``i``), whose ``\\u0001`` / ``\\u0002`` separators are undone
    after the match; integer fields of at most 9 digits (18 for bornTimestamp; 10 for the opaque, checked),
    so none needs a range check.  The top-level integers as JSON writes them (no leading zero).
    """
    s, props = r'([^"\\\x00-\x1f]*)', r'([^"\x00-\x1f]*)'
    i, born = r'(-?[0-9]{1,9})', r'(-?[0-9]{1,18})'
    json_int = r'(-?(?:0|[1-9][0-9]{0,8}))'
    ext = (f'"a":"{s}","b":"{s}","c":"{s}","d":"{i}","e":"{i}","f":"{i}","g":"{born}","h":"{i}","i":"{props}",'
           f'"j":"{i}","k":"{s}"(?:,"l":"{s}")?,"m":"{s}"(?:,"n":"{s}")?')
    return re.compile(r'\{"code":(310|320),"extFields":\{' + ext + r'\},"flag":' + json_int
                      + r',"language":"JAVA","opaque":(-?(?:0|[1-9][0-9]{0,9})),"serializeTypeCurrentRPC":"JSON",'
                      + r'"version":' + json_int + r'\}')


_SEND_HEADER = _send_header_pattern().fullmatch


def fast_send_header(text: str) -> Header | None:
    """The stock producer's send header (:func:`_send_header_pattern`) as :func:`general_json_header` and
    :func:`send_args` read it, in one match: the Header, its extFields a :class:`SendFields` carrying the
    send arguments.  None for anything else (the general rules then decide, errors included).

    Why: a single send's JSON header and send arguments cost ~8 us on the master by the general rules
    (the JSON scanner, the type checks, the short names' lookups and conversions), ~40 % of the port's own
    work per send (issue #28, Round 2f).
    """
    m = _SEND_HEADER(text)
    if m is None:
        return None
    code, a, b, c, d, e, f, g, h, i, j, k, l_, m_, n, flag, opaque, version = m.groups()
    opaque = int(opaque)
    if not _INT_MIN <= opaque <= _INT_MAX:
        return None
    if "\\" in i:  # the properties' separators; any other escape: the general rules
        i = i.replace("\\u0001", "\x01").replace("\\u0002", "\x02")
        if "\\" in i:
            return None
    if l_ is None and n is not None:  # what the stock producer sends: one dict display, in the JSON's order
        ext = SendFields(a=a, b=b, c=c, d=d, e=e, f=f, g=g, h=h, i=i, j=j, k=k, m=m_, n=n)
    else:
        ext = SendFields(a=a, b=b, c=c, d=d, e=e, f=f, g=g, h=h, i=i, j=j, k=k)
        if l_ is not None:
            ext["l"] = l_
        ext["m"] = m_
        if n is not None:
            ext["n"] = n
    code = int(code)
    ext.code = code
    ext.args = SendArgs(a, b, c, int(d), int(e), int(f), int(g), int(h), i, int(j),
                        code == SEND_BATCH_MESSAGE or m_.lower() == "true")
    return Header(code, opaque, int(flag), "JAVA", int(version), None, ext, "JSON")


_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag


def decode_binary_header(data: bytes) -> Header:
    """A ROCKETMQ (serializeType 1) header: fixed fields, remark, then (keyLen16, key, valLen32, val) pairs."""
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(data, 0)
        pos = _BIN_FIXED.size
        (n,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise HeaderError(f"header: remark length {n} out of range")
        remark = data[pos:pos + n].decode("utf-8") if n else None
        pos += n
        (ext_len,) = struct.unpack_from(">i", data, pos)
        pos += 4
        if ext_len < 0 or pos + ext_len > len(data):
            raise HeaderError(f"header: extFields length {ext_len} out of range")
        ext: dict[str, str] | None = {} if ext_len else None
        end = pos + ext_len
        while pos < end:
            (kl,) = struct.unpack_from(">h", data, pos)
            key = data[pos + 2:pos + 2 + kl].decode("utf-8")
            pos += 2 + kl
            (vl,) = struct.unpack_from(">i", data, pos)
            if vl < 0 or pos + 4 + vl > end:
                raise HeaderError(f"header: extFields value length {vl} out of range")
            ext[key] = data[pos + 4:pos + 4 + vl].decode("utf-8")
            pos += 4 + vl
    except (struct.error, UnicodeDecodeError) as exc:
        raise HeaderError(f"header: malformed ROCKETMQ binary header: {exc}") from None
    language = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else "OTHER"
    return Header(code, opaque, flag, language, version, remark, ext, "ROCKETMQ")


def encode_binary_header(header: Header) -> bytes:
    """The ROCKETMQ binary form of ``header`` (extFields in the dict's order)."""
    lang = LANGUAGES.index(header.language) if header.language in LANGUAGES else 0
    remark = (header.remark or "").encode("utf-8")
    ext = b"".join(struct.pack(">h", len(k := key.encode())) + k + struct.pack(">i", len(v := val.encode())) + v
                   for key, val in (header.ext_fields or {}).items())
    return (_BIN_FIXED.pack(header.code, lang, header.version, header.opaque, header.flag)
            + struct.pack(">i", len(remark)) + remark + struct.pack(">i", len(ext)) + ext)


def decode_header(serialize_type: int, data: bytes) -> Header:
    """:class:`FrameSplitter`'s header decoder for the port: type 0 JSON, type 1 ROCKETMQ binary."""
    if serialize_type == SERIALIZE_JSON:
        return decode_json_header(data)
    if serialize_type == SERIALIZE_ROCKETMQ:
        return decode_binary_header(data)
    raise UnsupportedSerializeTypeError(f"serializeType {serialize_type} is not supported (0 JSON, 1 ROCKETMQ)")


def encode_command(header: Header, body: bytes = b"") -> bytes:
    """A frame in the header's serialize type (``serialize_type`` "ROCKETMQ" -> binary, else JSON)."""
    if header.serialize_type == "ROCKETMQ":
        head, kind = encode_binary_header(header), SERIALIZE_ROCKETMQ
    else:
        head, kind = header.to_json(), SERIALIZE_JSON
    return struct.pack(">iI", 4 + len(head) + len(body), kind << 24 | len(head)) + head + body


class SendOkFields(dict):
    """The extFields of a successful send (:func:`send_reply`): a plain dict to every reader; its type tells
    :func:`reply_frame` that a JSON reply may be filled into :data:`_SEND_OK_JSON` instead of built and sorted."""


#: A successful send's JSON reply header, byte for byte what :meth:`Header.to_json` writes for it (sorted keys).
_SEND_OK_JSON = (b'{"code":0,"extFields":{"MSG_REGION":"DefaultRegion","TRACE_ON":"true","msgId":"%s","queueId":"%s",'
                 b'"queueOffset":"%s"},"flag":1,"language":"JAVA","opaque":%d,"serializeTypeCurrentRPC":"JSON",'
                 b'"version":%d}')
_SEND_OK_KEYS = frozenset(("MSG_REGION", "TRACE_ON", "msgId", "queueId", "queueOffset"))


def reply_frame(request: Header, reply: Reply) -> bytes:
    """The response frame for ``request``: same opaque and serialize type, flag 1, version 409."""
    ext = reply.ext
    if (type(ext) is SendOkFields and request.serialize_type == "JSON" and reply.remark is None and not reply.body
            and ext.keys() == _SEND_OK_KEYS and ext["MSG_REGION"] == "DefaultRegion" and ext["TRACE_ON"] == "true"
            and (frame := _send_ok(ext["msgId"], ext["queueId"].encode(), ext["queueOffset"].encode(),
                                   request.opaque))):
        return frame
    return encode_command(Header(reply.code, request.opaque, FLAG_RESPONSE, "JAVA", VERSION, reply.remark,
                                 reply.ext, request.serialize_type), reply.body)


def send_ok_frame(request: Header, result: PutResult) -> bytes:
    """``reply_frame(request, send_reply(result))``, the same bytes, for the lean path's answers
    (:meth:`BrokerPort.sends_answered`): a stored send to a JSON request is filled straight into
    :data:`_SEND_OK_JSON`, without its Reply and extFields made and checked (~1.5 us a send)."""
    if result.status is PutStatus.PUT_OK and request.serialize_type == "JSON":
        frame = _send_ok(_msg_ids(result), b"%d" % result.queue_id, b"%d" % result.queue_offset, request.opaque)
        if frame is not None:
            return frame
    return reply_frame(request, send_reply(result))


def _send_ok(ids: str, queue_id: bytes, queue_offset: bytes, opaque: int) -> bytes | None:
    """A successful send's JSON reply frame filled into :data:`_SEND_OK_JSON`; None if ``ids`` has anything JSON
    would escape (the general encoding then)."""
    if not (ids.isascii() and ids.replace(",", "").isalnum()):
        return None
    head = _SEND_OK_JSON % (ids.encode(), queue_id, queue_offset, opaque, VERSION)
    return struct.pack(">iI", 4 + len(head), len(head)) + head


def _msg_ids(result: PutResult) -> str:
    """A send reply's ``msgId``: a batch's ids joined by commas, else the one id."""
    return ",".join(result.msg_ids) if result.msg_ids else (result.msg_id or "")


# -- extFields helpers ----------------------------------------------------------------------------------------

def ext_str(ext: dict[str, str], key: str, default: str | None = None) -> str:
    value = ext.get(key, default)
    if value is None:
        raise ArgumentError(f"the request lacks the field {key!r}")
    return value


def ext_int(ext: dict[str, str], key: str, default: int | None = None, *, bits: int = 32) -> int:
    """An integer field (Java sends "2", ali-ons 2: both arrive as text here)."""
    value = ext.get(key)
    if value is None or value == "":
        if default is None:
            raise ArgumentError(f"the request lacks the field {key!r}")
        return default
    try:
        n = int(value)
    except ValueError:
        raise ArgumentError(f"field {key!r} is not an integer: {value!r:.40}") from None
    if not -(1 << (bits - 1)) <= n < (1 << (bits - 1)):
        raise ArgumentError(f"field {key!r} = {n} is out of range")
    return n


def ext_bool(ext: dict[str, str], key: str) -> bool:
    return ext.get(key, "false").lower() == "true"


# -- SEND --------------------------------------------------------------------------------------------------------

@dataclass(slots=True)
class SendArgs:
    """A send request's header (SendMessageRequestHeader; V2's short names expanded).

    Slotted, not frozen: one is made per send, and a frozen dataclass sets each of its eleven fields through
    ``object.__setattr__`` (1.7 us against 0.6, Round 2f).  Nobody changes one once made.
    """

    producer_group: str
    topic: str
    default_topic: str
    default_topic_queue_nums: int
    queue_id: int
    sys_flag: int
    born_timestamp: int
    flag: int
    properties: str
    reconsume_times: int
    batch: bool


def send_args(code: int, ext: dict[str, str]) -> SendArgs:
    """The send header of a SEND_MESSAGE / SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE request."""
    if type(ext) is SendFields and ext.code == code:  # read with its header (fast_send_header)
        return ext.args
    if code in (SEND_MESSAGE_V2, SEND_BATCH_MESSAGE) and "b" in ext:
        fast = _send_args_v2(code, ext)
        if fast is not None:
            return fast
        ext = {V2_NAMES.get(k, k): v for k, v in ext.items()}
    return SendArgs(producer_group=ext_str(ext, "producerGroup", ""), topic=ext_str(ext, "topic"),
                    default_topic=ext_str(ext, "defaultTopic", "TBW102"),
                    default_topic_queue_nums=ext_int(ext, "defaultTopicQueueNums", 4),
                    queue_id=ext_int(ext, "queueId"), sys_flag=ext_int(ext, "sysFlag", 0),
                    born_timestamp=ext_int(ext, "bornTimestamp", 0, bits=64), flag=ext_int(ext, "flag", 0),
                    properties=ext.get("properties") or "", reconsume_times=ext_int(ext, "reconsumeTimes", 0),
                    batch=code == SEND_BATCH_MESSAGE or ext_bool(ext, "batch"))


def _send_args_v2(code: int, ext: dict[str, str]) -> SendArgs | None:
    """:func:`send_args` of a well-formed V2 header read straight from its short names; None for anything else.

    Every single send of the stock producer comes this way: no renamed copy
    of the extFields and no per-field helper calls (about half the cost of
    the general path).  A field missing, empty or out of range returns None:
    the general path gives the error naming the field, or its default.
    """
    try:
        get = ext.get
        topic, queue_id = ext["b"], int(ext["e"])
        nums, sys_flag, flag, times = int(get("d") or 4), int(get("f") or 0), int(get("h") or 0), int(get("j") or 0)
        born = int(get("g") or 0)
    except (KeyError, ValueError, TypeError):
        return None
    group, default_topic = get("a", ""), get("c", "TBW102")
    if not (type(topic) is type(group) is type(default_topic) is str and _LONG_MIN <= born <= _LONG_MAX
            and _INT_MIN <= min(queue_id, nums, sys_flag, flag, times)
            and max(queue_id, nums, sys_flag, flag, times) <= _INT_MAX):
        return None
    return SendArgs(group, topic, default_topic, nums, queue_id, sys_flag, born, flag,
                    get("i") or "", times, code == SEND_BATCH_MESSAGE or get("m", "false").lower() == "true")


_LONG_MIN, _LONG_MAX = -(1 << 63), (1 << 63) - 1
_DELAY = PROPERTY_DELAY_TIME_LEVEL.encode()


def send_record(args: SendArgs, body: bytes, born_host: Address, *, queue_id: int | None = None) -> SendRecord:
    """The record a single send stores, as the lean path hands it to the put (:class:`SendRecord`)."""
    return SendRecord(args.topic, body, args.properties.encode("utf-8"),
                      args.queue_id if queue_id is None else queue_id, args.flag, args.sys_flag,
                      args.born_timestamp, born_host, args.reconsume_times)


def send_template(args: SendArgs, body: bytes, born_host: Address, *, queue_id: int | None = None) -> MessageRecord:
    """The record a send stores (for a batch: what its messages share, see :func:`batch_records`)."""
    return send_record(args, body, born_host, queue_id=queue_id).record()


def send_items(body: bytes) -> list[tuple[memoryview, bytes, int]]:
    """The messages of a batch send's body as views (:func:`batch_views`; CodecError if malformed or empty)."""
    items = batch_views(body)
    if not items:
        raise CodecError("empty batch")
    return items


def send_records(args: SendArgs, body: bytes, born_host: Address, *, queue_id: int | None = None
                 ) -> list[MessageRecord]:
    """The records a send stores: one message, or one per item of a batch body (CodecError if malformed)."""
    template = send_template(args, body, born_host, queue_id=queue_id)
    if not args.batch:
        return [template]
    send_items(body)  # the checks, the empty batch's included
    return batch_records(decode_batch(body), template)


def send_topic_check(args: SendArgs, topic: dict | None, default: dict | None, *, can_create: bool
                     ) -> tuple[Reply | None, dict | None, int]:
    """RocketMQ's msgCheck: (error reply, topic config to create, queue id to store in).

    A topic unknown to this broker is auto-created (master only) from the
    default topic when that exists and is inheritable (``autoCreateTopicEnable``),
    with min(defaultTopicQueueNums, default's write queues) queues; else
    TOPIC_NOT_EXIST.  A queue id past the write queues is SYSTEM_ERROR; a
    negative one picks queue 0 (Java picks a random queue).
    """
    create = None
    if topic is None:
        if default is None or not can_create or not default.get("perm", 0) & 1:
            return (Reply(TOPIC_NOT_EXIST, f"topic[{args.topic}] not exist, apply first please!{FAQ}",
                          dict(SEND_EXTRA)), None, 0)
        nums = max(1, min(args.default_topic_queue_nums, int(default.get("writeQueueNums", 4))))
        topic = create = topic_config(args.topic, nums, nums, PERM_READ | PERM_WRITE)
    if not topic.get("perm", PERM_WRITE) & PERM_WRITE:
        return Reply(SERVICE_NOT_AVAILABLE, f"the topic[{args.topic}] sending is forbidden",
                     dict(SEND_EXTRA)), None, 0
    queue_id = args.queue_id if args.queue_id >= 0 else 0
    writes = int(topic.get("writeQueueNums", 16))
    readq = int(topic.get("readQueueNums", 16))
    if queue_id >= max(writes, readq):
        return (Reply(SYSTEM_ERROR, f"request queueId[{queue_id}] is illegal, {topic} Producer: "
                      f"{args.producer_group}", dict(SEND_EXTRA)), None, 0)
    return None, create, queue_id


_SEND_ERRORS = {
    PutStatus.FLUSH_DISK_TIMEOUT: (FLUSH_DISK_TIMEOUT, None),
    PutStatus.FLUSH_SLAVE_TIMEOUT: (FLUSH_SLAVE_TIMEOUT, None),
    PutStatus.SLAVE_NOT_AVAILABLE: (SLAVE_NOT_AVAILABLE, None),
    PutStatus.SERVICE_NOT_AVAILABLE: (SERVICE_NOT_AVAILABLE,
                                      "service not available now. It may be caused by one of the following "
                                      "reasons: the broker's disk is full, messages are put to the slave, "
                                      "message store has been shut down, etc."),
    PutStatus.CREATE_MAPEDFILE_FAILED: (SYSTEM_ERROR, "create mapped file failed, server is busy or broken."),
    PutStatus.MESSAGE_ILLEGAL: (MESSAGE_ILLEGAL, "the message is illegal, maybe msg body or properties length "
                                                 "not matched. msg body length limit 128k, msg properties "
                                                 "length limit 32k."),
    PutStatus.PROPERTIES_SIZE_EXCEEDED: (MESSAGE_ILLEGAL, "the message is illegal, maybe msg properties length "
                                                          "limit 32k."),
    PutStatus.OS_PAGECACHE_BUSY: (SYSTEM_BUSY, "[PC_SYNCHRONIZED]broker busy, start flow control for a while"),
    PutStatus.UNKNOWN_ERROR: (SYSTEM_ERROR, "UNKNOWN_ERROR"),
}


def send_reply(result: PutResult) -> Reply:
    """SendMessageProcessor's response for a put result (SUCCESS: msgId, queueId, queueOffset)."""
    if result.ok:
        return Reply(SUCCESS, None, SendOkFields(SEND_EXTRA, msgId=_msg_ids(result), queueId=str(result.queue_id),
                                                 queueOffset=str(result.queue_offset)))
    ext = dict(SEND_EXTRA)
    code, remark = _SEND_ERRORS.get(result.status, (SYSTEM_ERROR, None))
    text = remark or result.status.name
    if result.error and result.status is not PutStatus.SERVICE_NOT_AVAILABLE:
        text = f"{text} ({result.error})"
    return Reply(code, text, ext)


# -- PULL --------------------------------------------------------------------------------------------------------

SYSFLAG_COMMIT_OFFSET = 1
SYSFLAG_SUSPEND = 2
SYSFLAG_SUBSCRIPTION = 4


@dataclass(frozen=True)
class PullArgs:
    """A PULL_MESSAGE header (PullMessageRequestHeader)."""

    group: str
    topic: str
    queue_id: int
    offset: int
    max_nums: int
    sys_flag: int
    commit_offset: int
    subscription: str | None
    expression_type: str
    sub_version: int = 0
    suspend_timeout_ms: int = 0


def pull_args(ext: dict[str, str]) -> PullArgs:
    """The pull header; the subscription is read only when sysFlag has the SUBSCRIPTION bit (as Java)."""
    sys_flag = ext_int(ext, "sysFlag", 0)
    return PullArgs(group=ext_str(ext, "consumerGroup"), topic=ext_str(ext, "topic"),
                    queue_id=ext_int(ext, "queueId"), offset=ext_int(ext, "queueOffset", bits=64),
                    max_nums=ext_int(ext, "maxMsgNums"), sys_flag=sys_flag,
                    commit_offset=ext_int(ext, "commitOffset", 0, bits=64),
                    subscription=ext.get("subscription") if sys_flag & SYSFLAG_SUBSCRIPTION else None,
                    expression_type=ext.get("expressionType") or "TAG",
                    sub_version=ext_int(ext, "subVersion", 0, bits=64),
                    suspend_timeout_ms=ext_int(ext, "suspendTimeoutMillis", 0, bits=64))


def subscription_tags(expression: str | None) -> list[str] | None:
    """The tags of a TAG expression (``A || B``), None for ``*`` / none (every message)."""
    if expression is None:
        return None
    tags = [t.strip() for t in expression.split("||") if t.strip()]
    if not tags or "*" in tags:
        return None
    return tags


def subscription_codes(args: PullArgs) -> set[int] | None:
    """The tag hashes a pull that carries its subscription asks for (None: every message)."""
    tags = subscription_tags(args.subscription) if args.expression_type.upper() == "TAG" else None
    return {tag_hash(t) for t in tags} if tags else None


def pull_reply(args: PullArgs, result: GetResult, *, is_master: bool, offset_check_in_slave: bool = False,
               suggest_broker_id: int = MASTER_ID) -> Reply:
    """PullMessageProcessor's response for a GetResult (without long polling: nothing found is answered now).

    The status name is the remark; FOUND carries the records as the body.  A
    slave answers PULL_RETRY_IMMEDIATELY instead of PULL_OFFSET_MOVED unless
    ``offsetCheckInSlave`` (Java does the same).
    """
    ext = {"suggestWhichBrokerId": str(suggest_broker_id), "nextBeginOffset": str(result.next_begin_offset),
           "minOffset": str(result.min_offset), "maxOffset": str(result.max_offset)}
    status = result.status
    body = b""
    if status is GetStatus.FOUND:
        code, body = SUCCESS, b"".join(result.records)
    elif status in (GetStatus.NO_MATCHED_MESSAGE, GetStatus.MESSAGE_WAS_REMOVING):
        code = PULL_RETRY_IMMEDIATELY
    elif status in (GetStatus.NO_MATCHED_LOGIC_QUEUE, GetStatus.NO_MESSAGE_IN_QUEUE):
        code = PULL_OFFSET_MOVED if args.offset != 0 else PULL_NOT_FOUND
    elif status in (GetStatus.OFFSET_FOUND_NULL, GetStatus.OFFSET_OVERFLOW_ONE):
        code = PULL_NOT_FOUND
    else:  # OFFSET_OVERFLOW_BADLY, OFFSET_TOO_SMALL
        code = PULL_OFFSET_MOVED
    if code == PULL_OFFSET_MOVED and not (is_master or offset_check_in_slave):
        code = PULL_RETRY_IMMEDIATELY
    return Reply(code, status.name, ext, body)


# -- offsets -------------------------------------------------------------------------------------------------------

def queue_args(ext: dict[str, str]) -> tuple[str, int]:
    """(topic, queueId) of GET_MAX_OFFSET / GET_MIN_OFFSET."""
    return ext_str(ext, "topic"), ext_int(ext, "queueId")


def offset_key(ext: dict[str, str]) -> tuple[str, str, int]:
    """(consumerGroup, topic, queueId) of QUERY/UPDATE_CONSUMER_OFFSET."""
    return ext_str(ext, "consumerGroup"), ext_str(ext, "topic"), ext_int(ext, "queueId")


def query_offset_reply(offset: int, min_offset: int) -> Reply:
    """ConsumerManageProcessor.queryConsumerOffset: the stored offset; none stored and the queue starts at 0
    -> SUCCESS 0; else QUERY_NOT_FOUND (the client then decides where to start)."""
    if offset >= 0:
        return Reply(SUCCESS, None, {"offset": str(offset)})
    if min_offset <= 0:
        return Reply(SUCCESS, None, {"offset": "0"})
    return Reply(QUERY_NOT_FOUND, "Not found, V3_0_6_SNAPSHOT maybe this group consumer boot first", {})


def unsupported_reply(code: int) -> Reply:
    return Reply(REQUEST_CODE_NOT_SUPPORTED, f" request type {code} not supported")


#: RocketMQ's GET_ALL_TOPIC_CONFIG: what a Java slave's sync asks on its master's VIP port (and nothing else does).
GET_ALL_TOPIC_CONFIG = 21


def vip_topic_sync_refusal(*, is_master: bool, self_id: str) -> Reply | None:
    """The answer to GET_ALL_TOPIC_CONFIG on the VIP endpoint: None (answer it) on the master, else a refusal.

    Why: a Java slave keeps its master's address until its next registration (up to 10 s) and replaces its
    whole topic table by what that address answers when the DataVersion differs.  A dledger member started
    in the stopped master's place (same address, as the migration runbook does) is a slave with a table of
    its own; answering would wipe the Java slave's topics (the full live migration test lost one that
    way).  Refused, the Java slave logs the error and asks again at its next sync, then of the real master.
    """
    if is_master:
        return None
    return Reply(SYSTEM_ERROR, f"{self_id} is not the master: a Java slave's topic sync must not copy this member's "
                               "table (ask the master registered with the name server)")


@dataclass(slots=True)
class Request:
    """One request as a handler sees it: code, lenient extFields, body, and the connection it came on.

    Slots, and the send header cached in a slot of its own rather than by
    ``functools.cached_property`` (whose lock, on Python 3.11, cost as much as
    the rest of the request object): one is made per request.
    """

    code: int
    ext: dict[str, Any]
    body: bytes = b""
    conn: Any = None  # the BrokerPortProtocol (None in unit tests)
    header: Header | None = None
    _sending: SendArgs | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def born_host(self) -> Address:
        return self.conn.born_host if self.conn is not None else Address("127.0.0.1", 0)

    @property
    def sending(self) -> SendArgs:
        """The send header (:func:`send_args`), decoded once however many send handlers look at it."""
        args = self._sending
        if args is None:
            args = self._sending = send_args(self.code, self.ext)
        return args


# -- the protocol ----------------------------------------------------------------------------------------------------

class BrokerPortProtocol(protocol.Protocol):
    """One client connection: frames in, one reply per two-way request out (in completion order)."""

    #: It came in on the VIP endpoint (``rocketmq.vipListen``).
    vip = False

    def __init__(self, port: BrokerPort):
        self.port = port
        self.splitter = FrameSplitter(port.max_frame_size, header_decoder=decode_header)
        self.closed = False
        #: The lean single sends of the read being handled (:class:`ReadSends`; None: none yet).
        self.read_sends: ReadSends | None = None
        #: The plain TCP connection under the transport: replies written to it leave at the end of the work
        #: that wrote them (this read's handling, a commit's answers), not after the reactor's next poll
        #: (:mod:`dledger.transport.outbox`); None for TLS and test transports (Twisted's own path).
        self._sendable = None

    def connectionMade(self):
        set_no_delay(self.transport)  # as RocketMQ's NettyRemotingServer: replies never wait for an ACK
        self._sendable = sendable_connection(self.transport)
        peer = self.transport.getPeer()
        self.born_host = Address(getattr(peer, "host", "127.0.0.1"), getattr(peer, "port", 0))
        try:
            self.born_host.packed()
        except ValueError:
            self.born_host = Address("127.0.0.1", 0)

    def dataReceived(self, data: bytes):
        # The single sends of one read go to the log as one store batch (CommitLog.gather), each answered alone.
        commitlog = getattr(getattr(self.port, "broker", None), "commitlog", None)  # None: the name server's port
        if commitlog is not None:
            commitlog.gather()
        try:
            for frame in self.splitter.feed(data):
                if self.closed:
                    return
                self.port.handle(self, frame.header, frame.body)
        except FrameError as exc:
            # Rate-limited per port and address (dledger's connection guard): a flood of bad frames is a few lines.
            why = TLS_AT_PLAIN_PORT if tls_hello(data) else exc
            warn_peer(self, "bad frame", "closing connection from {peer}: {exc}", peer=str(self.born_host), exc=why)
            self.closed = True
            self.transport.loseConnection()
        finally:
            self.read_sends = None  # the next read's sends are answered together, apart from these
            if commitlog is not None:
                commitlog.flush_gathered()
            send_written()  # the replies this read wrote leave now (dledger.transport.outbox)

    def unfinished_request(self) -> int:
        """Bytes the frame now arriving will have (0: none): the guard's read timeout closes a slow sender."""
        return self.splitter.unfinished

    def connectionLost(self, reason=None):
        self.closed = True
        self.port.connections.discard(self)
        for callback in self.port.connection_lost_callbacks:
            callback(self)

    def answer(self, request: Header, reply: Reply) -> None:
        if not self.closed and not request.is_oneway:
            self.transport.write(reply_frame(request, reply))
            wrote(self._sendable)

    def answer_with(self, reply: Reply, request: Header) -> None:
        """:meth:`answer` with the arguments the other way round: a Deferred's callback, no closure per request."""
        self.answer(request, reply)

    def answer_frames(self, frames: list[bytes]) -> None:
        """Reply frames answered together (:meth:`BrokerPort.sends_answered`): one transport write for all."""
        if not self.closed:
            self.transport.write(b"".join(frames))
            wrote(self._sendable)


class ReadSends:
    """The single sends of one read on one connection that took the lean path (a
    :class:`~dledger_rocketmq.store.commitlog.PutSink`): answered by plain calls, then together.

    Each put's answer is kept (``put_answered``) until its read's batch of answers is complete
    (``answers_done``: at the flush for the refused ones, at the commit for the others); then
    :meth:`BrokerPort.sends_answered` counts them in the statistics once per topic and writes their replies
    in one transport write.  ``began`` is the read's time (ms), every send's start for its put latency.
    """

    __slots__ = ("port", "conn", "began", "results")

    def __init__(self, port: BrokerPort, conn: BrokerPortProtocol, began: int):
        self.port = port
        self.conn = conn
        self.began = began
        self.results: list = []  # ((request header, topic, size), PutResult)

    def put_answered(self, token: tuple, result: PutResult) -> None:
        self.results.append((token, result))

    def answers_done(self) -> None:
        results, self.results = self.results, []
        if results:
            self.port.sends_answered(self.conn, self.began, results)


def _member_limits(broker: Any) -> ListenerLimits:
    """The connection limits of the member ``broker`` runs in (defaults when it has no configuration)."""
    config = getattr(getattr(broker, "server", None), "config", None)
    try:
        return ListenerLimits.from_config(config)
    except AttributeError:
        return ListenerLimits()


class BrokerPortFactory(protocol.Factory):
    noisy = False

    def __init__(self, port: BrokerPort, *, vip: bool = False):
        self.port = port
        self.vip = vip

    def buildProtocol(self, addr):
        p = BrokerPortProtocol(self.port)
        p.factory = self
        p.vip = self.vip
        self.port.connections.add(p)
        return p


@dataclass
class _Stats:
    requests: int = 0
    errors: int = 0
    forwarded: int = 0  # sends relayed to the master (dledger_rocketmq.broker.forward)
    by_code: dict[int, int] = field(default_factory=dict)


class BrokerPort(service.Service):
    """The RocketMQ remoting endpoint of one member's broker (see the module docstring)."""

    name = "rocketmq-port"

    def __init__(self, broker, endpoint: str, *, reactor: Any = None, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE,
                 now_ms: Callable[[], int] | None = None, access: Any = None, limits: ListenerLimits | None = None,
                 tls_options: Any = None, vip_endpoint: str = ""):
        self.broker = broker
        #: Who may do what (a :class:`dledger_rocketmq.broker.port_acl.PortAccess`: RocketMQ ACL, client-certificate
        #: roles), asked before every handler; None: everyone may do everything (RocketMQ without aclEnable).
        self.access = access
        self.endpoint = endpoint
        #: The connection guard's limits (dledger.transport.listener): the member's maxConnections, timeouts...
        self.limits = limits if limits is not None else _member_limits(broker)
        #: TLS context options for the port (``rocketmq.tlsClientAuth``; None: plain, or TLS from an ``ssl:``
        #: endpoint string): the connection guard puts the listening factory behind TLS.
        self.tls_options = tls_options
        self.listener_guard: ListenerGuard | None = None
        #: RocketMQ's VIP channel (``rocketmq.vipListen``, a Java broker's listenPort - 2): the same port on a
        #: second endpoint, with its own connection guard.  Java 4.9.8 slaves send GET_ALL_TOPIC_CONFIG there
        #: only, so without it a Java slave under a dledger master never learns a topic (issue #28, migfix).
        self.vip_endpoint = vip_endpoint
        self.vip_guard: ListenerGuard | None = None
        self.vip_listening_port = None
        self.reactor = reactor
        self.max_frame_size = max_frame_size
        self.now_ms = now_ms or (lambda: int(time.time() * 1000))
        self.factory = BrokerPortFactory(self)
        self.connections: set[BrokerPortProtocol] = set()
        self.listening_port = None
        self.stats = _Stats()
        #: RocketMQ's runtime statistics (BrokerStatsManager, StoreStatsService, BrokerStats) of this member's
        #: sends and pulls, sampled every second while the port runs (dledger_rocketmq.broker.brokerstats).
        options = getattr(broker, "options", None)
        self.broker_stats = BrokerStatsManager(self.now_ms(),
                                               cluster=getattr(options, "cluster_name", "DefaultCluster"))
        self._stats_loop: task.LoopingCall | None = None
        #: Where a slave learns the current master's broker address (a registration.MasterFetcher, set by the
        #: plugin when rocketmq.namesrvAddr is set): dledger_rocketmq.broker.forward relays sends to it.
        self.master_fetcher = None
        #: Fires with the listening port once bound, or fails.
        self.listening: Deferred = Deferred()
        #: Called with each connection that closes (a client's registrations end with its connection).
        self.connection_lost_callbacks: list[Callable[[BrokerPortProtocol], None]] = []
        #: Called with (connection, header, body) for each response a client sends (to a request the broker
        #: sent it over its connection, e.g. GET_CONSUMER_RUNNING_INFO); none: responses are dropped.
        self.response_callbacks: list[Callable[[BrokerPortProtocol, Header, bytes], None]] = []
        #: Called (no arguments) when the port stops, before its connections close (answer what is pending).
        self.stop_callbacks: list[Callable[[], None]] = []
        #: Request code -> handler (Request -> Reply | Deferred[Reply]); the core codes, then each extension's.
        self.handlers: dict[int, Callable[[Request], Reply | Deferred]] = {
            SEND_MESSAGE: self._send, SEND_MESSAGE_V2: self._send, SEND_BATCH_MESSAGE: self._send,
            PULL_MESSAGE: self._pull, QUERY_CONSUMER_OFFSET: self._query_offset,
            UPDATE_CONSUMER_OFFSET: self._update_offset, GET_MAX_OFFSET: self._max_offset,
            GET_MIN_OFFSET: self._min_offset,
        }
        for path in EXTENSIONS:
            module, _, name = path.partition(":")
            getattr(importlib.import_module(module), name)(self)

    # -- service ---------------------------------------------------------------------------------
    def startService(self):
        """Listen; a bind that fails at once (port in use, bad endpoint) raises, so the member's start fails
        with one line (dledger.services), as for dledger's own ports."""

        super().startService()
        reactor = self.reactor or self.broker.server.clock
        self.start_stats(reactor)
        # Every listener goes through dledger's connection guard: caps, the process's descriptor budget,
        # handshake/read/idle timeouts, rate-limited lines (issue #21).
        self.listener_guard, failure = self._listen(reactor, "broker port", "listen", self.endpoint, self.factory,
                                                    self._bound, self._listen_failed)
        if failure is None and self.vip_endpoint:
            self.vip_guard, failure = self._listen(reactor, "broker VIP port", "vipListen", self.vip_endpoint,
                                                   BrokerPortFactory(self, vip=True), self._vip_bound, None)
            if failure is not None:  # nothing left listening on the main endpoint either
                self.listener_guard.stop()
                port, self.listening_port = self.listening_port, None
                if port is not None:
                    port.stopListening()
        if failure is not None:
            self.running = 0
            if self._stats_loop is not None and self._stats_loop.running:
                self._stats_loop.stop()
            failure.raiseException()

    def _listen(self, reactor: Any, what: str, option: str, endpoint: str, factory, bound: Callable,
                failed: Callable | None) -> tuple[ListenerGuard, Failure | None]:
        """Listen on ``endpoint`` through a connection guard of its own; ``bound(port)`` once bound.

        A bind that fails at once (port in use, bad endpoint) is returned, so the start fails with one line
        (dledger.services), as for dledger's own ports; one that fails later is logged here (nobody else
        reports it: the member runs without that endpoint).  ``failed(failure)`` either way.
        """
        guard = ListenerGuard(what, self.limits, reactor)
        d = guard.listen(reactor, endpoint, factory, self.tls_options)
        outcome: list = []
        d.addBoth(outcome.append)

        def settle(_=None, *, report: bool = True) -> Failure | None:
            result = outcome[0]
            if isinstance(result, Failure):
                if report:
                    log.error("{id}: cannot listen on rocketmq.{option}={ep}: {err}", id=self.broker.server.self_id,
                              option=option, ep=endpoint, err=result.getErrorMessage())
                    log.failure("rocketmq {what} listen failed", result, what=what, level=LogLevel.debug)
                if failed is not None:
                    failed(result)
                return result
            h = result.getHost()
            log.info("{id}: RocketMQ {what} on {host}:{port}", id=self.broker.server.self_id, what=what, host=h.host,
                     port=h.port)
            bound(result)
            return None
        if not outcome:  # an endpoint that binds later: settled (and a failure reported) then
            d.addCallback(settle).addErrback(lambda _: None)
            return guard, None
        return guard, settle(report=False)

    def _bound(self, port) -> None:
        self.listening_port = port
        self.listening.callback(port)

    def _listen_failed(self, f: Failure) -> None:
        self.listening.errback(f)
        self.listening.addErrback(lambda _: None)  # waiters see None; the error is reported once

    def _vip_bound(self, port) -> None:
        self.vip_listening_port = port

    def start_stats(self, clock: Any) -> None:
        """Sample the runtime statistics every second on ``clock`` (startService does; until stopService)."""
        self._stats_loop = task.LoopingCall(lambda: self.broker_stats.tick(self.now_ms()))
        self._stats_loop.clock = clock
        self._stats_loop.start(1.0, now=True)

    def stopService(self):
        super().stopService()
        if self._stats_loop is not None and self._stats_loop.running:
            self._stats_loop.stop()
        for callback in list(self.stop_callbacks):
            try:
                callback()
            except Exception:
                log.failure("rocketmq port: stop callback {cb!r} failed", cb=callback)
        for conn in list(self.connections):
            conn.closed = True
            conn.transport.loseConnection()
        if self.listener_guard is not None:
            self.listener_guard.stop()
        if self.vip_guard is not None:
            self.vip_guard.stop()
        ports = [p for p in (self.listening_port, self.vip_listening_port) if p is not None]
        self.listening_port = self.vip_listening_port = None
        if ports:
            return gatherResults([maybeDeferred(p.stopListening) for p in ports], consumeErrors=True)
        return None

    # -- dispatch -----------------------------------------------------------------------------------
    def handle(self, conn: BrokerPortProtocol, header: Header, body: bytes) -> None:
        """Answer one request frame; a response (to a request the broker sent) goes to ``response_callbacks``."""
        if header.is_response:
            for callback in list(self.response_callbacks):
                try:
                    callback(conn, header, body)
                except Exception:  # a bug there must not take the client's connection down
                    log.failure("rocketmq port: response callback {cb!r} failed", cb=callback)
            return
        self.stats.requests += 1
        self.stats.by_code[header.code] = self.stats.by_code.get(header.code, 0) + 1
        ext = header.ext_fields or {}
        try:
            d = self.process(Request(header.code, ext, body, conn, header))
        except (ArgumentError, CodecError) as exc:
            d = Reply(SYSTEM_ERROR, str(exc))
        except Exception as exc:  # a bug must not leave the client waiting: answer and log
            log.failure("rocketmq port: request {code} failed", code=header.code)
            d = Reply(SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")
        if isinstance(d, Reply):
            if d.code not in (SUCCESS, PULL_NOT_FOUND, PULL_RETRY_IMMEDIATELY):
                self.stats.errors += 1
            conn.answer(header, d)
            return
        if d is ANSWER_LATER:  # a lean send: its put answers it (ReadSends)
            return
        d.addCallbacks(conn.answer_with, self._failed_answer, callbackArgs=(header,), errbackArgs=(conn, header))

    def _failed_answer(self, f, conn: BrokerPortProtocol, header: Header) -> None:
        """A handler's Deferred failed (a bug: handlers answer errors as replies): SYSTEM_ERROR, logged."""
        log.failure("rocketmq port: request {code} failed", f, code=header.code, level=LogLevel.debug)
        self.stats.errors += 1
        conn.answer(header, Reply(SYSTEM_ERROR, f.getErrorMessage()))

    def process(self, request: Request) -> Reply | Deferred:
        """A Reply now, or a Deferred firing with one: the handler registered for the request's code.

        The access check comes first, for every code (an unknown one included).
        """
        if self.access is not None:
            refused = self.access.refuse(request)
            if refused is not None:
                return refused
        if request.code == GET_ALL_TOPIC_CONFIG and getattr(request.conn, "vip", False):
            roles = getattr(self.broker, "roles", None)
            refused = vip_topic_sync_refusal(is_master=roles is not None and roles.is_master(),
                                             self_id=self.broker.server.self_id)
            if refused is not None:
                return refused
        handler = self.handlers.get(request.code)
        if handler is None:
            return unsupported_reply(request.code)
        return handler(request)

    # -- the core codes ---------------------------------------------------------------------------
    def _max_offset(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, {"offset": str(self.broker.max_offset(*queue_args(req.ext)))})

    def _min_offset(self, req: Request) -> Reply:
        return Reply(SUCCESS, None, {"offset": str(self.broker.min_offset(*queue_args(req.ext)))})

    def _query_offset(self, req: Request) -> Reply:
        group, topic, queue_id = offset_key(req.ext)
        broker = self.broker
        return query_offset_reply(broker.query_offset(group, topic, queue_id), broker.min_offset(topic, queue_id))

    def _update_offset(self, req: Request) -> Deferred:
        group, topic, queue_id = offset_key(req.ext)
        commit = OffsetCommit(group, topic, queue_id, ext_int(req.ext, "commitOffset", bits=64))
        return self.broker.commit_offsets([commit]).addCallback(lambda _: Reply(SUCCESS, None, {}))

    def _send(self, req: Request) -> Reply | Deferred:
        broker = self.broker
        args = req.sending
        body, born_host = req.body, req.born_host
        if broker.role != "MASTER":
            return send_reply(PutResult(PutStatus.SERVICE_NOT_AVAILABLE))
        topics = broker.meta.topics
        topic = topics.get(args.topic)  # the default topic is looked up only for a topic to create
        error, create, queue_id = send_topic_check(args, topic, topics.get(args.default_topic) if topic is None
                                                   else None, can_create=True)
        if error is not None:
            return error
        conn = req.conn
        if create is None and not args.batch and conn is not None:
            # The lean path: no Deferred, answered with its read's sends; no MessageRecord unless a DELAY
            # level asks for the schedule rewrite (Broker.put_gathered), encoded in one pass at the flush.
            send = send_record(args, body, born_host, queue_id=queue_id)
            sends = conn.read_sends
            if sends is None:
                sends = conn.read_sends = ReadSends(self, conn, self.now_ms())
            if broker.put_gathered(send if _DELAY not in send.properties else send.record(), sends,
                                   (req.header, args.topic, send.size)):
                return ANSWER_LATER
            conn.read_sends = None  # not in a read after all: no stale sink for the next one
            return self._store(send.record(), None, args.topic, self.now_ms())
        template = send_template(args, body, born_host, queue_id=queue_id)
        try:
            items = send_items(body) if args.batch else None
        except CodecError as exc:
            return Reply(MESSAGE_ILLEGAL, f"the batch is malformed: {exc}", dict(SEND_EXTRA))

        if create is None:
            return self._store(template, items, args.topic, self.now_ms())
        began = self.now_ms()
        # Auto-creation goes through the log (a control entry every member applies), then the message.
        log.info("{id}: topic {t} auto-created from {d} ({n} queues)", id=broker.server.self_id,
                 t=args.topic, d=args.default_topic, n=create["writeQueueNums"])
        return broker.create_topic(create).addCallback(lambda _: self._store(template, items, args.topic, began))

    def _store(self, template: MessageRecord, items: list | None, topic: str, began: int) -> Deferred:
        """The put of a send, answered by :meth:`_counted` (a bound method and its arguments: no closures per send)."""
        broker = self.broker
        d = broker.put_batch(template, items) if items is not None else broker.put_message(template)
        return d.addCallback(self._counted, template, items, topic, began)

    def _counted(self, result: PutResult, template: MessageRecord, items: list | None, topic: str,
                 began: int) -> Reply:
        """A put answered: the broker statistics, then the send's reply."""
        # A batch's items are send_items(template.body): their records' sizes add up from the lengths alone.
        size = template.size if items is None else stored_batch_size(template, len(items))
        self.broker_stats.on_put(topic, result.count or 1, size, self.now_ms() - began, result.ok)
        return send_reply(result)

    def sends_answered(self, conn: BrokerPortProtocol, began: int, results: list) -> None:
        """Lean single sends answered together (:class:`ReadSends`): one statistics update per topic and
        outcome, and their replies, in the order of the puts, in one write.

        Each send is counted and answered even if the statistics or a reply frame fail (a bug: logged; that
        send answered SYSTEM_ERROR, as :meth:`_failed_answer` would).
        """
        counts: dict[tuple[str, bool], list[int]] = {}
        frames = []
        for (header, topic, size), result in results:
            ok = result.status is PutStatus.PUT_OK
            c = counts.get((topic, ok))
            if c is None:
                counts[(topic, ok)] = [1, result.count or 1, size]
            else:
                c[0] += 1
                c[1] += result.count or 1
                c[2] += size
            if header is not None and not header.is_oneway:
                try:
                    frames.append(send_ok_frame(header, result))
                except Exception as exc:
                    log.failure("rocketmq port: request {code} failed", code=header.code)
                    self.stats.errors += 1
                    frames.append(reply_frame(header, Reply(SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")))
        try:
            elapsed = self.now_ms() - began
            on_puts = self.broker_stats.on_puts
            for (topic, ok), (sends, messages, size) in counts.items():
                on_puts(topic, sends, messages, size, elapsed, ok)
        except Exception:
            log.failure("rocketmq port: counting {n} sends failed", n=len(results))
        if frames:
            conn.answer_frames(frames)

    def _pull(self, req: Request) -> Reply:
        args = pull_args(req.ext)
        error = self.pull_precheck(args)
        if error is not None:
            return error
        self.commit_pulled(args)
        return self.read_pull(args, subscription_codes(args))

    # -- the pull path in parts (extensions compose them: subscriptions, long polling) ---------------------------
    def pull_precheck(self, args: PullArgs) -> Reply | None:
        """The checks before reading: an unknown topic -> TOPIC_NOT_EXIST, maxMsgNums <= 0 -> SYSTEM_ERROR."""
        broker = self.broker
        if broker.meta.topics.get(args.topic) is None and broker.max_offset(args.topic, args.queue_id) == 0:
            return Reply(TOPIC_NOT_EXIST, f"topic[{args.topic}] not exist, apply first please!{FAQ}")
        if args.max_nums <= 0:
            return Reply(SYSTEM_ERROR, f"maxMsgNums {args.max_nums} must be positive")
        return None

    def commit_pulled(self, args: PullArgs) -> None:
        """The consumer's progress riding on its pull (COMMIT_OFFSET flag, push consumers): committed through the
        log on the master when it moved, not waited for."""
        broker = self.broker
        if (args.sys_flag & SYSFLAG_COMMIT_OFFSET and broker.role == "MASTER" and args.commit_offset >= 0
                and broker.query_offset(args.group, args.topic, args.queue_id) != args.commit_offset):
            d = broker.commit_offsets([OffsetCommit(args.group, args.topic, args.queue_id, args.commit_offset)])
            d.addErrback(lambda f: log.debug("pull commitOffset not stored: {e}", e=f.getErrorMessage()))

    def read_pull(self, args: PullArgs, tag_codes: set[int] | None) -> Reply:
        """Read the queue now and answer as PullMessageProcessor does without suspending."""
        broker = self.broker
        result = broker.get_messages(args.group, args.topic, args.queue_id, args.offset, args.max_nums, tag_codes)
        if result.status is GetStatus.FOUND:
            self.broker_stats.on_get(args.group, args.topic, len(result.records), sum(map(len, result.records)))
        else:
            self.broker_stats.on_get(args.group, args.topic, 0, 0)
        return pull_reply(args, result, is_master=broker.role == "MASTER",
                          offset_check_in_slave=broker.options.offset_check_in_slave)
