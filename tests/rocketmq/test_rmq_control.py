"""Broker CONTROL entries (dledger_rocketmq.common.control): layout, strict decoding, round trip."""

from __future__ import annotations

import struct

import pytest
from dledger_rocketmq.common.control import (
    KIND_OFFSET_COMMIT,
    KIND_OFFSET_RESET,
    ControlEntry,
    ControlError,
    OffsetCommit,
    decode_control,
    encode_offset_commits,
    is_control,
)
from dledger_rocketmq.common.message import MessageRecord, encode_record
from hypothesis import given
from hypothesis import strategies as st

ONE = OffsetCommit("cg", "T", 3, 7)


def test_layout_of_one_commit():
    """One commit encodes as RMQC, kind 1, count 1, length-prefixed names, int32 queue id, int64 offset."""
    assert encode_offset_commits([ONE]) == (b"RMQC\x01\x00\x01" + b"\x00\x02cg" + b"\x00\x01T"
                                            + struct.pack(">iq", 3, 7))


def test_reset_kind():
    """reset=True writes kind 2, decoded as a reset."""
    entry = decode_control(encode_offset_commits([ONE], reset=True))
    assert entry == ControlEntry(KIND_OFFSET_RESET, (ONE,)) and entry.is_reset


def test_not_a_control_entry():
    """A CommitLog record (or anything without the prefix) is not a control entry: None, no error."""
    record = encode_record(MessageRecord(topic="T", body=b"x"))
    assert decode_control(record) is None and not is_control(record)
    assert decode_control(b"") is None
    assert is_control(encode_offset_commits([ONE]))


GOOD = encode_offset_commits([ONE, OffsetCommit("cg2", "%RETRY%cg2", 0, -1)])


@pytest.mark.parametrize("body, message", [
    (b"RMQC", "shorter than its 7-byte header"),
    (b"RMQC\x09\x00\x01", "unknown kind 9"),
    (b"RMQC\x01\x00\x00", "no commits"),
    (GOOD[:-1], "commit 1 truncated in its queue id/offset"),
    (GOOD + b"\x00", "1 bytes after its 2 commits"),
    (b"RMQC\x01\x00\x01\x00", "commit 0 truncated in its group length"),
    (b"RMQC\x01\x00\x01\x00\x00", "commit 0 group length 0 not in 1..255"),
    (b"RMQC\x01\x00\x01\x00\x05ab", "commit 0 truncated in its group"),
    (b"RMQC\x01\x00\x01\x00\x01\xff\x00\x01T" + bytes(12), "commit 0 group is not UTF-8"),
    (b"RMQC\x01\x00\x01\x00\x01@\x00\x01T" + bytes(12), "commit 0 group contains '@'"),
    (b"RMQC\x01\x00\x02" + GOOD[7:7 + 4 + 3 + 12], "commit 1 truncated in its group length"),
])
def test_malformed_bodies_raise_one_line(body, message):
    """Every malformed body raises ControlError naming what is wrong, on one line."""
    with pytest.raises(ControlError) as info:
        decode_control(body)
    assert message in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("commits, message", [
    ([], "no commits"),
    ([OffsetCommit("", "T", 0, 0)], "empty group"),
    ([OffsetCommit("g", "", 0, 0)], "empty topic"),
    ([OffsetCommit("g" * 256, "T", 0, 0)], "group of 256 bytes exceeds 255"),
    ([OffsetCommit("g", "T", 1 << 31, 0)], "queue id 2147483648 out of int32 range"),
    ([OffsetCommit("g@x", "T", 0, 0)], "group 'g@x' contains '@'"),
    ([OffsetCommit("g", "T", 0, 1 << 63)], "out of int64 range"),
])
def test_bad_commits_refused_when_encoding(commits, message):
    """Commits that could not decode back are refused at encode time."""
    with pytest.raises(ControlError, match=message):
        encode_offset_commits(commits)


names = st.text(min_size=1, max_size=40).filter(lambda s: len(s.encode()) <= 255 and "@" not in s)
commits = st.builds(OffsetCommit, names, names, st.integers(-(1 << 31), (1 << 31) - 1),
                    st.integers(-(1 << 63), (1 << 63) - 1))


@given(st.lists(commits, min_size=1, max_size=20), st.booleans())
def test_round_trip(items, reset):
    """decode(encode(commits)) gives the same commits in order, with the kind."""
    entry = decode_control(encode_offset_commits(items, reset=reset))
    assert entry.commits == tuple(items)
    assert entry.kind == (KIND_OFFSET_RESET if reset else KIND_OFFSET_COMMIT)


@given(st.binary(max_size=64))
def test_random_bytes_never_crash(tail):
    """Any bytes after the prefix decode or raise ControlError, nothing else."""
    try:
        decode_control(b"RMQC" + tail)
    except ControlError:
        pass
