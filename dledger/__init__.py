"""dledger: a Raft-replicated commit log for Python on Twisted, compatible with Java DLedger's formats.

Public API (see README.md and docs/):

* :mod:`dledger.config` -- :func:`make_config`, :class:`DLedgerConfig`
* :mod:`dledger.entry` -- the entry codec (:class:`Entry`, ``encode_entry``, ``decode_entry``)
* :mod:`dledger.codes`, :mod:`dledger.messages` -- protocol codes and messages
* :mod:`dledger.interfaces` -- the seams (stores, transports, handlers, hooks, listeners)
* :mod:`dledger.plugins`, :mod:`dledger.hookspecs` -- plugin discovery and hook specs
* :mod:`dledger.testing` -- helpers for testing stores and applications
"""

__version__ = "0.1.0"
