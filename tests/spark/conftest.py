"""The Spark tests start their JVMs without the class archive (``dledger_spark.session``).

Recording one costs a fresh machine about 30 s at its first ingest (measured: test_spark_bench.py 49 s
recording, 19 s without), more than the later sessions of one run win back, and CI always starts fresh.
The archive's decisions have their own table tests (test_spark_planning.py, which set the variable
themselves).  Set ``DLEDGER_SPARK_CLASS_ARCHIVE`` to a path to run these tests with one.
"""

import os

os.environ.setdefault("DLEDGER_SPARK_CLASS_ARCHIVE", "off")
