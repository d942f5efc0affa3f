"""The one place where dledger makes blocking disk syscalls (fsync, msync, rename), and owns the threads for them.

Everything else in the core is reactor-driven.  A :class:`BlockingIO`
decides *where* a blocking call runs: inline (tests, simulations and tools,
so results are deterministic) or on its own few worker threads (a running
member, so a slow fsync never stalls heartbeats).  Small metadata files are
always written inline with :func:`write_atomic`, because a vote must not be
answered before its promise is on disk.
"""

from __future__ import annotations

import errno
import os
import queue
import threading  # allowed: BlockingIO owns the worker threads the core hands blocking syscalls to (the one place)
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.python.failure import Failure

#: What a worker takes from the queue to know it should exit.
_STOP = object()


class BlockingIO:
    """Runs blocking callables inline or on a few worker threads of its own; always returns a Deferred.

    Threaded, it is a lean pool rather than Twisted's reactor thread pool:
    every member runs hundreds of flush rounds a second, each one hand-off,
    and the reactor pool's Team/LockWorker/context machinery cost 33-69 us
    of CPU per no-op hand-off on a 2-vCPU VM, against 23-37 us for a thread
    fed by a :class:`queue.SimpleQueue` that answers with
    ``reactor.callFromThread`` (docs/benchmarks.md, ``tools/bench_handoff``).
    Workers start lazily: none before the first job, a new one only when
    every started one is busy, at most ``workers`` (jobs
    of one member can run side by side: the store's flush round, a plugin's
    consume-queue flush, a checkpoint write).  A job's result, or its
    exception as a :class:`Failure` made in the worker (so the original type
    and traceback survive), reaches its Deferred on the reactor thread.

    Shutdown loses nothing and hangs nothing: :meth:`stop` runs in the
    reactor's ``during shutdown`` phase, as Twisted stops its own pool --
    after the ``before`` phase, where ``twistd`` stops the member and awaits
    its store's final flush and checkpoint, so those jobs have run and their
    Deferreds fired.  Jobs still queued then run before the workers exit
    (an fsync asked for happens), their Deferreds fire, and the reactor
    thread waits for that, as it waits for Twisted's pool.  A job submitted
    after :meth:`stop` runs inline: at shutdown blocking the reactor costs
    nothing, and its Deferred always fires.  ``run`` and ``stop`` are called
    on the reactor thread; a job must not wait for the reactor.
    """

    def __init__(self, reactor: Any = None, *, threaded: bool = False, workers: int = 4,
                 after_results: Callable[[], Any] | None = None):
        if threaded and reactor is None:
            raise ValueError("a threaded BlockingIO needs a reactor")
        if threaded and not hasattr(reactor, "callFromThread"):
            raise TypeError(f"a threaded BlockingIO needs a reactor with threads (callFromThread), not {reactor!r}")
        if workers < 1:
            raise ValueError(f"a BlockingIO needs at least one worker, not {workers}")
        self.reactor = reactor
        self.threaded = threaded
        #: The most worker threads this BlockingIO starts.
        self.workers = workers
        #: True once :meth:`stop` ran: jobs run inline from then on.
        self.stopped = False
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._results: deque = deque()  # (deferred, ok, result), appended by workers, drained on the reactor
        self._threads: list[threading.Thread] = []
        self._in_flight = 0  # submitted, result not yet delivered (reactor thread only)
        self._trigger: Any = None
        #: Called on the reactor thread after each delivery of finished jobs' results (a member passes
        #: :func:`dledger.transport.outbox.send_written`: what the results' callbacks wrote -- a follower's
        #: replies once durable, a leader's answers once its flush moved the commit -- leaves at once).
        self.after_results = after_results

    @property
    def threads_started(self) -> int:
        """How many worker threads were started (never more than :attr:`workers`)."""
        return len(self._threads)

    def run(self, fn: Callable[..., Any], *args: Any) -> Deferred:
        """``fn(*args)`` off the reactor thread when threaded (inline once stopped); its result as a Deferred."""
        if not self.threaded or self.stopped:
            return maybeDeferred(fn, *args)
        d: Deferred = Deferred()
        self._in_flight += 1
        self._jobs.put((d, fn, args))
        if self._in_flight > len(self._threads) and len(self._threads) < self.workers:
            self._start_worker()
        return d

    def run_here(self, fn: Callable[..., Any], *args: Any) -> Deferred:
        """``fn(*args)`` on the calling thread whether threaded or not; its result (or failure) as a Deferred.

        For a job shorter than the hand-offs a worker costs (a tiny flush round's ``fdatasync``: ~0.2 ms
        against two thread wake-ups, a queue and the reactor's waker, each waiting for the GIL or a busy
        turn).  ``after_results`` is not called: the caller sends what its callbacks wrote.
        """
        return maybeDeferred(fn, *args)

    def _start_worker(self) -> None:
        if self._trigger is None:
            self._trigger = self.reactor.addSystemEventTrigger("during", "shutdown", self._stop_at_shutdown)
        t = threading.Thread(target=self._work, name=f"dledger-io-{len(self._threads)}", daemon=True)
        self._threads.append(t)
        t.start()

    def _work(self) -> None:
        """A worker: run jobs in queue order until the stop marker, handing each result to the reactor."""
        get, results, call_from_thread = self._jobs.get, self._results, self.reactor.callFromThread
        while True:
            job = get()
            if job is _STOP:
                return
            d, fn, args = job
            try:
                outcome = (d, True, fn(*args))
            except BaseException:
                outcome = (d, False, Failure())
            del job, d, fn, args  # hold nothing of a finished job while waiting for the next
            results.append(outcome)
            del outcome
            call_from_thread(self._deliver)

    def _deliver(self) -> None:
        """On the reactor thread: fire the Deferreds of every finished job (a result is delivered once)."""
        results = self._results
        while results:
            try:
                d, ok, result = results.popleft()
            except IndexError:  # pragma: no cover - only the reactor thread pops
                return
            self._in_flight -= 1
            if ok:
                d.callback(result)
            else:
                d.errback(result)
        if self.after_results is not None:
            self.after_results()

    def stop(self) -> None:
        """Run every queued job, stop the workers and fire the finished jobs' Deferreds; later jobs run inline.

        Blocks the calling (reactor) thread until the queued jobs have run, as
        Twisted's pool does at shutdown.  Called by the reactor's ``during
        shutdown`` trigger; an owner may call it earlier (a test, a service
        that stops).  Idempotent; nothing to do for an inline BlockingIO.
        """
        if self.stopped or not self.threaded:
            return
        self.stopped = True
        if self._trigger is not None:
            try:
                self.reactor.removeSystemEventTrigger(self._trigger)
            except (ValueError, KeyError):  # already fired: we are in it
                pass
            self._trigger = None
        for _ in self._threads:
            self._jobs.put(_STOP)
        for t in self._threads:
            t.join()
        self._deliver()

    def _stop_at_shutdown(self) -> None:
        self._trigger = None
        self.stop()


#: Runs everything inline: for tests, simulations and offline tools.
INLINE = BlockingIO()


def fsync_fd(fd: int) -> None:
    """fdatasync where available (metadata is not needed to read data back), else fsync."""
    (getattr(os, "fdatasync", None) or os.fsync)(fd)


def fsync_dir(path: str | Path) -> None:
    """Make a rename or file creation in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str | Path, data: bytes, *, backup: bool = False, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves either the old or the new content.

    Temp file, fsync, rename, fsync of the directory.  With ``backup`` the
    previous content is first copied to ``<path>.bak`` (Java DLedger's habit,
    kept so that its tools find what they expect).  ``mode`` other than 0o644
    (e.g. 0o600 for a file holding secrets) is set on the file and its backup
    before any byte is written.
    """
    path = Path(path)
    if backup and path.exists():
        write_atomic(path.with_name(path.name + ".bak"), path.read_bytes(), mode=mode)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        if mode != 0o644:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)


# -- file-store helpers ---------------------------------------------------------
# Opening, sizing, listing and unlinking files are quick metadata calls run
# inline; what can stall for milliseconds (fsync, directory fsync) goes through
# ``flush_files``, which a store hands to its ``BlockingIO``.

def create_sized_file(path: str | Path, size: int, *, preallocate: bool = True) -> None:
    """Create ``path`` at exactly ``size`` bytes, never leaving a short file behind.

    The file is sized under a ``.tmp`` name and renamed into place, so a crash
    leaves either no file or a full-size one.  With ``preallocate`` the blocks
    are reserved up front (reading as zeros, like a sparse file): a full disk
    then fails here with ENOSPC instead of killing the process with SIGBUS
    when a page of a mapped sparse file cannot be allocated.  Not durable
    until the file and its directory are fsynced (the store's next flush).
    """
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        if preallocate and hasattr(os, "posix_fallocate"):
            try:
                os.posix_fallocate(fd, 0, size)
            except OSError as exc:
                if exc.errno == errno.ENOSPC:
                    raise
    except BaseException:
        os.close(fd)
        remove_file(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)


def write_at(fd: int, data: bytes | bytearray | memoryview, offset: int) -> None:
    """Write ``data`` at ``offset`` of ``fd`` into the page cache (durable only after a flush).

    Stores append with this rather than by storing into their memory map:
    a page dirtied through a shared mapping has to be write-protected again
    (and the TLBs of other CPUs flushed) before each writeback, which made
    mmap appends and their fdatasync 2-3x slower (docs/benchmarks.md).  The
    page cache is shared, so the mapping sees the bytes at once.
    """
    n = os.pwrite(fd, data, offset)
    if n != len(data):
        view = memoryview(data)[n:]
        offset += n
        while view:
            n = os.pwrite(fd, view, offset)
            view, offset = view[n:], offset + n


def read_file_at(path: str | Path, offset: int, length: int) -> bytes:
    """``length`` bytes of ``path`` from ``offset`` through a descriptor of its own (fewer at the end of the file).

    The scrub reads data files this way on a worker thread, never through the store's mappings: a file
    that retention removes meanwhile stays readable through this descriptor, and nothing the reactor
    thread maps is touched from another thread.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        out = bytearray()
        while len(out) < length:
            chunk = os.pread(fd, length - len(out), offset + len(out))
            if not chunk:
                break
            out += chunk
        return bytes(out)
    finally:
        os.close(fd)


def remove_file(path: str | Path) -> bool:
    """Unlink ``path``; False if it was already gone."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        return False
    return True


def file_mtime(path: str | Path) -> float:
    """Last modification time of ``path`` (seconds since the epoch)."""
    return os.stat(path).st_mtime


def flush_files(data_fds: list[int], full_fds: list[int], dirs: list[str]) -> None:
    """Make file contents durable: fdatasync ``data_fds``, fsync ``full_fds`` (new files), then ``dirs``.

    On Linux, pages written through a shared mmap live in the page cache, so
    fdatasync of the file writes them back exactly as msync(MS_SYNC) would,
    and unlike ``mmap.flush`` it releases the GIL while it waits.
    """
    for fd in data_fds:
        fsync_fd(fd)
    for fd in full_fds:
        os.fsync(fd)
    for d in dirs:
        fsync_dir(d)


def data_regions(fd: int, start: int, end: int) -> list[tuple[int, int]]:
    """The ``[a, b)`` ranges of ``[start, end)`` that may hold data (holes of a sparse file skipped).

    Uses SEEK_DATA/SEEK_HOLE where the platform has them; otherwise the whole
    range is reported, which is always correct, only slower to scan.
    """
    seek_data = getattr(os, "SEEK_DATA", None)
    seek_hole = getattr(os, "SEEK_HOLE", None)
    if seek_data is None or seek_hole is None:
        return [(start, end)] if start < end else []
    out = []
    pos = start
    while pos < end:
        try:
            a = os.lseek(fd, pos, seek_data)
        except OSError:  # ENXIO: no data after pos
            break
        if a >= end:
            break
        b = min(os.lseek(fd, a, seek_hole), end)
        out.append((a, b))
        pos = b
    return out


def free_bytes(path: str | Path) -> int:
    """Bytes an unprivileged writer may still allocate on the partition holding ``path`` (-1 if unknown)."""
    try:
        st = os.statvfs(path)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def format_bytes(n: int) -> str:
    """``n`` bytes for a log line: ``4.9 MiB``, ``1.2 GiB``; ``unknown`` for a negative count."""
    if n < 0:
        return "unknown"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def disk_used_ratio(path: str | Path) -> float:
    """Fraction of the partition holding ``path`` that is in use, as Java DLedger computes it."""
    st = os.statvfs(path)
    if not st.f_blocks:
        return 0.0
    return (st.f_blocks - st.f_bfree) / st.f_blocks
