"""SEND_BATCH_MESSAGE bodies: several messages in ``MessageDecoder.encodeMessages`` form.

A producer's batch body is the messages back to back, each::

    TOTALSIZE int32 | MAGICCODE int32 (0) | BODYCRC int32 (0) | FLAG int32
    BODYLEN int32 + body | PROPERTIESLEN int16 + properties

The broker stores each one as its own CommitLog record with the batch's
topic, queue, born/store fields and *the message's own property string*
(the golden store shows ``WAIT`` kept and no ``CLUSTER`` added), which
:func:`batch_records` does.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import itemgetter

from dledger_rocketmq.common.errors import CodecError, CorruptRecordError, RecordTooLargeError, TruncatedRecordError
from dledger_rocketmq.common.message import MAX_PROPERTIES_LENGTH, MessageRecord

_HEAD = struct.Struct(">iiiii")  # TOTALSIZE, MAGICCODE, BODYCRC, FLAG, BODYLEN
_I16 = struct.Struct(">h")
_HEAD_SIZE = _HEAD.size
#: Bytes of one batch item without body and properties.
ITEM_OVERHEAD = _HEAD.size + _I16.size  # 22


@dataclass(frozen=True, slots=True)
class BatchItem:
    """One message of a batch body: its flag, body and raw property string."""

    body: bytes
    properties: bytes = b""
    flag: int = 0

    def __iter__(self):
        """``body, properties, flag``: an item unpacks like :func:`batch_views`' tuples."""
        return iter((self.body, self.properties, self.flag))


def encode_batch(items: Iterable[BatchItem]) -> bytes:
    """The SEND_BATCH_MESSAGE body for ``items`` (magic and CRC written as 0, as the Java client does)."""
    out = []
    for item in items:
        if len(item.properties) > MAX_PROPERTIES_LENGTH:
            raise RecordTooLargeError(f"batch message properties of {len(item.properties)} bytes exceed "
                                      f"{MAX_PROPERTIES_LENGTH}")
        size = ITEM_OVERHEAD + len(item.body) + len(item.properties)
        try:
            out.append(_HEAD.pack(size, 0, 0, item.flag, len(item.body)))
        except struct.error:
            raise CodecError(f"batch message flag {item.flag} or size {size} does not fit an int32") from None
        out += [item.body, _I16.pack(len(item.properties)), item.properties]
    return b"".join(out)


def stored_batch_size(template: MessageRecord, count: int) -> int:
    """The sum of the TOTALSIZEs of the ``count`` records a batch send's body (``template.body``) is stored as,
    from the lengths alone (what the broker statistics count for the send).

    Each record is the template's fixed part (its size less body and properties) plus its message's body and
    properties; :func:`batch_views` returns only when the messages' TOTALSIZEs (ITEM_OVERHEAD + body +
    properties each) cover the body exactly, so the bodies and properties of its ``count`` items add up to
    ``len(body) - ITEM_OVERHEAD * count``.  The per-message sum this replaces was ~5 % of a master's reactor
    in 941-message batches (Round 2g, broker8).  Only for items :func:`batch_views` made of ``template.body``.
    """
    fixed = template.size - len(template.body) - len(template.properties)
    return count * (fixed - ITEM_OVERHEAD) + len(template.body)


def any_properties_contain(items: Sequence, needle: bytes) -> bool:
    """Whether any item's property string contains ``needle`` (which holds no NUL byte).

    :func:`batch_views`' tuples are searched as one NUL-joined string (a C-level join and one search, about
    half the time of a test per message); other items (BatchItems) one by one.
    """
    try:
        joined = b"\x00".join(map(_PROPERTIES, items))
    except TypeError:  # not subscriptable (BatchItem): unpack each
        return any(needle in props for _, props, _ in items)
    return needle in joined


_PROPERTIES = itemgetter(1)


def decode_batch(body: bytes | bytearray | memoryview, *, max_items: int = 1 << 16) -> list[BatchItem]:
    """The messages of a SEND_BATCH_MESSAGE body; CodecError (one line, with the offset) if it is malformed."""
    return [BatchItem(bytes(data), bytes(props), flag) for data, props, flag in batch_views(body, max_items=max_items)]


def batch_views(body: bytes | bytearray | memoryview, *, max_items: int = 1 << 16
                ) -> list[tuple[memoryview, bytes, int]]:
    """``(body, properties, flag)`` of each message of a batch body, the body as a view into it (the put path
    copies each message once, into its record; the short property string is copied, the put searches it);
    the same checks and CodecErrors as :func:`decode_batch`.

    A well-formed ``bytes`` body (what the broker port hands over) takes one
    loop with one unpack and one slice per message; anything else, or the
    first message that does not add up, takes :func:`checked_batch_views`,
    which names the error.
    """
    if type(body) is not bytes:
        return checked_batch_views(body, max_items=max_items)
    view = memoryview(body)
    items: list[tuple[memoryview, bytes, int]] = []
    append = items.append
    unpack = _HEAD.unpack_from
    pos, end = 0, len(body)
    while pos < end:
        if end - pos < ITEM_OVERHEAD or len(items) >= max_items:
            return checked_batch_views(body, max_items=max_items)
        size, _magic, _crc, flag, body_len = unpack(body, pos)
        props_at = pos + _HEAD_SIZE + body_len
        props_len = size - ITEM_OVERHEAD - body_len  # what PROPERTIESLEN must say for the lengths to add up
        if (body_len < 0 or not 0 <= props_len <= 0x7FFF or end - pos < size
                or body[props_at] << 8 | body[props_at + 1] != props_len):
            return checked_batch_views(body, max_items=max_items)
        append((view[pos + _HEAD_SIZE:props_at], body[props_at + 2:pos + size], flag))
        pos += size
    return items


def checked_batch_views(body: bytes | bytearray | memoryview, *, max_items: int = 1 << 16
                        ) -> list[tuple[memoryview, bytes, int]]:
    """:func:`batch_views` checking each length in turn: the reference, and the path that names an error."""
    items: list[tuple[memoryview, bytes, int]] = []
    view = memoryview(body)
    pos, end = 0, len(body)
    while pos < end:
        if len(items) >= max_items:
            raise RecordTooLargeError(f"batch holds more than {max_items} messages", pos)
        if end - pos < ITEM_OVERHEAD:
            raise TruncatedRecordError(f"batch message needs {ITEM_OVERHEAD} bytes, {end - pos} left", pos)
        size, _magic, _crc, flag, body_len = _HEAD.unpack_from(body, pos)
        if size < ITEM_OVERHEAD or body_len < 0 or body_len > size - ITEM_OVERHEAD:
            raise CorruptRecordError(f"batch message TOTALSIZE {size} / BODYLEN {body_len} inconsistent", pos)
        if end - pos < size:
            raise TruncatedRecordError(f"batch message of {size} bytes, {end - pos} left", pos)
        data = view[pos + _HEAD.size:pos + _HEAD.size + body_len]
        props_at = pos + _HEAD.size + body_len
        props_len = _I16.unpack_from(body, props_at)[0]
        if props_len < 0 or ITEM_OVERHEAD + body_len + props_len != size:
            raise CorruptRecordError(f"batch message lengths add up to {ITEM_OVERHEAD + body_len + props_len}, "
                                     f"TOTALSIZE says {size}", pos)
        items.append((data, bytes(view[props_at + 2:props_at + 2 + props_len]), flag))
        pos += size
    return items


def batch_records(items: Iterable[BatchItem], template: MessageRecord) -> list[MessageRecord]:
    """One CommitLog record per batch message: ``template``'s topic, queue, hosts and times, the item's
    body, flag and properties, consecutive queue offsets from ``template.queue_offset``.

    Physical offsets stay ``template.physical_offset`` (the append hook sets
    the real ones) and body CRCs are computed.
    """
    t = template  # built field by field: dataclasses.replace per message cost as much as encoding it
    return [MessageRecord(t.topic, item.body, item.properties, t.queue_id, item.flag, t.queue_offset + i,
                          t.physical_offset, t.sys_flag, t.born_timestamp, t.born_host, t.store_timestamp,
                          t.store_host, t.reconsume_times, t.prepared_transaction_offset, None)
            for i, item in enumerate(items)]
