"""``dledger bench ingest`` (registered by dledger-spark's plugin)."""


def register(subparsers) -> None:
    pass
