"""Reading the data log by byte position (:class:`dledger.interfaces.IPositionReader`), committed bytes only.

The bounds rule is one pure function, :func:`check_read`.  The mmap store
reads its mapped files; stores without a byte layout of their own (memory,
LMDB) rebuild the same bytes from their entries with :func:`read_entries`:
every entry's encoding at its ``pos``, and where an entry did not fit the
rest of a data file, the blank marker and zeros an mmap store holds there.
So every store answers a read with the bytes a Java DLedger data file holds.
"""

from __future__ import annotations

from collections.abc import Callable

from dledger.codes import ResponseCode
from dledger.entry import Entry, encode_blank, encode_entry
from dledger.errors import DLedgerError


def check_read(pos: int, size: int, begin: int, committed: int) -> None:
    """Refuse a read of ``size`` bytes at ``pos`` unless it lies within ``[begin, committed)``."""
    if pos < 0 or size < 0:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"read of {size} bytes at position {pos}: "
                           f"position and size must be >= 0")
    if pos + size > committed:
        raise DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"read of {size} bytes at position {pos} ends at "
                           f"{pos + size}, past the committed position {committed}")
    if pos < begin:
        raise DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, f"read at position {pos} is before the "
                           f"first position kept, {begin}")


def end_of(entry: Entry) -> int:
    """The position just past ``entry``."""
    return entry.pos + entry.size


def read_entries(get: Callable[[int], Entry], begin_index: int, last_index: int, pos: int, size: int) -> bytes:
    """``size`` bytes from ``pos`` rebuilt from entries ``begin_index..last_index`` (bounds already checked).

    The entry holding ``pos`` is found by binary search (positions grow with
    the index), then entries are encoded in order; a gap between two entries
    is the end of a data file: a blank marker, then zeros.
    """
    if size == 0:
        return b""
    lo, hi = begin_index, last_index
    while lo < hi:  # the last entry starting at or before pos
        mid = (lo + hi + 1) // 2
        if get(mid).pos <= pos:
            lo = mid
        else:
            hi = mid - 1
    out = bytearray()
    cursor = get(lo).pos
    end = pos + size
    index = lo
    while cursor < end and index <= last_index:
        e = get(index)
        if e.pos > cursor:
            gap = e.pos - cursor
            out += encode_blank(gap) + bytes(gap - len(encode_blank(gap)))
        out += encode_entry(e)
        cursor = end_of(e)
        index += 1
    first = get(lo).pos
    return bytes(out[pos - first:end - first])


class EntryPositionReader:
    """:class:`~dledger.interfaces.IPositionReader` for stores that keep entries, not a byte layout (memory, LMDB).

    A mixin: the store provides ``get(index)``, ``ledger_begin_index``, ``ledger_end_index``,
    ``committed_index`` and ``_write_pos`` (where its next entry goes); reads are rebuilt with
    :func:`read_entries`, so they answer with the bytes an mmap member holds at those positions.
    """

    def begin_position(self) -> int:
        """The first entry's ``pos`` (where the next entry goes when the log is empty, with or without a base)."""
        if 0 <= self.ledger_begin_index <= self.ledger_end_index:
            return self.get(self.ledger_begin_index).pos
        return self._write_pos

    def committed_position(self) -> int:
        """Just past the last committed entry; :meth:`begin_position` when nothing here is committed."""
        if self.ledger_end_index < 0 or self.committed_index < self.ledger_begin_index:
            return self.begin_position()
        return end_of(self.get(self.committed_index))

    def read_at(self, pos: int, size: int) -> bytes:
        """Committed data-log bytes rebuilt from the entries (the bytes an mmap member holds there)."""
        check_read(pos, size, self.begin_position(), self.committed_position())
        return read_entries(self.get, self.ledger_begin_index, self.committed_index, pos, size)
