"""The example plugin in a real ``twistd dledger`` member, driven by the real ``dledger example add`` command.

The one test an in-process Cluster cannot replace: the installed entry point, option parsing from the
command line, the HTTP service on a real port and the CLI command, as an operator runs them.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import urllib.request

import pytest

from dledger.launcher import TWISTD, child_env
from dledger.testing import wait_until

pytestmark = pytest.mark.process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def counters(url):
    """The member's page, or None while its HTTP service is not listening yet."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:
            return json.loads(reply.read())
    except OSError:
        return None


def test_twistd_member_with_the_example_plugin(tmp_path):
    port, http = free_port(), free_port()
    peers = ["--peers", f"n0-127.0.0.1:{port}", "--group", "g0"]
    member = subprocess.Popen([sys.executable, "-c", TWISTD, "-n", "--pidfile=", "dledger", "--id", "n0", *peers,
                               "--preset", "fast", "--plugin-opt", "example.enabled=true",
                               "--plugin-opt", f"example.listen=tcp:{http}:interface=127.0.0.1"],
                              cwd=tmp_path, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{http}/"
    try:
        page = wait_until(lambda: (p := counters(url)) and p["role"] == "LEADER" and p, 30, "the member to lead")
        assert page["counters"] == {}

        def example(*args):
            return subprocess.run([sys.executable, "-m", "dledger.cli", "example", *args, *peers],
                                  capture_output=True, text=True, env=child_env(), timeout=60)

        added = example("add", "apples", "--by", "3")
        assert added.returncode == 0 and "added 3 to apples: entry" in added.stdout, added.stderr
        refused = example("add", "apples", "--by", "5000")
        assert refused.returncode == 1
        assert refused.stderr.startswith("dledger: APPEND_REFUSED (431): ") and "example.max_add (1000)" in \
            refused.stderr, refused.stderr
        assert wait_until(lambda: counters(url)["counters"] == {"apples": 3}, 10, "the add to be applied")
    finally:
        member.terminate()
        output = member.communicate(timeout=30)[0].decode()
    assert member.returncode == 0, output
    assert "example n0: now LEADER" in output
