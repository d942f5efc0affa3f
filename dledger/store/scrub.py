"""The background scrub: every committed entry of the data files is read back and verified, damage repaired.

A damaged committed entry used to be found only when something read it (and
then answered DISK_ERROR), or by ``dledger store verify`` on a stopped
member.  A :class:`Scrubber` walks the committed entries of a store that
offers :class:`dledger.interfaces.IRepairableLogStore`, one span of about
:data:`SPAN_BYTES` in one data file at a time: the index records are taken on
the reactor thread, the bytes are read through a descriptor of their own and
checked (header against index record, reserved fields, body CRC) on a
:class:`dledger.diskio.BlockingIO` worker by :func:`verify_span`, and the
next span waits as long as ``scrubBytesPerSecond`` asks, so a pass never
competes with the member's own I/O for long.  A pass starts
``scrubIntervalSeconds`` after the previous one ended.

A suspect is confirmed on the reactor thread (``check_entry``: the entry as
the files hold it now) and handed to ``on_damaged(index, why)``, the
member's repair (:mod:`dledger.replication.repair`), which fetches a copy
from another member and has the store rewrite it only if
:func:`repair_refusal` finds nothing against it.

What proves a fetched copy is the committed entry: Raft's log matching
property -- two logs holding an entry with the same index and term hold the
same entry -- so the copy must have the index, term, position, size and type
of our index record (a separate file, written with the entry), a body whose
crc32c equals the CRC in its header (it verified on the member that sent it
and verifies here), and, when our damaged header can still be read and agrees
with the index record, the body CRC that header recorded when the entry was
written.  Anything else is left as it is.
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger

from dledger import diskio
from dledger.codes import EntryType, ResponseCode
from dledger.entry import HEADER_SIZE, CodecError, Entry, body_crc, decode_entry
from dledger.errors import DLedgerError
from dledger.ratelog import RateLimitedLog

log = Logger()

#: Bytes of entries one scrub step reads (then it waits ``bytes / scrubBytesPerSecond`` seconds).
SPAN_BYTES = 1 << 20
#: At most this many entries per step: their index records are read on the reactor thread.
SPAN_ENTRIES = 2048


class Record(NamedTuple):
    """An index record as the scrub uses it: where entry ``index`` lies and what it is (pos -1: unreadable)."""

    index: int
    pos: int
    size: int
    term: int
    magic: int


@dataclass
class Span:
    """Consecutive committed entries lying in one data file (``path`` None: their index record is unreadable)."""

    path: str | None
    file_start: int
    records: list[Record]

    @property
    def nbytes(self) -> int:
        return sum(r.size for r in self.records)


def verify_span(span: Span, accept_zero_crc: bool) -> list[tuple[int, str]]:
    """``(index, problem)`` of every entry of ``span`` whose bytes on disk do not verify; runs on a worker thread.

    A file that is gone (retention removed it meanwhile) has nothing left to scrub: no problems.
    """
    if span.path is None:
        return [(r.index, "its index record cannot be read") for r in span.records]
    first, last = span.records[0], span.records[-1]
    try:
        buf = diskio.read_file_at(span.path, first.pos - span.file_start, last.pos + last.size - first.pos)
    except FileNotFoundError:
        return []
    except OSError as exc:
        if exc.errno == errno.ENOENT:
            return []
        return [(r.index, f"reading {span.path} failed: {exc.strerror or exc}") for r in span.records]
    return [(index, why) for index, why in (
        (r.index, entry_problem(buf, r.pos - first.pos, r, accept_zero_crc)) for r in span.records) if why]


def entry_problem(buf: bytes, offset: int, record: Record, accept_zero_crc: bool) -> str | None:
    """Why the entry at ``offset`` of ``buf`` is not the one ``record`` describes, intact; None if it is."""
    try:
        e = decode_entry(buf, offset, accept_zero_crc=accept_zero_crc, max_size=max(record.size, HEADER_SIZE))
    except CodecError as exc:
        return str(exc)
    if (e.magic, e.pos, e.size, e.index, e.term) != (record.magic, record.pos, record.size, record.index,
                                                      record.term):
        return (f"header (index {e.index}, term {e.term}, pos {e.pos}, size {e.size}, magic {e.magic}) disagrees "
                f"with its index record")
    if e.channel or e.chain_crc:
        return "non-zero reserved fields (damaged header)"
    return None


def repair_refusal(record: tuple | None, header: Entry | None, copy: Entry) -> str | None:
    """Why ``copy`` may not replace our damaged entry; None when it is proven to be the same committed entry.

    ``record`` is our index record ``(magic, pos, size, index, term)``; ``header`` our entry's header as
    the data file holds it when it still agrees with that record (else None); ``copy`` what another member
    sent.  See the module docstring for why these checks prove it.
    """
    if record is None:
        return "our index record for it cannot be read, so nothing says what the entry was"
    magic, pos, size, index, term = record
    if (copy.index, copy.term) != (index, term):
        return f"the copy is entry {copy.index} of term {copy.term}, our index record says {index} of term {term}"
    if (copy.pos, copy.size, copy.magic) != (pos, size, magic):
        return (f"the copy lies at pos {copy.pos} with size {copy.size} and type {copy.magic}; our index record "
                f"says pos {pos}, size {size}, type {magic}")
    if copy.channel or copy.chain_crc:
        return "the copy has non-zero reserved fields"
    if copy.body_crc == 0 and not (copy.magic == EntryType.NOOP and not copy.body):
        return "the copy carries no body CRC (a Java-written entry), so it cannot be verified"
    if body_crc(copy.body) != copy.body_crc:
        return "the copy's body does not match its own CRC"
    if header is not None and header.body_crc != copy.body_crc:
        return f"the copy's body CRC {copy.body_crc} differs from the {header.body_crc} our entry recorded"
    return None


def noop_from_record(record: tuple) -> Entry | None:
    """A NOOP entry rebuilt from its index record alone (its body is empty, so the record says everything)."""
    magic, pos, size, index, term = record
    if magic != EntryType.NOOP or size != HEADER_SIZE:
        return None
    return Entry(body=b"", index=index, term=term, pos=pos, magic=magic, body_crc=body_crc(b""))


@dataclass
class ScrubStats:
    """What the scrub did since the member started (``dledger_scrub_*`` metrics)."""

    passes: int = 0
    bytes: int = 0
    entries: int = 0
    damaged: int = 0
    repaired: int = 0
    unrepaired: int = 0
    read_errors: int = 0
    last_pass_end: float = 0.0
    position: int = -1


class Scrubber:
    """Walks ``store``'s committed entries, rate-limited, off the reactor; hands confirmed damage to ``on_damaged``.

    ``on_damaged(index, why)`` returns a Deferred (or value) of whether the entry was repaired; the scrub
    waits for it before it goes on, so repairs run one at a time.  ``clock`` is an IReactorTime, ``io`` the
    member's BlockingIO.  Nothing runs before :meth:`start`; :meth:`stop` cancels the next step.
    """

    def __init__(self, store, clock, io: diskio.BlockingIO, *, interval: float, bytes_per_second: int,
                 on_damaged: Callable[[int, str], Any], accept_zero_crc: bool = True, name: str = "",
                 span_bytes: int = SPAN_BYTES):
        self.store = store
        self.clock = clock
        self.io = io
        self.interval = interval
        self.bytes_per_second = bytes_per_second
        self.on_damaged = on_damaged
        self.accept_zero_crc = accept_zero_crc
        self.name = name
        self.span_bytes = span_bytes
        self.stats = ScrubStats()
        self._next = -1
        self._call = None
        self._running = False
        self._busy: Deferred | None = None
        self._log = RateLimitedLog(log, clock, interval=60.0)

    def start(self) -> None:
        """Begin: the first pass starts one interval from now."""
        if self._running or self.interval <= 0:
            return
        self._running = True
        self._later(self.interval, self._new_pass)

    def stop(self) -> None:
        self._running = False
        if self._call is not None and self._call.active():
            self._call.cancel()
        self._call = None

    def _later(self, delay: float, fn) -> None:
        if self._running:
            self._call = self.clock.callLater(max(0.0, delay), fn)

    def _new_pass(self) -> None:
        self._call = None
        self._next = self.store.ledger_begin_index
        self._step()

    def _step(self) -> None:
        self._call = None
        if not self._running:
            return
        try:
            span = self.store.scrub_span(max(self._next, self.store.ledger_begin_index), self.span_bytes)
        except Exception:
            log.failure("{name}: scrub step failed", name=self.name)
            span = None
        if span is None:
            self.stats.passes += 1
            self.stats.last_pass_end = self.clock.seconds()
            self._later(self.interval, self._new_pass)
            return
        self._busy = d = self.io.run(verify_span, span, self.accept_zero_crc)
        d.addCallback(self._checked, span)
        d.addErrback(lambda f: log.failure("{name}: scrub read failed", f, name=self.name))
        d.addBoth(lambda _: self._after(span))

    def _checked(self, suspects: list[tuple[int, str]], span: Span) -> Deferred | None:
        if not self._running:  # the member stopped while the span was read: its store may be closed
            return None
        self.stats.bytes += span.nbytes
        self.stats.entries += len(span.records)
        damaged = []
        for index, why in suspects:
            if why.startswith("reading "):
                self.stats.read_errors += 1
                self._log.error(("read", span.path), "{name}: scrub cannot read {why}", name=self.name, why=why)
                continue
            try:
                self.store.check_entry(index)
            except DLedgerError as exc:
                if exc.code is ResponseCode.DISK_ERROR:
                    damaged.append((index, exc.message or why))
            # anything else (the entry is gone, or reads back intact now): nothing to repair
        return self._repair_each(damaged)

    def _repair_each(self, damaged: list[tuple[int, str]]) -> Deferred | None:
        if not damaged or not self._running:
            return None
        (index, why), rest = damaged[0], damaged[1:]
        self.stats.damaged += 1

        def done(repaired):
            if repaired is True:
                self.stats.repaired += 1
            else:
                self.stats.unrepaired += 1
            return self._repair_each(rest)

        return maybeDeferred(self.on_damaged, index, why).addErrback(lambda f: False).addCallback(done)

    def _after(self, span: Span) -> None:
        self._busy = None
        self._next = span.records[-1].index + 1
        self.stats.position = self._next
        self._later(span.nbytes / self.bytes_per_second, self._step)
