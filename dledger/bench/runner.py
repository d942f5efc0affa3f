"""How a benchmark command runs: its coroutine under ``react``, progress on stderr, results on stdout.

One place for what every process-starting benchmark needs (``dledger bench cluster``, plugin subjects
such as ``dledger bench rocketmq``): SIGTERM or Ctrl-C cancel the run first, so its ``finally`` stops
the members it started and removes its temporary directory, and the command then exits as the
signal says (143 / 130) instead of printing a traceback.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.task import react


def progress(text: str) -> None:
    """A progress line (stderr, so ``--json`` output on stdout stays parseable)."""
    print(f"  .. {text}", file=sys.stderr, flush=True)


def run_benchmark(run: Callable[[Any, Callable[[str], None]], Awaitable[dict]],
                  format_results: Callable[[dict], str], *, as_json: bool) -> int:
    """Run ``run(reactor, say)`` to completion and print its result dict (JSON or formatted); exit status 0.

    An error inside the run propagates (the CLI turns DLedgerError/ConfigError into one line); a signal
    raises KeyboardInterrupt or :class:`dledger.cli.Terminated` after the run has cleaned up.
    """
    outcome: list = []

    def main(reactor):
        d = Deferred.fromCoroutine(run(reactor, progress))
        d.addBoth(outcome.append)
        reactor.addSystemEventTrigger("before", "shutdown", d.cancel)
        return d

    try:
        react(main)
    except SystemExit:
        pass
    if not outcome or (hasattr(outcome[0], "check") and outcome[0].check(CancelledError)):
        from twisted.internet import reactor

        from dledger.bench.signals import interrupted

        raise interrupted(reactor)
    if hasattr(outcome[0], "raiseException"):
        outcome[0].raiseException()
    print(json.dumps(outcome[0], sort_keys=True) if as_json else format_results(outcome[0]))
    return 0
