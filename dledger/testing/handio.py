"""A BlockingIO whose calls run only when the test says so: what happens while a pool thread would be busy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import Deferred, maybeDeferred


class HandIO:
    """Stands in for :class:`dledger.diskio.BlockingIO` (``threaded``): ``run`` only queues the call.

    A test then completes the calls in the order it wants (:meth:`complete`,
    :meth:`step`, :meth:`drain`) or fails one (:meth:`fail`), and checks
    what the code did meanwhile -- a store's flush round, a vote written
    before it is answered, a broker's consume-queue sync.
    """

    threaded = True

    def __init__(self) -> None:
        #: The queued calls: ``(fn, args, deferred)``, oldest first.
        self.calls: list[tuple[Callable[..., Any], tuple, Deferred]] = []
        #: How many calls were asked to run on the caller's thread (``run_here``).
        self.here = 0

    def run(self, fn: Callable[..., Any], *args: Any) -> Deferred:
        d = Deferred()
        self.calls.append((fn, args, d))
        return d

    def run_here(self, fn: Callable[..., Any], *args: Any) -> Deferred:
        """Queued as :meth:`run` is (the test still decides when it ends); counted in :attr:`here`."""
        self.here += 1
        return self.run(fn, *args)

    def complete(self, i: int = 0) -> None:
        """Run queued call ``i`` now; its Deferred fires with the result or the exception."""
        fn, args, d = self.calls.pop(i)
        maybeDeferred(fn, *args).chainDeferred(d)

    def fail(self, i: int = 0, exc: Exception | None = None) -> None:
        """Fail queued call ``i`` without running it (default: a disk-full OSError)."""
        _fn, _args, d = self.calls.pop(i)
        d.errback(exc or OSError("disk full"))

    def step(self) -> None:
        """Run every call queued so far (calls they queue wait for the next step)."""
        calls, self.calls = self.calls, []
        for fn, args, d in calls:
            maybeDeferred(fn, *args).chainDeferred(d)

    def drain(self) -> None:
        """Run calls until none is queued."""
        while self.calls:
            self.step()
