"""When the mmap store may delete old data files, and when the disk counts as full (pure decisions).

Java DLedger's clean-space service, as options (defaults are Java's):
expired files (older than ``fileReservedHours``) are deleted at the
``deleteWhen`` hours or whenever the disk is fuller than
``diskSpaceRatioToCheckExpired``; past ``diskSpaceRatioToForceClean`` (if
``enableDiskForceClean``) files are deleted whatever their age.  Whatever
the mode, the store never deletes a file holding an entry above the
committed index, nor the last file.  Past ``diskFullRatio`` appends fail
with DISK_FULL until space is freed.

The decisions are pure (:class:`RetentionPolicy`, :func:`keeps_uncommitted`,
table-tested in ``tests/test_store_retention.py``); the store walks its
oldest files with them, reading each next file's first entry with
:func:`first_index_from`.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass

from dledger.entry import CodecError
from dledger.store.mappedfiles import MappedFileList
from dledger.store.scan import decode_at


class CleanMode(enum.Enum):
    NONE = "none"
    EXPIRED = "expired"  # delete files older than the reserved hours
    FORCE = "force"  # delete committed files regardless of age


@dataclass(frozen=True)
class RetentionPolicy:
    file_reserved_hours: float = 72
    delete_when: str = "04"
    disk_space_ratio_to_check_expired: float = 0.70
    disk_space_ratio_to_force_clean: float = 0.85
    enable_disk_force_clean: bool = True
    disk_full_ratio: float = 0.90

    @classmethod
    def from_config(cls, config) -> RetentionPolicy:
        return cls(config.file_reserved_hours, config.delete_when, config.disk_space_ratio_to_check_expired,
                   config.disk_space_ratio_to_force_clean, config.enable_disk_force_clean, config.disk_full_ratio)

    @property
    def reserved_seconds(self) -> float:
        return self.file_reserved_hours * 3600.0

    def is_time_to_delete(self, now: float) -> bool:
        """Whether the local hour of ``now`` is one of the ``deleteWhen`` hours (``"04"`` or ``"04;16"``)."""
        hour = time.localtime(now).tm_hour
        return any(int(h) == hour for h in self.delete_when.split(";") if h.strip())

    def mode(self, now: float, used_ratio: float) -> CleanMode:
        if self.enable_disk_force_clean and used_ratio > self.disk_space_ratio_to_force_clean:
            return CleanMode.FORCE
        if used_ratio > self.disk_space_ratio_to_check_expired or self.is_time_to_delete(now):
            return CleanMode.EXPIRED
        return CleanMode.NONE

    def expired(self, now: float, mtime: float) -> bool:
        return now - mtime > self.reserved_seconds

    def may_delete(self, mode: CleanMode, now: float, mtime: float, used_ratio: float) -> bool:
        """Whether the oldest data file (last modified at ``mtime``, all of it committed) goes in ``mode``.

        An expired file goes in any cleaning mode; in FORCE mode a young one
        goes too while the disk is still over ``diskSpaceRatioToForceClean``.
        """
        return self.expired(now, mtime) or (mode is CleanMode.FORCE and self.keep_forcing(used_ratio))

    def keep_forcing(self, used_ratio: float) -> bool:
        """In FORCE mode, whether the disk is still too full to stop deleting."""
        return used_ratio > self.disk_space_ratio_to_force_clean

    def disk_full(self, used_ratio: float) -> bool:
        return used_ratio > self.disk_full_ratio


def file_may_go(next_first: int | None, below: int) -> bool:
    """The one rule for what may leave the log, retention and compaction alike: the oldest data file goes only if
    every entry it holds lies below ``below``.

    ``next_first`` is the first entry after that file (None: no later file says where it ends, so it
    never goes: the last file stays); the file holds entries up to ``next_first - 1``.  Retention
    passes ``committed + 1``; compaction after a snapshot passes the lower of that and
    ``snapshot index - trailingEntries`` (:func:`dledger.snapshot.rules.compact_limit`).
    """
    return next_first is not None and next_first <= below


def keeps_uncommitted(next_first: int | None, committed: int) -> bool:
    """Whether the oldest data file must stay because it may hold an entry above the committed index."""
    return not file_may_go(next_first, committed + 1)


def first_index_from(data: MappedFileList, k: int, begin_pos: int, accept_zero_crc: bool) -> int | None:
    """Index of the first entry in data file ``k`` or a later one (blank-only files skipped), else None.

    The first file's entries may start inside it (``begin_pos``, after a
    follower reset); every later file starts with an entry or a blank marker.
    """
    for f in data.files[k:]:
        pos = begin_pos if f.start <= begin_pos < f.end else f.start
        try:
            return decode_at(data, pos, accept_zero_crc=accept_zero_crc, verify_crc=False).index
        except CodecError:
            continue
    return None
