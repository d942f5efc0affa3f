"""The mmap store's append writer: the hot path from a batch of entries to one ``pwrite`` per run.

:class:`MmapAppendWriter` is a base of :class:`dledger.store.mmapfile.MmapLogStore` (as :class:`.MmapReader`,
:class:`.MmapLifeCycle` and :class:`.MmapFileSet` are): leader and follower appends, truncation and a reset
write here.  It is a base class over the store's own state rather than an object of its own because this is
the path the performance work tuned: every append reads the cached tail (``_dfd``, ``_dlimit``, ``_imm``...)
and the log's end as plain attributes of one object, with no extra call or indirection per batch.
Encoding goes into one buffer per run (:class:`_Run`), written with one ``pwrite``, then its index records.
"""

from __future__ import annotations

from collections.abc import Sequence

import crc32c

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.entry import (
    HEADER,
    HEADER_SIZE,
    INDEX_RECORD,
    INDEX_UNIT_SIZE,
    MIN_BLANK_LEN,
    NATIVE,
    Entry,
    EntryList,
    body_crc,
    encode_blank,
    encoded_size,
)
from dledger.errors import BatchAppendError, DLedgerError, StoreError
from dledger.store import base, runplan
from dledger.store.checkpoint import Checkpoint, write_checkpoint
from dledger.store.mappedfiles import MappedFile

_write_at = diskio.write_at
_crc32c = crc32c.crc32c
_pack_header_into = HEADER.pack_into
_pack_index = INDEX_RECORD.pack_into


class MmapAppendWriter(base.PlannedTruncate):
    """Appends (leader, follower, a batch as runs), truncation and reset of the mmap store's log."""

    def _set_data_tail(self, f: MappedFile | None) -> None:
        """Cache the last data file for the append path (``_dlimit``: last byte an entry may end at)."""
        if f is None:
            self._dfd, self._dstart, self._dlimit = -1, 0, -1
        else:
            self._dfd, self._dstart, self._dlimit = f.fd, f.start, runplan.run_limit(f.end)

    def _set_index_tail(self, f: MappedFile | None) -> None:
        if f is None:
            self._imm, self._istart, self._isize = None, 0, 0
        else:
            self._imm, self._istart, self._isize = f.mm, f.start, f.size

    def _refresh_tails(self) -> None:
        self._set_data_tail(self._data.files[-1] if self._data and self._data.files else None)
        self._set_index_tail(self._index.files[-1] if self._index and self._index.files else None)

    def append_as_leader(self, entry: Entry, seal=None) -> Entry:
        return _one(self.append_batch_as_leader, entry, seal)

    def append_batch_as_leader(self, entries: Sequence[Entry], seal=None) -> list[Entry]:
        """Leader appends of ``entries`` in order, one ``pwrite`` per run of entries in one data file."""
        return self._append(entries, _LEADER, seal)

    def append_as_follower(self, entry: Entry, leader_term: int, leader_id: str) -> Entry:
        return _one(self.append_batch_as_follower, entry, leader_term, leader_id)

    def append_batch_as_follower(self, entries: Sequence[Entry], leader_term: int, leader_id: str) -> list[Entry]:
        """Follower appends of ``entries`` in order, one ``pwrite`` per run of entries in one data file."""
        return self._append(entries, _FOLLOWER)

    def _append(self, entries: Sequence[Entry], mode: int, seal=None) -> list[Entry]:
        """Store ``entries`` at the end of the log: checks per entry, then one write per run (see IBatchLogStore).

        ``mode`` is ``_LEADER`` (assign index and pos, then store
        ``seal(entry, index, pos)``, the core's hooks and CRC, or seal the
        CRC here without one), ``_FOLLOWER`` (the leader's entries, every follower check)
        or ``_PLACED`` (an entry truncate or reset has checked already).  A run
        ends where the next entry needs a new data file: it is written (with
        its index records) before the blank marker and the new file, so the
        blank marker rules are those of one-entry appends.  The first failing
        entry stops the batch; what was written before it stays.  A hook that
        raises fails its entry with AppendHookError (see
        :func:`dledger.store.guard.seal_leader_entry`), after the entries before it were written.
        """
        if self._writes.current is not None and self.clock is not None:
            refused = self._writes.refusal(self.clock.seconds())
            if refused is not None:  # a write failed a moment ago: do not hammer the disk (see .writefail)
                raise BatchAppendError(refused, [])
        stored: list[Entry] = []
        index = self.ledger_end_index + 1
        # A push's entries arrive encoded (checked by their CRCs): write those bytes instead of encoding again.
        known = entries.known_section() if mode == _FOLLOWER and type(entries) is EntryList else None
        # Otherwise they are encoded into a buffer sized for them at once, as far as the current data file
        # takes them (a run never crosses a file; the next run gets a buffer for the rest).
        room = self._dlimit - self._write_pos
        need = 0 if known is not None or room <= 0 else min(encoded_size(entries), room)
        run = _Run(self._write_pos, need)
        run.src = known[0] if known is not None else None
        crc_checked = known is not None and entries.crc_checked  # the bytes written are the ones checked
        into = getattr(seal, "into", None)  # the guard's seal that encodes into the run's buffer (one copy less)
        src_off = 0
        todo = entries
        if crc_checked and not self._disk_full:
            # A decoded push its decode found to be one plain run: the follower's checks made on the run as a
            # whole, its bytes written as they came.  Anything else goes entry by entry.
            end = base.follower_run_end(entries, index, run.pos, self._dlimit, self.data_file_size,
                                        self.max_entry_size)
            if end is not None:
                run.entries.extend(entries)
                run.end = end
                todo = ()
                irecs = entries.irecs  # the C decoder's index records of this run (dledger/_native.py)
                if irecs is not None and len(irecs) == INDEX_UNIT_SIZE * len(entries):
                    run.irecs, run.irec_count = irecs, len(entries)
        elif mode == _LEADER and seal is None and not self._disk_full:
            taken = self._encode_plain(run, entries, index)  # most leader appends end here
            if taken:
                index += taken
                todo = entries[taken:]
        try:
            for entry in todo:
                body = entry.body
                size = HEADER_SIZE + len(body)
                wp = run.end
                if mode == _LEADER:
                    if self._disk_full:
                        self._refuse_disk_full()
                    if entry.channel or entry.chain_crc:
                        base.check_reserved_fields(entry)
                    if wp + size > self._dlimit or size > self.max_entry_size:  # runplan.extends_run, negated, inline
                        run = self._next_run(run, stored, size, None, _left(entries, stored, run))
                        wp = run.end
                    if into is not None:
                        e = into(entry, index, wp, run.room(size), wp - run.pos)
                        run.entries.append(e)
                        run.end += size
                        index += 1
                        continue
                    if seal is not None:
                        e = seal(entry, index, wp)
                        body = e.body
                    else:
                        e = Entry(body, index, entry.term, wp, entry.magic, 0, 0, body_crc(body))
                else:
                    e = entry
                    if mode == _FOLLOWER:
                        base.check_next_index(entry, index - 1)
                        base.check_follower_entry(entry, wp, self.data_file_size, self.max_entry_size,
                                                  self.accept_zero_crc, crc_checked)
                        if self._disk_full:
                            self._refuse_disk_full()
                    if e.pos != wp or e.pos + size > self._dlimit:
                        left = 0 if known is not None else _left(entries, stored, run)
                        run = self._next_run(run, stored, size, e, left)
                        if known is not None:
                            run.src, run.src_off = known[0], src_off
                if run.src is None:
                    run.add(e, body, size)
                else:
                    run.entries.append(e)
                    run.end += size
                    src_off += size
                index = e.index + 1
            self._write_run(run, stored)
        except Exception as exc:
            error = exc
            try:
                if not run.written:  # the entries before the failing one stay appended
                    try:
                        self._write_run(run, stored)
                    except DLedgerError as write_error:
                        error = write_error
                if isinstance(error, DLedgerError):
                    raise BatchAppendError(error, stored) from None
                raise  # a failing hook propagates as it is
            finally:
                # ``error`` -> its traceback -> this frame -> ``error`` is a reference cycle holding the
                # append's entries (a follower's whole push): only the cyclic collector, which a member runs
                # rarely (tap.tune_gc), would free it.  A follower refusing every push on a full disk grew to
                # about 1 GB that way (issue 21).
                del error
        return stored

    def _encode_plain(self, run: _Run, entries: Sequence[Entry], index: int) -> int:
        """Place and encode the leading ``entries`` into ``run`` as plain leader entries; how many it took.

        The general loop's commonest case in one tight loop (no seal, no reserved field, within the data
        file, ``maxEntrySize`` and the run's buffer): no call per entry but the CRC's and the Entry's.  It
        stops at the first entry that needs any of the general loop's other steps, which then goes on from
        there (issue #28, Round 2e).  The entries' index records are packed in the same loop, for
        :meth:`_write_run` to copy in one slice (Round 2f).
        """
        view = run.view
        max_size, crc32c, pack, out = self.max_entry_size, _crc32c, _pack_header_into, run.entries
        before = len(out)
        # The index records of these entries too, back to back: _write_run copies them in one slice.
        irecs, ipack, ioff = bytearray(INDEX_UNIT_SIZE * len(entries)), _pack_index, 0
        wp = run.end
        off = wp - run.pos
        # Within the data file (``_dlimit``) and within the run's buffer: one bound for both (Round 2f).
        limit = min(self._dlimit, run.pos + len(view))
        if NATIVE is not None:  # the same loop in C (dledger/_native.py): stops where this one would
            taken, run.end = NATIVE.encode_plain(entries, view, off, wp, limit, max_size, index, out, irecs)
            if before == 0:
                run.irecs, run.irec_count = irecs, taken
            return taken
        for entry in entries:
            body = entry.body
            n = len(body)
            size = HEADER_SIZE + n
            if wp + size > limit or size > max_size or entry.channel or entry.chain_crc:
                break
            crc = crc32c(body)
            if crc >= 0x80000000:  # body_crc's signed value, without a call per entry (Round 2f)
                crc -= 0x100000000
            magic, term = entry.magic, entry.term
            pack(view, off, magic, size, index, term, wp, 0, 0, crc, n)
            view[off + HEADER_SIZE:off + size] = body
            out.append(Entry(body, index, term, wp, magic, 0, 0, crc))
            ipack(irecs, ioff, magic, wp, size, index, term)
            ioff += INDEX_UNIT_SIZE
            off += size
            wp += size
            index += 1
        run.end = wp
        if before == 0:
            run.irecs, run.irec_count = irecs, len(out)
        return len(out) - before

    def _next_run(self, run: _Run, stored: list[Entry], size: int, placed: Entry | None = None,
                  capacity: int = 0) -> _Run:
        """Write ``run``, then start the run :func:`.runplan.next_run` plans for an entry of ``size`` bytes.

        ``placed`` is an entry whose position is fixed already (follower, truncate). The plan is made
        first; the run before is written whatever it says (the batch rule: earlier entries stay).
        ``capacity``: the bytes the new run's buffer is made for (the entries left; at most one file holds).
        """
        data = self._data
        plan = runplan.next_run(run.end, size, file_size=self.data_file_size, max_size=self.max_entry_size,
                                files_start=data.start, files_end=data.end,
                                fixed_pos=None if placed is None else placed.pos,
                                index=-1 if placed is None else placed.index)
        self._write_run(run, stored)
        return _Run(self._start_run(plan), min(capacity, self.data_file_size))

    def _write_run(self, run: _Run, stored: list[Entry]) -> None:
        """Write a run's entries with one pwrite, then their index records; only then do they count as stored."""
        run.written = True
        entries = run.entries
        if not entries:
            return
        data = run.written_bytes() if run.src is None else run.src[run.src_off:run.src_off + run.end - run.pos]
        try:
            _write_at(self._dfd, data, run.pos - self._dstart)
        except OSError as exc:
            raise self._write_failed(exc, f"cannot write entries {entries[0].index}..{entries[-1].index} at "
                                          f"position {run.pos}") from None
        rest = entries
        n = run.irec_count
        if n:  # the leading entries' records, encoded with them (_encode_plain): one copy if one file holds them
            ioff = entries[0].index * INDEX_UNIT_SIZE - self._istart
            if 0 <= ioff and ioff + n * INDEX_UNIT_SIZE <= self._isize:
                with memoryview(run.irecs) as recs:
                    self._imm[ioff:ioff + n * INDEX_UNIT_SIZE] = recs[:n * INDEX_UNIT_SIZE]
                rest = entries[n:] if n < len(entries) else ()
        for e in rest:
            ioff = e.index * INDEX_UNIT_SIZE - self._istart
            if not 0 <= ioff < self._isize:
                ioff = self._index_room(e.index)
            _pack_index(self._imm, ioff, e.magic, e.pos, HEADER_SIZE + len(e.body), e.index, e.term)
        last = entries[-1]
        self.ledger_end_index = last.index
        self.ledger_end_term = last.term
        self._write_pos = run.end
        if self.ledger_begin_index < 0:
            self.ledger_begin_index, self._begin_pos = entries[0].index, run.pos
        # A leader's run buffer (never changed again) is the encoding of these entries: pushes cut theirs from it.
        self._recent.extend(entries, run.end - run.pos, data if run.src is None else None)
        stored.extend(entries)
        if self._writes.current is not None:
            self._writes_resumed()

    def _start_run(self, plan: runplan.NextRun) -> int:
        """Do what ``plan`` says before its run: refuse on a full disk before a new file, blank marker, new file."""
        if plan.new_file is not None:
            self.check_disk()
            if self._disk_full:
                self._refuse_disk_full()
        if plan.blank_at is not None:
            f = self._data.file_for(plan.blank_at)
            try:
                _write_at(f.fd, encode_blank(plan.blank), plan.blank_at - f.start)
            except OSError as exc:
                raise self._write_failed(exc, f"cannot write the blank marker at position {plan.blank_at}") from None
            self._flushing.mark_data(plan.blank_at)
        if plan.new_file is None:
            f = self._data.file_for(plan.pos)
        else:
            f = self._create(self._data, plan.new_file)
        self._set_data_tail(f)
        self._write_pos = plan.pos
        return plan.pos

    def _index_room(self, index: int) -> int:
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        if f is None:
            start = off - off % self.options.index_file_size
            if self._index.files and start != self._index.end:
                raise StoreError(f"index record {index} does not follow the index files in {self._index.directory}")
            f = self._create(self._index, start)
        self._set_index_tail(f)
        return off - f.start

    # -- truncate --------------------------------------------------------------
    # truncate(): base.PlannedTruncate, with the steps below.
    def _replace(self, entry: Entry) -> None:
        prev = self._record(entry.index - 1)
        base.check_follower_entry(entry, prev[1] + prev[2], self.data_file_size, self.max_entry_size,
                                  self.accept_zero_crc)
        if self._disk_full:
            self._refuse_disk_full()
        self._drop_after(entry.index - 1)
        _one(self._append, entry, _PLACED)

    def _append_next(self, entry: Entry) -> None:
        _one(self._append, entry, _FOLLOWER)

    def _drop_after(self, keep: int) -> None:
        """Drop entries after ``keep`` (which stays): zero their bytes and index records, remove later files."""
        old_end, old_wp = self.ledger_end_index, self._write_pos
        if keep >= old_end:
            return
        rec = self._record(keep)
        new_wp = rec[1] + rec[2]
        f = self._data.file_for(new_wp)
        f.mm[new_wp - f.start:min(old_wp, f.end) - f.start] = bytes(min(old_wp, f.end) - new_wp)
        self._data.remove_after(self._data.position_of(f) + 1, self._close_file)
        ioff = (keep + 1) * INDEX_UNIT_SIZE
        kept = [g for g in self._index.files if g.start < ioff]
        if kept:
            g = kept[-1]
            hi = min((old_end + 1) * INDEX_UNIT_SIZE, g.end)
            if hi > ioff:
                g.mm[ioff - g.start:hi - g.start] = bytes(hi - ioff)
        self._index.remove_after(len(kept), self._close_file)
        self.ledger_end_index, self.ledger_end_term = keep, rec[4]
        self._recent.drop_after(keep)
        self._write_pos = new_wp
        self._flushing.mark_data(new_wp)
        self._flushing.mark_index(keep + 1)
        self._gc.cap(keep)
        self._refresh_tails()

    def _reset(self, entry: Entry) -> None:
        """Start the log over at ``entry`` (a follower behind the leader's begin, or an empty one)."""
        base.check_entry_size(entry.size, self.max_entry_size)
        rel = entry.pos % self.data_file_size
        if rel + entry.size + MIN_BLANK_LEN > self.data_file_size:
            raise DLedgerError(ResponseCode.DISK_ERROR,
                               f"entry {entry.index} at pos {entry.pos} does not fit a {self.data_file_size}-byte "
                               f"data file here (data file sizes differ between members?)")
        base.check_reserved_fields(entry)
        base.check_body_crc(entry, self.accept_zero_crc)
        if self._disk_full:
            self._refuse_disk_full()
        self._remove_all_files()  # gone for good before new files appear
        # Nor may a crash leave the old checkpoint claiming committed entries that were just dropped
        # (recovery refuses to start below a committed index; the leader's log starts past ours).
        ck = self._checkpoint_written
        if ck is not None and ck.committed_index >= 0 or self._checkpoint_running is not None:
            self._checkpoint_written = Checkpoint(end_index=-1, committed_index=-1)
            write_checkpoint(self.member_dir, self._checkpoint_written)
        self._set_data_tail(None)
        self._set_index_tail(None)
        self.ledger_begin_index = self.ledger_end_index = self.ledger_end_term = -1
        self._recent.clear()
        self._write_pos = entry.pos - rel
        self._create(self._data, self._write_pos)
        self._refresh_tails()
        self._write_pos = entry.pos
        _one(self._append, entry, _PLACED)
        self._begin_pos = entry.pos
        self.committed_index = entry.index - 1
        self._gc.cap(entry.index - 1)
        self._flushing.restart(entry.pos, entry.index - 1)



_LEADER, _FOLLOWER, _PLACED = 0, 1, 2


def _left(entries: Sequence[Entry], stored: list[Entry], run: _Run) -> int:
    """Encoded bytes of the entries of an append not yet in ``stored`` or ``run`` (the next run's buffer)."""
    return encoded_size(entries[len(stored) + len(run.entries):])


class _Run:
    """Entries encoded back to back for one ``pwrite`` at ``pos`` (they all lie in one data file).

    The buffer is allocated once at the size the append's entries need (``capacity``) and written
    through ``view`` at offsets: growing one ``bytearray`` entry by entry re-allocates it every 12.5 %,
    and each re-allocation may copy the whole buffer (about 8x a 1 MiB run's bytes, measured on a
    RocketMQ master).  Bytes past ``end - pos`` are not part of the run (a failed entry may have left
    some there).
    """

    __slots__ = ("pos", "end", "buf", "view", "entries", "written", "src", "src_off", "irecs", "irec_count")

    def __init__(self, pos: int, capacity: int = 0):
        self.pos = self.end = pos
        self.buf = bytearray(capacity)
        self.view = memoryview(self.buf)
        self.entries: list[Entry] = []
        self.written = False  # a write was attempted (successful or not): never write it twice
        # Or the entries are already encoded: bytes [src_off, src_off + end - pos) of src.
        self.src: bytes | memoryview | None = None
        self.src_off = 0
        # The index records of the first ``irec_count`` entries, back to back, when the plain leader loop
        # encoded them with the entries (_write_run copies them in one slice).
        self.irecs: bytearray | None = None
        self.irec_count = 0

    def room(self, size: int) -> memoryview:
        """The buffer's view, with room for ``size`` more bytes (a larger buffer if the estimate fell short)."""
        used = self.end - self.pos
        if used + size > len(self.buf):
            buf = bytearray(max(used + size, 2 * len(self.buf)))
            view = memoryview(buf)
            view[:used] = self.view[:used]
            self.buf, self.view = buf, view
        return self.view

    def add(self, e: Entry, body: bytes, size: int) -> None:
        off = self.end - self.pos
        view = self.room(size)
        _pack_header_into(view, off, e.magic, size, e.index, e.term, e.pos, e.channel, e.chain_crc, e.body_crc,
                          size - HEADER_SIZE)
        view[off + HEADER_SIZE:off + size] = body
        self.entries.append(e)
        self.end += size

    def written_bytes(self) -> memoryview:
        """The encoded entries of the run (the part of the buffer in use)."""
        return self.view[:self.end - self.pos]


def _one(append_batch, entry: Entry, *args) -> Entry:
    """A one-entry append as a batch of one, raising the entry's own error rather than a BatchAppendError."""
    try:
        return append_batch((entry,), *args)[0]
    except BatchAppendError as exc:
        raise exc.cause from None

