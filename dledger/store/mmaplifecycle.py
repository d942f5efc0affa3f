"""The mmap store's recovery glue and life cycle: open and recover, the timers and checkpoints, shutdown.

:class:`MmapLifeCycle` is a base of :class:`dledger.store.mmapfile.MmapLogStore`: :meth:`startup` locks the
directory, opens the files (:class:`.MmapFileSet`), runs the pure recovery of :mod:`.recovery` and makes what
it verified or repaired durable before anything is acknowledged; the timers write the checkpoint (after
syncing the index records it vouches for), flush (``async``) and check retention.  It uses the store's state.
"""

from __future__ import annotations

from pathlib import Path

from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from dledger import diskio
from dledger.entry import INDEX_UNIT_SIZE
from dledger.store import ownership
from dledger.store.checkpoint import Checkpoint, checkpoint_after_index, read_checkpoint, write_checkpoint
from dledger.store.flushing import FlushTracker, index_sync_due
from dledger.store.indexlog import IndexLog
from dledger.store.mappedfiles import MappedFileList
from dledger.store.recovery import Recovered, recover

log = Logger(namespace="dledger.store.mmapfile")


class MmapLifeCycle:
    """Start-up with recovery, shutdown and abandon, and the periodic checkpoint, flush and retention check."""

    def startup(self) -> None:
        """Lock the directory (before anything is read or repaired), then open and recover; see :meth:`_startup`."""
        if self._open:
            return
        self._claim = ownership.claim(self.member_dir, self.owner)
        try:
            self._startup()
        except BaseException:
            ownership.release(self._claim)
            self._claim = None
            raise

    def _startup(self) -> None:
        """Open the files, recover (see :mod:`.recovery`), make the repairs durable, start the timers."""
        self.member_dir.mkdir(parents=True, exist_ok=True)
        data = MappedFileList(self.member_dir / "data", self.data_file_size, kind="data")
        index = MappedFileList(self.member_dir / "index", self.options.index_file_size, kind="index")
        notes = data.load(stop_at_gap=True)
        try:
            notes += index.load(contiguous=False)
        except BaseException:
            data.close()
            raise
        for path in index.stragglers:
            diskio.remove_file(path)
            index.dir_dirty = True
            notes.append(f"removed index file {path.name} (after a gap; rebuilt from the data)")
        checkpoint, ck_note = read_checkpoint(self.member_dir)
        if ck_note and (checkpoint is not None or data.files):
            notes.append(f"checkpoint: {ck_note}")
        self._data, self._index, self._ilog = data, index, IndexLog(index)
        try:
            rec = recover(data, index, checkpoint, accept_zero_crc=self.accept_zero_crc,
                          closer=self._close_file, full=self.options.full_verify,
                          truncate_damaged=self.options.truncate_damaged)
        except BaseException:
            data.close()
            index.close()
            self._data = self._index = self._ilog = None
            raise
        rec.notes[:0] = notes
        rec.removed_index_files += len(index.stragglers)
        self.recovered = rec
        self.ledger_begin_index, self._begin_pos = rec.begin, rec.begin_pos
        self.ledger_end_index, self.ledger_end_term = rec.end, rec.end_term
        self._recent.clear()
        self._write_pos = rec.write_pos if rec.end >= 0 else (0 if data.files else self._initial_pos)
        self.committed_index = rec.committed
        self.snapshot_base, base_pos = self._read_base()
        if rec.end < 0 and self.snapshot_base[0] >= 0:  # empty with a base: the log continues after a snapshot
            base_index, base_term = self.snapshot_base
            self.ledger_begin_index, self.ledger_end_index = base_index + 1, base_index
            self.ledger_end_term = base_term
            self._write_pos = self._begin_pos = base_pos
            self.committed_index = base_index
        self._refresh_tails()
        self._make_recovery_durable(rec, checkpoint)
        claimed = checkpoint.committed_index if checkpoint is not None else -1
        if rec.forced and checkpoint is not None and checkpoint.committed_index > rec.committed:
            # Never claim, even after a crash right now, a committed index the log no longer holds.
            checkpoint = Checkpoint(end_index=rec.end, committed_index=rec.committed)
            write_checkpoint(self.member_dir, checkpoint)
        self._gc.flushed_index = self.ledger_end_index
        self._flushing = FlushTracker(data, index, lambda: self._write_pos,
                                      release_pages=self.options.release_flushed_pages)
        self._flushing.restart(self._write_pos, self.ledger_end_index)
        self._checkpoint_written = checkpoint
        self._open = True
        msg = "mmap store {dir}: {summary}"
        if claimed > rec.end:  # committed entries are missing here: an operator must hear of it
            rec.notes.append(f"the checkpoint claims more than the log holds: committed index {claimed} but "
                             f"entries only up to {rec.end} (see docs/operations.md, Troubleshooting)")
        if rec.forced:
            log.error(msg, dir=str(self.member_dir), summary=rec.summary())
        elif rec.cut or claimed > rec.end:
            log.warn(msg, dir=str(self.member_dir), summary=rec.summary())
        else:
            log.info(msg, dir=str(self.member_dir), summary=rec.summary())
        self.check_disk()
        if self.clock is not None:
            self._start_timers()

    def _make_recovery_durable(self, rec: Recovered, checkpoint: Checkpoint | None) -> None:
        """Fsync what recovery verified past the checkpoint or repaired, before anything is acknowledged."""
        anchor_pos = self._begin_pos
        if not rec.full_scan and rec.anchor >= 0:
            r = self._ilog.read(rec.anchor)
            anchor_pos = r[1] if r else anchor_pos
        data_fds = [f.fd for f in self._data.files if f.end > anchor_pos]
        index_fds = [f.fd for f in self._index.files if f.end > max(rec.anchor, 0) * INDEX_UNIT_SIZE]
        if rec.full_scan or rec.rebuilt_index:
            index_fds = [f.fd for f in self._index.files]
        dirs = [str(lst.directory) for lst in (self._data, self._index) if lst.dir_dirty or any(
            f.new for f in lst.files)]
        for lst in (self._data, self._index):
            lst.dir_dirty = False
            for f in lst.files:
                f.new = False
        diskio.flush_files(data_fds + index_fds, [], [d for d in dirs if Path(d).is_dir()])

    def shutdown(self) -> Deferred:
        """Stop the timers, flush, write the checkpoint, close the files."""
        if not self._open:
            return succeed(None)
        for lc in self._timers:
            if lc.running:
                lc.stop()
        self._timers = []
        d = self._gc.request()

        def after_flush(_):
            prev = self._checkpoint_running
            if prev is not None:
                wait: Deferred = Deferred()
                prev.addBoth(lambda r: wait.callback(None))
                return wait.addCallback(lambda _: self._write_checkpoint(force=True))
            return self._write_checkpoint(force=True)

        def close(result):
            self._close_all()
            return result

        d.addCallback(after_flush)
        d.addBoth(close)
        d.addCallback(lambda _: None)
        return d

    def abandon(self) -> None:
        """Drop the store as a killed process would: timers stop and files close, nothing more is written.

        What was already written stays in the page cache, exactly as after a
        SIGKILL; in-process tests use this to restart a member from its files.
        """
        for lc in self._timers:
            if lc.running:
                lc.stop()
        self._timers = []
        self._close_all()

    # -- timers ----------------------------------------------------------------
    def _start_timers(self) -> None:
        def every(ms: int, fn) -> None:
            lc = LoopingCall(fn)
            lc.clock = self.clock
            lc.start(ms / 1000.0, now=False).addErrback(
                lambda f: log.failure("mmap store timer {fn} stopped", f, fn=fn.__name__))
            self._timers.append(lc)

        every(self.options.checkpoint_interval_ms, self._periodic_checkpoint)
        if self.options.flush_policy == "async":
            every(self.options.flush_interval_ms, self._periodic_flush)
        every(self.options.clean_interval_ms, self._periodic_clean)

    def _periodic_flush(self):
        if self._gc.busy or not self._flushing.dirty(self._write_pos, self.ledger_end_index):
            return None
        return self._gc.request().addErrback(self._background_failed, "periodic flush")

    def _periodic_checkpoint(self) -> None:
        if self._checkpoint_running is None:
            self._write_checkpoint(force=False).addErrback(self._background_failed, "checkpoint write")

    def _background_failed(self, failure, what: str) -> None:
        """A timer's write failed: an OSError is one line naming the directory and free space (once a minute).

        A full disk fails the checkpoint every ``checkPointInterval``: a traceback each time told an operator
        nothing more and buried everything else.  Anything but an OSError is a bug: logged with its traceback.
        """
        exc = failure.value
        if not isinstance(exc, OSError):
            log.failure("mmap store {dir}: {what} failed", failure, dir=str(self.member_dir), what=what)
            return
        self._write_log.error((what, exc.errno), "mmap store {dir}: {what} failed: {why}; {free} free on its "
                              "disk (tried again every interval)", dir=str(self.member_dir), what=what,
                              why=exc.strerror or exc, free=diskio.format_bytes(diskio.free_bytes(self.member_dir)))

    def _periodic_clean(self) -> None:
        try:
            self.clean_expired(self.clock.seconds())
        except Exception:
            log.failure("retention check failed")

    def _current_checkpoint(self) -> Checkpoint:
        if self.ledger_begin_index > self.ledger_end_index:  # empty with a base: snapshot_base says it all
            return Checkpoint(end_index=-1, committed_index=-1)
        flushed = self.flushed_index
        return Checkpoint(end_index=flushed, committed_index=min(self.committed_index, flushed))

    def _write_checkpoint(self, *, force: bool) -> Deferred:
        """Replace the checkpoint, after syncing the index records it vouches for (flush rounds sync only data)."""
        ck = self._current_checkpoint()
        if not force and ck == self._checkpoint_written and not index_sync_due(self._flushing.index_lo,
                                                                                 ck.end_index):
            return succeed(None)
        index_fds, undo = self._flushing.index_sync(ck.end_index)
        d = self.io.run(checkpoint_after_index, index_fds, self.member_dir, ck)
        self._checkpoint_running = d

        def written(result):
            self._checkpoint_running = None
            self._checkpoint_written = ck
            return result

        def failed(failure):
            self._checkpoint_running = None
            undo()
            return failure

        d.addCallbacks(written, failed)
        return d

