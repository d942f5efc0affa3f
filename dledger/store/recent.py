"""The newest entries of a log, held in memory for the readers of its tail (see :class:`RecentEntries`)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from dledger.entry import Entry, EntryList, encoded_size

#: How many appends, newest first, a range is looked for in when cutting its encoding from their bytes (a
#: range over more, or older, appends encodes itself: the search must stay cheaper than that).
_RUNS_SEARCHED = 8


class RecentEntries:
    """The newest entries of a log, as they were stored, so readers of the tail need not read them back.

    Reading an entry back from a file store means decoding (and checking) it again, yet the readers of
    a busy log mostly want its newest entries: a leader's pushes to followers that keep up, and the
    commit feed (committed entries are delivered moments after they were appended).  A store that keeps
    one (the mmap store) offers it as ``recent_entries`` and the leader pushes from it; for any other
    store the leader keeps its own.  Bounded by ``max_bytes`` (whole appends are let go, oldest first,
    never the newest: at most ``max_bytes`` plus one append are held); anything older, or
    any gap, is read from the store as before.  Whoever cuts the log must say so (:meth:`drop_after`,
    :meth:`clear`): what is held is only ever the log's own tail.

    A store that wrote an append's entries from one buffer hands that buffer over too (``encoded``):
    a range held in such appends gets its encoding cut from those bytes, so a leader's push encodes
    nothing again (only its crc32c is computed, once for every follower).  Those buffers are held
    with their entries, so a leader holds up to about twice ``max_bytes`` (32 MiB by default).
    """

    def __init__(self, max_bytes: int = 16 << 20):
        self.max_bytes = max_bytes
        self._entries: list[Entry] = []
        self._start = 0  # self._entries[self._start] has index self.first
        self.first = -1
        self._bytes = 0
        # (entries, bytes, their encoding or None) of each append still held, oldest first: the budget
        # evicts whole appends.
        self._runs: deque[tuple[int, int, memoryview | None]] = deque()
        # The last ranges handed out, by (begin, max_count, max_bytes): followers in step ask for the same
        # one and share its encoding, while other readers (the commit feed) ask for theirs in between.
        self._last: dict[tuple[int, int, int], tuple[EntryList, bool]] = {}

    def get(self, index: int) -> Entry | None:
        """Entry ``index`` if held here, else None."""
        offset = index - self.first
        if offset < 0 or self.first < 0:
            return None
        i = self._start + offset
        return self._entries[i] if i < len(self._entries) else None

    def drop_after(self, index: int) -> None:
        """Forget entries after ``index`` (the log was cut there); the ones up to it stay."""
        held = len(self._entries) - self._start
        if self.first < 0 or index >= self.first + held - 1:
            return
        if index < self.first:
            self.clear()
            return
        keep = self._start + index - self.first + 1
        for e in self._entries[keep:]:
            self._bytes -= e.size
        del self._entries[keep:]
        self._last.clear()
        self._runs.clear()  # what stays counts as one append from now on (a cut is rare), its encoding unknown
        self._runs.append((keep - self._start, self._bytes, None))

    def clear(self) -> None:
        """Forget everything (the log started over, or the store closed)."""
        self._entries.clear()
        self._start, self.first, self._bytes = 0, -1, 0
        self._last.clear()
        self._runs.clear()

    def add(self, entry: Entry) -> None:
        self.extend((entry,))

    def extend(self, stored: Sequence[Entry], nbytes: int | None = None,
               encoded: bytes | bytearray | None = None) -> None:
        """Remember consecutive entries just appended (a gap before them forgets everything held).

        ``nbytes``: their encoded size when the caller knows it (a store that wrote them as one run),
        else it is summed here.  ``encoded``: exactly their encoding, back to back, as the store wrote
        it; held (read-only) while they are, so it must never change afterwards.
        """
        if not stored:
            return
        entries = self._entries
        if len(entries) == self._start or stored[0].index != self.first + len(entries) - self._start:
            self.clear()
            self.first = stored[0].index
        entries.extend(stored)
        before = self._bytes
        self._bytes += encoded_size(stored) if nbytes is None else nbytes
        runs = self._runs
        view = None if encoded is None else memoryview(encoded).toreadonly()  # a resize of it would now fail
        runs.append((len(stored), self._bytes - before, view))
        if self._bytes > self.max_bytes and len(runs) > 1:
            start, held = self._start, self._bytes
            while held > self.max_bytes and len(runs) > 1:  # whole appends go: no step per entry
                count, nbytes, _ = runs.popleft()
                start += count
                held -= nbytes
            self.first += start - self._start
            self._start, self._bytes = start, held
        if self._start > 4096 and self._start * 2 > len(entries):
            del entries[:self._start]
            self._start = 0

    def get_range(self, begin: int, max_count: int, max_bytes: int) -> EntryList | None:
        """Like ``ILogStore.get_range`` for entries held here; None if ``begin`` is not held.

        Asked again for the same range while no entry was added, it returns the same EntryList, so a
        push to every follower encodes those entries once.
        """
        offset = begin - self.first
        held = len(self._entries) - self._start
        if offset < 0 or offset >= held or self.first < 0:
            return None
        key = (begin, max_count, max_bytes)
        last = self._last.get(key)
        if last is not None and (last[1] or begin + len(last[0]) == self.first + held):
            return last[0]  # cut short by the limits, or nothing was added since: the same range
        if len(self._last) >= 4:
            self._last.clear()
        i = self._start + offset
        entries = self._entries
        if max_bytes >= self._bytes:  # everything held fits the budget (the commit feed's reads): a slice
            out = EntryList(entries[i:i + max_count])
            self._last[key] = (out, begin + len(out) < self.first + held)
            return self._with_encoding(out, i)
        out = EntryList((entries[i],))
        total = out[0].size
        stop = min(len(entries), i + max_count)
        for j in range(i + 1, stop):
            e = entries[j]
            total += e.size
            if total > max_bytes:
                break
            out.append(e)
        self._last[key] = (out, begin + len(out) < self.first + held)
        return self._with_encoding(out, i)

    def _with_encoding(self, out: EntryList, i: int) -> EntryList:
        """``out`` (held from list position ``i``) with its encoding cut from the bytes of the appends holding it.

        Within one append the encoding is a view of its bytes; across appends, their slices, joined once a
        push asks for the section (the commit feed never does).  Only appends whose bytes were handed over
        qualify, among the newest ``_RUNS_SEARCHED``; any other range encodes itself on first use, as before.
        """
        last = i + len(out)
        end = len(self._entries)
        covering = []  # (first position, end position, bytes) of the appends holding [i, last), newest first
        for n, (count, _, encoded) in enumerate(reversed(self._runs)):
            start = end - count
            if start < last:
                if encoded is None:
                    return out
                covering.append((start, end, encoded))
                if start <= i:
                    break
            if n >= _RUNS_SEARCHED:
                return out
            end = start
        else:
            return out
        entries = self._entries
        parts = [encoded[0 if start >= i else encoded_size(entries[start:i]):
                         len(encoded) if stop <= last else encoded_size(entries[start:last])]
                 for start, stop, encoded in reversed(covering)]
        return out.give_encoding(parts[0] if len(parts) == 1 else parts)
