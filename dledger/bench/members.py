"""``dledger bench members``: the write outage of each kind of membership change, and a learner's catch-up.

Three ``twistd dledger`` members on 127.0.0.1 (the best durable store, the ``fast`` preset with a 5 s
push timeout) take a
steady write load (four writers, one 64-byte append in flight each:
:class:`dledger.bench.writeload.WriteLoad`).  Then, one at a time: add a learner, promote it, remove a
follower, remove the leader (it hands leadership over), replace a follower (add, automatic
promotion, remove).  For each, the longest time without an acknowledged append from just before the
command to the first acknowledgement half a second after its answer -- next to the same figure for a
quiet window as long, which is what the machine's own hiccups cost.  Then, without the load, ``--size-mib``
MiB of entries are written and a new learner catches up on all of them: seconds and MB/s.
Every acknowledged append is checked to be in the log exactly once at the end.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.task import deferLater

from dledger.bench.runner import progress, run_benchmark
from dledger.bench.writeload import WriteLoad, load_client
from dledger.commands.argtypes import positive_int
from dledger.errors import ConfigError
from dledger.launcher import LocalGroup, durable_store

MiB = 1 << 20
#: What a change's window includes after its answer: a removed leader's hand-over, the writers' reconnection.
TAIL = 0.5
#: The fast preset's 300 ms for a push to be answered is less than a 1 MiB push with its fsync takes on a
#: loaded machine: the learner's catch-up then times out push after push and never progresses (seen on the
#: shared 2-vCPU VM at load 17).  The other timers stay the fast preset's.
PUSH_TIMEOUT_MS = 5000


@dataclass
class Options:
    size_mib: int = 1024
    entry_kib: int = 64
    max_pending: int = 1000
    directory: str | None = None
    keep: bool = False
    json: bool = False


def register(bench_subparsers) -> None:
    """Add ``members`` to ``dledger bench``'s sub-commands."""
    import argparse

    p = bench_subparsers.add_parser(
        "members", help="write outage of each membership change; a learner's catch-up time",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size-mib", type=positive_int, default=1024,
                   help="MiB of entries the learner catches up on (default 1024: 1 GiB)")
    p.add_argument("--entry-kib", type=positive_int, default=64, help="size of those entries in KiB (default 64)")
    p.add_argument("--max-pending", type=positive_int, default=1000,
                   help="maxPendingSize of the group: pushes in flight to one follower (default 1000, the option's "
                        "default)")
    p.add_argument("--quick", action="store_true", help="a tiny run (8 MiB; keeps the benchmark working in tests)")
    p.add_argument("--dir", dest="directory", help="directory for stores and logs (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the directory afterwards")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.set_defaults(func=cmd_bench_members)


def cmd_bench_members(args) -> int:
    opts = Options(size_mib=8 if args.quick else args.size_mib, entry_kib=args.entry_kib, max_pending=args.max_pending,
                   directory=args.directory, keep=args.keep, json=args.json)
    if durable_store() is None:
        raise ConfigError("dledger bench members needs a durable store (pip install dledger[mmap])")
    return run_benchmark(lambda reactor, say: run(reactor, opts, say), format_results, as_json=opts.json)


async def pause(reactor: Any, seconds: float) -> None:
    await deferLater(reactor, seconds, lambda: None)


async def timed_change(reactor: Any, load: WriteLoad, what: str, call, say) -> dict:
    """Run ``call()`` (a change); the outage over its window and, as a baseline, over a quiet one as long."""
    began = reactor.seconds()
    view = await call()
    answered = reactor.seconds()
    load.learn(view.configuration)
    await pause(reactor, TAIL)
    ended = await load.resumed(reactor.seconds())  # the window holds the whole outage, however long
    outage = load.longest_gap(began, ended)
    quiet_start = reactor.seconds()
    await pause(reactor, ended - began)
    baseline = load.longest_gap(quiet_start, reactor.seconds())
    say(f"{what}: answered in {answered - began:.2f}s, longest gap {outage.seconds:.3f}s "
        f"(quiet window: {baseline.seconds:.3f}s)")
    return {"change": what, "answered_seconds": round(answered - began, 3), "outage_seconds": round(outage.seconds, 3),
            "baseline_seconds": round(baseline.seconds, 3),
            "acks_in_window": load.acks_between(began, ended)}


async def join(group: LocalGroup, admin: Any) -> str:
    new = group.new_member()
    group.start(new.id)
    await group.wait_ready(admin, new.id, 60)
    return new.id


async def run(reactor: Any, opts: Options, say=progress) -> dict:
    base = Path(opts.directory) if opts.directory else Path(tempfile.mkdtemp(prefix="dledger-bench-members-"))
    group = LocalGroup(base / "group", n=3, store=durable_store(), preset="fast", reactor=reactor,
                       options={"maxPushTimeOutMs": PUSH_TIMEOUT_MS, "maxPendingSize": opts.max_pending})
    admin = group.client(request_timeout=5.0)
    load = WriteLoad(reactor, lambda: load_client(group))
    try:
        leader = (await group.start_and_wait(60)).leader_id
        load.start()
        await group.wait_for(lambda: len(load.acked) >= 100, 60, "the first acknowledged appends")
        changes = []
        learner = await join(group, admin)
        changes.append(await timed_change(reactor, load, f"add learner {learner}",
                                          lambda: admin.add_member(learner, group.address(learner), learner=True),
                                          say))
        changes.append(await timed_change(reactor, load, f"promote {learner}",
                                          lambda: admin.promote_member(learner), say))
        follower = next(m for m in group.ids if m not in (leader, learner))
        changes.append(await timed_change(reactor, load, f"remove follower {follower}",
                                          lambda: admin.remove_member(follower), say))
        group.retire(follower)
        leader = (await admin.find_leader()).leader_id
        changes.append(await timed_change(reactor, load, f"remove leader {leader}",
                                          lambda: admin.remove_member(leader), say))
        group.retire(leader)
        leader = (await admin.find_leader()).leader_id
        old = next(m for m in group.ids if m != leader)
        new = await join(group, admin)
        changes.append(await timed_change(reactor, load, f"replace follower {old} by {new}",
                                          lambda: admin.replace_member(old, new, group.address(new)), say))
        group.retire(old)
        await load.stop()
        catch_up = await learner_catch_up(reactor, group, admin, opts, say)
        await group.wait_converged(admin, 120)
        await admin.close()
        await group.stop_all()
        logs = await group.read_logs()
        check = load.check(e.body for e in logs[group.ids[0]].entries)
        return {"store": group.store, "changes": changes, "catch_up": catch_up, "check": check.describe(),
                "check_ok": check.ok, "writers": load.writers, "acknowledged": len(load.acked),
                "failed": dict(load.failed)}
    finally:
        load.running = False
        group.close()
        if not opts.keep and not opts.directory:
            shutil.rmtree(base, ignore_errors=True)


async def learner_catch_up(reactor: Any, group: LocalGroup, admin: Any, opts: Options, say) -> dict:
    """Write ``size_mib`` MiB, then time a new learner from ``members add`` until it holds all of it."""
    entry = opts.entry_kib * 1024
    batch = max(1, min(16, (4 * MiB) // entry))
    total = opts.size_mib * MiB
    say(f"writing {opts.size_mib} MiB in {opts.entry_kib} KiB entries")
    written = 0
    while written < total:
        n = min(batch, max(1, (total - written) // entry))
        await admin.append_batch([b"c" * entry] * n)
        written += n * entry
    target = (await admin.find_leader()).ledger_end_index
    new = await join(group, admin)
    say(f"{new} joins as a learner and catches up on {written / MiB:.0f} MiB (to index {target})")
    began = reactor.seconds()
    view = await admin.add_member(new, group.address(new), learner=True)
    for c in (admin,):
        c.learn(view.configuration)

    async def caught_up():
        meta = await group.metadata(admin, new, timeout=1.0)
        return meta is not None and meta.ledger_end_index is not None and meta.ledger_end_index >= target

    await group.wait_for(caught_up, max(600.0, opts.size_mib * 2.0), f"{new} to catch up", interval=0.1)
    took = reactor.seconds() - began
    say(f"{new} caught up in {took:.1f}s")
    await admin.remove_member(new)
    group.retire(new)
    return {"bytes": written, "entries_to": target, "seconds": round(took, 2),
            "mb_per_s": round(written / 1e6 / took, 1) if took > 0 else None}


def format_results(r: dict) -> str:
    lines = [f"membership changes under a write load ({r['writers']} writers, {r['store']} store): longest time "
             "without an acknowledged append"]
    for c in r["changes"]:
        lines.append(f"  {c['change']:32} {c['outage_seconds']:7.3f} s   (quiet window {c['baseline_seconds']:.3f} s; "
                     f"answered in {c['answered_seconds']:.2f} s; {c['acks_in_window']} acks in the window)")
    cu = r["catch_up"]
    lines.append(f"learner catch-up: {cu['bytes'] / MiB:.0f} MiB in {cu['seconds']:.1f} s ({cu['mb_per_s']} MB/s)")
    lines.append(f"log check: {r['check']}")
    lines.append("  " + json.dumps({c["change"]: c["outage_seconds"] for c in r["changes"]}))
    return "\n".join(lines)
