"""Consume-queue dispatch throughput: ``python -m dledger_rocketmq.tools.bench_dispatch --messages 200000 --queues 8``.

Feeds synthetic committed entries (one RocketMQ record of ``--body`` bytes
each, round-robin over ``--queues`` queues of one topic) to a
:class:`~dledger_rocketmq.store.dispatch.Dispatcher` in commit-feed deliveries of
``--batch`` entries, over ConsumeQueues in a temporary directory, and prints
the units per second of the dispatch loop and of the final flush.  No
cluster and no log: what is measured is the dispatcher's decode and the
queues' writes (page cache), the path every member runs for every message.
The records are encoded once and patched per message, so building the input
is not measured.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from typing import NamedTuple

from twisted.internet.task import Clock

from dledger.entry import HEADER_SIZE
from dledger_rocketmq.common.message import (
    QUEUE_ID_POSITION,
    MessageRecord,
    encode_properties,
    encode_record,
    patch_physical_offset,
    patch_queue_offset,
)
from dledger_rocketmq.store.consumequeue import DEFAULT_FILE_SIZE, ConsumeQueues
from dledger_rocketmq.store.dispatch import Dispatcher


class _Entry(NamedTuple):
    index: int
    pos: int
    size: int
    body: bytes


class _Server:
    """What the Dispatcher uses of a DLedgerServer outside recovery: a clock and an id."""

    def __init__(self) -> None:
        self.clock = Clock()
        self.self_id = "bench"


def make_entries(messages: int, queues: int, body_size: int, topic: str = "BenchTopic") -> list[_Entry]:
    """``messages`` committed entries, round-robin over ``queues`` queues, with consistent offsets."""
    template = encode_record(MessageRecord(topic, b"x" * body_size, encode_properties({"TAGS": "TagA"})))
    next_offset = [0] * queues
    entries, pos = [], 0
    for i in range(messages):
        qid = i % queues
        buf = bytearray(template)
        buf[QUEUE_ID_POSITION:QUEUE_ID_POSITION + 4] = qid.to_bytes(4, "big")
        patch_queue_offset(buf, 0, next_offset[qid])
        patch_physical_offset(buf, 0, pos + HEADER_SIZE)
        next_offset[qid] += 1
        size = HEADER_SIZE + len(buf)
        entries.append(_Entry(i, pos, size, bytes(buf)))
        pos += size
    return entries


def run(messages: int, queues: int, batch: int, body_size: int, file_size: int,
        max_open_files: int | None = None) -> dict[str, float]:
    """Dispatch once into a fresh temporary directory; returns the timings.

    ``max_open_files`` None: the queues' default (also what works with
    versions of the queues before the open-file cache, for before/after runs).
    """
    entries = make_entries(messages, queues, body_size)
    root = tempfile.mkdtemp(prefix="bench-dispatch-")
    try:
        dispatcher = Dispatcher(_Server(), root, file_size=file_size)
        opts = {} if max_open_files is None else {"max_open_files": max_open_files}
        dispatcher.queues = ConsumeQueues(root, file_size=file_size, **opts)
        t0, c0 = time.perf_counter(), time.process_time()
        for i in range(0, len(entries), batch):
            dispatcher.entries_committed(entries[i:i + batch])
        drain = getattr(dispatcher, "drain", None)  # the units still buffered are written in the timed part
        if drain is not None:
            drain()
        t1, c1 = time.perf_counter(), time.process_time()
        dispatcher.flush()
        t2 = time.perf_counter()
        units = sum(q.max_offset for q in dispatcher.queues.queues())
        if units != messages:
            raise SystemExit(f"bench: {units} units for {messages} messages")
        close = getattr(dispatcher.queues, "close", None)
        if close is not None:
            close()
        return {"units": units, "dispatch_s": t1 - t0, "flush_s": t2 - t1, "dispatch_cpu_s": c1 - c0}
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dledger_rocketmq.tools.bench_dispatch",
                                     description="Consume-queue dispatch throughput (units/s) in a temp dir.")
    parser.add_argument("--messages", type=int, default=200_000, help="records to dispatch (default 200000)")
    parser.add_argument("--queues", type=int, default=8, help="queues of the topic, round-robin (default 8)")
    parser.add_argument("--batch", type=int, default=32, help="entries per commit-feed delivery (default 32)")
    parser.add_argument("--body", type=int, default=1024, help="message body bytes (default 1024)")
    parser.add_argument("--file-size", type=int, default=DEFAULT_FILE_SIZE,
                        help=f"consume-queue file size, a multiple of 20 (default {DEFAULT_FILE_SIZE})")
    parser.add_argument("--max-open-files", type=int, default=None,
                        help="open consume-queue files kept (default: the queues' default, 256)")
    parser.add_argument("--repeat", type=int, default=1, help="runs, each in a fresh directory (default 1)")
    args = parser.parse_args(argv)
    for name in ("messages", "queues", "batch", "repeat"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.max_open_files is not None and args.max_open_files < 1:
        parser.error("--max-open-files must be at least 1")
    if args.body < 0 or args.file_size < 20 or args.file_size % 20:
        parser.error("--body must be >= 0 and --file-size a positive multiple of 20")
    for _ in range(args.repeat):
        r = run(args.messages, args.queues, args.batch, args.body, args.file_size, args.max_open_files)
        print(f"messages={args.messages} queues={args.queues} batch={args.batch}: "
              f"dispatch {r['units'] / r['dispatch_s']:,.0f} units/s ({r['dispatch_s']:.3f}s; "
              f"CPU {r['dispatch_cpu_s'] / r['units'] * 1e6:.2f} us per unit), "
              f"flush {r['flush_s'] * 1000:.1f} ms", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
