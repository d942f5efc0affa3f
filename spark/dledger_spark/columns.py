"""A binary GET reply's entries decoded straight into column arrays: no ``Entry`` object per entry.

The plain client's ``get`` decodes every entry of a reply into a :class:`dledger.entry.Entry` (a Python
object, a ``bytes`` copy of its body, a CRC call) and :func:`dledger_spark.schema.arrow_batch` then walks
those objects once per column.  For the ``raw`` format a Spark task needs only four columns, so this
module reads the reply's entry section (``dledger.messages.GetEntriesRawResponse``) as arrays: the
48-byte headers gathered into one NumPy record array, the bodies cut out of the section by Arrow's
``binary_slice`` (one copy, in C).  What stays per entry in Python is the body's CRC call and, when the
entries are not all the same size, one step of the walk to the next header.

The checks are the entry codec's (:func:`dledger.entry.decode_entries` with ``accept_zero_crc``, as a
binary GET reply is decoded): a known magic, ``size`` = header + body size, no negative field, indexes
and terms in :data:`dledger.messages.DECODED_ENTRY_BOUNDS`, every entry inside the section and the
section filled exactly, each body's CRC32C (0 accepted: Java's entries).  A failure raises
:class:`CorruptReplyError` naming the entry.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from crc32c import crc32c

from dledger.entry import HEADER_SIZE, VALID_MAGICS
from dledger.messages import DECODED_ENTRY_BOUNDS

#: The entry header's layout (``dledger.entry.HEADER``) as a NumPy record.
_HEADER_FIELDS = [("magic", ">i4"), ("size", ">i4"), ("index", ">i8"), ("term", ">i8"), ("pos", ">i8"),
                  ("channel", ">i4"), ("chain_crc", ">i4"), ("body_crc", ">u4"), ("body_size", ">i4")]
_SIZE = struct.Struct(">i")
#: Arrow's binary_slice needs an explicit stop: past any body.
_TO_THE_END = 2 ** 31 - 1


class CorruptReplyError(ValueError):
    """A GET reply's entry section that the entry codec would refuse (the reply is asked for again)."""


@dataclass
class Columns:
    """``len(self)`` entries of one reply, in index order: ``index``, ``term``, ``pos`` (NumPy int64 arrays)
    and ``body`` (a ``pyarrow.BinaryArray``)."""

    index: object
    term: object
    pos: object
    body: object

    def __len__(self) -> int:
        return len(self.index)

    @property
    def last_index(self) -> int:
        return int(self.index[-1])

    def below(self, end: int) -> Columns:
        """The entries whose index is below ``end`` (a prefix: indexes ascend)."""
        import numpy as np

        n = int(np.searchsorted(self.index, end))
        if n == len(self):
            return self
        return Columns(self.index[:n], self.term[:n], self.pos[:n], self.body.slice(0, n))


def from_entries(entries: list) -> Columns:
    """The columns of already decoded entries (a member that answered the GET in JSON)."""
    import numpy as np
    import pyarrow as pa

    return Columns(np.array([e.index for e in entries], np.int64), np.array([e.term for e in entries], np.int64),
                   np.array([e.pos for e in entries], np.int64), pa.array([e.body for e in entries], pa.binary()))


def from_reply(reply) -> Columns:
    """The columns of a ``GetEntriesRawResponse`` (its ``entries`` when it carries no binary section, or when
    the reply is a plain ``GetEntriesResponse``: an in-memory transport's, ``dledger.testing``)."""
    if getattr(reply, "section", None) is None:
        return from_entries(reply.entries)
    return decode_section(reply.section, reply.count)


def decode_section(section, count: int) -> Columns:
    """``count`` entries back to back filling ``section`` (bytes or a memoryview), checked as described above."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    view = memoryview(section).cast("B")
    end = len(view)
    if end >= 2 ** 31:  # Arrow's binary offsets are 32-bit
        raise CorruptReplyError(f"a reply section of {end} bytes is past 2 GiB")
    if count == 0:
        if end:
            raise CorruptReplyError(f"{end} bytes after the reply's 0 entries")
        return from_entries([])
    starts = _entry_starts(view, count, end)
    raw = np.frombuffer(view, np.uint8)
    headers = raw[starts[:, None] + np.arange(HEADER_SIZE)].view(np.dtype(_HEADER_FIELDS))[:, 0]
    _check_headers(headers, starts, end)
    size = headers["size"].astype(np.int64)
    offsets = np.append(starts, end).astype(np.int32)
    whole = pa.BinaryArray.from_buffers(pa.binary(), count, [None, pa.py_buffer(offsets), pa.py_buffer(view)])
    bodies = pc.binary_slice(whole, HEADER_SIZE, _TO_THE_END)
    stored = headers["body_crc"]
    computed = np.fromiter(map(crc32c, map(view.__getitem__, map(slice, (starts + HEADER_SIZE).tolist(),
                                                                       (starts + size).tolist()))),
                           np.uint32, count)
    bad = np.flatnonzero((computed != stored) & (stored != 0))
    if len(bad):
        i = int(bad[0])
        raise CorruptReplyError(f"entry #{i} (index {int(headers['index'][i])}): body crc32c mismatch: stored "
                                f"{int(stored[i]):#010x}, computed {int(computed[i]):#010x}")
    return Columns(headers["index"].astype(np.int64), headers["term"].astype(np.int64),
                   headers["pos"].astype(np.int64), bodies)


def _entry_starts(view: memoryview, count: int, end: int):
    """Each entry's offset in ``view``: one stride when every entry has the first one's size (checked by
    gathering the size fields), else a walk header by header."""
    import numpy as np

    first = _SIZE.unpack_from(view, 4)[0] if end >= HEADER_SIZE else 0
    if first >= HEADER_SIZE and first * count == end:
        starts = np.arange(count, dtype=np.int64) * first
        sizes = np.frombuffer(view, np.uint8)[starts[:, None] + np.arange(4, 8)].view(">i4")[:, 0]
        if (sizes == first).all():
            return starts
    starts = np.empty(count, np.int64)
    unpack, off = _SIZE.unpack_from, 0
    for i in range(count):
        if end - off < HEADER_SIZE:
            raise CorruptReplyError(f"entry #{i} at byte {off}: needs {HEADER_SIZE} header bytes, "
                                    f"{end - off} left")
        size = unpack(view, off + 4)[0]
        if size < HEADER_SIZE or size > end - off:
            raise CorruptReplyError(f"entry #{i} at byte {off}: size {size} does not fit the "
                                    f"{end - off} bytes left")
        starts[i] = off
        off += size
    if off != end:
        raise CorruptReplyError(f"{end - off} bytes after the reply's {count} entries")
    return starts


def _check_headers(headers, starts, end: int) -> None:
    import numpy as np

    problems = (
        (~np.isin(headers["magic"], sorted(VALID_MAGICS)), "unknown magic"),
        (headers["size"] != HEADER_SIZE + headers["body_size"].astype(np.int64), "size != header + bodySize"),
        (headers["body_size"] < 0, "negative bodySize"),
        ((headers["index"] < 0) | (headers["term"] < 0) | (headers["pos"] < 0), "negative index, term or pos"),
        (starts + headers["size"] > end, "runs past the reply"),
    ) + tuple((headers[name] > bounds.hi, f"{name} past {bounds.hi}") for name, bounds in DECODED_ENTRY_BOUNDS.items())
    for mask, what in problems:
        bad = np.flatnonzero(mask)
        if len(bad):
            i = int(bad[0])
            raise CorruptReplyError(f"entry #{i} at byte {int(starts[i])}: {what} (magic {int(headers['magic'][i])}, "
                                    f"size {int(headers['size'][i])}, index {int(headers['index'][i])})")
