"""Client appends on the leader: the checks of SPEC §4 ``handleAppend`` and one store batch for many requests.

Requests that arrive together (the APPEND frames of one TCP read, see
:class:`dledger.interfaces.IBatchRequestHandler`) are checked one by one,
then every accepted body goes to the store in one batch append and to the
replicator in one notification; each request still gets its own waiter in
:class:`~dledger.replication.pending.PendingAppends`, acknowledged when its
last entry commits, so answers leave in index order.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode, Role
from dledger.entry import HEADER_SIZE, Entry
from dledger.errors import AppendHookError, BatchAppendError, DLedgerError
from dledger.messages import AppendEntryRequest, AppendEntryResponse
from dledger.ratelog import RateLimitedLog

log = Logger()


def check_append(server: Any, request: AppendEntryRequest, queued: int) -> list[bytes]:
    """The bodies of ``request`` if this member may append them now (``queued``: requests accepted before it)."""
    st = server.state
    if st.role is not Role.LEADER or server.replicator is None:
        raise server.not_leader()
    if st.transferee is not None:
        raise DLedgerError(ResponseCode.LEADER_TRANSFERRING, f"transferring leadership to {st.transferee}",
                           leader_id=st.leader_id)
    bodies = request.bodies()
    if not bodies:
        raise DLedgerError(ResponseCode.REQUEST_WITH_EMPTY_BODYS, "no body to append", leader_id=st.leader_id)
    pending = server.pending
    if len(pending) + queued >= pending.limit:
        raise DLedgerError(ResponseCode.LEADER_PENDING_FULL,
                           f"{len(pending) + queued} appends already wait for the quorum", leader_id=st.leader_id)
    limit = server.config.max_entry_size - HEADER_SIZE
    for body in bodies:
        if len(body) > limit:
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT,
                               f"body of {len(body)} bytes exceeds maxEntrySize {server.config.max_entry_size}",
                               leader_id=st.leader_id)
    return bodies


def append_requests(server: Any, requests: Sequence[AppendEntryRequest]) -> list:
    """Answer APPEND requests together: for each a Deferred (fires when its last entry commits) or a Failure.

    A request refused by its checks fails alone.  The accepted ones share
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
            server.check_request(request)
            accepted.append((i, check_append(server, request, len(accepted))))
        except DLedgerError:
            results[i] = Failure()
    if not accepted:
        return results
    term, replicator, stats = server.state.curr_term, server.replicator, server.stats
    started = server.clock.seconds() if stats is not None else 0.0
    group, self_id, pending = server.config.group, server.self_id, server.pending
    all_stored: list[Entry] = []
    todo = accepted
    while todo:
        entries = [Entry(body=body, term=term) for _, bodies in todo for body in bodies]
        try:
            stored = server.append_batch(entries)
            error = None
        except BatchAppendError as exc:
            stored, error = exc.stored, exc.cause
            error.leader_id = server.state.leader_id
        all_stored += stored
        end, rest = 0, []
        for k, (i, bodies) in enumerate(todo):
            end += len(bodies)
            if end > len(stored):
                results[i] = Failure(error)
                if isinstance(error, AppendHookError):
                    _hook_failed(server, error)
                    rest = todo[k + 1:]  # only this request failed: go on with the others
                else:
                    for j, _ in todo[k + 1:]:
                        results[j] = Failure(error)
                break
            last = stored[end - 1]
            d = pending.add(last.index, AppendEntryResponse(group=group, term=term, index=last.index, pos=last.pos,
                                                            leader_id=self_id))
            if stats is not None:
                stats.append_accepted(d, len(bodies), sum(map(len, bodies)), started)
            results[i] = d
        todo = rest
    if all_stored:
        replicator.recent.extend(all_stored)
        replicator.entries_appended(all_stored[-1].index)
    return results


def _hook_failed(server: Any, error: AppendHookError) -> None:
    """The client only sees the code (Java's reply shape): say why on the leader, at most once per 10 s."""
    hook_log = getattr(server, "_hook_failure_log", None)
    if hook_log is None:
        hook_log = server._hook_failure_log = RateLimitedLog(log, server.clock)
    hook_log.warn("append-hook", "{id}: append refused: {error}", id=server.self_id, error=error)
