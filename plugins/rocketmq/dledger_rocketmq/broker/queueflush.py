"""Consume-queue durability on a member: the periodic flush and the flush a snapshot waits for.

The queues' fsyncs run on the member's BlockingIO (a pool thread), one round at a time: the next periodic
round is scheduled when the last is done, so a slow disk never has two running, and a snapshot at index
``i`` waits for dispatch to reach ``i``, then for its own flush and any periodic one still running, before
it records the queues' next offsets (their units durable before compaction may delete the entries).
Apart from the :class:`~dledger_rocketmq.broker.broker.Broker` because timers and flush rounds are their
own concern.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred, gatherResults
from twisted.logger import Logger

from dledger_rocketmq.store.metadata import MetadataError

log = Logger()


class QueueFlusher:
    """Flush rounds of ``dispatcher``'s queues every ``interval`` seconds (0: at stop only) while ``running()``."""

    #: Seconds a snapshot waits for the consume-queue dispatch to reach its index before it fails (one line).
    snapshot_dispatch_timeout = 60.0

    def __init__(self, server: Any, dispatcher: Any, machine: Any, interval: float,
                 running: Callable[[], bool]) -> None:
        self.server = server
        self.dispatcher = dispatcher
        self.machine = machine
        self.interval = interval
        self.running = running
        self._timer = None
        #: A periodic flush whose fsyncs still run (None when none does).
        self.flushing: Deferred | None = None

    def start(self) -> None:
        if self.interval > 0:
            self._timer = self.server.clock.callLater(self.interval, self._flush)

    def stop(self) -> None:
        if self._timer is not None and self._timer.active():
            self._timer.cancel()
        self._timer = None

    def _flush(self) -> None:
        self._timer = None
        if not self.running():
            return

        def failed(failure):
            failure.trap(OSError)
            log.error("{id}: consume-queue flush failed: {exc}", id=self.server.self_id, exc=failure.value)

        def done(_):
            self.flushing = None
            if self.running():
                self.start()
        d = self.dispatcher.flush_with(self.server.blocking_io).addErrback(failed).addBoth(done)
        self.flushing = None if d.called else d

    def queue_state(self, index: int) -> Deferred:
        """For a snapshot at ``index``: the next offset of every consume queue once dispatch reached ``index``,
        after the queues are flushed (a periodic flush still running is waited for too)."""
        wait = self.dispatcher.wait_dispatched(index)
        timer = self.server.clock.callLater(self.snapshot_dispatch_timeout, wait.cancel)

        def stop_timer(result):
            if timer.active():
                timer.cancel()
            return result

        def timed_out(failure):
            failure.trap(CancelledError)
            raise MetadataError(f"{self.server.self_id}: consume-queue dispatch did not reach index {index} "
                                f"within {self.snapshot_dispatch_timeout:g} s (lag {self.dispatcher.lag()} bytes)")

        def table(_):
            queues = self.dispatcher.queues
            out = dict(self.machine.queue_bases)
            if queues is not None:
                for q in queues.queues():
                    key = (q.topic, q.queue_id)
                    out[key] = max(out.get(key, 0), q.max_offset)
            flushed = self.dispatcher.flush_with(self.server.blocking_io)
            if self.flushing is not None:  # a periodic flush took queues before this one: wait for it too
                periodic = Deferred()
                self.flushing.addBoth(lambda r: (periodic.callback(None), r)[1])
                flushed = gatherResults([flushed, periodic], consumeErrors=True)
            return flushed.addCallback(lambda _: out)
        return wait.addBoth(stop_timer).addErrback(timed_out).addCallback(table)
