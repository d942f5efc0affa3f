"""The mmap store's write failures and full disk (``IDiskHealth``), kept apart from its append path.

:class:`MmapDiskHealth` is a base of :class:`dledger.store.mmapfile.MmapLogStore`: a failed write (ENOSPC,
EIO, a failed ``fallocate``) is remembered (:mod:`dledger.store.writefail`) so appends are refused at once,
without touching the disk, until a retry succeeds; one rate-limited line names the store directory, the
reason and the free space (issue #21).  It uses the store's own state (``_writes``, ``_write_log``,
``_disk_full``, ``clock``, ``member_dir``, ``retention``, ``_used_ratio``) and adds none.
"""

from __future__ import annotations

import errno

from twisted.logger import Logger

from dledger import diskio
from dledger.errors import DLedgerError
from dledger.store import base, mappedfiles, writefail
from dledger.store.mappedfiles import MappedFile, MappedFileList
from dledger.store.writefail import failure_code, problem_name, room_for_file

log = Logger()


class MmapDiskHealth:
    """Disk-full and write-failure state of the mmap store: what appends are refused with, and the lines."""

    @property
    def disk_problem(self) -> str | None:
        """``"disk full"`` or ``"disk error"`` while appends are refused for that, else None (IDiskHealth)."""
        if self._disk_full:
            return "disk full"
        return problem_name(self._writes.code)

    def write_refusal(self) -> DLedgerError | None:
        """The error an append would get now without touching the disk, or None (it would be tried; IDiskHealth).

        A follower asks before it keeps a push that waits for its turn: a store that refuses every write
        would only make it hold the push until it is refused anyway.
        """
        if self._disk_full:
            try:
                self._refuse_disk_full()
            except DLedgerError as exc:
                return exc
        if self._writes.current is not None and self.clock is not None:
            return self._writes.refusal(self.clock.seconds())
        return None


    def _create(self, files: MappedFileList, start: int) -> MappedFile:
        """A new data or index file, or the DLedgerError of a failed write (no space: DISK_FULL, before fallocate)."""
        free = diskio.free_bytes(files.directory if files.directory.is_dir() else self.member_dir)
        try:
            if free >= 0 and not room_for_file(free, files.file_size):
                raise OSError(errno.ENOSPC, f"not enough space (it needs {diskio.format_bytes(files.file_size)})")
            return files.create(start)
        except OSError as exc:
            raise self._write_failed(exc, f"cannot create {files.kind} file "
                                          f"{files.directory / mappedfiles.file_name(start)}") from None

    def _write_failed(self, exc: OSError, what: str) -> DLedgerError:
        """Remember a failed write (appends are refused for a while, see :mod:`.writefail`), log it, return its error.

        One error line names the store directory, the reason and the free space; while the failure lasts
        the next one comes at most once a minute, with a count.
        """
        code = failure_code(exc.errno)
        why = f"{what}: {exc.strerror or exc}"
        free = diskio.format_bytes(diskio.free_bytes(self.member_dir))
        self._writes.failed(code, why, self.clock.seconds() if self.clock is not None else 0.0)
        self._write_log.error(("write failed", code), "mmap store {dir}: {why}; {free} free on its disk; "
                              "refusing appends ({code}) until a write succeeds (retried within {retry:g}s)",
                              dir=str(self.member_dir), why=why, free=free, code=code.name,
                              retry=writefail.MAX_RETRY)
        return DLedgerError(code, f"{problem_name(code)}: {why} ({free} free in {self.member_dir})")

    def _writes_resumed(self) -> None:
        cur = self._writes.succeeded()
        self._write_log.limiter.forget(("write failed", cur.code))
        secs = self.clock.seconds() - cur.since if self.clock is not None else 0.0
        log.info("mmap store {dir}: writes succeed again after {secs:.1f}s ({n} failed attempts); appends resume",
                 dir=str(self.member_dir), secs=secs, n=cur.attempts)

    def _refuse_disk_full(self):
        base.check_disk_not_full(True, self._used_ratio, self.retention.disk_full_ratio)
