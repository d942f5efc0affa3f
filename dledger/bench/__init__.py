"""Benchmarks run by ``dledger bench``: one module per subject (``store`` now, ``cluster`` later)."""
