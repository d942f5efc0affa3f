"""The mmap store's deletions of whole files: retention, compaction after a snapshot, a reset to a snapshot.

:class:`MmapDeletion` is a base of :class:`dledger.store.mmapfile.MmapLogStore` (as :class:`.MmapRepair` and
:class:`.MmapDiskHealth` are), kept apart from its append path.  Retention (:mod:`.retention`) and compaction
(``ICompactingLogStore``) share one rule for what may go (:func:`.retention.file_may_go`) and one loop
(``_drop_first_files``): the oldest data files go, lowest first, never the last, so the first remaining file
keeps its name (its start offset) as Java DLedger's layout wants.  It uses the store's own state and adds none.
"""

from __future__ import annotations

import json

from twisted.logger import Logger

from dledger import diskio
from dledger.errors import StoreError
from dledger.store import base
from dledger.store.checkpoint import Checkpoint, write_checkpoint
from dledger.store.retention import CleanMode, file_may_go, first_index_from, keeps_uncommitted

log = Logger(namespace="dledger.store.mmapfile")

#: The file beside the log that records the snapshot an emptied log continues (``reset_to_snapshot``).
BASE_NAME = "snapshot_base"


class MmapDeletion:
    """Whole-file deletions of the mmap store (ICompactingLogStore and retention)."""

    # -- compaction (ICompactingLogStore) -----------------------------------------
    def _read_base(self) -> tuple[tuple[int, int], int]:
        """``((index, term), next_pos)`` from ``snapshot_base``; ``((-1, -1), 0)`` if there is none."""
        path = self.member_dir / BASE_NAME
        try:
            raw = json.loads(path.read_bytes())
            index, term, pos = int(raw["index"]), int(raw["term"]), int(raw["pos"])
        except FileNotFoundError:
            return (-1, -1), 0
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StoreError(f"mmap store {self.member_dir}: {path.name} is unreadable ({exc}); it records the "
                             f"snapshot this log continues: restore it or wipe the member's store") from None
        return (index, term), pos

    def compact(self, below_index: int) -> int:
        """Delete whole data files below ``below_index`` (retention's rule, :func:`.retention.file_may_go`).

        The first remaining file keeps its name (its start offset), as Java DLedger's layout wants;
        the begin index is the first entry of the files that remain, so removing a file (lowest
        first) moves it atomically, and index files wholly below it go too.
        """
        if not self._open:
            return self.ledger_begin_index
        below = base.compact_floor(below_index, self.ledger_begin_index, self.ledger_end_index, self.committed_index)
        old_begin = self.ledger_begin_index
        files = self._drop_first_files(lambda next_first: file_may_go(next_first, below))
        if files:
            log.info("mmap store {dir}: compaction after a snapshot removed {files} data files, entries [{a}, {b}]",
                     dir=str(self.member_dir), files=files, a=old_begin, b=self.ledger_begin_index - 1)
        return self.ledger_begin_index

    def _drop_first_files(self, may_go, removed=None) -> int:
        """Remove oldest data files while ``may_go(first index after it)`` (never the last); returns files removed.

        ``removed()`` runs after each file went (retention measures the disk again in FORCE mode).
        """
        files = 0
        while len(self._data.files) > 1:
            next_first = first_index_from(self._data, 1, self._begin_pos, self.accept_zero_crc)
            if not may_go(next_first):
                break
            self._data.remove_first(1, self._close_file)
            self.ledger_begin_index = next_first
            self._begin_pos = self._record(next_first)[1]
            files += 1
            if removed is not None:
                removed()
        if files:
            self._flushing.dropped_below()
            self._ilog.drop_below(self.ledger_begin_index, self._close_file)
            self._refresh_tails()
        return files

    def reset_to_snapshot(self, index: int, term: int, next_pos: int) -> None:
        """Drop every file: the log is empty with a base at ``index``/``term``, the next entry at ``next_pos``.

        The old files are removed (directories fsynced), the checkpoint cleared, then ``snapshot_base``
        is written atomically: a crash before that leaves an empty log (start-up resets it to the
        snapshot again), after it the base.  Data files appear with the next append, named by their
        start offset as always.
        """
        base.check_snapshot_base(index, term, next_pos)
        if self._disk_full:
            self._refuse_disk_full()
        self._remove_all_files()
        self._checkpoint_written = Checkpoint(end_index=-1, committed_index=-1)
        write_checkpoint(self.member_dir, self._checkpoint_written)
        diskio.write_atomic(self.member_dir / BASE_NAME,
                            json.dumps({"index": index, "term": term, "pos": next_pos}).encode() + b"\n")
        self.snapshot_base = (index, term)
        self._set_data_tail(None)
        self._set_index_tail(None)
        self._recent.clear()
        self.ledger_begin_index, self.ledger_end_index, self.ledger_end_term = index + 1, index, term
        self._write_pos = self._begin_pos = next_pos
        self.committed_index = index
        self._gc.cap(index)
        self._gc.flushed_index = index
        self._flushing.restart(next_pos, index)

    def clean_expired(self, now: float) -> int:
        """Delete whole data files past retention (see :mod:`.retention`); returns how many entries went."""
        if not self._open:
            return 0
        used = self.check_disk()
        mode = self.retention.mode(now, used)
        if mode is CleanMode.NONE:
            return 0
        old_begin = self.ledger_begin_index
        floor = self.retention_floor
        state = {"used": used}

        def may_go(next_first: int | None) -> bool:
            if keeps_uncommitted(next_first, self.committed_index):
                return False
            if floor is not None and not file_may_go(next_first, floor):
                return False
            return self.retention.may_delete(mode, now, diskio.file_mtime(self._data.files[0].path), state["used"])

        def removed() -> None:
            if mode is CleanMode.FORCE:
                state["used"] = self._disk_usage()

        files = self._drop_first_files(may_go, removed)
        if not files:
            return 0
        log.info("mmap store {dir}: retention ({mode}) removed {files} data files, entries [{a}, {b}]",
                 dir=str(self.member_dir), mode=mode.value, files=files, a=old_begin, b=self.ledger_begin_index - 1)
        self.check_disk()
        return self.ledger_begin_index - old_begin
