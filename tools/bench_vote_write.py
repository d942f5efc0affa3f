"""Micro-benchmark: how long answering a granted vote keeps the reactor thread busy, inline vs threaded I/O.

A member built as twistd builds it (file term/vote store, real fsyncs in ``--dir``) answers ``--votes``
vote requests, each in a new term.  For each I/O mode (inline, then the reactor's thread pool, repeated
``--rounds`` times, interleaved) it prints the median time ``handle_vote`` held the reactor thread and the
median time until the reply existed.

Usage: python -m tools.bench_vote_write [--votes 50] [--rounds 2] [--dir DIR]
"""

from __future__ import annotations

import argparse
import tempfile
import time

from twisted.internet import defer, task


def median_ms(values: list[float]) -> float:
    return sorted(values)[len(values) // 2] * 1000.0


@defer.inlineCallbacks
def measure(reactor, threaded: bool, votes: int, directory: str | None):
    from dledger.config import make_config
    from dledger.diskio import BlockingIO
    from dledger.messages import VoteRequest
    from dledger.server import DLedgerServer
    from dledger.store.termvote import FileTermVoteStore
    from dledger.transport.inprocess import InProcessNetwork

    config = make_config(preset="fast", group="g0", self_id="n1",
                         peers="n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913",
                         store_type="memory", transport_type="inprocess")
    with tempfile.TemporaryDirectory(prefix="dledger-vote-", dir=directory) as member_dir:
        term_store = FileTermVoteStore(member_dir)
        server = DLedgerServer.build(config, clock=reactor, term_store=term_store,
                                     blocking_io=BlockingIO(reactor, threaded=threaded),
                                     network=InProcessNetwork(reactor))
        state, blocked, replied = server.state, [], []
        try:
            for _ in range(votes):
                state.known_max_term = state.curr_term + 1
                state.next_term()  # a candidate of a new term, with no vote yet
                yield state.persisted()
                req = VoteRequest(group="g0", term=state.curr_term, ledger_end_term=9, ledger_end_index=9,
                                  leader_id="n2", local_id="n2", remote_id="n1")
                start = time.perf_counter()
                d = server.elector.handle_vote(req)
                blocked.append(time.perf_counter() - start)
                reply = yield d
                replied.append(time.perf_counter() - start)
                if reply.vote_result.name != "ACCEPT":
                    raise SystemExit(f"vote not granted: {reply}")
        finally:
            term_store.close()
    return median_ms(blocked), median_ms(replied)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--votes", type=int, default=50, help="votes answered per run (default 50)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved inline/threaded pairs (default 2)")
    parser.add_argument("--dir", default=None, help="directory for the term/vote files (default: the temp dir)")
    args = parser.parse_args(argv)

    @defer.inlineCallbacks
    def run(reactor):
        for pair in range(1, args.rounds + 1):
            for threaded in (False, True):
                blocked, replied = yield measure(reactor, threaded, args.votes, args.dir)
                print(f"pair {pair} {'threaded' if threaded else 'inline  '}: reactor blocked p50 "
                      f"{blocked:.3f} ms, reply after p50 {replied:.3f} ms")

    task.react(run)


if __name__ == "__main__":
    main()
