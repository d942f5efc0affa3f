"""CPU seconds of a process tree, from /proc: what ``dledger bench ingest`` charges to the ingest and to the reads.

Spark's work happens in other processes (the driver JVM, its Python workers, the Python streaming
runner), all descendants of the process that made the session; the group's members are children too
when the bench starts them, so they are left out of the tree and counted on their own.  A throughput
follows the machine's load; the CPU seconds per row do much less, so the bench reports both.
"""

from __future__ import annotations

import os


def stat_fields(line: str) -> tuple[int, float]:
    """``(ppid, CPU ticks)`` from one /proc/PID/stat line: user + system, plus those of reaped children.

    The command name (field 2) may hold spaces and parentheses: fields are counted after its last ``)``.
    """
    rest = line.rsplit(")", 1)[1].split()
    # rest[0] is the state (field 3): ppid is field 4, utime..cstime fields 14-17.
    return int(rest[1]), float(sum(int(x) for x in rest[11:15]))


def descendants(root: int, parents: dict[int, int], exclude: set[int] = frozenset()) -> set[int]:
    """``root`` and every process below it in ``parents`` (pid -> ppid), without ``exclude`` and their subtrees."""
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid in exclude or pid in out:
            continue
        out.add(pid)
        todo.extend(children.get(pid, ()))
    return out


def snapshot() -> dict[int, tuple[int, float]]:
    """``{pid: (ppid, ticks)}`` of every process readable now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as fh:
                out[int(name)] = stat_fields(fh.read())
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    return out


def tree_cpu(root: int | None = None, exclude: set[int] = frozenset()) -> float:
    """CPU seconds used so far by ``root`` (default: this process) and its descendants, ``exclude`` left out."""
    snap = snapshot()
    pids = descendants(os.getpid() if root is None else root, {p: v[0] for p, v in snap.items()}, set(exclude))
    return sum(snap[p][1] for p in pids if p in snap) / os.sysconf("SC_CLK_TCK")


def cpu_of(pids) -> float:
    """CPU seconds used so far by ``pids`` (and their reaped children); a pid that is gone counts 0."""
    snap = snapshot()
    return sum(snap[p][1] for p in pids if p in snap) / os.sysconf("SC_CLK_TCK")


def kind(pid: int, me: int) -> str:
    """Which part of a Spark process tree ``pid`` is: ``driver`` (``me``), ``jvm`` or ``python workers``."""
    if pid == me:
        return "driver"
    try:
        with open(f"/proc/{pid}/comm", encoding="ascii", errors="replace") as fh:
            return "jvm" if fh.read().strip() == "java" else "python workers"
    except OSError:
        return "python workers"


def tree_cpu_split(exclude: set[int] = frozenset()) -> dict[str, float]:
    """:func:`tree_cpu` of this process, by :func:`kind`: where a Spark ingest's CPU goes."""
    snap = snapshot()
    me = os.getpid()
    out: dict[str, float] = {}
    for pid in descendants(me, {p: v[0] for p, v in snap.items()}, set(exclude)):
        if pid in snap:
            k = kind(pid, me)
            out[k] = out.get(k, 0.0) + snap[pid][1] / os.sysconf("SC_CLK_TCK")
    return out
