"""Helpers for people testing dledger stores and applications built on dledger.

* :mod:`dledger.testing.store_contract` -- the log-store contract suite.
"""
