"""Micro-benchmark: encode/decode a PUSH of N x SIZE-byte entries, binary body vs Java's JSON body.

Usage: python -m tools.bench_remoting [--entries 256] [--size 1024] [--seconds 2]
"""

from __future__ import annotations

import argparse
import time

from dledger.codes import PushType
from dledger.entry import HEADER_SIZE, Entry
from dledger.messages import PushEntryRequest
from dledger.transport import remoting


def make_request(n: int, size: int) -> PushEntryRequest:
    entries, pos = [], 0
    for i in range(n):
        entries.append(Entry(bytes([i % 256]) * size, 10_000 + i, 3, pos).sealed())
        pos += HEADER_SIZE + size
    return PushEntryRequest(group="g0", remote_id="n1", local_id="n0", leader_id="n0", term=3,
                            commit_index=9_999, type=PushType.APPEND, batch_entry=entries, total_size=pos)


def rate(fn, seconds: float) -> float:
    """Calls per second of ``fn`` (best of three runs of ``seconds / 3``)."""
    best = 0.0
    for _ in range(3):
        count, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < seconds / 3:
            fn()
            count += 1
        best = max(best, count / elapsed)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=256)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--seconds", type=float, default=2.0)
    args = parser.parse_args()
    request = make_request(args.entries, args.size)
    payload = args.entries * args.size
    print(f"PUSH of {args.entries} x {args.size} B entries ({payload / 1e6:.3f} MB of entry bodies)")
    print(f"{'form':<7}{'op':<8}{'frame bytes':>12}{'frames/s':>11}{'MB/s (bodies)':>15}{'MB/s (wire)':>13}")
    for binary in (True, False):
        frame = remoting.encode_request(request, 1, binary=binary)
        assert remoting.decode_request(remoting.decode_frame(frame)) == request
        ops = {"encode": lambda b=binary: remoting.encode_request(request, 1, binary=b),
               "decode": lambda f=frame: remoting.decode_request(remoting.decode_frame(f))}
        for name, fn in ops.items():
            r = rate(fn, args.seconds)
            print(f"{'binary' if binary else 'json':<7}{name:<8}{len(frame):>12}{r:>11.0f}"
                  f"{r * payload / 1e6:>15.1f}{r * len(frame) / 1e6:>13.1f}")


if __name__ == "__main__":
    main()
