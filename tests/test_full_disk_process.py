"""Real processes: a follower whose store sits on a small full tmpfs says so, stays bounded and catches up (issue 21).

The test mounts a tmpfs for one follower's store (root, or CAP_SYS_ADMIN, is needed: skipped with the
reason otherwise), fills it with the group's writes until the follower cannot create its second data
file, checks the follower, the leader and ``dledger metadata`` say ``disk full``, that the follower's
memory stays flat and it never stands for election, then grows the tmpfs and waits for the follower to
catch up by itself.  The tmpfs is unmounted whatever happens.
"""

import json
import os
import subprocess
import sys
import uuid

import pytest
import pytest_twisted
from twisted.internet.task import deferLater
from twisted.internet.utils import getProcessOutputAndValue

from dledger.launcher import LocalGroup, child_env, differing_logs

pytestmark = [pytest.mark.process, pytest.mark.skipif(sys.platform != "linux", reason="tmpfs mounts are Linux's")]

DATA_FILE = 4 << 20
INDEX_FILE = 32 * 32768  # 1 MiB
BODY = 20_000
ENTRIES = 300  # about 6 MB: more than the tmpfs holds once its first data file is full


def mount_tmpfs(path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``path``; None, or why it cannot be done here."""
    path.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", f"dledger-test-{uuid.uuid4().hex[:8]}",
                               str(path)], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run mount: {exc}"
    if done.returncode:
        return f"mounting a tmpfs is not allowed here: {done.stderr.strip() or done.returncode}"
    return None


def anon_bytes(group, mid) -> int:
    try:
        with open(f"/proc/{group.members[mid].pid}/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


async def cli_metadata(reactor, group):
    out, err, status = await getProcessOutputAndValue(
        sys.executable, ["-m", "dledger.cli", "metadata", "--peers", group.peers, "--group", group.group, "--json",
                         "--timeout", "2"], env=child_env(), reactor=reactor)
    assert status == 0, err
    return json.loads(out.decode())


@pytest_twisted.ensureDeferred
async def test_follower_on_a_full_tmpfs_says_so_stays_bounded_and_catches_up(tmp_path, reactor):
    """Full tmpfs under a follower: one line each side, `disk full` in metadata, flat memory, no elections, catch-up."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    store_dir = tmp_path / "dledger-n2"
    why = mount_tmpfs(store_dir, "6m")
    if why is not None:
        pytest.skip(why)
    group = LocalGroup(tmp_path, n=3, store="mmap", preset="fast", reactor=reactor,
                       options={"mappedFileSizeForEntryData": DATA_FILE, "mappedFileSizeForEntryIndex": INDEX_FILE,
                                # a 750 ms election timeout: a loaded test machine must not look like an election
                                "heartBeatTimeIntervalMs": 250})
    admin = group.client(request_timeout=2.0)
    try:
        await group.start_and_wait(30)

        async def n2_follows():  # the member on the tmpfs must be a follower: move leadership off it if needed
            if await _leads(group, admin, "n2"):
                try:
                    await admin.transfer("n0")
                except Exception:
                    return None
            meta = await group.wait_for_leader(admin, 10)
            return meta.leader_id if meta.leader_id != "n2" else None

        leader = await group.wait_for(n2_follows, 30, "a leader other than n2", interval=0.2)
        body = os.urandom(BODY)
        for _ in range(ENTRIES):
            await admin.append(body)
        end = (await group.metadata(admin, leader)).ledger_end_index

        # The follower stops short of the leader and says why, once, naming its store and the free space.
        await group.wait_for(lambda: group.log_lines("n2", "refusing appends (DISK_FULL)"), 20,
                             "n2's disk-full line")
        line = group.log_lines("n2", "refusing appends (DISK_FULL)")[0]
        assert str(store_dir) in line and "free on its disk" in line, line
        await group.wait_for(lambda: group.log_lines(leader, "follower n2 cannot store entries"), 10,
                             "the leader's line about n2")
        assert "disk full" in group.log_lines(leader, "follower n2 cannot store entries")[0]
        meta = await group.metadata(admin, "n2")
        assert meta.ledger_end_index < end and meta.disk == "disk full"
        report = await cli_metadata(reactor, group)
        assert report["members"]["n2"]["disk"] == "disk full" and report["members"][leader]["disk"] is None
        lines_before = len(group.log_lines("n2"))

        # Bounded: the leader keeps retrying for a while; memory stays flat, nothing is logged again, no election.
        before = anon_bytes(group, "n2")
        for _ in range(8):
            await deferLater(reactor, 1.0, lambda: None)
            for _i in range(5):
                await admin.append(body)
        grew = anon_bytes(group, "n2") - before
        assert grew < 24 << 20, f"n2's anonymous memory grew {grew >> 20} MiB while its disk was full"
        assert len(group.log_lines("n2", "refusing appends")) == 1
        assert len(group.log_lines(leader, "follower n2 cannot store entries")) == 1
        stood = [line for line in group.log_lines("n2")[lines_before:] if "standing for election" in line]
        assert not stood, f"n2 stood for election while its disk was full: {stood}"
        assert (await group.metadata(admin, leader)).term == meta.term

        # Space returns: the follower catches up by itself, and says so.
        subprocess.run(["mount", "-o", "remount,size=64m", str(store_dir)], check=True, timeout=30)
        end = (await group.metadata(admin, leader)).ledger_end_index

        async def caught_up():
            m = await group.metadata(admin, "n2")
            return m is not None and m.ledger_end_index == end and m.committed_index == end and m.disk is None

        await group.wait_for(caught_up, 30, "n2 to catch up once space returned")
        assert group.log_lines("n2", "appends resume") and group.log_lines(leader, "follower n2 stores entries again")
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
        assert differing_logs(await group.read_logs(), leader) == []
    finally:
        group.close()
        subprocess.run(["umount", "-l", str(store_dir)], capture_output=True, timeout=30)


async def _leads(group, admin, mid):
    meta = await group.metadata(admin, mid)
    return meta is not None and meta.role == "LEADER"
