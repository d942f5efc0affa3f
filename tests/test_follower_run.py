"""The follower's batch check (``store.base.follower_run_end``): a decoded push checked a field at a time.

It must never accept what the entry-by-entry checks refuse; a table for each rule and a property test for
the whole.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.entry import HEADER_SIZE, MIN_BLANK_LEN, Entry
from dledger.errors import DLedgerError
from dledger.store.base import check_follower_entry, check_next_index, follower_run_end

FILE = 4096
LIMIT = FILE - MIN_BLANK_LEN  # the first data file's run_limit


def run(sizes, first_index=5, write_pos=0, crc=7):
    """Entries of the given body sizes placed one after another from ``write_pos``, as a leader pushes them."""
    out, pos = [], write_pos
    for i, n in enumerate(sizes):
        out.append(Entry(bytes(n), first_index + i, 2, pos, body_crc=crc))
        pos += HEADER_SIZE + n
    return out


def changed(entries, k, **fields):
    entries = list(entries)
    entries[k] = dataclasses.replace(entries[k], **fields)
    return entries


def slow_checks_pass(entries, first_index, write_pos, file_size, max_size, accept_zero_crc) -> bool:
    """The entry-by-entry checks, as the mmap store makes them for a decoded push (crc_checked)."""
    wp = write_pos
    try:
        for k, e in enumerate(entries):
            check_next_index(e, first_index + k - 1)
            pos = check_follower_entry(e, wp, file_size, max_size, accept_zero_crc, True)
            if pos != wp:
                return False
            wp = pos + e.size
    except DLedgerError:
        return False
    return True


BASE = run([100, 0, 300])
END = 3 * HEADER_SIZE + 400


@pytest.mark.parametrize("entries, kw, expected", [
    pytest.param(BASE, {}, END, id="a run in place"),
    pytest.param([], {}, None, id="nothing"),
    pytest.param(run([100, 0, 300], first_index=6), {}, None, id="not after the end index"),
    pytest.param(changed(BASE, 2, index=8), {}, None, id="an index skipped"),
    pytest.param(changed(BASE, 1, pos=BASE[1].pos + 1), {}, None, id="a position not the leader's"),
    pytest.param(run([100, 0, 300], write_pos=8), {}, None, id="not at the write position"),
    pytest.param(BASE, {"max_size": HEADER_SIZE + 299}, None, id="an entry over the size limit"),
    pytest.param(BASE, {"limit": END - 1}, None, id="past the file's limit"),
    pytest.param(run([FILE - HEADER_SIZE - MIN_BLANK_LEN]), {"limit": 10 * FILE}, FILE - MIN_BLANK_LEN,
                 id="room left for the blank marker"),
    pytest.param(run([FILE - HEADER_SIZE - MIN_BLANK_LEN + 1]), {"limit": 10 * FILE}, None,
                 id="no room for the blank marker"),
    pytest.param(changed(BASE, 0, channel=1), {}, None, id="channel set"),
    pytest.param(changed(BASE, 2, chain_crc=3), {}, None, id="chain crc set"),
    pytest.param(changed(BASE, 1, body_crc=0), {}, None, id="a zero crc, not accepted"),
    pytest.param(changed(BASE, 1, body_crc=0), {"accept_zero_crc": True}, END, id="a zero crc, accepted"),
])
def test_follower_run_end(entries, kw, expected):
    args = {"write_pos": 0, "limit": LIMIT, "file_size": FILE, "max_size": 1 << 20, "accept_zero_crc": False, **kw}
    assert follower_run_end(entries, 5, **args) == expected


@st.composite
def pushes(draw):
    sizes = draw(st.lists(st.integers(0, 700), min_size=1, max_size=8))
    write_pos = draw(st.sampled_from([0, 100, FILE - 200, FILE + 48]))
    entries = run(sizes, write_pos=write_pos, crc=draw(st.sampled_from([0, 7])))
    for _ in range(draw(st.integers(0, 2))):  # damage a field or two
        k = draw(st.integers(0, len(entries) - 1))
        field, value = draw(st.sampled_from([("index", 99), ("pos", 3), ("channel", 1), ("chain_crc", 1),
                                             ("body_crc", 0), ("pos", entries[k].pos + 1)]))
        entries = changed(entries, k, **{field: value})
    first = draw(st.sampled_from([5, 5, 6]))
    return entries, first, write_pos, draw(st.sampled_from([FILE // 2, 1 << 20])), draw(st.booleans())


@settings(max_examples=600, deadline=None)
@given(pushes())
def test_follower_run_end_accepts_only_what_every_entry_check_accepts(push):
    """Whenever the batch check gives an end, each entry passes its own checks in place and the run ends there."""
    entries, first, write_pos, max_size, accept_zero = push
    limit = (write_pos // FILE + 1) * FILE - MIN_BLANK_LEN
    end = follower_run_end(entries, first, write_pos, limit, FILE, max_size, accept_zero)
    if end is not None:
        assert slow_checks_pass(entries, first, write_pos, FILE, max_size, accept_zero)
        assert end == write_pos + sum(e.size for e in entries)
    elif slow_checks_pass(entries, first, write_pos, FILE, max_size, accept_zero) and not any(
            e.body_crc == 0 for e in entries):
        # the only batches it may leave to the entry-by-entry path although they pass: none but zero-CRC ones
        assert write_pos + sum(e.size for e in entries) > limit, "a valid in-place run was refused"
