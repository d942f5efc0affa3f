"""``dledger bench install-snapshot``: InstallSnapshot throughput and both sides' peak RSS (issue #22 item 9).

Three ``twistd dledger`` members on 127.0.0.1 (mmap store) run the test plugin's
:class:`~dledger.testing.smplugin.BlobMachine`, whose snapshot is ``--size-mib``
MiB generated on the fly (so the members' memory is the transfer's, not a
state's).  Every member snapshots at the same index and compacts; one
follower is stopped, its store directory removed, and started again: the
leader streams the snapshot to it.  Reported: bytes, seconds from the first
byte received to the last (transfer), then to "installed" (verify + restore),
MB/s, and the peak RSS of the leader and of the follower during the transfer
(``VmHWM`` after resetting it through ``/proc/<pid>/clear_refs``, and the
highest ``VmRSS`` sampled every 50 ms).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dledger.bench.runner import progress, run_benchmark
from dledger.commands.argtypes import positive_int
from dledger.errors import ConfigError
from dledger.launcher import LocalGroup, durable_store
from dledger.testing import smplugin

MiB = 1 << 20


@dataclass
class Options:
    size_mib: int = 1024
    chunk: int = 256 * 1024
    directory: str | None = None
    keep: bool = False
    json: bool = False


def register(bench_subparsers) -> None:
    """Add ``install-snapshot`` to ``dledger bench``'s sub-commands."""
    p = bench_subparsers.add_parser(
        "install-snapshot", help="InstallSnapshot MB/s and peak RSS on both sides (3 mmap members)",
        description=__doc__.split("\n\n", 1)[1], formatter_class=_raw())
    p.add_argument("--size-mib", type=positive_int, default=1024, help="snapshot size in MiB (default 1024)")
    p.add_argument("--chunk", type=positive_int, default=256 * 1024,
                   help="snapshotChunkSize in bytes (default 262144)")
    p.add_argument("--quick", action="store_true", help="a tiny run (8 MiB; keeps the benchmark working in tests)")
    p.add_argument("--dir", dest="directory", help="directory for stores and logs (default: a temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the directory afterwards")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.set_defaults(func=cmd_bench_install)


def _raw():
    import argparse

    return argparse.RawDescriptionHelpFormatter


def cmd_bench_install(args) -> int:
    opts = Options(size_mib=8 if args.quick else args.size_mib, chunk=args.chunk, directory=args.directory,
                   keep=args.keep, json=args.json)
    if durable_store() != "mmap":
        raise ConfigError("dledger bench install-snapshot needs the mmap store (pip install dledger[mmap])")
    return run_benchmark(lambda reactor, say: run(reactor, opts, say), format_results, as_json=opts.json)


def _install_dir_bytes(root: Path) -> int | None:
    """Bytes under ``snapshot/.install-*`` (None when there is no such directory)."""
    dirs = list(root.glob(".install-*"))
    if not dirs:
        return None
    return sum(p.stat().st_size for d in dirs for p in d.rglob("*") if p.is_file() and p.name != "manifest.json")


def _clear_hwm(pid: int | None) -> bool:
    """Reset a process's peak RSS (VmHWM) to its current RSS (Linux: ``echo 5 > /proc/<pid>/clear_refs``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


async def run(reactor: Any, opts: Options, say=progress) -> dict:
    size = opts.size_mib * MiB
    base = Path(opts.directory) if opts.directory else Path(tempfile.mkdtemp(prefix="dledger-bench-install-"))
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", smplugin.ENV_KIND, smplugin.ENV_BYTES)}
    os.environ.update(smplugin.child_environment(base / "plugin", "blob", size))
    group = LocalGroup(base / "group", n=3, store="mmap", preset="fast", reactor=reactor,
                       options={"snapshotThreshold": 0, "snapshotThresholdBytes": 0, "trailingEntries": 0,
                                "snapshotChunkSize": opts.chunk, "mappedFileSizeForEntryData": 256 * 1024,
                                "mappedFileSizeForEntryIndex": 32 * 1024})
    client = group.client(request_timeout=5.0)
    try:
        leader = (await group.start_and_wait(60)).leader_id
        for k in range(4):  # ~1 MiB of entries: several 256 KiB data files, so compaction deletes some
            await client.append_batch([b"entry %d " % i + b"x" * 2048 for i in range(k * 128, k * 128 + 128)])
        await client.append(smplugin.SNAPSHOT_BODY)
        say(f"every member writes a {opts.size_mib} MiB snapshot")

        async def compacted():
            metas = [await group.metadata(client, mid) for mid in group.ids]
            return all(m is not None and m.ledger_begin_index > 0 for m in metas)

        await group.wait_for(compacted, 3600, "every member to snapshot and compact", interval=0.5)
        follower = next(mid for mid in group.ids if mid != leader)
        assert await group.stop(follower) == 0
        shutil.rmtree(group.configs[follower].member_dir)
        hwm_reset = _clear_hwm(group.members[leader].pid)
        leader_before = group.rss_bytes(leader)
        say(f"{follower} wiped and restarted: {leader} streams the snapshot to it")
        group.start(follower)
        restarted = reactor.seconds()
        root = group.configs[follower].member_dir / "snapshot"
        peaks = {leader: 0, follower: 0}
        marks: dict[str, float] = {"polled": restarted}

        async def installed():
            now = reactor.seconds()
            for mid in peaks:
                peaks[mid] = max(peaks[mid], group.rss_bytes(mid))
            got = _install_dir_bytes(root) if root.exists() else None
            if got is not None and got > 0:
                if "first" not in marks and got >= size:
                    # The whole snapshot arrived between two polls: the transfer started after the last
                    # poll that saw nothing, so time it from there (an upper bound, never a zero).
                    marks["first"], marks["timed_from_poll"] = marks["polled"], now
                marks.setdefault("first", now)
                if got >= size:
                    marks.setdefault("received", now)
            marks["polled"] = now
            meta = await group.metadata(client, follower, timeout=0.2)
            if meta is not None and meta.ledger_begin_index > 0:
                # A small snapshot can arrive between two polls (the .install-* directory is renamed when
                # complete): then the transfer is timed from the follower's restart, an upper bound.
                if "first" not in marks:
                    marks["first"], marks["timed_from_restart"] = restarted, now
                marks.setdefault("received", now)
                marks["installed"] = now
                return True
            return False

        await group.wait_for(installed, max(300, opts.size_mib), f"{follower} to install the snapshot", interval=0.05)
        transfer = marks["received"] - marks["first"]
        total = marks["installed"] - marks["first"]
        result = {
            "snapshot_bytes": size, "chunk_bytes": opts.chunk, "transfer_seconds": round(transfer, 3),
            "install_seconds": round(total, 3),
            "timed_from": "restart (transfer faster than the polls)" if "timed_from_restart" in marks
            else "the last empty poll (whole snapshot arrived between two polls)" if "timed_from_poll" in marks
            else "first byte",
            "transfer_mb_per_s": round(size / 1e6 / transfer, 1) if transfer > 0 else None,
            "end_to_end_mb_per_s": round(size / 1e6 / total, 1) if total > 0 else None,
            "leader_rss_before": leader_before,
            "leader_peak_rss": group.peak_rss_bytes(leader) if hwm_reset else None,
            "follower_peak_rss": group.peak_rss_bytes(follower),
            "leader_peak_rss_sampled": peaks[leader], "follower_peak_rss_sampled": peaks[follower],
        }
        await client.close()
        await group.stop_all()
        return result
    finally:
        group.close()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        if not opts.keep and not opts.directory:
            shutil.rmtree(base, ignore_errors=True)


def format_results(r: dict) -> str:
    def mib(n):
        return "n/a" if n is None else f"{n / MiB:.0f} MiB"

    return "\n".join([
        f"InstallSnapshot of {r['snapshot_bytes'] / MiB:.0f} MiB in chunks of {r['chunk_bytes'] // 1024} KiB",
        f"  transfer   {r['transfer_seconds']:.2f} s  ({r['transfer_mb_per_s']} MB/s)",
        f"  installed  {r['install_seconds']:.2f} s after the first byte ({r['end_to_end_mb_per_s']} MB/s end to end)",
        f"  leader     peak RSS {mib(r['leader_peak_rss'])} (sampled {mib(r['leader_peak_rss_sampled'])}; "
        f"{mib(r['leader_rss_before'])} before)",
        f"  follower   peak RSS {mib(r['follower_peak_rss'])} (sampled {mib(r['follower_peak_rss_sampled'])})",
        "  " + json.dumps({k: r[k] for k in ("transfer_mb_per_s", "end_to_end_mb_per_s")}),
    ])
