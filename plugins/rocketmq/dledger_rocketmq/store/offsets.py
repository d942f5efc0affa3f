"""Consumer offsets and delay offsets: in-memory tables in RocketMQ's JSON shapes.

``ConsumerOffsetTable`` is RocketMQ's ``ConsumerOffsetManager.offsetTable``
(``{"topic@group": {queueId: offset}}``) with two differences that matter
after a master switch:

- commits arrive through the dledger log (:mod:`dledger_rocketmq.common.control`)
  and are applied on *every* member in log order, so a new master already
  holds every offset committed before the switch (RocketMQ's slaves copy the
  master's table every 10 s and a new master serves offsets up to 10 s old);
- an offset never moves backwards (a late or replayed commit, or a stale
  table from a sync, would otherwise make consumers re-read: apache/rocketmq#1094);
  only an explicit reset (control kind 2) may lower it.

``DelayOffsetTable`` is ``ScheduleMessageService.offsetTable``
(``{"offsetTable": {level: queue offset}}``, delayOffset.json).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from twisted.logger import Logger

from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.control import ControlEntry, ControlError, OffsetCommit, decode_control

log = Logger(namespace="dledger_rocketmq.store.offsets")

SEPARATOR = "@"
#: ConsumerOffsetManager's ``new ConcurrentHashMap<>(512)`` (iteration order of the file).
TABLE_CAPACITY = 512
#: The per-key ``new ConcurrentHashMap<>(32)`` of queue offsets, and ScheduleMessageService's table.
QUEUE_CAPACITY = 32


def _int(text: Any, what: str) -> int:
    if isinstance(text, bool):
        raise ValueError(f"{what}: {text!r} is not an integer")
    try:
        return int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what}: {text!r} is not an integer") from None


def _queue_map(raw: Any, what: str) -> dict[int, int]:
    if not isinstance(raw, dict):
        raise ValueError(f"{what}: expected an object of queueId: offset")
    return {_int(k, f"{what} queue id"): _int(v, f"{what} offset {k}") for k, v in raw.items()}


def _ordered(queues: Mapping[int, int]) -> dict[int, int]:
    return {q: queues[q] for q in fastjson.java_map_order(queues, QUEUE_CAPACITY)}


class ConsumerOffsetTable:
    """``{(group, topic, queue_id): offset}`` kept as RocketMQ keeps it, plus the last applied log index.

    ``applied_index`` lets a member that replays the log after a restart skip
    control entries it had applied before its file was written (exactly-once
    application, so a replayed reset cannot undo later commits).
    """

    def __init__(self) -> None:
        self._table: dict[str, dict[int, int]] = {}
        self.applied_index = -1
        self.version = 0  # bumped on every change: persisting only when it moved

    # -- queries ----------------------------------------------------------

    def query(self, group: str, topic: str, queue_id: int) -> int:
        """The committed offset, or -1 if this group never committed one here (RocketMQ's queryOffset)."""
        return self._table.get(f"{topic}{SEPARATOR}{group}", {}).get(queue_id, -1)

    def queues(self, group: str, topic: str) -> dict[int, int]:
        return dict(self._table.get(f"{topic}{SEPARATOR}{group}", {}))

    def groups_of(self, topic: str) -> set[str]:
        """Groups with offsets in ``topic`` (RocketMQ's whichGroupByTopic)."""
        return {k.split(SEPARATOR, 1)[1] for k in self._table if k.split(SEPARATOR, 1)[0] == topic}

    def items(self) -> list[OffsetCommit]:
        out = []
        for key, queues in self._table.items():
            topic, _, group = key.partition(SEPARATOR)
            out += [OffsetCommit(group, topic, q, o) for q, o in queues.items()]
        return out

    def __len__(self) -> int:
        return sum(len(q) for q in self._table.values())

    # -- changes ----------------------------------------------------------

    def _set(self, commit: OffsetCommit, reset: bool) -> bool:
        queues = self._table.setdefault(f"{commit.topic}{SEPARATOR}{commit.group}", {})
        old = queues.get(commit.queue_id)
        if old is not None and (old == commit.offset or (old > commit.offset and not reset)):
            return False
        queues[commit.queue_id] = commit.offset
        return True

    def apply(self, commits: Iterable[OffsetCommit], *, from_log: bool = True, reset: bool = False) -> int:
        """Apply commits in order; returns how many offsets changed.

        An offset never moves backwards unless ``reset``.  ``from_log`` says
        where the commits come from (committed control entries, or a local or
        synced source); both obey the same rule, it only shows in logs/stats.
        """
        commits = list(commits)
        for c in commits:  # all or nothing: check every commit before changing any
            if not c.topic or not c.group or SEPARATOR in c.topic or SEPARATOR in c.group:
                raise ValueError(f"offset commit: topic {c.topic!r} / group {c.group!r} empty or containing "
                                 f"{SEPARATOR!r}")
        changed = sum(self._set(c, reset) for c in commits)
        if changed:
            self.version += 1
        return changed

    def apply_entry(self, index: int, entry: ControlEntry) -> int:
        """Apply a committed control entry at log ``index``, once: entries at or below applied_index are skipped."""
        if index <= self.applied_index:
            return 0
        changed = self.apply(entry.commits, reset=entry.is_reset)
        self.applied_index = index
        return changed

    def on_control(self, index: int, body: bytes) -> int:
        """The dispatcher's ``on_control(entry_index, body)`` callback: decode and apply a committed entry once.

        A malformed body is logged and skipped (every member skips it alike,
        so the tables stay equal); it still counts as applied.
        """
        if index <= self.applied_index:
            return 0
        try:
            entry = decode_control(body)
            if entry is None:
                raise ControlError("not a control entry (no RMQC prefix)", 0)
            return self.apply_entry(index, entry)
        except ValueError as exc:  # ControlError, or a name apply refuses
            log.warn("skipping the control entry at index {index}: {err}", index=index, err=exc)
            self.applied_index = index
            return 0

    def copy_table(self) -> dict[str, dict[int, int]]:
        """``{"topic@group": {queue id: offset}}``, copied (a snapshot's frozen view)."""
        return {k: dict(q) for k, q in self._table.items()}

    def replace_all(self, table: Mapping[str, Mapping[int, int]], applied_index: int) -> None:
        """Replace the whole table and the applied index (a snapshot restored); offsets may move backwards."""
        self._table = {k: dict(q) for k, q in table.items()}
        self.applied_index = applied_index
        self.version += 1

    def merge(self, other: ConsumerOffsetTable) -> int:
        """Take ``other``'s offsets where they are ahead (a slave's sync from its master); never backwards."""
        return self.apply(other.items(), from_log=False)

    def remove_group(self, group: str, topic: str | None = None) -> int:
        """Drop a group's offsets (admin deleteSubscriptionGroup); returns how many keys went."""
        keys = [k for k in self._table if k.partition(SEPARATOR)[2] == group
                and (topic is None or k.partition(SEPARATOR)[0] == topic)]
        for k in keys:
            del self._table[k]
        if keys:
            self.version += 1
        return len(keys)

    # -- RocketMQ's JSON --------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """``{"offsetTable": {...}}`` ordered as RocketMQ's ConcurrentHashMaps iterate."""
        table = {k: _ordered(self._table[k]) for k in fastjson.java_map_order(self._table, TABLE_CAPACITY)}
        return {"offsetTable": table}

    def to_json(self, *, pretty: bool = True) -> str:
        """consumerOffset.json (``pretty``) or the GET_ALL_CONSUMER_OFFSET body (compact)."""
        return fastjson.dumps(self.to_dict(), pretty=pretty)

    @classmethod
    def from_dict(cls, data: Any) -> ConsumerOffsetTable:
        if not isinstance(data, dict) or not isinstance(data.get("offsetTable", {}), dict):
            raise ValueError('expected {"offsetTable": {"topic@group": {queueId: offset}}}')
        table = cls()
        for key, queues in data.get("offsetTable", {}).items():
            topic, sep, group = key.partition(SEPARATOR)
            if not sep or not topic or not group:
                raise ValueError(f"offsetTable key {key!r} is not topic@group")
            table._table[key] = _queue_map(queues, f"offsetTable {key!r}")
        return table

    @classmethod
    def from_json(cls, text: str | bytes) -> ConsumerOffsetTable:
        """Parse consumerOffset.json or a GET_ALL_CONSUMER_OFFSET body; ValueError (one line) if malformed."""
        return cls.from_dict(fastjson.loads(text))


class DelayOffsetTable:
    """``{delay level: next SCHEDULE_TOPIC_XXXX queue offset}``: how far each level has been delivered."""

    def __init__(self, offsets: Mapping[int, int] | None = None) -> None:
        self._table: dict[int, int] = dict(offsets or {})
        self.version = 0

    def get(self, level: int) -> int:
        return self._table.get(level, 0)

    def advance(self, level: int, offset: int) -> bool:
        """Move ``level`` to ``offset`` if that is forward; False otherwise (delivery never re-runs backwards)."""
        if offset <= self._table.get(level, -1):
            return False
        self._table[level] = offset
        self.version += 1
        return True

    def reset(self, level: int, offset: int) -> bool:
        """Set ``level`` to ``offset`` even backwards (the queue no longer reaches the old offset)."""
        if self._table.get(level) == offset:
            return False
        self._table[level] = offset
        self.version += 1
        return True

    def replace_all(self, offsets: Mapping[int, int]) -> None:
        """Replace every level's offset (a snapshot restored)."""
        self._table = dict(offsets)
        self.version += 1

    def merge(self, other: DelayOffsetTable) -> int:
        """Take ``other``'s offsets where they are ahead (a slave's sync); returns how many moved."""
        return sum(self.advance(level, off) for level, off in other.items().items())

    def items(self) -> dict[int, int]:
        return dict(self._table)

    def to_dict(self) -> dict[str, Any]:
        return {"offsetTable": _ordered(self._table)}

    def to_json(self, *, pretty: bool = True) -> str:
        """delayOffset.json (``pretty``) or the GET_ALL_DELAY_OFFSET body (compact)."""
        return fastjson.dumps(self.to_dict(), pretty=pretty)

    @classmethod
    def from_dict(cls, data: Any) -> DelayOffsetTable:
        if not isinstance(data, dict) or not isinstance(data.get("offsetTable", {}), dict):
            raise ValueError('expected {"offsetTable": {level: offset}}')
        return cls(_queue_map(data.get("offsetTable", {}), "offsetTable"))

    @classmethod
    def from_json(cls, text: str | bytes) -> DelayOffsetTable:
        return cls.from_dict(fastjson.loads(text))
