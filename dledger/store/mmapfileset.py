"""The mmap store's file set: the data and index files it holds open, and when a removed one is closed.

:class:`MmapFileSet` is a base of :class:`dledger.store.mmapfile.MmapLogStore`: the two
:class:`.mappedfiles.MappedFileList` (``_data``, ``_index``) and their :class:`.indexlog.IndexLog`, the files
removed while a flush round may still be syncing their descriptors (closed when it ends), and closing it all
at shutdown.  It uses the store's state (``_gc``, ``_recent``, ``_claim`` ...) and adds none.
"""

from __future__ import annotations

from pathlib import Path

from dledger import diskio
from dledger.store import ownership
from dledger.store.mappedfiles import MappedFile


class MmapFileSet:
    """The data and index files of the mmap store: listing, closing (now or after the flush round), closing all."""

    @property
    def closing_files(self) -> tuple[MappedFile, ...]:
        """Removed files still open because the running flush round may be syncing their descriptors.

        Read-only, for tests and diagnostics: they are closed when the rounds that ran when they were
        removed have ended (or at shutdown); rounds started later never had their descriptors.
        """
        return tuple(f for _seq, f in self._graveyard)

    @property
    def data_files(self) -> list[Path]:
        return [f.path for f in self._data.files] if self._data else []

    @property
    def index_files(self) -> list[Path]:
        return [f.path for f in self._index.files] if self._index else []

    def _close_all(self) -> None:
        if not self._open:
            return
        self._open = False
        self._recent.clear()
        for lst in (self._data, self._index):
            if lst is not None:
                lst.close()
        for _seq, f in self._graveyard:
            f.close()
        self._graveyard = []
        self._set_data_tail(None)
        self._set_index_tail(None)
        ownership.release(self._claim)  # last: the files are closed, another process may have them
        self._claim = None

    def _remove_all_files(self) -> None:
        """Remove every data and index file, then fsync both directories: the old files are gone for good
        before new ones appear (a reset or an install of a snapshot), or a crash could mix the two logs."""
        self._data.remove_after(0, self._close_file)
        self._index.remove_after(0, self._close_file)
        for lst in (self._data, self._index):
            if lst.directory.is_dir():
                diskio.fsync_dir(lst.directory)

    def _close_file(self, f: MappedFile) -> None:
        """Close a removed file now, or after the flush rounds running now (they may be syncing its descriptor)."""
        if self._gc.busy:
            self._graveyard.append((self._gc.started, f))
        else:
            f.close()

    def _bury(self) -> None:
        """After a round: close the removed files no running round may still use (rounds end in order)."""
        if self._graveyard:
            finished = self._gc.finished
            keep = []
            for seq, f in self._graveyard:
                if seq <= finished:
                    f.close()
                else:
                    keep.append((seq, f))
            self._graveyard = keep
