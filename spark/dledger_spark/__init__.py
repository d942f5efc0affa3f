"""dledger-spark: the PySpark data source ``dledger`` (committed entries of dledger groups)."""
