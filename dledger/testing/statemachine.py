"""A small state machine for tests: the bodies it was fed, folded into a dict (``b"key=value"`` sets a key).

Shipped with the testing helpers (hashicorp/raft ships its ``MockFSM``) so that tests of snapshots,
compaction and InstallSnapshot -- ours and an application's -- have a machine whose state says
exactly which entries it applied: ``count`` and ``digest`` change with every entry, so a machine
that skipped or repeated one never matches its peers.
"""

from __future__ import annotations

import json
import zlib

from twisted.internet.defer import succeed
from zope.interface import implementer

from dledger.interfaces import IStateMachine


@implementer(IStateMachine)
class DictMachine:
    """``key=value`` bodies set keys; every body counts and feeds a running CRC (order matters)."""

    def __init__(self, name: str = "dict", *, piece: int = 64 * 1024):
        self.name = name
        self.piece = piece
        self.data: dict[str, str] = {}
        self.count = 0
        self.digest = 0
        self.last_index = -1
        self.restores = 0

    def apply(self, entries):
        for e in entries:
            if e.index <= self.last_index:
                raise AssertionError(f"{self.name}: entry {e.index} applied twice (last {self.last_index})")
            key, sep, value = bytes(e.body).partition(b"=")
            if sep:
                self.data[key.decode(errors="replace")] = value.decode(errors="replace")
            self.count += 1
            self.digest = zlib.crc32(bytes(e.body), self.digest)
            self.last_index = e.index
        return None

    def state(self) -> dict:
        return {"data": self.data, "count": self.count, "digest": self.digest, "last": self.last_index}

    def snapshot(self, writer):
        frozen = json.dumps(self.state(), sort_keys=True).encode()  # the point-in-time view, taken in the call
        d = succeed(None)
        for k in range(0, len(frozen), self.piece):
            d.addCallback(lambda _, p=frozen[k:k + self.piece]: writer.write(p))
        return d

    def restore(self, reader):
        parts: list[bytes] = []

        def more(data: bytes):
            if data:
                parts.append(data)
                return reader.read(self.piece).addCallback(more)
            raw = b"".join(parts)
            state = json.loads(raw) if raw else {"data": {}, "count": 0, "digest": 0, "last": -1}
            self.data, self.count, self.digest = state["data"], state["count"], state["digest"]
            self.last_index = state["last"]
            self.restores += 1

        return reader.read(self.piece).addCallback(more)
