"""The mmap store's reads: entries by index (from the recent tail or the files) and committed bytes by position.

:class:`MmapReader` is a base of :class:`dledger.store.mmapfile.MmapLogStore`: index records are read from the
mapped index files (a damaged one is rewritten from the data, :func:`.recovery.repair_index`), entries from the
recent tail held in memory or checked against their record (:meth:`.MmapRepair.check_entry`), and raw
committed bytes (``IPositionReader``) straight from the data mappings.  It uses the store's state, adds none.
"""

from __future__ import annotations

from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.entry import HEADER_SIZE, INDEX_RECORD, INDEX_UNIT_SIZE, Entry
from dledger.errors import DLedgerError
from dledger.store import base, positions
from dledger.store.recovery import repair_index

log = Logger(namespace="dledger.store.mmapfile")

_unpack_index = INDEX_RECORD.unpack_from


class MmapReader:
    """Reads of the mmap store's log by index and by position."""

    def _record(self, index: int) -> tuple[int, int, int, int, int]:
        """Index record ``index`` (magic, pos, size, index, term), repaired from the data if it is damaged."""
        rec = self._ilog.read(index)
        return rec if rec is not None else self._repair_index(index)

    def _repair_index(self, index: int) -> tuple[int, int, int, int, int]:
        """Rewrite index records up to ``index`` from the data (see :func:`.recovery.repair_index`)."""
        rewritten = repair_index(self._data, self._ilog, index, begin=self.ledger_begin_index,
                                 begin_pos=self._begin_pos, accept_zero_crc=self.accept_zero_crc)
        if rewritten:
            log.warn("mmap store {dir}: rewrote {n} damaged index records ({first}..{last}) from the data",
                     dir=str(self.member_dir), n=len(rewritten), first=rewritten[0], last=rewritten[-1])
            self._flushing.mark_index(rewritten[0])
        self._refresh_tails()
        off = index * INDEX_UNIT_SIZE
        f = self._index.file_for(off)
        return _unpack_index(f.mm, off - f.start)

    def get(self, index: int) -> Entry:
        """Entry ``index``, checked against its index record; DISK_ERROR rather than a damaged entry."""
        if index > self.ledger_end_index or index < self.ledger_begin_index or self.ledger_end_index < 0:
            raise base.index_out_of_range(index, self.ledger_begin_index, self.ledger_end_index)
        held = self._recent.get(index)
        if held is not None:
            return held
        entry = self.check_entry(index)
        self._flushing.note_read(entry.pos, entry.pos + HEADER_SIZE + len(entry.body), index)
        return entry

    def get_range(self, begin_index: int, max_count: int, max_bytes: int) -> list[Entry]:
        if self.ledger_begin_index <= begin_index <= self.ledger_end_index:
            held = self._recent.get_range(begin_index, max_count, max_bytes)
            if held is not None:
                return held
        return base.read_range(self.get, begin_index, self.ledger_end_index, max_count, max_bytes)

    def get_first_log_of_target_term(self, term: int, end_index: int) -> int:
        return base.first_index_of_term(lambda i: self._record(i)[4], term, self.ledger_begin_index,
                                        self.ledger_end_index, end_index)

    def update_committed_index(self, term: int, index: int) -> None:
        self.committed_index = base.next_committed_index(
            self.committed_index, term, self.member_state.curr_term, index,
            self.ledger_begin_index, self.ledger_end_index)

    # -- reads by position (IPositionReader) ----------------------------------
    def begin_position(self) -> int:
        """The first entry's ``pos`` (where the next entry goes when the log is empty)."""
        return self._begin_pos if self.ledger_end_index >= 0 else self._write_pos

    def committed_position(self) -> int:
        """Just past the last committed entry; :meth:`begin_position` when nothing here is committed."""
        if self.ledger_end_index < 0 or self.committed_index < self.ledger_begin_index:
            return self.begin_position()
        rec = self._record(self.committed_index)
        return rec[1] + rec[2]

    def read_at(self, pos: int, size: int) -> bytes:
        """Committed bytes of the data files, straight from the mappings (a read may span files)."""
        if not self._open:
            raise DLedgerError(ResponseCode.DISK_ERROR, f"mmap store {self.member_dir} is not open")
        positions.check_read(pos, size, self.begin_position(), self.committed_position())
        out = bytearray()
        end = pos + size
        while pos < end:
            f = self._data.file_for(pos)
            if f is None:
                raise DLedgerError(ResponseCode.DISK_ERROR, f"no data file holds position {pos}")
            upto = min(end, f.end)
            out += f.mm[pos - f.start:upto - f.start]
            pos = upto
        self._flushing.note_read(end - size, end)
        return bytes(out)

