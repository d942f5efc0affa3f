"""A plain RocketMQ CommitLog beside the dledger log: the first DLedger start and reads below the divide (seed 003).

With ``rocketmq.storePathCommitLog`` naming an existing CommitLog directory:

* **first start** (the member's dledger data directory has no file yet):
  the old last file's unused tail gets a blank record
  (:func:`~dledger_rocketmq.store.migration.plan_first_start`, written and
  fsynced before the store opens), and the dledger store is told to start
  its log at ``dividedCommitlogOffset`` = the end of that file
  (``MmapLogStore.set_initial_position``), so physical offsets never overlap;
* **later starts**: ``dividedCommitlogOffset`` is the first dledger data
  file's start, as in RocketMQ;
* offsets below it are read from the old files (:class:`OldCommitLog`), at or
  above it from the dledger log;
* dledger files are never deleted while old files exist: the store's
  retention is switched off for as long as the broker sees old files
  (RocketMQ deletes the old files first; deleting them is the operator's
  call here).
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path

from twisted.logger import Logger

from dledger import diskio
from dledger_rocketmq.common.errors import StoreLayoutError, TruncatedRecordError
from dledger_rocketmq.store.migration import StoreReader, divided_offset, plan_first_start

log = Logger()
_NAME = re.compile(r"^[0-9]{20}$")


class OldCommitLog:
    """Read-only access to the old CommitLog files (full-size, contiguous, named by their start offset)."""

    def __init__(self, directory: str | Path, file_size: int):
        self.directory = Path(directory)
        self.file_size = file_size
        self.old_files = StoreReader._list(self.directory, file_size, aligned=True)

    def get_message(self, offset: int, size: int) -> bytes:
        """``size`` bytes at physical ``offset`` of the old log (a record never spans files)."""
        start = offset - offset % self.file_size
        if start not in self.old_files:
            raise TruncatedRecordError(f"no old CommitLog file holds physical offset {offset}")
        pos = offset - start
        if size <= 0 or pos + size > self.file_size:
            raise TruncatedRecordError(f"{size} bytes at physical offset {offset} run past the end of its file")
        with open(self.directory / f"{start:020d}", "rb") as fh:
            fh.seek(pos)
            data = fh.read(size)
        if len(data) != size:
            raise TruncatedRecordError(f"short read of {size} bytes at physical offset {offset}")
        return data


def dledger_data_starts(member_dir: str | Path) -> list[int]:
    """Start offsets of the member's dledger data files (empty before the first DLedger start)."""
    data = Path(member_dir) / "data"
    if not data.is_dir():
        return []
    return sorted(int(n) for n in os.listdir(data) if _NAME.match(n))


def prepare(server, directory: str | Path, file_size: int) -> tuple[OldCommitLog | None, int]:
    """Before the store opens: ``(old log, dividedCommitlogOffset)``; a first start writes the blank, sets the start.

    ``(None, 0)`` when the directory holds no CommitLog file.
    """
    old = OldCommitLog(directory, file_size)
    if not old.old_files:
        return None, 0
    starts = dledger_data_starts(server.config.member_dir)
    if starts:
        divided = divided_offset(old.old_files, file_size, starts[0])
        if max(old.old_files) + file_size > divided:
            raise StoreLayoutError(f"{directory}: old CommitLog files reach past the first DLedger data file "
                                   f"at {divided}")
    else:
        last = old.old_files[-1]
        path = old.directory / f"{last:020d}"
        plan = plan_first_start(last, file_size, path.read_bytes())
        if plan.blank:
            fd = os.open(path, os.O_WRONLY)
            try:
                diskio.write_at(fd, plan.blank, plan.write_position - last)
                diskio.fsync_fd(fd)
            finally:
                os.close(fd)
            log.info("{id}: closed the old CommitLog {path} with a blank record of {n} bytes at {pos}",
                     id=server.self_id, path=str(path), n=len(plan.blank), pos=plan.write_position)
        setter = getattr(server.store, "set_initial_position", None)
        if setter is None:
            raise StoreLayoutError(f"rocketmq.storePathCommitLog needs a store that can start its log at "
                                   f"{plan.divided} (the mmap store); {type(server.store).__name__} cannot")
        try:
            setter(plan.divided)
        except ValueError as exc:
            raise StoreLayoutError(f"cannot start the dledger log at dividedCommitlogOffset {plan.divided}: {exc} "
                                   f"(mappedFileSizeForEntryData must equal the old CommitLog file size "
                                   f"{file_size})") from None
        divided = plan.divided
    retention = getattr(server.store, "retention", None)
    if retention is not None and dataclasses.is_dataclass(retention):
        server.store.retention = dataclasses.replace(retention, file_reserved_hours=float("inf"),
                                                     enable_disk_force_clean=False)
        log.info("{id}: old CommitLog files in {dir}: dledger data files are kept (retention off) while they "
                 "exist", id=server.self_id, dir=str(directory))
    return old, divided
