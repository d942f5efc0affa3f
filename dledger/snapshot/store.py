"""The snapshot files beside the log: ``<member dir>/snapshot/<index>-<term>/`` (docs/snapshots.md).

Every byte goes through a :class:`dledger.diskio.BlockingIO` (a worker thread in a running member,
inline in tests and tools), one job at a time per builder, reader or receiver, so a job stream
keeps its order even on an I/O that completes jobs out of order.  Only quick metadata calls
(``stat``, ``mkdir``) run inline.

A snapshot becomes visible atomically: it is written under ``.tmp-<index>-<term>``, every file and
directory fsynced, the manifest written last, then renamed to ``<index>-<term>`` and the parent
fsynced.  A crash leaves either no snapshot or a whole one; ``load()`` clears what a crash left.
A snapshot received from a leader (InstallSnapshot) is written under ``.install-<index>-<term>``,
which survives a restart so that a transfer resumes where it stopped.
"""

from __future__ import annotations

import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import crc32c as _crc32c
from twisted.internet.defer import Deferred, fail, succeed
from twisted.logger import Logger
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger.diskio import INLINE, fsync_dir, read_file_at, write_atomic
from dledger.interfaces import ISnapshotReader, ISnapshotWriter
from dledger.snapshot import rules
from dledger.snapshot.manifest import (
    MANIFEST_NAME,
    NAME_RE,
    FileInfo,
    Manifest,
    ManifestError,
    Section,
    chunk_path,
    dir_name,
    parse_dir_name,
)

log = Logger()

MiB = 1024 * 1024
#: Default size of one chunk file (``snapshotFileSize``).
DEFAULT_FILE_SIZE = 64 * MiB
#: How many bytes a section writer lets wait for the disk before its ``write`` Deferred holds the caller back.
WRITE_WINDOW = 4 * MiB
#: Bytes read at a time to check a file's CRC.
CHECK_BLOCK = 1 * MiB

TMP_PREFIX = ".tmp-"
INSTALL_PREFIX = ".install-"
TRASH_PREFIX = ".trash-"


class SnapshotError(Exception):
    """A snapshot cannot be written, read or received; ``str()`` is one line for the operator."""


class SnapshotDamaged(SnapshotError):
    """A snapshot's files do not match its manifest (missing, wrong size, wrong CRC)."""


class _Serial:
    """Runs jobs on a BlockingIO one after another, in submission order; each job's result as a Deferred."""

    def __init__(self, io):
        self.io = io
        self._queue: deque = deque()
        self._busy = False

    def run(self, fn: Callable[..., Any], *args: Any) -> Deferred:
        d: Deferred = Deferred()
        self._queue.append((d, fn, args))
        if not self._busy:
            self._next()
        return d

    @property
    def idle(self) -> bool:
        return not self._busy and not self._queue

    def _next(self) -> None:
        while self._queue:
            d, fn, args = self._queue.popleft()
            self._busy = True
            job = self.io.run(fn, *args)
            if not job.called:
                job.addBoth(self._done, d)
                return
            job.addBoth(self._fire, d)  # ran inline: keep going without recursion
            self._busy = False
        self._busy = False

    @staticmethod
    def _fire(result, d: Deferred):
        d.callback(result) if not isinstance(result, Failure) else d.errback(result)

    def _done(self, result, d: Deferred) -> None:
        self._busy = False
        self._fire(result, d)
        if not self._busy:
            self._next()


def _crc_file(path: Path, size: int) -> tuple[int, int]:
    """``(bytes, crc32c)`` of the first ``size`` bytes of ``path`` (fewer if it is shorter)."""
    crc, done = 0, 0
    fd = os.open(path, os.O_RDONLY)
    try:
        while done < size:
            chunk = os.pread(fd, min(CHECK_BLOCK, size - done), done)
            if not chunk:
                break
            crc = _crc32c.crc32c(chunk, crc)
            done += len(chunk)
    finally:
        os.close(fd)
    return done, crc


def file_problem(directory: Path, f: FileInfo, *, crc: bool = True) -> str | None:
    """Why chunk file ``f`` in ``directory`` does not match its manifest entry (one line), or None.  Blocking."""
    path = directory / f.path
    try:
        actual = path.stat().st_size
    except FileNotFoundError:
        return f"file {f.path} is missing"
    except OSError as exc:
        return f"file {f.path}: {exc.strerror}"
    if actual != f.size:
        return f"file {f.path} has {actual} bytes, the manifest says {f.size}"
    if crc:
        try:
            _n, got = _crc_file(path, f.size)
        except OSError as exc:
            return f"file {f.path}: {exc.strerror}"
        if got != f.crc32c:
            return f"file {f.path} has CRC32C {got:#010x}, the manifest says {f.crc32c:#010x}"
    return None


def check_files(directory: Path, manifest: Manifest, *, crc: bool = True) -> str | None:
    """Why the files in ``directory`` do not match ``manifest`` (one line), or None when they do.  Blocking."""
    for f in manifest.files:
        why = file_problem(directory, f, crc=crc)
        if why is not None:
            return why
    return None


def _rmtree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _trash(path: Path) -> None:
    """Delete a directory so that a crash half-way never leaves something that looks like a snapshot."""
    if not path.exists():
        return
    trash = path.with_name(TRASH_PREFIX + path.name)
    _rmtree(trash)
    os.replace(path, trash)
    fsync_dir(path.parent)
    _rmtree(trash)


class SnapshotStore:
    """Creates, lists, verifies, reads, receives and prunes the snapshots of one member (docs/snapshots.md)."""

    def __init__(self, directory: str | Path, io=None, reserved: int = 3, file_size: int = DEFAULT_FILE_SIZE):
        self.directory = Path(directory)
        self.io = io or INLINE
        #: ``maxSnapshotReservedNum``: how many complete snapshots :meth:`prune` keeps.
        self.reserved = reserved
        #: ``snapshotFileSize``: the most bytes of one chunk file.
        self.file_size = file_size
        #: Complete snapshots, newest first (what :meth:`load` found, plus those finished since).
        self.manifests: list[Manifest] = []
        #: ``(directory name, why)`` of every damaged snapshot :meth:`load` or :meth:`verify` found.
        self.damaged: list[tuple[str, str]] = []
        self._in_use: dict[int, int] = {}
        self._serial = _Serial(self.io)

    # -- listing --------------------------------------------------------------------------
    def path_of(self, manifest: Manifest) -> Path:
        return self.directory / manifest.dirname

    def newest(self) -> Manifest | None:
        return self.manifests[0] if self.manifests else None

    def load(self) -> Deferred:
        """The complete snapshots on disk, newest first (Deferred of a list of :class:`Manifest`).

        Clears what a crash left (``.tmp-*``, ``.trash-*``, ``.install-*`` no newer than the newest
        snapshot).  A snapshot whose manifest does not parse, or whose files are missing or have
        the wrong size, is *damaged*: reported with one log line and skipped.  CRCs are checked by
        :meth:`verify` (start-up verifies the one it restores).
        """
        return self._serial.run(self._load).addCallback(self._loaded)

    def _load(self) -> tuple[list[Manifest], list[tuple[str, str]]]:
        self.directory.mkdir(parents=True, exist_ok=True)
        found, damaged, installs = [], [], []
        for entry in sorted(os.listdir(self.directory)):
            path = self.directory / entry
            if entry.startswith((TMP_PREFIX, TRASH_PREFIX)):
                _rmtree(path)
                continue
            if entry.startswith(INSTALL_PREFIX):
                installs.append(entry)
                continue
            ident = parse_dir_name(entry)
            if ident is None or not path.is_dir():
                continue
            try:
                manifest = read_manifest(path)
            except ManifestError as exc:
                damaged.append((entry, str(exc)))
                continue
            if (manifest.index, manifest.term) != ident:
                damaged.append((entry, f"{path / MANIFEST_NAME}: says {dir_name(manifest.index, manifest.term)}"))
                continue
            why = check_files(path, manifest, crc=False)
            if why is not None:
                damaged.append((entry, f"{path}: {why}"))
                continue
            found.append(manifest)
        found.sort(key=lambda m: (m.index, m.term), reverse=True)
        newest = found[0].index if found else -1
        for entry in installs:
            ident = parse_dir_name(entry[len(INSTALL_PREFIX):])
            if ident is None or rules.stale_install(ident[0], newest):
                _rmtree(self.directory / entry)
        return found, damaged

    def _loaded(self, result) -> list[Manifest]:
        found, damaged = result
        self.manifests = list(found)
        for name, why in damaged:
            self._report_damaged(name, why)
        return list(found)

    def _report_damaged(self, name: str, why: str) -> None:
        self.damaged.append((name, why))
        log.warn("snapshot {name} is damaged and skipped: {why}", name=name, why=why)

    def verify(self, manifest: Manifest) -> Deferred:
        """Whether every file of ``manifest`` has its size and CRC32C (Deferred of bool; a damaged one is reported)."""
        path = self.path_of(manifest)

        def checked(why):
            if why is None:
                return True
            self._report_damaged(manifest.dirname, f"{path}: {why}")
            self.manifests = [m for m in self.manifests if m.dirname != manifest.dirname]
            return False

        return self._serial.run(check_files, path, manifest).addCallback(checked)

    # -- writing ----------------------------------------------------------------------------
    def create(self, index: int, term: int, next_pos: int, members,
               configuration: dict | None = None) -> SnapshotBuilder:
        """A builder for the snapshot at ``index``/``term``: a writer per section, then ``finish()``.

        ``configuration``: the group's configuration at ``index`` with roles (``Configuration.to_json()``).
        """
        return SnapshotBuilder(self, Manifest(index, term, next_pos, tuple(members), configuration=configuration))

    def _added(self, manifest: Manifest) -> Manifest:
        self.manifests = [m for m in self.manifests if m.dirname != manifest.dirname] + [manifest]
        self.manifests.sort(key=lambda m: (m.index, m.term), reverse=True)
        return manifest

    # -- reading ----------------------------------------------------------------------------
    def open_section(self, manifest: Manifest, name: str) -> SectionReader:
        """A reader of section ``name`` (no bytes if the snapshot has no such section)."""
        section = manifest.section(name) or Section(name)
        return SectionReader(self.path_of(manifest), section, _Serial(self.io))

    def read_file(self, manifest: Manifest, path: str, offset: int, size: int) -> Deferred:
        """``size`` bytes (fewer at the end) of chunk file ``path`` from ``offset`` (InstallSnapshot's sender)."""
        info = manifest.file(path)
        if info is None:
            return fail(SnapshotError(f"snapshot {manifest.dirname} has no file {path!r}"))
        if offset < 0 or size < 0 or offset > info.size:
            return fail(SnapshotError(f"snapshot {manifest.dirname}: file {path} has {info.size} bytes, "
                                      f"cannot read {size} at {offset}"))
        return self.io.run(read_file_at, self.path_of(manifest) / path, offset, min(size, info.size - offset))

    def hold(self, manifest: Manifest) -> None:
        """Keep ``manifest`` from :meth:`prune` (while it is being sent); pair with :meth:`release`."""
        self._in_use[manifest.index] = self._in_use.get(manifest.index, 0) + 1

    def release(self, manifest: Manifest) -> None:
        n = self._in_use.get(manifest.index, 0) - 1
        if n > 0:
            self._in_use[manifest.index] = n
        else:
            self._in_use.pop(manifest.index, None)

    # -- receiving -------------------------------------------------------------------------
    def receive(self, manifest: Manifest) -> SnapshotReceiver:
        """The follower's side of InstallSnapshot: a receiver for ``manifest``'s files (resumes a transfer)."""
        return SnapshotReceiver(self, manifest)

    # -- pruning ----------------------------------------------------------------------------
    def prune(self) -> Deferred:
        """Delete all but the newest ``reserved`` snapshots (never one in use); Deferred of the names deleted."""
        victims = set(rules.prune_victims([m.index for m in self.manifests], self.reserved, set(self._in_use)))
        gone = [m for m in self.manifests if m.index in victims]
        if not gone:
            return succeed([])
        self.manifests = [m for m in self.manifests if m.index not in victims]

        def delete():
            for m in gone:
                _trash(self.path_of(m))
            return [m.dirname for m in gone]

        return self._serial.run(delete)


def read_manifest(path: Path) -> Manifest:
    """The manifest of the snapshot in directory ``path``; ManifestError (one line) if missing or bad."""
    where = str(path / MANIFEST_NAME)
    try:
        data = (path / MANIFEST_NAME).read_bytes()
    except FileNotFoundError:
        raise ManifestError(f"{where}: missing") from None
    except OSError as exc:
        raise ManifestError(f"{where}: {exc.strerror}") from None
    m = Manifest.from_bytes(data, where)
    return Manifest(m.index, m.term, m.next_pos, m.members, m.sections, m.created, m.format, dirname=path.name,
                    configuration=m.configuration)


class _FileState:
    """What the jobs of one section writer know: the open chunk file, its size and CRC (touched by jobs only)."""

    __slots__ = ("fd", "k", "size", "crc", "files", "fds_done")

    def __init__(self):
        self.fd = -1
        self.k = -1
        self.size = 0
        self.crc = 0
        self.files: list[FileInfo] = []
        self.fds_done: list[int] = []


@implementer(ISnapshotWriter)
class SectionWriter:
    """Cuts a section's stream into chunk files of at most ``file_size`` bytes, with a CRC32C each."""

    def __init__(self, builder: SnapshotBuilder, name: str):
        self.builder = builder
        self.name = name
        self._state = _FileState()
        self._waiting = 0
        self._waiters: list[Deferred] = []

    def write(self, data: bytes) -> Deferred:
        b = self.builder
        if b.failure is not None:
            return fail(b.failure)
        if b.closed:
            return fail(SnapshotError(f"snapshot {b.manifest.dirname}: section {self.name} written after finish"))
        data = bytes(data)
        if not data:
            return succeed(None)
        self._waiting += len(data)
        b.serial.run(self._write, b.tmp, data).addCallbacks(self._written, b.failed, (len(data),))
        if self._waiting <= WRITE_WINDOW:
            return succeed(None)
        d: Deferred = Deferred()
        self._waiters.append(d)
        return d

    def _written(self, _result, n: int) -> None:
        self._waiting -= n
        if self._waiting <= WRITE_WINDOW:
            waiters, self._waiters = self._waiters, []
            for d in waiters:
                d.callback(None)

    def _fail_waiters(self, failure) -> None:
        waiters, self._waiters = self._waiters, []
        for d in waiters:
            d.errback(failure)

    def _write(self, tmp: Path, data: bytes) -> None:
        """A job: append ``data``, starting a new chunk file whenever one is full."""
        st, size = self._state, self.builder.store.file_size
        view = memoryview(data)
        while view:
            if st.fd < 0 or st.size >= size:
                self._close_file()
                st.k += 1
                st.size, st.crc = 0, 0
                (tmp / self.name).mkdir(exist_ok=True)
                st.fd = os.open(tmp / chunk_path(self.name, st.k), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            piece = view[:size - st.size]
            n = os.write(st.fd, piece)
            st.crc = _crc32c.crc32c(piece[:n], st.crc)
            st.size += n
            view = view[n:]

    def _close_file(self) -> None:
        st = self._state
        if st.fd >= 0:
            os.fsync(st.fd)
            os.close(st.fd)
            st.files.append(FileInfo(chunk_path(self.name, st.k), st.size, st.crc))
            st.fd = -1

    def _abandon(self) -> None:
        if self._state.fd >= 0:
            os.close(self._state.fd)
            self._state.fd = -1


class SnapshotBuilder:
    """A snapshot being written: ``section(name)`` for each machine, then ``finish()`` (or ``abort()``)."""

    def __init__(self, store: SnapshotStore, manifest: Manifest):
        self.store = store
        self.manifest = manifest
        self.tmp = store.directory / (TMP_PREFIX + manifest.dirname)
        self.serial = _Serial(store.io)
        self.sections: list[SectionWriter] = []
        self.failure: Failure | None = None
        self.closed = False
        self.serial.run(self._start).addErrback(self.failed)

    def _start(self) -> None:
        self.store.directory.mkdir(parents=True, exist_ok=True)
        _rmtree(self.tmp)
        self.tmp.mkdir()

    def failed(self, failure: Failure) -> None:
        if self.failure is None:
            self.failure = failure
        for s in self.sections:
            s._fail_waiters(failure)

    def section(self, name: str) -> SectionWriter:
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise SnapshotError(f"section name {name!r} must match [a-z0-9_.-]{{1,64}}")
        if any(s.name == name for s in self.sections):
            raise SnapshotError(f"snapshot {self.manifest.dirname}: section {name!r} opened twice")
        writer = SectionWriter(self, name)
        self.sections.append(writer)
        return writer

    def finish(self) -> Deferred:
        """Close every file, write the manifest, make it all durable and rename it into place (Deferred of Manifest)."""
        if self.closed:
            return fail(SnapshotError(f"snapshot {self.manifest.dirname}: finished twice"))
        self.closed = True
        d = self.serial.run(self._finish)

        def done(manifest):
            if self.failure is not None:
                self.serial.run(_rmtree, self.tmp)
                return self.failure
            return self.store._added(manifest)

        def failed(failure):
            self.failed(failure)
            self.serial.run(self._cleanup)
            return failure

        return d.addCallbacks(done, failed)

    def _finish(self) -> Manifest | None:
        if self.failure is not None:
            return None
        sections = []
        for s in self.sections:
            s._close_file()
            sections.append(Section(s.name, tuple(s._state.files)))
        m = self.manifest
        manifest = Manifest(m.index, m.term, m.next_pos, m.members, tuple(sections), time.time(),
                            configuration=m.configuration)
        for s in self.sections:
            if (self.tmp / s.name).exists():
                fsync_dir(self.tmp / s.name)
        write_atomic(self.tmp / MANIFEST_NAME, manifest.to_bytes())  # fsyncs the file and the directory
        final = self.store.directory / manifest.dirname
        if final.exists():  # the same point taken again: the state is the same; replace it
            _trash(final)
        os.replace(self.tmp, final)
        fsync_dir(self.store.directory)
        return manifest

    def abort(self) -> Deferred:
        """Give the snapshot up: its files are deleted."""
        self.closed = True
        if self.failure is None:
            self.failure = Failure(SnapshotError(f"snapshot {self.manifest.dirname} aborted"))
        for s in self.sections:
            s._fail_waiters(self.failure)
        return self.serial.run(self._cleanup)

    def _cleanup(self) -> None:
        for s in self.sections:
            s._abandon()
        _rmtree(self.tmp)


@implementer(ISnapshotReader)
class SectionReader:
    """Reads a section's chunk files back in order, checking each file's size and CRC32C as it ends."""

    def __init__(self, directory: Path, section: Section, serial: _Serial):
        self.directory = directory
        self.section = section
        self.serial = serial
        self._k = 0
        self._offset = 0
        self._crc = 0

    def read(self, max_bytes: int) -> Deferred:
        if max_bytes <= 0:
            return fail(SnapshotError(f"read of {max_bytes} bytes from section {self.section.name}"))
        return self.serial.run(self._read, max_bytes)

    def _read(self, max_bytes: int) -> bytes:
        files = self.section.files
        while self._k < len(files):
            f = files[self._k]
            if self._offset < f.size:
                want = min(max_bytes, f.size - self._offset)
                try:
                    data = read_file_at(self.directory / f.path, self._offset, want)
                except FileNotFoundError:
                    raise SnapshotDamaged(f"{self.directory}: file {f.path} is missing") from None
                if len(data) < want:
                    raise SnapshotDamaged(f"{self.directory}: file {f.path} ends at {self._offset + len(data)}, "
                                          f"the manifest says {f.size} bytes")
                self._crc = _crc32c.crc32c(data, self._crc)
                self._offset += len(data)
                if self._offset == f.size:
                    self._next_file(f)
                return data
            self._next_file(f)
        return b""

    def _next_file(self, f: FileInfo) -> None:
        if self._crc != f.crc32c:
            raise SnapshotDamaged(f"{self.directory}: file {f.path} has CRC32C {self._crc:#010x}, "
                                  f"the manifest says {f.crc32c:#010x}")
        self._k += 1
        self._offset = 0
        self._crc = 0


class SnapshotReceiver:
    """A snapshot arriving from the leader, under ``.install-<index>-<term>``; resumes after a restart."""

    def __init__(self, store: SnapshotStore, manifest: Manifest):
        self.store = store
        self.manifest = manifest
        self.dir = store.directory / (INSTALL_PREFIX + manifest.dirname)
        self.serial = _Serial(store.io)
        self.closed = False
        #: Why the install directory could not be prepared (every write then fails with it), else None.
        self.failure: Failure | None = None
        self._sizes = self._open()

    def _open(self) -> dict[str, int]:
        """What has arrived already (quick metadata reads, inline); the directory work is the first job.

        A transfer of the same snapshot resumes: its files keep their bytes.  Anything else under
        ``.install-*`` (another snapshot, a manifest that differs) is deleted by that first job,
        before any write of this receiver, so nothing blocking runs on the caller's thread.
        """
        d, m = self.dir, self.manifest
        kept = None
        if d.is_dir():
            try:
                kept = read_manifest(d)
            except ManifestError:
                kept = None
        same = kept is not None and kept.to_json() | {"created": 0} == m.to_json() | {"created": 0}
        self.serial.run(self._prepare, same).addErrback(self._prepare_failed)
        sizes = {}
        for f in m.files:
            try:
                sizes[f.path] = min((d / f.path).stat().st_size, f.size) if same else 0
            except FileNotFoundError:
                sizes[f.path] = 0
        return sizes

    def _prepare(self, same: bool) -> None:
        d = self.dir
        d.parent.mkdir(parents=True, exist_ok=True)
        for other in os.listdir(d.parent):  # one transfer at a time: a different one left behind is of no use
            if other.startswith(INSTALL_PREFIX) and other != d.name:
                _rmtree(d.parent / other)
        if not same:
            _rmtree(d)
        if not d.exists():
            d.mkdir()
            write_atomic(d / MANIFEST_NAME, self.manifest.to_bytes())

    def _prepare_failed(self, failure) -> None:
        self.failure = failure
        log.error("install of {name}: cannot prepare {dir}: {why}", name=self.manifest.dirname, dir=str(self.dir),
                  why=failure.getErrorMessage())

    def resume_point(self) -> tuple[str | None, int]:
        """``(path, offset)`` of the first byte still missing; ``(None, 0)`` once every file is complete."""
        for f in self.manifest.files:
            if self._sizes[f.path] < f.size:
                return f.path, self._sizes[f.path]
        return None, 0

    def write(self, path: str, offset: int, data: bytes) -> Deferred:
        """Store ``data`` at ``offset`` of chunk file ``path``; fires once written (durable at ``finish``)."""
        info = self.manifest.file(path)
        if self.failure is not None:
            return fail(self.failure)
        if self.closed:
            return fail(SnapshotError(f"install of {self.manifest.dirname}: write after finish or abort"))
        if info is None:
            return fail(SnapshotError(f"install of {self.manifest.dirname}: no file {path!r} in the manifest"))
        have = self._sizes[path]
        if offset < 0 or offset > have or offset + len(data) > info.size:
            return fail(SnapshotError(f"install of {self.manifest.dirname}: file {path} has {have} of {info.size} "
                                      f"bytes; cannot write {len(data)} at {offset}"))
        end = offset + len(data)

        def job():
            target = self.dir / path
            target.parent.mkdir(exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT, 0o644)
            try:
                os.pwrite(fd, data, offset)
            finally:
                os.close(fd)

        def done(_):
            self._sizes[path] = max(self._sizes[path], end)

        return self.serial.run(job).addCallback(done)

    def finish(self) -> Deferred:
        """Check every file's CRC, make them durable and rename the snapshot into place (Deferred of Manifest).

        A file that does not match is emptied (so :meth:`resume_point` asks for it again) and the
        Deferred fails with :class:`SnapshotDamaged`.
        """
        if self.closed:
            return fail(SnapshotError(f"install of {self.manifest.dirname}: finished twice"))
        missing = self.resume_point()
        if missing[0] is not None:
            return fail(SnapshotError(f"install of {self.manifest.dirname}: file {missing[0]} incomplete "
                                      f"({missing[1]} bytes)"))
        self.closed = True
        return self.serial.run(self._finish).addCallbacks(self.store._added, self._not_finished)

    def _not_finished(self, failure):
        self.closed = False
        return failure

    def _finish(self) -> Manifest:
        m, d = self.manifest, self.dir
        problems = [(f, file_problem(d, f)) for f in m.files]
        bad = [(f, why) for f, why in problems if why is not None]
        if bad:
            for f, _why in bad:
                os.truncate(d / f.path, 0) if (d / f.path).exists() else None
                self._sizes[f.path] = 0
            raise SnapshotDamaged(f"install of {m.dirname}: {bad[0][1]} ({len(bad)} file(s) bad); fetching again")
        for f in m.files:
            fd = os.open(d / f.path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for s in m.sections:
            if (d / s.name).exists():
                fsync_dir(d / s.name)
        fsync_dir(d)
        final = self.store.directory / m.dirname
        if final.exists():
            _trash(final)
        os.replace(d, final)
        fsync_dir(self.store.directory)
        return read_manifest(final)

    def abort(self) -> Deferred:
        """Give the transfer up and delete what arrived."""
        self.closed = True
        return self.serial.run(_rmtree, self.dir)
