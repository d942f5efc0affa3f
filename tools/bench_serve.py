"""Micro-benchmark: CPU per one-entry APPEND served by one connection, frames in to reply bytes out.

Binary APPEND frames go through one ``RemotingProtocol`` (128 KiB per read, as a member reads them) to a
handler that parks each request in ``PendingAppends``, as the leader does; every parked request is answered
after its read (all committed), and the replies are written.  No store, no followers: the leader's
per-request Python of issue #28 target 2 without the rest.  With ``--against DIR`` it alternates runs of
this tree and of another source tree (e.g. a worktree of the base commit), each in its own process, and
prints both medians and their ratio.  A tree without ``IAnsweringRequestHandler`` answers through
Deferreds, as it did.

Usage: python -m tools.bench_serve [--requests 40000] [--runs 5] [--against DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: This source tree (the repository root holding tools/ and dledger/).
HERE = Path(__file__).resolve().parent.parent


def serve_cpu_us(requests: int) -> float:
    """CPU microseconds per request through one connection (this process's dledger)."""
    from twisted.internet.task import Clock
    from twisted.internet.testing import StringTransport
    from zope.interface import implementer

    from dledger import interfaces
    from dledger.messages import AppendEntryRequest, AppendEntryResponse
    from dledger.replication.pending import PendingAppends
    from dledger.transport import remoting
    from dledger.transport.protocol import RemotingProtocol

    clock = Clock()
    pending = PendingAppends(clock, 10.0, 10**9)
    answering = getattr(interfaces, "IAnsweringRequestHandler", None)

    class Leader:
        index = 0

        def park(self) -> tuple[int, AppendEntryResponse]:
            self.index += 1
            return self.index, AppendEntryResponse(group="g0", term=1, index=self.index, pos=0, leader_id="n0")

        def handle_request(self, request):
            return self.handle_requests([request])[0]

        def handle_requests(self, batch):
            return [pending.add(*self.park()) for _ in batch]

        def handle_requests_answering(self, batch, answer, tokens):
            for token in tokens:
                pending.add_answer(*self.park(), answer, token)
            return [interfaces.ANSWER_LATER] * len(batch)

    handler = implementer(answering or interfaces.IBatchRequestHandler)(Leader)()
    frames = b"".join(remoting.encode_request(AppendEntryRequest(group="g0", remote_id="n0", body=b"x" * 1024),
                                              i, binary=True) for i in range(requests))
    protocol, transport = RemotingProtocol(clock, handler), StringTransport()
    protocol.makeConnection(transport)
    step = 128 * 1024
    written = 0
    start = time.process_time()
    for offset in range(0, len(frames), step):
        protocol.dataReceived(frames[offset:offset + step])
        pending.resolve_upto(handler.index)
        written += len(transport.value())
        transport.clear()
    cpu = time.process_time() - start
    if handler.index != requests or len(pending) or written < requests * len(b'{"code":0,"index":1}'):
        raise RuntimeError(f"served {handler.index} of {requests} requests, {written} reply bytes")
    return cpu / requests * 1e6


def run_in(tree: Path, requests: int) -> float:
    """One measurement in a fresh process importing ``tree``'s dledger (this file run as a script)."""
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, __file__, "--one", "--requests", str(requests)], cwd=tree, env=env,
                         capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=40_000, help="APPEND frames per run (default 40000)")
    parser.add_argument("--runs", type=int, default=5, help="runs per tree (default 5)")
    parser.add_argument("--against", type=Path, help="another source tree, run alternately with this one")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # one figure (run_in's child)
    args = parser.parse_args(argv)
    if args.one:
        print(serve_cpu_us(args.requests))
        return
    if args.against is None:
        runs = [serve_cpu_us(args.requests) for _ in range(args.runs)]
        print(f"CPU per request: median {statistics.median(runs):.2f} us "
              f"({' '.join(f'{r:.2f}' for r in runs)})")
        return
    if not (args.against / "dledger" / "__init__.py").exists():
        raise SystemExit(f"--against {args.against}: no dledger package there")
    mine, theirs = [], []
    for _ in range(args.runs):
        theirs.append(run_in(args.against.resolve(), args.requests))
        mine.append(run_in(HERE, args.requests))
    a, b = statistics.median(mine), statistics.median(theirs)
    print(f"CPU per request: this tree {a:.2f} us ({' '.join(f'{r:.2f}' for r in mine)}), "
          f"{args.against} {b:.2f} us ({' '.join(f'{r:.2f}' for r in theirs)}); ratio {a / b:.2f}")


if __name__ == "__main__":
    main()
