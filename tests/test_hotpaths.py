"""Behaviour kept by the hot-path optimizations: coalesced durability waits, fast header and base64 paths."""

import base64
import binascii
import random

import pytest

from dledger.messages import AppendEntryRequest, from_wire, to_wire
from dledger.testing.cluster import Cluster
from dledger.transport.remoting import Header, HeaderError, _dumps, _utf8


@pytest.mark.parametrize("policy", ["sync", "async"])
def test_every_append_commits_with_one_durability_wait_per_flush_round(policy):
    """A burst of appends all commit, with sync (one leader durability wait per flush round) and async flushing."""
    c = Cluster(3, seed=5, flush_policy=policy)
    c.start()
    leader = c.servers[c.wait_for_leader()]
    client = c.client()
    ds = [client.append(b"burst %d" % i) for i in range(300)]
    assert c.run_until(lambda: all(d.called for d in ds))
    results = [d.result for d in ds]
    assert all(r.code == 200 for r in results)
    assert len({r.index for r in results}) == 300
    assert leader.store.committed_index == max(r.index for r in results)
    if policy == "sync":
        assert leader.flusher.flushes <= 301
    c.stop()


def test_plain_header_fast_paths_match_json():
    """Headers without remark/extFields are written and read exactly as the JSON encoder and parser do."""
    rng = random.Random(3)
    for _ in range(2000):
        h = Header(rng.choice([200, 50001, 51004, -1, 2**31 - 1, -2**31]), rng.randrange(-2**31, 2**31),
                   rng.choice([0, 1, 2, 3]), version=rng.choice([0, 1, -5]))
        slow = _utf8(_dumps({"code": h.code, "flag": h.flag, "language": "JAVA", "opaque": h.opaque,
                             "serializeTypeCurrentRPC": "JSON", "version": h.version}))
        assert h.to_json() == slow
        assert Header.from_json(slow) == h


@pytest.mark.parametrize("raw, message", [
    (b'{"code":007,"flag":0,"language":"JAVA","opaque":1,"serializeTypeCurrentRPC":"JSON","version":0}', "JSON"),
    (b'{"code":1,"flag":0,"language":"JAVA","opaque":2147483648,"serializeTypeCurrentRPC":"JSON","version":0}',
     "does not fit a Java int"),
])
def test_header_fast_path_still_rejects_what_json_rejects(raw, message):
    """A header the fast path cannot vouch for goes through full validation and is refused with its reason."""
    with pytest.raises(HeaderError, match=message):
        Header.from_json(raw)


def test_base64_bodies_are_validated_like_b64decode():
    """Bodies decode as base64.b64decode(validate=True) would, and malformed ones are refused."""
    rng = random.Random(1)
    for _ in range(2000):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 50)))
        msg = from_wire(AppendEntryRequest, {"body": base64.b64encode(body).decode(), "group": "g"})
        assert msg.body == body
    for bad in ("abc", "ab=c", "====", "a\nbc", "éé==", "QQ==QQ=="):
        with pytest.raises(ValueError):
            from_wire(AppendEntryRequest, {"body": bad})
        with pytest.raises((ValueError, binascii.Error)):
            base64.b64decode(bad, validate=True)


def test_to_wire_and_from_wire_round_trip_batches():
    """A batch append survives to_wire/from_wire unchanged, None fields omitted."""
    req = AppendEntryRequest(group="g0", remote_id="n1", batch_msgs=[b"a", b"", bytes(range(256))])
    wire = to_wire(req)
    assert "body" not in wire and wire["batchMsgs"][1] == ""
    assert from_wire(AppendEntryRequest, wire) == req


def test_recent_entries_serve_ranges_like_the_store():
    """The leader's recent-entries cache answers get_range exactly as the store does, for the entries it holds."""
    from dledger.codes import Role
    from dledger.entry import Entry
    from dledger.store.memory import MemoryLogStore
    from dledger.store.recent import RecentEntries
    from dledger.testing.store_contract import FakeMemberState

    store = MemoryLogStore(FakeMemberState(role=Role.LEADER, curr_term=1, leader_id="n0"), data_file_size=4096)
    recent = RecentEntries(max_bytes=3000)
    rng = random.Random(4)
    for _ in range(200):
        recent.add(store.append_as_leader(Entry(body=bytes(rng.randrange(0, 300)), term=1)))
    assert recent.first > 0  # older entries were evicted to stay within max_bytes
    for begin in range(store.ledger_end_index + 1):
        for count, limit in ((1, 10), (5, 10_000), (50, 1000), (1000, 1 << 20)):
            got = recent.get_range(begin, count, limit)
            if begin < recent.first:
                assert got is None
            else:
                assert got == store.get_range(begin, count, limit)
    assert recent.get_range(store.ledger_end_index + 1, 1, 100) is None


def test_recent_entries_start_over_after_a_gap():
    """An entry that does not follow the last one held (a new leadership) replaces what was held."""
    from dledger.entry import Entry
    from dledger.store.recent import RecentEntries

    recent = RecentEntries()
    for i in range(5):
        recent.add(Entry(body=b"x", index=i, term=1))
    recent.add(Entry(body=b"y", index=9, term=2))
    assert recent.first == 9 and recent.get_range(3, 10, 1 << 20) is None
    assert [e.index for e in recent.get_range(9, 10, 1 << 20)] == [9]


def test_recent_entries_hand_out_one_list_per_range_while_it_holds():
    """Followers in step get the same EntryList (one encoding); after an add they get the longer range."""
    from dledger.entry import Entry, EntryList
    from dledger.store.recent import RecentEntries

    recent = RecentEntries()
    recent.extend([Entry(body=b"x" * 10, index=i, term=1) for i in range(5)])
    first = recent.get_range(2, 100, 1 << 20)
    assert type(first) is EntryList and recent.get_range(2, 100, 1 << 20) is first
    recent.add(Entry(body=b"x", index=5, term=1))
    longer = recent.get_range(2, 100, 1 << 20)
    assert longer is not first and [e.index for e in longer] == [2, 3, 4, 5]
    cut = recent.get_range(0, 2, 1 << 20)
    recent.add(Entry(body=b"x", index=6, term=1))
    assert recent.get_range(0, 2, 1 << 20) is cut, "a range cut by its limits does not grow"


def test_entry_list_section_is_the_codec_layout_and_its_crc():
    """EntryList.section() is the entries encoded back to back with their crc32c, computed once."""
    import crc32c

    from dledger.entry import Entry, EntryList, encode_entry

    entries = EntryList([Entry(body=b"ab", index=1, term=1, pos=0).sealed(),
                         Entry(body=b"", index=2, term=1, pos=50).sealed()])
    assert entries.known_section() is None
    size = entries.encoded_size()
    data, crc = entries.section()
    assert data == b"".join(encode_entry(e) for e in entries) and crc == crc32c.crc32c(data)
    assert entries.known_section() == (data, crc) and entries.section()[0] is data
    assert size == entries.encoded_size() == len(data) == sum(e.size for e in entries)


def test_follower_writes_the_bytes_a_push_carried(tmp_path, monkeypatch):
    """A decoded binary push hands the store its encoded entries, which the mmap store writes without re-encoding."""
    from dledger.entry import Entry, EntryList
    from dledger.messages import PushEntryRequest
    from dledger.store import mmapwriter as mmapfile
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState
    from dledger.transport import remoting

    leader = MmapLogStore(tmp_path / "l", FakeMemberState(), data_file_size=1024, index_file_size=256)
    leader.startup()
    entries = leader.append_batch_as_leader([Entry(body=b"%03d" % i * 40, term=1) for i in range(9)])
    push = PushEntryRequest(group="g0", term=1, leader_id="n0", batch_entry=entries)
    decoded = remoting.decode_push_binary(remoting.encode_push_binary(push))
    assert type(decoded.batch_entry) is EntryList and decoded.batch_entry.known_section() is not None
    state = FakeMemberState()
    state.follow(1, "n0")
    follower = MmapLogStore(tmp_path / "f", state, data_file_size=1024, index_file_size=256)
    follower.startup()
    packed = []
    real = mmapfile._pack_header_into
    monkeypatch.setattr(mmapfile, "_pack_header_into", lambda *a: packed.append(a) or real(*a))
    assert follower.append_batch_as_follower(decoded.batch_entry, 1, "n0") == entries
    assert packed == [], "the entries were written as received, not encoded again"
    assert [follower.get(i) for i in range(9)] == entries
    follower.append_batch_as_follower([Entry(b"z", 9, 1, entries[-1].pos + entries[-1].size).sealed()], 1, "n0")
    assert len(packed) == 1, "a plain list is encoded"


@pytest.mark.parametrize("cut, held_after", [
    (9, list(range(5, 10))),   # at the last entry: nothing goes
    (7, [5, 6, 7]),            # inside: the tail goes
    (5, [5]),                  # at the first held entry: it stays
    (4, []),                   # before what is held: everything goes
])
def test_recent_entries_drop_after_a_cut(cut, held_after):
    """drop_after(k) keeps what is held up to k; a later add must follow k or it starts over."""
    from dledger.entry import Entry
    from dledger.store.recent import RecentEntries

    recent = RecentEntries()
    recent.extend([Entry(body=b"x", index=i, term=1) for i in range(5, 10)])
    recent.drop_after(cut)
    assert [i for i in range(0, 12) if recent.get(i) is not None] == held_after
    recent.add(Entry(body=b"y", index=cut + 1, term=2))
    assert recent.get(cut + 1).body == b"y"
    if held_after:
        assert [e.index for e in recent.get_range(5, 100, 1 << 20)] == held_after + [cut + 1]


@pytest.mark.parametrize("body, crc, accept_zero, checked, refused", [
    (b"abc", "right", False, False, False),
    (b"abc", "wrong", False, False, True),    # unchecked: computed and refused
    (b"abc", "wrong", False, True, False),    # the push decode verified it: not computed again
    (b"abc", 0, False, True, True),           # a zero CRC is the store's to judge, checked or not
    (b"abc", 0, True, True, False),           # ... and accepted where Java's zero CRCs are
    (b"", 0, False, True, False),             # an empty body's CRC really is 0
    (b"", 0, False, False, False),
])
def test_follower_crc_rule_trusts_only_a_checked_nonzero_crc(body, crc, accept_zero, checked, refused):
    """check_follower_entry skips the CRC only for a non-zero CRC its push decode already verified."""
    from dledger.entry import Entry, body_crc
    from dledger.errors import DLedgerError
    from dledger.store.base import check_follower_entry

    value = body_crc(body) if crc == "right" else (body_crc(body) ^ 1 if crc == "wrong" else crc)
    entry = Entry(body=body, index=0, term=1, pos=0, body_crc=value)
    if refused:
        with pytest.raises(DLedgerError):
            check_follower_entry(entry, 0, 1 << 20, 1 << 16, accept_zero, checked)
    else:
        assert check_follower_entry(entry, 0, 1 << 20, 1 << 16, accept_zero, checked) == 0


def test_a_decoded_push_is_crc_checked_and_its_store_does_not_compute_crcs_again(tmp_path, monkeypatch):
    """Only a list the push decode built carries crc_checked; the mmap store then computes no body CRC."""
    from dledger.entry import Entry, EntryList
    from dledger.messages import PushEntryRequest
    from dledger.store import base
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState
    from dledger.transport import remoting

    leader = MmapLogStore(tmp_path / "l", FakeMemberState(), data_file_size=4096, index_file_size=256)
    leader.startup()
    entries = leader.append_batch_as_leader([Entry(body=b"%03d" % i * 10, term=1) for i in range(6)])
    assert not EntryList(entries).crc_checked and not EntryList(entries, EntryList(entries).section()).crc_checked
    push = PushEntryRequest(group="g0", term=1, leader_id="n0", batch_entry=entries)
    decoded = remoting.decode_push_binary(remoting.encode_push_binary(push)).batch_entry
    assert decoded.crc_checked
    computed = []
    real = base.body_crc
    monkeypatch.setattr(base, "body_crc", lambda b: computed.append(len(b)) or real(b))
    for name, batch, crcs in (("checked", decoded, 0),                     # the bytes written are the ones checked
                              ("plain", list(decoded), 6),                 # a plain list: every CRC computed
                              ("flag only", EntryList(decoded, None, crc_checked=True), 6)):  # no section: not trusted
        state = FakeMemberState()
        state.follow(1, "n0")
        follower = MmapLogStore(tmp_path / name, state, data_file_size=4096, index_file_size=256)
        follower.startup()
        computed.clear()
        assert follower.append_batch_as_follower(batch, 1, "n0") == entries
        assert len(computed) == crcs, name


def test_recent_entries_keep_each_readers_range_while_others_read():
    """A push's range stays the same list (one encoding for every follower) while the commit feed reads its own."""
    from dledger.entry import Entry
    from dledger.store.recent import RecentEntries

    recent = RecentEntries()
    recent.extend([Entry(body=b"x" * 10, index=i, term=1) for i in range(8)])
    push = recent.get_range(2, 3, 1 << 20)
    feed = recent.get_range(0, 1000, 1 << 30)
    assert recent.get_range(2, 3, 1 << 20) is push and recent.get_range(0, 1000, 1 << 30) is feed
    recent.add(Entry(body=b"y", index=8, term=1))
    assert recent.get_range(2, 3, 1 << 20) is push, "cut short by its limits: still the same range"
    assert recent.get_range(0, 1000, 1 << 30) is not feed, "it reached the end: an entry was added since"
    recent.drop_after(5)
    assert recent.get_range(2, 3, 1 << 20) is not push, "a cut forgets every range handed out"


def test_a_leader_on_the_mmap_store_pushes_from_the_stores_own_tail(tmp_path):
    """The leader keeps no second copy of what it appends when its store holds its newest entries (mmap)."""
    import os

    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing import Cluster

    def factory(mid, cfg, state):
        return MmapLogStore(os.path.join(tmp_path, mid), state, data_file_size=1 << 20, index_file_size=1 << 16)

    cluster = Cluster(3, seed=3, store_factory=factory)
    cluster.start()
    leader = cluster.wait_for_leader()
    client = cluster.client()
    done = []
    client.append_batch([b"m%d" % i for i in range(50)]).addCallback(done.append)
    assert cluster.run_until(lambda: bool(done), 30)
    server = cluster.servers[leader] if isinstance(leader, str) else leader
    rep = server.replicator
    assert rep.recent is server.store.recent_entries and not rep.keeps_recent
    assert cluster.run_until(lambda: len({s.store.ledger_end_index for s in cluster.servers.values()}) == 1, 30)
    ends = [[e.body for e in s.store.get_range(0, 100, 1 << 20)] for s in cluster.servers.values()]
    assert ends[0] == ends[1] == ends[2] and ends[0][-1] == b"m49"
    cluster.stop()


@pytest.mark.parametrize("appends, budget", [
    ([3, 3, 3, 3], 500),        # several appends over budget: the oldest whole appends go
    ([1] * 30, 700),            # one entry per append: entry by entry, as before
    ([50], 500),                # one append larger than the budget: the newest append always stays
    ([5, 40, 2], 900),          # a large append in the middle goes once newer ones exceed the budget
])
def test_recent_entries_let_whole_appends_go_oldest_first(appends, budget):
    """The byte budget evicts whole appends, oldest first, never the newest: held <= budget + newest append."""
    from dledger.entry import Entry
    from dledger.store.recent import RecentEntries

    recent = RecentEntries(max_bytes=budget)
    index, sizes = 0, []
    for count in appends:
        batch = [Entry(body=b"x" * 52, index=index + k, term=1) for k in range(count)]
        recent.extend(batch, 100 * count)
        sizes.append((index, count))
        index += count
        held = [i for i in range(index) if recent.get(i) is not None]
        assert held == list(range(held[0], index)), "what is held is a tail of the log"
        starts = {first for first, _ in sizes}
        assert held[0] in starts, "eviction stops at an append's first entry"
        newest = 100 * count
        assert len(held) * 100 <= max(budget, newest), "never more than the budget, unless the newest append is"
        if len(held) > count:
            assert (len(held) - count) * 100 <= budget, "an older append is held only within the budget"
    recent.drop_after(index - 2)
    assert recent.get(index - 1) is None and recent.get(index - 2) is not None
    recent.extend([Entry(body=b"y", index=index - 1, term=2)], 100)
    held = [i for i in range(index) if recent.get(i) is not None]
    assert recent.get(index - 1).body == b"y" and held == list(range(held[0], index))
    assert (len(held) - 1) * 100 <= budget or held == [index - 1], "after a cut the budget still holds"


@pytest.mark.parametrize("hooked", [False, True], ids=["no hook", "hook"])
def test_pushed_sections_cut_from_the_stores_written_bytes_equal_encoding_the_entries(tmp_path, hooked, monkeypatch):
    """A range held in appends the store wrote gets their written bytes as its encoding (a view within one append,
    slices across several, joined when the section is asked for): byte for byte what encoding its entries gives,
    through file rollovers, hooks and truncations (after which ranges encode themselves)."""
    from dledger import entry as codec
    from dledger.entry import Entry, EntryList
    from dledger.store.guard import LogGuard
    from dledger.testing.store_contract import FakeMemberState, StampPos, fired, open_small_store

    state = FakeMemberState()
    store = open_small_store("mmap", tmp_path, state, 4096)
    guard = LogGuard(store, state)
    if hooked:
        guard.add_append_hook(StampPos())
    recent = store.recent_entries
    rng = random.Random(7)
    one = joined = computed = 0
    packed = []
    monkeypatch.setattr(codec, "_pack_header", lambda *a: packed.append(a) or codec.HEADER.pack(*a))
    for step in range(60):
        if step % 15 == 14 and store.ledger_end_index > 5:
            store.truncate(store.get(store.ledger_end_index - 3), 1, "n0")
        batch = [Entry(body=bytes(8) + rng.randbytes(rng.randrange(0, 700)), term=1)
                 for _ in range(rng.randrange(1, 12))]
        guard.append_batch_as_leader(batch)
        end = store.ledger_end_index
        for _ in range(6):
            begin = rng.randrange(max(0, recent.first), end + 1)
            got = recent.get_range(begin, rng.choice([1, 3, 8, 1000]), rng.choice([600, 2500, 1 << 20]))
            known = got.known_section()
            packed.clear()
            section = got.section()
            if packed:
                computed += 1  # encoded here, entry by entry
            elif known is not None and isinstance(known[0], memoryview):
                one += 1  # a view of one append's bytes
            else:
                joined += 1  # the slices of several appends, joined
            assert section == EntryList(list(got)).section()
            assert list(got) == store.get_range(begin, len(got), 1 << 30)
    assert one > 30 and joined > 15 and computed > 5, "every kind of range was checked"
    fired(store.shutdown())


def test_a_decoded_push_in_place_is_checked_as_one_run_and_a_damaged_one_entry_by_entry(tmp_path, monkeypatch):
    """The mmap follower checks a decoded push in place at once (no per-entry check call); a push it cannot vouch
    for (here a position the leader's file layout does not give) takes the entry-by-entry checks and their error."""
    import dataclasses

    from dledger.entry import Entry
    from dledger.errors import BatchAppendError
    from dledger.messages import PushEntryRequest
    from dledger.store import base
    from dledger.store.mmapfile import MmapLogStore
    from dledger.testing.store_contract import FakeMemberState
    from dledger.transport import remoting

    leader = MmapLogStore(tmp_path / "l", FakeMemberState(), data_file_size=4096, index_file_size=1024)
    leader.startup()
    entries = leader.append_batch_as_leader([Entry(body=b"%03d" % i * 30, term=1) for i in range(40)])
    assert len({e.pos // 4096 for e in entries}) > 1, "the batch crosses a data file"

    def decoded(batch):
        push = PushEntryRequest(group="g0", term=1, leader_id="n0", batch_entry=batch)
        return remoting.decode_push_binary(remoting.encode_push_binary(push)).batch_entry

    checks = []
    real = base.check_follower_entry
    monkeypatch.setattr(base, "check_follower_entry", lambda *a: checks.append(a[0].index) or real(*a))
    state = FakeMemberState()
    state.follow(1, "n0")
    follower = MmapLogStore(tmp_path / "f", state, data_file_size=4096, index_file_size=1024)
    follower.startup()
    first_file = [e for e in entries if e.pos < 4096]
    follower.append_batch_as_follower(decoded(first_file[:1]), 1, "n0")  # creates the data file
    checks.clear()
    assert follower.append_batch_as_follower(decoded(first_file[1:]), 1, "n0") == first_file[1:]
    assert checks == [], "in place: one run, no entry checked by itself"
    rest = entries[len(first_file):]
    assert follower.append_batch_as_follower(decoded(rest), 1, "n0") == rest  # a new file: entry by entry
    assert checks[0] == rest[0].index
    assert [follower.get(e.index) for e in entries] == entries
    damaged = MmapLogStore(tmp_path / "d", state, data_file_size=4096, index_file_size=1024)
    damaged.startup()
    damaged.append_batch_as_follower(decoded(first_file[:1]), 1, "n0")
    bad = list(first_file[1:4])
    bad[1] = dataclasses.replace(bad[1], pos=bad[1].pos + 1)
    with pytest.raises(BatchAppendError, match="at pos") as info:
        damaged.append_batch_as_follower(decoded(bad), 1, "n0")
    assert [e.index for e in info.value.stored] == [bad[0].index]


def test_a_range_across_appends_is_joined_only_when_its_section_is_asked_for():
    """The commit feed reads ranges over many appends and never sends them: their slices stay parts (no copy)
    until a push asks for the section, which is then the entries' encoding."""
    from dledger.entry import Entry, EntryList, encode_entry
    from dledger.store.recent import RecentEntries

    recent = RecentEntries()
    index = 0
    for count in (3, 2, 4):
        batch = [Entry(b"%d" % (index + k) * 5, index + k, 1, 0).sealed() for k in range(count)]
        recent.extend(batch, None, bytearray(b"".join(encode_entry(e) for e in batch)))
        index += count
    got = recent.get_range(1, 100, 1 << 30)
    assert [e.index for e in got] == list(range(1, 9))
    assert got.known_section() is None, "nothing joined yet"
    assert got.encoded_size() == sum(e.size for e in got)
    assert got.section() == EntryList(list(got)).section()
    assert got.known_section() is not None
