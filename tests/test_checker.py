"""The history checker: it flags lost, divergent and non-linearizable histories, and agrees with Wing-Gong."""

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from dledger.entry import Entry
from dledger.testing.checker import (
    CommittedLog,
    History,
    linearizability_violations,
    lost_appends,
    wing_gong_linearizable,
)


def append(h, body, t0, t1, index=None, ok=True):
    op = h.invoke("append", "c", t0, body=body)
    History.complete(op, t1, ok=ok, index=index, error=None if ok else "TIMEOUT")
    return op


def get(h, index, t0, t1, result=None, error=None):
    op = h.invoke("get", "c", t0, index=index)
    History.complete(op, t1, ok=result is not None, result=result, error=error)
    return op


def test_lost_append_is_reported():
    """An acknowledged append missing from a member's committed log is reported for that member."""
    h = History()
    append(h, b"a", 0, 1, index=0)
    logs = {"n0": [Entry(body=b"a", index=0)], "n1": []}
    assert lost_appends(h, logs) == ["append b'a' acknowledged at 0 but n1 has None"]


def test_committed_log_flags_divergence():
    """Two different entries committed at one index are a divergence."""
    log = CommittedLog()
    log.observe("n0", 3, 1, b"x")
    log.observe("n1", 3, 1, b"x")
    assert not log.divergences
    log.observe("n2", 3, 2, b"y")
    assert len(log.divergences) == 1


def test_stale_read_is_not_linearizable():
    """A get that finds nothing at an index acknowledged before it started is a stale read."""
    h = History()
    append(h, b"a", 0, 1, index=0)
    get(h, 0, 2, 3, error="INDEX_OUT_OF_RANGE")
    problems = linearizability_violations(h, {0: b"a"})
    assert problems and "stale read" in problems[0]
    assert not wing_gong_linearizable(h, {0: b"a"})


def test_concurrent_not_found_is_fine():
    """A get concurrent with the append may find nothing."""
    h = History()
    append(h, b"a", 0, 3, index=0)
    get(h, 0, 1, 2, error="INDEX_OUT_OF_RANGE")
    assert linearizability_violations(h, {0: b"a"}) == []
    assert wing_gong_linearizable(h, {0: b"a"})


def test_real_time_order_must_match_index_order():
    """An append acknowledged at a lower index than one that completed before it began is flagged."""
    h = History()
    append(h, b"a", 0, 1, index=1)
    append(h, b"b", 2, 3, index=0)
    log = {0: b"b", 1: b"a"}
    assert linearizability_violations(h, log)
    assert not wing_gong_linearizable(h, log)


def test_read_from_the_future_is_flagged():
    """A get returning a body whose append began after the get completed is flagged."""
    h = History()
    get(h, 0, 0, 1, result=b"a")
    append(h, b"a", 2, 3, index=0)
    assert linearizability_violations(h, {0: b"a"})
    assert not wing_gong_linearizable(h, {0: b"a"})


def random_history(seed: int):
    """A small history from a random sequential log with random (possibly wrong) timings and answers."""
    rng = random.Random(seed)
    n = rng.randint(2, 5)
    log = {i: f"b{i}".encode() for i in range(n)}
    h = History()
    for i in range(n):
        if rng.random() < 0.3:
            # filled by someone nobody told (a NOOP or an unacknowledged append) before everything
            append(h, log[i], -1, -0.5, ok=False)
            continue
        t0 = rng.uniform(0, 10)
        append(h, log[i], t0, t0 + rng.uniform(0.1, 4), index=i)
    for _ in range(rng.randint(0, 4)):
        i = rng.randint(0, n)
        t0 = rng.uniform(0, 10)
        if i < n and rng.random() < 0.6:
            get(h, i, t0, t0 + rng.uniform(0.1, 3), result=log[i])
        else:
            get(h, i, t0, t0 + rng.uniform(0.1, 3), error="INDEX_OUT_OF_RANGE")
    return h, log


@settings(max_examples=400, deadline=None)
@given(st.integers(0, 10**9))
def test_reduction_agrees_with_wing_gong(seed):
    """On small random histories the real-time reduction and the exhaustive search give the same verdict."""
    h, log = random_history(seed)
    assert (not linearizability_violations(h, log)) == wing_gong_linearizable(h, log)
