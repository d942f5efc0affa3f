"""InstallSnapshot's pure decisions (dledger.replication.snapshot_rules), one table row per rule."""

from types import SimpleNamespace

import pytest

from dledger.replication import snapshot_rules as r
from dledger.replication.rules import Next, Step
from dledger.replication.snapshot_rules import Chunk, FileSpan, ReplyAction, Verdict

FILES = [FileSpan("a/000000", 10), FileSpan("a/000001", 4), FileSpan("b/000000", 7)]


def test_files_of_keeps_manifest_order_and_leaves_out_empty_files():
    """Files are sent section by section, in order; an empty file is never sent (the follower creates it)."""
    f = SimpleNamespace
    manifest = f(sections=[f(files=[f(path="b/0", size=3), f(path="b/1", size=0)]), f(files=[f(path="a/0", size=5)])])
    assert r.files_of(manifest) == [FileSpan("b/0", 3), FileSpan("a/0", 5)]
    assert r.empty_files(manifest) == ["b/1"]


NORMALIZE = [
    ("inside_a_file_stays", ("a/000000", 3), ("a/000000", 3)),
    ("end_of_a_file_is_start_of_next", ("a/000000", 10), ("a/000001", 0)),
    ("end_of_last_file_is_the_end", ("b/000000", 7), None),
    ("the_end_stays_the_end", None, None),
]


@pytest.mark.parametrize("rule, pos, expected", NORMALIZE, ids=[x[0] for x in NORMALIZE])
def test_normalize(rule, pos, expected):
    """A place at the end of a file is the start of the next one; past the last file is the end (None)."""
    assert r.normalize(FILES, pos) == expected


@pytest.mark.parametrize("pos", [("zz", 0), ("a/000000", 11), ("a/000001", -1)])
def test_normalize_refuses_places_the_snapshot_does_not_have(pos):
    """An unknown path or an offset outside its file is a ValueError (a reply that makes no sense)."""
    with pytest.raises(ValueError):
        r.normalize(FILES, pos)


ORDINAL = [
    ("start", ("a/000000", 0), 0),
    ("inside_first", ("a/000000", 9), 9),
    ("second_file", ("a/000001", 2), 12),
    ("third_file", ("b/000000", 0), 14),
    ("end", None, 21),
]


@pytest.mark.parametrize("rule, pos, expected", ORDINAL, ids=[x[0] for x in ORDINAL])
def test_ordinal(rule, pos, expected):
    """A place's ordinal is the bytes of the snapshot before it (the total at the end)."""
    assert r.ordinal(FILES, pos) == expected


CHUNKS = [
    # (rule, place, chunk size, chunk, place after it)
    ("full_chunk_inside_a_file", ("a/000000", 0), 4, Chunk("a/000000", 0, 4), ("a/000000", 4)),
    ("last_chunk_of_a_file_is_cut_at_its_end", ("a/000000", 8), 4, Chunk("a/000000", 8, 2), ("a/000001", 0)),
    ("a_chunk_never_spans_two_files", ("a/000001", 0), 100, Chunk("a/000001", 0, 4), ("b/000000", 0)),
    ("end_of_a_file_moves_to_the_next", ("a/000000", 10), 4, Chunk("a/000001", 0, 4), ("b/000000", 0)),
    ("last_chunk_then_the_end", ("b/000000", 5), 4, Chunk("b/000000", 5, 2), None),
]


@pytest.mark.parametrize("rule, pos, size, chunk, nxt", CHUNKS, ids=[x[0] for x in CHUNKS])
def test_which_chunk_next(rule, pos, size, chunk, nxt):
    """The chunk for a place holds at most snapshotChunkSize bytes of one file; after it comes the next place."""
    assert r.chunk_at(FILES, pos, size) == chunk
    assert r.after(FILES, chunk) == nxt


def test_chunks_cover_every_byte_once():
    """Walking chunk by chunk from the first place sends each byte of each file exactly once, in order."""
    pos, seen = r.first_position(FILES), []
    while (chunk := r.chunk_at(FILES, pos, 3)) is not None:
        seen += [(chunk.path, o) for o in range(chunk.offset, chunk.offset + chunk.size)]
        pos = r.after(FILES, chunk)
    assert seen == [(f.path, o) for f in FILES for o in range(f.size)]
    assert r.chunk_at(FILES, None, 3) is None and r.first_position([]) is None


WINDOW = [("empty", 0, 4, True), ("room", 3, 4, True), ("full", 4, 4, False), ("window_of_0_means_1", 0, 0, True),
          ("window_of_0_full_at_1", 1, 0, False)]


@pytest.mark.parametrize("rule, in_flight, window, expected", WINDOW, ids=[x[0] for x in WINDOW])
def test_window(rule, in_flight, window, expected):
    """At most ``window`` chunks await an answer (at least one may always be in flight)."""
    assert r.may_send(in_flight, window) is expected


SNAP = [
    # (rule, next step, same, leader begin, snapshot index, peer installs, verdict)
    ("truncate_at_begin_with_snapshot_installs", Next(Step.TRUNCATE, 100), False, 100, 120, True, Verdict.INSTALL),
    ("snapshot_exactly_below_begin_installs", Next(Step.TRUNCATE, 100), False, 100, 99, True, Verdict.INSTALL),
    ("snapshot_older_than_begin_cannot_help", Next(Step.TRUNCATE, 100), False, 100, 98, True, Verdict.KEEP),
    ("no_snapshot_keeps_the_truncate", Next(Step.TRUNCATE, 100), False, 100, None, True, Verdict.KEEP),
    ("leader_log_from_0_is_a_full_reset", Next(Step.TRUNCATE, 0), False, 0, 50, True, Verdict.KEEP),
    ("truncate_above_begin_is_a_repair", Next(Step.TRUNCATE, 150), False, 100, 120, True, Verdict.KEEP),
    ("equal_entry_truncate_is_a_repair", Next(Step.TRUNCATE, 100), True, 100, 120, True, Verdict.KEEP),
    ("append_needs_nothing", Next(Step.APPEND, 101), True, 100, 120, True, Verdict.KEEP),
    ("compare_goes_on", Next(Step.COMPARE, 110), False, 100, 120, True, Verdict.KEEP),
    ("java_peer_is_never_sent_one", Next(Step.TRUNCATE, 100), False, 100, 120, False, Verdict.JAVA_BEHIND),
]


@pytest.mark.parametrize("rule, nxt, same, begin, snap, installs, verdict", SNAP, ids=[x[0] for x in SNAP])
def test_when_to_install(rule, nxt, same, begin, snap, installs, verdict):
    """A TRUNCATE at the leader's first index (> 0) after a mismatch becomes InstallSnapshot if a snapshot covers it."""
    assert r.after_compare_snapshot(nxt, same, begin, snap, installs) is verdict


REPLIES = [
    # (rule, chunk sent, place the follower wants, place after the last chunk sent, action)
    ("wanted_is_end_of_chunk_ack", Chunk("a/000000", 0, 4), ("a/000000", 4), ("a/000000", 8), ReplyAction.ACK),
    ("ack_of_last_chunk_of_a_file", Chunk("a/000000", 8, 2), ("a/000001", 0), ("a/000001", 0), ReplyAction.ACK),
    ("ack_of_the_last_chunk", Chunk("b/000000", 4, 3), None, None, ReplyAction.ACK),
    ("wanted_before_chunk_rewinds", Chunk("a/000000", 4, 4), ("a/000000", 4 - 4), ("b/000000", 0),
     ReplyAction.REWIND),
    ("wanted_at_chunk_start_rewinds", Chunk("a/000001", 0, 4), ("a/000001", 0), ("b/000000", 3), ReplyAction.REWIND),
    ("wanted_past_all_sent_skips", Chunk("a/000000", 0, 4), ("b/000000", 2), ("a/000000", 8), ReplyAction.SKIP),
    ("wanted_inside_what_is_in_flight_waits", Chunk("a/000000", 0, 4), ("a/000000", 6), ("a/000001", 0),
     ReplyAction.IGNORE),
    ("status_at_our_place_changes_nothing", None, ("a/000001", 0), ("a/000001", 0), ReplyAction.IGNORE),
    ("status_behind_us_rewinds", None, ("a/000000", 0), ("a/000001", 0), ReplyAction.REWIND),
    ("status_ahead_of_us_skips", None, ("b/000000", 0), ("a/000001", 0), ReplyAction.SKIP),
]


@pytest.mark.parametrize("rule, chunk, wanted, sent, action", REPLIES, ids=[x[0] for x in REPLIES])
def test_reply_action(rule, chunk, wanted, sent, action):
    """The follower's "next place wanted" acknowledges a chunk, or moves the transfer back or forward."""
    assert r.reply_action(FILES, chunk, wanted, sent) is action


CHUNK_ERRORS = [
    ("inside", "a/000000", 0, 10, None),
    ("unknown_file", "zz", 0, 1, "not a file"),
    ("past_file_end", "a/000001", 2, 3, "run past"),
    ("negative_offset", "a/000001", -1, 1, "run past"),
    ("empty_chunk", "a/000001", 0, 0, "empty chunk"),
]


@pytest.mark.parametrize("rule, path, offset, size, error", CHUNK_ERRORS, ids=[x[0] for x in CHUNK_ERRORS])
def test_chunk_error(rule, path, offset, size, error):
    """A follower refuses a chunk that is not inside a file of the snapshot."""
    got = r.chunk_error(FILES, path, offset, size)
    assert (got is None) if error is None else (error in got)


TAKES = [
    ("expected_place", ("a/000000", 4), "a/000000", 4, True),
    ("end_of_file_equals_start_of_next", ("a/000000", 10), "a/000001", 0, True),
    ("ahead_of_expected", ("a/000000", 4), "a/000000", 8, False),
    ("behind_expected_duplicate", ("a/000000", 4), "a/000000", 0, False),
    ("nothing_expected_any_more", None, "a/000000", 0, False),
]


@pytest.mark.parametrize("rule, expected, path, offset, takes", TAKES, ids=[x[0] for x in TAKES])
def test_follower_takes_chunks_in_order_only(rule, expected, path, offset, takes):
    """A follower writes only the chunk at the place it expects (a duplicate or a gap is answered, not written)."""
    assert r.takes_chunk(FILES, expected, path, offset) is takes


@pytest.mark.parametrize("committed, index, refused", [(-1, 10, False), (10, 10, False), (11, 10, True)])
def test_install_refusal(committed, index, refused):
    """A member that committed past the snapshot refuses it: installing would lose committed entries."""
    assert (r.install_refusal(committed, index) is not None) is refused


DISPOSITION = [
    # (rule, expected place, chunk place, chunks held, already parked, what the follower does)
    ("in_order_is_written", ("a/000000", 4), ("a/000000", 4), 0, False, r.Disposition.WRITE),
    ("end_of_file_place_is_in_order", ("a/000000", 10), ("a/000001", 0), 2, False, r.Disposition.WRITE),
    ("ahead_is_parked_until_its_turn", ("a/000000", 4), ("a/000001", 0), 1, False, r.Disposition.PARK),
    ("duplicate_behind_is_answered", ("a/000001", 0), ("a/000000", 4), 0, False, r.Disposition.ANSWER),
    ("second_copy_of_a_parked_chunk_is_answered", ("a/000000", 0), ("a/000000", 4), 1, True, r.Disposition.ANSWER),
    ("nothing_held_past_the_limit", ("a/000000", 0), ("a/000000", 0), r.MAX_QUEUED_CHUNKS, False,
     r.Disposition.ANSWER),
    ("everything_received_answers", None, ("a/000000", 0), 0, False, r.Disposition.ANSWER),
]


@pytest.mark.parametrize("rule, expected, place, held, parked, action", DISPOSITION, ids=[x[0] for x in DISPOSITION])
def test_chunk_disposition(rule, expected, place, held, parked, action):
    """In order: written; ahead (reordered): parked; behind, duplicated or over the limit: answered, not kept."""
    assert r.chunk_disposition(FILES, expected, place[0], place[1], held, parked) is action
