"""Consume queues: RocketMQ's per-(topic, queue id) index of the CommitLog.

A consume queue is a sequence of 20-byte units, one per message of that
queue, in queue-offset order::

    commitLogOffset int64 (the record's PHYSICALOFFSET) | size int32 (its TOTALSIZE) | tagsCode int64

stored in ``consumequeue/<topic>/<queueId>/<20-digit name>`` files of a fixed
size (``mappedFileSizeConsumeQueue``, a multiple of 20, pre-allocated with
zeros); a file's name is the byte offset of its first unit, i.e. the queue
offset of that unit times 20.  ``tagsCode`` is Java's ``String.hashCode`` of
the TAGS property (0 without tags), except in ``SCHEDULE_TOPIC_XXXX`` where it
is the delivery time in ms.  A unit whose size is 0 was never written: it
ends the queue.

The decisions (what unit a record gets, where a unit lives, whether a unit
appends, repeats or leaves a gap) are pure functions; :class:`ConsumeQueue`
applies them to files.

Cost per unit (every member indexes every message): a queue keeps its files
open in an :class:`FdCache`, one bounded LRU per :class:`ConsumeQueues`
(thousands of queues must not mean thousands of open files), and deferred
appends (the dispatcher's, one commit-feed delivery at a time) are buffered
per queue and written with one ``pwrite`` per file when the delivery ends.
"""

from __future__ import annotations

import os
import re
import struct
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from functools import lru_cache
from pathlib import Path
from typing import NamedTuple

from twisted.internet.defer import Deferred, succeed

from dledger.diskio import create_sized_file, fsync_dir, fsync_fd, remove_file, write_at
from dledger_rocketmq.common.errors import CodecError, CorruptRecordError, StoreLayoutError, TruncatedRecordError
from dledger_rocketmq.common.fastjson import java_string_hash
from dledger_rocketmq.common.message import (
    PROPERTY_DELAY_TIME_LEVEL,
    PROPERTY_TAGS,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_TYPE_MASK,
    MessageRecord,
)

UNIT = struct.Struct(">qiq")
UNIT_SIZE = UNIT.size  # 20
#: RocketMQ's default ``mappedFileSizeConsumeQueue``: 300,000 units.
DEFAULT_FILE_SIZE = 300_000 * UNIT_SIZE
#: What RocketMQ writes in front of the first unit of a queue that does not start at a file boundary.
FILLER_SIZE = 0x7FFFFFFF

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ's default ``messageDelayLevel``.
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_UNIT_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_NAME = re.compile(r"^[0-9]{20}$")
#: How many consume-queue files one ConsumeQueues keeps open (least recently used closed first).
DEFAULT_OPEN_FILES = 256
#: The same for a ConsumeQueue opened on its own (tools, rebuilds): its last file and one being read.
STANDALONE_OPEN_FILES = 4


class Unit(NamedTuple):
    """One consume-queue unit."""

    physical_offset: int
    size: int
    tags_code: int

    @property
    def is_filler(self) -> bool:
        return self.size == FILLER_SIZE and self.physical_offset == 0


FILLER = Unit(0, FILLER_SIZE, 0)


# -- what a record's unit is ------------------------------------------------------------------------------

#: A broker sees few distinct tags and hashes one per message dispatched: remember the last few thousand.
_cached_string_hash = lru_cache(maxsize=4096)(java_string_hash)


def tag_hash(tags: str | None) -> int:
    """``tagsCode`` of a message outside the schedule topic: hashCode of TAGS, 0 when absent or empty."""
    return _cached_string_hash(tags) if tags else 0


def parse_delay_levels(text: str = DEFAULT_DELAY_LEVELS) -> tuple[int, ...]:
    """Delay levels in ms from RocketMQ's ``messageDelayLevel`` syntax (``1s 5s ... 2h``); level 1 is first."""
    levels = []
    for word in text.split():
        match = re.fullmatch(r"([0-9]+)([smhd])", word)
        if not match:
            raise ValueError(f"messageDelayLevel: bad level {word!r} (expected e.g. 5s, 1m, 2h)")
        levels.append(int(match.group(1)) * _UNIT_MS[match.group(2)])
    if not levels:
        raise ValueError("messageDelayLevel: no levels")
    return tuple(levels)


DELAY_LEVELS_MS = parse_delay_levels()


def deliver_timestamp(level: int, store_timestamp: int, levels: tuple[int, ...] = DELAY_LEVELS_MS) -> int:
    """When a message of delay ``level`` stored at ``store_timestamp`` is due (levels above the last are the last)."""
    return store_timestamp + levels[min(level, len(levels)) - 1]


def tags_code(record: MessageRecord, levels: tuple[int, ...] = DELAY_LEVELS_MS) -> int:
    """The unit's third field for ``record``: its delivery time in the schedule topic, else its tag hash."""
    return tags_code_of(record.topic, record.property_map, record.store_timestamp, levels)


def tags_code_of(topic: str, props: Mapping[str, str], store_timestamp: int,
                 levels: tuple[int, ...] = DELAY_LEVELS_MS) -> int:
    """:func:`tags_code` from the three fields it depends on (the dispatcher has them without a record)."""
    code = tag_hash(props.get(PROPERTY_TAGS))
    if topic == SCHEDULE_TOPIC and PROPERTY_DELAY_TIME_LEVEL in props:
        try:
            level = int(props[PROPERTY_DELAY_TIME_LEVEL])
        except ValueError:
            level = 0
        if level > 0:
            code = deliver_timestamp(level, store_timestamp, levels)
    return code


def is_dispatched(record: MessageRecord) -> bool:
    """Whether a record gets a consume-queue unit: not for prepared or rolled-back transaction messages."""
    return is_dispatched_flag(record.sys_flag)


def is_dispatched_flag(sys_flag: int) -> bool:
    """:func:`is_dispatched` from a record's sysFlag."""
    return sys_flag & TRANSACTION_TYPE_MASK in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE)


def unit_for(record: MessageRecord, levels: tuple[int, ...] = DELAY_LEVELS_MS) -> Unit:
    """The unit that indexes ``record`` in the queue (``record.topic``, ``record.queue_id``)."""
    return Unit(record.physical_offset, record.size, tags_code(record, levels))


def check_unit(unit: Unit, record: MessageRecord, levels: tuple[int, ...] = DELAY_LEVELS_MS) -> list[str]:
    """What is wrong with ``unit`` as the index of ``record`` (empty: nothing)."""
    expected = unit_for(record, levels)
    return [f"{name} {got} != {want}" for name, got, want in zip(Unit._fields, unit, expected, strict=True)
            if got != want]


# -- bytes and files --------------------------------------------------------------------------------------

def encode_unit(unit: Unit) -> bytes:
    try:
        return UNIT.pack(*unit)
    except struct.error:
        raise CodecError(f"consume-queue unit {tuple(unit)} does not fit int64/int32/int64") from None


def decode_unit(buf: bytes | bytearray | memoryview, offset: int = 0) -> Unit:
    if len(buf) - offset < UNIT_SIZE:
        raise TruncatedRecordError(f"need {UNIT_SIZE} bytes for a consume-queue unit", offset)
    return Unit(*UNIT.unpack_from(buf, offset))


def decode_units(buf: bytes | bytearray | memoryview) -> list[Unit]:
    """The written units of one file's bytes: up to the first never-written unit (size 0) or the end.

    A unit with a negative offset or size is corruption, not an end.
    """
    units = []
    for pos in range(0, len(buf) - len(buf) % UNIT_SIZE, UNIT_SIZE):
        unit = decode_unit(buf, pos)
        if unit.size == 0:
            break
        if unit.physical_offset < 0 or unit.size < 0:
            raise CorruptRecordError(f"consume-queue unit {tuple(unit)} has a negative field", pos)
        units.append(unit)
    return units


def file_size_for(requested: int) -> int:
    """RocketMQ's rule: ``mappedFileSizeConsumeQueue`` rounded up to whole units."""
    if requested < UNIT_SIZE:
        raise ValueError(f"mappedFileSizeConsumeQueue {requested} is smaller than one unit ({UNIT_SIZE})")
    return -(-requested // UNIT_SIZE) * UNIT_SIZE


def file_name(start: int) -> str:
    """The 20-digit file name for a file whose first unit is at byte offset ``start``."""
    return f"{start:020d}"


def locate_unit(queue_offset: int, file_size: int) -> tuple[int, int]:
    """``(file start, byte position in that file)`` of the unit at ``queue_offset``."""
    if queue_offset < 0:
        raise ValueError(f"negative queue offset {queue_offset}")
    byte = queue_offset * UNIT_SIZE
    return byte - byte % file_size, byte % file_size


def queue_dir(root: str | Path, topic: str, queue_id: int) -> Path:
    """``<root>/consumequeue/<topic>/<queueId>``."""
    if not topic or "/" in topic or topic in (".", ".."):
        raise ValueError(f"topic {topic!r} cannot name a directory")
    return Path(root) / "consumequeue" / topic / str(queue_id)


def _close_fds(fds: OrderedDict) -> None:
    while fds:
        os.close(fds.popitem()[1])


class FdCache:
    """A bounded LRU of open file descriptors by path, so a unit write is a pwrite, not open+pwrite+close.

    Bounded because a broker may have thousands of queues; the least recently
    used fd is closed when one more is needed (closing loses nothing: the
    bytes are in the page cache, and a flush of a file without a cached fd
    opens it again).  Files are opened read-write, for appends and reads.
    Not thread-safe: the queues, their flush included, run on one thread.
    Whoever deletes or renames a file drops its fd first (:meth:`drop`).
    """

    def __init__(self, capacity: int = DEFAULT_OPEN_FILES):
        if capacity < 1:
            raise ValueError(f"open consume-queue files: {capacity} is below 1")
        self.capacity = capacity
        self._fds: OrderedDict[str, int] = OrderedDict()
        #: How many times a file was opened (tests and benchmarks: a hit opens nothing).
        self.opened = 0
        # A cache dropped without close() (a test, an abandoned dispatcher) still closes its fds.
        self._finalizer = weakref.finalize(self, _close_fds, self._fds)

    def __len__(self) -> int:
        return len(self._fds)

    def __contains__(self, path: str | Path) -> bool:
        return str(path) in self._fds

    def fd(self, path: str | Path) -> int:
        """An open fd of ``path`` (opened now if not cached; the least recently used one closed if over capacity)."""
        key = path if isinstance(path, str) else str(path)
        fd = self._fds.get(key)
        if fd is not None:
            self._fds.move_to_end(key)
            return fd
        fd = os.open(key, os.O_RDWR)
        self.opened += 1
        self._fds[key] = fd
        while len(self._fds) > self.capacity:
            os.close(self._fds.popitem(last=False)[1])
        return fd

    def cached(self, path: str | Path) -> int | None:
        """The fd of ``path`` if it is open, without opening it or changing the order."""
        return self._fds.get(str(path))

    def drop(self, path: str | Path) -> None:
        """Close ``path``'s fd if open (before the file is deleted, truncated away or replaced)."""
        fd = self._fds.pop(str(path), None)
        if fd is not None:
            os.close(fd)

    def close(self) -> None:
        """Close every fd; the cache stays usable (it opens files again on demand)."""
        _close_fds(self._fds)


class Placement(Enum):
    """How a unit for queue offset ``q`` relates to a queue whose next offset is ``next``."""

    APPEND = "append"  # q == next (or the queue is empty): write it
    REPEAT = "repeat"  # q < next: dispatched before (a replay after restart); must match what is stored
    GAP = "gap"  # q > next: units in between are missing


def place(next_offset: int, queue_offset: int, empty: bool) -> Placement:
    """Where a unit goes; an empty queue may start anywhere (its earlier units were never kept here)."""
    if empty or queue_offset == next_offset:
        return Placement.APPEND
    return Placement.REPEAT if queue_offset < next_offset else Placement.GAP


class FlushJob(NamedTuple):
    """One sync of a flush: a duplicated fd (closed when done), a file by path, or a directory."""

    fd: int | None = None
    path: Path | None = None
    directory: bool = False


class FlushTaken(NamedTuple):
    """A queue's flush, taken: the jobs, and the marks they cleared (put back if they fail)."""

    jobs: list[FlushJob]
    starts: frozenset[int]
    directory: bool


def run_flush_jobs(jobs: Iterable[FlushJob]) -> None:
    """fsync what :meth:`ConsumeQueue.take_flush` took; any thread.  Every duplicated fd is closed, also on error.

    A file deleted since it was taken needs no sync (its directory's sync
    records the deletion); the first other error propagates after the rest
    of the fds are closed.
    """
    jobs = list(jobs)
    try:
        for job in jobs:
            if job.fd is not None:
                fsync_fd(job.fd)
            elif job.directory:
                if job.path.is_dir():
                    fsync_dir(job.path)
            else:
                try:
                    fd = os.open(job.path, os.O_RDONLY)
                except FileNotFoundError:
                    continue
                try:
                    fsync_fd(fd)
                finally:
                    os.close(fd)
    finally:
        for job in jobs:
            if job.fd is not None:
                os.close(job.fd)


class ConsumeQueue:
    """One consume queue over its files: append in order, read, truncate, rebuild.

    Blocking file I/O, run inline on the caller's thread (the dispatcher's
    is the reactor's: page-cache writes of 20 bytes a unit).  Appends are
    written to the page cache; :meth:`flush` makes them durable.  Files stay
    open in ``fds`` (shared by the queues of a :class:`ConsumeQueues`, else
    the queue's own small cache).  ``append(..., defer=True)`` buffers the
    unit until :meth:`drain` (every read, truncate and flush drains first),
    so a batch is one pwrite per file; ``on_change(queue, buffered)`` is
    called when the queue starts buffering (``buffered`` True: its owner's
    to-drain list) and when it changes a file not yet changed since the last
    flush (False: the to-flush list); ``on_drain_error(queue)`` when a
    drain's write failed.
    """

    def __init__(self, root: str | Path, topic: str, queue_id: int, *, file_size: int = DEFAULT_FILE_SIZE,
                 fds: FdCache | None = None, on_change: Callable[[ConsumeQueue, bool], object] | None = None,
                 on_drain_error: Callable[[ConsumeQueue], object] | None = None,
                 drain_all: Callable[[], object] | None = None):
        self.topic = topic
        self.queue_id = queue_id
        self.file_size = file_size_for(file_size)
        if self.file_size != file_size:
            raise ValueError(f"consume-queue file size {file_size} is not a multiple of {UNIT_SIZE}")
        self.dir = queue_dir(root, topic, queue_id)
        self._files: list[int] = []  # starts (byte offsets), ascending, contiguous
        self._min = 0  # first queue offset that holds a real unit
        self._next = 0  # the queue offset the next unit gets
        self._max_physical = 0  # end of the last unit's record in the CommitLog
        self._dirty: set[int] = set()  # file starts written since the last flush
        self._dir_dirty = False  # files created or deleted since the last flush
        self._own_fds = fds is None
        self._fds = FdCache(STANDALONE_OPEN_FILES) if fds is None else fds
        self._on_change = on_change
        #: Called with the queue when a drain's write failed (its deferred units are dropped), whoever drained:
        #: the dispatcher that buffered them puts its position back (:class:`ConsumeQueues.drain_failed`).
        self._on_drain_error = on_drain_error
        #: The owner's drain of every queue (see :meth:`drain`); None: a queue on its own drains itself.
        self._drain_all = drain_all
        self._names: dict[int, str] = {}
        # Deferred appends: the encoded units from queue offset _pending_at on, and the state before them.
        self._pending = bytearray()
        self._pending_at = 0
        self._before_pending = (0, 0)
        self._load()

    # -- state ----------------------------------------------------------------

    @property
    def min_offset(self) -> int:
        return self._min

    @property
    def max_offset(self) -> int:
        """The next queue offset (RocketMQ's ``getMaxOffsetInQueue``); equals min_offset when empty."""
        return self._next

    @property
    def max_physical_offset(self) -> int:
        """Where the last indexed record ends in the CommitLog (0 when empty)."""
        return self._max_physical

    @property
    def empty(self) -> bool:
        return self._next == self._min

    @property
    def pending(self) -> int:
        """Units appended with ``defer=True`` and not written yet."""
        return len(self._pending) // UNIT_SIZE

    def _path(self, start: int) -> Path:
        return self.dir / file_name(start)

    def _name(self, start: int) -> str:
        """The file's path as a string (the fd cache's key), built once per file."""
        name = self._names.get(start)
        if name is None:
            name = self._names[start] = str(self._path(start))
        return name

    @property
    def files(self) -> list[Path]:
        return [self.dir / file_name(s) for s in self._files]

    def _load(self) -> None:
        if not self.dir.is_dir():
            return
        starts = []
        for name in os.listdir(self.dir):
            if name.endswith(".tmp"):
                continue
            if not _NAME.match(name) or int(name) % self.file_size:
                raise StoreLayoutError(f"{self.dir / name}: not a consume-queue file name for file size "
                                       f"{self.file_size}")
            starts.append(int(name))
        starts.sort()
        for a, b in zip(starts, starts[1:]):
            if b != a + self.file_size:
                raise StoreLayoutError(f"{self.dir}: files {file_name(a)} and {file_name(b)} are not contiguous")
        self._files = starts
        if not starts:
            return
        first = starts[0] // UNIT_SIZE
        self._min = self._next = first
        for i, start in enumerate(starts):
            units = decode_units((self.dir / file_name(start)).read_bytes())
            for unit in units:
                if unit.is_filler and self._next == self._min:
                    self._min += 1
                elif unit.is_filler:
                    raise CorruptRecordError(f"{self.dir / file_name(start)}: filler unit after real units")
                else:
                    self._max_physical = unit.physical_offset + unit.size
                self._next += 1
            if len(units) < self.file_size // UNIT_SIZE and i != len(starts) - 1:
                raise StoreLayoutError(f"{self.dir / file_name(start)}: a file in the middle of the queue "
                                       f"is not full")

    # -- reading --------------------------------------------------------------

    def get(self, queue_offset: int) -> Unit | None:
        """The unit at ``queue_offset``, None outside [min_offset, max_offset)."""
        if not self._min <= queue_offset < self._next:
            return None
        found = self.read(queue_offset, 1)
        return found[0][1] if found else None

    def read(self, queue_offset: int, max_count: int) -> list[tuple[int, Unit]]:
        """Up to ``max_count`` ``(queue offset, unit)`` from ``queue_offset`` (or min_offset, if above) on."""
        self.drain()
        out: list[tuple[int, Unit]] = []
        q = max(queue_offset, self._min)
        while q < self._next and len(out) < max_count:
            start, pos = locate_unit(q, self.file_size)
            n = min(max_count - len(out), self._next - q, (self.file_size - pos) // UNIT_SIZE)
            data = os.pread(self._fds.fd(self._name(start)), n * UNIT_SIZE, pos)
            for i in range(len(data) // UNIT_SIZE):
                out.append((q + i, decode_unit(data, i * UNIT_SIZE)))
            if len(data) < n * UNIT_SIZE:
                raise TruncatedRecordError(f"{self.dir / file_name(start)}: short read at queue offset {q}")
            q += n
        return out

    # -- writing --------------------------------------------------------------

    def append(self, queue_offset: int, unit: Unit, *, defer: bool = False) -> bool:
        """Store ``unit`` at ``queue_offset``; False if exactly that unit is already there (a replay).

        A different unit at a stored offset, or an offset past the next one,
        is a CodecError: the dispatcher fed this queue out of order.  With
        ``defer`` the unit is buffered (visible to reads, which drain first)
        and written by :meth:`drain`, together with the units deferred after it.
        """
        if unit.size <= 0 or unit.physical_offset < 0:
            raise CodecError(f"{self.topic}/{self.queue_id}: invalid unit {tuple(unit)}")
        how = place(self._next, queue_offset, self.empty)
        if how is Placement.REPEAT:
            stored = self.get(queue_offset)
            if stored is None and queue_offset < self._min:
                return False  # before the retained range: already consumed into deleted files
            if stored != unit:
                raise CodecError(f"{self.topic}/{self.queue_id}: queue offset {queue_offset} holds "
                                 f"{tuple(stored) if stored else None}, not {tuple(unit)}")
            return False
        if how is Placement.GAP:
            raise CodecError(f"{self.topic}/{self.queue_id}: unit for queue offset {queue_offset} but the "
                             f"queue ends at {self._next} (units missing)")
        if unit.physical_offset < self._max_physical:
            raise CodecError(f"{self.topic}/{self.queue_id}: physical offset {unit.physical_offset} is below "
                             f"the queue's last record end {self._max_physical}")
        if self.empty and queue_offset != self._next:
            self._start_at(queue_offset)
        self._buffer(queue_offset, encode_unit(unit), unit.physical_offset + unit.size)
        if not defer:
            self.drain()
        return True

    def _buffer(self, queue_offset: int, data: bytes, end: int) -> None:
        """Buffer one encoded unit at ``queue_offset`` (the queue's next), its record ending at ``end``.

        The first unit buffered since the last drain records the queue's state before it, which a failed
        drain restores, and tells the owner this queue has units to write.
        """
        if not self._pending:
            self._pending_at = queue_offset
            self._before_pending = (self._next, self._max_physical)
            if self._on_change is not None:
                self._on_change(self, True)
        self._pending += data
        self._next = queue_offset + 1
        self._max_physical = end

    def append_next(self, queue_offset: int, physical_offset: int, size: int, tags_code: int) -> bool:
        """``append(queue_offset, Unit(...), defer=True)``, with the dispatcher's common case taken inline.

        The common case: the unit goes right after the queue's last one (next
        offset, physical offsets ascending) of a queue that is not empty, so
        none of :meth:`append`'s other placements can apply.  That includes
        the first unit of a delivery for its queue (nothing buffered yet: the
        state before it is recorded as :meth:`append` records it), which is
        most units when deliveries are small (single sends: a few entries
        spread over the queues).  Anything else goes through :meth:`append`
        and its checks.
        """
        if queue_offset == self._next and size > 0 and physical_offset >= self._max_physical and (
                self._pending or self._next != self._min):
            try:
                data = UNIT.pack(physical_offset, size, tags_code)
            except struct.error:
                raise CodecError(f"consume-queue unit {(physical_offset, size, tags_code)} does not fit "
                                 f"int64/int32/int64") from None
            if not self._pending:  # the first unit since the last drain: _buffer's bookkeeping
                self._buffer(queue_offset, data, physical_offset + size)
                return True
            self._pending += data  # the rest of a run: _buffer's common case inline (one call less per unit)
            self._next = queue_offset + 1
            self._max_physical = physical_offset + size
            return True
        return self.append(queue_offset, Unit(physical_offset, size, tags_code), defer=True)

    def drain(self) -> None:
        """Write the deferred units (one pwrite per file they span): with an owner (``drain_all``), every
        queue's, so the files never hold a unit of a later record while another queue still buffers one of an
        earlier record (recovery resumes dispatch after the last record ANY queue's files index, so the files
        must be a prefix of the dispatch); on its own, this queue's (:meth:`write_pending`).
        """
        if self._drain_all is not None:
            self._drain_all()
        else:
            self.write_pending()

    def write_pending(self) -> None:
        """Write this queue's deferred units (one pwrite per file they span).

        If the write fails, the queue is as it was before them (they may be
        appended again) and the OSError propagates.
        """
        if not self._pending:
            return
        data, at = bytes(self._pending), self._pending_at
        self._pending.clear()
        try:
            self._write(at, data)
        except BaseException:
            self._next, self._max_physical = self._before_pending
            if self._on_drain_error is not None:
                self._on_drain_error(self)
            raise

    def _start_at(self, queue_offset: int) -> None:
        """An empty queue that starts at ``queue_offset``: drop its files, fill the first file's head."""
        for start in self._files:
            self._remove(start)
        self._files = []
        start, pos = locate_unit(queue_offset, self.file_size)
        self._min = self._next = start // UNIT_SIZE
        if pos:
            self._write(self._next, encode_unit(FILLER) * (pos // UNIT_SIZE))
        self._min = self._next = queue_offset

    def _write(self, queue_offset: int, data: bytes) -> None:
        """Write whole units from ``queue_offset`` on: one pwrite per file, creating files as they are reached."""
        files = self._files
        if files and queue_offset >= 0:  # the common case: all of it inside the last file (a drain of a delivery)
            byte = queue_offset * UNIT_SIZE
            pos = byte % self.file_size
            start = byte - pos
            if start == files[-1] and pos + len(data) <= self.file_size:
                write_at(self._fds.fd(self._name(start)), data, pos)
                if start not in self._dirty:
                    self._mark_dirty(start)
                return
        view = memoryview(data)
        while view:
            start, pos = locate_unit(queue_offset, self.file_size)
            if not self._files or start > self._files[-1]:
                if self._files and start != self._files[-1] + self.file_size:
                    raise CodecError(f"{self.topic}/{self.queue_id}: file {file_name(start)} would leave a hole")
                self.dir.mkdir(parents=True, exist_ok=True)
                create_sized_file(self._path(start), self.file_size)
                self._files.append(start)
                self._dir_dirty = True
            elif start < self._files[0]:
                raise CodecError(f"{self.topic}/{self.queue_id}: file {file_name(start)} is before the queue")
            n = min(len(view), self.file_size - pos)
            write_at(self._fds.fd(self._name(start)), view[:n], pos)
            if start not in self._dirty:
                self._mark_dirty(start)
            view = view[n:]
            queue_offset += n // UNIT_SIZE

    def _mark_dirty(self, start: int) -> None:
        """File ``start`` has writes its next flush must sync (the owner told once, to queue this queue's flush)."""
        self._dirty.add(start)
        if self._on_change is not None:
            self._on_change(self, False)

    def _remove(self, start: int) -> None:
        """Delete one file of the queue (its cached fd closed first)."""
        path = self._name(start)
        self._fds.drop(path)
        remove_file(path)
        self._dirty.discard(start)
        self._dir_dirty = True
        if self._on_change is not None:
            self._on_change(self, False)

    @property
    def dirty(self) -> bool:
        """Written, created or deleted files since the last :meth:`flush` (or units not drained yet)."""
        return bool(self._dirty or self._dir_dirty or self._pending)

    def flush(self) -> None:
        """Make the appended units and new (or deleted) files durable: the files written since, then the directory."""
        taken = self.take_flush()
        try:
            run_flush_jobs(taken.jobs)
        except BaseException:
            self.undo_flush(taken)
            raise

    def take_flush(self) -> FlushTaken:
        """What a flush of this queue must sync, taken now (units drained, marks cleared): see :func:`run_flush_jobs`.

        Files open in the cache are synced through a duplicate of their fd,
        so the jobs may run on another thread while this one goes on writing,
        evicting or deleting files; :meth:`undo_flush` puts the marks back if
        they fail.
        """
        self.drain()
        jobs: list[FlushJob] = []
        for start in sorted(self._dirty):
            fd = self._fds.cached(self._name(start))
            jobs.append(FlushJob(fd=os.dup(fd)) if fd is not None else FlushJob(path=self._path(start)))
        if self._dir_dirty:
            jobs.append(FlushJob(path=self.dir, directory=True))
        taken = FlushTaken(jobs, frozenset(self._dirty), self._dir_dirty)
        self._dirty.clear()
        self._dir_dirty = False
        return taken

    def undo_flush(self, taken: FlushTaken) -> None:
        """A taken flush failed: its files count as unflushed again."""
        self._dirty |= taken.starts
        self._dir_dirty = self._dir_dirty or taken.directory

    def close(self) -> None:
        """Drain and close this queue's open files (no fsync: :meth:`flush` first for durability)."""
        self.drain()
        if self._own_fds:
            self._fds.close()
        else:
            for start in self._files:
                self._fds.drop(self._name(start))

    def truncate_physical(self, end: int) -> int:
        """Drop the units whose record does not lie wholly below ``end`` (the log's committed end).

        Units are in physical order, so they are dropped from the tail:
        their bytes are zeroed and files that become empty are deleted.
        Returns how many units were dropped.
        """
        keep = self._next
        while keep > self._min:
            unit = self.get(keep - 1)
            if unit.physical_offset + unit.size <= end:
                break
            keep -= 1
        return self.truncate_to(keep)

    def truncate_to(self, queue_offset: int) -> int:
        """Keep the units below ``queue_offset`` only; returns how many were dropped."""
        self.drain()
        queue_offset = max(queue_offset, self._min)
        dropped = max(self._next - queue_offset, 0)
        if not dropped:
            return 0
        first_start, pos = locate_unit(queue_offset, self.file_size)
        for start in [s for s in self._files if s > first_start or (s == first_start and pos == 0)]:
            self._remove(start)
            self._files.remove(start)
        if pos and first_start in self._files:
            self._write(queue_offset, bytes(self.file_size - pos))
        self._next = queue_offset
        if not self._files:
            self._min = self._next = 0
        last = self.get(self._next - 1) if self._next > self._min else None
        self._max_physical = last.physical_offset + last.size if last else 0
        return dropped

    def destroy(self) -> None:
        """Delete every file of this queue (before a rebuild)."""
        self.truncate_to(self._min)
        for start in self._files:
            self._remove(start)
        self._files = []
        self._min = self._next = self._max_physical = 0


def rebuild(queue: ConsumeQueue, records: Iterable[MessageRecord],
            levels: tuple[int, ...] = DELAY_LEVELS_MS) -> int:
    """Rebuild ``queue`` from the CommitLog's records (all topics, in log order); returns units written."""
    queue.destroy()
    written = 0
    for record in records:
        if record.topic == queue.topic and record.queue_id == queue.queue_id and is_dispatched(record):
            written += queue.append(record.queue_offset, unit_for(record, levels))
    return written


class ConsumeQueues:
    """Every consume queue of a store root (``<root>/consumequeue``): routing, the topic-queue table, recovery.

    The dispatcher feeds it committed records in log order through
    :meth:`dispatch`; :meth:`topic_queue_table` is RocketMQ's
    ``topicQueueTable`` (the next queue offset of every queue), which a new
    master rebuilds from here before it assigns queue offsets.
    """

    def __init__(self, root: str | Path, *, file_size: int = DEFAULT_FILE_SIZE,
                 levels: tuple[int, ...] = DELAY_LEVELS_MS, max_open_files: int = DEFAULT_OPEN_FILES):
        self.root = Path(root)
        self.file_size = file_size
        self.levels = levels
        #: The open files of every queue here, at most ``max_open_files``.
        self.fds = FdCache(max_open_files)
        self._queues: dict[tuple[str, int], ConsumeQueue] = {}
        self._changed: dict[tuple[str, int], ConsumeQueue] = {}  # files changed since the last flush
        self._buffered: list[ConsumeQueue] = []  # deferred units not drained yet
        #: Called (no arguments) when a queue's deferred units could not be written, by whatever drained them
        #: (a dispatcher's drain, a read, a flush): the dispatcher that buffered them sets it.
        self.drain_failed: Callable[[], object] | None = None
        base = self.root / "consumequeue"
        if base.is_dir():
            for topic in sorted(os.listdir(base)):
                if not (base / topic).is_dir():
                    continue
                for qid in sorted(os.listdir(base / topic)):
                    if not re.fullmatch(r"-?[0-9]+", qid) or not (base / topic / qid).is_dir():
                        raise StoreLayoutError(f"{base / topic / qid}: not a queue id")
                    self.queue(topic, int(qid))

    def queue(self, topic: str, queue_id: int) -> ConsumeQueue:
        """The queue (topic, queue_id), opened or created on first use."""
        key = (topic, queue_id)
        queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = ConsumeQueue(self.root, topic, queue_id, file_size=self.file_size,
                                                     fds=self.fds, on_change=self._note_change,
                                                     on_drain_error=self._drain_error, drain_all=self.drain)
        return queue

    def _note_change(self, queue: ConsumeQueue, buffered: bool) -> None:
        if buffered:
            self._buffered.append(queue)
        else:
            self._changed[(queue.topic, queue.queue_id)] = queue

    def _drain_error(self, queue: ConsumeQueue) -> None:
        if self.drain_failed is not None:
            self.drain_failed()

    def find(self, topic: str, queue_id: int) -> ConsumeQueue | None:
        """The queue (topic, queue_id) if it exists (opened at start or written since), without creating it."""
        return self._queues.get((topic, queue_id))

    def queues(self) -> list[ConsumeQueue]:
        return [self._queues[k] for k in sorted(self._queues)]

    def dispatch(self, record: MessageRecord, *, defer: bool = False) -> bool:
        """Index one committed record; False if it gets no unit or had it already (a replay).

        ``defer``: buffer the unit until :meth:`drain` (see :meth:`ConsumeQueue.append`).
        """
        if not is_dispatched(record):
            return False
        return self.queue(record.topic, record.queue_id).append(record.queue_offset, unit_for(record, self.levels),
                                                                defer=defer)

    def drain(self) -> None:
        """Write every queue's deferred units (the end of a dispatched batch); the first OSError propagates
        after the other queues are written."""
        error = None
        buffered, self._buffered = self._buffered, []
        for queue in buffered:
            try:
                queue.write_pending()
            except OSError as exc:
                error = error or exc
        if error is not None:
            raise error

    def topic_queue_table(self) -> dict[str, int]:
        """``{"topic-queueId": next queue offset}`` for every non-empty queue, RocketMQ's key format."""
        return {f"{q.topic}-{q.queue_id}": q.max_offset for q in self.queues() if q.max_offset > 0}

    def max_physical_offset(self) -> int:
        """The end of the last record any queue indexes: where dispatch resumes after a restart."""
        return max((q.max_physical_offset for q in self._queues.values()), default=0)

    def truncate_physical(self, end: int) -> int:
        """Drop every unit whose record is not wholly below ``end`` (recovery after the log's end moved back)."""
        return sum(q.truncate_physical(end) for q in self._queues.values())

    def flush(self) -> None:
        """fsync the queues written (or with files created or deleted) since the last flush, and only those."""
        taken = self.take_flush()
        try:
            run_flush_jobs(job for _, t in taken for job in t.jobs)
        except BaseException:
            self.undo_flush(taken)
            raise

    def flush_with(self, io) -> Deferred:
        """:meth:`flush` with the fsyncs run by ``io`` (a :class:`dledger.diskio.BlockingIO`: a member's runs them
        on a pool thread, so the reactor keeps dispatching); fires when they are done, errbacks if one failed
        (the queues then count as unflushed again)."""
        taken = self.take_flush()
        if not taken:
            return succeed(None)
        d = io.run(run_flush_jobs, [job for _, t in taken for job in t.jobs])

        def failed(failure):
            self.undo_flush(taken)
            return failure
        return d.addErrback(failed)

    def take_flush(self) -> list[tuple[ConsumeQueue, FlushTaken]]:
        """The flush of every queue changed since the last one, taken now (see :meth:`ConsumeQueue.take_flush`)."""
        self.drain()
        changed, self._changed = self._changed, {}
        return [(changed[key], changed[key].take_flush()) for key in sorted(changed)]

    def undo_flush(self, taken: list[tuple[ConsumeQueue, FlushTaken]]) -> None:
        """A taken flush failed: the next flush syncs those queues again."""
        for queue, t in taken:
            queue.undo_flush(t)
            self._changed[(queue.topic, queue.queue_id)] = queue

    def close(self) -> None:
        """Write what is buffered and close every open file (at stop; :meth:`flush` first for durability)."""
        try:
            self.drain()
        finally:
            self.fds.close()
