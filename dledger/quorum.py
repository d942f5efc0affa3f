"""Majorities, written once (SPEC §3 and §4 both count to a majority of the configured members)."""

from __future__ import annotations


def majority(members: int) -> int:
    """How many of ``members`` make a majority: ``members // 2 + 1``."""
    return members // 2 + 1


def is_quorum(n: int, members: int) -> bool:
    """``n`` members form a majority of ``members``."""
    return n >= majority(members)
