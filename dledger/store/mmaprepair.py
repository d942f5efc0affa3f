"""The mmap store's scrub and repair (``IRepairableLogStore``), kept apart from its append and read paths.

:class:`MmapRepair` is a base of :class:`dledger.store.mmapfile.MmapLogStore`: it reads what the store's
files hold (never the in-memory tail of recent entries) and rewrites one committed entry from a copy
proven to be the same entry (:func:`dledger.store.scrub.repair_refusal`).  It uses the store's own
state (``_record``, ``_repair_index``, ``_data``, ``_ilog``, ``io``, ``_write_failed``) and adds none.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred

from dledger import diskio
from dledger.codes import ResponseCode
from dledger.entry import CodecError, Entry, decode_entry, encode_entry
from dledger.errors import DLedgerError, StoreError
from dledger.store import base, scrub


class MmapRepair:
    """Scrub spans, on-disk entry checks and verified rewrites of committed entries for the mmap store."""

    def check_entry(self, index: int) -> Entry:
        """Entry ``index`` read from the data files (never the in-memory tail), or DISK_ERROR naming file and offset.

        What the scrub confirms a suspect with (IRepairableLogStore): :meth:`get` answers the newest entries
        from memory, which says nothing about the bytes on disk.
        """
        if index > self.ledger_end_index or index < self.ledger_begin_index or self.ledger_end_index < 0:
            raise base.index_out_of_range(index, self.ledger_begin_index, self.ledger_end_index)
        problem = "index record and data disagree"
        for attempt in (0, 1):
            rec = self._record(index) if attempt == 0 else self._repair_index(index)
            pos = rec[1]
            f = self._data.file_for(pos)
            if f is None:
                continue
            try:
                e = decode_entry(f.mm, pos - f.start, accept_zero_crc=self.accept_zero_crc, max_size=f.size)
            except CodecError as exc:
                problem = f"entry {index} in {f.path} at offset {pos - f.start} (pos {pos}) is damaged: {exc}"
                continue
            if (e.magic, e.pos, e.size, e.index, e.term) == rec:
                if e.channel or e.chain_crc:
                    raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} at pos {pos} has non-zero "
                                       f"reserved fields (damaged header)")
                return e
            if (e.index, e.pos, e.size) == (index, pos, rec[2]):
                raise DLedgerError(ResponseCode.DISK_ERROR, f"entry {index} at pos {pos} says term {e.term} "
                                   f"magic {e.magic} but its index record says term {rec[4]} magic {rec[0]}")
        raise DLedgerError(ResponseCode.DISK_ERROR, problem)


    def scrub_span(self, index: int, max_bytes: int) -> scrub.Span | None:
        """The committed entries from ``index`` that lie in one data file, about ``max_bytes`` of them; None if none.

        Index records only (the bytes are read and checked off the reactor thread, by
        :func:`dledger.store.scrub.verify_span`, from the file's path, so that a file retention removes
        meanwhile is still read through its own descriptor).
        """
        index = max(index, self.ledger_begin_index)
        last = min(self.committed_index, self.ledger_end_index)
        if not self._open or index > last or index < 0:
            return None
        records: list[scrub.Record] = []
        f = None
        total = 0
        while index <= last and total < max_bytes and len(records) < scrub.SPAN_ENTRIES:
            try:
                rec = self._record(index)
            except (DLedgerError, StoreError):
                rec = None
            if rec is None or rec[3] != index:
                if not records:  # the record itself is unreadable: a suspect of its own
                    return scrub.Span(None, 0, [scrub.Record(index, -1, 0, -1, 0)])
                break
            g = self._data.file_for(rec[1])
            if f is None:
                f = g
            if g is not f or g is None:
                break
            records.append(scrub.Record(index, rec[1], rec[2], rec[4], rec[0]))
            total += rec[2]
            index += 1
        if not records:
            return scrub.Span(None, 0, [scrub.Record(index, -1, 0, -1, 0)])
        return scrub.Span(str(f.path) if f is not None else None, f.start if f is not None else 0, records)

    def index_record(self, index: int) -> tuple[int, int, int, int, int] | None:
        """Index record ``index`` as stored ``(magic, pos, size, index, term)``, None if it is not valid."""
        return self._ilog.read(index) if self._ilog is not None else None

    def damaged_header(self, index: int) -> Entry | None:
        """The header of entry ``index`` as the data file holds it (body not checked), if it agrees with its index
        record; None otherwise.  Its ``body_crc`` is the CRC recorded when the entry was written."""
        rec = self.index_record(index)
        if rec is None:
            return None
        f = self._data.file_for(rec[1])
        if f is None:
            return None
        try:
            e = decode_entry(f.mm, rec[1] - f.start, verify_crc=False, max_size=f.size)
        except CodecError:
            return None
        return e if (e.magic, e.pos, e.size, e.index, e.term) == rec else None

    def repair_entry(self, entry: Entry) -> Deferred:
        """Overwrite committed entry ``entry.index`` with ``entry`` (a verified copy from another member), durably.

        Only what can be proven to be the same entry is written (:func:`dledger.store.scrub.repair_refusal`:
        the index record's index, term, position, size and type, a body whose CRC verifies and equals the CRC
        the damaged header recorded when it can still be read); a committed index only.  Fires with True once
        the bytes are fsynced and read back intact; a DLedgerError (UNEXPECTED_ARGUMENT) names why it refused.
        """
        index = entry.index
        if not self._open or not self.ledger_begin_index <= index <= min(self.committed_index, self.ledger_end_index):
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"entry {index} is not a committed entry of this log "
                               f"({self.ledger_begin_index}..{self.committed_index} committed)")
        rec = self.index_record(index)
        why = scrub.repair_refusal(rec, self.damaged_header(index), entry)
        if why is not None:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"not repairing entry {index}: {why}")
        f = self._data.file_for(entry.pos)
        try:
            diskio.write_at(f.fd, encode_entry(entry), entry.pos - f.start)
        except OSError as exc:
            raise self._write_failed(exc, f"cannot repair entry {index} at position {entry.pos}") from None

        def synced(_):
            self.check_entry(index)  # what is on disk now verifies, or DISK_ERROR
            return True

        return self.io.run(diskio.fsync_fd, f.fd).addCallback(synced)
