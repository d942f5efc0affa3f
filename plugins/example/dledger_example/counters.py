"""The application itself, without dledger: what a body means and how counters change. Pure, table-tested.

A body is one JSON object ``{"add": NAME, "by": N}``.  Committed bodies are applied in log order, so
every member that applied the same log holds the same counters.
"""

from __future__ import annotations

import json


def encode_add(name: str, by: int) -> bytes:
    """The body that adds ``by`` to counter ``name``."""
    return json.dumps({"add": name, "by": by}, sort_keys=True).encode()


def parse_add(body: bytes) -> tuple[str, int]:
    """``(name, by)`` of an add body; ValueError saying what is wrong with any other body."""
    try:
        obj = json.loads(body)
    except ValueError:
        raise ValueError(f"not JSON: {body[:40]!r}") from None
    if not isinstance(obj, dict) or set(obj) != {"add", "by"}:
        raise ValueError('expected {"add": NAME, "by": N}')
    name, by = obj["add"], obj["by"]
    if not isinstance(name, str) or not name:
        raise ValueError("the counter name must be a non-empty string")
    if not isinstance(by, int) or isinstance(by, bool) or by < 1:
        raise ValueError(f"'by' must be a positive integer, got {by!r}")
    return name, by


def check_add(body: bytes, max_add: int) -> None:
    """What the leader accepts: an add body whose ``by`` is at most ``max_add``; ValueError saying why not.

    Only the leader checks, before the entry is stored: what is committed is never judged again (a
    member with another ``max_add`` must still apply the same log the same way).
    """
    _, by = parse_add(body)
    if by > max_add:
        raise ValueError(f"'by' is {by}, more than example.max_add ({max_add})")


class Counters:
    """The state machine: counter values, and the index of the last entry applied."""

    def __init__(self) -> None:
        self.values: dict[str, int] = {}
        self.applied_index = -1

    def apply(self, index: int, body: bytes) -> None:
        """Apply the committed entry ``index``; a body that is not an add (written by something else) is skipped."""
        try:
            name, by = parse_add(body)
        except ValueError:
            pass
        else:
            self.values[name] = self.values.get(name, 0) + by
        self.applied_index = index
