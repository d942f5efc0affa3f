"""The dledger plugin of dledger-spark: ``dledger ingest`` and ``dledger bench ingest``."""

from dledger.hookspecs import hookimpl


@hookimpl
def dledger_cli_commands(subparsers):
    from dledger_spark import cli

    cli.register(subparsers)


@hookimpl
def dledger_bench_subjects(subparsers):
    from dledger_spark import bench

    bench.register(subparsers)
