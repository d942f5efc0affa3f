"""How a member's parts follow its configuration (issue #23): what :func:`attach` connects.

The server builds its tracker here (``server.membership``) and every part whose idea of the group
was fixed by ``--peers`` observes it instead:

* the member state -- members (voters and learners) and voters (the elector asks and counts voters);
* the leader's replicator -- a dispatcher per member, the committed index over the voters;
* the transport -- where a new member listens (:meth:`TcpTransport.set_members`), and with it the
  security guard's member ids (a connection claiming an id outside the configuration is refused);
* the peer kinds -- which peers to probe (Java or dledger);
* the snapshots -- a snapshot records the configuration at its index; a compaction or an installed
  snapshot moves the tracker's base.

Kept out of :class:`dledger.server.DLedgerServer` so the server stays wiring of a few lines.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred
from twisted.logger import Logger

from dledger.diskio import INLINE, BlockingIO
from dledger.membership.changes import MembershipChanges
from dledger.membership.configuration import Configuration
from dledger.membership.tracker import Membership, config_entry_indexes

log = Logger(namespace="dledger.membership")


def attach(server) -> Membership:
    """``server.membership``: built from ``server.config`` and connected to the server's parts."""
    membership = Membership.from_config(server.config, server.store)
    server.guard.membership = membership
    membership.changes = MembershipChanges(server, membership)
    server.state.set_configuration(membership.configuration)

    def changed(old: Configuration, new: Configuration) -> None:
        server.state.set_configuration(new)
        if server.replicator is not None:
            server.replicator.configuration_changed(new)
        set_members = getattr(server.transport, "set_members", None)
        if set_members is not None:
            set_members(new.addresses)
        server.peer_kinds.set_peers(new.ids)

    membership.observe(changed)
    server.snapshots.membership = membership

    def retain() -> None:
        """Without state machines no snapshot records the configuration: retention keeps its entry in the log."""
        if server.snapshots.machines or not hasattr(server.store, "retention_floor"):
            return
        committed = server.store.committed_index
        kept = [c.index for c in membership.history if c.index <= committed]
        server.store.retention_floor = kept[-1] if kept else None

    membership.retain = retain
    return membership


def load(server, blocking_io: BlockingIO = INLINE) -> Deferred:
    """Start-up: read the log's configuration entries (off the reactor thread when ``blocking_io`` is threaded),
    then make the newest the one in force and start the change flow."""
    membership = server.membership
    store = server.store

    def read() -> list:
        indexes = config_entry_indexes(store, store.ledger_begin_index, store.ledger_end_index)
        return [store.get(i) for i in indexes]

    def loaded(entries: list) -> None:
        membership.loaded(entries)
        log.info("{id}: configuration in force: entry {index}{what}: {members}", id=server.self_id,
                 index=membership.configuration.index,
                 what=" (the bootstrap --peers)" if membership.configuration.index == 0 and not entries else "",
                 members=membership.configuration.describe())
        membership.changes.start()

    return (blocking_io or INLINE).run(read).addCallback(loaded)
