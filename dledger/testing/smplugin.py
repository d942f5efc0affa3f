"""A state machine for *process* tests and benchmarks, loaded into real ``twistd dledger`` members.

Why: a member process takes snapshots only when a state machine runs in it, and
dledger itself ships none.  :func:`install` writes a throw-away distribution
(a ``*.dist-info`` with an entry point in the ``dledger`` group) into a
directory; with that directory on a child's ``PYTHONPATH`` the child loads this
module as a plugin, like any third-party one.  The environment chooses the
machine:

* ``DLEDGER_TEST_SM=dict`` -- a :class:`~dledger.testing.statemachine.DictMachine`
  whose state is written to ``<member dir>/testsm-state.json`` after every batch,
  so a test can compare the members' states after they stopped;
* ``DLEDGER_TEST_SM=blob`` with ``DLEDGER_TEST_SM_BYTES=N`` -- a :class:`BlobMachine`
  whose snapshot section is ``N`` bytes generated on the fly (a 1 GiB snapshot
  without a 1 GiB state in memory: what the InstallSnapshot benchmark measures is
  the transfer's memory, not the machine's).

Either machine takes a snapshot when it applies an entry whose body is
``!snapshot`` (once that batch is applied), so every member snapshots at the same
index when that entry is the last one written.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path

from twisted.internet.defer import Deferred, succeed
from twisted.python.failure import Failure
from zope.interface import implementer

from dledger.hookspecs import hookimpl
from dledger.interfaces import IStateMachine
from dledger.testing.statemachine import DictMachine

ENV_KIND = "DLEDGER_TEST_SM"
ENV_BYTES = "DLEDGER_TEST_SM_BYTES"
SNAPSHOT_BODY = b"!snapshot"
STATE_FILE = "testsm-state.json"
#: Bytes a BlobMachine hands its writer at a time (each write waits for the writer: flow control).
PIECE = 1 << 20


def install(directory: str | Path) -> str:
    """Make ``directory`` a path entry that exposes this module as the ``testsm`` dledger plugin; returns it."""
    d = Path(directory)
    info = d / "dledger_testsm-0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: dledger-testsm\nVersion: 0.0\n", encoding="utf-8")
    (info / "entry_points.txt").write_text("[dledger]\ntestsm = dledger.testing.smplugin\n", encoding="utf-8")
    return str(d)


def child_environment(directory: str | Path, kind: str, size: int = 0) -> dict[str, str]:
    """Environment variables that load the plugin from ``directory`` with machine ``kind`` in a child."""
    path = install(directory)
    old = os.environ.get("PYTHONPATH", "")
    return {"PYTHONPATH": os.pathsep.join(p for p in (path, old) if p), ENV_KIND: kind, ENV_BYTES: str(size)}


def _pattern(k: int, size: int) -> bytes:
    """Piece ``k`` of a blob: cheap to generate, different for every piece (so a misplaced piece is noticed)."""
    word = (k * 0x9E3779B97F4A7C15 & 0xFFFFFFFFFFFFFFFF).to_bytes(8, "big")
    return (word * (size // 8 + 1))[:size]


@implementer(IStateMachine)
class BlobMachine:
    """A machine whose snapshot is ``size`` bytes made on the fly; restore reads them all and checks their CRC."""

    name = "blob"

    def __init__(self, size: int):
        self.size = size
        self.applied = 0
        self.restored_bytes = 0
        self.restore_ok: bool | None = None

    def apply(self, entries):
        self.applied += len(entries)

    def snapshot(self, writer):
        """Write ``size`` bytes piece by piece, each after the writer took the one before (a loop, not recursion:
        a writer's Deferred may fire at once)."""
        return _pump(lambda k, left: writer.write(_pattern(k, min(PIECE, left))), self.size)

    def restore(self, reader):
        seen = {"n": 0, "crc": 0}

        def step(k, left):
            def got(data):
                seen["n"] += len(data)
                seen["crc"] = zlib.crc32(data, seen["crc"])
                return len(data)

            return reader.read(PIECE).addCallback(got)

        def finished(_):
            self.restored_bytes = seen["n"]
            self.restore_ok = seen["n"] == self.size

        return _pump(step, None).addCallback(finished)


def _pump(step, size: int | None) -> Deferred:
    """Call ``step(k, left)`` until ``size`` bytes went (or, with ``size`` None, until a step returns 0 bytes)."""
    done: Deferred = Deferred()
    state = {"k": 0, "left": size}

    def run(_=None):
        while True:
            left = state["left"]
            if left is not None and left <= 0:
                done.callback(None)
                return
            k = state["k"]
            state["k"] += 1
            d = step(k, left)
            result: list = []
            d.addBoth(result.append)
            if not result:  # not yet: go on when it fires (its value is in ``result``, taken by addBoth)
                d.addCallback(lambda _, got=result: later(got[0]))
                return
            if isinstance(result[0], Failure):
                done.errback(result[0])
                return
            if not advance(result[0]):
                done.callback(None)
                return

    def later(outcome) -> None:
        if isinstance(outcome, Failure):
            done.errback(outcome)
        elif advance(outcome):
            run()
        else:
            done.callback(None)

    def advance(n) -> bool:
        if state["left"] is None:
            return bool(n)
        state["left"] -= min(PIECE, state["left"])
        return True

    run()
    return done


@implementer(IStateMachine)
class _Trigger:
    """Wraps a machine: an applied ``!snapshot`` entry asks ``server.snapshots`` for a snapshot after the batch."""

    def __init__(self, machine, server, state_file: Path | None):
        self.machine = machine
        self.name = machine.name
        self.server = server
        self.state_file = state_file

    def apply(self, entries):
        result = self.machine.apply(entries)
        if self.state_file is not None:
            self._save()
        if any(bytes(e.body) == SNAPSHOT_BODY for e in entries):
            self.server.clock.callLater(0, lambda: self.server.snapshots.take().addErrback(lambda _f: None))
        return result if result is not None else succeed(None)

    def snapshot(self, writer):
        return self.machine.snapshot(writer)

    def _save(self) -> None:
        """What identifies the state (entries applied, their running CRC, the last index), replaced atomically."""
        st = self.machine.state()
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({k: st[k] for k in ("count", "digest", "last")}), encoding="utf-8")
        os.replace(tmp, self.state_file)

    def restore(self, reader):
        d = self.machine.restore(reader)

        def restored(result):
            if self.state_file is not None:
                self._save()
            return result

        return d.addCallback(restored)


@hookimpl
def dledger_state_machines(server):
    kind = os.environ.get(ENV_KIND, "")
    if kind == "dict":
        return [_Trigger(DictMachine(piece=64 * 1024), server, server.config.member_dir / STATE_FILE)]
    if kind == "blob":
        return [_Trigger(BlobMachine(int(os.environ.get(ENV_BYTES, "0") or 0)), server, None)]
    return []
