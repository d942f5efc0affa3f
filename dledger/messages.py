"""Request and response messages, with Java DLedger's field names on the wire.

Python attributes are snake_case; :func:`to_wire` / :func:`from_wire` map
them to the camelCase JSON objects Java DLedger 0.3.2 exchanges (fastjson:
null fields omitted, enums by name, byte arrays as Base64).  Some keys that
Java only exposes through getters (``batch``, ``count``, ``firstEntryIndex``
... of a PUSH request) are derived properties here and appear on the wire
all the same.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import enum
import struct
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any, ClassVar

from dledger.codes import PLUGIN_REQUEST_CODES, PushType, RequestCode, ResponseCode, VoteResult
from dledger.entry import HEADER, HEADER_FIELDS, Entry, EntryList


@dataclass(slots=True, kw_only=True)
class RequestOrResponse:
    """Fields every message carries (Java's ``RequestOrResponse``)."""

    group: str | None = None
    remote_id: str | None = None
    local_id: str | None = None
    code: int = ResponseCode.SUCCESS
    leader_id: str | None = None
    term: int = -1

    WIRE_EXTRA: ClassVar[tuple[str, ...]] = ()

    def base_reply(self, cls: type[RequestOrResponse], code: ResponseCode = ResponseCode.SUCCESS, **kw: Any):
        """A response of type ``cls`` that copies this request's base fields, as Java's ``copyBaseInfo``."""
        base = dict(group=self.group, term=self.term, code=int(code), local_id=self.local_id,
                    remote_id=self.remote_id, leader_id=self.leader_id)
        base.update(kw)
        return cls(**base)

    @property
    def response_code(self) -> ResponseCode:
        return ResponseCode.of(self.code)


# -- election ---------------------------------------------------------------

@dataclass(slots=True, kw_only=True)
class VoteRequest(RequestOrResponse):
    ledger_end_index: int = -1
    ledger_end_term: int = -1


@dataclass(slots=True, kw_only=True)
class VoteResponse(RequestOrResponse):
    vote_result: VoteResult = VoteResult.UNKNOWN


@dataclass(slots=True, kw_only=True)
class HeartBeatRequest(RequestOrResponse):
    pass


@dataclass(slots=True, kw_only=True)
class HeartBeatResponse(RequestOrResponse):
    pass


@dataclass(slots=True, kw_only=True)
class LeadershipTransferRequest(RequestOrResponse):
    transfer_id: str | None = None
    transferee_id: str | None = None
    take_leadership_ledger_index: int = 0


@dataclass(slots=True, kw_only=True)
class LeadershipTransferResponse(RequestOrResponse):
    pass


# -- client API -------------------------------------------------------------

@dataclass(slots=True, kw_only=True)
class AppendEntryRequest(RequestOrResponse):
    """Append one body, or (dledger extension, ``batchMsgs``) several; a batch is acknowledged by its last entry."""

    body: bytes | None = None
    batch_msgs: list[bytes] | None = None

    def bodies(self) -> list[bytes]:
        if self.batch_msgs is not None:
            return list(self.batch_msgs)
        return [self.body] if self.body is not None else []


@dataclass(slots=True, kw_only=True)
class AppendEntryResponse(RequestOrResponse):
    index: int = -1
    pos: int = -1


@dataclass(slots=True, kw_only=True)
class GetEntriesRequest(RequestOrResponse):
    """``followerRead`` (a dledger extension) lets a follower answer from its own committed prefix."""

    begin_index: int = 0
    max_size: int = 0
    index_list: list[int] | None = None
    follower_read: bool | None = None


@dataclass(slots=True, kw_only=True)
class GetEntriesResponse(RequestOrResponse):
    entries: list[Entry] = field(default_factory=list)


@dataclass(slots=True, kw_only=True)
class GetEntriesRawRequest(GetEntriesRequest):
    """A GET (the same request on the wire) whose binary reply is kept undecoded: :class:`GetEntriesRawResponse`.

    For bulk readers that build columns straight from the reply's bytes (the Spark source), with no
    :class:`~dledger.entry.Entry` object per entry.
    """


@dataclass(slots=True, kw_only=True)
class GetEntriesRawResponse(GetEntriesResponse):
    """A GET reply whose binary entry section is kept as received: ``count`` entries in the entry codec's
    layout in ``section`` (its section CRC verified, each entry still to be checked by whoever decodes it).
    ``section`` is None when the member answered in JSON: ``entries`` then holds them, decoded.
    """

    section: bytes | memoryview | None = None
    count: int = 0


@dataclass(slots=True, kw_only=True)
class MetadataRequest(RequestOrResponse):
    """``detail`` (a dledger extension) asks for role, term and log indexes in the reply."""

    detail: bool | None = None


@dataclass(slots=True, kw_only=True)
class MetadataResponse(RequestOrResponse):
    peers: dict[str, str] | None = None
    # dledger extensions (Java clients ignore unknown keys)
    role: str | None = None
    ledger_begin_index: int | None = None
    ledger_end_index: int | None = None
    committed_index: int | None = None
    #: "disk full" / "disk error" while this member's store refuses writes for that (issue 21); else absent.
    disk: str | None = None
    #: On a leader: followers whose last answer said their disk refuses writes, ``{id: "disk full"}``.
    peer_disk: dict[str, str] | None = None


# -- plugins ----------------------------------------------------------------

@dataclass(slots=True, kw_only=True)
class PluginRequest(RequestOrResponse):
    """A request a plugin serves (dledger extension): ``request_code`` in ``codes.PLUGIN_REQUEST_CODES``.

    The frame's header carries the code too (the remoting layer keeps the two equal); ``body`` is the
    plugin's own bytes, which dledger never parses.
    """

    request_code: int = 0
    body: bytes | None = None


@dataclass(slots=True, kw_only=True)
class PluginResponse(RequestOrResponse):
    """A plugin's answer: its bytes, or a code with the plugin's one-line ``reason``."""

    body: bytes | None = None
    reason: str | None = None


# -- replication ------------------------------------------------------------

@dataclass(slots=True, kw_only=True)
class PushEntryRequest(RequestOrResponse):
    """A push from a leader's dispatcher: COMPARE/TRUNCATE carry ``entry``, APPEND ``entry`` or ``batch_entry``."""

    commit_index: int = -1
    type: PushType = PushType.APPEND
    entry: Entry | None = None
    batch_entry: list[Entry] = field(default_factory=list)
    total_size: int = 0

    WIRE_EXTRA: ClassVar[tuple[str, ...]] = ("batch", "count", "first_entry_index", "last_entry_index")

    @property
    def batch(self) -> bool:
        return bool(self.batch_entry)

    @property
    def count(self) -> int:
        return len(self.batch_entry) if self.batch_entry else (1 if self.entry is not None else 0)

    @property
    def first_entry_index(self) -> int:
        if self.batch_entry:
            return self.batch_entry[0].index
        return self.entry.index if self.entry is not None else -1

    @property
    def last_entry_index(self) -> int:
        if self.batch_entry:
            return self.batch_entry[-1].index
        return self.entry.index if self.entry is not None else -1

    def entries(self) -> list[Entry]:
        if self.batch_entry:
            return self.batch_entry
        return [self.entry] if self.entry is not None else []


@dataclass(slots=True, kw_only=True)
class PushEntryResponse(RequestOrResponse):
    index: int | None = None
    begin_index: int = -1
    end_index: int = -1
    count: int = 0


# -- InstallSnapshot (dledger only; code 51006) -----------------------------

@dataclass(slots=True, kw_only=True)
class InstallSnapshotRequest(RequestOrResponse):
    """One step of a leader streaming its newest snapshot to a follower (docs/snapshots.md, "InstallSnapshot").

    ``snapshot_index``/``snapshot_term`` name the snapshot (the follower receives it into
    ``.install-<index>-<term>``); ``manifest`` is its ``manifest.json`` text, carried by every request so
    that a follower that restarted mid-transfer needs nothing else.  With ``path`` set the request carries
    the bytes ``data`` of that file from ``offset``; without it, it only asks where the follower stands
    (the first request of a transfer, and the leader's polls while the follower installs).  Java DLedger
    has no such request: a Java member is never sent one (:mod:`dledger.replication.peerkind`).
    """

    snapshot_index: int = -1
    snapshot_term: int = -1
    manifest: str | None = None
    path: str | None = None
    offset: int = 0
    data: bytes | None = None


@dataclass(slots=True, kw_only=True)
class InstallSnapshotResponse(RequestOrResponse):
    """Where the follower stands: the next ``(next_path, next_offset)`` it wants, or that it is installing / done.

    ``installed`` True: the follower's state is this snapshot (its log is reset to the snapshot's index),
    the leader goes on with PUSH from ``snapshot_index + 1``.  ``installing`` True: every byte arrived and
    the follower is verifying and restoring it; the leader asks again later.  ``begin_index``/``end_index``
    are the follower's log range, as a PUSH reply's.
    """

    snapshot_index: int = -1
    snapshot_term: int = -1
    next_path: str | None = None
    next_offset: int = -1
    installing: bool | None = None
    installed: bool | None = None
    begin_index: int = -1
    end_index: int = -1


# -- snapshots (dledger extension) ---------------------------------------------

@dataclass(slots=True, kw_only=True)
class SnapshotRequest(RequestOrResponse):
    """An admin asks the receiving member to snapshot its state machines now (``dledger snapshot``)."""


@dataclass(slots=True, kw_only=True)
class SnapshotResponse(RequestOrResponse):
    """The snapshot taken (or the newest, if nothing was applied since): its index/term, bytes, the log's begin.

    ``error`` is the member's one-line reason when the code is not SUCCESS.
    """

    index: int = -1
    snapshot_term: int = -1
    snapshot_bytes: int = 0
    ledger_begin_index: int = -1
    error: str | None = None


# -- membership change (dledger extension; code 50101, issue #23) ----------------

@dataclass(slots=True, kw_only=True)
class MembersRequest(RequestOrResponse):
    """List (``op`` "list", any member answers) or change the configuration (the leader; admin role).

    ``op``: list, add, promote, remove (``dledger.membership.rules.Op``); ``member_id`` and, for add,
    ``address`` (``host:port``) and ``learner`` (stay a learner until promoted).
    """

    op: str = "list"
    member_id: str | None = None
    address: str | None = None
    learner: bool | None = None


@dataclass(slots=True, kw_only=True)
class MembersResponse(RequestOrResponse):
    """The configuration in force on the answering member (after the change, once committed).

    ``configuration`` is the configuration's JSON (``Configuration.to_json``: members with id, address,
    role); ``config_index`` the index of its entry (0: the bootstrap ``--peers``); ``error`` the one-line
    refusal when the code is not SUCCESS.
    """

    configuration: dict | None = None
    config_index: int = -1
    committed_index: int = -1
    error: str | None = None


#: request code -> (request class, response class)
RPCS: dict[RequestCode, tuple[type[RequestOrResponse], type[RequestOrResponse]]] = {
    RequestCode.METADATA: (MetadataRequest, MetadataResponse),
    RequestCode.APPEND: (AppendEntryRequest, AppendEntryResponse),
    RequestCode.GET: (GetEntriesRequest, GetEntriesResponse),
    RequestCode.VOTE: (VoteRequest, VoteResponse),
    RequestCode.HEART_BEAT: (HeartBeatRequest, HeartBeatResponse),
    RequestCode.PUSH: (PushEntryRequest, PushEntryResponse),
    RequestCode.LEADERSHIP_TRANSFER: (LeadershipTransferRequest, LeadershipTransferResponse),
    RequestCode.SNAPSHOT: (SnapshotRequest, SnapshotResponse),
    RequestCode.INSTALL_SNAPSHOT: (InstallSnapshotRequest, InstallSnapshotResponse),
    RequestCode.MEMBERS: (MembersRequest, MembersResponse),
}
REQUEST_CODES: dict[type, RequestCode] = {req: code for code, (req, _) in RPCS.items()}
RESPONSE_TYPES: dict[type, type] = {req: resp for req, resp in RPCS.values()}
#: Every code of ``codes.PLUGIN_REQUEST_CODES`` carries these (the plugin's code is in the request).
PLUGIN_RPC = (PluginRequest, PluginResponse)
RESPONSE_TYPES[PluginRequest] = PluginResponse
REQUEST_CODES[GetEntriesRawRequest] = RequestCode.GET
RESPONSE_TYPES[GetEntriesRawRequest] = GetEntriesRawResponse


def request_code(request: RequestOrResponse) -> int:
    """The remoting request code of a request object (a plugin request's own ``request_code``)."""
    if type(request) is PluginRequest:
        if request.request_code not in PLUGIN_REQUEST_CODES:
            raise ValueError(f"plugin request code {request.request_code} is outside the plugins' range "
                             f"{PLUGIN_REQUEST_CODES.start}-{PLUGIN_REQUEST_CODES.stop - 1}")
        return request.request_code
    try:
        return REQUEST_CODES[type(request)]
    except KeyError:
        raise TypeError(f"{type(request).__name__} is not a request") from None


def error_response(request: RequestOrResponse, code: ResponseCode, **kw: Any) -> RequestOrResponse:
    """The response a server gives when ``request`` fails with ``code``: Java copies the request's base fields."""
    return request.base_reply(RESPONSE_TYPES[type(request)], code, **kw)


# -- wire mapping -----------------------------------------------------------

def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


def entry_to_wire(entry: Entry) -> dict[str, Any]:
    return {"body": base64.b64encode(entry.body).decode("ascii"), "bodyCrc": entry.body_crc,
            "chainCrc": entry.chain_crc, "channel": entry.channel, "index": entry.index,
            "magic": entry.magic, "pos": entry.pos, "size": entry.size, "term": entry.term}


def entry_from_wire(obj: dict[str, Any]) -> Entry:
    """An entry from its JSON object; every integer must be a JSON integer within its field's bounds."""
    body = obj.get("body") or ""
    if not isinstance(body, str):
        raise ValueError("entry.body: expected base64 text")
    fields = {}
    for key, name, default in _ENTRY_KEYS:
        value = obj.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"entry.{key}: expected an integer, got {value!r:.40}")
        fields[name] = check_bounds(f"entry.{key}", value, ENTRY_BOUNDS[name])
    return Entry(body=binascii.a2b_base64(body, strict_mode=True), **fields)


#: (wire key, Entry attribute, default when absent) of an entry's integer fields
_ENTRY_KEYS = (("index", "index", -1), ("term", "term", -1), ("pos", "pos", -1), ("magic", "magic", 1),
               ("channel", "channel", 0), ("chainCrc", "chain_crc", 0), ("bodyCrc", "body_crc", 0))


# -- bounds of integers from the wire ---------------------------------------
#
# Why: every term, index and position a member receives may end up in a fixed-width field on disk
# (signed 64-bit in the entry header, index record, ``currterm`` and ``checkpoint``; signed 32-bit
# sizes).  A value that does not fit used to be accepted and persisted, after which every write
# failed with ``struct.error`` and the group was bricked (issue #9, item 13).  So every integer is
# checked here, once, when a message is decoded: nothing out of range reaches a member's state.

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
INT64_MAX = 2 ** 63 - 1
#: The largest term a message may carry: one below the signed 64-bit field, so that a member can
#: still move to ``term + 1`` (``nextTerm``) and persist it.
MAX_TERM = INT64_MAX - 1
#: The largest index a message may carry: ``index + 1`` (the next entry) must still fit.
MAX_INDEX = INT64_MAX - 1
MAX_POS = INT64_MAX


class Bounds(typing.NamedTuple):
    """The accepted range of one integer field (inclusive) and what the range stands for."""

    lo: int
    hi: int
    why: str


TERM = Bounds(-1, MAX_TERM, "signed 64-bit term with room for +1")
INDEX = Bounds(-1, MAX_INDEX, "signed 64-bit index with room for +1")
POSITION = Bounds(-1, MAX_POS, "signed 64-bit byte position")
SIZE = Bounds(0, INT32_MAX, "32-bit size or count")
INT32 = Bounds(INT32_MIN, INT32_MAX, "Java int")

#: Bounds of message fields by attribute name (every message class uses the same name for the same thing).
FIELD_BOUNDS: dict[str, Bounds] = {
    "term": TERM, "ledger_end_term": TERM,
    "index": INDEX, "ledger_end_index": INDEX, "ledger_begin_index": INDEX, "begin_index": INDEX,
    "end_index": INDEX, "commit_index": INDEX, "committed_index": INDEX, "take_leadership_ledger_index": INDEX,
    "index_list": INDEX,  # each element
    "pos": POSITION,
    "count": SIZE, "total_size": SIZE,
    "max_size": INT32, "code": INT32, "request_code": INT32,
    "snapshot_term": TERM, "snapshot_bytes": Bounds(0, MAX_POS, "byte count"),
    "snapshot_index": INDEX, "offset": POSITION, "next_offset": POSITION, "config_index": INDEX,
}
#: Bounds of a transported entry's fields: a placed entry has index, term and position >= 0.
ENTRY_BOUNDS: dict[str, Bounds] = {
    "index": Bounds(0, MAX_INDEX, INDEX.why), "term": Bounds(0, MAX_TERM, TERM.why),
    "pos": Bounds(0, MAX_POS, POSITION.why), "magic": INT32, "channel": INT32, "chain_crc": INT32,
    "body_crc": INT32,
}


def bounds_error(name: str, value: int, bounds: Bounds) -> str | None:
    """Why ``value`` cannot be accepted for field ``name`` (None if it is within ``bounds``)."""
    if bounds.lo <= value <= bounds.hi:
        return None
    shown = str(value) if abs(value) < 10 ** 24 else f"{str(value)[:12]}... ({len(str(abs(value)))} digits)"
    return f"{name} = {shown} is out of range [{bounds.lo}, {bounds.hi}] ({bounds.why})"


def check_bounds(name: str, value: int, bounds: Bounds) -> int:
    """``value`` if within ``bounds``, else ValueError saying which field and which range."""
    error = bounds_error(name, value, bounds)
    if error is not None:
        raise ValueError(error)
    return value


def entry_bounds_error(entry: Entry, where: str = "entry", bounds: dict[str, Bounds] | None = None) -> str | None:
    """Why a transported entry's integers are out of range (None if all fit); ``bounds``: which to check
    (default :data:`ENTRY_BOUNDS`, all of them).

    Every entry a follower receives is checked, so the field names are only
    formatted for a field that fails.
    """
    for name, b in (ENTRY_BOUNDS if bounds is None else bounds).items():
        value = getattr(entry, name)
        if not b.lo <= value <= b.hi:
            return bounds_error(f"{where}.{name}", value, b)
    return None


def _codec_range(fmt: str) -> tuple[int, int]:
    bits = struct.calcsize(fmt) * 8
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


#: The ENTRY_BOUNDS an entry decoded from the entry codec can still fail (the others are as wide as the
#: codec's integer of that field, so decoding alone keeps them): derived from the header's layout.
DECODED_ENTRY_BOUNDS: dict[str, Bounds] = {
    name: bounds for name, bounds in ENTRY_BOUNDS.items()
    for lo, hi in [_codec_range(HEADER.format[1 + HEADER_FIELDS.index(name)])]
    if not bounds.lo <= lo <= hi <= bounds.hi}


def decoded_entry_bounds_error(entry: Entry, where: str = "entry") -> str | None:
    """:func:`entry_bounds_error` of an entry the entry codec decoded (only :data:`DECODED_ENTRY_BOUNDS` can fail)."""
    return entry_bounds_error(entry, where, DECODED_ENTRY_BOUNDS)


_DECODED_FIELDS = tuple((name, attrgetter(name), b.lo, b.hi) for name, b in DECODED_ENTRY_BOUNDS.items())
#: Fields that grow from entry to entry in one plain run (:class:`EntryList` with ``largest`` set): their first
#: and last values are their least and greatest.
_GROWING_IN_A_RUN = frozenset({"index", "pos"})


def decoded_entries_in_bounds(entries: Sequence[Entry]) -> bool:
    """True if no entry of ``entries`` has a :func:`decoded_entry_bounds_error`.

    A field at a time over all the entries (C-level ``map``/``min``/``max``,
    no Python call per entry): a follower checks every entry of every push,
    and asks :func:`decoded_entry_bounds_error` entry by entry only when this
    says one is out of range (to name the first).  In one plain run (an
    EntryList whose decoder set ``largest``: consecutive indexes, each entry
    right after the one before) index and pos are checked at the first and
    last entry only, which bound them (Round 2f: a third of the push's checks);
    the terms by their greatest where the C decoder noted it (``max_term``, Round 2g).
    """
    known = type(entries) is EntryList
    run = known and entries.largest > 0 and len(entries) > 0
    max_term = entries.max_term if known else None
    for name, get, lo, hi in _DECODED_FIELDS:
        if name == "term" and max_term is not None and lo <= 0:  # the C decoder's greatest term, all >= 0 (Round 2g)
            if max_term > hi:
                return False
            continue
        if run and name in _GROWING_IN_A_RUN:
            if get(entries[0]) < lo or get(entries[-1]) > hi:
                return False
            continue
        values = list(map(get, entries))
        if values and (min(values) < lo or max(values) > hi):
            return False
    return True


def message_bounds_error(msg: RequestOrResponse) -> str | None:
    """Why some integer of ``msg`` (its entries included) is out of range; None if all fit.

    :func:`from_wire` applies the same bounds field by field while decoding (and the binary PUSH decoder
    checks each entry with :func:`entry_bounds_error`); this whole-message form is the oracle the
    decoder fuzz tests compare those checks against.
    """
    for name, bounds in FIELD_BOUNDS.items():
        value = getattr(msg, name, None)
        values = value if isinstance(value, list) else [value]
        for v in values:
            if type(v) is int:
                error = bounds_error(name, v, bounds)
                if error is not None:
                    return error
    entries = msg.entries() if isinstance(msg, PushEntryRequest) else getattr(msg, "entries", None) or []
    for i, e in enumerate(entries):
        error = entry_bounds_error(e, f"entry #{i}")
        if error is not None:
            return error
    return None


_PLAIN = frozenset({int, str, bool, float})


def _value_to_wire(value: Any) -> Any:
    if type(value) in _PLAIN:
        return value
    if isinstance(value, enum.Enum) and not isinstance(value, int):
        return value.name
    if isinstance(value, ResponseCode):
        return int(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, Entry):
        return entry_to_wire(value)
    if isinstance(value, list):
        return [_value_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _value_to_wire(v) for k, v in value.items()}
    return value


#: class -> ((attribute, wire key) of its fields, (attribute, wire key) of its WIRE_EXTRA properties)
_WIRE_NAMES: dict[type, tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]] = {}


def _wire_names(cls: type) -> tuple[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]]:
    names = _WIRE_NAMES.get(cls)
    if names is None:
        names = _WIRE_NAMES[cls] = (tuple((f.name, camel(f.name)) for f in dataclasses.fields(cls)),
                                    tuple((n, camel(n)) for n in cls.WIRE_EXTRA))
    return names


def flat_wire_fields(cls: type) -> tuple[tuple[str, str], ...] | None:
    """``(wire key, attribute)`` of every field, sorted by key, if all are ints or strings (None otherwise).

    Such a message's JSON is a flat object; :mod:`dledger.transport.remoting` writes the common
    replies from this without building a dict.
    """
    flat = _FLAT.get(cls, ())
    if flat == ():
        fields, extra = _wire_names(cls)
        hints = typing.get_type_hints(cls)
        scalar = all(hints[name] in (int, str, int | None, str | None) for name, _ in fields)
        flat = _FLAT[cls] = tuple(sorted((key, name) for name, key in fields)) if scalar and not extra else None
    return flat


_FLAT: dict[type, tuple[tuple[str, str], ...] | None] = {}


def to_wire(msg: RequestOrResponse) -> dict[str, Any]:
    """The JSON object Java DLedger would write for ``msg`` (None fields omitted)."""
    out: dict[str, Any] = {}
    plain = _PLAIN
    fields, extra = _wire_names(type(msg))
    for name, key in fields:
        value = getattr(msg, name)
        if value is not None:
            out[key] = value if type(value) in plain else _value_to_wire(value)
    for name, key in extra:
        out[key] = _value_to_wire(getattr(msg, name))
    return out


_Converter = typing.Callable[[Any, str], Any]
#: class -> {wire key: (attribute, converter)}; converters are built once per field type.
_READERS: dict[type, dict[str, tuple[str, _Converter]]] = {}


def _b64(value: Any, key: str) -> bytes:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected base64 text")
    return binascii.a2b_base64(value, strict_mode=True)


def _entry(value: Any, key: str) -> Entry:
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected an entry object")
    return entry_from_wire(value)


def _int(value: Any, key: str) -> int:
    if type(value) is not int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{key}: expected an integer, got {value!r}")
    return value


def _str(value: Any, key: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {value!r}")
    return value


def _str_dict(value: Any, key: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise ValueError(f"{key}: expected an object")
    return {str(k): str(v) for k, v in value.items()}


def _converter(kind: Any) -> _Converter:
    """The function that reads a JSON value of type ``kind`` (None is handled by the caller)."""
    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        return _converter(inner[0])
    if kind is bytes:
        return _b64
    if kind is Entry:
        return _entry
    if isinstance(kind, type) and issubclass(kind, enum.Enum) and not issubclass(kind, int):
        return lambda value, key, kind=kind: kind[value]
    if origin is list:
        (item,) = typing.get_args(kind)
        read_item = _converter(item)

        def read_list(value: Any, key: str) -> list:
            if not isinstance(value, list):
                raise ValueError(f"{key}: expected a list")
            return [None if v is None else read_item(v, key) for v in value]

        return read_list
    if origin is dict:
        return _str_dict
    if kind is int:
        return _int
    if kind is str:
        return _str
    return lambda value, key: value


def _bounded(read: _Converter, name: str, bounds: Bounds) -> _Converter:
    """``read`` followed by the bounds check of field ``name`` (each element of a list)."""

    def read_bounded(value: Any, key: str) -> Any:
        out = read(value, key)
        for v in out if isinstance(out, list) else (out,):
            if type(v) is int:
                check_bounds(key, v, bounds)
        return out

    return read_bounded


def _readers(cls: type) -> dict[str, tuple[str, _Converter]]:
    readers = _READERS.get(cls)
    if readers is None:
        hints = typing.get_type_hints(cls)
        readers = {}
        for f in dataclasses.fields(cls):
            read = _converter(hints[f.name])
            bounds = FIELD_BOUNDS.get(f.name)
            if bounds is not None:
                read = _bounded(read, f.name, bounds)
            readers[camel(f.name)] = (f.name, read)
        _READERS[cls] = readers
    return readers


def from_wire(cls: type[RequestOrResponse], obj: dict[str, Any]) -> RequestOrResponse:
    """Build a message from its Java JSON object; unknown keys (getter-only ones included) are ignored.

    Raises ValueError naming the key if a value has the wrong type.
    """
    if not isinstance(obj, dict):
        raise ValueError(f"{cls.__name__}: expected a JSON object")
    readers = _readers(cls)
    kwargs = {}
    for key, value in obj.items():
        spec = readers.get(key)
        if spec is None:
            continue
        name, read = spec
        if value is None:
            kwargs[name] = None
            continue
        try:
            kwargs[name] = read(value, key)
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ValueError(f"{cls.__name__}.{key}: bad value {value!r:.80}: {exc}") from None
    return cls(**kwargs)
