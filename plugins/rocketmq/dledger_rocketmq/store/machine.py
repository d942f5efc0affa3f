"""The broker's metadata as a dledger state machine (issue #22 item 6): ``BrokerMachine``, name ``"rocketmq"``.

Why: before snapshots, a member rebuilt its topics, subscription groups,
consumer and delay offsets and ACL from ``config/*.json`` plus a replay of
the control entries (:mod:`dledger_rocketmq.common.control`) committed after the
index saved in ``consumerOffset.json.dledger``.  That needs the log to reach
back to that index, so the log could never be compacted, and a member wiped
after compaction came back without any metadata.  Now the tables are an
``IStateMachine``: the member restores the newest snapshot and is fed only
the entries after it (exactly once per index), and InstallSnapshot brings a
wiped member every topic, offset and ACL.

* ``apply(entries)``: committed entries in log order (records included: the
  machine only looks at their first four bytes); a control entry changes the
  tables (metadata kinds 3-7, offset commits and resets 1-2), once: the
  applied index (``meta.offsets.applied_index``) covers every entry handed
  over, and entries at or below it are skipped.
* ``snapshot(writer)``: a frozen copy of every table is taken synchronously
  (plain dict copies; ACL configs are immutable and shared), then streamed
  as JSON lines in pieces of ``piece_size`` bytes, each write awaited (flow
  control: memory is the copy plus one piece).  The section also holds the
  *queue bases*: the next queue offset of every consume queue once dispatch
  reached the snapshot's index (``queue_state``), so a member that restores
  the snapshot without the records before it (wiped, then InstallSnapshot)
  gives queues it has no record of the offset they had, and a new master
  does not hand out queue offsets already used.  ``queue_state`` also
  flushes the consume queues, so the units of every entry the snapshot
  covers are durable before compaction can delete the entries.
* ``restore(reader)``: reads the section back line by line, checks its end
  mark, then replaces every table *in place* (the port's ACL check and the
  name server hold the table objects).  The files in ``config/`` are written
  again at the next persist: they keep RocketMQ 4.9.8's shapes for its
  tools, but after a restart the source of truth is snapshot + entries after.

The section format (UTF-8, one JSON value a line)::

    {"format": "dledger-rocketmq-metadata", "version": 1, "appliedIndex": I}
    ["topicVersion", {"counter": C, "timestamp": T}]     then one ["topic", TopicConfig] per topic
    ["groupVersion", {...}]                              then one ["group", SubscriptionGroupConfig] per group
    ["offset", "topic@group", [[queueId, offset], ...]]  one per key of consumerOffset.json
    ["delay", [[level, offset], ...]]
    ["acl", {"acl": ..., "source": ..., "file": ..., "timestamp": ...}]     (only once the log carried one)
    ["queue", topic, queueId, nextQueueOffset]           one per consume queue
    ["end", N]                                           N = the lines before it
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from twisted.internet.defer import Deferred, inlineCallbacks, maybeDeferred, succeed
from twisted.logger import Logger
from zope.interface import implementer

from dledger.interfaces import ICommitListener, IStateMachine
from dledger_rocketmq.common.control import MAGIC, METADATA_KINDS, control_kind, decode_control
from dledger_rocketmq.store.metadata import AclTable, MetadataError, VersionedTable
from dledger_rocketmq.store.offsets import SEPARATOR

log = Logger(namespace="dledger_rocketmq.store.machine")

NAME = "rocketmq"
FORMAT = "dledger-rocketmq-metadata"
VERSION = 1
#: Bytes per writer.write (the store cuts chunk files itself; this only bounds what is held at once).
PIECE_SIZE = 64 * 1024
#: A line longer than this is damage, not data (the largest item, the ACL, is at most 1 MiB encoded).
MAX_LINE = 8 * 1024 * 1024


class SnapshotFormatError(MetadataError):
    """The rocketmq section of a snapshot does not parse; the message names the line and why."""


class Frozen(NamedTuple):
    """A point-in-time copy of the tables (what :meth:`BrokerMachine.snapshot` writes)."""

    applied_index: int
    topic_version: dict
    topics: dict
    group_version: dict
    groups: dict
    offsets: dict
    delay: dict
    acl: tuple | None  # (AclConfig, source, file_source, timestamp); AclConfig objects are never mutated


class Restored(NamedTuple):
    """The tables read back from a section, before they replace the live ones."""

    applied_index: int
    topic_version: dict
    topics: dict
    group_version: dict
    groups: dict
    offsets: dict
    delay: dict
    acl: dict | None
    queues: dict


def freeze(meta) -> Frozen:
    """Copy every table of ``meta`` (a BrokerMetadata) now: later applies do not change the copy."""
    acl = meta.acl
    return Frozen(meta.offsets.applied_index, dict(meta.topics.data_version),
                  {k: dict(v) for k, v in meta.topics.table.items()}, dict(meta.groups.data_version),
                  {k: dict(v) for k, v in meta.groups.table.items()}, meta.offsets.copy_table(),
                  meta.delay_offsets.items(),
                  (acl.config, acl.source, acl.file_source, acl.timestamp) if acl.config is not None else None)


def _line(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False).encode("utf-8") + b"\n"


def encode_lines(frozen: Frozen, queues: dict[tuple[str, int], int]) -> Iterator[bytes]:
    """The section's lines for ``frozen`` and the queue bases (generated lazily: a large table is never one blob)."""
    count = 0

    def counted(value: Any) -> bytes:
        nonlocal count
        count += 1
        return _line(value)
    yield counted({"format": FORMAT, "version": VERSION, "appliedIndex": frozen.applied_index})
    yield counted(["topicVersion", frozen.topic_version])
    for config in frozen.topics.values():
        yield counted(["topic", config])
    yield counted(["groupVersion", frozen.group_version])
    for config in frozen.groups.values():
        yield counted(["group", config])
    for key, q in frozen.offsets.items():
        yield counted(["offset", key, sorted(q.items())])
    yield counted(["delay", sorted(frozen.delay.items())])
    if frozen.acl is not None:
        config, source, file_source, timestamp = frozen.acl
        yield counted(["acl", {"acl": config.to_dict(), "source": source, "file": file_source,
                               "timestamp": timestamp}])
    for (topic, qid), nxt in sorted(queues.items()):
        yield counted(["queue", topic, qid, nxt])
    yield _line(["end", count])


def _int(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{what} {value!r:.40} is not an integer")
    return value


def _pairs(value: Any, what: str) -> dict[int, int]:
    if not isinstance(value, list) or not all(isinstance(p, list) and len(p) == 2 for p in value):
        raise ValueError(f"{what} is not a list of [key, value] pairs")
    return {_int(k, what): _int(v, what) for k, v in value}


def _version(value: Any, what: str) -> dict:
    if not isinstance(value, dict) or set(value) != {"counter", "timestamp"}:
        raise ValueError(f"{what} is not {{counter, timestamp}}")
    return {k: _int(v, what) for k, v in value.items()}


class SectionParser:
    """Parses the section a line at a time (:meth:`feed`), so restoring never holds more than one line extra."""

    def __init__(self) -> None:
        self.lines = 0
        self.ended = False
        self.head: dict | None = None
        self.out = Restored(-1, {"counter": 0, "timestamp": 0}, {}, {"counter": 0, "timestamp": 0}, {}, {}, {},
                            None, {})

    def feed(self, raw: bytes) -> None:
        n = self.lines + 1
        try:
            self._line(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise SnapshotFormatError(f"rocketmq snapshot section, line {n}: {exc}") from None

    def _line(self, raw: bytes) -> None:
        if self.ended:
            raise ValueError("data after the end mark")
        value = json.loads(raw.decode("utf-8"))
        if self.head is None:
            if not isinstance(value, dict) or value.get("format") != FORMAT:
                raise ValueError(f"not a {FORMAT} section")
            if value.get("version") != VERSION:
                raise ValueError(f"version {value.get('version')!r} (this broker reads {VERSION})")
            self.head = value
            self.out = self.out._replace(applied_index=_int(value.get("appliedIndex"), "appliedIndex"))
            self.lines += 1
            return
        if not isinstance(value, list) or not value or not isinstance(value[0], str):
            raise ValueError("not a [kind, ...] line")
        kind, args = value[0], value[1:]
        o = self.out
        if kind == "end":
            if args != [self.lines]:
                raise ValueError(f"end mark says {args!r:.40}, {self.lines} lines read")
            self.ended = True
            return
        if kind in ("topic", "group") and len(args) == 1 and isinstance(args[0], dict):
            key = "topicName" if kind == "topic" else "groupName"
            name = args[0].get(key)
            if not isinstance(name, str) or not name:
                raise ValueError(f"{kind} without a {key}")
            (o.topics if kind == "topic" else o.groups)[name] = args[0]
        elif kind == "topicVersion" and len(args) == 1:
            self.out = o._replace(topic_version=_version(args[0], kind))
        elif kind == "groupVersion" and len(args) == 1:
            self.out = o._replace(group_version=_version(args[0], kind))
        elif kind == "offset" and len(args) == 2 and isinstance(args[0], str):
            topic, sep, group = args[0].partition(SEPARATOR)
            if not (topic and sep and group):
                raise ValueError(f"offset key {args[0]!r:.60} is not topic@group")
            o.offsets[args[0]] = _pairs(args[1], "offset")
        elif kind == "delay" and len(args) == 1:
            o.delay.update(_pairs(args[0], "delay"))
        elif kind == "acl" and len(args) == 1 and isinstance(args[0], dict):
            self.out = o._replace(acl=args[0])
        elif kind == "queue" and len(args) == 3 and isinstance(args[0], str) and args[0]:
            o.queues[(args[0], _int(args[1], "queue id"))] = _int(args[2], "queue offset")
        else:
            raise ValueError(f"unknown line {kind!r:.40} with {len(args)} values")
        self.lines += 1

    def finish(self) -> Restored:
        if self.head is None:
            raise SnapshotFormatError("rocketmq snapshot section: empty")
        if not self.ended:
            raise SnapshotFormatError(f"rocketmq snapshot section: truncated after line {self.lines} (no end mark)")
        return self.out


@implementer(IStateMachine)
class BrokerMachine:
    """The broker's metadata tables (``meta``, a BrokerMetadata) as an IStateMachine.

    ``queue_state(index)``: a Deferred of ``{(topic, queue id): next queue
    offset}`` once dispatch reached ``index``, consume queues flushed (None:
    no queues, e.g. in unit tests).  ``on_applied(index, entry)``: called after
    a metadata entry changed the tables (the broker's logging and
    ``metadata_callbacks``).  ``store``: the member's log store, to tell a
    tail of NOOPs (never fed) from entries not applied yet.
    """

    name = NAME

    def __init__(self, meta, *, queue_state: Callable[[int], Deferred] | None = None,
                 on_applied: Callable[[int, Any], object] | None = None, store: Any = None,
                 piece_size: int = PIECE_SIZE) -> None:
        self.meta = meta
        self.queue_state = queue_state
        self.on_applied = on_applied
        self.store = store
        self.piece_size = piece_size
        #: Queue bases of the last snapshot restored ({(topic, qid): next offset}); {} until one is.
        self.queue_bases: dict[tuple[str, int], int] = {}
        self._waiters: list[tuple[int, Deferred]] = []
        self.snapshots_written = 0
        self.restored_index = -1

    @property
    def applied_index(self) -> int:
        """The last log index applied (every entry handed over counts, controls or not)."""
        return self.meta.offsets.applied_index

    # -- applying -------------------------------------------------------------------------
    def apply(self, entries: list) -> None:
        """Apply committed entries (NOOPs excluded) in log order; entries at or below the applied index are skipped."""
        offsets = self.meta.offsets
        last = offsets.applied_index
        for entry in entries:
            index = entry.index
            if index <= last:
                continue
            body = entry.body
            if body[:4] == MAGIC:
                self.apply_control(index, body)
            last = index
        if last > offsets.applied_index:
            offsets.applied_index = last
        self._wake()

    def apply_control(self, index: int, body: bytes) -> int:
        """One committed control entry at ``index``: metadata kinds to the tables, offsets to the offset table.

        Once per index (``offsets.on_control`` moves the applied index); a
        malformed entry is logged by the offset table and skipped alike on
        every member.
        """
        offsets = self.meta.offsets
        if index <= offsets.applied_index:
            return 0
        if control_kind(body) in METADATA_KINDS:
            try:
                entry = decode_control(body)
                changed = self.meta.apply_change(entry)
            except ValueError as exc:
                log.debug("metadata control entry {i} not applied: {e}", i=index, e=exc)
            else:
                if changed and self.on_applied is not None:
                    self.on_applied(index, entry)
        return offsets.on_control(index, body)

    # -- waiting ---------------------------------------------------------------------------
    def caught_up(self, index: int) -> bool:
        """Has every entry up to ``index`` the machine is fed (all but NOOPs) been applied?"""
        from dledger_rocketmq.store.dispatch import only_noops_between

        done = self.applied_index
        return done >= index or (self.store is not None and only_noops_between(self.store, done, index))

    def wait_applied(self, index: int) -> Deferred:
        """Fires (with the applied index) once every entry up to ``index`` is applied."""
        d = Deferred()
        if self.caught_up(index):
            d.callback(self.applied_index)
        else:
            self._waiters.append((index, d))
        return d

    def _wake(self) -> None:
        if not self._waiters:
            return
        keep = []
        for index, d in self._waiters:
            if d.called:
                continue
            if self.caught_up(index):
                d.callback(self.applied_index)
            else:
                keep.append((index, d))
        self._waiters = keep

    def fail_waiters(self, exc: Exception) -> None:
        waiters, self._waiters = self._waiters, []
        for _, d in waiters:
            if not d.called:
                d.errback(exc)

    # -- snapshots ---------------------------------------------------------------------------
    def snapshot(self, writer) -> Deferred:
        """Freeze the tables now, then stream them (and the queue bases at that index) to ``writer``."""
        frozen = freeze(self.meta)
        queues = self.queue_state(frozen.applied_index) if self.queue_state is not None else succeed({})
        return queues.addCallback(lambda table: self._write(writer, frozen, table or {}))

    @inlineCallbacks
    def _write(self, writer, frozen: Frozen, queues: dict):
        piece: list[bytes] = []
        size = 0
        for line in encode_lines(frozen, queues):
            piece.append(line)
            size += len(line)
            if size >= self.piece_size:
                yield maybeDeferred(writer.write, b"".join(piece))
                piece, size = [], 0
        if piece:
            yield maybeDeferred(writer.write, b"".join(piece))
        self.snapshots_written += 1
        log.info("rocketmq metadata snapshot at index {i}: {t} topics, {g} groups, {o} consumer offsets, "
                 "{q} queues", i=frozen.applied_index, t=len(frozen.topics), g=len(frozen.groups),
                 o=sum(len(q) for q in frozen.offsets.values()), q=len(queues))

    @inlineCallbacks
    def restore(self, reader):
        """Read the section (line by line), then replace every table with it; fails (one line) if damaged."""
        parser = SectionParser()
        rest = b""
        first = True
        while True:
            data = yield maybeDeferred(reader.read, self.piece_size)
            if not data:
                if first:  # a snapshot without a rocketmq section (taken before the broker ran here)
                    log.warn("snapshot without a rocketmq section: the broker keeps the metadata of its config "
                             "files (applied up to index {i})", i=self.applied_index)
                    return self.applied_index
                break
            first = False
            rest += bytes(data)
            lines = rest.split(b"\n")
            rest = lines.pop()
            if len(rest) > MAX_LINE:
                raise SnapshotFormatError(f"rocketmq snapshot section: a line longer than {MAX_LINE} bytes")
            for raw in lines:
                parser.feed(raw)
        if rest:
            parser.feed(rest)
        restored = parser.finish()
        self.install(restored)
        return restored.applied_index

    def install(self, restored: Restored) -> None:
        """Replace the live tables with ``restored`` (in place: other parts of the broker hold the objects)."""
        meta = self.meta
        acl = None
        if restored.acl is not None:
            try:
                acl = AclTable.from_json(json.dumps(restored.acl))
            except ValueError as exc:
                raise SnapshotFormatError(f"rocketmq snapshot section: acl: {exc}") from None
        _replace_versioned(meta.topics, restored.topics, restored.topic_version)
        _replace_versioned(meta.groups, restored.groups, restored.group_version)
        meta.offsets.replace_all(restored.offsets, restored.applied_index)
        meta.delay_offsets.replace_all(restored.delay)
        meta.acl.replace_with(acl if acl is not None else AclTable())
        self.queue_bases = dict(restored.queues)
        self.restored_index = restored.applied_index
        log.info("rocketmq metadata restored from a snapshot at index {i}: {t} topics, {g} groups, "
                 "{o} consumer offsets, ACL {a}", i=restored.applied_index, t=len(restored.topics),
                 g=len(restored.groups), o=sum(len(q) for q in restored.offsets.values()),
                 a="in effect" if acl is not None and acl.config is not None else "none")
        if acl is not None and acl.config is not None:
            log.info("ACL from a snapshot at index {i} in effect ({n} accounts, source {s})",
                     i=restored.applied_index, n=len(acl.config.accounts), s=acl.source)
        self._wake()


def _replace_versioned(table: VersionedTable, entries: dict, data_version: dict) -> None:
    table.table = {k: dict(v) for k, v in entries.items()}
    table.data_version = dict(data_version)
    table.version += 1
    table._notify()


@implementer(ICommitListener)
class MachineFeed:
    """Feeds a machine from the commit feed, for a member whose core has no ``server.snapshots``.

    The member's ``StateMachines`` feeds registered machines itself; this is
    the fallback, with the same start rule (after the applied index).
    """

    def __init__(self, machine: BrokerMachine) -> None:
        self.machine = machine

    def start_index(self) -> int:
        return self.machine.applied_index + 1

    def entries_committed(self, entries: list) -> None:
        self.machine.apply(entries)


__all__ = ["BrokerMachine", "MachineFeed", "SectionParser", "SnapshotFormatError", "Frozen", "freeze",
           "encode_lines", "NAME"]
