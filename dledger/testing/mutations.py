"""Deliberately broken membership rules, for showing that the simulator's checks catch them (issue #23).

A check that never fails proves nothing: each mutation here removes one of the two rules that make
single-server changes safe (:func:`dledger.membership.rules.refusal`), for the duration of a ``with``
block, and the tests and ``python -m tools.simulate replication --membership --mutation NAME`` show
the simulator failing:

* ``own-term`` -- a new leader proposes a change before it committed an entry of its own term (the
  bug in the dissertation's algorithm, Ongaro, raft-dev, July 2015);
* ``two-in-flight`` -- a change is proposed while the previous one is not committed yet.

Test-only: nothing outside :mod:`dledger.testing` and the tests imports this module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable, Iterator

from dledger.membership import rules


def _own_term(view: rules.LeaderView) -> rules.LeaderView:
    return dataclasses.replace(view, own_term_committed=True)


def _two_in_flight(view: rules.LeaderView) -> rules.LeaderView:
    return dataclasses.replace(view, committed_index=max(view.committed_index, view.config.index))


#: name -> how the leader's view is falsified before :func:`~dledger.membership.rules.refusal` judges it
MUTATIONS: dict[str, Callable[[rules.LeaderView], rules.LeaderView]] = {
    "own-term": _own_term,
    "two-in-flight": _two_in_flight,
}


@contextlib.contextmanager
def mutation(name: str | None) -> Iterator[None]:
    """Within the block, ``refusal`` judges a falsified view (``name`` None: no mutation, nothing patched).

    Every ``dledger`` module that imported ``refusal`` by name is patched too, and all are restored after.
    """
    if name is None:
        yield
        return
    falsify = MUTATIONS[name]
    real = rules.refusal

    def mutated(view, change):
        return real(falsify(view), change)

    patched = [m for m in list(sys.modules.values())
               if getattr(m, "__name__", "").startswith("dledger") and getattr(m, "refusal", None) is real]
    for module in patched:
        module.refusal = mutated
    try:
        yield
    finally:
        for module in patched:
            module.refusal = real
