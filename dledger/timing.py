"""The one float tolerance for comparing reactor times.

A timer armed for ``start + timeout`` fires at that time give or take an ulp; comparing with no
tolerance can find it "not yet due" and re-arm it with a zero delay forever.
"""

from __future__ import annotations

#: Seconds: far below any configured interval, far above float rounding of reactor times.
EPSILON = 1e-6


def due(deadline: float, now: float) -> bool:
    """``deadline`` has come at ``now`` (allowing for float rounding)."""
    return deadline <= now + EPSILON
