"""The one place that decides whether the entry codec's batch loops run in C (issue #28, Round 2g).

``dledger._native_c`` is an optional extension built by ``setup.py`` (an install without a compiler
still succeeds, without it).  It does over a whole batch what the pure-Python loops do entry by entry --
a follower's decode and check of a push (:func:`dledger.entry.decode_entries`) and a leader's encode of a
plain run (``MmapAppendWriter._encode_plain``) -- with no interpreter step per entry.  The pure-Python
code stays the reference: the C functions give the same entries and bytes or step aside (an invalid
entry, an unusual argument) so the pure code decides, and the equivalence tests run both.

:func:`load` gives the extension, bound to :class:`~dledger.entry.Entry`, or None (then the pure code
runs) when any of these holds; :data:`dledger.entry.NATIVE` is what it gave at import, for every user:

* the environment variable ``DLEDGER_PURE`` is ``1`` (read once, at import);
* the extension is not built or fails to import;
* the CPU has no crc32c instruction (the C code's table fallback is slower than the ``crc32c`` package,
  so the pure path is faster there).
"""

from __future__ import annotations

import os
from types import ModuleType


def load(environ=os.environ) -> ModuleType | None:
    """The extension bound to Entry, or None if the pure code should run (see the module's docstring)."""
    if environ.get("DLEDGER_PURE") == "1":
        return None
    try:
        from dledger import _native_c
    except ImportError:
        return None
    if not _native_c.HW_CRC32C:
        return None
    from dataclasses import fields

    from dledger.entry import VALID_MAGICS, Entry

    names = tuple(f.name for f in fields(Entry))
    if hasattr(Entry, "__post_init__") or not hasattr(Entry, "__slots__"):
        return None  # the C code sets the slots as Entry's __init__ does: only while that is all it does
    try:
        _native_c.init(Entry, names, tuple(sorted(VALID_MAGICS)))
    except (TypeError, ValueError):
        return None
    return _native_c
