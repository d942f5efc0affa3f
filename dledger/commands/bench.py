"""``dledger bench``: benchmarks, one sub-command per subject (``store``, ``cluster``, and
plugins' subjects through the ``dledger_bench_subjects`` hook)."""

from __future__ import annotations

import json
import sys

from dledger.bench import cluster as cluster_bench
from dledger.bench import install as install_bench
from dledger.bench import members as members_bench
from dledger.bench import store as store_bench
from dledger.bench.signals import interrupted
from dledger.commands.argtypes import non_negative_int, positive_int


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="run a benchmark", description="Benchmarks; see docs/benchmarks.md.")
    sub = p.add_subparsers(dest="bench_command", metavar="SUBJECT")
    _register_store(sub)
    cluster_bench.register(sub)
    _register_snapshot(sub)
    install_bench.register(sub)
    members_bench.register(sub)
    _register_plot(sub)
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


def _register_snapshot(sub) -> None:
    s = sub.add_parser("snapshot", help="restart time with and without a snapshot; a snapshot's cost on appends",
                       description="restart: a member with COUNT entries restarted until its state machine applied "
                                   "the whole log, without a snapshot and with one TAIL entries before the end "
                                   "(interleaved runs, medians, ratio). cost: append throughput while a snapshot "
                                   "of KEYS keys is taken against windows of the same length without one "
                                   "(interleaved). See docs/benchmarks.md.")
    s.add_argument("what", choices=("restart", "cost", "both"), nargs="?", default="both")
    s.add_argument("--count", type=positive_int, default=1_000_000, help="restart: entries in the log (1000000)")
    s.add_argument("--tail", type=non_negative_int, default=10_000,
                   help="restart: entries after the snapshot (10000)")
    s.add_argument("--size", type=positive_int, default=64, help="body bytes per entry (64)")
    s.add_argument("--keys", type=positive_int, default=None,
                   help="distinct keys of the state machine (restart 100000, cost 1000000)")
    s.add_argument("--batch", type=positive_int, default=256, help="cost: entries per flushed batch (256)")
    s.add_argument("--runs", type=positive_int, default=3, help="interleaved runs of each kind (3)")
    s.add_argument("--encode", choices=("reactor", "thread"), default="reactor",
                   help="cost: the machine turns its frozen copy into bytes on the reactor thread or on a "
                        "BlockingIO worker (default reactor)")
    s.add_argument("--dir", dest="directory", default=None, help="directory for the stores (default: temp)")
    s.add_argument("--json", action="store_true", help="print the results as JSON")
    s.set_defaults(func=cmd_bench_snapshot)


def cmd_bench_snapshot(args) -> int:
    from dledger.bench import snapshot as snap_bench

    if args.what in ("restart", "both"):
        if args.tail >= args.count:
            print(f"dledger bench snapshot: --tail {args.tail} must be below --count {args.count}", file=sys.stderr)
            return 2
        r = snap_bench.run_restart(args.count, args.tail, args.size, args.keys or 100_000, args.runs, args.directory)
        print(snap_bench.to_json({"restart": r.as_dict()}) if args.json else snap_bench.format_restart(r))
    if args.what in ("cost", "both"):
        from twisted.internet.defer import Deferred
        from twisted.internet.task import react

        out = []

        def main(reactor):
            d = Deferred.fromCoroutine(snap_bench.run_cost(reactor, args.keys or 1_000_000, args.batch, args.size,
                                                           args.runs, args.directory, args.encode))
            return d.addCallback(out.append)

        try:
            react(main)
        except SystemExit as exc:
            if exc.code:
                return int(exc.code)
        r = out[0]
        print(snap_bench.to_json({"cost": r}) if args.json else snap_bench.format_cost(r))
def _register_plot(sub) -> None:
    from dledger.bench.plot import plot_path

    s = sub.add_parser("plot", help="draw the plot of a saved 'dledger bench cluster --json' result",
                       description="Draw throughput over time, latency percentiles and the failover timeline of a "
                                   "result saved with 'dledger bench cluster --json > RESULT.json' (what --plot "
                                   "draws at the end of a run). Needs matplotlib: pip install 'dledger[plot]'.")
    s.add_argument("result", metavar="RESULT.json", help="the JSON object 'dledger bench cluster --json' printed")
    s.add_argument("output", metavar="FILE.svg", type=plot_path, help="the plot to write (.svg, .png or .pdf)")
    s.set_defaults(func=cmd_bench_plot)


def cmd_bench_plot(args) -> int:
    from dledger.bench import plot
    from dledger.errors import ConfigError

    try:
        with open(args.result, encoding="utf-8") as fh:
            result = json.load(fh)
    except OSError as e:
        raise ConfigError(f"{args.result}: {e.strerror}") from None
    except ValueError as e:
        raise ConfigError(f"{args.result}: not a 'dledger bench cluster --json' result: {e}") from None
    if not isinstance(result, dict):
        raise ConfigError(f"{args.result}: not a 'dledger bench cluster --json' result (not a JSON object)")
    drawn = plot.write(result, args.output)
    print(f"{args.output}: {', '.join(drawn)}")
    return 0


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
