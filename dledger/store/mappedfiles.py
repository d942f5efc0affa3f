"""A directory of fixed-size memory-mapped files named by their start offset (DLedger's ``MmapFileList``).

The data log and the index log are each one such list: file ``N`` holds the
bytes at absolute offsets ``[N, N + file_size)`` and is named ``N`` as 20
zero-padded digits.  Files are created at full size (sparse), so a file whose
length differs from the configured size means the configuration does not
match the store and loading refuses it, naming the file and both sizes --
except a data file that is shorter than configured but where a file of that
size belongs: that one was truncated (bytes lost), and it is mapped as a
read-only copy padded with zeros so that recovery can judge the damage (see
:attr:`MappedFileList.truncated`).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

from dledger import diskio
from dledger.errors import StoreError

NAME_DIGITS = 20
_PAGE = mmap.PAGESIZE
_ZERO_CHUNK = bytes(1 << 20)


def file_name(offset: int) -> str:
    """DLedger's file name for a file starting at ``offset``."""
    return f"{offset:0{NAME_DIGITS}d}"


class MappedFile:
    """One open, mapped file. ``new`` files need a full fsync and a directory fsync before they are durable."""

    __slots__ = ("path", "start", "size", "fd", "mm", "new", "readonly", "length")

    def __init__(self, path: Path, start: int, size: int, *, readonly: bool = False, new: bool = False,
                 length: int | None = None):
        self.path = path
        self.start = start
        self.size = size
        self.readonly = readonly
        self.new = new
        #: Bytes the file really holds: ``size`` unless it was truncated (then ``mm`` is a zero-padded copy).
        self.length = size if length is None else length
        self.fd = os.open(path, os.O_RDONLY if readonly else os.O_RDWR)
        try:
            if self.length < size:
                self.mm = mmap.mmap(-1, size)
                self.mm[:self.length] = os.pread(self.fd, self.length, 0)
            else:
                self.mm = mmap.mmap(self.fd, size, access=mmap.ACCESS_READ if readonly else mmap.ACCESS_WRITE)
        except BaseException:
            os.close(self.fd)
            raise

    @property
    def truncated(self) -> bool:
        return self.length < self.size

    def restore_size(self) -> None:
        """Extend a truncated file to its size with zeros (what its copy shows) and map the file itself."""
        if not self.truncated:
            return
        os.ftruncate(self.fd, self.size)
        self.mm.close()
        self.mm = mmap.mmap(self.fd, self.size, access=mmap.ACCESS_WRITE)
        self.length = self.size

    @property
    def end(self) -> int:
        return self.start + self.size

    def __repr__(self) -> str:
        return f"<MappedFile {self.path.name}>"

    def nonzero_regions(self, start: int, end: int) -> list[tuple[int, int]]:
        """Relative ``[a, b)`` ranges within ``[start, end)`` holding at least one non-zero byte.

        Holes of the sparse file are skipped without reading them; the rest is
        compared in 1 MiB chunks, so checking a mostly empty 1 GiB tail is cheap.
        """
        out: list[tuple[int, int]] = []
        for a, b in diskio.data_regions(self.fd, start, end):
            pos = a
            while pos < b:
                n = min(len(_ZERO_CHUNK), b - pos)
                if self.mm[pos:pos + n] != _ZERO_CHUNK[:n]:
                    if out and out[-1][1] == pos:
                        out[-1] = (out[-1][0], pos + n)
                    else:
                        out.append((pos, pos + n))
                pos += n
        return out

    def first_nonzero(self, start: int = 0) -> int:
        """Relative offset of the first non-zero byte at or after ``start``, or -1."""
        for a, b in self.nonzero_regions(start, self.size):
            chunk = self.mm[a:b]
            return a + len(chunk) - len(chunk.lstrip(b"\0"))
        return -1

    def zero(self, start: int, end: int) -> int:
        """Zero ``[start, end)`` where it is not zero already (holes stay holes); returns bytes written."""
        written = 0
        for a, b in self.nonzero_regions(start, end):
            self.mm[a:b] = bytes(b - a)
            written += b - a
        return written

    def release(self, start: int, end: int) -> None:
        """Drop our mapping of whole pages in ``[start, end)`` (RSS only; the data stays in the file)."""
        advice = getattr(mmap, "MADV_DONTNEED", None)
        a = -(-start // _PAGE) * _PAGE
        b = (end // _PAGE) * _PAGE
        if advice is not None and b > a:
            self.mm.madvise(advice, a, b - a)

    def close(self) -> None:
        try:
            self.mm.close()
        finally:
            os.close(self.fd)


class MappedFileList:
    """The files of one log directory, contiguous, sorted by start offset.

    ``files[k].start == files[0].start + k * file_size`` always holds, so the
    file holding an offset is found by arithmetic.  Removed files are closed
    through ``closer`` so that a store can keep them open while a flush on
    another thread may still be syncing their descriptors.
    """

    def __init__(self, directory: str | Path, file_size: int, *, readonly: bool = False, kind: str = "data"):
        self.directory = Path(directory)
        self.file_size = file_size
        self.readonly = readonly
        self.kind = kind
        self.files: list[MappedFile] = []
        #: Files after a gap, not opened (see :meth:`load`).
        self.stragglers: list[Path] = []
        #: Set when a file was created or removed since the directory was last fsynced.
        self.dir_dirty = False

    # -- loading -------------------------------------------------------------
    def scan_names(self) -> tuple[list[tuple[int, Path, int]], list[str]]:
        """``[(start, path, length)]`` sorted, plus notes on stray temp files (removed unless read-only)."""
        notes: list[str] = []
        found: list[tuple[int, Path, int]] = []
        if not self.directory.is_dir():
            return found, notes
        for path in self.directory.iterdir():
            name = path.name
            if name.endswith(".tmp"):
                if not self.readonly:
                    diskio.remove_file(path)
                notes.append(f"{'found' if self.readonly else 'removed'} unfinished file {path}")
                continue
            if len(name) != NAME_DIGITS or not name.isdigit():
                raise StoreError(f"unexpected file {path} in the {self.kind} directory (expected names of "
                                 f"{NAME_DIGITS} digits, the file's start offset)")
            found.append((int(name), path, path.stat().st_size))
        found.sort()
        return found, notes

    def load(self, *, contiguous: bool = True, stop_at_gap: bool = False) -> list[str]:
        """Open every file; StoreError on a size that does not match the configuration or a missing file.

        With ``contiguous=False`` (the index, which can be rebuilt) neither a
        gap nor a wrong size raises: wrong-sized files are dropped, only the run
        of files before the first gap is opened and the files after it are
        left for the caller (see :attr:`stragglers`).  ``stop_at_gap`` does the
        same for a gap in the data files, so that recovery can judge it (a
        missing file is damage like any other, see :mod:`.recovery`).  A data
        file shorter than configured whose start fits the configured size was
        truncated: it is opened as a zero-padded copy and listed in
        :attr:`truncated` (never written until :meth:`MappedFile.restore_size`).
        """
        found, notes = self.scan_names()
        # A last file of the wrong size that holds nothing is a creation a crash interrupted.
        while found and found[-1][2] != self.file_size and _all_zero(found[-1][1]):
            start, path, length = found.pop()
            if not self.readonly:
                diskio.remove_file(path)
                self.dir_dirty = True
            notes.append(f"{'ignored' if self.readonly else 'removed'} empty {self.kind} file {path} "
                         f"of {length} bytes (interrupted creation)")
        if not contiguous:
            # Index files are derived data: a wrong-sized one is rebuilt from the data log, not refused.
            for start, path, length in [x for x in found if x[2] != self.file_size or x[0] % self.file_size]:
                found.remove((start, path, length))
                if not self.readonly:
                    diskio.remove_file(path)
                    self.dir_dirty = True
                notes.append(f"{'ignored' if self.readonly else 'removed'} {self.kind} file {path} of {length} "
                             f"bytes (configured size {self.file_size}); it is rebuilt from the data")
        shorter = {}
        for k, (start, path, length) in enumerate(found):
            if length < self.file_size and not start % self.file_size and contiguous and (
                    k + 1 == len(found) or found[k + 1][0] >= start + self.file_size):
                shorter[start] = length
                continue
            if length != self.file_size:
                raise StoreError(f"{self.kind} file {path} is {length} bytes but the configured "
                                 f"{self.kind} file size is {self.file_size} (mappedFileSizeForEntry"
                                 f"{'Data' if self.kind == 'data' else 'Index'}); the store was written "
                                 f"with another size")
            if start % self.file_size:
                raise StoreError(f"{self.kind} file {path}: start offset {start} is not a multiple of the "
                                 f"configured file size {self.file_size}; the store was written with another size")
        self.stragglers: list[Path] = []
        for k, (start, path, _length) in enumerate(found):
            if self.files and start != self.files[-1].end:
                if contiguous and not stop_at_gap:
                    missing = file_name(self.files[-1].end)
                    self.close()
                    raise StoreError(f"{self.kind} file {self.directory / missing} is missing: "
                                     f"{found[k - 1][1].name} is followed by {path.name}; restore the "
                                     f"missing file(s) or move the later ones away")
                self.stragglers = [p for _s, p, _l in found[k:]]
                break
            self.files.append(MappedFile(path, start, self.file_size, readonly=self.readonly,
                                         length=shorter.get(start)))
        return notes

    @property
    def truncated(self) -> list[MappedFile]:
        """Loaded files shorter than the configured size (bytes lost at their end)."""
        return [f for f in self.files if f.truncated]

    def missing_after(self) -> str | None:
        """The name of the first missing file when :attr:`stragglers` follow a gap, else None."""
        if not getattr(self, "stragglers", None):
            return None
        return file_name(self.files[-1].end if self.files else 0)

    # -- lookup --------------------------------------------------------------
    @property
    def start(self) -> int:
        """Start offset of the first file (-1 when empty)."""
        return self.files[0].start if self.files else -1

    @property
    def end(self) -> int:
        """End offset of the last file (-1 when empty)."""
        return self.files[-1].end if self.files else -1

    def file_for(self, offset: int) -> MappedFile | None:
        """The file holding absolute ``offset``, or None."""
        files = self.files
        if not files:
            return None
        k = (offset - files[0].start) // self.file_size
        if 0 <= k < len(files):
            return files[k]
        return None

    def position_of(self, f: MappedFile) -> int:
        return (f.start - self.files[0].start) // self.file_size

    # -- changing ----------------------------------------------------------------
    def create(self, start: int) -> MappedFile:
        """Create the file starting at ``start``: the next one after the last, or the first of an empty list."""
        if start % self.file_size:
            raise ValueError(f"{self.kind} file start {start} is not a multiple of {self.file_size}")
        if self.files and start != self.files[-1].end:
            raise ValueError(f"{self.kind} file at {start} would not follow {self.files[-1].path.name}")
        self.directory.mkdir(parents=True, exist_ok=True)
        path = self.directory / file_name(start)
        diskio.create_sized_file(path, self.file_size)
        f = MappedFile(path, start, self.file_size, new=True)
        self.files.append(f)
        self.dir_dirty = True
        return f

    def remove_after(self, keep: int, closer) -> int:
        """Remove the files after the first ``keep`` ones, highest first (so a crash never leaves a gap)."""
        removed = 0
        while len(self.files) > keep:
            f = self.files.pop()
            diskio.remove_file(f.path)
            closer(f)
            removed += 1
        if removed:
            self.dir_dirty = True
        return removed

    def remove_first(self, count: int, closer) -> int:
        """Remove the first ``count`` files, lowest first (retention: a crash leaves a contiguous suffix)."""
        count = min(count, len(self.files))
        for f in self.files[:count]:
            diskio.remove_file(f.path)
            closer(f)
        del self.files[:count]
        if count:
            self.dir_dirty = True
        return count

    def close(self) -> None:
        for f in self.files:
            f.close()
        self.files = []


def _all_zero(path: Path) -> bool:
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            if chunk.count(0) != len(chunk):
                return False
    return True
