"""Store ownership with real ``twistd dledger`` processes: a second member on a live store dir, a lost currterm."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted

from dledger.cli import main
from dledger.launcher import TWISTD, LocalGroup, child_env, free_ports
from dledger.store.checkpoint import read_checkpoint


def snapshot(member_dir: Path) -> dict[str, tuple[str, int]]:
    """Checksum and mtime of the member's data, index, checkpoint, term and identity files."""
    files = [p for p in sorted(member_dir.rglob("*")) if p.is_file() and p.name != "lock"]
    return {str(p.relative_to(member_dir)): (hashlib.md5(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in files}


def twistd(group: LocalGroup, mid: str, *extra: str) -> subprocess.CompletedProcess:
    """Run member ``mid`` of ``group`` once more in the foreground (its output captured)."""
    argv = [sys.executable, "-c", TWISTD, "-n", "--pidfile=", "dledger", "--config", str(group.config_path),
            "--id", mid, *extra]
    return subprocess.run(argv, cwd=group.base_dir, env=child_env(), capture_output=True, text=True, timeout=60)


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_second_twistd_on_a_live_store_dir_exits_1_with_one_line_and_touches_nothing(tmp_path, reactor):
    """A second member process on a live store dir says 'in use by pid N' once, exits 1, changes no file."""
    group = LocalGroup(tmp_path, n=1, store="mmap", reactor=reactor)
    client = group.client()
    try:
        group.start()
        await group.wait_for_leader(client, 20)
        for i in range(20):
            await client.append(f"entry-{i}".encode())
        member_dir = group.configs["n0"].member_dir

        def settled():
            ck, _ = read_checkpoint(member_dir)
            return ck is not None and ck.end_index >= 20 and ck.committed_index == ck.end_index

        await group.wait_for(settled, 20, "the checkpoint to cover every entry")
        before = snapshot(member_dir)
        assert {"checkpoint", "currterm", "identity.json", "data/00000000000000000000"} <= set(before)
        [port] = free_ports(1)  # a typo in --listen: the port differs, the store dir does not
        out = twistd(group, "n0", "--listen", f"tcp:{port}:interface=127.0.0.1")
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        lines = [line for line in text.splitlines() if "is in use by pid" in line]
        assert len(lines) == 1, text
        assert f"store dir {member_dir} is in use by pid {group.members['n0'].pid}" in lines[0]
        assert "Traceback" not in text
        assert snapshot(member_dir) == before, "the live member's files were touched"
        await client.append(b"still-serving")
        assert await group.stop("n0") == 0
    finally:
        await client.close()
        group.close()


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_member_with_lost_currterm_refuses_until_reset_vote(tmp_path, reactor):
    """A stopped member whose currterm is gone refuses to start (one line naming reset-vote, exit 1) until repaired."""
    group = LocalGroup(tmp_path, n=1, store="mmap", reactor=reactor)
    client = group.client()
    try:
        group.start()
        await group.wait_for_leader(client, 20)
        await client.append(b"before")
        assert await group.stop("n0") == 0
        member_dir = group.configs["n0"].member_dir
        term = int(re.search(rb"currTerm=(\d+)", (member_dir / "currterm").read_bytes()).group(1))
        for name in ("currterm", "currterm.bak"):
            (member_dir / name).unlink(missing_ok=True)
        out = twistd(group, "n0")
        text = out.stdout + out.stderr
        assert out.returncode == 1, text
        lines = [line for line in text.splitlines() if "reset-vote" in line]
        assert len(lines) == 1 and "Traceback" not in text, text
        command = re.search(r"dledger store reset-vote (\S+) --term (\d+)", lines[0])
        assert command.group(1) == str(member_dir) and int(command.group(2)) == term + 1
        assert main(["store", "reset-vote", command.group(1), "--term", command.group(2)]) == 0
        group.start("n0")
        meta = await group.wait_for_leader(client, 20)
        assert meta.term > term, "the member came back in a term after the one it may have voted in"
        assert await group.stop("n0") == 0
    finally:
        await client.close()
        group.close()
