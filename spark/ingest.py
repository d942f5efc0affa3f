"""Entry point for ``spark-submit``: ``spark-submit --master spark://HOST:7077 spark/ingest.py --peers ... --output``.

The same arguments as ``dledger ingest`` (``--help``); the master is spark-submit's.  dledger-spark must be
importable by the driver and the executors (installed in the environment ``PYSPARK_PYTHON`` names, or
shipped with ``--py-files`` as a wheel); see README "Spark ingest".
"""

import sys

from dledger_spark.ingest import main

if __name__ == "__main__":
    sys.exit(main())
