"""Real processes: a wiped broker member returns through InstallSnapshot and serves as master (issue #22 item 6).

A 3-member ``twistd dledger`` broker group (mmap store, ACL on the broker
port) with small data files and automatic snapshots: a topic, a subscription
group, consumer offsets and an ACL account added with mqadmin's code 50 (so it
exists only in the log and in snapshots); traffic until every member took a
snapshot past them and the leader compacted its log past them; a follower's
store and broker directory are deleted, it comes back through InstallSnapshot,
leadership is transferred to it (``dledger transfer``), and its broker port
answers the topic, the group, the offsets and the ACL, and a consumer resumes
at its committed offsets.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import RocketMQError, connect
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.common.acl import Credentials
from dledger_rocketmq.tools.localgroup import broker_port_args

from dledger.launcher import LocalGroup, durable_store, free_ports

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]

TOPIC, FILLER, PROBE, GROUP = "SnapTopic", "FillerTopic", "ProbeTopic", "snap_cg"
ADMIN = Credentials("rocketmq-admin", "admin-secret-1")
LATER = Credentials("added-later", "added-later-secret")
PLAIN_ACL = f"""\
accounts:
- accessKey: {ADMIN.access_key}
  secretKey: {ADMIN.secret_key}
  admin: true
"""


async def client(reactor, port: int, credentials=ADMIN):
    return await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=credentials,
                         default_topic_queue_nums=2)


async def request(reactor, port: int, code: int, ext: dict, body: bytes = b"", credentials=ADMIN):
    """One raw request: (code, remark, body) of the reply."""
    c = await client(reactor, port, credentials)
    try:
        header, reply = await c.request(code, ext, body)
        return header.code, header.remark, reply
    finally:
        c.close()


async def master_of(group, admin, ports, only: str | None = None) -> str:
    """The member whose broker takes a signed send (the master); ``only``: wait until it is that one."""
    async def probe():
        meta = await group.wait_for_leader(admin, 30)
        mid = meta.leader_id
        if only is not None and mid != only:
            return None
        try:
            c = await client(group.reactor, ports[mid])
        except Exception:
            return None
        try:
            await c.send(PROBE, b"probe", queue_id=0)
        except Exception:
            return None
        finally:
            c.close()
        return mid
    return await group.wait_for(probe, 60, f"a master broker{' on ' + only if only else ''} taking a signed send",
                                interval=0.1)


def newest_snapshot(base: Path, mid: str) -> int:
    """The index of the newest complete snapshot of member ``mid`` on disk (-1: none)."""
    d = base / f"dledger-{mid}" / "snapshot"
    found = [int(p.name.split("-")[0]) for p in d.glob("[0-9]*-[0-9]*") if (p / "manifest.json").exists()] \
        if d.is_dir() else []
    return max(found, default=-1)


@pytest_twisted.ensureDeferred
async def test_a_wiped_member_returns_through_install_snapshot_with_topics_offsets_and_acl(tmp_path, reactor):
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    options = {"plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0,
               "plugins.rocketmq.aclEnable": True, "plugins.rocketmq.aclFile": str(acl_file),
               "plugins.rocketmq.mappedFileSizeConsumeQueue": 2000,
               "mappedFileSizeForEntryData": 16384, "snapshotThreshold": 40, "trailingEntries": 0,
               "snapshotChunkSize": 4096}
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=broker_port_args(ports),
                       options=options)
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)
        master = await master_of(group, admin, ports)
        port = ports[master]

        # The metadata: a topic (code 17), a group (200), an ACL account (50): through the log.
        code, remark, _ = await request(reactor, port, 17, {"topic": TOPIC, "readQueueNums": "2",
                                                            "writeQueueNums": "2", "perm": "6"})
        assert code == 0, remark
        group_body = json.dumps({"groupName": GROUP, "retryMaxTimes": 7}).encode()
        code, remark, _ = await request(reactor, port, 200, {}, group_body)
        assert code == 0, remark
        code, remark, _ = await request(reactor, port, 50, {"accessKey": LATER.access_key,
                                                            "secretKey": LATER.secret_key,
                                                            "topicPerms": f"{TOPIC}=PUB|SUB"})
        assert code == 0, remark
        c = await client(reactor, port)
        try:
            for i in range(20):  # queue offsets 0..9 in each of the two queues
                await c.send(TOPIC, b"before-%d" % i, queue_id=i % 2)
            for q in (0, 1):  # consumed and committed: offset 10 in both queues
                pulled = await c.pull(GROUP, TOPIC, q, 0, 32)
                assert len(pulled.messages) == 10
                await c.commit_offset(GROUP, TOPIC, q, 10)
            marked = (await group.metadata(admin, master)).committed_index
            # Traffic until every member snapshotted past the metadata, the leader compacted its log past it,
            # and the leader's newest snapshot is a few entries old only (so the tail below, and the probes,
            # stay after it: the wiped member then receives the tail's records as log entries).
            n = 0

            async def snapshotted_and_compacted():
                nonlocal n
                await c.send(FILLER, b"f" * 200, queue_id=n % 2)
                n += 1
                meta = await group.metadata(admin, master)
                return (meta is not None and meta.ledger_begin_index > marked
                        and all(newest_snapshot(tmp_path, mid) >= marked for mid in group.ids)
                        and meta.committed_index - newest_snapshot(tmp_path, master) <= 4)
            await group.wait_for(snapshotted_and_compacted, 60, "snapshots and compaction past the metadata",
                                 interval=0.0)
            for i in range(6):  # the tail: queue offsets 10..12 in each queue, after the snapshot
                await c.send(TOPIC, b"after-%d" % i, queue_id=i % 2)
            await c.commit_offset(GROUP, TOPIC, 0, 11)  # also in the tail
        finally:
            c.close()
        end = (await group.metadata(admin, master)).committed_index

        # Wipe a follower: its dledger store (log, snapshots, term/vote) and its broker directory.
        victim = next(mid for mid in group.ids if mid != master)
        assert await group.stop(victim) == 0
        shutil.rmtree(tmp_path / f"dledger-{victim}")
        shutil.rmtree(tmp_path / f"rocketmq-{victim}")
        group.start(victim)

        async def caught_up():
            meta = await group.metadata(admin, victim)
            return meta is not None and meta.committed_index is not None and meta.committed_index >= end
        await group.wait_for(caught_up, 60, f"{victim} to catch up after the wipe")
        assert group.log_lines(victim, "installed snapshot"), "the wiped member did not install a snapshot"
        assert group.log_lines(victim, "rocketmq metadata restored from a snapshot")

        # Make it master.
        async def transferred():
            meta = await group.wait_for_leader(admin, 10)
            if meta.leader_id == victim:
                return True
            try:
                await admin.transfer(victim)
            except Exception:
                return False
            return False
        await group.wait_for(transferred, 60, f"leadership to move to {victim}", interval=0.5)
        await master_of(group, admin, ports, only=victim)
        vport = ports[victim]

        code, _, body = await request(reactor, vport, 21, {})  # GET_ALL_TOPIC_CONFIG
        assert code == 0 and fastjson.loads(body)["topicConfigTable"][TOPIC]["readQueueNums"] == 2
        code, _, body = await request(reactor, vport, 201, {})  # GET_ALL_SUBSCRIPTIONGROUP_CONFIG
        assert code == 0 and fastjson.loads(body)["subscriptionGroupTable"][GROUP]["retryMaxTimes"] == 7

        # The ACL: the account added with code 50 (only in the log and the snapshot) is accepted, no account is not.
        c = await client(reactor, vport, LATER)
        try:
            sent = await c.send(TOPIC, b"by-later", queue_id=1)
        finally:
            c.close()
        assert sent.queue_offset == 13  # queue offsets continue where the old master left them
        with pytest.raises(RocketMQError) as info:
            anonymous = await client(reactor, vport, None)
            try:
                await anonymous.send(TOPIC, b"anonymous", queue_id=1)
            finally:
                anonymous.close()
        assert info.value.code == 1 and "AclException" in str(info.value)

        # The consumer resumes at its committed offsets: nothing below them is delivered again.
        c = await client(reactor, vport)
        try:
            resumed = {}
            for q, committed in ((0, 11), (1, 10)):
                assert await c.query_offset(GROUP, TOPIC, q) == committed
                pulled = await c.pull(GROUP, TOPIC, q, committed, 32)
                resumed[q] = [m.queue_offset for m in pulled.messages]
            assert resumed == {0: [11, 12], 1: [10, 11, 12, 13]}, resumed
            assert await c.min_offset(TOPIC, 0) == 10  # the records before the snapshot are not on this member
        finally:
            c.close()
        print(f"\nrocketmq wiped member (process): installed a snapshot, became master; topics, group, "
              f"offsets and ACL intact; consumer resumed at {resumed}")
    finally:
        await admin.close()
        await group.stop_all()
        group.close()
