"""Real processes: a damaged committed entry is repaired from the intact copies of the other members (issue 21).

One flipped body byte in a committed entry: on a running follower and on a stopped leader, the background
scrub finds and repairs each, with one line each, and the three stores end byte-identical; with the scrub
off, a GET of the damaged entry on the leader is answered from a member's intact copy (repaired first).
"""

import hashlib

import pytest
import pytest_twisted

from dledger.launcher import LocalGroup, differing_logs, durable_store

pytestmark = [pytest.mark.process,
              pytest.mark.skipif(durable_store() != "mmap", reason="the scrub needs the mmap store")]

DATA_FILE = 4 << 20
INDEX_FILE = 32 * 32768
ENTRIES = 40
# 250 ms heartbeats: a loaded test machine must not keep the group in elections.
OPTIONS = {"mappedFileSizeForEntryData": DATA_FILE, "mappedFileSizeForEntryIndex": INDEX_FILE,
           "heartBeatTimeIntervalMs": 250, "scrubBytesPerSecond": 64 << 20}


def flip_body_byte(group, mid, entry) -> str:
    """Flip the second body byte of ``entry`` in member ``mid``'s data file (through the page cache); the file."""
    path = group.configs[mid].member_dir / "data" / f"{entry.pos - entry.pos % DATA_FILE:020d}"
    with open(path, "r+b") as fh:
        fh.seek(entry.pos % DATA_FILE + 48 + 1)
        byte = fh.read(1)
        fh.seek(entry.pos % DATA_FILE + 48 + 1)
        fh.write(bytes([byte[0] ^ 0x5A]))
    return path.name


def data_digests(group, mid) -> dict[str, str]:
    root = group.configs[mid].member_dir / "data"
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir())}


async def start_group(group, admin):
    """Start, append, wait until every member holds and commits everything; the leader and the other two."""
    await group.start_and_wait(30)
    for i in range(ENTRIES):
        await admin.append(b"entry %d " % i + bytes(200))
    metas = await group.wait_converged(admin, 30)
    leader = metas[0].leader_id
    return leader, sorted(mid for mid in group.ids if mid != leader)


@pytest_twisted.ensureDeferred
async def test_scrub_repairs_a_running_follower_and_a_stopped_leader(tmp_path, reactor):
    """Flip a byte in entry 10 of a running follower and entry 20 of the stopped leader: one line each, stores equal."""
    group = LocalGroup(tmp_path, n=3, store="mmap", preset="fast", reactor=reactor,
                       options={**OPTIONS, "scrubIntervalSeconds": 1})
    admin = group.client(request_timeout=2.0)
    try:
        leader, (follower, other) = await start_group(group, admin)
        (e10,) = await admin.get(10, 1)
        (e20,) = await admin.get(20, 1)
        file10 = flip_body_byte(group, follower, e10)
        await group.wait_for(lambda: group.log_lines(follower, "repaired damaged entry 10"), 20,
                             f"{follower} to repair entry 10")
        line = group.log_lines(follower, "repaired damaged entry 10")[0]
        assert file10 in line and f"offset {e10.pos % DATA_FILE}" in line and "intact copy from n" in line, line

        assert await group.stop(leader) == 0
        file20 = flip_body_byte(group, leader, e20)
        group.start(leader)
        await group.wait_for(lambda: group.log_lines(leader, "repaired damaged entry 20"), 30,
                             f"{leader} to repair entry 20")
        line = group.log_lines(leader, "repaired damaged entry 20")[0]
        assert file20 in line and f"offset {e20.pos % DATA_FILE}" in line, line
        await group.wait_converged(admin, 30)
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
        assert len(group.log_lines(follower, "repaired damaged entry")) == 1
        assert len(group.log_lines(leader, "repaired damaged entry")) == 1
        assert not group.log_lines(other, "repaired damaged entry")
        assert differing_logs(await group.read_logs(), other) == []
        assert data_digests(group, leader) == data_digests(group, follower) == data_digests(group, other)
    finally:
        group.close()


@pytest_twisted.ensureDeferred
async def test_a_leader_read_of_a_damaged_entry_is_served_from_an_intact_copy(tmp_path, reactor):
    """Scrub off: a GET of an entry failing its CRC on the leader answers the intact body, with one repair line."""
    group = LocalGroup(tmp_path, n=3, store="mmap", preset="fast", reactor=reactor,
                       options={**OPTIONS, "scrubIntervalSeconds": 0})
    admin = group.client(request_timeout=2.0)
    try:
        damaged, _ = await start_group(group, admin)
        (e20,) = await admin.get(20, 1)
        assert await group.stop(damaged) == 0
        name = flip_body_byte(group, damaged, e20)
        group.start(damaged)
        await group.wait_converged(admin, 30, f"{damaged} to rejoin and catch up")

        async def leads():  # hand leadership back to the damaged member (a transfer waits until it is caught up)
            if not await _leads(group, admin, damaged):
                try:
                    await admin.transfer(damaged)
                except Exception:
                    return False
            return await _leads(group, admin, damaged)

        await group.wait_for(leads, 30, f"{damaged} to lead again", interval=0.2)
        (got,) = await admin.get(20, 1)
        assert (got.index, got.term, got.pos, got.body) == (e20.index, e20.term, e20.pos, e20.body)
        lines = group.log_lines(damaged, "repaired damaged entry 20")
        assert len(lines) == 1 and name in lines[0] and f"offset {e20.pos % DATA_FILE}" in lines[0], lines
        await group.wait_converged(admin, 30)  # the new leader's NOOP has reached everyone before they stop
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
        others = [mid for mid in group.ids if mid != damaged]
        assert differing_logs(await group.read_logs(), others[0]) == []
        assert data_digests(group, damaged) == data_digests(group, others[0])
    finally:
        group.close()


async def _leads(group, admin, mid):
    meta = await group.metadata(admin, mid)
    return meta is not None and meta.role == "LEADER"
