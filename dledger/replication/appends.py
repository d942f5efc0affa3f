"""Client appends on the leader: the checks of SPEC §4 ``handleAppend`` and one store batch for many requests.

Requests that arrive together (the APPEND frames of one TCP read, see
:class:`dledger.interfaces.IBatchRequestHandler`) are checked one by one,
then every accepted body goes to the store in one batch append and to the
replicator in one notification; each request still gets its own waiter in
:class:`~dledger.replication.pending.PendingAppends`, acknowledged when its
last entry commits, so answers leave in index order.

:class:`ClientAppends` gets what it works with explicitly (member state,
config, pending appends, the store's batch append, clock, stats) rather than
reaching through the server; the current leadership's replicator is passed
with each call, because it changes with every role change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode, Role
from dledger.entry import HEADER_SIZE, Entry
from dledger.errors import AppendHookError, BatchAppendError, DLedgerError
from dledger.interfaces import ANSWER_LATER
from dledger.messages import AppendEntryRequest, AppendEntryResponse
from dledger.ratelog import RateLimitedLog

log = Logger()


class ClientAppends:
    """The leader's client-append path (SPEC §4 ``handleAppend``) for one member.

    ``check_request(request)`` raises for a request this member must not serve at all (not running,
    wrong member or group); ``not_leader()`` is the NOT_LEADER error naming the known leader.
    ``stats`` is None (nothing recorded) until the server enables stats and sets it.
    """

    def __init__(self, *, state, config, pending, append_batch: Callable[[list[Entry]], list[Entry]], clock,
                 check_request: Callable[[Any], None], not_leader: Callable[[], DLedgerError], stats=None):
        self.state = state
        self.config = config
        self.pending = pending
        self.append_batch = append_batch
        self.clock = clock
        self.check_request = check_request
        self.not_leader = not_leader
        self.stats = stats
        self.hook_log = RateLimitedLog(log, clock)

    def check_append(self, request: AppendEntryRequest, queued: int, replicator: Any) -> list[bytes]:
        """The bodies of ``request`` if this member may append them now (``queued``: requests accepted before it)."""
        st = self.state
        if st.role is not Role.LEADER or replicator is None:
            raise self.not_leader()
        if st.transferee is not None:
            raise DLedgerError(ResponseCode.LEADER_TRANSFERRING, f"transferring leadership to {st.transferee}",
                               leader_id=st.leader_id)
        bodies = request.bodies()
        if not bodies:
            raise DLedgerError(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "no body to append", leader_id=st.leader_id)
        pending = self.pending
        if len(pending) + queued >= pending.limit:
            raise DLedgerError(ResponseCode.LEADER_PENDING_FULL,
                               f"{len(pending) + queued} appends already wait for the quorum",
                               leader_id=st.leader_id)
        max_entry_size = self.config.max_entry_size
        limit = max_entry_size - HEADER_SIZE
        for body in bodies:
            if len(body) > limit:
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                                   f"body of {len(body)} bytes exceeds maxEntrySize {max_entry_size}",
                                   leader_id=st.leader_id)
        return bodies

    def append_requests(self, requests: Sequence[AppendEntryRequest], replicator: Any, answer: Any = None,
                        tokens: Sequence[Any] = ()) -> list:
        """Answer APPEND requests together: for each a Deferred (fires when its last entry commits) or a Failure.

        With ``answer``, a request that waits gets :data:`~dledger.interfaces.ANSWER_LATER` instead of a
        Deferred and ``answer(tokens[i], response)`` is called with what that Deferred would have fired
        with (:class:`~dledger.interfaces.IAnsweringRequestHandler`); while stats are on (they watch each
        request's Deferred) it still gets a Deferred.

        ``replicator`` is the current leadership's :class:`~dledger.replication.leader.LeaderReplicator`
        (None: not leading).  A request refused by its checks fails alone.  The accepted ones share
        one store batch.  If an append hook fails on an entry
        (:class:`~dledger.errors.AppendHookError`), only the request holding that
        entry fails, with the hook's error; the requests after it are appended in
        a new batch.  If the store stops at an entry for any other reason
        (DISK_FULL, NOT_LEADER, ...), the requests wholly stored before it wait as
        usual and the others fail with its error.  Either way, entries of a
        failed request stored before its failing entry stay in the log and may
        commit: a request with several bodies is not atomic.
        """
        results: list = [None] * len(requests)
        accepted: list[tuple[int, list[bytes]]] = []
        for i, request in enumerate(requests):
            try:
                self.check_request(request)
                accepted.append((i, self.check_append(request, len(accepted), replicator)))
            except DLedgerError:
                results[i] = Failure()
        if not accepted:
            return results
        state, stats = self.state, self.stats
        term = state.curr_term
        started = self.clock.seconds() if stats is not None else 0.0
        group, self_id, pending = self.config.group, state.self_id, self.pending
        all_stored: list[Entry] = []
        todo = accepted
        while todo:
            entries = [Entry(body, -1, term) for _, bodies in todo for body in bodies]  # positional args: cheaper
            try:
                stored = self.append_batch(entries)
                error = None
            except BatchAppendError as exc:
                stored, error = exc.stored, exc.cause
                error.leader_id = state.leader_id
            all_stored += stored
            end, rest = 0, []
            for k, (i, bodies) in enumerate(todo):
                end += len(bodies)
                if end > len(stored):
                    results[i] = Failure(error)
                    if isinstance(error, AppendHookError):
                        self._hook_failed(error)
                        rest = todo[k + 1:]  # only this request failed: go on with the others
                    else:
                        for j, _ in todo[k + 1:]:
                            results[j] = Failure(error)
                    break
                last = stored[end - 1]
                response = AppendEntryResponse(group=group, term=term, index=last.index, pos=last.pos,
                                               leader_id=self_id)
                if answer is not None and stats is None:
                    pending.add_answer(last.index, response, answer, tokens[i])
                    results[i] = ANSWER_LATER
                    continue
                d = pending.add(last.index, response)
                if stats is not None:
                    stats.append_accepted(d, len(bodies), sum(map(len, bodies)), started)
                results[i] = d
            todo = rest
        if all_stored:
            if replicator.keeps_recent:
                replicator.recent.extend(all_stored)
            replicator.entries_appended(all_stored[-1].index)
        return results

    def _hook_failed(self, error: AppendHookError) -> None:
        """The client only sees the code (Java's reply shape): say why on the leader, at most once per 10 s."""
        self.hook_log.warn("append-hook", "{id}: append refused: {error}", id=self.state.self_id, error=error)
