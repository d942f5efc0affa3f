"""Whether dledger-rocketmq's optional C speedups are used: decided here, once, at import.

The plugin's distribution builds ``dledger_rocketmq.common._speedups`` from ``_speedups.c`` as an OPTIONAL extension
(``setup.py``: the install succeeds without a compiler, and then nothing changes).  The pure-Python functions
stay the reference and the fallback; each C function gives their answers (equivalence tests in
``tests/rocketmq/test_rmq_speedups.py``).  ``DLEDGER_PURE=1`` in the environment forces the pure-Python code
everywhere (as dledger's own switch of that name), e.g. to rule the extension out when chasing a bug.

:data:`speedups` is the extension module, or None when it is not built or ``DLEDGER_PURE=1``.
"""

from __future__ import annotations

import os
from types import ModuleType


def load_speedups(environ=os.environ) -> ModuleType | None:
    """The C extension, or None: not built (no compiler at install), or ``DLEDGER_PURE=1`` asks for pure Python."""
    if environ.get("DLEDGER_PURE", "") == "1":
        return None
    try:
        from dledger_rocketmq.common import _speedups
    except ImportError:
        return None
    return _speedups


speedups = load_speedups()
