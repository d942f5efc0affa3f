"""``dledger demo`` (the README's main job) end to end: real twistd members, a kill -9, and a verified result."""

import subprocess
import sys
from pathlib import Path

import pytest

from dledger.launcher import child_env, durable_store, processes_mentioning

ROOT = Path(__file__).resolve().parent.parent
STORE = durable_store()


def run_demo(*argv, timeout=120):
    return subprocess.run([sys.executable, "-m", "dledger.cli", "demo", *argv], cwd=ROOT, env=child_env(),
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.process
@pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed on this branch yet; "
                                         "the demo kills members and needs one")
def test_demo_fails_over_catches_up_and_verifies_identical_logs(tmp_path):
    """The demo kills the leader, shows failover and catch-up, verifies the logs, exits 0 and leaves no process."""
    out = run_demo("--dir", str(tmp_path))
    transcript = out.stdout
    assert out.returncode == 0, transcript + out.stderr
    for line in ("all three serve; the leader is", "appended 10 entries before the failover",
                 "read back from the leader with GET: 10 of 10 entries match", "(the leader), pid",
                 "is the new leader (term", "failover took", "appended 10 entries after the failover",
                 "is back as FOLLOWER", "caught up with the leader", "all exited with status 0",
                 "the three logs are identical entry by entry", "all 21 acknowledged appends are at their "
                 "acknowledged indexes", "demo finished: OK"):
        assert line in transcript, f"missing {line!r} in:\n{transcript}"
    assert f"store {STORE!r}" in transcript
    assert processes_mentioning(str(tmp_path)) == []


@pytest.mark.process
def test_demo_refuses_a_memory_store():
    """The demo will not run on the memory store (a killed member would forget its log) and says why."""
    out = run_demo("--store", "memory")
    assert out.returncode == 2 and "memory store forgets everything" in out.stderr
