"""How a member answers reads: GETs of committed entries and ReadIndex for state machines (the I/O side).

The decisions are :mod:`dledger.reads`' (pure, table-tested); this module asks the elector to confirm
leadership when a decision needs it and reads the store.  Kept out of :class:`dledger.server.DLedgerServer`
so that the server stays the wiring of one member.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail

from dledger import reads
from dledger.codes import ResponseCode
from dledger.entry import Entry, without_noops
from dledger.errors import DLedgerError
from dledger.interfaces import IDiskHealth
from dledger.messages import GetEntriesRequest, GetEntriesResponse, MetadataRequest, MetadataResponse

#: Byte budget of one GET reply.
GET_MAX_BYTES = 4 * 1024 * 1024


class ReadPath:
    """The read side of one member (``server.reads``)."""

    def __init__(self, server):
        self.server = server

    def handle_get(self, request: GetEntriesRequest):
        """Committed entries from ``beginIndex``: at most ``maxSize`` of them (0 means 1), NOOPs left out.

        Entries at or below the committed index never change, so they are
        served at once.  Before saying an index is *not* committed yet the
        leader confirms it still leads and that its own term's first entry is
        committed (Raft's ReadIndex), so a deposed leader never answers a
        stale INDEX_OUT_OF_RANGE; a follower serves ``followerRead`` GETs from
        its own committed prefix.
        """
        server = self.server
        store = server.store
        begin, want = request.begin_index, max(1, request.max_size)
        replicator = server.replicator
        decision = reads.read_decision(server.leads(), request.follower_read is True, begin,
                                       store.ledger_begin_index, store.committed_index, server.self_id)
        if decision.action is reads.ReadAction.SERVE:
            return self.read(begin, want)
        if decision.action is reads.ReadAction.REFUSE:
            raise self.refused(decision)

        def confirmed(ok: bool):
            after = reads.confirmed_read_decision(ok, server.replicator is replicator, begin, store.committed_index,
                                                  replicator.term_start_index, server.self_id)
            if after.action is reads.ReadAction.SERVE:
                return self.read(begin, want)
            raise self.refused(after)

        return server.elector.confirm_leadership().addCallback(confirmed)

    def read_index(self) -> Deferred:
        """Raft's ReadIndex for linearizable reads of state built from the log: fires with the index to wait for.

        Confirms that this member still leads (a quorum answered a heartbeat of its term) and that its
        term's first entry is committed; then every write acknowledged before the call is at or below
        the committed index it fires with, so a state machine that has applied that index
        (``server.snapshots.wait_applied(index)``) answers as of a moment after the call.  Fails with
        NOT_LEADER (naming the leader this member knows) or LEADER_NOT_READY otherwise.
        """
        server = self.server
        if not server.leads():
            return fail(server.not_leader())
        replicator = server.replicator

        def confirmed(ok: bool):
            committed = server.store.committed_index
            after = reads.confirmed_read_decision(ok, server.replicator is replicator, committed, committed,
                                                  replicator.term_start_index, server.self_id)
            if after.action is not reads.ReadAction.SERVE:
                raise self.refused(after)
            return committed

        return server.elector.confirm_leadership().addCallback(confirmed)

    def refused(self, decision: reads.ReadDecision) -> DLedgerError:
        if decision.code is ResponseCode.NOT_LEADER:
            return self.server.not_leader()
        return decision.error(self.server.state.leader_id)

    def read(self, begin: int, want: int):
        """:meth:`read_now`, with a damaged entry repaired first (:meth:`dledger.mending.Mending.read`)."""
        return self.server.mending.read(begin, want, self.read_now)

    def read_now(self, begin: int, want: int) -> GetEntriesResponse:
        server = self.server
        store = server.store
        committed = store.committed_index
        stats = server.stats
        started = server.clock.seconds() if stats is not None else 0.0
        out: list[Entry] = []
        while begin <= committed and not out:
            entries = store.get_range(begin, min(want, committed - begin + 1), GET_MAX_BYTES)
            out = without_noops(entries)
            begin = entries[-1].index + 1
        if stats is not None:
            stats.read_done(started)
        return GetEntriesResponse(group=server.config.group, entries=out)

    def metadata(self, request: MetadataRequest) -> MetadataResponse:
        """The peer map and leader (Java's shape); ``detail`` adds role, term, log indexes and disk state."""
        server = self.server
        store, state = server.store, server.state
        resp = MetadataResponse(group=server.config.group, leader_id=state.leader_id,
                                peers=dict(server.membership.configuration.addresses))
        if request.detail:
            resp.term = state.curr_term
            resp.role = state.role.name
            resp.ledger_begin_index = store.ledger_begin_index
            resp.ledger_end_index = store.ledger_end_index
            resp.committed_index = store.committed_index
            resp.disk = getattr(store, "disk_problem", None) if IDiskHealth.providedBy(store) else None
            if server.leads():
                resp.peer_disk = server.replicator.peer_disk_problems() or None
        return resp
