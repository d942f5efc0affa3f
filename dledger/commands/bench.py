"""``dledger bench``: benchmarks, one sub-command per subject (``cluster`` here; ``store`` on the stores branch)."""

from __future__ import annotations

from dledger.bench import cluster as cluster_bench


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run a benchmark", description="Benchmarks; see docs/benchmarks.md.")
    sub = p.add_subparsers(dest="bench_command", metavar="SUBJECT")
    cluster_bench.register(sub)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])
