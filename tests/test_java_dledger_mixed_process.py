"""A mixed group: two dledger members and one real Java DLedger 0.3.2 member (``java-dledger`` from the kit).

The Java member must vote and replicate with our members as a member of the group: with one dledger member
killed, appends still commit (the Java member's acknowledgement is the majority); with the other dledger member
killed and the first restarted, the group of one dledger and one Java member elects a leader (either kind) and
serves every entry appended before, plus new ones.  Skipped with the reason without the kit or ``java``;
marked slow (a JVM and three elections, about 30 s); `make test` runs it too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import pytest_twisted

from dledger.codes import Role
from dledger.launcher import LocalGroup, child_env, durable_store
from dledger.testing.procs import LogFile

ROOT = Path(__file__).resolve().parent.parent
KIT = Path(os.environ.get("DLEDGER_JAVAKIT", ROOT.parent / "shared" / "javakit"))
JAVA_DLEDGER = KIT / "bin" / "java-dledger"
STORE = durable_store()
pytestmark = [
    pytest.mark.process,
    pytest.mark.slow,
    pytest.mark.skipif(not JAVA_DLEDGER.exists(), reason=f"the Java kit is not at {KIT} (set DLEDGER_JAVAKIT)"),
    pytest.mark.skipif(shutil.which("java") is None, reason="java is not installed"),
    pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
]




@pytest_twisted.ensureDeferred
async def test_two_dledger_members_and_a_java_dledger_member(tmp_path, reactor, capsys):
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="default")
    client = group.client(request_timeout=1.0)
    java = LogFile(tmp_path / "n2-java.log")
    env = child_env({"DLEDGER_HEAP": "-Xms64m -Xmx128m"})
    proc = reactor.spawnProcess(java, str(JAVA_DLEDGER), [str(JAVA_DLEDGER), "server", "-g", group.group, "-i", "n2",
                                                          "-p", group.peers, "-s", str(tmp_path / "java-n2")],
                                env=env, path=str(tmp_path))
    bodies: list[bytes] = []

    async def append(n: int, tag: str, timeout: float = 60.0):
        for i in range(n):
            body = f"{tag}-{i}".encode()

            async def once(body=body):
                try:
                    await client.append(body)
                    return True
                except Exception:
                    return False
            await group.wait_for(once, timeout, f"append {body!r} to commit", interval=0.2)
            bodies.append(body)

    async def leader_anywhere():
        """The leader as our members see it (a Java member's metadata has no role: its followers name it)."""
        for mid in ("n0", "n1"):
            if not group.members[mid].running:
                continue
            meta = await group.metadata(client, mid)
            if meta is not None and meta.role == Role.LEADER.name:
                return mid
            if meta is not None and meta.role == Role.FOLLOWER.name and meta.leader_id == "n2":
                return "n2"
        return None

    try:
        group.start("n0", "n1")
        first = await group.wait_for(leader_anywhere, 60, "a leader of the mixed group")
        await append(5, "all-three")
        # one dledger member down: the other and the Java member are the majority
        follower = next(mid for mid in ("n0", "n1") if mid != first) if first != "n2" else "n1"
        group.kill(follower)
        await group.wait_exit(follower, 10)
        await append(5, "with-java")
        # the other dledger member down, the first back: one dledger and one Java member
        survivor = next(mid for mid in ("n0", "n1") if mid != follower)
        group.kill(survivor)
        await group.wait_exit(survivor, 10)
        group.start(follower)
        second = await group.wait_for(leader_anywhere, 90, "a leader of dledger + Java DLedger")
        await append(3, "after")
        got = []
        for index in range(0, 64):
            if set(bodies) <= set(got):
                break
            try:
                entries = await client.get(index)
            except Exception:
                break
            got += [e.body for e in (entries if isinstance(entries, list) else [entries])]
        with capsys.disabled():
            print(f"\nmixed dledger/Java DLedger group: first leader {first}, after two kills {second}, "
                  f"{len(bodies)} entries appended and read back")
        # an append retried after a timeout may be stored twice (at least once): first occurrences, in order
        assert list(dict.fromkeys(b for b in got if b in set(bodies))) == bodies
    finally:
        await client.close()
        await group.stop_all()
        group.close()
        if not java.ended.called:
            proc.signalProcess("TERM")
            await java.ended
