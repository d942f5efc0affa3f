"""``dledger ingest``: stream committed entries into Parquet (registered by dledger-spark's plugin)."""


def register(subparsers) -> None:
    from dledger_spark import ingest

    ingest.add_parser(subparsers)
