"""The follower's check of a push as one run: what ``entry.decode_entries`` notes while decoding (``largest``:
one plain run) and what ``store.base.follower_run_end`` then checks of the run as a whole.

Together they must never accept what the entry-by-entry checks refuse: a table for each rule and a property
test for the whole.
"""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.entry import HEADER_SIZE, MIN_BLANK_LEN, Entry, EntryList, body_crc, decode_entries, encode_entry
from dledger.errors import DLedgerError
from dledger.store.base import check_follower_entry, check_next_index, follower_run_end

FILE = 4096
LIMIT = FILE - MIN_BLANK_LEN  # the first data file's run_limit


def run(sizes, first_index=5, write_pos=0):
    """Entries of the given body sizes placed one after another from ``write_pos``, as a leader pushes them."""
    out, pos = [], write_pos
    for i, n in enumerate(sizes):
        body = bytes([i % 251]) * n
        out.append(Entry(body, first_index + i, 2, pos, body_crc=body_crc(body)))
        pos += HEADER_SIZE + n
    return out


def changed(entries, k, **fields):
    entries = list(entries)
    entries[k] = dataclasses.replace(entries[k], **fields)
    return entries


def pushed(entries) -> EntryList:
    """The entries as a follower gets them: encoded back to back and decoded (which notes one plain run)."""
    data = b"".join(encode_entry(e) for e in entries)
    got, _ = decode_entries(data, 0, len(data), len(entries), accept_zero_crc=True)
    return got


def slow_checks_pass(entries, first_index, write_pos, file_size, max_size, accept_zero_crc=True) -> bool:
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


BASE = run([100, 1, 300])
END = 3 * HEADER_SIZE + 401


@pytest.mark.parametrize("entries, plain", [
    pytest.param(BASE, True, id="a plain run"),
    pytest.param(run([7]), True, id="one entry"),
    pytest.param(changed(BASE, 2, index=8), False, id="an index skipped"),
    pytest.param(changed(BASE, 1, index=4), False, id="an index going back"),
    pytest.param(changed(BASE, 1, pos=BASE[1].pos + 1), False, id="a position not right after the one before"),
    pytest.param(changed(BASE, 0, channel=1), False, id="channel set on the first"),
    pytest.param(changed(BASE, 2, chain_crc=3), False, id="chain crc set"),
    pytest.param(changed(BASE, 0, body_crc=0), False, id="a zero crc on the first"),
    pytest.param(changed(BASE, 1, body_crc=0), False, id="a zero crc"),
    pytest.param(run([100, 0, 300]), False, id="an empty body (its CRC is 0): entry by entry, to be safe"),
])
def test_decode_notes_one_plain_run(entries, plain):
    got = pushed(entries)
    assert got == entries and got.largest == (max(e.size for e in entries) if plain else 0)


PLAIN = pushed(BASE)


@pytest.mark.parametrize("entries, kw, expected", [
    pytest.param(PLAIN, {}, END, id="in place"),
    pytest.param(EntryList(BASE), {}, None, id="a list that does not vouch for itself"),
    pytest.param(PLAIN, {"first_index": 6}, None, id="not after the end index"),
    pytest.param(PLAIN, {"write_pos": 48}, None, id="not at the write position"),
    pytest.param(PLAIN, {"max_size": HEADER_SIZE + 299}, None, id="an entry over the size limit"),
    pytest.param(PLAIN, {"max_size": HEADER_SIZE + 300}, END, id="the largest entry at the size limit"),
    pytest.param(PLAIN, {"limit": END - 1}, None, id="past the file's limit"),
    pytest.param(pushed(run([FILE - HEADER_SIZE - MIN_BLANK_LEN])), {"limit": 10 * FILE}, FILE - MIN_BLANK_LEN,
                 id="room left for the blank marker"),
    pytest.param(pushed(run([FILE - HEADER_SIZE - MIN_BLANK_LEN + 1])), {"limit": 10 * FILE}, None,
                 id="no room for the blank marker"),
])
def test_follower_run_end(entries, kw, expected):
    args = {"first_index": 5, "write_pos": 0, "limit": LIMIT, "file_size": FILE, "max_size": 1 << 20, **kw}
    assert follower_run_end(entries, **args) == expected


@st.composite
def pushes(draw):
    sizes = draw(st.lists(st.integers(0, 700), min_size=1, max_size=8))
    write_pos = draw(st.sampled_from([0, 100, FILE - 200, FILE + 48]))
    entries = run(sizes, write_pos=write_pos)
    for _ in range(draw(st.integers(0, 2))):  # damage a field or two
        k = draw(st.integers(0, len(entries) - 1))
        field, value = draw(st.sampled_from([("index", 99), ("index", entries[k].index - 1), ("pos", 3),
                                             ("channel", 1), ("chain_crc", 1), ("body_crc", 0),
                                             ("pos", entries[k].pos + 1)]))
        entries = changed(entries, k, **{field: value})
    first = draw(st.sampled_from([5, 5, 6]))
    return entries, first, write_pos, draw(st.sampled_from([FILE // 2, 1 << 20]))


@settings(max_examples=800, deadline=None)
@given(pushes())
def test_a_run_is_accepted_only_where_every_entry_check_accepts(push):
    """Whenever a decoded push gets an end, each entry passes its own checks in place and the run ends there; a
    push that passes them without a zero CRC is refused only for running past the file's limit."""
    entries, first, write_pos, max_size = push
    limit = (write_pos // FILE + 1) * FILE - MIN_BLANK_LEN
    end = follower_run_end(pushed(entries), first, write_pos, limit, FILE, max_size)
    if end is not None:
        assert slow_checks_pass(entries, first, write_pos, FILE, max_size)
        assert end == write_pos + sum(e.size for e in entries)
    elif slow_checks_pass(entries, first, write_pos, FILE, max_size) and all(e.body_crc for e in entries):
        assert write_pos + sum(e.size for e in entries) > limit, "a valid in-place run was refused"
