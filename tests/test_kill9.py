"""Real processes, real SIGKILL: acknowledged appends survive repeated leader kills on every member.

Three ``twistd dledger`` members with a durable store (sync flush) on
127.0.0.1; several clients append concurrently while the leader is killed
with SIGKILL and restarted, over and over.  At the end every member is
stopped cleanly and its log is read back from its files: the logs must be
identical, and every acknowledged append must be at its acknowledged index
(delivery is at least once, so unacknowledged bodies -- and retried copies
-- may appear too; an acknowledged one may never be missing or moved).
"""

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater

from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, differing_logs, durable_store

STORE = durable_store()
pytestmark = [
    pytest.mark.process,
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed on this branch yet; "
                                             "a memory store restarted after SIGKILL forgets its vote and log"),
]

APPENDERS = 8
KILLS = 4
ACKS_BETWEEN_KILLS = 150


class Appenders:
    """``n`` concurrent appenders, each with its own client, recording what was acknowledged where."""

    def __init__(self, group, n):
        self.group = group
        self.acked = {}  # index -> body
        self.conflicts = []
        self.failures = 0
        self.running = True
        self.clients = [group.client(request_timeout=1.0, retry_delay=0.01, max_attempts=400) for _ in range(n)]
        self.done = gatherResults([Deferred.fromCoroutine(self._run(k, c)) for k, c in enumerate(self.clients)])

    async def _run(self, k, client):
        seq = 0
        while self.running:
            body = f"appender {k} entry {seq}".encode()
            seq += 1
            try:
                resp = await client.append(body)
            except DLedgerError:
                self.failures += 1  # not acknowledged: may or may not be in the log
                await deferLater(self.group.reactor, 0.05, lambda: None)
                continue
            if self.acked.setdefault(resp.index, body) != body:
                self.conflicts.append((resp.index, self.acked[resp.index], body))

    async def progress(self, count, timeout):
        """Wait until ``count`` more appends were acknowledged."""
        target = len(self.acked) + count
        await self.group.wait_for(lambda: len(self.acked) >= target, timeout, f"{count} more acknowledged appends")

    async def stop(self):
        self.running = False
        await self.done
        await gatherResults([c.close() for c in self.clients])


@pytest.mark.parametrize("tls", [False, True], ids=["plain", "tls"])
@pytest_twisted.ensureDeferred
async def test_acknowledged_appends_survive_repeated_leader_kill9(tmp_path, reactor, tls):
    """Every acknowledged append is at its index on every member after the leader is SIGKILLed and restarted 4 times
    (plain TCP, and mutual TLS with authMode=tls)."""
    options, credentials = {}, None
    if tls:
        from dledger.security.certs import local_group_security

        options, credentials = local_group_security(tmp_path / "certs", "g0", ["n0", "n1", "n2"])
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", reactor=reactor, options=options,
                       client_credentials=credentials)
    admin = group.client(request_timeout=0.5)
    appenders = None
    killed = []
    try:
        await group.start_and_wait(30)
        appenders = Appenders(group, APPENDERS)
        for _ in range(KILLS):
            await appenders.progress(ACKS_BETWEEN_KILLS, 30)
            leader = (await group.wait_for_leader(admin, 15)).leader_id
            group.kill(leader)
            killed.append(leader)
            await appenders.progress(ACKS_BETWEEN_KILLS // 2, 30)  # the survivors elected a leader and commit
            group.start(leader)
            await group.wait_ready(admin, leader, 30)
        await appenders.progress(ACKS_BETWEEN_KILLS, 30)
        await appenders.stop()

        await group.wait_converged(admin, 30)
        await admin.close()
        statuses = await group.stop_all()
        assert statuses == {mid: 0 for mid in group.ids}

        logs = await group.read_logs()
        assert differing_logs(logs, "n0") == [], "these members' logs differ from n0's"
        stored = {e.index: e.body for e in logs["n0"].entries}
        missing = {i: b for i, b in appenders.acked.items() if stored.get(i) != b}
        assert not missing, f"{len(missing)} acknowledged appends missing or moved, e.g. {sorted(missing)[:5]}"
        assert not appenders.conflicts, appenders.conflicts[:5]
        assert len(killed) == KILLS and len(appenders.acked) >= KILLS * ACKS_BETWEEN_KILLS
        terms = {e.term for e in logs["n0"].entries}
        assert len(terms) >= KILLS + 1  # a new leader (term) after every kill
    finally:
        if appenders is not None and appenders.running:
            appenders.running = False
        group.close()
