"""`make demo-rocketmq` end to end: real twistd processes (name server, two groups), a kill -9, nothing left running."""

from __future__ import annotations

import subprocess
import sys

import pytest

from dledger.launcher import processes_mentioning


@pytest.mark.process
def test_demo_rocketmq_spreads_fails_over_and_stops_everything(tmp_path):
    """Two groups register, sends spread, a master kill is survived, all is read back, exit 0, no process left."""
    out = subprocess.run([sys.executable, "-m", "dledger_rocketmq.tools.demo", "--dir", str(tmp_path),
                          "--messages", "8"], capture_output=True, text=True, timeout=240)
    text = out.stdout
    assert out.returncode == 0, text + out.stderr
    assert "name server: broker-a master" in text and "name server: broker-b master" in text
    assert "kill -9 broker-a's master" in text and "ok: every message sent was read back once" in text
    assert "pulled 18 messages in all" in text and "stopped every process" in text
    assert processes_mentioning(str(tmp_path)) == []
