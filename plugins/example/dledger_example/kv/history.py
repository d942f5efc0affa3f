"""Recording a kv history and checking it: what the tests (and the nemesis) use to show the map is linearizable.

:class:`KVHistory` records each operation's invocation and completion (with :class:`RecordingKV`
wrapping a :class:`.client.KVClient`).  Two checks:

* :func:`kv_violations` -- against the group's final committed log (``{index: body}``): the log,
  replayed through the machine's own rules, must explain every reply (each acknowledged write is in
  it with the outcome its client got, each get's value is the key's value at the index it read at),
  and real time must agree with log order (a write acknowledged before a get started is at or below
  the get's index; a write a get saw was invoked before the get returned; writes ordered in real time
  are ordered in the log).  Cheap: histories of any length.
* :func:`kv_linearizable` -- the exhaustive search (Wing & Gong), per key, with no log: for short
  histories, to cross-check the reduction above (as ``dledger.testing.checker`` does for the log).

Writes whose outcome is unknown (an error or no answer) may or may not have happened; both checks
allow either.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field

from dledger_example.kv.codec import NotKV, Op, Reply, decode_op
from dledger_example.kv.machine import apply_op


@dataclass
class KVOp:
    """One client operation: ``kind`` get/put/delete/cas on ``key``; ``reply`` None until (unless) it succeeded."""

    kind: str
    client: str
    key: str
    invoked: float
    value: bytes | None = None      # put: the value; cas: the new value
    expected: bytes | None = None   # cas
    op_id: bytes | None = None      # writes
    completed: float | None = None
    reply: Reply | None = None
    error: str | None = None

    @property
    def write(self) -> bool:
        return self.kind != "get"


@dataclass
class KVHistory:
    ops: list[KVOp] = field(default_factory=list)

    def invoke(self, kind: str, client: str, key: str, now: float, **kw) -> KVOp:
        op = KVOp(kind, client, key, now, **kw)
        self.ops.append(op)
        return op

    @staticmethod
    def complete(op: KVOp, now: float, reply: Reply | None = None, error: str | None = None) -> None:
        op.completed, op.reply, op.error = now, reply, error


class RecordingKV:
    """A :class:`.client.KVClient` whose every call is recorded in ``history`` (times from ``clock.seconds()``)."""

    def __init__(self, kv, history: KVHistory, clock, name: str):
        self.kv, self.history, self.clock, self.name = kv, history, clock, name

    def _run(self, op: KVOp, d):
        def ok(reply):
            KVHistory.complete(op, self.clock.seconds(), reply)
            return reply

        def failed(f):
            KVHistory.complete(op, self.clock.seconds(), error=str(f.value))
            return f

        return d.addCallbacks(ok, failed)

    def read(self, key: str):
        op = self.history.invoke("get", self.name, key, self.clock.seconds())
        return self._run(op, self.kv.read(key))

    def write(self, kv_op: Op):
        op = self.history.invoke(kv_op.kind, self.name, kv_op.key, self.clock.seconds(), value=kv_op.value,
                                 expected=kv_op.expected, op_id=kv_op.op_id)
        return self._run(op, self.kv.write(kv_op))

    def put(self, key: str, value: bytes):
        from dledger_example.kv.client import new_op_id

        return self.write(Op("put", new_op_id(), key, value))

    def delete(self, key: str):
        from dledger_example.kv.client import new_op_id

        return self.write(Op("delete", new_op_id(), key))

    def cas(self, key: str, expected: bytes | None, new: bytes | None):
        from dledger_example.kv.client import new_op_id

        return self.write(Op("cas", new_op_id(), key, new, expected))


def replay(log: dict[int, bytes]) -> tuple[dict[bytes, Reply], dict[str, list[tuple[int, bytes | None]]]]:
    """The log through the machine's rules: ``(outcome by op id, key -> [(index, value after)] in log order)``."""
    data: dict = {}
    outcomes: dict[bytes, Reply] = {}
    versions: dict[str, list[tuple[int, bytes | None]]] = defaultdict(list)
    for index in sorted(log):
        try:
            op = decode_op(log[index])
        except (NotKV, ValueError):
            continue
        if op.op_id in outcomes:
            continue
        outcomes[op.op_id] = apply_op(data, op, index)
        current = data.get(op.key)
        versions[op.key].append((index, current[0] if current is not None else None))
    return outcomes, versions


def value_at(versions: list[tuple[int, bytes | None]], index: int) -> bytes | None:
    value = None
    for i, v in versions:
        if i > index:
            break
        value = v
    return value


def kv_violations(history: KVHistory, log) -> list[str]:
    """What in ``history`` the committed ``log`` and real time cannot explain (empty: linearizable).

    ``log``: ``{index: body}``, or the committed entries (what ``Cluster.converged()`` returns).
    """
    if not isinstance(log, dict):
        log = {entry.index: entry.body for entry in log}
    problems: list[str] = []
    outcomes, versions = replay(log)
    index_of = {op_id: reply.index for op_id, reply in outcomes.items()}
    writes = [op for op in history.ops if op.write]
    for op in writes:
        if op.reply is None:
            continue
        first = outcomes.get(op.op_id)
        if first is None:
            problems.append(f"lost: {op.client}'s {op.kind} of {op.key!r} was acknowledged at {op.reply.index} but "
                            "is not in the committed log")
        elif first != op.reply:
            problems.append(f"{op.client}'s {op.kind} of {op.key!r} got {op.reply} but the log gives {first}")
    logged = sorted(((index_of[op.op_id], op) for op in writes if op.op_id in index_of), key=lambda t: t[0])
    # Real time vs log order among writes: b acknowledged before a was invoked, yet a is earlier in the log.
    acked = sorted(((op.completed, index_of[op.op_id], op) for op in writes if op.reply is not None
                    and op.op_id in index_of), key=lambda t: t[0])
    for idx, op in logged:
        for done, jdx, other in acked:
            if done >= op.invoked:
                break
            if jdx > idx:
                problems.append(f"{other.client}'s {other.kind} of {other.key!r} (entry {jdx}) was acknowledged "
                                f"before {op.client}'s {op.kind} (entry {idx}) started, yet comes after it")
    for get in (op for op in history.ops if op.kind == "get" and op.reply is not None):
        at = get.reply.index
        expected = value_at(versions.get(get.key, []), at)
        got = get.reply.value if get.reply.ok else None
        if got != expected:
            problems.append(f"{get.client}'s get of {get.key!r} at index {at} read {got!r}, the log says {expected!r}")
        for done, idx, op in acked:
            if done >= get.invoked:
                break
            if idx > at:
                problems.append(f"stale read: {get.client}'s get of {get.key!r} read at {at}, but a {op.kind} at "
                                f"entry {idx} was acknowledged before it started")
        for idx, op in logged:
            if idx <= at and op.invoked > get.completed:
                problems.append(f"{get.client}'s get of {get.key!r} read at {at}, which includes entry {idx} "
                                "of a write invoked after the get returned")
    return problems


def _step(state: bytes | None, op: KVOp) -> tuple[bytes | None, Reply | None]:
    """``op`` on a key holding ``state``: the new state and what it answers (index left out: 0)."""
    data = {} if state is None else {op.key: (state, 0)}
    if op.kind == "get":
        return state, Reply(state is not None, 0, state)
    reply = apply_op(data, Op(op.kind, b"", op.key, op.value, op.expected), 0)
    return (data[op.key][0] if op.key in data else None), reply


def _matches(op: KVOp, reply: Reply) -> bool:
    """Whether the model's ``reply`` is what ``op`` got (the values a reply carries for its kind and outcome)."""
    got = op.reply
    if got.ok != reply.ok:
        return False
    if op.kind == "get" or (op.kind == "delete" and got.ok) or (op.kind == "cas" and not got.ok):
        return got.value == reply.value
    return True


def kv_linearizable(history: KVHistory, max_ops: int = 14) -> bool:
    """Exhaustive search: can every key's operations be ordered consistently with real time and a map? (short only)"""
    by_key: dict[str, list[KVOp]] = defaultdict(list)
    for op in history.ops:
        if op.reply is not None or op.write:  # a get with no answer tells nothing
            by_key[op.key].append(op)
    for key, ops in by_key.items():
        if len(ops) > max_ops:
            raise ValueError(f"{len(ops)} operations on {key!r}: too many for the exhaustive search")
        if not _key_linearizable(ops):
            return False
    return True


def _key_linearizable(ops: list[KVOp]) -> bool:
    end = [op.completed if op.reply is not None else math.inf for op in ops]
    seen: set = set()

    def search(done: frozenset, state) -> bool:
        if (done, state) in seen:
            return False
        seen.add((done, state))
        left = [i for i in range(len(ops)) if i not in done]
        if all(ops[i].reply is None for i in left):
            return True  # the rest may never have happened
        horizon = min(end[i] for i in left)
        for i in left:
            op = ops[i]
            if op.invoked > horizon:
                continue
            new, reply = _step(state, op)
            if op.reply is not None and not _matches(op, reply):
                continue
            if search(done | {i}, new):
                return True
        return False

    return search(frozenset(), None)
