"""The membership helpers of :class:`dledger.testing.Cluster` (issue #23): add a member, change the configuration.

A mixin, so the cluster class stays one concern (a group on a simulated clock, network and disks) and
tests still call ``cluster.add_member(...)``/``cluster.change(...)`` on it.
"""

from __future__ import annotations

from twisted.python.failure import Failure

from dledger.config import make_config
from dledger.store.memory import MemoryTermVoteStore


class ClusterMembership:
    """Members joining and the configuration in force; mixed into :class:`dledger.testing.cluster.Cluster`."""

    def address(self, mid: str) -> str:
        """The ``host:port`` member ``mid`` has (or, for a member not built yet, would have) in this cluster."""
        if mid in self.configs:
            return self.configs[mid].self_peer.address
        return f"127.0.0.1:{20911 + len(self.ids)}"

    def add_member(self, mid: str, *, join: bool = True, start: bool = True, **options) -> str:
        """A new member ``mid`` in the network, with its own empty store (issue #23); returns its address.

        Its ``--peers`` are the group's configuration in force (the leader's, else the original ids) plus
        itself; with ``join`` (``joinExisting``) it is a learner of that bootstrap and never campaigns
        before the group's log makes it a voter.  It is only started (``start``): making it a member is
        the group's business -- :meth:`change` with ``Change(Op.ADD, mid, address)``.
        """
        if mid in self.configs:
            raise ValueError(f"{mid} is already a member of this cluster")
        address = self.address(mid)
        lid = self.leader()
        known = self.servers[lid].membership.configuration.addresses if lid is not None else \
            {m: self.address(m) for m in self.ids}
        peers = ";".join(f"{m}-{a}" for m, a in {**known, mid: address}.items())
        self.configs[mid] = make_config(preset=self._preset, group=self._group, self_id=mid, peers=peers,
                                        store_type="memory", transport_type="inprocess", join_existing=join,
                                        **{**self._options, **options})
        self.ids.append(mid)
        self.term_stores[mid] = MemoryTermVoteStore()
        self.disks[mid] = self._new_disk(mid)
        if start:
            self.start(mid)
        return address

    def change(self, change, timeout: float = 60.0):
        """Propose ``change`` (a :class:`dledger.membership.rules.Change`) on the stable leader and run until it
        is committed; returns the new configuration (AssertionError with the refusal if it is refused)."""
        lid = self.wait_for_leader(timeout)
        results: list = []
        self.servers[lid].membership.propose(change).addBoth(results.append)
        self.wait_until(lambda: results, timeout, f"configuration change {change.describe()}")
        if isinstance(results[0], Failure):
            raise AssertionError(f"{change.describe()}: {results[0].getErrorMessage()}")
        return results[0]

    def configuration(self, mid: str | None = None):
        """The configuration in force on ``mid`` (the leader by default)."""
        mid = mid or self.leader()
        return self.servers[mid].membership.configuration

    def members(self) -> list[str]:
        """The running members the leader's configuration holds (every running member without a leader)."""
        lid = self.leader()
        if lid is None:
            return list(self.servers)
        ids = self.servers[lid].membership.configuration.ids
        return [m for m in self.servers if m in ids]
