"""The kv state machine: a map from text keys to byte values, fed the committed log in order.

Every member applies the same entries in the same order, so every member holds the same map at the
same applied index.  Besides the map the machine keeps the outcome of the last :data:`RECENT_OPS`
operations by their client-chosen id: an operation whose entry is in the log twice (a client retried
an ambiguous write, the network duplicated the request) is applied once, and its retry gets the first
outcome -- Raft's answer to at-least-once delivery (§6.3 of Ongaro's thesis), bounded.

Snapshots (:meth:`KVMachine.snapshot`) take a **frozen copy** of the map synchronously, inside the call:
a shallow ``dict`` copy -- values are immutable ``bytes`` -- so applies that follow change the live map
only.  The copy is then streamed through the writer in chunks of about :data:`CHUNK` bytes, each
waiting for the writer's Deferred (flow control): memory holds the copy's references and one chunk.

A body that is not a kv entry (another application's) is skipped silently; a kv entry that does not
decode (a bug, or a newer member's format) is skipped with a rate-limited log line: a member never
stops applying because of one entry.
"""

from __future__ import annotations

import struct
from collections import OrderedDict

from twisted.internet.defer import Deferred, inlineCallbacks
from twisted.logger import Logger
from zope.interface import implementer

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.interfaces import IStateMachine
from dledger.ratelog import RateLimitedLog
from dledger_example.kv.codec import NotKV, Op, Reply, decode_op

log = Logger()

#: Outcomes of this many recent operations are kept (and snapshotted) to apply retried ones once.
RECENT_OPS = 10_000
#: Bytes per snapshot write.
CHUNK = 64 * 1024

# Snapshot section: SNAP_MAGIC version applied_index(i64), then records, then END count(u64).
SNAP_MAGIC = b"KVSNAP"
SNAP_VERSION = 1
_SNAP_HEAD = struct.Struct(">6sBq")
_ITEM = struct.Struct(">HqI")  # key length, version (index of its last write), value length
_RECENT = struct.Struct(">8sqBBI")  # op id, index, ok, has value, value length
_END = struct.Struct(">Q")
ITEM, RECENT, END = b"I", b"R", b"E"


def apply_op(data: dict, op: Op, index: int) -> Reply:
    """Apply ``op`` (entry ``index``) to ``data`` (key -> (value, version)); the outcome.  Pure but for ``data``."""
    current = data.get(op.key)
    value = current[0] if current is not None else None
    if op.kind == "put":
        data[op.key] = (op.value, index)
        return Reply(True, index)
    if op.kind == "delete":
        if current is not None:
            del data[op.key]
        return Reply(current is not None, index, value)
    if value != op.expected:  # cas: expected None means "absent"
        return Reply(False, index, value)
    if op.value is None:
        data.pop(op.key, None)
    else:
        data[op.key] = (op.value, index)
    return Reply(True, index)


@implementer(IStateMachine)
class KVMachine:
    """The replicated map of one member (``name`` ``"kv"``: its snapshot section)."""

    name = "kv"

    def __init__(self, clock, member: str = "", recent_ops: int = RECENT_OPS):
        self.member = member
        #: key -> (value, index of the entry that wrote it)
        self.data: dict[str, tuple[bytes, int]] = {}
        self.applied_index = -1
        self.recent: OrderedDict[bytes, Reply] = OrderedDict()
        self.recent_ops = recent_ops
        #: op id -> Deferreds of writes this member's leader waits on (:meth:`outcome`)
        self._waiters: dict[bytes, list[Deferred]] = {}
        self.skipped = 0  # kv entries that did not decode
        self._log = RateLimitedLog(log, clock, interval=60.0)

    # -- reading ---------------------------------------------------------------------------------------
    def get(self, key: str) -> Reply:
        """The key's value as of :attr:`applied_index` (``ok`` False and no value if absent)."""
        current = self.data.get(key)
        if current is None:
            return Reply(False, self.applied_index)
        return Reply(True, self.applied_index, current[0])

    # -- applying --------------------------------------------------------------------------------------
    def apply(self, entries: list) -> None:
        """Apply committed entries in log order (IStateMachine); bodies that are not kv entries are skipped."""
        for entry in entries:
            self.apply_entry(entry.index, entry.body)

    def apply_entry(self, index: int, body: bytes) -> Reply | None:
        try:
            op = decode_op(body)
        except NotKV:
            op = None
        except ValueError as exc:
            op = None
            self.skipped += 1
            self._log.warn("bad entry", "kv {member}: entry {index} is a kv entry this member cannot read ({why}); "
                           "skipped", member=self.member, index=index, why=exc)
        reply = None
        if op is not None:
            reply = self.recent.get(op.op_id)
            if reply is None:
                reply = apply_op(self.data, op, index)
                self._remember(op.op_id, reply)
            for d in self._waiters.pop(op.op_id, ()):
                d.callback(reply)
        self.applied_index = index
        return reply

    def _remember(self, op_id: bytes, reply: Reply) -> None:
        self.recent[op_id] = reply
        while len(self.recent) > self.recent_ops:
            self.recent.popitem(last=False)

    def outcome(self, op_id: bytes) -> Deferred:
        """A Deferred of the :class:`Reply` of operation ``op_id`` once it is applied (at once if it was, recently).

        The leader's write handler asks before it appends.  :meth:`forget` it if the append fails.
        """
        reply = self.recent.get(op_id)
        if reply is not None:
            d: Deferred = Deferred()
            d.callback(reply)
            return d
        d = Deferred()
        self._waiters.setdefault(op_id, []).append(d)
        return d

    def forget(self, op_id: bytes, d: Deferred) -> None:
        """Stop waiting for ``op_id`` with ``d`` (its append failed or timed out)."""
        waiting = self._waiters.get(op_id)
        if waiting and d in waiting:
            waiting.remove(d)
            if not waiting:
                del self._waiters[op_id]

    def _fail_waiters(self, why: str) -> None:
        waiters, self._waiters = self._waiters, {}
        for ds in waiters.values():
            for d in ds:
                d.errback(DLedgerError(ResponseCode.TERM_CHANGED, why))

    # -- snapshots --------------------------------------------------------------------------------------
    def snapshot(self, writer) -> Deferred:
        """Write the map as of now (IStateMachine): a frozen copy taken here, streamed with flow control."""
        frozen = dict(self.data)
        recent = list(self.recent.items())
        return self._write(writer, self.applied_index, frozen, recent)

    @inlineCallbacks
    def _write(self, writer, applied: int, frozen: dict, recent: list):
        buf = bytearray(_SNAP_HEAD.pack(SNAP_MAGIC, SNAP_VERSION, applied))
        count = 0
        for key, (value, version) in frozen.items():
            raw = key.encode("utf-8", "surrogatepass")
            buf += ITEM + _ITEM.pack(len(raw), version, len(value)) + raw + value
            count += 1
            if len(buf) >= CHUNK:
                yield writer.write(bytes(buf))
                buf = bytearray()
        for op_id, reply in recent:
            value = reply.value if reply.value is not None else b""
            buf += RECENT + _RECENT.pack(op_id, reply.index, reply.ok, reply.value is not None, len(value)) + value
            count += 1
            if len(buf) >= CHUNK:
                yield writer.write(bytes(buf))
                buf = bytearray()
        buf += END + _END.pack(count)
        yield writer.write(bytes(buf))

    @inlineCallbacks
    def restore(self, reader):
        """Replace the map with the section's (IStateMachine); ValueError if the section is damaged."""
        parser = SnapshotParser()
        while True:
            data = yield reader.read(CHUNK)
            if not data:
                break
            parser.feed(data)
        data, recent, applied = parser.finish()
        self.data = data
        self.recent = OrderedDict(recent)
        self.applied_index = applied
        for op_id in [o for o in self._waiters if o in self.recent]:
            for d in self._waiters.pop(op_id):
                d.callback(self.recent[op_id])
        self._fail_waiters("the kv map was replaced by a snapshot; the write's outcome is unknown")
        log.info("kv {member}: restored {n} keys at index {index}", member=self.member, n=len(data), index=applied)


class SnapshotParser:
    """Reads a kv snapshot section fed in pieces of any size (what :meth:`KVMachine.restore` reads)."""

    def __init__(self):
        self._buf = bytearray()
        self._head: int | None = None
        self._done = False
        self.data: dict[str, tuple[bytes, int]] = {}
        self.recent: list[tuple[bytes, Reply]] = []

    def feed(self, data: bytes) -> None:
        if self._done:
            raise ValueError("bytes after the end of the kv snapshot")
        self._buf += data
        buf, pos = self._buf, 0
        if self._head is None:
            if len(buf) < _SNAP_HEAD.size:
                return
            magic, version, applied = _SNAP_HEAD.unpack_from(buf)
            if magic != SNAP_MAGIC or version != SNAP_VERSION:
                raise ValueError(f"not a kv snapshot of version {SNAP_VERSION}")
            self._head, pos = applied, _SNAP_HEAD.size
        while pos < len(buf):
            kind = buf[pos:pos + 1]
            if kind == ITEM:
                if pos + 1 + _ITEM.size > len(buf):
                    break
                klen, version, vlen = _ITEM.unpack_from(buf, pos + 1)
                end = pos + 1 + _ITEM.size + klen + vlen
                if end > len(buf):
                    break
                start = pos + 1 + _ITEM.size
                key = bytes(buf[start:start + klen]).decode("utf-8", "surrogatepass")
                self.data[key] = (bytes(buf[start + klen:end]), version)
            elif kind == RECENT:
                if pos + 1 + _RECENT.size > len(buf):
                    break
                op_id, index, ok, has, vlen = _RECENT.unpack_from(buf, pos + 1)
                end = pos + 1 + _RECENT.size + vlen
                if end > len(buf):
                    break
                value = bytes(buf[pos + 1 + _RECENT.size:end]) if has else None
                self.recent.append((op_id, Reply(bool(ok), index, value)))
            elif kind == END:
                end = pos + 1 + _END.size
                if end > len(buf):
                    break
                (count,) = _END.unpack_from(buf, pos + 1)
                if count != len(self.data) + len(self.recent):
                    raise ValueError(f"the kv snapshot says {count} records, it holds "
                                     f"{len(self.data) + len(self.recent)}")
                self._done = True
                if end != len(buf):
                    raise ValueError("bytes after the end of the kv snapshot")
            else:
                raise ValueError(f"unknown record {bytes(kind)!r} in the kv snapshot")
            pos = end
        del buf[:pos]

    def finish(self) -> tuple[dict, list, int]:
        """``(data, recent, applied_index)``; ValueError if the section ended early."""
        if not self._done:
            raise ValueError("the kv snapshot is truncated")
        return self.data, self.recent, self._head
