"""Walking a data log forward and judging every byte: shared by recovery and ``dledger store verify``.

The rules (SPEC §5): entries follow each other with contiguous indexes, each
``pos`` field equals where the entry really is, terms never decrease, the
body CRC matches (a zero CRC is accepted only in Java-compatibility mode),
and every entry leaves room for a blank marker.  A blank marker sends the
walk to the next file.  The log ends at the first zero header; after the
end everything must be zero and no later file may hold data, otherwise
something was torn or damaged, and the result says what and where.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dledger.entry import BLANK_MAGIC, MIN_BLANK_LEN, CodecError, Entry, body_crc, decode_entry, peek
from dledger.store.mappedfiles import MappedFile, MappedFileList


@dataclass
class ScanResult:
    """What a forward walk found. ``write_pos`` is where the next entry would go (right after the last good one)."""

    count: int
    last_index: int
    last_term: int
    write_pos: int
    stop_pos: int
    problem: str | None = None
    problem_pos: int | None = None

    @property
    def clean(self) -> bool:
        return self.problem is None


def where(data: MappedFileList, pos: int) -> str:
    """``pos 6112 (file 00000000000000006112 offset 0)``: how problems name a position."""
    f = data.file_for(pos)
    if f is None:
        return f"pos {pos}"
    return f"pos {pos} (file {f.path.name} offset {pos - f.start})"


def decode_at(data: MappedFileList, pos: int, *, accept_zero_crc: bool, verify_crc: bool = True) -> Entry:
    """The entry whose header is at absolute ``pos``; CodecError if there is none or it is damaged."""
    f = data.file_for(pos)
    if f is None:
        raise CodecError(f"no data file holds pos {pos}", pos)
    e = decode_entry(f.mm, pos - f.start, accept_zero_crc=accept_zero_crc, verify_crc=verify_crc, max_size=f.size)
    if e.pos != pos:
        raise CodecError(f"entry {e.index} says pos {e.pos} but sits at {pos}", pos)
    return e


def first_entry(data: MappedFileList, *, accept_zero_crc: bool) -> tuple[Entry | None, str | None]:
    """The first entry of the log and, if there is none, why (None: the log is simply empty).

    Files normally start with an entry; blank-only files (Java's refused
    oversized append) are skipped.  After a follower reset the first file
    starts with zeros and the entry sits at the leader's position inside it:
    its magic (1..3, big-endian) has three zero bytes, so the entry starts
    three bytes before the first non-zero byte.
    """
    for f in data.files:
        magic, size = peek(f.mm, 0)
        if magic == BLANK_MAGIC and size == f.size:
            continue
        rel = 0
        if magic == 0 and size == 0:
            nz = f.first_nonzero(0)
            if nz < 0:
                later = [g for g in data.files if g.start > f.start and g.first_nonzero(0) >= 0]
                if later:
                    return None, f"data file {f.path.name} holds nothing but {later[0].path.name} holds data"
                return None, None
            rel = nz - 3
            if rel < 0:
                return None, f"unexpected bytes at {where(data, f.start + nz)} before the first entry"
        try:
            return decode_at(data, f.start + rel, accept_zero_crc=accept_zero_crc), None
        except CodecError as exc:
            return None, f"first entry at {where(data, f.start + rel)} is damaged: {exc}"
    return None, None


def scan_forward(data: MappedFileList, pos: int, next_index: int, prev_term: int, *,
                 accept_zero_crc: bool, on_entry: Callable[[Entry], str | None] | None = None,
                 check_tail: bool = True, stop_after: int | None = None) -> ScanResult:
    """Verify entries from ``pos`` (expected to hold entry ``next_index``) to the end of the log.

    ``on_entry`` sees every good entry in order and may return a problem
    that stops the walk before that entry.  With ``check_tail`` the
    bytes after the end are checked too, so a damaged entry followed by more
    data is reported as a problem instead of looking like a clean end.
    ``stop_after`` ends the walk after that index (no tail check then).
    """
    count, last_index, last_term = 0, next_index - 1, -1
    write_pos = pos
    problem = None
    while True:
        f = data.file_for(pos)
        if f is None:
            break
        rel = pos - f.start
        if rel + MIN_BLANK_LEN > f.size:
            problem = f"no room for a header or blank marker at {where(data, pos)}"
            break
        magic, size = peek(f.mm, rel)
        if magic == BLANK_MAGIC:
            if size != f.size - rel:
                problem = f"blank marker at {where(data, pos)} claims {size} bytes but {f.size - rel} remain"
                break
            pos = f.end
            continue
        if magic == 0 and size == 0:
            break
        try:
            e = decode_entry(f.mm, rel, accept_zero_crc=accept_zero_crc, max_size=f.size)
        except CodecError as exc:
            problem = f"entry {next_index} at {where(data, pos)}: {str(exc).rsplit(' (at offset', 1)[0]}"
            break
        if e.index != next_index:
            problem = f"entry at {where(data, pos)} has index {e.index}, expected {next_index}"
        elif e.pos != pos:
            problem = f"entry {e.index} at {where(data, pos)} says pos {e.pos}"
        elif e.term < prev_term:
            problem = f"entry {e.index} at {where(data, pos)} has term {e.term} after term {prev_term}"
        elif rel + e.size + MIN_BLANK_LEN > f.size:
            problem = f"entry {e.index} at {where(data, pos)} leaves no room for a blank marker"
        elif e.channel or e.chain_crc:
            problem = f"entry {e.index} at {where(data, pos)} has non-zero reserved fields"
        elif on_entry is not None:
            problem = on_entry(e)
        if problem:
            break
        count += 1
        last_index, last_term = e.index, e.term
        prev_term = e.term
        next_index += 1
        pos += e.size
        write_pos = pos
        if e.index == stop_after:
            return ScanResult(count, last_index, last_term, write_pos, pos)
    result = ScanResult(count, last_index, last_term, write_pos, pos, problem, pos if problem else None)
    if problem is None and check_tail:
        junk = first_junk_after(data, pos)
        if junk is not None:
            result.problem = (f"non-zero bytes at {where(data, junk)} after the last good entry "
                              f"(index {last_index}): a torn write or a damaged entry")
            result.problem_pos = junk
    return result


def first_junk_after(data: MappedFileList, pos: int) -> int | None:
    """Absolute position of the first non-zero byte at or after ``pos`` in the data files, or None."""
    for f in data.files:
        if f.end <= pos:
            continue
        start = max(0, pos - f.start)
        nz = f.first_nonzero(start)
        if nz >= 0:
            return f.start + nz
    return None


def zero_after(data: MappedFileList, pos: int, closer) -> tuple[int, int]:
    """Cut the log at ``pos``: zero the rest of its file, remove later files. Returns (bytes zeroed, files removed)."""
    f: MappedFile | None = data.file_for(pos)
    if f is None:
        keep = len([g for g in data.files if g.start < pos])
        return 0, data.remove_after(keep, closer)
    zeroed = f.zero(pos - f.start, f.size)
    return zeroed, data.remove_after(data.position_of(f) + 1, closer)


def has_java_zero_crc(data: MappedFileList, pos: int) -> bool:
    """Whether the entry at ``pos`` is well-formed except for a zero body CRC (as Java DLedger 0.3.2 writes)."""
    try:
        e = decode_at(data, pos, accept_zero_crc=True)
    except CodecError:
        return False
    return e.body_crc == 0 and e.body_crc != body_crc(e.body)
