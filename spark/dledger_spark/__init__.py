"""dledger-spark: the PySpark data source ``dledger`` (committed entries of dledger groups) and ``dledger ingest``.

    from dledger_spark import register
    register(spark)                 # spark.read.format("dledger") / spark.readStream.format("dledger")
"""


def register(spark, python: str | None = None) -> None:
    """Register the ``dledger`` data source with a SparkSession.

    On a local master its Python workers run this interpreter unless ``spark.pyspark.python`` or
    ``PYSPARK_PYTHON`` names one (``python``: name it here); see :func:`dledger_spark.session.worker_python`.
    """
    from dledger_spark.session import register as _register

    _register(spark, python)


__all__ = ["register"]
