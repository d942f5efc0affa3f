"""Helpers for people testing dledger stores and applications built on dledger (see docs/testing.md).

* :class:`Cluster` -- whole groups in one process on a virtual clock and a
  fault-injecting network, with crash/restart on simulated disks.
* :class:`SimClock` -- a deterministic, heap-based ``IReactorTime``.
* :class:`SimulatedDisk` -- a store that loses or tears unflushed writes on a crash.
* :mod:`dledger.testing.store_contract` -- the log-store contract suite.
* :mod:`dledger.testing.election_sim`, :mod:`dledger.testing.replication_sim`
  and :mod:`dledger.testing.checker` -- seeded soaks and their safety checks.
* :func:`wait_until` -- a bounded poll, for blocking test code waiting on another process.
"""

from dledger.testing.clock import SimClock
from dledger.testing.cluster import Cluster, isolated_plugin_manager
from dledger.testing.handio import HandIO
from dledger.testing.simdisk import SimulatedDisk, make_entries, preload
from dledger.testing.waiting import wait_until

__all__ = ["Cluster", "HandIO", "SimClock", "SimulatedDisk", "isolated_plugin_manager", "make_entries", "preload",
           "wait_until"]
