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
from dataclasses import fields
from types import ModuleType


def load(entry_type: type, valid_magics, environ=os.environ) -> ModuleType | None:
    """The extension bound to ``entry_type`` (:class:`~dledger.entry.Entry`, whose module calls this once it
    is defined: no import back), or None if the pure code should run (see the module's docstring)."""
    if environ.get("DLEDGER_PURE") == "1":
        return None
    try:
        from dledger import _native_c
    except ImportError:
        return None
    if not _native_c.HW_CRC32C:
        return None
    if hasattr(entry_type, "__post_init__") or not hasattr(entry_type, "__slots__"):
        return None  # the C code sets the slots as Entry's __init__ does: only while that is all it does
    try:
        _native_c.init(entry_type, tuple(f.name for f in fields(entry_type)), tuple(sorted(valid_magics)))
    except (TypeError, ValueError):
        return None
    return _native_c
