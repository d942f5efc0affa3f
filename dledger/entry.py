"""The entry codec: DLedger's on-disk and on-wire entry layout (SPEC §5).

One module owns every byte layout of the log so stores, transports and tools
cannot drift apart:

* an entry is a 48-byte big-endian header followed by its body;
* an index record is 32 bytes, record ``i`` living at ``i * 32``;
* the unused tail of a data file starts with a blank marker
  (``int -1``, ``int remaining``).

``bodyCrc`` is crc32c of the body.  Java DLedger 0.3.2 writes 0 there, so a
Java-written log cannot be checked; :func:`decode_entry` rejects such entries
unless the caller opts into ``accept_zero_crc`` (the ``acceptJavaZeroCrc``
option), in which case a zero CRC means "unverified" and any other value is
still checked.  Entries we write always carry the real CRC.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import NamedTuple

import crc32c as _crc32c

from dledger import _native
from dledger.codes import EntryType

HEADER = struct.Struct(">iiqqqiiii")
#: The header's fields in order (the names of :class:`Entry`'s fields where they are one).
HEADER_FIELDS = ("magic", "size", "index", "term", "pos", "channel", "chain_crc", "body_crc", "body_size")
INDEX_RECORD = struct.Struct(">iqiqq")
BLANK = struct.Struct(">ii")

HEADER_SIZE = HEADER.size  # 48
BODY_OFFSET = HEADER_SIZE
INDEX_UNIT_SIZE = INDEX_RECORD.size  # 32
BLANK_MAGIC = -1
MIN_BLANK_LEN = BLANK.size  # 8: every entry leaves room for a blank marker after it

#: Offsets of header fields, for tools that patch a field in place.
BODY_CRC_OFFSET = 40
VALID_MAGICS = frozenset(int(m) for m in EntryType)
#: Refuse to even look at a header claiming more than this (a torn or random size).
DEFAULT_MAX_ENTRY_SIZE = 64 * 1024 * 1024

_pack_header_into = HEADER.pack_into
_pack_header = HEADER.pack
_unpack_header_from = HEADER.unpack_from
_crc = _crc32c.crc32c


class CodecError(ValueError):
    """Bytes do not hold a valid entry or index record. ``offset`` is where decoding started."""

    def __init__(self, message: str, offset: int = 0):
        super().__init__(f"{message} (at offset {offset})")
        self.offset = offset


class TruncatedEntryError(CodecError):
    """Fewer bytes than the header or the declared size: a torn write or a short read."""


class CorruptEntryError(CodecError):
    """The bytes are there but wrong: bad magic, inconsistent sizes, negative fields or CRC mismatch."""


class OversizedEntryError(CodecError):
    """The declared or requested size exceeds the configured maximum."""


def body_crc(body: bytes | memoryview) -> int:
    """crc32c of a body, as a signed 32-bit int (how the header stores it)."""
    value = _crc(body)
    return value - 0x100000000 if value >= 0x80000000 else value


@dataclass(slots=True, eq=True)
class Entry:
    """One log entry. ``index``, ``term`` and ``pos`` are -1 until a store places it."""

    body: bytes = b""
    index: int = -1
    term: int = -1
    pos: int = -1
    magic: int = EntryType.NORMAL
    channel: int = 0
    chain_crc: int = 0
    body_crc: int = 0

    @property
    def size(self) -> int:
        """Encoded size: header plus body."""
        return HEADER_SIZE + len(self.body)

    @property
    def is_noop(self) -> bool:
        return self.magic == EntryType.NOOP

    @property
    def is_control(self) -> bool:
        """A member's own entry (a term-start NOOP, a CONFIG_CHANGE): never an application's (:func:`is_control`)."""
        return self.magic in CONTROL_MAGICS

    def sealed(self) -> Entry:
        """This entry with ``body_crc`` computed from its body."""
        return Entry(self.body, self.index, self.term, self.pos, self.magic,
                     self.channel, self.chain_crc, body_crc(self.body))


class EntryList(list):
    """Consecutive entries that remember their encoding: the entry codec's layout, back to back, with its crc32c.

    A leader pushes the same entries to every follower, and a follower stores exactly the bytes a push
    carried; with an EntryList the encoding is computed (or received) once and reused.  Do not change
    the list or its entries once :meth:`section` was asked for.

    ``crc_checked`` says whoever built the list verified every entry's non-zero body CRC against its
    body (a push decoded by :func:`decode_entries`), so a store writing the section need not compute
    them again; a zero CRC (Java's "unverified") is still the store's to judge.

    ``encoded`` gives the encoding without its crc32c (a store's own written bytes of these entries,
    :class:`dledger.store.recent.RecentEntries`), or its parts in order (the slices of several appends):
    :meth:`section` then only joins them (once) and computes the crc32c.

    ``largest`` > 0 says whoever built the list found it one plain run (:func:`decode_entries` does, as
    it decodes): consecutive indexes, each entry at the position right after the one before, no
    reserved field set, no zero CRC; ``largest`` is then its largest entry's encoded size.  A follower
    then checks such a push as a whole (:func:`dledger.store.base.follower_run_end`).

    ``irecs``: the entries' index records back to back (bytes), when the C decoder made them with a plain
    run (:mod:`dledger._native`); a store writing the run copies them in one slice.  None otherwise.

    ``max_term``: the greatest term among the entries when the C decoder gave them (every term is >= 0
    after a decode), so their bounds check needs no pass over them; None otherwise.
    """

    __slots__ = ("_section", "_parts", "crc_checked", "largest", "irecs", "max_term")

    def __init__(self, entries=(), section: tuple[bytes | memoryview, int] | None = None, *,
                 crc_checked: bool = False, encoded: bytes | memoryview | list | None = None, largest: int = 0,
                 irecs: bytes | None = None):
        super().__init__(entries)
        self._section = section
        self._parts: list | None = None
        self.crc_checked = crc_checked
        self.largest = largest
        self.irecs = irecs
        self.max_term: int | None = None
        if encoded is not None:
            self.give_encoding(encoded)

    def known_section(self) -> tuple[bytes | memoryview, int | None] | None:
        """The encoding if it was computed, received or given already (never computes it; its crc32c is
        None while only the bytes were given)."""
        return self._section

    def give_encoding(self, encoded: bytes | memoryview | list) -> EntryList:
        """Take ``encoded`` (bytes, or a list of their parts in order) as these entries' encoding unless one is
        known; self.  Nothing is joined or checksummed until :meth:`section` is asked for (a reader that
        only wants the entries, the commit feed, pays nothing)."""
        if self._section is None and self._parts is None:
            if type(encoded) is list:
                self._parts = encoded
            else:
                self._section = (encoded, None)
        return self

    def section(self) -> tuple[bytes | memoryview, int]:
        """``(encoded entries, crc32c of them)``, computed on first use.

        Headers packed and joined with the bodies in one pass (no call or
        buffer slice per entry): a leader encodes every entry it pushes.
        """
        known = self._section
        if known is not None:
            if known[1] is None:  # the bytes were given: only their crc32c is computed
                known = self._section = (known[0], _crc(known[0]))
            return known
        if self._parts is not None:
            data = b"".join(self._parts)
            self._section, self._parts = (data, _crc(data)), None
            return self._section
        pack = _pack_header
        parts = []
        for e in self:
            body = e.body
            n = len(body)
            parts.append(pack(e.magic, HEADER_SIZE + n, e.index, e.term, e.pos, e.channel, e.chain_crc,
                              e.body_crc, n))
            parts.append(body)
        data = b"".join(parts)
        self._section = (data, _crc(data))
        return self._section

    def encoded_size(self) -> int:
        """Bytes of the encoded entries (the section's length), without encoding them when it is not known yet."""
        if self._section is not None:
            return len(self._section[0])
        if self._parts is not None:
            return sum(map(len, self._parts))
        return encoded_size(self)


_body = attrgetter("body")
_magic = attrgetter("magic")
_NOOP_MAGIC = int(EntryType.NOOP)
_CONFIG_MAGIC = int(EntryType.CONFIG_CHANGE)
#: Magics of the control entries: a leader's term-start NOOP and a configuration entry (issue #23).  The
#: group writes them for itself; state machines, commit listeners, reads and application counters never
#: see them (:func:`without_noops` is the one filter every such path uses).
CONTROL_MAGICS = frozenset({_NOOP_MAGIC, _CONFIG_MAGIC})


def is_control(entry: Entry) -> bool:
    """``entry`` is the group's own (NOOP or CONFIG_CHANGE), never an application's."""
    return entry.magic in CONTROL_MAGICS


def without_noops(entries: Sequence[Entry]) -> list[Entry]:
    """A new list of ``entries`` less the control entries: NOOPs (a leader's term-start entries) and
    configuration entries (issue #23), never an application's.

    The common case (none) is found and copied at C level, without a property call per entry:
    every committed entry passes here on its way to the commit listeners.
    """
    magics = set(map(_magic, entries))
    if _NOOP_MAGIC not in magics and _CONFIG_MAGIC not in magics:
        return list(entries)
    return [e for e in entries if e.magic not in CONTROL_MAGICS]


#: The same filter under the name that says what it removes (new code should use this one).
without_control = without_noops


def config_entries(entries: Sequence[Entry]) -> list[Entry]:
    """The CONFIG_CHANGE entries among ``entries`` (found at C level when there is none: the common case)."""
    if _CONFIG_MAGIC not in map(_magic, entries):
        return []
    return [e for e in entries if e.magic == _CONFIG_MAGIC]


def encoded_size(entries: Sequence[Entry]) -> int:
    """Bytes of ``entries`` encoded back to back (C-level ``map``: no Python step per entry)."""
    return sum(map(len, map(_body, entries))) + HEADER_SIZE * len(entries)


class IndexRecord(NamedTuple):
    """A 32-byte index record: where entry ``index`` lives in the data log."""

    magic: int
    pos: int
    size: int
    index: int
    term: int


class Blank(NamedTuple):
    """The end-of-file marker: ``remaining`` bytes from the marker to the end of the file."""

    remaining: int


def encode_entry(entry: Entry) -> bytes:
    """Encode an entry exactly as stored; ``body_crc`` is written as given."""
    buf = bytearray(HEADER_SIZE + len(entry.body))
    encode_entry_into(buf, 0, entry)
    return bytes(buf)


def encode_entry_into(buf: bytearray | memoryview, offset: int, entry: Entry) -> int:
    """Write ``entry`` at ``offset`` of a writable buffer; returns the encoded size."""
    body = entry.body
    n = len(body)
    size = HEADER_SIZE + n
    _pack_header_into(buf, offset, entry.magic, size, entry.index, entry.term, entry.pos,
                      entry.channel, entry.chain_crc, entry.body_crc, n)
    buf[offset + HEADER_SIZE:offset + size] = body
    return size


def seal_crc_in_place(buf: bytearray | memoryview, offset: int, size: int) -> int:
    """Compute the body CRC of the entry encoded at ``offset`` and patch it into its header.

    Stores call this after append hooks have rewritten body bytes, so the CRC
    covers what is really stored.
    """
    crc = body_crc(memoryview(buf)[offset + HEADER_SIZE:offset + size])
    struct.pack_into(">i", buf, offset + BODY_CRC_OFFSET, crc)
    return crc


def decode_entry(buf: bytes | bytearray | memoryview, offset: int = 0, *,
                 accept_zero_crc: bool = False, verify_crc: bool = True,
                 max_size: int = DEFAULT_MAX_ENTRY_SIZE, exact: bool = False) -> Entry:
    """Decode the entry at ``offset``.

    Raises :class:`TruncatedEntryError` if the buffer ends inside the entry,
    :class:`OversizedEntryError` if the header claims more than ``max_size``
    and :class:`CorruptEntryError` for anything else that is not a valid
    entry (a blank marker included).  With ``exact`` the entry must fill the
    buffer from ``offset`` to its end.
    """
    avail = len(buf) - offset
    if avail < HEADER_SIZE:
        raise TruncatedEntryError(f"need {HEADER_SIZE} header bytes, have {max(avail, 0)}", offset)
    (magic, size, index, term, pos, channel, chain_crc, crc, body_size) = _unpack_header_from(buf, offset)
    if magic not in VALID_MAGICS:
        kind = "blank marker" if magic == BLANK_MAGIC else "bad magic"
        raise CorruptEntryError(f"{kind} {magic}", offset)
    if size != HEADER_SIZE + body_size or body_size < 0:
        raise CorruptEntryError(f"size {size} != {HEADER_SIZE} + bodySize {body_size}", offset)
    if size > max_size:
        raise OversizedEntryError(f"entry size {size} exceeds maximum {max_size}", offset)
    if index < 0 or term < 0 or pos < 0:
        raise CorruptEntryError(f"negative field: index={index} term={term} pos={pos}", offset)
    if avail < size:
        raise TruncatedEntryError(f"entry of {size} bytes but only {avail} available", offset)
    if exact and avail != size:
        raise CorruptEntryError(f"{avail - size} trailing bytes after entry", offset)
    body = bytes(buf[offset + HEADER_SIZE:offset + size])
    if verify_crc and not (crc == 0 and accept_zero_crc):
        actual = body_crc(body)
        if actual != crc:
            raise CorruptEntryError(f"body crc32c mismatch: stored {crc & 0xFFFFFFFF:#010x}, "
                                    f"computed {actual & 0xFFFFFFFF:#010x}", offset)
    return Entry(body, index, term, pos, magic, channel, chain_crc, crc)


def decode_entries(buf: bytes | bytearray | memoryview, offset: int, end: int, count: int, *,
                   accept_zero_crc: bool = False) -> tuple[EntryList, int]:
    """``count`` entries encoded back to back from ``offset``, none reaching past ``end``; ``(entries, offset after)``.

    What :func:`decode_entry` gives for each (``max_size`` = the bytes left
    before ``end``), with the valid case -- exactly decode_entry's conditions
    -- decided inline: a follower decodes every entry of every push.  The
    first entry that is not valid raises decode_entry's own CodecError, with
    ``number`` set to its position in the batch.  The list's ``largest`` says
    whether the entries form one plain run (see :class:`EntryList`), noted in
    the same loop (a few comparisons per entry: the follower's own checks of a
    push then need no pass over its entries).
    """
    out = EntryList()
    if NATIVE is not None:  # the same loop in C (dledger/_native.py); None: an entry is not valid, decide below
        done = NATIVE.decode_run(buf, offset, end, count, accept_zero_crc, out)
        if done is not None:
            off, out.largest, out.irecs, out.max_term = done
            return out, off
    unpack, magics, header, crc32c = _unpack_header_from, VALID_MAGICS, HEADER_SIZE, _crc
    append = out.append
    copy = type(buf) is not bytes  # a slice of bytes is a bytes already: no second copy (Round 2f)
    off = offset
    next_index = next_pos = -1
    breaks = largest = 0  # breaks: entries not right after the one before, or not plain (the first counts once)
    try:
        for _ in range(count):
            if end - off >= header:
                magic, size, index, term, pos, channel, chain_crc, crc, n = unpack(buf, off)
                stop = off + size
                # (n | index | term | pos) >= 0: each of them >= 0, in one comparison (Round 2f)
                if magic in magics and size == header + n and (n | index | term | pos) >= 0 and stop <= end:
                    body = buf[off + header:stop]
                    if copy:
                        body = bytes(body)
                    if (crc == 0 and accept_zero_crc) or crc32c(body) == crc & 0xFFFFFFFF:
                        append(Entry(body, index, term, pos, magic, channel, chain_crc, crc))
                        if index != next_index or pos != next_pos or channel or chain_crc or not crc:
                            breaks += 1
                        if size > largest:
                            largest = size
                        next_index = index + 1
                        next_pos = pos + size
                        off = stop
                        continue
            entry = decode_entry(buf, off, accept_zero_crc=accept_zero_crc, max_size=end - off)
            append(entry)  # not reached for an invalid entry: decode_entry raised its reason
            off += entry.size
            breaks += 2  # not reached for a valid entry (decode_entry raised); if it were, no run is vouched for
    except CodecError as exc:
        exc.number = len(out)
        raise
    if breaks == 1 and not (out[0].channel or out[0].chain_crc or not out[0].body_crc):
        out.largest = largest
    return out, off


def peek(buf: bytes | bytearray | memoryview, offset: int = 0) -> tuple[int, int]:
    """``(magic, size)`` at ``offset`` without validation; for scanners that must tell blanks apart."""
    if len(buf) - offset < MIN_BLANK_LEN:
        raise TruncatedEntryError("need 8 bytes to read magic and size", offset)
    return BLANK.unpack_from(buf, offset)


def encode_blank(remaining: int) -> bytes:
    """The blank marker that fills ``remaining`` bytes at the end of a data file."""
    if remaining < MIN_BLANK_LEN:
        raise ValueError(f"a blank needs at least {MIN_BLANK_LEN} bytes, got {remaining}")
    return BLANK.pack(BLANK_MAGIC, remaining)


def decode_blank(buf: bytes | bytearray | memoryview, offset: int = 0) -> Blank:
    """Decode a blank marker; :class:`CorruptEntryError` if the bytes are not one."""
    magic, remaining = peek(buf, offset)
    if magic != BLANK_MAGIC or remaining < MIN_BLANK_LEN:
        raise CorruptEntryError(f"not a blank marker: magic={magic} remaining={remaining}", offset)
    return Blank(remaining)


def encode_index(entry: Entry | IndexRecord) -> bytes:
    """The 32-byte index record of an entry."""
    return INDEX_RECORD.pack(entry.magic, entry.pos, entry.size, entry.index, entry.term)


def decode_index(buf: bytes | bytearray | memoryview, offset: int = 0) -> IndexRecord:
    """Decode and sanity-check the index record at ``offset``."""
    if len(buf) - offset < INDEX_UNIT_SIZE:
        raise TruncatedEntryError(f"need {INDEX_UNIT_SIZE} index bytes, have {len(buf) - offset}", offset)
    rec = IndexRecord(*INDEX_RECORD.unpack_from(buf, offset))
    if rec.magic not in VALID_MAGICS or rec.size < HEADER_SIZE or rec.pos < 0 or rec.index < 0 or rec.term < 0:
        raise CorruptEntryError(f"bad index record {rec}", offset)
    return rec


def place_entry(write_pos: int, size: int, file_size: int) -> tuple[int, int]:
    """Where an entry of ``size`` bytes goes when the log ends at ``write_pos``.

    Returns ``(pos, blank)``: ``blank`` bytes at ``write_pos`` are padding
    (a blank marker) and the entry starts at ``pos``.  As in DLedger, an entry
    never straddles files and always leaves room for an 8-byte blank after it,
    so every store that uses this function assigns the same positions for the
    same file size, whatever its medium.
    """
    if size + MIN_BLANK_LEN > file_size:
        raise OversizedEntryError(f"entry of {size} bytes cannot fit a data file of {file_size} bytes "
                                  f"(needs size + {MIN_BLANK_LEN})", write_pos)
    remaining = file_size - write_pos % file_size
    if size + MIN_BLANK_LEN > remaining:
        return write_pos + remaining, remaining
    return write_pos, 0


#: The C batch loops (:mod:`dledger._native`), or None: the pure-Python code above runs (``DLEDGER_PURE=1``).
NATIVE = _native.load(Entry, VALID_MAGICS)
