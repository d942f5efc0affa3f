"""Where a request's time goes in each member process: a stage tracer loaded through ``sitecustomize``.

Put this directory first on ``PYTHONPATH`` and name an output directory in ``DLEDGER_STAGE_TRACE``; every
Python process started with that environment (``dledger bench cluster``'s members inherit it) then wraps a
few functions of the core with ``perf_counter`` stamps and writes ``PID.json`` at exit: percentiles in ms of

* ``leader_append_to_commit`` (a client append stored -> its entry committed, per request),
* ``push_rtt`` (an APPEND push sent -> its reply, on the leader), ``follower_push_to_reply`` (on a follower),
* ``flush_wait`` (a durability wait -> durable), ``io_handoff_in`` / ``io_job`` / ``io_handoff_out`` (a
  ``BlockingIO`` job queued -> started on its thread -> done -> its result back on the reactor),
* ``pump_sched_lag`` / ``flush_sched_lag`` (a ``callLater(0)`` pump or flush asked -> run: the reactor turn),
* ``loop_busy`` / ``poll_wait`` (the reactor between two polls, and inside ``epoll``),
* ``write_to_send`` (a TCP connection's first buffered ``write`` -> the ``doWrite`` that sends it) and
  ``read_before_write`` (a ``doRead`` on a connection whose written bytes still wait: the reads handled first),
  each ``_accepted`` (a connection a member accepted: its replies) or ``_opened`` (one it opened: its pushes,
  the load generator's requests),
* ``gc_gen0`` / ``gc_gen1`` / ``gc_gen2`` (each cyclic garbage collection's pause, once the reactor runs:
  start-up's collections are left out), with the process's ``switch_interval_ms`` and ``gc_threshold``.

A measuring tool for issue #28 (docs/benchmarks.md, "Round 2c"), not part of dledger: it patches private
methods by name and adds its own cost to every stage (the same on both sides of an interleaved comparison).
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from time import perf_counter as now

OUT = os.environ.get("DLEDGER_STAGE_TRACE")
SAMPLES: dict[str, list[float]] = {}
#: Set at the reactor's first poll: garbage collections are recorded from then on.
REACTOR_RUNNING = False


def record(key: str, seconds: float) -> None:
    SAMPLES.setdefault(key, []).append(seconds)


def dump() -> None:
    import gc

    result: dict = {"argv": sys.argv[-6:], "switch_interval_ms": sys.getswitchinterval() * 1e3,
                    "gc_threshold": gc.get_threshold()}
    for key, values in SAMPLES.items():
        values.sort()
        n = len(values)
        result[key] = {"n": n, "p50": values[n // 2] * 1e3, "p90": values[int(n * 0.9)] * 1e3,
                       "p99": values[int(n * 0.99)] * 1e3, "max": values[-1] * 1e3, "sum_s": sum(values)}
    with open(os.path.join(OUT, f"{os.getpid()}.json"), "w") as f:
        json.dump(result, f)


def timed(d, key: str, t0: float):
    def done(result):
        record(key, now() - t0)
        return result
    d.addCallback(done)


def install() -> None:
    from twisted.internet import epollreactor

    from dledger import diskio
    from dledger.replication import appends, durability, follower, leader

    append_requests = appends.ClientAppends.append_requests

    def traced_append_requests(self, requests, replicator, answer=None, tokens=()):
        t0 = now()
        if answer is None:  # Deferreds (and a tree whose append_requests takes no answer)
            results = append_requests(self, requests, replicator)
        else:  # waiters answered by a call (IAnsweringRequestHandler): time the call
            def timed_answer(token, response, inner=answer):
                record("leader_append_to_commit", now() - t0)
                inner(token, response)
            results = append_requests(self, requests, replicator, timed_answer, tokens)
        for d in results:
            if hasattr(d, "addCallback"):
                timed(d, "leader_append_to_commit", t0)
        return results
    appends.ClientAppends.append_requests = traced_append_requests

    wait = durability.Flusher.wait

    def traced_wait(self, index):
        d = wait(self, index)
        timed(d, "flush_wait", now())
        return d
    durability.Flusher.wait = traced_wait

    schedule, flush = durability.Flusher._schedule, durability.Flusher._flush

    def traced_schedule(self):
        was = self._scheduled
        schedule(self)
        if was is None and self._scheduled is not None:
            self._trace_asked = now()

    def traced_flush(self):
        asked = getattr(self, "_trace_asked", None)
        if asked is not None:  # asked through callLater(0) (None: started at once)
            record("flush_sched_lag", now() - asked)
            self._trace_asked = None
        flush(self)
    durability.Flusher._schedule, durability.Flusher._flush = traced_schedule, traced_flush

    handle_push = follower.EntryHandler.handle_push

    def traced_handle_push(self, req):
        d = handle_push(self, req)
        if req.batch_entry:
            timed(d, "follower_push_to_reply", now())
        return d
    follower.EntryHandler.handle_push = traced_handle_push

    send = leader.EntryDispatcher._send

    def traced_send(self, req, on_reply, on_fail):
        t0, is_append = now(), bool(req.batch_entry)

        def reply(resp):
            if is_append:
                record("push_rtt", now() - t0)
            on_reply(resp)
        send(self, req, reply, on_fail)
    leader.EntryDispatcher._send = traced_send

    schedule_pump, pump_all = leader.LeaderReplicator.schedule_pump, leader.LeaderReplicator._pump_all

    def traced_schedule_pump(self):
        if self._pump_scheduled is None:
            self._trace_pump_asked = now()
        schedule_pump(self)

    def traced_pump_all(self):
        record("pump_sched_lag", now() - self._trace_pump_asked)
        pump_all(self)
    leader.LeaderReplicator.schedule_pump, leader.LeaderReplicator._pump_all = traced_schedule_pump, traced_pump_all

    run = diskio.BlockingIO.run

    def traced_run(self, fn, *args):
        if not self.threaded or self.stopped:
            return run(self, fn, *args)
        queued, stamps = now(), {}

        def job(*a):
            started = now()
            record("io_handoff_in", started - queued)
            try:
                return fn(*a)
            finally:
                stamps["end"] = now()
                record("io_job", stamps["end"] - started)

        def back(result):
            if "end" in stamps:
                record("io_handoff_out", now() - stamps["end"])
            return result
        return run(self, job, *args).addBoth(back)
    diskio.BlockingIO.run = traced_run

    from twisted.internet import tcp

    #: Which end of the connection: an accepted one (a member's answers to its callers) or an opened one.
    _SIDE = {"Server": "_accepted", "Client": "_opened"}

    fd_write, fd_write_sequence = tcp.Connection.write, tcp.Connection.writeSequence
    fd_do_write, fd_do_read = tcp.Connection.doWrite, tcp.Connection.doRead

    def stamp_first_write(self):
        if getattr(self, "_trace_w", None) is None and not self._tempDataLen and len(self.dataBuffer) == self.offset:
            self._trace_w = now()

    def traced_write(self, data):
        stamp_first_write(self)
        fd_write(self, data)

    def traced_write_sequence(self, iovec):
        stamp_first_write(self)
        fd_write_sequence(self, iovec)

    def traced_do_write(self):
        t0 = getattr(self, "_trace_w", None)
        if t0 is not None:
            record("write_to_send" + _SIDE.get(type(self).__name__, ""), now() - t0)
            self._trace_w = None
        return fd_do_write(self)

    def traced_do_read(self):
        if getattr(self, "_trace_w", None) is None:
            return fd_do_read(self)
        t0 = now()
        try:
            return fd_do_read(self)
        finally:
            record("read_before_write" + _SIDE.get(type(self).__name__, ""), now() - t0)
    tcp.Connection.write, tcp.Connection.writeSequence = traced_write, traced_write_sequence
    tcp.Connection.doWrite, tcp.Connection.doRead = traced_do_write, traced_do_read

    import gc

    gc_started: list[float] = []

    def gc_pause(phase, info):
        if phase == "start":
            gc_started[:] = [now()]
        elif gc_started and REACTOR_RUNNING:
            record(f"gc_gen{info['generation']}", now() - gc_started[0])
    gc.callbacks.append(gc_pause)

    class Poller:
        """The reactor's epoll object, timing each poll and the busy stretch since the previous one."""

        def __init__(self, poller):
            self._poller, self._last = poller, None

        def poll(self, timeout=-1, maxevents=-1):
            global REACTOR_RUNNING
            REACTOR_RUNNING = True
            t0 = now()
            if self._last is not None:
                record("loop_busy", t0 - self._last)
            events = self._poller.poll(timeout, maxevents)
            self._last = now()
            record("poll_wait", self._last - t0)
            return events

        def __getattr__(self, name):
            return getattr(self._poller, name)

    init = epollreactor.EPollReactor.__init__

    def traced_init(self):
        init(self)
        self._poller = Poller(self._poller)
    epollreactor.EPollReactor.__init__ = traced_init
    atexit.register(dump)


if OUT:
    try:
        install()
    except Exception as exc:  # a tree without one of the patched names: say so, run untraced
        print(f"stage trace off: {exc}", file=sys.stderr)
