"""Benchmarks run by ``dledger bench``: one module per subject (``store``, ``cluster``)."""
