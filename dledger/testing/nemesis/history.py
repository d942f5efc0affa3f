"""Histories on disk: one JSON object per line, so a failing run's history can be read, replayed and re-checked.

Log operations are :class:`dledger.testing.checker.Op` (bodies as latin-1
strings); broker events are plain dicts (see :mod:`.brokercheck`).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from dledger.testing.checker import History, Op


def _enc(value):
    return value.decode("latin-1") if isinstance(value, bytes) else value


def write_ops(path: Path, history: History) -> None:
    """Write a log history as JSON lines."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for op in history.ops:
            fh.write(json.dumps({k: _enc(v) for k, v in asdict(op).items()}) + "\n")


def read_ops(path: Path) -> History:
    """A log history written by :func:`write_ops`."""
    ops = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        raw = json.loads(line)
        for k in ("body", "result"):
            if raw.get(k) is not None:
                raw[k] = raw[k].encode("latin-1")
        ops.append(Op(**raw))
    return History(ops)


def write_events(path: Path, events: list[dict]) -> None:
    """Write broker events (dicts of JSON-able values) as JSON lines."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps(e) + "\n")


def read_events(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines()]
