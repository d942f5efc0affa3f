"""The kv workload (issue #24 (b)): the example plugin's replicated map (``dledger_example.kv``) under the faults.

Members run with ``--plugin-opt kv.enabled=true``. Each client is a :class:`dledger_example.kv.client.KVClient`
wrapped in :class:`dledger_example.kv.history.RecordingKV`, doing gets, puts and compare-and-sets on a handful
of keys (a cas expects the value its client read last). The kv client retries an ambiguous write under the same
operation id and the machine applies it once, so a write's outcome is what its first application answered.
The verdict is the plugin's own :func:`~dledger_example.kv.history.kv_violations` against the members' committed
logs (lost or mis-answered writes, stale reads, reads of the future, writes out of real-time order), plus the
log-level divergence check of :mod:`.logcheck`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater
from zope.interface import implementer

from dledger.interfaces import INemesisWorkload
from dledger.testing.nemesis.workload import ClientWorkload

KEYS = [f"k{i}" for i in range(4)]


def available() -> str | None:
    """Why the kv workload cannot run here (the example plugin's kv map is not installed), or None."""
    try:
        import dledger_example.kv.history  # noqa: F401
    except ImportError as exc:
        return f"the kv map (dledger_example.kv) is not installed: {exc}"
    return None


@implementer(INemesisWorkload)
class KVWorkload(ClientWorkload):
    def __init__(self, run: Any, peers: str, rng: random.Random, clients: int):
        from dledger_example.kv.history import KVHistory
        super().__init__(run, peers, rng, clients, KVHistory())

    async def start(self) -> None:
        from dledger_example.kv.client import KVClient
        from dledger_example.kv.history import RecordingKV

        clients = self.connect()
        kvs = [RecordingKV(KVClient(c), self.history, self.reactor, f"c{k}") for k, c in enumerate(clients)]
        self.done = gatherResults([Deferred.fromCoroutine(self._loop(k, kv)) for k, kv in enumerate(kvs)])

    async def _loop(self, k: int, kv: Any) -> None:
        seq = 0
        last: dict[str, bytes | None] = {}
        while self.running:
            key = self.rng.choice(KEYS)
            roll = self.rng.random()
            before = len(self.history.ops)
            try:
                if roll < 0.4:
                    reply = await kv.read(key)
                    last[key] = reply.value if reply.ok else None
                elif roll < 0.7:
                    seq += 1
                    await kv.put(key, f"c{k}-{seq}".encode())
                else:
                    seq += 1
                    reply = await kv.cas(key, last.get(key), f"c{k}-{seq}".encode())
                    if not reply.ok:
                        last[key] = reply.value
            except Exception:
                pass
            op = self.history.ops[before] if len(self.history.ops) > before else None
            if op is not None:
                outcome = "ok" if op.reply is not None else "timeout" if "TIMEOUT" in (op.error or "") else "failed"
                self.spans.append((op.invoked, op.completed, outcome))
            await deferLater(self.reactor, self.rng.uniform(0.002, 0.02), lambda: None)

    async def finish(self, result: Any) -> None:
        ops = self.history.ops
        self.tally(result, sum(1 for op in ops if op.reply is not None),
                   sum(1 for op in ops if "TIMEOUT" in (op.error or "")))


def check_kv(history: Any, logs: dict[str, dict[int, bytes]]) -> list[str]:
    """The plugin's verdict on ``history`` against the merged committed logs, plus divergences between members."""
    from dledger_example.kv.history import kv_violations

    from dledger.testing.nemesis.logcheck import merge_committed
    log, problems = merge_committed(logs)
    return problems + kv_violations(history, log)


def write_kv_history(path: Path, history: Any) -> None:
    """The kv history as JSON lines (values and op ids latin-1 / hex)."""
    with Path(path).open("w", encoding="utf-8") as fh:
        for op in history.ops:
            reply = op.reply
            fh.write(json.dumps({
                "kind": op.kind, "client": op.client, "key": op.key, "invoked": op.invoked,
                "completed": op.completed, "error": op.error,
                "value": None if op.value is None else op.value.decode("latin-1"),
                "expected": None if op.expected is None else op.expected.decode("latin-1"),
                "op_id": None if op.op_id is None else op.op_id.hex(),
                "reply": None if reply is None else {
                    "ok": reply.ok, "index": reply.index,
                    "value": None if reply.value is None else reply.value.decode("latin-1")}}) + "\n")
