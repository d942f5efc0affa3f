"""Real processes: a wiped follower of a compacted group returns through InstallSnapshot, across a leader's death.

Three ``twistd dledger`` members on 127.0.0.1 (mmap store) run the test state machine of
:mod:`dledger.testing.smplugin`; every member snapshots at the same index and compacts its log.
One follower is stopped, its store directory removed, and started again: the leader streams the
snapshot; halfway through, the leader is killed (SIGKILL).  The new leader (with the same snapshot)
resumes the transfer where the follower stands, the follower installs it and catches up, and in
the end every member's log (where they overlap) and machine state agree.
"""

import json
import shutil

import pytest
import pytest_twisted

from dledger.launcher import LocalGroup, durable_store
from dledger.testing import smplugin

STORE = "mmap" if durable_store() == "mmap" else None
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(STORE is None, reason="the mmap store is not installed"),
]

ENTRIES = 1200
VALUE = 1600  # bytes per value: the snapshot is ~2 MB, ~1000 chunks of 2 KiB


def _install_bytes(group, mid) -> int:
    """Bytes received so far into ``mid``'s ``snapshot/.install-*`` directory (0 if none)."""
    root = group.configs[mid].member_dir / "snapshot"
    total = 0
    for d in root.glob(".install-*"):
        total += sum(p.stat().st_size for p in d.rglob("*") if p.is_file() and p.name != "manifest.json")
    return total


def _snapshot_size(group, mid) -> tuple[str, int]:
    """(name, bytes) of ``mid``'s newest complete snapshot."""
    root = group.configs[mid].member_dir / "snapshot"
    newest = max((d for d in root.iterdir() if d.is_dir() and d.name[0].isdigit()),
                 key=lambda d: tuple(int(x) for x in d.name.split("-")))
    manifest = json.loads((newest / "manifest.json").read_text())
    return newest.name, sum(f["size"] for s in manifest["sections"] for f in s["files"])


@pytest_twisted.ensureDeferred
async def test_wiped_follower_returns_through_install_snapshot_across_a_leader_death(tmp_path, reactor,
                                                                                     monkeypatch):
    """Wipe a follower of a compacted group; kill the leader mid-transfer; it resumes, completes, all agree."""
    for key, value in smplugin.child_environment(tmp_path / "plugin", "dict").items():
        monkeypatch.setenv(key, value)
    group = LocalGroup(tmp_path / "group", n=3, store=STORE, preset="fast", reactor=reactor,
                       options={"snapshotThreshold": 0, "snapshotThresholdBytes": 0, "trailingEntries": 0,
                                "snapshotChunkSize": 2048, "snapshotFileSize": 256 * 1024,
                                "mappedFileSizeForEntryData": 256 * 1024,
                                "mappedFileSizeForEntryIndex": 32 * 1024})
    admin = group.client(request_timeout=2.0)
    try:
        leader = (await group.start_and_wait(30)).leader_id
        for first in range(0, ENTRIES, 100):
            await admin.append_batch([b"k%d=" % i + b"v" * VALUE for i in range(first, first + 100)])
        await admin.append(smplugin.SNAPSHOT_BODY)
        metas = await group.wait_converged(admin, 30)
        end = metas[0].ledger_end_index

        async def compacted():
            ms = [await group.metadata(admin, mid) for mid in group.ids]
            return all(m is not None and m.ledger_begin_index > 0 for m in ms)

        await group.wait_for(compacted, 60, "every member to snapshot and compact its log")
        name, size = _snapshot_size(group, leader)
        assert all(_snapshot_size(group, mid)[0] == name for mid in group.ids), "members snapshot at one index"

        follower = next(mid for mid in group.ids if mid != leader)
        assert await group.stop(follower) == 0
        shutil.rmtree(group.configs[follower].member_dir)
        group.start(follower)
        await group.wait_for(lambda: _install_bytes(group, follower) >= size // 3, 60,
                             f"{follower} to receive a third of snapshot {name}", interval=0.005)
        got = _install_bytes(group, follower)
        assert got < size, f"the transfer ended before the leader could be killed ({got} of {size} bytes)"
        group.kill(leader)

        async def installed():
            meta = await group.metadata(admin, follower)
            return meta is not None and meta.ledger_begin_index >= int(name.split("-")[0]) + 1 \
                and meta.committed_index >= int(name.split("-")[0])

        await group.wait_for(installed, 60, f"{follower} to install snapshot {name}")
        # The new leader asked where the follower stands and went on from there (not from byte 0).
        starts = [int(line.split(": ")[-1].split(" of ")[0])
                  for mid in group.ids if mid not in (leader, follower)
                  for line in group.log_lines(mid, f"InstallSnapshot of {name} to {follower}:")]
        assert starts and starts[0] > 0, f"the new leader did not resume the transfer: {starts}"
        assert group.log_lines(follower, f"installed snapshot {name}")
        group.start(leader)
        await admin.append(b"after=1")
        metas = await group.wait_converged(admin, 60)
        assert metas[0].ledger_end_index > end
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
        logs = await group.read_logs()
        first = max(lg.begin for lg in logs.values())
        tails = {mid: [(e.index, e.term, e.body_crc, e.body) for e in lg.entries if e.index >= first]
                 for mid, lg in logs.items()}
        assert len({tuple(t) for t in tails.values()}) == 1, "logs differ where they overlap"
        states = {mid: json.loads((group.configs[mid].member_dir / smplugin.STATE_FILE).read_text())
                  for mid in group.ids}
        assert len({json.dumps(s, sort_keys=True) for s in states.values()}) == 1, states
        assert states[follower]["count"] == ENTRIES + 2  # every entry applied once (the snapshot's and after)
    finally:
        group.close()
