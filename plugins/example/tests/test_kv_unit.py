"""The kv map's parts without a group: the encodings (tables), the machine, its snapshot, the request handlers
against a fake member, the history checks.  Time is a ``task.Clock``."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from dledger_example.kv import codec
from dledger_example.kv.codec import Op, Reply
from dledger_example.kv.handlers import APPLY_WAIT, KVHandlers, check_write
from dledger_example.kv.history import KVHistory, kv_linearizable, kv_violations
from dledger_example.kv.machine import CHUNK, KVMachine, SnapshotParser
from twisted.internet.defer import Deferred, fail, succeed
from twisted.internet.task import Clock
from zope.interface.verify import verifyObject

from dledger.codes import ResponseCode
from dledger.entry import Entry
from dledger.errors import DLedgerError
from dledger.interfaces import IStateMachine

ID = b"\x01" * 8


def op_id(n: int) -> bytes:
    return n.to_bytes(8, "big")


# -- the encodings ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("op", [
    Op("put", ID, "k", b"v"), Op("put", ID, "k", b""), Op("put", ID, "ключ", b"\x00" * 300),
    Op("delete", ID, "k"), Op("cas", ID, "k", b"new", b"old"), Op("cas", ID, "k", b"new", None),
    Op("cas", ID, "k", None, b"old"), Op("cas", ID, "k" * 1024, None, None),
])
def test_ops_round_trip(op):
    """Every operation decodes to itself, and its body starts with the magic and version."""
    body = codec.encode_op(op)
    assert body[:4] == b"\xffKV\x01" and codec.decode_op(body) == op


GOOD = codec.encode_op(Op("put", ID, "k", b"v"))


@pytest.mark.parametrize("body, error", [
    (b'{"add": "a", "by": 1}', codec.NotKV), (b"", codec.NotKV),
    (b"KV\x01P", codec.NotKV), (b"\xffKV", "truncated"), (b"\xffKV\x02" + GOOD[4:], "format version 2"),
    (GOOD[:4] + b"X" + GOOD[5:], "unknown operation"), (GOOD[:-1], "truncated value"), (GOOD + b"x", "bytes after"),
    (GOOD[:14] + b"\x00\x00" + GOOD[16:], "key length 0"),
    (codec.encode_op(Op("put", ID, "k", b"v")).replace(b"\x00\x01k", b"\x00\x01\xff"), "not UTF-8"),
    (codec.encode_op(Op("delete", ID, "k"))[:-1] + b"\x02", "truncated value"),
    (codec.encode_op(Op("delete", ID, "k"))[:-1] + b"\x04", "unknown flags"),
    (codec.encode_op(Op("delete", ID, "k"))[:-1] + b"\x02" + b"\x00\x00\x00\x00", "do not fit a delete"),
])
def test_bad_bodies_say_why(body, error):
    """A body that is not a kv entry is NotKV; a broken kv entry is a ValueError naming what is wrong."""
    if isinstance(error, type):
        with pytest.raises(error):
            codec.decode_op(body)
    else:
        with pytest.raises(ValueError, match=error):
            codec.decode_op(body)


@pytest.mark.parametrize("key, error", [("", "must not be empty"), ("x" * 1025, "at most 1024 bytes"),
                                        (b"k", "a key is text")])
def test_bad_keys_are_refused_before_anything_is_sent(key, error):
    with pytest.raises(ValueError, match=error):
        codec.encode_op(Op("put", ID, key, b"v"))
    with pytest.raises(ValueError, match=error):
        codec.encode_get(key)


@pytest.mark.parametrize("reply", [Reply(True, 7, b"v"), Reply(False, -1), Reply(False, 3, b""), Reply(True, 2**62)])
def test_replies_round_trip(reply):
    assert codec.decode_reply(codec.encode_reply(reply)) == reply


def test_the_leader_checks_values_against_kv_max_value():
    """kv.max_value bounds a put's value and a cas's expected value; a foreign body is no write."""
    assert check_write(codec.encode_op(Op("put", ID, "k", b"x" * 10)), 10).value == b"x" * 10
    with pytest.raises(ValueError, match=r"the value is 11 bytes, more than kv.max_value \(10\)"):
        check_write(codec.encode_op(Op("put", ID, "k", b"x" * 11)), 10)
    with pytest.raises(ValueError, match="expected value is 11 bytes"):
        check_write(codec.encode_op(Op("cas", ID, "k", b"", b"x" * 11)), 10)
    with pytest.raises(ValueError):
        check_write(b"hello", 10)


# -- the machine -----------------------------------------------------------------------------------------
def entries(*ops, start=0):
    return [Entry(codec.encode_op(op) if isinstance(op, Op) else op, index=start + i, term=1)
            for i, op in enumerate(ops)]


def test_machine_provides_the_interface():
    verifyObject(IStateMachine, KVMachine(Clock()))
    assert KVMachine.name == "kv"


def test_put_delete_cas_apply_in_log_order():
    """Each operation changes the map as a dict would; cas compares, delete reports what it removed."""
    m = KVMachine(Clock())
    m.apply(entries(Op("put", op_id(1), "a", b"1"), Op("cas", op_id(2), "a", b"2", b"1"),
                    Op("cas", op_id(3), "a", b"3", b"1"), Op("cas", op_id(4), "b", b"new", None),
                    Op("delete", op_id(5), "a"), Op("delete", op_id(6), "zz"), Op("cas", op_id(7), "b", None, b"new")))
    assert m.data == {} and m.applied_index == 6
    assert [m.recent[op_id(i)] for i in range(1, 8)] == [
        Reply(True, 0), Reply(True, 1), Reply(False, 2, b"2"), Reply(True, 3), Reply(True, 4, b"2"),
        Reply(False, 5), Reply(True, 6)]


def test_an_operation_in_the_log_twice_is_applied_once():
    """A retried put after a later write does not undo it; the retry's outcome is the first one."""
    m = KVMachine(Clock())
    put = Op("put", op_id(1), "a", b"old")
    m.apply(entries(put, Op("put", op_id(2), "a", b"new"), put))
    assert m.get("a") == Reply(True, 2, b"new") and m.recent[op_id(1)] == Reply(True, 0)


def test_recent_outcomes_are_bounded():
    m = KVMachine(Clock(), recent_ops=3)
    m.apply(entries(*[Op("put", op_id(i), "a", b"%d" % i) for i in range(10)]))
    assert list(m.recent) == [op_id(7), op_id(8), op_id(9)]


def test_foreign_and_bad_entries_are_skipped_with_a_rate_limited_line(capture_log):
    """Another application's body is skipped silently; a kv entry that cannot be read is skipped with one line
    per minute; the member goes on applying."""
    clock = Clock()
    m = KVMachine(clock, "n0")
    bad = b"\xffKV\x09" + GOOD[4:]
    m.apply(entries(b'{"add": "x", "by": 1}', bad, bad, Op("put", ID, "a", b"1")))
    clock.advance(61)
    m.apply(entries(bad, start=4))
    assert m.get("a") == Reply(True, 4, b"1") and m.skipped == 3
    lines = [e for e in capture_log if "cannot read" in e]
    assert len(lines) == 2 and "entry 1 is a kv entry this member cannot read (format version 9" in lines[0]
    assert "1 similar lines suppressed" in lines[1]


@pytest.fixture
def capture_log():
    from twisted.logger import formatEvent, globalLogPublisher

    lines: list[str] = []

    def observer(event):
        lines.append(formatEvent(event))
    globalLogPublisher.addObserver(observer)
    yield lines
    globalLogPublisher.removeObserver(observer)


# -- snapshots -------------------------------------------------------------------------------------------
class SlowWriter:
    """An ISnapshotWriter whose Deferreds fire when the test says (flow control is observable)."""

    def __init__(self):
        self.chunks: list[bytes] = []
        self.waiting: list[Deferred] = []

    def write(self, data):
        self.chunks.append(data)
        d = Deferred()
        self.waiting.append(d)
        return d

    def release(self):
        while self.waiting:
            self.waiting.pop(0).callback(None)


class Reader:
    def __init__(self, data: bytes, piece: int = 7):
        self.data, self.piece = data, piece

    def read(self, max_bytes):
        n = min(max_bytes, self.piece)
        out, self.data = self.data[:n], self.data[n:]
        return succeed(out)


def test_snapshot_is_a_frozen_copy_streamed_with_flow_control():
    """The snapshot holds the map as it was when snapshot() was called, however applies go on while it is
    written; one chunk is written at a time, the next only once the writer's Deferred fired."""
    m = KVMachine(Clock())
    m.apply(entries(*[Op("put", op_id(i), f"key{i}", b"v" * 1000) for i in range(200)]))
    writer = SlowWriter()
    done = m.snapshot(writer)
    assert len(writer.chunks) == 1 and not done.called  # waits for the writer
    m.apply(entries(Op("put", op_id(500), "key0", b"changed"), Op("delete", op_id(501), "key1"),
                    Op("put", op_id(502), "late", b"x"), start=200))
    while writer.waiting:
        assert len(writer.waiting) == 1
        writer.release()
    assert done.called and len(writer.chunks) > 2 and all(len(c) < CHUNK + 2000 for c in writer.chunks)
    copy = KVMachine(Clock())
    copy.restore(Reader(b"".join(writer.chunks), piece=1000))
    assert copy.applied_index == 199 and len(copy.data) == 200 and copy.get("key0").value == b"v" * 1000
    assert "late" not in copy.data and len(copy.recent) == 200


@pytest.mark.parametrize("piece", [1, 5, 64 * 1024])
def test_restore_round_trip_in_pieces_of_any_size(piece):
    m = KVMachine(Clock())
    m.apply(entries(Op("put", op_id(1), "a", b""), Op("put", op_id(2), "ü", b"\xff" * 70000),
                    Op("cas", op_id(3), "a", b"x", b"nope")))
    writer = SlowWriter()
    m.snapshot(writer)
    writer.release()
    copy = KVMachine(Clock())
    copy.restore(Reader(b"".join(writer.chunks), piece))
    assert copy.data == m.data and copy.recent == m.recent and copy.applied_index == 2
    # a retry of an operation in the snapshot is still applied once
    copy.apply(entries(Op("cas", op_id(3), "a", b"x", b"nope"), start=3))
    assert copy.recent[op_id(3)] == Reply(False, 2, b"")


@pytest.mark.parametrize("damage, error", [
    (lambda b: b[:-1], "truncated"), (lambda b: b"XXSNAP" + b[6:], "not a kv snapshot"),
    (lambda b: b[:-8] + (99).to_bytes(8, "big"), "says 99 records"), (lambda b: b + b"E", "after the end"),
    (lambda b: b[:15] + b"Q" + b[16:], "unknown record"),
])
def test_a_damaged_snapshot_is_refused(damage, error):
    """restore fails (the member then falls back to an older snapshot) rather than loading half a map."""
    m = KVMachine(Clock())
    m.apply(entries(Op("put", op_id(1), "a", b"1")))
    writer = SlowWriter()
    m.snapshot(writer)
    writer.release()
    copy = KVMachine(Clock())
    copy.apply(entries(Op("put", op_id(9), "keep", b"me")))
    failures = []
    copy.restore(Reader(damage(b"".join(writer.chunks)))).addErrback(failures.append)
    assert failures and error in str(failures[0].value) and copy.get("keep").ok


def test_parser_needs_the_end_marker():
    with pytest.raises(ValueError, match="truncated"):
        SnapshotParser().finish()


# -- the request handlers, against a fake member ---------------------------------------------------------
class FakeServer:
    """What the handlers use of a member: leads/not_leader/read_index/append/clock, snapshots.wait_applied."""

    def __init__(self, machine, clock):
        self.machine, self.clock = machine, clock
        self.leading = True
        self.committed = 5
        self.reads: list[Deferred] = []
        self.appends: list[tuple[bytes, Deferred]] = []
        self.applied_waits: list[tuple[int, Deferred]] = []
        self.snapshots = SimpleNamespace(wait_applied=self.wait_applied)

    def leads(self):
        return self.leading

    def not_leader(self):
        return DLedgerError(ResponseCode.NOT_LEADER, "n0 is FOLLOWER", leader_id="n1")

    def read_index(self):
        if not self.leading:
            return fail(self.not_leader())
        d = Deferred()
        self.reads.append(d)
        return d

    def wait_applied(self, index):
        d = Deferred()
        self.applied_waits.append((index, d))
        return d

    def append(self, body):
        d = Deferred()
        self.appends.append((body, d))
        return d


def handlers(clock=None):
    clock = clock or Clock()
    machine = KVMachine(clock)
    server = FakeServer(machine, clock)
    return server, machine, KVHandlers(server, machine, max_value=100)


def outcome(d):
    out = []
    d.addBoth(out.append)
    return out


def test_get_waits_for_read_index_then_for_the_machine_to_apply_it():
    """The answer comes only after leadership is confirmed and the machine applied the read index."""
    server, machine, h = handlers()
    machine.apply(entries(Op("put", op_id(1), "a", b"1")))
    got = outcome(h.get(codec.encode_get("a")))
    assert not got and server.reads
    server.reads[0].callback(7)
    assert not got and server.applied_waits[0][0] == 7
    machine.apply(entries(Op("put", op_id(2), "a", b"2"), start=1))
    server.applied_waits[0][1].callback(None)
    assert codec.decode_reply(got[0]) == Reply(True, 1, b"2")


def test_get_on_a_follower_is_not_leader_and_a_bad_key_is_refused():
    server, _, h = handlers()
    server.leading = False
    got = outcome(h.get(codec.encode_get("a")))
    assert got[0].value.code is ResponseCode.NOT_LEADER and got[0].value.leader_id == "n1"
    with pytest.raises(DLedgerError, match="kv.get: the key is not UTF-8"):
        h.get(b"\xff")


def test_write_answers_with_the_outcome_once_applied():
    """A cas is appended as sent; its answer is its outcome on this member's machine."""
    server, machine, h = handlers()
    body = codec.encode_op(Op("cas", op_id(1), "a", b"new", None))
    got = outcome(h.write(body))
    assert server.appends[0][0] == body and not got
    server.appends[0][1].callback(SimpleNamespace(index=0))
    assert not got
    machine.apply([Entry(body, index=0, term=1)])
    assert codec.decode_reply(got[0]) == Reply(True, 0)


def test_write_retry_after_apply_is_answered_without_appending():
    server, machine, h = handlers()
    body = codec.encode_op(Op("put", op_id(1), "a", b"1"))
    machine.apply([Entry(body, index=3, term=1)])
    got = outcome(h.write(body))
    assert codec.decode_reply(got[0]) == Reply(True, 3) and server.appends == []


def test_write_refusals():
    """Too large a value or not a write: UNEXPECTED_ARGUMENT; a follower: NOT_LEADER; a failed append: its code."""
    server, machine, h = handlers()
    with pytest.raises(DLedgerError, match=r"kv.write: the value is 101 bytes, more than kv.max_value \(100\)"):
        h.write(codec.encode_op(Op("put", op_id(1), "a", b"x" * 101)))
    with pytest.raises(DLedgerError, match="kv.write: not a kv entry"):
        h.write(b"hello")
    got = outcome(h.write(codec.encode_op(Op("put", op_id(2), "a", b"1"))))
    server.appends[0][1].errback(DLedgerError(ResponseCode.TERM_CHANGED, "lost it"))
    assert got[0].value.code is ResponseCode.TERM_CHANGED and machine._waiters == {}
    server.leading = False
    with pytest.raises(DLedgerError) as exc:
        h.write(codec.encode_op(Op("put", op_id(3), "a", b"1")))
    assert exc.value.code is ResponseCode.NOT_LEADER


def test_a_committed_write_not_applied_in_time_times_out():
    clock = Clock()
    server, machine, h = handlers(clock)
    got = outcome(h.write(codec.encode_op(Op("put", op_id(1), "a", b"1"))))
    server.appends[0][1].callback(SimpleNamespace(index=0))
    clock.advance(APPLY_WAIT + 1)
    assert got[0].value.code is ResponseCode.TIMEOUT and machine._waiters == {}


def test_restore_answers_or_fails_pending_writes():
    """A write waiting when the map is replaced gets its outcome if the snapshot has it, else TERM_CHANGED."""
    clock = Clock()
    source = KVMachine(clock)
    source.apply(entries(Op("put", op_id(1), "a", b"1")))
    writer = SlowWriter()
    source.snapshot(writer)
    writer.release()
    m = KVMachine(clock)
    known, unknown = outcome(m.outcome(op_id(1))), outcome(m.outcome(op_id(2)))
    m.restore(Reader(b"".join(writer.chunks)))
    assert known == [Reply(True, 0)] and unknown[0].value.code is ResponseCode.TERM_CHANGED


# -- the history checks ----------------------------------------------------------------------------------
def history_of(*rows):
    """rows: (kind, key, invoked, completed, reply, extra kw) -- writes get op ids 1, 2, ... in order."""
    h = KVHistory()
    for n, (kind, key, t0, t1, reply, kw) in enumerate(rows, 1):
        op = h.invoke(kind, f"c{n}", key, t0, op_id=op_id(n) if kind != "get" else None, **kw)
        if t1 is not None:
            h.complete(op, t1, reply, None if reply else "timeout")
    return h


def log_of(h, order):
    """The committed log holding the writes of ``h`` numbered in ``order`` (1-based), at indexes 1, 2, ..."""
    ops = [op for op in h.ops]
    return {i: codec.encode_op(Op(ops[n - 1].kind, op_id(n), ops[n - 1].key, ops[n - 1].value, ops[n - 1].expected))
            for i, n in enumerate(order, 1)}


def test_a_consistent_history_passes_both_checks():
    h = history_of(("put", "a", 0, 1, Reply(True, 1), dict(value=b"1")),
                   ("get", "a", 2, 3, Reply(True, 1, b"1"), {}),
                   ("cas", "a", 2.5, 4, Reply(False, 2, b"1"), dict(value=b"3", expected=b"2")),
                   ("get", "a", 5, 6, Reply(True, 2, b"1"), {}))
    assert kv_violations(h, log_of(h, [1, 3])) == [] and kv_linearizable(h)


def test_a_stale_read_is_caught_by_both_checks():
    """A get that started after a put was acknowledged but read the older value."""
    h = history_of(("put", "a", 0, 1, Reply(True, 1), dict(value=b"1")),
                   ("put", "a", 2, 3, Reply(True, 2), dict(value=b"2")),
                   ("get", "a", 4, 5, Reply(True, 1, b"1"), {}))
    problems = kv_violations(h, log_of(h, [1, 2]))
    assert any("stale read" in p for p in problems) and not kv_linearizable(h)


def test_a_lost_write_and_a_wrong_outcome_are_caught():
    h = history_of(("put", "a", 0, 1, Reply(True, 1), dict(value=b"1")),
                   ("cas", "a", 2, 3, Reply(True, 2), dict(value=b"2", expected=b"9")))
    problems = kv_violations(h, log_of(h, [2]))
    assert any(p.startswith("lost:") for p in problems)
    assert any("the log gives" in p for p in problems) and not kv_linearizable(h)


def test_an_unacknowledged_write_may_or_may_not_have_happened():
    h = history_of(("put", "a", 0, None, None, dict(value=b"1")), ("get", "a", 1, 2, Reply(True, 1, b"1"), {}),
                   ("get", "a", 3, 4, Reply(True, 1, b"1"), {}))
    assert kv_violations(h, log_of(h, [1])) == [] and kv_linearizable(h)
    h2 = history_of(("put", "a", 0, None, None, dict(value=b"1")), ("get", "a", 1, 2, Reply(False, 0), {}))
    assert kv_violations(h2, {}) == [] and kv_linearizable(h2)


@pytest.mark.parametrize("seed", range(30))
def test_the_log_check_agrees_with_the_exhaustive_search(seed):
    """Random short histories made from a real serial execution (then perturbed): the cheap log-based check and
    the exhaustive search give the same verdict."""
    rng = random.Random(seed)
    m = KVMachine(Clock())
    h = KVHistory()
    t, index, log = 0.0, 0, {}
    for n in range(1, 9):
        kind = rng.choice(["get", "put", "cas", "delete"])
        key = rng.choice("ab")
        t0 = t + rng.random()
        t1 = t0 + rng.random()
        t = t0 if rng.random() < 0.5 else t1  # overlap sometimes
        if kind == "get":
            reply = m.get(key)
            h.complete(h.invoke("get", f"c{n}", key, t0), t1, reply)
            continue
        op = Op(kind, op_id(n), key, None if kind == "delete" else rng.choice([b"1", b"2"]),
                rng.choice([None, b"1", b"2"]) if kind == "cas" else None)
        index += 1
        log[index] = codec.encode_op(op)
        reply = m.apply_entry(index, log[index])
        h.complete(h.invoke(kind, f"c{n}", key, t0, value=op.value, expected=op.expected, op_id=op.op_id), t1, reply)
    if seed % 2:  # corrupt one get's answer
        gets = [op for op in h.ops if op.kind == "get"]
        if gets:
            g = rng.choice(gets)
            g.reply = Reply(not g.reply.ok, g.reply.index, None if g.reply.ok else b"zz")
    assert (kv_violations(h, log) == []) == kv_linearizable(h)


# -- ReplicatedDict over a blocking client ------------------------------------------------------------------
class FakeBlockingClient:
    """Answers kv requests from a KVMachine at once (what BlockingClient.request returns: the reply's bytes)."""

    def __init__(self):
        self.machine = KVMachine(Clock())
        self.closed = False

    def request(self, code, body, timeout=None, *, retry_ambiguous=False, member=None):
        from dledger_example.kv.handlers import GET_CODE

        assert retry_ambiguous  # writes carry an operation id: retrying them is safe
        if code == GET_CODE:
            return codec.encode_reply(self.machine.get(codec.decode_get(body)))
        reply = self.machine.apply_entry(self.machine.applied_index + 1, body)
        return codec.encode_reply(reply)

    def close(self):
        self.closed = True


def test_replicated_dict_is_dict_like():
    """d[k] = v, d[k] (KeyError if absent), in, get, del (KeyError if absent), pop, cas; a client passed in is
    not closed by the dict."""
    from dledger_example.kv.client import ReplicatedDict

    fake = FakeBlockingClient()
    with ReplicatedDict(client=fake) as d:
        d["a"] = "1"
        d.set("b", "2")
        assert d["a"] == "1" and d.get("b") == "2" and "a" in d and "zz" not in d and 5 not in d
        with pytest.raises(KeyError):
            d["zz"]
        assert d.cas("a", "1", "3") and not d.cas("a", "1", "4") and d["a"] == "3"
        assert d.cas("c", None, "new") and not d.cas("c", None, "again")
        del d["a"]
        with pytest.raises(KeyError):
            del d["a"]
        assert d.pop("b") == "2" and d.pop("b", None) is None
        assert d.read("c") == Reply(True, fake.machine.applied_index, b"new")
    assert not fake.closed
    with ReplicatedDict(client=FakeBlockingClient(), codec="bytes") as raw:
        raw["k"] = b"\x00\xff"
        assert raw["k"] == b"\x00\xff"
    with pytest.raises(ValueError, match="needs peers and group"):
        ReplicatedDict()
