"""Real processes: a follower restarted with a wiped store in an idle group is refilled within two heartbeats."""

import shutil

import pytest
import pytest_twisted
from prometheus_client.parser import text_string_to_metric_families
from twisted.web.client import Agent, readBody

from dledger.launcher import LocalGroup, differing_logs, durable_store

STORE = durable_store()
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
]

ENTRIES = 40


async def lag_of(reactor, group, leader, peer):
    """The leader's dledger_lag_entries_count for ``peer`` from its metrics endpoint (None if not served)."""
    url = f"http://127.0.0.1:{group.members[leader].metrics_port}/metrics".encode()
    try:
        text = (await readBody(await Agent(reactor).request(b"GET", url))).decode()
    except Exception:
        return None
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "dledger_lag_entries_count" and s.labels.get("remote_id") == peer:
                return int(s.value)
    return None


@pytest.mark.filterwarnings("ignore:Using readBody:DeprecationWarning")
@pytest_twisted.ensureDeferred
async def test_wiped_follower_in_an_idle_group_catches_up_within_two_heartbeats(tmp_path, reactor):
    """rm -rf of a follower's store, restart, no client writes: it holds the leader's log within 2 heartbeats."""
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", metrics=True, reactor=reactor)
    heartbeat = group.configs["n0"].heart_beat_time_interval_ms / 1000.0
    admin = group.client(request_timeout=0.5)
    try:
        leader = (await group.start_and_wait(30)).leader_id
        for i in range(ENTRIES):
            await admin.append(b"entry %d" % i)
        end = (await group.metadata(admin, leader)).ledger_end_index

        async def all_hold_end():
            metas = [await group.metadata(admin, mid) for mid in group.ids]
            return all(m is not None and m.ledger_end_index == end and m.committed_index == end for m in metas)

        await group.wait_for(all_hold_end, 15, "every member to hold and commit the log")
        follower = next(mid for mid in group.ids if mid != leader)
        assert await group.stop(follower) == 0
        shutil.rmtree(tmp_path / f"dledger-{follower}")

        # Down and unknown: the leader counts every entry it holds as missing there.
        await group.wait_for(lambda: _equals(lag_of(reactor, group, leader, follower), end + 1), 10,
                             f"lag of {follower} to read {end + 1}")
        group.start(follower)

        async def following():
            meta = await group.metadata(admin, follower, timeout=0.2)
            return meta is not None and meta.leader_id == leader

        await group.wait_for(following, 30, f"{follower} to follow {leader}", interval=0.01)
        joined = reactor.seconds()

        async def caught_up():
            meta = await group.metadata(admin, follower, timeout=0.2)
            return meta is not None and meta.ledger_end_index == end and meta.committed_index == end

        await group.wait_for(caught_up, 10, f"{follower} to catch up", interval=0.01)
        took = reactor.seconds() - joined
        assert took <= 2 * heartbeat, f"caught up {took:.3f}s after joining (heartbeat {heartbeat}s)"
        await group.wait_for(lambda: _equals(lag_of(reactor, group, leader, follower), 0), 2 * heartbeat,
                             f"lag of {follower} to read 0")
        assert (await group.metadata(admin, leader)).ledger_end_index == end, "no client wrote meanwhile"
        await admin.close()
        statuses = await group.stop_all()
        assert statuses == {mid: 0 for mid in group.ids}
        logs = await group.read_logs()
        assert follower not in differing_logs(logs, leader)
    finally:
        group.close()


async def _equals(deferred_value, expected):
    return (await deferred_value) == expected
