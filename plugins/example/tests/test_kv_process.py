"""``dledger kv`` against three real ``twistd dledger`` members running the kv map (the installed entry point).

What the in-process tests cannot show: the plugin loaded from its entry point in a member process, its
request codes on a real port, the command line an operator types, and a get after the leader was killed.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from dledger_example.kv.client import ReplicatedDict

from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, child_env, durable_store
from dledger.testing import wait_until

STORE = durable_store()
pytestmark = [pytest.mark.process, pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb)")]


def test_dledger_kv_against_a_three_member_group(tmp_path):
    """put, get, cas (conflict and success), delete from the command line; the value survives killing the leader."""
    kv_on = ["--plugin-opt", "kv.enabled=true"]
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args={m: kv_on for m in ("n0", "n1", "n2")})
    group.start()
    d = ReplicatedDict(group.peers, "g0", timeout=10)

    def kv(*args):
        return subprocess.run([sys.executable, "-m", "dledger.cli", "kv", *args, "--peers", group.peers, "--group",
                               "g0", "--timeout", "5"], capture_output=True, text=True, env=child_env(), timeout=60)
    try:
        def leader():
            try:
                return d.client.find_leader(timeout=3).leader_id
            except DLedgerError:
                return None
        first = wait_until(leader, 60, "a leader")
        put = kv("put", "colour", "blue")
        assert put.returncode == 0 and put.stdout.startswith("put colour: entry "), put.stderr
        got = kv("get", "colour")
        assert (got.returncode, got.stdout) == (0, "blue\n"), got.stderr
        conflict = kv("cas", "colour", "red", "--expect", "green")
        assert conflict.returncode == 3 and "cas colour failed: it holds 'blue'" in conflict.stdout
        swapped = kv("cas", "colour", "green", "--expect", "blue", "--json")
        assert swapped.returncode == 0 and json.loads(swapped.stdout)["set"] is True
        assert d["colour"] == "green" and d.cas("colour", "green", "amber")

        group.kill(first)
        after = wait_until(lambda: (m := leader()) not in (None, first) and m, 60, "a new leader")
        got = kv("get", "colour")
        assert (got.returncode, got.stdout) == (0, "amber\n"), (after, got.stderr)
        gone = kv("delete", "colour")
        assert gone.returncode == 0 and gone.stdout.startswith("deleted colour: entry ")
        missing = kv("get", "colour")
        assert missing.returncode == 3 and missing.stderr.startswith("dledger: kv: no key 'colour'")
        usage = kv("put", "", "x")
        assert usage.returncode == 2 and "a key must not be empty" in usage.stderr and "Traceback" not in usage.stderr
    finally:
        d.close()
        group.close()
