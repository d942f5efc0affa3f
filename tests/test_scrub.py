"""The background scrub and entry repair rules (dledger.store.scrub, dledger.replication.repair; issue 21)."""

import pytest
from twisted.internet import task

from dledger.codes import EntryType, ResponseCode
from dledger.diskio import INLINE
from dledger.entry import Entry, body_crc
from dledger.errors import DLedgerError
from dledger.metrics import _scrub_metrics
from dledger.replication.repair import fetch_order
from dledger.store.mmapfile import MmapLogStore
from dledger.store.scrub import Scrubber, ScrubStats, noop_from_record, repair_refusal, verify_span
from dledger.testing.store_contract import FakeMemberState, fired

BODY = b"the committed body"
CRC = body_crc(BODY)
RECORD = (1, 4096, 48 + len(BODY), 7, 3)  # magic, pos, size, index, term


def copy(**kw):
    fields = dict(body=BODY, index=7, term=3, pos=4096, magic=1, body_crc=CRC)
    fields.update(kw)
    return Entry(**fields)


@pytest.mark.parametrize("record, header, entry, refused", [
    (RECORD, None, copy(), None),                                         # header unreadable: record + own CRC prove it
    (RECORD, copy(), copy(), None),                                       # header readable, same recorded CRC
    (None, None, copy(), "index record"),                                 # nothing says what the entry was
    (RECORD, None, copy(term=4), "term 4"),                               # another term: another entry
    (RECORD, None, copy(index=8), "entry 8"),
    (RECORD, None, copy(pos=4097), "pos 4097"),
    (RECORD, None, copy(body=BODY + b"!", body_crc=body_crc(BODY + b"!")), "size"),
    (RECORD, None, copy(magic=3), "type 3"),
    (RECORD, None, copy(body=b"the committed bodY"), "its own CRC"),       # the copy is damaged too
    (RECORD, None, copy(body_crc=0), "no body CRC"),                      # Java-written: cannot be verified
    (RECORD, copy(body_crc=CRC ^ 1), copy(), "differs from"),            # not what our header recorded
    (RECORD, None, copy(channel=1), "reserved"),
])
def test_repair_refusal(record, header, entry, refused):
    """A copy replaces a damaged entry only when index record, own CRC and recorded CRC all prove it is the same."""
    why = repair_refusal(record, header, entry)
    if refused is None:
        assert why is None
    else:
        assert why is not None and refused in why, why


def test_noop_from_record():
    """A NOOP is rebuilt from its index record alone; any other type is not."""
    e = noop_from_record((int(EntryType.NOOP), 96, 48, 2, 5))
    assert (e.index, e.term, e.pos, e.body, e.magic) == (2, 5, 96, b"", EntryType.NOOP)
    assert repair_refusal((int(EntryType.NOOP), 96, 48, 2, 5), None, e) is None
    assert noop_from_record((1, 96, 48, 2, 5)) is None


@pytest.mark.parametrize("peers, leader, order", [
    (["n0", "n1", "n2"], "n2", ["n2", "n1"]),
    (["n2", "n1", "n0"], None, ["n1", "n2"]),
    (["n0", "n1", "n2"], "n0", ["n1", "n2"]),  # we lead: the followers
])
def test_fetch_order(peers, leader, order):
    """The leader is asked first (it holds every committed entry), then the others in id order; never ourselves."""
    assert fetch_order(peers, "n0", leader) == order


def open_store(tmp_path, clock=None):
    store = MmapLogStore(tmp_path / "dledger-n0", FakeMemberState(), data_file_size=4096, index_file_size=32 * 64,
                         max_entry_size=1024, clock=clock)
    store.startup()
    return store


def filled(tmp_path, n=12):
    store = open_store(tmp_path)
    for i in range(n):
        store.append_as_leader(Entry(body=b"body %d " % i + bytes(300), term=1))
    store.update_committed_index(1, n - 1)
    fired(store.shutdown())
    return open_store(tmp_path, task.Clock())


def flip(store, index):
    e = store.check_entry(index)
    f = store._data.file_for(e.pos)
    with open(f.path, "r+b") as fh:
        fh.seek(e.pos - f.start + 50)
        b = fh.read(1)
        fh.seek(e.pos - f.start + 50)
        fh.write(bytes([b[0] ^ 1]))
    return e


def test_verify_span_finds_a_flipped_byte_and_skips_a_removed_file(tmp_path):
    """The worker-side check reports exactly the damaged entry; a file gone meanwhile has nothing to scrub."""
    store = filled(tmp_path)
    good = flip(store, 5)
    span = store.scrub_span(0, 1 << 20)
    assert span.records[0].index == 0 and span.path.endswith("00000000000000000000")
    problems = verify_span(span, accept_zero_crc=True)
    assert [i for i, _ in problems] == [5] and "crc" in problems[0][1]
    with pytest.raises(DLedgerError) as info:
        store.check_entry(5)
    assert info.value.code is ResponseCode.DISK_ERROR and "offset" in info.value.message
    span.path += ".gone"
    assert verify_span(span, accept_zero_crc=True) == []
    fired(store.repair_entry(good))
    assert store.check_entry(5) == good
    fired(store.shutdown())


def test_repair_entry_refuses_what_it_cannot_prove_and_uncommitted_entries(tmp_path):
    """A copy of another term or with a bad CRC changes nothing; an uncommitted index is never rewritten."""
    store = filled(tmp_path)
    good = flip(store, 3)
    before = open(store._data.files[0].path, "rb").read()
    for bad in (copy(index=3, term=2, pos=good.pos, body=good.body, body_crc=good.body_crc),
                Entry(body=good.body[:-1] + b"?", index=3, term=1, pos=good.pos, magic=1, body_crc=good.body_crc)):
        with pytest.raises(DLedgerError) as info:
            store.repair_entry(bad)
        assert info.value.code is ResponseCode.UNEXPECTED_ARGUMENT
    assert open(store._data.files[0].path, "rb").read() == before
    store.committed_index = 2
    with pytest.raises(DLedgerError):
        store.repair_entry(good)
    fired(store.shutdown())


def test_scrubber_walks_rate_limited_and_hands_confirmed_damage_to_the_repair(tmp_path):
    """Spans wait bytes/rate seconds apart; the damaged entry is confirmed, repaired; a pass ends and the next waits."""
    store = filled(tmp_path, 12)
    clock = store.clock
    good = flip(store, 9)
    asked = []

    def on_damaged(index, why):
        asked.append((index, why))
        return store.repair_entry(good)

    scrubber = Scrubber(store, clock, INLINE, interval=100.0, bytes_per_second=1000, on_damaged=on_damaged,
                        name="n0", span_bytes=1000)
    scrubber.start()
    clock.advance(99)
    assert scrubber.stats.entries == 0, "the first pass starts one interval after start"
    clock.advance(1)
    first = scrubber.stats.bytes
    assert 0 < first < 2000 and scrubber.stats.passes == 0
    assert abs(scrubber._call.getTime() - clock.seconds() - first / 1000) < 1e-9, "waits bytes / rate"
    for _ in range(20):
        clock.advance(2)
    stats = scrubber.stats
    assert stats.passes == 1 and stats.entries == 12 and stats.damaged == 1 and stats.repaired == 1
    assert [i for i, _ in asked] == [9] and "offset" in asked[0][1]
    assert store.check_entry(9) == good
    names = [m.name for m in _scrub_metrics(stats, ["group", "self_id"], ["g0", "n0"])]
    assert "dledger_scrub_repaired" in names and "dledger_scrub_passes" in names
    assert [c for c in clock.getDelayedCalls() if "Scrubber" in repr(c)], "the next pass is scheduled"
    scrubber.stop()
    assert not [c for c in clock.getDelayedCalls() if "Scrubber" in repr(c)]
    fired(store.shutdown())


def test_scrub_stats_start_at_zero():
    """Nothing is counted before a pass ran."""
    s = ScrubStats()
    assert (s.passes, s.bytes, s.damaged, s.repaired, s.unrepaired) == (0, 0, 0, 0, 0)
