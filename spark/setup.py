"""Packaging for dledger-spark: a PySpark data source reading dledger's committed log, as a dledger plugin."""

from setuptools import find_packages, setup

with open("README.md", encoding="utf-8") as fh:
    LONG_DESCRIPTION = fh.read()

setup(
    name="dledger-spark",
    version="0.1.0",
    description="Spark ingest for dledger: spark.read/readStream.format('dledger'), exactly-once into Parquet",
    long_description=LONG_DESCRIPTION,
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["dledger_spark", "dledger_spark.*"]),
    # Dependencies of dledger-spark only (dledger itself needs neither): pyspark >= 4.2 for the Python Data
    # Source API with admission control (latestOffset(start, limit), SupportsTriggerAvailableNow; PyPI has
    # 4.3); pyarrow, the form read() hands rows to Spark in (record batches, no per-row Python objects);
    # numpy, which reads a GET reply's entry headers as arrays (dledger_spark.columns; pyarrow >= 16 no
    # longer pulls it in).
    install_requires=["dledger", "pyspark>=4.2", "pyarrow>=15", "numpy>=1.22"],
    # format=rocketmq decodes entries with the broker layer's codec; imported only for that format.
    extras_require={"rocketmq": ["dledger-rocketmq"]},
    entry_points={
        # dledger's plugin group: adds `dledger ingest` and `dledger bench ingest`.
        "dledger": ["spark = dledger_spark.plugin"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "Framework :: Apache Spark",
    ],
)
