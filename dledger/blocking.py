"""A blocking client for scripts and non-Twisted programs: ``BlockingClient(peers, group).append(b"x")``.

It owns a private reactor running in one background thread
(:class:`ReactorThread`) -- the only thread dledger itself starts.  Each call hands the request to that reactor
and waits for the answer, so any number of threads may share one client.
The reactor is not the global one (it does not register itself as
Twisted's I/O thread), so the program may run its own reactor too.

    with BlockingClient("n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913", "g0") as c:
        r = c.append(b"hello")          # AppendEntryResponse: r.index, r.term, r.pos
        [e] = c.get(r.index)            # Entry: e.body == b"hello"
        c.metadata()                    # leader's view; c.metadata("n1") for one member
        c.transfer("n1")

Errors are :class:`dledger.errors.DLedgerError` (``.code``: NOT_LEADER, TIMEOUT, ...).
Appends are at least once, as with :class:`dledger.client.DLedgerClient`.
"""

from __future__ import annotations

import threading  # allowed: the blocking clients' reactor thread (ReactorThread, see module docstring)
from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.internet.defer import TimeoutError as DeferredTimeout
from twisted.internet.threads import blockingCallFromThread

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError


def private_reactor() -> Any:
    """A reactor instance of our own (epoll where available), not installed as the global one.

    Public so that other blocking clients (e.g. a plugin's) run their private reactor thread the same way.
    """
    try:
        from twisted.internet.epollreactor import EPollReactor as Reactor
    except ImportError:  # pragma: no cover - not Linux
        from twisted.internet.selectreactor import SelectReactor as Reactor
    reactor = Reactor()
    reactor._registerAsIOThread = False  # leave twisted.python.threadable's I/O thread alone
    return reactor


class ReactorThread:
    """A private reactor (:func:`private_reactor`) running in one daemon thread: what a blocking client stands on.

    ``call(fn, timeout)`` runs ``fn`` on that reactor (it returns a Deferred or a plain value) and blocks the
    calling thread until the result is there, which it returns (or raises the failure's exception); any number
    of threads may call at once.  ``timeout`` (seconds, None: wait as long as it takes) cancels a Deferred still
    pending and raises ``twisted.internet.defer.TimeoutError``.  ``stop()`` stops the reactor and joins the
    thread (idempotent); a call after it raises RuntimeError.  :class:`BlockingClient`, the RocketMQ plugin's
    blocking client and ``dledger rocketmq migrate-check`` all run on one.

        thread = ReactorThread("my-client")
        try:
            client = thread.call(lambda: connect(thread.reactor, ...))
            print(thread.call(lambda: client.ping(), timeout=5))
        finally:
            thread.stop()
    """

    def __init__(self, name: str = "dledger-reactor") -> None:
        self.reactor = private_reactor()
        self._stopped = False
        self._thread = threading.Thread(target=self.reactor.run, kwargs={"installSignalHandlers": False},
                                        name=name, daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        """``fn()`` on the reactor thread, its (Deferred's) result here; see the class docstring."""
        if self._stopped:
            raise RuntimeError(f"{self._thread.name}: the reactor thread is stopped")

        def run() -> Deferred:
            d = maybeDeferred(fn)
            if timeout is not None:
                d.addTimeout(timeout, self.reactor)
            return d
        return blockingCallFromThread(self.reactor, run)

    @property
    def alive(self) -> bool:
        """The reactor thread runs (False once :meth:`stop` returned)."""
        return self._thread.is_alive()

    def stop(self, join_timeout: float = 10.0) -> None:
        """Stop the reactor and wait up to ``join_timeout`` seconds for its thread to end (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        self.reactor.callFromThread(self.reactor.stop)
        self._thread.join(join_timeout)


class BlockingClient:
    """Blocking calls to a group over TCP; ``close()`` (or a ``with`` block) stops the background reactor."""

    def __init__(self, peers: str, group: str, *, timeout: float = 10.0, request_timeout: float = 3.0,
                 **client_options: Any):
        from dledger.client import connect

        self.timeout = timeout
        self._closed = False
        self._thread = ReactorThread("dledger-blocking-client")
        try:
            self._client = self._thread.call(lambda: connect(peers, group, reactor=self._thread.reactor,
                                                             request_timeout=request_timeout, **client_options))
        except BaseException:
            self._thread.stop()
            raise

    def _call(self, fn: Callable[[], Deferred], timeout: float | None = None) -> Any:
        if self._closed:
            raise DLedgerError(ResponseCode.NETWORK_ERROR, "client is closed")
        limit = self.timeout if timeout is None else timeout
        try:
            return self._thread.call(fn, limit)
        except DeferredTimeout:
            raise DLedgerError(ResponseCode.TIMEOUT, f"no answer within {limit:g}s") from None

    # -- API ---------------------------------------------------------------------------------
    def append(self, body: bytes, timeout: float | None = None) -> Any:
        """Append one body; the AppendEntryResponse (``index``, ``term``, ``pos``) once it is committed."""
        return self._checked(self._call(lambda: self._client.append(body), timeout))

    def append_batch(self, bodies: list[bytes], timeout: float | None = None) -> Any:
        """Append several bodies as consecutive entries; the response carries the last one's index."""
        return self._checked(self._call(lambda: self._client.append_batch(list(bodies)), timeout))

    def get(self, index: int, count: int = 1, timeout: float | None = None, *, member: str | None = None) -> list:
        """Committed entries from ``index`` (at most ``count``; NOOPs skipped); ``member``: ask that one only."""
        return self._call(lambda: self._client.get(index, count, member=member), timeout)

    def get_raw(self, index: int, count: int = 1, timeout: float | None = None, *, member: str | None = None):
        """:meth:`DLedgerClient.get_raw`: the GET reply with its entries as bytes, for bulk readers."""
        return self._call(lambda: self._client.get_raw(index, count, member=member), timeout)

    def request(self, code: int, body: bytes = b"", timeout: float | None = None, *, retry_ambiguous: bool = False,
                member: str | None = None) -> bytes:
        """A plugin's request (``DLedgerClient.request``): the reply's bytes, or a DLedgerError with its reason."""
        return self._call(lambda: self._client.request(code, body, retry_ambiguous=retry_ambiguous, member=member),
                          timeout)

    def metadata(self, member: str | None = None, timeout: float | None = None) -> Any:
        """Detailed metadata (role, term, indexes) of ``member``, or of whichever member answers first."""
        return self._checked(self._call(lambda: self._client.metadata(member), timeout))

    def find_leader(self, timeout: float | None = None) -> Any:
        """The leader's detailed metadata (``leader_id``, ``committed_index``, ``ledger_begin_index`` ...)."""
        return self._call(self._client.find_leader, timeout)

    def transfer(self, to: str, timeout: float | None = None) -> Any:
        """Move leadership to member ``to``; the LeadershipTransferResponse."""
        return self._call(lambda: self._client.transfer(to), timeout)

    # membership (issue #23): DLedgerClient's calls, each waiting for its Deferred
    def members(self, member: str | None = None, timeout: float | None = None) -> Any:
        """The configuration (a :class:`dledger.member_changes.MembersView`) from the leader, or ``member``."""
        return self._call(lambda: self._client.members(member), timeout)

    def add_member(self, member_id: str, address: str, learner: bool = False, timeout: float | None = None) -> Any:
        """Add a member started with ``--join``; the new MembersView once committed."""
        return self._call(lambda: self._client.add_member(member_id, address, learner), timeout)

    def promote_member(self, member_id: str, timeout: float | None = None) -> Any:
        return self._call(lambda: self._client.promote_member(member_id), timeout)

    def remove_member(self, member_id: str, timeout: float | None = None) -> Any:
        return self._call(lambda: self._client.remove_member(member_id), timeout)

    def replace_member(self, old: str, new_id: str, new_address: str, *, progress=None,
                       catch_up_timeout: float = 600.0) -> Any:
        """Add, wait until a voter, remove (``DLedgerClient.replace_member``); ``progress`` runs on the
        client's reactor thread.  Waits up to ``catch_up_timeout`` plus the time of the three changes."""
        return self._call(lambda: self._client.replace_member(old, new_id, new_address, progress=progress,
                                                              catch_up_timeout=catch_up_timeout),
                          catch_up_timeout + 3 * self.timeout)

    @property
    def thread_alive(self) -> bool:
        """The client's reactor thread runs (False once :meth:`close` returned)."""
        return self._thread.alive

    def close(self) -> None:
        """Close the connections and stop the reactor thread (idempotent)."""
        if self._closed:
            return
        try:
            self._call(self._client.close, timeout=5.0)
        except DLedgerError:
            pass
        self._closed = True
        self._thread.stop()

    def __enter__(self) -> BlockingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @staticmethod
    def _checked(resp: Any) -> Any:
        if resp.response_code is not ResponseCode.SUCCESS:
            raise DLedgerError(resp.response_code, "", leader_id=resp.leader_id)
        return resp
