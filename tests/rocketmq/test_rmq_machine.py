"""The broker's metadata as a state machine (issue #22 item 6): apply, snapshot, restore, exactly once.

Unit tests on BrokerMetadata tables with fake snapshot writers/readers (the
contract's ISnapshotWriter/ISnapshotReader), no member and no clock.
"""

from __future__ import annotations

import pytest
from dledger_rocketmq.broker.broker import first_kept_offset
from dledger_rocketmq.common import acl
from dledger_rocketmq.common.control import (
    KIND_ACL_CONFIG,
    KIND_GROUP_CONFIG,
    KIND_TOPIC_CONFIG,
    KIND_TOPIC_DELETE,
    OffsetCommit,
    encode_metadata,
    encode_offset_commits,
)
from dledger_rocketmq.store.machine import NAME, BrokerMachine, SnapshotFormatError
from dledger_rocketmq.store.metadata import BrokerMetadata, subscription_group_config, topic_config
from twisted.internet.defer import Deferred, succeed
from zope.interface import implementer
from zope.interface.verify import verifyObject

from dledger.entry import Entry
from dledger.interfaces import ISnapshotReader, ISnapshotWriter, IStateMachine

CONFIG = acl.load_acl_text("accounts:\n- {accessKey: account-one, secretKey: secret-one-1, admin: true}\n", "t")
OTHER_ACL = acl.load_acl_text("accounts:\n- {accessKey: account-two, secretKey: secret-two-2}\n", "t")


@implementer(ISnapshotWriter)
class Writer:
    """An ISnapshotWriter; with ``hold`` each write's Deferred waits until :meth:`release` (flow control)."""

    def __init__(self, hold: bool = False):
        self.data = bytearray()
        self.hold = hold
        self.pending: list[Deferred] = []
        self.max_pending = 0

    def write(self, data: bytes):
        self.data += data
        if not self.hold:
            return succeed(None)
        d = Deferred()
        self.pending.append(d)
        self.max_pending = max(self.max_pending, len(self.pending))
        return d

    def release(self) -> bool:
        if not self.pending:
            return False
        self.pending.pop(0).callback(None)
        return True


@implementer(ISnapshotReader)
class Reader:
    """An ISnapshotReader over bytes (answers at most ``max_bytes``, and at most ``step`` to cut lines apart)."""

    def __init__(self, data: bytes, step: int = 1 << 30):
        self.data, self.pos, self.step = bytes(data), 0, step
        self.largest = 0

    def read(self, max_bytes: int):
        n = min(max_bytes, self.step)
        self.largest = max(self.largest, n)
        out = self.data[self.pos:self.pos + n]
        self.pos += len(out)
        return succeed(out)


def meta(tmp_path, name="m") -> BrokerMetadata:
    m = BrokerMetadata(tmp_path / name)
    m.load()
    return m


def result(d: Deferred):
    out = []
    d.addBoth(out.append)
    assert out, "Deferred did not fire"
    if hasattr(out[0], "raiseException"):
        out[0].raiseException()
    return out[0]


def control(index: int, body: bytes) -> Entry:
    return Entry(body, index, 1, index * 100)


def record(index: int) -> Entry:
    """Any non-control body: the machine only looks at the first four bytes."""
    return Entry(b"\x00\x00\x00\x40\xda\xa3\x20\xa7" + b"r" * 56, index, 1, index * 100)


def commits(*items, reset=False) -> bytes:
    return encode_offset_commits([OffsetCommit(*i) for i in items], reset=reset)


def populated(tmp_path) -> tuple[BrokerMachine, list[Entry]]:
    """A machine that applied one of every kind of change (topics, groups, offsets, a reset, ACL, a delete)."""
    m = meta(tmp_path, "source")
    machine = BrokerMachine(m)
    entries = [
        control(0, encode_metadata(KIND_TOPIC_CONFIG, [topic_config("TopicA", 4, 4), topic_config("Gone", 1, 1)],
                                   1000)),
        record(1),
        control(2, encode_metadata(KIND_GROUP_CONFIG, [subscription_group_config("cg", retryMaxTimes=3)], 1001)),
        control(3, commits(("cg", "TopicA", 0, 10), ("cg", "TopicA", 1, 20), ("other", "TopicA", 3, 7))),
        record(4),
        control(5, commits(("cg", "TopicA", 1, 15), reset=True)),
        control(6, encode_metadata(KIND_ACL_CONFIG, [{"acl": CONFIG.to_dict(), "source": "file:x",
                                                       "file": "file:x"}], 1002)),
        control(7, encode_metadata(KIND_TOPIC_DELETE, [{"topicName": "Gone"}], 1003)),
        record(8),
    ]
    machine.apply(entries)
    m.delay_offsets.advance(3, 42)  # delay offsets are the master's own (not carried by the log)
    return machine, entries


def snapshot_bytes(machine: BrokerMachine, **writer) -> bytes:
    w = Writer(**writer)
    result(machine.snapshot(w))
    return bytes(w.data)


def tables(m: BrokerMetadata) -> dict:
    return {"topics": m.topics.to_json(), "groups": m.groups.to_json(), "offsets": m.offsets.to_json(),
            "delay": m.delay_offsets.to_json(), "applied": m.offsets.applied_index,
            "acl": (m.acl.config.digest() if m.acl.config else None, m.acl.source, m.acl.file_source,
                    m.acl.timestamp)}


def test_the_machine_provides_the_contract(tmp_path):
    machine = BrokerMachine(meta(tmp_path))
    assert verifyObject(IStateMachine, machine) and machine.name == NAME == "rocketmq"
    assert verifyObject(ISnapshotWriter, Writer()) and verifyObject(ISnapshotReader, Reader(b""))


def test_apply_changes_every_table_once_and_counts_every_entry(tmp_path):
    machine, _ = populated(tmp_path)
    m = machine.meta
    assert m.topics.get("TopicA") == topic_config("TopicA", 4, 4) and m.topics.get("Gone") is None
    assert m.topics.data_version == {"counter": 3, "timestamp": 1003}  # 2 puts, 1 delete, the entries' time
    assert m.groups.get("cg")["retryMaxTimes"] == 3
    assert m.offsets.queues("cg", "TopicA") == {0: 10, 1: 15}  # the reset moved queue 1 back
    assert m.acl.config == CONFIG and machine.applied_index == 8  # records count as applied too


def test_snapshot_restore_round_trips_every_table(tmp_path):
    machine, _ = populated(tmp_path)
    data = snapshot_bytes(machine)
    target = BrokerMachine(meta(tmp_path, "target"))
    assert result(target.restore(Reader(data, step=7))) == 8  # lines cut across reads
    assert tables(target.meta) == tables(machine.meta)
    assert target.meta.offsets.query("other", "TopicA", 3) == 7


def test_restore_replaces_the_state_and_keeps_the_table_objects(tmp_path):
    """What the target had and the snapshot lacks is gone; offsets may go back; the objects others hold stay."""
    machine, _ = populated(tmp_path)
    data = snapshot_bytes(machine)
    target = BrokerMachine(meta(tmp_path, "target"))
    t = target.meta
    t.topics.put(topic_config("OnlyHere"))
    t.offsets.apply([OffsetCommit("cg", "TopicA", 0, 999), OffsetCommit("lonely", "X", 0, 1)])
    t.offsets.applied_index = 500
    t.acl.apply({"acl": OTHER_ACL.to_dict(), "source": "admin", "file": ""}, 9)
    held = (t.topics, t.groups, t.offsets, t.delay_offsets, t.acl)
    heard = []
    t.topics.listeners.append(lambda: heard.append("topics"))
    result(target.restore(Reader(data)))
    assert (t.topics, t.groups, t.offsets, t.delay_offsets, t.acl) == held
    assert t.topics.get("OnlyHere") is None and t.offsets.query("lonely", "X", 0) == -1
    assert t.offsets.query("cg", "TopicA", 0) == 10 and t.offsets.applied_index == 8
    assert t.acl.config == CONFIG and heard == ["topics"]
    assert tables(t) == tables(machine.meta)


def test_restore_of_a_snapshot_without_acl_clears_the_acl(tmp_path):
    source = BrokerMachine(meta(tmp_path, "source"))
    source.apply([control(0, commits(("cg", "T", 0, 1)))])
    target = BrokerMachine(meta(tmp_path, "target"))
    target.meta.acl.apply({"acl": CONFIG.to_dict(), "source": "admin", "file": ""}, 1)
    result(target.restore(Reader(snapshot_bytes(source))))
    assert target.meta.acl.config is None


def test_entries_after_the_snapshot_are_applied_once(tmp_path):
    """Restored at index 8, fed entries from 6 (some again) and the tail twice: no commit or reset applied twice."""
    machine, entries = populated(tmp_path)
    data = snapshot_bytes(machine)
    tail = [control(9, commits(("cg", "TopicA", 0, 30))), record(10),
            control(11, commits(("cg", "TopicA", 0, 25), reset=True)),
            control(12, encode_metadata(KIND_TOPIC_CONFIG, [topic_config("Later", 2, 2)], 2000))]
    machine.apply(tail)
    target = BrokerMachine(meta(tmp_path, "target"))
    result(target.restore(Reader(data)))
    target.apply(entries[6:] + tail[:2])  # 6..8 are in the snapshot: skipped
    target.apply(tail)  # 9 and 10 again: skipped; 11 and 12 once
    target.apply(tail[:1])  # the commit to 30 replayed after the reset to 25 would undo it
    assert target.meta.offsets.query("cg", "TopicA", 0) == 25
    assert target.meta.topics.data_version == machine.meta.topics.data_version  # Later counted once
    assert tables(target.meta) == tables(machine.meta)


def test_the_snapshot_is_the_state_when_it_was_called(tmp_path):
    """Applies while the section is being written (writes held) do not reach the snapshot."""
    machine, _ = populated(tmp_path)
    before = tables(machine.meta)
    w = Writer(hold=True)
    machine.piece_size = 64
    done = []
    machine.snapshot(w).addBoth(done.append)
    machine.apply([control(9, commits(("cg", "TopicA", 0, 99))),
                   control(10, encode_metadata(KIND_TOPIC_DELETE, [{"topicName": "TopicA"}], 3000))])
    machine.meta.delay_offsets.advance(3, 50)
    while w.release():
        pass
    assert done == [None]
    assert w.max_pending == 1  # one piece in flight at a time: the machine waits for each write
    target = BrokerMachine(meta(tmp_path, "target"))
    result(target.restore(Reader(bytes(w.data))))
    assert tables(target.meta) == before


def test_queue_bases_are_written_after_dispatch_reached_the_index(tmp_path):
    """queue_state(index) is asked for the snapshot's index; its table comes back as queue_bases on restore."""
    asked = []
    later = Deferred()

    def queue_state(index):
        asked.append(index)
        return later
    machine = BrokerMachine(meta(tmp_path), queue_state=queue_state)
    machine.apply([record(0), control(1, commits(("cg", "T", 0, 3)))])
    w = Writer()
    done = []
    machine.snapshot(w).addBoth(done.append)
    machine.apply([record(2)])
    assert asked == [1] and not done and not w.data  # nothing written before the queues are known
    later.callback({("T", 0): 4, ("T", 1): 2, ("%RETRY%cg", 0): 1})
    assert done == [None]
    target = BrokerMachine(meta(tmp_path, "target"))
    result(target.restore(Reader(bytes(w.data))))
    assert target.queue_bases == {("T", 0): 4, ("T", 1): 2, ("%RETRY%cg", 0): 1}
    assert target.applied_index == 1


@pytest.mark.parametrize("damage, message", [
    (lambda d: d[:len(d) // 2], "truncated|line"),
    (lambda d: d.replace(b'"topic"', b'"topix"', 1), "unknown line 'topix'"),
    (lambda d: d.replace(b"dledger-rocketmq-metadata", b"something-else", 1), "not a dledger-rocketmq-metadata"),
    (lambda d: d.replace(b'"version":1', b'"version":2', 1), "version 2"),
    (lambda d: d + b'["topic",{"topicName":"X"}]\n', "after the end mark"),
    (lambda d: d.replace(b'["end",', b'["end",1', 1), "end mark says"),
    (lambda d: b"\n", "line 1"),
    (lambda d: b"\xff\xfe\n", "line 1"),
])
def test_a_damaged_section_fails_with_one_line_and_changes_nothing(tmp_path, damage, message):
    machine, _ = populated(tmp_path)
    data = damage(snapshot_bytes(machine))
    target = BrokerMachine(meta(tmp_path, "target"))
    before = tables(target.meta)
    with pytest.raises(SnapshotFormatError, match=message) as info:
        result(target.restore(Reader(data)))
    assert "\n" not in str(info.value) and str(info.value).startswith("rocketmq snapshot section")
    assert tables(target.meta) == before


def test_a_snapshot_without_a_rocketmq_section_keeps_the_loaded_state(tmp_path):
    """A snapshot taken before the broker ran on the member has no section (the core hands an empty reader)."""
    target = BrokerMachine(meta(tmp_path, "target"))
    target.apply([control(0, commits(("cg", "T", 0, 4)))])
    before = tables(target.meta)
    assert result(target.restore(Reader(b""))) == 0
    assert tables(target.meta) == before


def test_restore_reads_in_bounded_pieces(tmp_path):
    machine, _ = populated(tmp_path)
    for n in range(2000):  # a larger offset table
        machine.meta.offsets.apply([OffsetCommit(f"g{n}", "TopicA", n % 8, n)])
    machine.piece_size = 4096
    data = snapshot_bytes(machine)
    assert len(data) > 3 * machine.piece_size
    target = BrokerMachine(meta(tmp_path, "target"), piece_size=4096)
    reader = Reader(data)
    result(target.restore(reader))
    assert reader.largest == target.piece_size and tables(target.meta) == tables(machine.meta)


def test_wait_applied_fires_once_applied(tmp_path):
    machine = BrokerMachine(meta(tmp_path))
    d = machine.wait_applied(2)
    machine.apply([control(0, commits(("cg", "T", 0, 1))), record(1)])
    assert not d.called
    machine.apply([control(2, commits(("cg", "T", 0, 2)))])
    assert result(d) == 2
    assert machine.wait_applied(1).called
    waiting = machine.wait_applied(9)
    machine.fail_waiters(RuntimeError("stopping"))
    with pytest.raises(RuntimeError):
        result(waiting)


@pytest.mark.parametrize("physicals, min_physical, expect", [
    ([], 100, 0),                      # empty queue
    ([100, 200, 300], 50, 0),          # nothing removed
    ([100, 200, 300], 100, 0),         # the first record is where the log begins
    ([100, 200, 300], 101, 1),
    ([100, 200, 300], 300, 2),
    ([100, 200, 300], 301, 3),         # every record gone: min = max (nothing to read)
    ([-1, -1, 100, 200], 0, 2),        # filler units (physical -1 here) are never readable
    ([-1, -1, 100, 200], 150, 3),
])
def test_first_kept_offset(physicals, min_physical, expect):
    """A queue's min offset after compaction: the first unit whose record the CommitLog still holds."""
    assert first_kept_offset(0, len(physicals), physicals.__getitem__, min_physical) == expect
