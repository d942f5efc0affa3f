"""InstallSnapshot's decisions as pure functions: when to install, which chunk next, the window, the replies.

The leader's side (:mod:`dledger.replication.snapshot_send`) and the follower's
(:mod:`dledger.replication.snapshot_receive`) only move bytes and time; every
choice they make is one of these functions, each with a table test in
``tests/test_install_rules.py``.  A snapshot's bytes are the concatenation of
its files in manifest order, so a place in the transfer is ``(path, offset)``
and its *ordinal* (bytes before it) orders places.
"""

from __future__ import annotations

import enum
import typing
from collections.abc import Sequence

from dledger.replication.rules import Next, Step

#: InstallSnapshot chunk (``snapshotChunkSize``) when the config does not say.
DEFAULT_CHUNK_SIZE = 256 * 1024
#: Chunks a leader keeps in flight to one follower: enough to keep a link busy, few enough that neither
#: side ever holds more than this many chunks in memory (the follower writes each before it answers).
DEFAULT_WINDOW = 4
#: The most chunks a follower accepts ahead of its disk (a leader never has more than its window in flight).
MAX_QUEUED_CHUNKS = 8


class FileSpan(typing.NamedTuple):
    """One file of a snapshot: its path inside the snapshot directory and its size."""

    path: str
    size: int


class Chunk(typing.NamedTuple):
    """Bytes ``offset .. offset + size`` of file ``path``."""

    path: str
    offset: int
    size: int


Position = tuple[str, int]


def files_of(manifest) -> list[FileSpan]:
    """The files of ``manifest`` that carry bytes (sections in order, their files in order).

    An empty file has nothing to send: the follower creates it itself before it finishes (see
    :func:`empty_files`).
    """
    return [FileSpan(f.path, f.size) for section in manifest.sections for f in section.files if f.size > 0]


def empty_files(manifest) -> list[str]:
    """The paths of ``manifest``'s empty files (never sent; the follower creates them)."""
    return [f.path for section in manifest.sections for f in section.files if f.size == 0]


def first_position(files: Sequence[FileSpan]) -> Position | None:
    """Where a transfer starts (None: a snapshot without bytes is complete from the start)."""
    return (files[0].path, 0) if files else None


def _find(files: Sequence[FileSpan], path: str) -> int | None:
    for i, f in enumerate(files):
        if f.path == path:
            return i
    return None


def normalize(files: Sequence[FileSpan], pos: Position | None) -> Position | None:
    """``pos`` with the end of a file written as the start of the next (None: the end of the transfer).

    ValueError for a path the snapshot does not send or an offset outside its file.
    """
    if pos is None:
        return None
    path, offset = pos
    i = _find(files, path)
    if i is None:
        raise ValueError(f"{path!r} is not a file of this snapshot")
    if offset < 0 or offset > files[i].size:
        raise ValueError(f"offset {offset} is outside {path!r} ({files[i].size} bytes)")
    if offset == files[i].size:
        return (files[i + 1].path, 0) if i + 1 < len(files) else None
    return path, offset


def ordinal(files: Sequence[FileSpan], pos: Position | None) -> int:
    """Bytes of the snapshot before ``pos`` (the total for None, the end): orders places in a transfer."""
    total = 0
    for f in files:
        if pos is not None and f.path == pos[0]:
            return total + pos[1]
        total += f.size
    if pos is None:
        return total
    raise ValueError(f"{pos[0]!r} is not a file of this snapshot")


def chunk_at(files: Sequence[FileSpan], pos: Position | None, chunk_size: int) -> Chunk | None:
    """The chunk to send for place ``pos`` (at most ``chunk_size`` bytes, never across files); None at the end."""
    pos = normalize(files, pos)
    if pos is None:
        return None
    path, offset = pos
    size = files[_find(files, path)].size
    return Chunk(path, offset, min(max(1, chunk_size), size - offset))


def after(files: Sequence[FileSpan], chunk: Chunk) -> Position | None:
    """The place just after ``chunk`` (None: it was the last one)."""
    return normalize(files, (chunk.path, chunk.offset + chunk.size))


def may_send(in_flight: int, window: int) -> bool:
    """Another chunk may go out: fewer than ``window`` (at least 1) await an answer."""
    return in_flight < max(1, window)


# -- the leader ------------------------------------------------------------------------------

class Verdict(enum.Enum):
    """What the leader does after a COMPARE showed the follower's log does not reach into its own."""

    KEEP = "keep"            # the compare step's own answer stands (TRUNCATE, COMPARE or APPEND)
    INSTALL = "install"      # stream the newest snapshot
    JAVA_BEHIND = "java"     # the follower needs a snapshot but is a Java member: keep, and say how to fix it


def after_compare_snapshot(nxt: Next, same: bool, leader_begin: int, snapshot_index: int | None,
                           peer_installs: bool) -> Verdict:
    """Whether the compare step's TRUNCATE at the leader's first index must become an InstallSnapshot.

    The dispatcher truncates at ``leader_begin`` when the follower's log does not reach into the
    leader's (disjoint ranges) or differs all the way down to it.  When ``leader_begin`` is 0 that is a
    complete reset and right.  Above 0 the entries before it are gone from the leader (compaction,
    retention): the follower would keep an unverified prefix, or a hole, before them.  A snapshot that
    covers ``leader_begin - 1`` replaces that prefix, so it is installed; with no such snapshot the
    old behaviour stays (retention without snapshots).  A peer that may not take snapshots (a Java
    member) keeps the old behaviour too and the leader says what to do.
    """
    if same or nxt.step is not Step.TRUNCATE or nxt.index != leader_begin or leader_begin <= 0:
        return Verdict.KEEP
    if snapshot_index is None or snapshot_index < leader_begin - 1:
        return Verdict.KEEP
    return Verdict.INSTALL if peer_installs else Verdict.JAVA_BEHIND


class ReplyAction(enum.Enum):
    ACK = "ack"          # the chunk is written; the transfer goes on
    REWIND = "rewind"    # the follower wants an earlier place: resend from there
    SKIP = "skip"        # the follower is further than we thought (it had the bytes): continue from there
    IGNORE = "ignore"    # nothing to change (a reply to an older round, or the place we are at anyway)


def reply_action(files: Sequence[FileSpan], chunk: Chunk | None, wanted: Position | None,
                 sent_upto: Position | None) -> ReplyAction:
    """How the leader takes a reply that says the follower wants ``wanted`` next.

    ``chunk`` is the chunk the request carried (None for a request without data), ``sent_upto`` the place
    after the last chunk sent.  ``wanted`` at the end of ``chunk`` is the normal acknowledgement; before
    it, the follower did not take the chunk (out of order, lost earlier one, restarted) and the leader
    resends from ``wanted``; after everything sent, it already had those bytes.
    """
    w = ordinal(files, wanted)
    if chunk is not None and wanted == after(files, chunk):
        return ReplyAction.ACK
    sent = ordinal(files, sent_upto)
    if chunk is None:
        if w == sent:
            return ReplyAction.IGNORE
        return ReplyAction.REWIND if w < sent else ReplyAction.SKIP
    if w < ordinal(files, after(files, chunk)):
        return ReplyAction.REWIND
    if w > sent:
        return ReplyAction.SKIP
    return ReplyAction.IGNORE


# -- the follower ------------------------------------------------------------------------------

def chunk_error(files: Sequence[FileSpan], path: str, offset: int, size: int) -> str | None:
    """Why a chunk of ``size`` bytes at ``(path, offset)`` cannot be part of this snapshot; None if it can."""
    i = _find(files, path)
    if i is None:
        return f"{path!r} is not a file of the snapshot"
    if offset < 0 or offset + size > files[i].size:
        return f"bytes {offset}..{offset + size} run past {path!r} ({files[i].size} bytes)"
    if size == 0:
        return f"an empty chunk of {path!r}"
    return None


def takes_chunk(files: Sequence[FileSpan], expected: Position | None, path: str, offset: int) -> bool:
    """The follower writes a chunk only at the place it expects next (anything else is answered with it)."""
    return expected is not None and normalize(files, expected) == normalize(files, (path, offset))


class Disposition(enum.Enum):
    WRITE = "write"    # the chunk at the place expected: write it now
    PARK = "park"      # a chunk ahead of the place expected (the network reordered): keep it until its turn
    ANSWER = "answer"  # a duplicate, or no room: answer with the place wanted, keep nothing


def chunk_disposition(files: Sequence[FileSpan], expected: Position | None, path: str, offset: int,
                      held: int, parked: bool) -> Disposition:
    """What a follower does with a chunk at ``(path, offset)`` while ``held`` chunks are queued or parked.

    In order: written.  Ahead of the place expected (a reordered window): parked, so one late chunk does
    not make the leader resend the whole window.  Behind it (a duplicate) or already parked: answered.
    Never more than :data:`MAX_QUEUED_CHUNKS` held, so memory stays bounded whatever a sender does.
    """
    if expected is None or held >= MAX_QUEUED_CHUNKS:
        return Disposition.ANSWER
    if takes_chunk(files, expected, path, offset):
        return Disposition.WRITE
    if not parked and ordinal(files, (path, offset)) > ordinal(files, expected):
        return Disposition.PARK
    return Disposition.ANSWER


def install_refusal(committed_index: int, snapshot_index: int) -> str | None:
    """Why a follower must not install a snapshot at ``snapshot_index``; None if it may.

    Installing resets the log to the snapshot: a member that committed beyond it would lose committed
    entries (a leader never needs to send it one: its log reaches into the leader's).
    """
    if committed_index > snapshot_index:
        return (f"this member committed up to {committed_index}, past the snapshot's index {snapshot_index}: "
                "installing it would go back")
    return None
