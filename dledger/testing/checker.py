"""History recording and the safety checks run after every simulated schedule.

* **lost** -- an acknowledged append is missing from its acknowledged index
  on some member's final committed log;
* **divergent** -- two members (or one member at two times) committed
  different entries at the same index, or a member lost part of a prefix it
  had committed (it must hold what it committed, durably);
* **two leaders in a term** (see :mod:`dledger.testing.election_sim`);
* **non-linearizable** -- the append/get history cannot be ordered
  consistently with real time and the committed log.

The log is a sequence of immutable slots, so linearizability reduces to a
few real-time conditions checked against the final committed log ``L``
(:func:`linearizability_violations`); :func:`wing_gong_linearizable` is the
exhaustive search for short histories that cross-checks that reduction.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field


@dataclass
class Op:
    """One client operation: an append of ``body`` or a get of ``index``."""

    kind: str  # "append" | "get"
    client: str
    invoked: float
    body: bytes | None = None
    index: int | None = None  # acknowledged index (append) or requested index (get)
    completed: float | None = None
    ok: bool | None = None  # append: acknowledged; get: found an entry
    result: bytes | None = None  # get: body found
    error: str | None = None


@dataclass
class History:
    """Invocations and completions, in the order they happened."""

    ops: list[Op] = field(default_factory=list)

    def invoke(self, kind: str, client: str, now: float, **kw) -> Op:
        op = Op(kind, client, now, **kw)
        self.ops.append(op)
        return op

    @staticmethod
    def complete(op: Op, now: float, *, ok: bool, index: int | None = None, result: bytes | None = None,
                 error: str | None = None) -> None:
        op.completed, op.ok, op.error = now, ok, error
        if index is not None:
            op.index = index
        if result is not None:
            op.result = result

    @property
    def acked(self) -> list[Op]:
        return [op for op in self.ops if op.kind == "append" and op.ok]


class CommittedLog:
    """Every entry any member ever reported committed, by index: the first one seen wins, others must agree."""

    def __init__(self):
        self.entries: dict[int, tuple[int, bytes]] = {}  # index -> (term, body)
        self.divergences: list[str] = []

    def observe(self, member: str, index: int, term: int, body: bytes) -> None:
        seen = self.entries.setdefault(index, (term, body))
        if seen != (term, body):
            self.divergences.append(f"{member} committed (term {term}, {body[:20]!r}) at {index}, "
                                    f"but (term {seen[0]}, {seen[1][:20]!r}) was committed there before")

    def bodies(self) -> dict[int, bytes]:
        return {i: body for i, (_, body) in self.entries.items()}


def lost_appends(history: History, logs: dict[str, list]) -> list[str]:
    """Acknowledged appends not at their index in some member's committed log (``logs``: member -> entries)."""
    out = []
    for member, entries in logs.items():
        by_index = {e.index: e.body for e in entries}
        for op in history.acked:
            if by_index.get(op.index) != op.body:
                got = by_index.get(op.index)
                out.append(f"append {op.body[:20]!r} acknowledged at {op.index} but {member} has "
                           f"{None if got is None else got[:20]!r}")
    return out


def linearizability_violations(history: History, log: dict[int, bytes]) -> list[str]:
    """Real-time conditions a linearizable append/get history over an immutable-slot log satisfies.

    ``log`` maps index -> body of the final committed log.  Witnesses "index
    k is visible at time t" are acknowledged appends and found gets.  Then:
    an acknowledged append holds its slot; no acknowledged append begins
    after an index at or past its own was already visible; a found get read
    the committed body of something already invoked; a get that found
    nothing did not begin after its index was visible.
    """
    out: list[str] = []
    acked = history.acked
    first_invoked: dict[bytes, float] = {}
    for op in history.ops:
        if op.kind == "append":
            first_invoked[op.body] = min(first_invoked.get(op.body, op.invoked), op.invoked)
    witnesses = [(op.completed, op.index) for op in acked]
    witnesses += [(op.completed, op.index) for op in history.ops if op.kind == "get" and op.ok]
    witnesses.sort()
    prefix_max = list(itertools.accumulate((k for _, k in witnesses), max))
    times = [t for t, _ in witnesses]

    def visible_before(t: float) -> int:
        k = bisect.bisect_left(times, t)
        return prefix_max[k - 1] if k else -1

    for op in acked:
        if log.get(op.index) != op.body:
            out.append(f"append {op.body[:20]!r} acknowledged at {op.index} but the log holds "
                       f"{(log.get(op.index) or b'')[:20]!r}")
        seen = visible_before(op.invoked)
        if seen >= op.index:
            out.append(f"append acknowledged at {op.index} was invoked after index {seen} was already visible")
    for op in history.ops:
        if op.kind != "get" or op.completed is None:
            continue
        if op.ok:
            if log.get(op.index) != op.result:
                out.append(f"get({op.index}) returned {op.result[:20]!r}, the log holds "
                           f"{(log.get(op.index) or b'')[:20]!r}")
            elif first_invoked.get(op.result, float("inf")) > op.completed:
                out.append(f"get({op.index}) returned {op.result[:20]!r} before it was appended")
        elif op.error == "INDEX_OUT_OF_RANGE":
            seen = visible_before(op.invoked)
            if seen >= op.index:
                out.append(f"get({op.index}) found nothing although index {seen} was visible before it "
                           f"started (stale read)")
    return out


def wing_gong_linearizable(history: History, log: dict[int, bytes], max_ops: int = 12) -> bool:
    """Exhaustive Wing & Gong search over a short history against a sequential log.

    The sequential object is the log's visible prefix: an acknowledged append
    of ``b`` at ``i`` makes slots up to ``i`` visible (slots in between are
    filled by appends nobody was told about -- NOOPs, unacknowledged or
    retried ones -- unless an acknowledged append still to be placed owns
    one); a get returns the body of a visible slot or "nothing".  Used only
    to cross-check :func:`linearizability_violations` on small histories.
    """
    ops = [op for op in history.ops if op.completed is not None
           and ((op.kind == "append" and op.ok) or (op.kind == "get" and (op.ok or op.error == "INDEX_OUT_OF_RANGE")))]
    if len(ops) > max_ops:
        raise ValueError(f"history of {len(ops)} ops is too long for the exhaustive search")

    def free(done: frozenset, current: int, lo: int, hi: int) -> bool:
        return not any(j not in done and j != current and op.kind == "append" and lo <= op.index <= hi
                       for j, op in enumerate(ops))

    def search(done: frozenset, visible: int) -> bool:
        if len(done) == len(ops):
            return True
        pending = [i for i in range(len(ops)) if i not in done]
        earliest_end = min(ops[i].completed for i in pending)
        for i in pending:
            op = ops[i]
            if op.invoked > earliest_end:
                continue  # a pending op completed before this one began: it goes first
            if op.kind == "append":
                ok = (op.index >= visible and log.get(op.index) == op.body
                      and free(done, i, visible, op.index - 1))
                if ok and search(done | {i}, op.index + 1):
                    return True
            elif op.ok:
                if log.get(op.index) != op.result:
                    continue
                if op.index < visible:
                    if search(done | {i}, visible):
                        return True
                elif free(done, i, visible, op.index) and search(done | {i}, op.index + 1):
                    return True
            elif op.index >= visible and search(done | {i}, visible):
                return True
        return False

    return search(frozenset(), 0)
