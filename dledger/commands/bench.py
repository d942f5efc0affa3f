"""``dledger bench``: benchmarks, one sub-command per subject (``store``, ``cluster``, and
plugins' subjects through the ``dledger_bench_subjects`` hook)."""

from __future__ import annotations

import json
import sys

from dledger.bench import cluster as cluster_bench
from dledger.bench import install as install_bench
from dledger.bench import store as store_bench
from dledger.commands.argtypes import non_negative_int, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run a benchmark", description="Benchmarks; see docs/benchmarks.md.")
    sub = p.add_subparsers(dest="bench_command", metavar="SUBJECT")
    _register_store(sub)
    cluster_bench.register(sub)
    install_bench.register(sub)
    from dledger import plugins

    # Plugins' benchmarks, each on its own: one that fails is a line on stderr, the others still work.
    for problem in plugins.call_each(plugins.get_plugin_manager(), "dledger_bench_subjects", subparsers=sub):
        print(problem, file=sys.stderr)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def _register_store(sub) -> None:
    s = sub.add_parser("store", help="append and flush entries on one store",
                       description="Append COUNT entries of SIZE bytes as a leader, in batches of BATCH, flushing "
                                   "each batch (sync) or on the store's timer (async); print entries/s, MB/s, flush "
                                   "latency and reactor-blocked percentiles and RSS.")
    s.add_argument("--store", choices=store_bench.STORES, default="mmap")
    s.add_argument("--size", type=non_negative_int, default=1024, help="body bytes per entry (default 1024)")
    s.add_argument("--count", type=positive_int, default=100_000, help="entries (default 100000)")
    s.add_argument("--batch", type=positive_int, default=256, help="entries per flush (default 256)")
    s.add_argument("--flush", choices=("sync", "async"), default="sync", help="flush policy (default sync)")
    s.add_argument("--io", choices=("inline", "thread"), default="inline",
                   help="run fsync inline or on worker threads, as a member does (default inline)")
    s.add_argument("--pipeline", action="store_true",
                   help="with --io thread: append the next batch while the previous one is being flushed")
    s.add_argument("--dir", dest="directory", default=None, help="empty directory for the store (default: temp)")
    s.add_argument("--keep", action="store_true", help="keep the store files afterwards")
    s.add_argument("--data-file-size", type=positive_int, default=1 << 30, metavar="BYTES")
    s.add_argument("--index-file-size", type=positive_int, default=160 << 20, metavar="BYTES")
    s.add_argument("--json", action="store_true", help="print the result as JSON")
    s.set_defaults(func=cmd_bench_store)


def cmd_bench_store(args) -> int:
    opts = store_bench.StoreBenchOptions(
        store=args.store, size=args.size, count=args.count, batch=args.batch, flush=args.flush, io=args.io,
        pipeline=args.pipeline, directory=args.directory, keep=args.keep, data_file_size=args.data_file_size,
        index_file_size=args.index_file_size)
    if opts.io == "thread":
        result = _run_under_reactor(opts)
    else:
        result = store_bench.run_inline(opts)
    print(json.dumps(result.as_dict(), sort_keys=True) if args.json else store_bench.format_result(result))
    return 0


def _run_under_reactor(opts):
    from twisted.internet import reactor
    from twisted.internet.defer import CancelledError, Deferred

    outcome = []
    stopping: list[bool] = []

    def start():
        d = Deferred.fromCoroutine(store_bench.run_threaded(reactor, opts))
        d.addBoth(outcome.append)
        d.addBoth(lambda _: None if stopping else reactor.stop())
        def cancel():
            # A signal stops the reactor with the run in the middle: cancel it; the reactor waits for the run to
            # shut its store down (flush rounds on worker threads) before it stops and the directory is removed.
            stopping.append(True)
            d.cancel()
            return d

        reactor.addSystemEventTrigger("before", "shutdown", cancel)

    reactor.callWhenRunning(start)
    reactor.run()  # SIGTERM/SIGINT stop the reactor; the before-shutdown trigger unwinds the run first
    if not outcome or (hasattr(outcome[0], "check") and outcome[0].check(CancelledError)):
        raise interrupted(reactor)  # stopped by a signal; the store directory is gone
    if hasattr(outcome[0], "raiseException"):
        outcome[0].raiseException()
    return outcome[0]


def interrupted(reactor) -> KeyboardInterrupt:
    """The exception that ends a command whose reactor a signal stopped: Terminated for SIGTERM (exit 143)."""
    import signal

    from dledger.cli import Terminated

    signum = getattr(reactor, "_exitSignal", None)  # which signal twistd-style reactors record
    return Terminated(signum) if signum == signal.SIGTERM else KeyboardInterrupt()
