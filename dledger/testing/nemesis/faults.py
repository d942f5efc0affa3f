"""What the nemesis does and when, as pure functions of a seed: fault kinds, the cuts a partition makes, schedules.

A schedule is a list of :class:`Step`: one fault kind (or a combination) with
its actions at offsets from the step's start, then a quiet gap. Targets are
roles ("leader", "follower", "any", a member of a partition's minority or
majority) resolved when the action runs, from the seeded ``rng`` and what the
group says at that moment; everything else (kinds, order, offsets, durations,
which side of a split, jump sizes) comes from the seed alone, so replaying a
seed replays the schedule (not the interleaving of real processes).

Kinds (``KINDS``; docs/testing.md "Nemesis" says what each does on the wire):

======================  =================================================================
isolate                 one member cut off from every other member (both directions)
halves                  members split into a random majority and minority
ring                    the "majorities ring": each member sees its two ring neighbours,
                        so every member sees a majority and no two see the same (n >= 5)
oneway                  one member's packets to all others dropped, or all others' to it
pause-leader            SIGSTOP the leader, SIGCONT later
pause-follower          SIGSTOP one follower, SIGCONT later
kill                    SIGKILL one member (the leader half of the time), restart later
clock-jump              one member's clock (libfaketime) jumps by -30..+30 s, back later
clock-drift             one member's clock gains or loses 0.2-0.5 s every second
kill-in-partition       halves, then the majority side's leader is killed mid-partition
heal-in-election        the leader is isolated, then healed 0.2-1.2 s later (mid-election)
======================  =================================================================

Partitions are between members only: the clients and the broker's name server are
never cut off, as Jepsen's control node reaches every node.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

NET = ("isolate", "halves", "ring", "oneway")
PROCESS = ("pause-leader", "pause-follower", "kill")
CLOCK = ("clock-jump", "clock-drift")
COMBINED = ("kill-in-partition", "heal-in-election")
KINDS = NET + PROCESS + CLOCK + COMBINED


@dataclass(frozen=True)
class Action:
    """One thing done at ``at`` seconds into its step: ``op`` with its arguments."""

    at: float
    op: str  # cut | heal | stop | cont | kill | restart | clock | drift | noop
    args: tuple = ()


@dataclass
class Step:
    """One fault of a schedule: its kind, its actions, how long it lasts, the quiet gap after it."""

    kind: str
    start: float
    duration: float
    actions: list[Action] = field(default_factory=list)
    gap: float = 1.0


def ring_cuts(members: list[str]) -> set[tuple[str, str]]:
    """The majorities ring: member i keeps links to i-1 and i+1 (mod n) only; every other pair is cut both ways."""
    n = len(members)
    keep = {frozenset((members[i], members[(i + 1) % n])) for i in range(n)}
    return {(a, b) for a in members for b in members if a != b and frozenset((a, b)) not in keep}


def split_cuts(side_a: list[str], side_b: list[str]) -> set[tuple[str, str]]:
    """Every link between the two sides cut, both directions."""
    return {(a, b) for a in side_a for b in side_b} | {(b, a) for a in side_a for b in side_b}


def oneway_cuts(member: str, others: list[str], outgoing: bool) -> set[tuple[str, str]]:
    """``member``'s packets to every other dropped (``outgoing``), or every other's packets to it."""
    return {(member, o) for o in others} if outgoing else {(o, member) for o in others}


def halves(members: list[str], rng: random.Random) -> tuple[list[str], list[str]]:
    """A random (majority, minority) split."""
    shuffled = list(members)
    rng.shuffle(shuffled)
    k = len(members) // 2 + 1
    return sorted(shuffled[:k]), sorted(shuffled[k:])


def available_kinds(members: int, clock: bool) -> tuple[str, ...]:
    """The kinds that make sense for ``members`` members (the ring needs 5; clock kinds need libfaketime)."""
    return tuple(k for k in KINDS if (k != "ring" or members >= 5) and (clock or k not in CLOCK))


def make_step(kind: str, start: float, rng: random.Random, members: list[str]) -> Step:
    """The actions of one ``kind`` of fault starting at ``start`` (its random parts drawn from ``rng``)."""
    d = round(rng.uniform(1.5, 5.0), 2)
    acts: list[Action] = []
    if kind == "isolate":
        acts = [Action(0, "cut", ("isolate", rng.choice(["leader", "any"]))), Action(d, "heal")]
    elif kind == "halves":
        major, minor = halves(members, rng)
        acts = [Action(0, "cut", ("split", tuple(major), tuple(minor))), Action(d, "heal")]
    elif kind == "ring":
        order = list(members)
        rng.shuffle(order)
        acts = [Action(0, "cut", ("ring", tuple(order))), Action(d, "heal")]
    elif kind == "oneway":
        acts = [Action(0, "cut", ("oneway", rng.choice(["leader", "any"]), rng.random() < 0.5)), Action(d, "heal")]
    elif kind == "pause-leader":
        acts = [Action(0, "stop", ("leader",)), Action(d, "cont")]
    elif kind == "pause-follower":
        acts = [Action(0, "stop", ("follower",)), Action(d, "cont")]
    elif kind == "kill":
        acts = [Action(0, "kill", (rng.choice(["leader", "any"]),)), Action(d, "restart")]
    elif kind == "clock-jump":
        jump = round(rng.choice([-1, 1]) * rng.uniform(3, 30), 1)
        acts = [Action(0, "clock", (rng.choice(["leader", "any"]), jump)), Action(d, "clock-reset")]
    elif kind == "clock-drift":
        rate = round(rng.choice([-1, 1]) * rng.uniform(0.2, 0.5), 2)
        acts = [Action(0, "drift", (rng.choice(["leader", "any"]), rate)), Action(d, "clock-reset")]
    elif kind == "kill-in-partition":
        major, minor = halves(members, rng)
        mid = round(d * rng.uniform(0.2, 0.6), 2)
        acts = [Action(0, "cut", ("split", tuple(major), tuple(minor))),
                Action(mid, "kill", ("leader-of", tuple(major))),
                Action(round(mid + rng.uniform(0.5, 2.0), 2), "restart"),
                Action(max(d, mid + 2.1), "heal")]
        d = max(d, mid + 2.1)
    elif kind == "heal-in-election":
        d = round(rng.uniform(0.2, 1.2), 2)
        acts = [Action(0, "cut", ("isolate", "leader")), Action(d, "heal")]
    else:
        raise ValueError(f"unknown fault kind {kind!r}: one of {', '.join(KINDS)}")
    return Step(kind, start, d, acts, gap=round(rng.uniform(0.5, 2.5), 2))


def schedule(seed: int, seconds: float, members: list[str], kinds: tuple[str, ...]) -> list[Step]:
    """The seeded schedule: steps of random kinds (each kind in turn first, so a short run sees many), back to back
    with their gaps, until ``seconds`` are filled."""
    if not kinds:
        raise ValueError("no fault kinds to schedule")
    rng = random.Random(seed)
    order = list(kinds)
    rng.shuffle(order)
    steps: list[Step] = []
    t = round(rng.uniform(0.5, 1.5), 2)
    while t < seconds:
        kind = order[len(steps)] if len(steps) < len(order) else rng.choice(kinds)
        step = make_step(kind, t, rng, members)
        steps.append(step)
        t = round(t + step.duration + step.gap, 2)
    return steps


def parse_kinds(text: str | None, available: tuple[str, ...]) -> tuple[str, ...]:
    """``"isolate,kill"`` -> those kinds (``None`` or ``"all"``: every available one); ValueError naming a bad one."""
    if not text or text == "all":
        return available
    kinds = tuple(k.strip() for k in text.split(",") if k.strip())
    bad = [k for k in kinds if k not in KINDS]
    if bad:
        raise ValueError(f"unknown fault kind {bad[0]!r}: one of {', '.join(KINDS)}")
    missing = [k for k in kinds if k not in available]
    if missing:
        raise ValueError(f"fault kind {missing[0]!r} is not available here (the ring needs 5 members, clock "
                         f"faults need libfaketime)")
    return kinds
