"""dledger-spark: the PySpark data source ``dledger`` (committed entries of dledger groups) and ``dledger ingest``.

    from dledger_spark import register
    register(spark)                 # spark.read.format("dledger") / spark.readStream.format("dledger")
"""


def register(spark) -> None:
    """Register the ``dledger`` data source with a SparkSession."""
    from dledger_spark.session import register as _register

    _register(spark)


__all__ = ["register"]
