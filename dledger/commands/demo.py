"""``dledger demo``: the README's main job -- a real three-member group on this machine, a leader killed, nothing lost.

Three ``twistd dledger`` processes on 127.0.0.1 (free ports) with a durable
store (mmap, else LMDB) in a temporary directory and the ``fast`` preset.
The demo appends, kills the leader with SIGKILL, measures the failover,
appends again, restarts the old leader, waits for it to catch up, stops
everyone cleanly and then reads every member's log back from its store
files to show they are identical and hold every acknowledged append.
Every member is killed on the way out, whatever happens (also on Ctrl-C).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from twisted.internet.defer import Deferred
from twisted.internet.task import react

from dledger.commands.argtypes import positive_int
from dledger.errors import ConfigError, DLedgerError
from dledger.launcher import LocalGroup, durable_store


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="run a three-member group locally: append, kill -9 the leader, fail over, catch up, verify",
        description="Start three 'twistd dledger' members on 127.0.0.1 with a durable store in a temporary "
                    "directory, append entries, SIGKILL the leader, show the failover, restart it, show it "
                    "caught up and verify that every member's log is identical. Takes well under a minute.")
    p.add_argument("--store", default=None, help="store type (default: mmap, else lmdb; must be durable)")
    p.add_argument("--entries", type=positive_int, default=10, help="entries appended before and after the failover")
    p.add_argument("--dir", default=None, help="directory for stores and logs (default: a new temporary one)")
    p.add_argument("--keep", action="store_true", help="keep the directory (stores and member logs) afterwards")
    p.add_argument("--no-tls", dest="tls", action="store_false",
                   help="plain TCP without authentication (default: mutual TLS, authMode=tls, with certificates "
                        "made by 'dledger certs init' in the directory)")
    p.set_defaults(func=cmd_demo)


def cmd_demo(args) -> int:
    store = args.store or durable_store()
    if store is None:
        raise ConfigError("the demo needs a durable store (mmap or lmdb) and none is installed: a member killed "
                          "with SIGKILL would come back with an empty memory store and forget its vote")
    if store == "memory":
        raise ConfigError("--store memory: the demo kills members, and a memory store forgets everything; "
                          "use mmap or lmdb")
    base = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="dledger-demo-"))
    demo = Demo(base, store, args.entries, tls=args.tls)
    status = [1]

    def main(reactor):
        d = Deferred.fromCoroutine(demo.run(reactor))
        d.addCallback(lambda code: status.__setitem__(0, code))
        return d

    try:
        react(main)
    except SystemExit as exc:
        if exc.code not in (0, None):
            status[0] = status[0] or 1
    finally:
        if demo.group is not None:
            demo.group.close()
        if args.keep or args.dir:
            print(f"stores and member logs kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return status[0]


class Demo:
    """The demo's steps, in order; prints a transcript."""

    def __init__(self, base: Path, store: str, entries: int, tls: bool = True):
        self.tls = tls
        self.base = base
        self.store = store
        self.entries = entries
        self.group: LocalGroup | None = None
        self.t0 = time.monotonic()
        self.acked: dict[int, bytes] = {}

    def say(self, text: str) -> None:
        print(f"[{time.monotonic() - self.t0:5.1f}s] {text}", flush=True)

    async def run(self, reactor) -> int:
        reactor.addSystemEventTrigger("before", "shutdown", lambda: self.group and self.group.kill_all())
        try:
            return await self._run(reactor)
        except (DLedgerError, TimeoutError, RuntimeError) as exc:
            self.say(f"FAILED: {exc}")
            if self.group is not None:
                for mid in self.group.ids:
                    print(f"  last lines of {self.group.members[mid].log_path}:")
                    for line in self.group.log_lines(mid)[-5:]:
                        print(f"    {line}")
            return 1
        finally:
            if self.group is not None:
                self.group.kill_all()

    async def _run(self, reactor) -> int:
        print(f"dledger demo: three members on this machine, store {self.store!r}, preset 'fast'")
        print(f"  directory: {self.base} (member stores, config dledger.toml, logs n0.log n1.log n2.log)")
        options, credentials = {}, None
        if self.tls:
            from dledger.security.certs import local_group_security

            options, credentials = local_group_security(self.base / "certs", "g0", ["n0", "n1", "n2"])
            print(f"  security: mutual TLS, authMode=tls; CA and certificates from 'dledger certs init' in "
                  f"{self.base / 'certs'}")
        g = self.group = LocalGroup(self.base, n=3, store=self.store, preset="fast", reactor=reactor,
                                    options=options, client_credentials=credentials)
        client = g.client(request_timeout=1.0, retry_delay=0.01, max_attempts=200)
        try:
            return await self._steps(g, client)
        finally:
            await client.close()

    async def _steps(self, g: LocalGroup, client) -> int:
        self.say(f"starting {', '.join(g.ids)}: twistd {' '.join(g.argv(g.ids[0])[3:])} (and --id n1, --id n2)")
        g.start()
        for mid in g.ids:
            await g.wait_ready(client, mid, 20)
        summary = g.log_lines(g.ids[0], "dledger member ")
        if summary:
            self.say("n0 says: " + summary[-1].split("] ", 1)[-1])
        leader = await g.wait_for_leader(client, 10)
        self.say(f"all three serve; the leader is {leader.leader_id} (term {leader.term})")
        if self.tls:
            await self.outsider(g, leader)

        await self.append_some(client, "before")
        entries = await client.get(min(self.acked), self.entries * 2)
        same = sum(1 for e in entries if self.acked.get(e.index) == e.body)
        self.say(f"read back from the leader with GET: {same} of {len(self.acked)} entries match what was appended")

        old = (await g.wait_for_leader(client, 10)).leader_id
        self.say(f"kill -9 {old} (the leader), pid {g.members[old].pid}")
        killed_at = time.monotonic()
        g.kill(old)
        resp = await client.append(b"first entry after the failover")
        failover = time.monotonic() - killed_at
        self.acked[resp.index] = b"first entry after the failover"
        new = await g.wait_for_leader(client, 10, exclude=(old,))
        self.say(f"{new.leader_id} is the new leader (term {new.term}); failover took {failover:.2f} s "
                 f"(SIGKILL -> first acknowledged append, index {resp.index})")

        await self.append_some(client, "after")
        self.say(f"restarting {old}: it recovers its {self.store} store from disk and rejoins")
        g.start(old)
        leader_meta = await g.wait_for_leader(client, 10)

        async def caught_up():
            meta = await g.metadata(client, old)
            lead = await g.metadata(client, leader_meta.leader_id)
            if meta is None or lead is None:
                return None
            ok = meta.ledger_end_index == lead.ledger_end_index and meta.committed_index == lead.committed_index
            return meta if ok else None

        meta = await g.wait_for(caught_up, 20, f"{old} to catch up")
        self.say(f"{old} is back as {meta.role} in term {meta.term}: end index {meta.ledger_end_index}, "
                 f"committed {meta.committed_index} -- caught up with the leader")
        for mid in g.ids:
            m = await g.metadata(client, mid)
            self.say(f"  {mid}: {m.role:9} term {m.term}  log {m.ledger_begin_index}..{m.ledger_end_index}  "
                     f"committed {m.committed_index}")

        self.say("stopping all members with SIGTERM (each flushes its store and exits)")
        statuses = await g.stop_all()
        bad = {mid: code for mid, code in statuses.items() if code != 0}
        if bad:
            raise RuntimeError(f"members exited with a non-zero status: {bad}")
        self.say(f"all exited with status 0; reading each member's log back from its {self.store} files")
        logs = {mid: await g.read_log(mid) for mid in g.ids}
        for mid, lg in logs.items():
            noops = sum(1 for e in lg.entries if e.is_noop)
            self.say(f"  {mid}: entries {lg.begin}..{lg.end} ({len(lg.entries)} entries, {noops} of them NOOPs "
                     f"written by new leaders), committed {lg.committed}")
        return self.verify(logs)

    async def outsider(self, g: LocalGroup, leader) -> None:
        """A forged VOTE from a client without a member certificate: refused, the term does not move."""
        from dledger.messages import VoteRequest
        from dledger.security.guard import ClientCredentials
        from dledger.transport.client import RemotingClient

        victim = next(mid for mid in g.ids if mid != leader.leader_id)
        outsider = RemotingClient(g.reactor, timeout=2.0, credentials=ClientCredentials.for_client(
            g.group, tls_ca=str(self.base / "certs" / "ca.crt")))
        try:
            resp = await outsider.send(f"127.0.0.1:{g.members[victim].port}", VoteRequest(
                group=g.group, remote_id=victim, local_id=victim, leader_id=victim, term=leader.term + 1,
                ledger_end_index=10 ** 6, ledger_end_term=leader.term))
        finally:
            await outsider.close()
        from dledger.codes import ResponseCode

        self.say(f"a forged VOTE (term {leader.term + 1}) from a TLS client without a member certificate: "
                 f"{ResponseCode.of(resp.code).name}")
        if resp.code != ResponseCode.NOT_AUTHORIZED:
            raise RuntimeError(f"{victim} accepted a forged VOTE: {resp}")

    async def append_some(self, client, when: str) -> None:
        first = last = None
        for i in range(self.entries):
            body = f"entry {i} appended {when} the failover".encode()
            resp = await client.append(body)
            self.acked[resp.index] = body
            first = resp.index if first is None else first
            last = resp.index
        self.say(f"appended {self.entries} entries {when} the failover: indexes {first}..{last} "
                 f"(each acknowledged once a majority stored it)")

    def verify(self, logs) -> int:
        ref_id, ref = next(iter(logs.items()))
        key = lambda e: (e.index, e.term, e.pos, e.magic, e.body_crc, e.body)
        for mid, lg in logs.items():
            if [key(e) for e in lg.entries] != [key(e) for e in ref.entries]:
                diff = next((a.index for a, b in zip(lg.entries, ref.entries) if key(a) != key(b)),
                            min(len(lg.entries), len(ref.entries)))
                self.say(f"FAILED: {mid}'s log differs from {ref_id}'s at index {diff}")
                return 1
        by_index = {e.index: e.body for e in ref.entries}
        missing = [i for i, body in self.acked.items() if by_index.get(i) != body]
        if missing:
            self.say(f"FAILED: acknowledged appends missing or different at indexes {missing}")
            return 1
        self.say(f"the three logs are identical entry by entry (index, term, pos, CRC, body), and all "
                 f"{len(self.acked)} acknowledged appends are at their acknowledged indexes")
        self.say("demo finished: OK")
        return 0
