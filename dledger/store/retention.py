"""When the mmap store may delete old data files, and when the disk counts as full (pure decisions).

Java DLedger's clean-space service, as options (defaults are Java's):
expired files (older than ``fileReservedHours``) are deleted at the
``deleteWhen`` hours or whenever the disk is fuller than
``diskSpaceRatioToCheckExpired``; past ``diskSpaceRatioToForceClean`` (if
``enableDiskForceClean``) files are deleted whatever their age.  Whatever
the mode, the store never deletes a file holding an entry above the
committed index, nor the last file.  Past ``diskFullRatio`` appends fail
with DISK_FULL until space is freed.
"""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass


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

    def keep_forcing(self, used_ratio: float) -> bool:
        """In FORCE mode, whether the disk is still too full to stop deleting."""
        return used_ratio > self.disk_space_ratio_to_force_clean

    def disk_full(self, used_ratio: float) -> bool:
        return used_ratio > self.disk_full_ratio
