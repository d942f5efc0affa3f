"""What every log store shares: the storage checks, placement and the committed-index rule.

Stores differ in where bytes live; the rules that decide whether an entry
can be stored (its index, its position, its fields), what a truncate does
and how the committed index moves are the same for all of them and live
here, once.  Whether this member may write at all (its role, the leader's
term and id) and the append hooks are the core's: :mod:`dledger.store.guard`.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence

from dledger.codes import ResponseCode
from dledger.entry import (
    HEADER_SIZE,
    MIN_BLANK_LEN,
    Entry,
    OversizedEntryError,
    body_crc,
    place_entry,
)
from dledger.errors import BatchAppendError, DLedgerError


def check_next_index(entry: Entry, end_index: int) -> None:
    if entry.index != end_index + 1:
        raise DLedgerError(ResponseCode.INCONSISTENT_INDEX,
                           f"entry index {entry.index} != end index + 1 ({end_index + 1})")


def check_position(entry: Entry, pos: int) -> None:
    """A follower must place an entry at the leader's byte position, or offsets would differ between members."""
    if entry.pos != pos:
        raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {entry.index} at pos {entry.pos} on the leader "
                           f"but {pos} here (data file sizes differ between members?)")


def index_out_of_range(index: int, begin: int, end: int) -> DLedgerError:
    if begin >= 0 and 0 <= index < begin:
        return DLedgerError(ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN, f"index {index} < begin index {begin}")
    return DLedgerError(ResponseCode.INDEX_OUT_OF_RANGE, f"index {index} not in [{begin}, {end}]")


def next_committed_index(current: int, term: int, curr_term: int, index: int,
                         begin: int, end: int) -> int:
    """The committed index after ``updateCommittedIndex(term, index)``.

    Ignored for a stale term, an empty log or a move backwards; clamped to
    the end of the log, so committed never passes what is stored here.
    """
    if index < 0 or end < 0 or term < curr_term or index <= current or index < begin:
        return current
    return min(index, end)


def check_entry_size(size: int, max_size: int) -> None:
    """Refuse oversized entries with a clear error before anything is written."""
    if size > max_size:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"entry of {size} bytes exceeds maxEntrySize {max_size}")


def check_truncate_keeps_committed(index: int, committed: int) -> None:
    """Raft never asks a follower to drop a committed entry; if asked, refuse rather than lose it."""
    if index <= committed:
        raise DLedgerError(ResponseCode.INCONSISTENT_STATE,
                           f"refusing to drop committed entry {index} (committed index {committed})")


def place(write_pos: int, size: int, file_size: int, max_size: int) -> tuple[int, int]:
    """``(pos, blank)`` for a new entry (see :func:`dledger.entry.place_entry`), as a DLedgerError if it cannot fit."""
    check_entry_size(size, max_size)
    try:
        return place_entry(write_pos, size, file_size)
    except OversizedEntryError as exc:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, str(exc)) from None


def check_body_crc(entry: Entry, accept_zero_crc: bool) -> None:
    """A follower stores the leader's bytes as they are, so it refuses a body whose CRC does not match.

    Storing it would only make recovery cut the log there later.  A zero CRC
    (Java DLedger 0.3.2 leaders) passes unverified when ``acceptJavaZeroCrc`` is set (the default, so a
    member of a mixed group follows a Java leader); when an operator turned it off the error says so.
    """
    if entry.body_crc == 0 and accept_zero_crc:
        return
    actual = body_crc(entry.body)
    if actual == entry.body_crc:
        return
    if entry.body_crc == 0:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"entry {entry.index} has bodyCrc 0 (written by a Java DLedger leader, which computes no "
                           f"CRC) and acceptJavaZeroCrc is false on this member: set acceptJavaZeroCrc = true (the "
                           f"default) to follow a Java leader")
    raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                       f"entry {entry.index}: body crc32c is {actual & 0xFFFFFFFF:#010x} but the entry says "
                       f"{entry.body_crc & 0xFFFFFFFF:#010x} (damaged on the leader or in transit)")


def check_follower_entry(entry: Entry, write_pos: int, file_size: int, max_size: int, accept_zero_crc: bool,
                         crc_checked: bool = False) -> int:
    """Every check of a follower entry that goes at ``write_pos`` (after the role and index checks); returns its pos.

    The placement (size, position agreeing with the leader's) first, then
    the reserved fields and the body CRC: a follower stores the leader's
    bytes unchanged, so whatever it stores must already be valid.  With
    ``crc_checked`` (the entry's push was decoded with every non-zero CRC
    verified, :attr:`dledger.entry.EntryList.crc_checked`) a non-zero CRC is
    not computed a second time; a zero one is judged by ``accept_zero_crc`` as always.
    """
    # The common case (fits the current file, every field as expected) is decided inline; each
    # helper below still raises the error when a check fails (followers check every entry they store).
    size = HEADER_SIZE + len(entry.body)
    if size <= max_size and size + MIN_BLANK_LEN <= file_size - write_pos % file_size:
        pos = write_pos
    else:
        pos = place(write_pos, size, file_size, max_size)[0]
    if entry.pos != pos:
        check_position(entry, pos)
    if entry.channel or entry.chain_crc:
        check_reserved_fields(entry)
    crc = entry.body_crc
    if crc == 0:
        if not accept_zero_crc and body_crc(entry.body) != 0:
            check_body_crc(entry, accept_zero_crc)
    elif not crc_checked and body_crc(entry.body) != crc:
        check_body_crc(entry, accept_zero_crc)
    return pos


def follower_run_end(entries: Sequence[Entry], first_index: int, write_pos: int, limit: int, file_size: int,
                     max_size: int) -> int | None:
    """Where ``entries`` end if every one passes :func:`check_next_index` and :func:`check_follower_entry` (with
    ``crc_checked``) as one run from ``write_pos``; None if that is not certain (then check entry by entry,
    which names any failure).

    Only a list that vouches for its own layout qualifies: an :class:`~dledger.entry.EntryList` with
    ``largest`` set, which :func:`~dledger.entry.decode_entries` gives a push whose entries it found to be
    one plain run (consecutive indexes, each at the position right after the one before, no reserved
    field, no zero CRC).  What is left to check is the run as a whole: it follows ``first_index - 1`` at
    ``write_pos``, ends at or before ``limit`` (the data file's last byte an entry may end at), leaves a
    blank marker's room in the ``file_size`` file holding ``write_pos`` as ``check_follower_entry``
    computes it, and no entry is over ``max_size``: O(1), however long the push.
    """
    largest = getattr(entries, "largest", 0)
    if not largest or largest > max_size:
        return None
    first = entries[0]
    if first.index != first_index or first.pos != write_pos:
        return None
    end = write_pos + entries.encoded_size()
    if end > limit or write_pos % file_size + (end - write_pos) + MIN_BLANK_LEN > file_size:
        return None
    return end


def check_reserved_fields(entry: Entry) -> None:
    """``channel`` and ``chainCrc`` are reserved and 0 (SPEC §5); durable stores treat anything else as damage.

    No CRC covers the header, so the only way to notice a flipped bit there
    is to know what the field must hold.
    """
    if entry.channel or entry.chain_crc:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"entry {entry.index}: reserved fields channel={entry.channel} "
                           f"chainCrc={entry.chain_crc} must be 0")


def check_disk_not_full(full: bool, used_ratio: float, limit: float) -> None:
    """Appends stop, with DISK_FULL, while the disk is fuller than ``diskFullRatio``; the member keeps running."""
    if full:
        raise DLedgerError(ResponseCode.DISK_FULL,
                           f"disk {used_ratio:.1%} used, over diskFullRatio {limit:.0%}; appends resume once "
                           f"space is freed")


class TruncateAction(enum.Enum):
    """What ``truncate(entry)`` does to a log (see :func:`plan_truncate`)."""

    DROP_AFTER = "drop_after"  # we hold the same entry: drop everything after it
    REPLACE = "replace"  # ours differs: drop from entry.index on and store the entry there
    APPEND = "append"  # entry.index == end + 1
    RESET = "reset"  # outside [begin, end + 1] (or replacing the first entry): start over at the entry


def plan_truncate(entry: Entry, begin: int, end: int, committed: int,
                  stored_at: Callable[[int], Entry]) -> TruncateAction:
    """Decide what ``truncate(entry)`` does, refusing (INCONSISTENT_STATE) to drop a committed entry.

    ``stored_at(i)`` returns our entry ``i``; one we cannot read counts as different.
    """
    if end >= 0 and begin <= entry.index <= end:
        try:
            ours = stored_at(entry.index)
        except DLedgerError:
            ours = None
        if ours == entry:
            if entry.index < end:
                check_truncate_keeps_committed(entry.index + 1, committed)
            return TruncateAction.DROP_AFTER
        check_truncate_keeps_committed(entry.index, committed)
        return TruncateAction.REPLACE if entry.index > begin else TruncateAction.RESET
    if end >= 0 and entry.index == end + 1:
        return TruncateAction.APPEND
    return TruncateAction.RESET


class PlannedTruncate:
    """``ILogStore.truncate`` as :func:`plan_truncate` decides it; a store says how each step touches its storage.

    The mmap and lmdb stores shared this dispatch line for line; what differs is only how a step reaches
    the files or the database, so the decision, the order of the steps and the clamp of the committed
    index live here once.  The store gives:

    * ``_drop_after(keep)``: drop every entry after ``keep`` (which stays);
    * ``_replace(entry)``: check that ``entry`` may follow our entry ``entry.index - 1`` (refusing before
      anything is dropped), drop from ``entry.index`` on and store ``entry`` there;
    * ``_append_next(entry)``: store ``entry`` at ``ledger_end_index + 1``, checked as a follower's append;
    * ``_reset(entry)``: start the log over at ``entry`` (a follower behind the leader's begin, or empty).
    """

    def truncate(self, entry: Entry, leader_term: int, leader_id: str) -> int:
        action = plan_truncate(entry, self.ledger_begin_index, self.ledger_end_index, self.committed_index, self.get)
        if action is TruncateAction.DROP_AFTER:
            self._drop_after(entry.index)
        elif action is TruncateAction.REPLACE:
            self._replace(entry)
        elif action is TruncateAction.APPEND:
            self._append_next(entry)
        else:
            self._reset(entry)
        self.committed_index = min(self.committed_index, self.ledger_end_index)
        return entry.index


def compact_floor(below_index: int, begin: int, end: int, committed: int) -> int:
    """The new begin index of a log compacted below ``below_index``: never past the committed index + 1, never
    past the last entry (a log keeps its last entry, as retention keeps its last file), never backwards."""
    if end < 0 or begin > end:
        return begin
    return max(begin, min(below_index, committed + 1, end))


def check_snapshot_base(index: int, term: int, next_pos: int) -> None:
    """A snapshot base must be a real entry: index, term and position >= 0."""
    if index < 0 or term < 0 or next_pos < 0:
        raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                           f"reset to snapshot at index {index} term {term} pos {next_pos}: all must be >= 0")


def committed_after_recovery(saved_committed: int, begin: int, end: int) -> int:
    """What a reopened store claims committed: the saved value, at least what is below the log, never past its end."""
    if end < 0:
        return -1
    return min(max(saved_committed, begin - 1), end)


def read_range(get: Callable[[int], Entry], begin_index: int, end_index: int, max_count: int,
               max_bytes: int) -> list[Entry]:
    """``get_range`` on top of a store's ``get``: at least one entry, then up to the count and byte budget."""
    first = get(begin_index)
    out = [first]
    total = first.size
    for index in range(begin_index + 1, min(end_index, begin_index + max_count - 1) + 1):
        e = get(index)
        total += e.size
        if total > max_bytes:
            break
        out.append(e)
    return out


def first_index_of_term(term_of: Callable[[int], int], term: int, begin: int, end: int, end_index: int) -> int:
    """``getFirstLogOfTargetTerm`` by binary search (terms never decrease along the log); -1 if absent."""
    lo, hi = begin, min(end_index, end)
    if end < 0 or hi < lo:
        return -1
    first, last = lo, hi
    while lo < hi:
        mid = (lo + hi) // 2
        if term_of(mid) < term:
            lo = mid + 1
        else:
            hi = mid
    return lo if first <= lo <= last and term_of(lo) == term else -1


def placed(entry: Entry, index: int, pos: int) -> Entry:
    """``entry`` as a leader stores it at ``index``/``pos`` when no append hook rewrites it: body CRC sealed."""
    return Entry(entry.body, index, entry.term, pos, entry.magic, 0, 0, body_crc(entry.body))


# -- batches ---------------------------------------------------------------------

def append_each(append_one: Callable[..., Entry], entries: Sequence[Entry], *args) -> list[Entry]:
    """A batch append made of one-entry appends, with :class:`~dledger.interfaces.IBatchLogStore`'s failure rule.

    ``append_one(entry, *args)`` runs for each entry in order; the first
    DLedgerError becomes a :class:`BatchAppendError` listing what stayed.
    """
    stored: list[Entry] = []
    try:
        for entry in entries:
            stored.append(append_one(entry, *args))
    except DLedgerError as exc:
        raise BatchAppendError(exc, stored) from None
    return stored
