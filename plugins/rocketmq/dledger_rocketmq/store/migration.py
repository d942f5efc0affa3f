"""Reading a store migrated from a plain CommitLog to DLedger (seed 003, golden ``store-migration/``).

A RocketMQ broker restarted with ``enableDLegerCommitLog=true`` over an
existing ``commitlog/`` directory keeps the old files and starts the DLedger
data log where the old one ends:

* ``dividedCommitlogOffset`` = start of the last old file + the file size
  (on the first DLedger start), or the start of the first DLedger data file
  (on every later start, once DLedger files exist);
* a physical offset below it is a position in the old CommitLog files;
  at or above it, it is the position of a record inside the DLedger data
  files (an entry's ``pos`` + 48);
* on the first start the old last file's unused tail gets a blank record so
  that nothing is ever appended there again (:func:`plan_first_start`).

:func:`locate` is the pure mapping from a physical offset to (log, file,
position); :class:`StoreReader` serves records of a store directory with it.
Writing (the blank, the DLedger log's start position) is the broker
service's job and needs dledger's store API; it is not built yet.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from dledger.entry import BLANK_MAGIC as DLEDGER_BLANK_MAGIC
from dledger.entry import BODY_OFFSET, decode_entry, peek
from dledger_rocketmq.common.errors import StoreLayoutError, TruncatedRecordError
from dledger_rocketmq.common.message import (
    MESSAGE_MAGIC,
    MIN_BLANK_LENGTH,
    MessageRecord,
    decode_record,
    encode_blank_record,
    peek_record,
    scan_records,
)

#: RocketMQ's default ``mappedFileSizeCommitLog`` (also the DLedger data file size in DLedger mode).
DEFAULT_COMMITLOG_FILE_SIZE = 1024 * 1024 * 1024
_NAME = re.compile(r"^[0-9]{20}$")


class Log(Enum):
    COMMITLOG = "commitlog"  # the old, plain CommitLog files
    DLEDGER = "dledger"  # the DLedger data files


class Location(NamedTuple):
    """Where a physical offset lives: which log, the file (by its start offset) and the position in it."""

    log: Log
    file_start: int
    position: int


def divided_offset(old_file_starts: list[int], commitlog_file_size: int, dledger_first_start: int | None) -> int:
    """``dividedCommitlogOffset`` as RocketMQ's DLedgerCommitLog.recover sets it.

    Once DLedger data files exist it is the first one's start; before (the
    first DLedger start) it is the end of the last old file; with neither it
    is 0 (a store that never had a plain CommitLog).
    """
    if dledger_first_start is not None:
        return dledger_first_start
    if old_file_starts:
        return max(old_file_starts) + commitlog_file_size
    return 0


def locate(offset: int, divided: int, commitlog_file_size: int, dledger_file_size: int) -> Location:
    """The log, file and position of physical ``offset``; the DLedger files start at ``divided``."""
    if offset < 0:
        raise ValueError(f"negative physical offset {offset}")
    if offset < divided:
        return Location(Log.COMMITLOG, offset - offset % commitlog_file_size, offset % commitlog_file_size)
    rel = offset - divided
    return Location(Log.DLEDGER, divided + rel - rel % dledger_file_size, rel % dledger_file_size)


@dataclass(frozen=True)
class FirstStartPlan:
    """What the first DLedger start does to the old last file (see :func:`plan_first_start`)."""

    write_position: int  # where the old log ends, as a physical offset
    blank: bytes  # bytes to write at write_position (empty if a blank record is already there)
    divided: int  # dividedCommitlogOffset: where the DLedger log starts


def plan_first_start(last_file_start: int, commitlog_file_size: int, last_file: bytes) -> FirstStartPlan:
    """Find the old last file's write position and the blank record that closes it.

    ``last_file`` is the file's content (zeros after the data).  If the data
    already ends with a blank record nothing is written (a restart that
    crashed after writing it); the old file is full either way, and the
    DLedger log starts at the end of that file.
    """
    end = None
    for step in scan_records(last_file):
        if step.record is None:
            end = step
    assert end is not None
    divided = last_file_start + commitlog_file_size
    if end.size:  # a blank record is already there
        return FirstStartPlan(last_file_start + end.position, b"", divided)
    remaining = commitlog_file_size - end.position
    blank = encode_blank_record(remaining) if remaining >= 8 else b""
    return FirstStartPlan(last_file_start + end.position, blank, divided)


class StoreReader:
    """Read-only access to a RocketMQ store's CommitLog: old ``commitlog/`` files and/or DLedger data.

    ``root`` is the broker's ``storePathRootDir``; the DLedger files are in
    ``dledger-<self_id>/data`` (the only ``dledger-*`` directory when
    ``self_id`` is None).  Files must have their full size, as RocketMQ
    pre-allocates them (a shorter file is refused, as RocketMQ refuses to load
    it).  Blocking reads; for tools, tests and start-up recovery.
    """

    def __init__(self, root: str | Path, *, self_id: str | None = None,
                 commitlog_file_size: int = DEFAULT_COMMITLOG_FILE_SIZE,
                 dledger_file_size: int | None = None, verify_crc: bool = True):
        self.root = Path(root)
        self.commitlog_file_size = commitlog_file_size
        self.dledger_file_size = dledger_file_size or commitlog_file_size
        self.verify_crc = verify_crc
        self.commitlog_dir = self.root / "commitlog"
        self.dledger_dir = self._find_dledger_dir(self_id)
        self.old_files = self._list(self.commitlog_dir, self.commitlog_file_size, aligned=True)
        self.dledger_files = (self._list(self.dledger_dir, self.dledger_file_size, aligned=False)
                              if self.dledger_dir else [])
        first = self.dledger_files[0] if self.dledger_files else None
        self.divided_commitlog_offset = divided_offset(self.old_files, self.commitlog_file_size, first)
        if self.old_files and max(self.old_files) + self.commitlog_file_size > self.divided_commitlog_offset:
            raise StoreLayoutError(f"{self.commitlog_dir}: old CommitLog files reach past the first DLedger "
                                   f"file at {self.divided_commitlog_offset}")

    def _find_dledger_dir(self, self_id: str | None) -> Path | None:
        if self_id is not None:
            path = self.root / f"dledger-{self_id}" / "data"
            return path if path.is_dir() else None
        found = sorted(p for p in self.root.glob("dledger-*") if (p / "data").is_dir())
        if len(found) > 1:
            raise StoreLayoutError(f"{self.root}: several DLedger members' stores ({', '.join(p.name for p in found)});"
                                   f" say which self id to read")
        return found[0] / "data" if found else None

    @staticmethod
    def _list(directory: Path, file_size: int, *, aligned: bool) -> list[int]:
        """Start offsets of the full-size, contiguous files of ``directory``.

        Old CommitLog files start at multiples of their size; DLedger data
        files are counted from ``dividedCommitlogOffset`` instead.
        """
        if not directory.is_dir():
            return []
        starts = []
        for name in sorted(os.listdir(directory)):
            if not _NAME.match(name):
                continue
            size = (directory / name).stat().st_size
            if size != file_size:
                raise StoreLayoutError(f"{directory / name}: {size} bytes, expected the file size {file_size}")
            if aligned and int(name) % file_size:
                raise StoreLayoutError(f"{directory / name}: name is not a multiple of the file size {file_size}")
            starts.append(int(name))
        for a, b in zip(starts, starts[1:]):
            if b != a + file_size:
                raise StoreLayoutError(f"{directory}: files {a:020d} and {b:020d} are not contiguous")
        return starts

    # -- locating and reading ---------------------------------------------------

    def locate(self, offset: int) -> Location:
        return locate(offset, self.divided_commitlog_offset, self.commitlog_file_size, self.dledger_file_size)

    def path(self, location: Location) -> Path:
        directory = self.commitlog_dir if location.log is Log.COMMITLOG else self.dledger_dir
        files = self.old_files if location.log is Log.COMMITLOG else self.dledger_files
        if directory is None or location.file_start not in files:
            raise TruncatedRecordError(f"no {location.log.value} file holds physical offset "
                                       f"{location.file_start + location.position}")
        return directory / f"{location.file_start:020d}"

    def get_message(self, offset: int, size: int | None = None) -> bytes:
        """The ``size`` bytes at physical ``offset`` (the record's TOTALSIZE when None), from whichever log."""
        loc = self.locate(offset)
        with open(self.path(loc), "rb") as fh:
            fh.seek(loc.position)
            if size is None:
                size = peek_record(fh.read(8))[0]
                fh.seek(loc.position)
            file_size = self.commitlog_file_size if loc.log is Log.COMMITLOG else self.dledger_file_size
            if size <= 0 or loc.position + size > file_size:
                raise TruncatedRecordError(f"{size} bytes at physical offset {offset} run past the end of its file")
            data = fh.read(size)
        if len(data) != size:
            raise TruncatedRecordError(f"short read of {size} bytes at physical offset {offset}")
        return data

    def get_record(self, offset: int) -> MessageRecord:
        """The record at physical ``offset``, decoded (CodecError if no record starts there)."""
        head = self.get_message(offset, MIN_BLANK_LENGTH)
        size, magic = peek_record(head)
        if magic != MESSAGE_MAGIC:
            decode_record(head)  # raises the error that names what is there (a blank, a bad magic)
        return decode_record(self.get_message(offset, size), verify_crc=self.verify_crc)

    # -- scanning ---------------------------------------------------------------

    def old_records(self) -> Iterator[MessageRecord]:
        """Records of the old CommitLog files in order (each file ends at a blank record or unwritten bytes)."""
        for start in self.old_files:
            data = (self.commitlog_dir / f"{start:020d}").read_bytes()
            for step in scan_records(data, verify_crc=self.verify_crc):
                if step.record is not None:
                    yield step.record

    def dledger_records(self) -> Iterator[tuple[int, MessageRecord]]:
        """``(entry index, record)`` of every DLedger entry in order; Java writes no body CRC, so none is checked."""
        for start in self.dledger_files:
            data = (self.dledger_dir / f"{start:020d}").read_bytes()
            pos = 0
            while len(data) - pos >= 8:
                magic, _ = peek(data, pos)
                if magic in (DLEDGER_BLANK_MAGIC, 0):
                    break
                entry = decode_entry(data, pos, accept_zero_crc=True)
                if entry.pos != start + pos:
                    raise StoreLayoutError(f"{self.dledger_dir / f'{start:020d}'}: entry {entry.index} says pos "
                                           f"{entry.pos}, found at {start + pos}")
                yield entry.index, decode_record(entry.body, verify_crc=self.verify_crc)
                pos += entry.size

    def records(self) -> Iterator[MessageRecord]:
        """Every record of the store in physical-offset order: the old files, then the DLedger log."""
        yield from self.old_records()
        for _index, record in self.dledger_records():
            yield record


def record_physical_offset(entry_pos: int) -> int:
    """The physical offset of the record inside a DLedger entry at ``entry_pos``: right after the header."""
    return entry_pos + BODY_OFFSET
