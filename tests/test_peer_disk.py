"""The leader's rules for a follower that answers DISK_FULL / DISK_ERROR (dledger.replication.peerdisk)."""

import pytest

from dledger.codes import ResponseCode
from dledger.replication.peerdisk import in_flight_limit, peer_disk_problem, retry_after


@pytest.mark.parametrize("code, problem", [
    (ResponseCode.DISK_FULL, "disk full"),
    (ResponseCode.DISK_ERROR, "disk error"),
    (ResponseCode.INCONSISTENT_STATE, None),
    (ResponseCode.UNEXPECTED_ARGUMENT, None),
    (ResponseCode.SUCCESS, None),
])
def test_peer_disk_problem(code, problem):
    """Only the two disk codes mark a follower as `disk full` / `disk error`."""
    assert peer_disk_problem(code) == problem


@pytest.mark.parametrize("problem, limit, want", [(None, 1000, 1000), ("disk full", 1000, 1), ("disk error", 5, 1)])
def test_in_flight_limit(problem, limit, want):
    """A follower whose disk refuses gets one probing push at a time, not the whole pipeline."""
    assert in_flight_limit(problem, limit) == want


@pytest.mark.parametrize("problem, delay, heartbeat, want", [
    (None, 0.05, 2.0, 0.05), ("disk full", 0.05, 2.0, 2.0), ("disk error", 0.05, 0.1, 0.1),
    ("disk full", 0.5, 0.1, 0.5)])
def test_retry_after(problem, delay, heartbeat, want):
    """A refused push is retried after a heartbeat when the follower's disk is the reason, else soon."""
    assert retry_after(problem, delay, heartbeat) == want
