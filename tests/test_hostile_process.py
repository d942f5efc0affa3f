"""Hostile frames against a live ``twistd dledger`` group on 127.0.0.1 (issue #9, items 13 and 14).

Absurd terms, a far-past-the-end TRUNCATE (JSON and binary) and APPEND, impossible commit indexes,
an oversized frame, an unfinished frame and a crowd of idle connections are sent to live members.
Each hostile request is answered UNEXPECTED_ARGUMENT (or its connection closed), the members' term/vote
and log files are byte for byte what they were, and the group keeps committing.
"""

import socket
import struct
import sys

import pytest
import pytest_twisted

from dledger import messages
from dledger.codes import PushType, ResponseCode
from dledger.entry import Entry
from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, differing_logs, durable_store
from dledger.messages import INT64_MAX, MAX_INDEX, PushEntryRequest
from dledger.transport.client import RemotingClient

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]
HUGE = 10 ** 30
IDLE_MS = 1500


def raw_socket(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.setblocking(False)
    return s


def closed_by_peer(sock):
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest_twisted.ensureDeferred
async def test_hostile_frames_change_nothing_on_disk_and_the_group_keeps_committing(tmp_path, reactor):
    """Every hostile frame is refused by a live member; currterm and data files keep their checksums; commits go on."""
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", reactor=reactor,
                       options={"connectionIdleTimeoutMs": IDLE_MS, "maxConnectionsPerAddress": 64})
    admin = group.client(request_timeout=1.0)
    raw = RemotingClient(reactor, timeout=2.0)
    socks = []
    try:
        leader = (await group.start_and_wait(30)).leader_id
        for i in range(20):
            await admin.append(f"before {i}".encode())

        metas = await group.wait_converged(admin, 15)
        term, end = metas[0].term, metas[0].ledger_end_index
        before = {mid: group.store_checksums(mid) for mid in group.ids}
        assert all(any(k.startswith("data") for k in sums) or sums for sums in before.values())
        follower = next(mid for mid in group.ids if mid != leader)
        addr = {mid: f"127.0.0.1:{group.members[mid].port}" for mid in group.ids}

        async def refused(mid, request, binary=False):
            resp = await raw.send(addr[mid], request, binary=binary)
            assert resp.code == ResponseCode.UNEXPECTED_ARGUMENT, (mid, request, resp)

        other = next(m for m in group.ids if m != follower and m != leader)
        for mid in group.ids:  # absurd terms: refused when decoded, never persisted
            voter = next(m for m in group.ids if m != mid)
            for bad in (HUGE, INT64_MAX):
                await refused(mid, messages.VoteRequest(group="g0", remote_id=mid, local_id=voter, leader_id=voter,
                                                        term=bad, ledger_end_index=end + 10,
                                                        ledger_end_term=term))
            await refused(mid, messages.VoteRequest(group="g0", remote_id=mid, leader_id=voter, term=term + 1,
                                                    ledger_end_index=end, ledger_end_term=HUGE))
            await refused(mid, messages.HeartBeatRequest(group="g0", remote_id=mid, leader_id=voter, term=HUGE))
        far = Entry(b"forged", end + 5000, term, 10 ** 6).sealed()
        truncate = PushEntryRequest(group="g0", remote_id=follower, leader_id=leader, term=term,
                                    commit_index=end, type=PushType.TRUNCATE, entry=far)
        await refused(follower, truncate)
        await refused(follower, truncate, binary=True)
        await refused(follower, PushEntryRequest(group="g0", remote_id=follower, leader_id=leader, term=term,
                                                 commit_index=end, type=PushType.APPEND,
                                                 entry=Entry(b"x", end + 10 ** 12, term, 0).sealed()), binary=True)
        await refused(follower, PushEntryRequest(group="g0", remote_id=follower, leader_id=leader, term=term,
                                                 commit_index=HUGE, type=PushType.COMMIT))
        await refused(follower, PushEntryRequest(group="g0", remote_id=follower, leader_id=leader, term=HUGE,
                                                 type=PushType.COMMIT))
        await raw.send(addr[follower], PushEntryRequest(group="g0", remote_id=follower, leader_id=leader, term=term,
                                                        commit_index=MAX_INDEX, type=PushType.COMMIT))
        await refused(other, messages.GetEntriesRequest(group="g0", remote_id=other, begin_index=HUGE))

        # oversized, unfinished, and idle connections
        port = group.members[follower].port
        oversized = raw_socket(port)
        oversized.send(struct.pack(">iI", 32 << 20, 2) + b"{}")
        unfinished = raw_socket(port)
        unfinished.send(struct.pack(">iI", 1 << 20, 2) + b"{}" + b"u" * 100_000)
        idle = [raw_socket(group.members[mid].port) for mid in group.ids for _ in range(10)]
        socks += [oversized, unfinished, *idle]
        await group.wait_for(lambda: closed_by_peer(oversized), 5, "the oversized frame's connection to close")
        await group.wait_for(lambda: all(closed_by_peer(s) for s in socks), IDLE_MS / 1000 + 10,
                             "unfinished and idle connections to time out")

        assert {mid: group.store_checksums(mid) for mid in group.ids} == before, "a hostile frame changed a store"
        for i in range(20):
            await admin.append(f"after {i}".encode())
        metas = await group.wait_converged(admin, 15, "the group to commit after the hostile frames")
        assert metas[0].committed_index >= end + 20 and metas[0].term < 1000
        lines = group.log_lines(follower, "refusing a TRUNCATE push")
        assert len(lines) == 1, lines  # two forged TRUNCATEs, one rate-limited line

        await admin.close()
        await raw.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
        logs = await group.read_logs()
        bodies = [e.body for e in logs[leader].entries if e.body]
        assert bodies == [f"before {i}".encode() for i in range(20)] + [f"after {i}".encode() for i in range(20)]
        assert differing_logs(logs, leader) == []
        assert not any(group.log_lines(mid, "Traceback") for mid in group.ids)
    except DLedgerError:
        raise
    finally:
        for s in socks:
            s.close()
        group.close()


@pytest_twisted.ensureDeferred
async def test_idle_connection_flood_under_a_low_fd_limit_leaves_the_group_working(tmp_path, reactor):
    """Under ``ulimit -n 64``, 200 idle connections to a follower: one accept line, no traceback, commits go on."""
    wrapper = tmp_path / "python-ulimit"
    wrapper.write_text(f'#!/bin/sh\nulimit -n 64 || exit 99\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    group = LocalGroup(tmp_path / "g", n=3, store=STORE, preset="fast", reactor=reactor, python=str(wrapper),
                       options={"connectionIdleTimeoutMs": 6000})
    admin = group.client(request_timeout=1.0)
    socks = []
    try:
        leader = (await group.start_and_wait(30)).leader_id
        follower = next(mid for mid in group.ids if mid != leader)
        for i in range(10):
            await admin.append(f"before {i}".encode())
        for _ in range(200):  # non-blocking connects: the ones not accepted wait in the backlog
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(("127.0.0.1", group.members[follower].port))
            socks.append(s)
        log_path = group.members[follower].log_path
        await group.wait_for(lambda: "refusing a connection" in log_path.read_text(errors="replace"), 15,
                             "the follower to refuse connections beyond its descriptor budget")
        for i in range(50):
            await admin.append(f"during {i}".encode())

        async def caught_up():
            metas = [await group.metadata(admin, mid) for mid in group.ids]
            if any(m is None for m in metas):
                return False
            return len({(m.ledger_end_index, m.committed_index) for m in metas}) == 1

        await group.wait_for(caught_up, 60, "the flooded follower to hold and commit everything")
        text = group.members[follower].log_path.read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in text
        assert "accepting at most" in text  # maxConnections lowered to what ulimit -n leaves
        refusals = [line for line in text.splitlines() if "refusing a connection" in line]
        assert 1 <= len(refusals) <= 4, refusals  # one per 10 s, not one per connection
        assert len(text.splitlines()) < 100
    finally:
        for s in socks:
            s.close()
        await admin.close()
        group.close()
