"""A dledger group as local ``twistd dledger`` processes: the demo, the cluster benchmark and process tests use it.

Each member runs ``twistd -n dledger --config <dir>/dledger.toml --id <id>``
in its own session (so its process group can be killed as a whole and a
Ctrl-C in the terminal does not reach it behind our back), with its output
in ``<dir>/<id>.log``.  Ports are picked free on 127.0.0.1.  Waiting is done
by polling an observable condition on the reactor with a deadline, never by
sleeping.  :meth:`LocalGroup.kill_all` (also registered with ``atexit``)
SIGKILLs every process group still running, so nothing is left behind when
the caller fails or is interrupted.
"""

from __future__ import annotations

import atexit
import hashlib
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet.defer import maybeDeferred
from twisted.internet.task import deferLater

import dledger
from dledger import plugins
from dledger.codes import Role
from dledger.config import DLedgerConfig, make_config
from dledger.entry import Entry
from dledger.errors import DLedgerError

#: Runs twistd with this interpreter (so the children import the same dledger as the parent).
TWISTD = "import sys; from twisted.scripts.twistd import run; sys.argv[0] = 'twistd'; sys.exit(run())"
#: Smaller files than DLedger's 1 GiB / 160 MiB, so a local group does not allocate gigabytes.
LOCAL_FILE_SIZES = {"mappedFileSizeForEntryData": 64 << 20, "mappedFileSizeForEntryIndex": 32 * (256 << 10)}
#: Durable stores, best first, for anything that kills members and expects their logs back.
DURABLE_STORES = ("mmap", "lmdb")


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports that were free a moment ago (all bound at once, then released)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def durable_store() -> str | None:
    """The best installed durable store type (``mmap``, else ``lmdb``), or None."""
    known = plugins.store_types()
    return next((name for name in DURABLE_STORES if name in known), None)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a member process: the directory holding our ``dledger`` package comes first on the path.

    So a child imports the same dledger as this process, and twistd finds the dropin in that
    directory's ``twisted/plugins`` (a source checkout or a compat editable install).
    """
    env = dict(os.environ)
    root = str(Path(dledger.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.update(extra or {})
    return env


@dataclass
class Member:
    """One member process (restartable)."""

    id: str
    port: int
    metrics_port: int | None
    log_path: Path
    proc: subprocess.Popen | None = None
    starts: int = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class LocalGroup:
    """``n`` members on 127.0.0.1 sharing one config file in ``base_dir``; the reactor drives every wait."""

    def __init__(self, base_dir: str | Path, *, n: int = 3, group: str = "g0", store: str = "mmap",
                 preset: str = "fast", flush_policy: str = "sync", metrics: bool = False,
                 options: dict[str, Any] | None = None, reactor: Any = None, python: str = sys.executable,
                 host: str = "127.0.0.1", member_args: dict[str, list[str]] | None = None,
                 client_credentials: Any = None):
        if reactor is None:
            from twisted.internet import reactor
        self.reactor = reactor
        #: What :meth:`client` presents to members with TLS or authentication on (docs/security.md).
        self.client_credentials = client_credentials
        self.base_dir = Path(base_dir)
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.group = group
        self.store = store
        self.python = python
        self.host = host
        self.ids = [f"n{i}" for i in range(n)]
        #: Extra command-line arguments per member (e.g. ``--plugin-opt rocketmq.listen=...``: what differs
        #: between members of one shared config file).
        self.member_args = dict(member_args or {})
        ports = free_ports(n * (2 if metrics else 1), host)
        self.members = {mid: Member(mid, ports[i], ports[n + i] if metrics else None, self.base_dir / f"{mid}.log")
                        for i, mid in enumerate(self.ids)}
        #: Members removed from the group (:meth:`retire`), by id: their stores stay readable.
        self.retired: dict[str, Member] = {}
        self._set_peers()
        settings: dict[str, Any] = {"preset": preset, "group": group, "peers": self.peers, "storeType": store,
                                    "storeBaseDir": str(self.base_dir), "flushPolicy": flush_policy,
                                    **LOCAL_FILE_SIZES, **(options or {})}
        self.config_path = self.base_dir / "dledger.toml"
        self.config_path.write_text("".join(f"{k} = {_toml(v)}\n" for k, v in settings.items()), encoding="utf-8")
        self.configs = {mid: make_config(file=self.config_path, self_id=mid) for mid in self.ids}
        atexit.register(self.kill_all)

    # -- processes ---------------------------------------------------------------------
    def argv(self, mid: str) -> list[str]:
        """The command line of member ``mid`` (``twistd -n dledger --config ... --id mid``)."""
        m = self.members[mid]
        args = [self.python, "-c", TWISTD, "-n", "--pidfile=", "dledger", "--config", str(self.config_path),
                "--id", mid]
        if m.metrics_port is not None:
            args += ["--metrics", f"tcp:{m.metrics_port}:interface={self.host}"]
        return args + list(self.member_args.get(mid, ()))

    # -- membership change (issue #23) ------------------------------------------------------
    def new_member(self, mid: str | None = None) -> Member:
        """A member to join the running group (not started): its own free port(s), started with ``--join``.

        Its bootstrap ``--peers`` are the group's current members and itself (``joinExisting``: a learner
        until ``dledger members add`` on the leader and the leader's promotion).  Start it with
        :meth:`start`; the group's :attr:`peers` (what :meth:`client` connects to) include it from now on.
        """
        taken = set(self.members) | set(self.retired)
        if mid is None:
            mid = next(f"n{i}" for i in range(len(taken) + 1) if f"n{i}" not in taken)
        elif mid in taken:
            raise ValueError(f"{mid} is already a member id of this group")
        ports = free_ports(2 if any(m.metrics_port for m in self.members.values()) else 1, self.host)
        member = Member(mid, ports[0], ports[1] if len(ports) > 1 else None, self.base_dir / f"{mid}.log")
        self.members[mid] = member
        self.ids.append(mid)
        self._set_peers()
        self.member_args[mid] = [*self.member_args.get(mid, ()), "--peers", self.peers, "--join"]
        self.configs[mid] = make_config(file=self.config_path, self_id=mid, peers=self.peers, join_existing=True)
        return member

    def address(self, mid: str) -> str:
        """``host:port`` of member ``mid`` (what ``dledger members add ID=HOST:PORT`` takes)."""
        m = self.members.get(mid) or self.retired[mid]
        return f"{self.host}:{m.port}"

    def retire(self, mid: str) -> Member:
        """Forget member ``mid`` once it was removed from the configuration: kill it if it still runs.

        It leaves :attr:`ids`, :attr:`peers` and the waits; its record stays in :attr:`retired` (its
        store can still be read with :meth:`read_log`).
        """
        self.kill(mid)
        member = self.members.pop(mid)
        self.retired[mid] = member
        self.ids.remove(mid)
        self._set_peers()
        return member

    def _set_peers(self) -> None:
        self.peers = ";".join(f"{mid}-{self.host}:{m.port}" for mid, m in self.members.items())

    def start(self, *ids: str) -> None:
        """Start members (all by default) that are not running; their output is appended to ``<id>.log``."""
        for mid in ids or self.ids:
            m = self.members[mid]
            if m.running:
                continue
            with m.log_path.open("ab") as out:
                m.proc = subprocess.Popen(self.argv(mid), stdin=subprocess.DEVNULL, stdout=out,
                                          stderr=subprocess.STDOUT, cwd=self.base_dir, env=child_env(),
                                          start_new_session=True)
            m.starts += 1

    def signal(self, mid: str, sig: int) -> None:
        """Send ``sig`` to member ``mid``'s process group (nothing if it is not running)."""
        m = self.members.get(mid) or self.retired[mid]
        if m.running:
            try:
                os.killpg(m.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, mid: str) -> None:
        """``kill -9`` member ``mid``: no flush, no goodbye."""
        self.signal(mid, signal.SIGKILL)
        m = self.members.get(mid) or self.retired.get(mid)
        if m is not None and m.proc is not None:
            m.proc.wait(5)  # SIGKILL cannot be caught: this returns at once

    async def wait_exit(self, mid: str, timeout: float) -> int:
        """The exit status of ``mid`` once it exited (negative: killed by that signal); TimeoutError if not in time."""
        m = self.members[mid]
        await self.wait_for(lambda: not m.running, timeout, f"{mid} to exit")
        return m.proc.returncode

    async def stop(self, mid: str, timeout: float = 15.0) -> int:
        """SIGTERM (flush and exit), then the exit status; SIGKILL and TimeoutError if it does not exit in time."""
        self.signal(mid, signal.SIGTERM)
        try:
            return await self.wait_exit(mid, timeout)
        except TimeoutError:
            self.kill(mid)
            raise

    async def stop_all(self, timeout: float = 15.0) -> dict[str, int]:
        """Stop every running member (all at once); their exit statuses."""
        running = [mid for mid in self.ids if self.members[mid].running]
        for mid in running:
            self.signal(mid, signal.SIGTERM)
        return {mid: await self.wait_exit(mid, timeout) for mid in running}

    def kill_all(self) -> None:
        """SIGKILL every member still running and reap it (safe to call any time, twice, or at exit)."""
        for mid in [*self.ids, *self.retired]:
            try:
                self.kill(mid)
            except (OSError, subprocess.TimeoutExpired):
                pass

    def close(self) -> None:
        self.kill_all()
        atexit.unregister(self.kill_all)

    # -- observing -----------------------------------------------------------------------
    async def wait_for(self, condition: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
        """Poll ``condition`` (a plain or async callable) until it is truthy; TimeoutError naming ``what``."""
        deadline = self.reactor.seconds() + timeout
        while True:
            value = condition()
            if isinstance(value, Awaitable):
                value = await value
            if value:
                return value
            if self.reactor.seconds() >= deadline:
                raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
            await deferLater(self.reactor, interval, lambda: None)

    def client(self, **options: Any):
        """A :class:`~dledger.client.DLedgerClient` of this group over TCP (close it when done)."""
        from dledger.client import connect

        options.setdefault("credentials", self.client_credentials)
        return connect(self.peers, self.group, reactor=self.reactor, **options)

    def teach(self, client: Any, *ids: str) -> None:
        """Give ``client`` (made before they joined) the addresses of members ``ids`` (all by default)."""
        known = getattr(client.transport, "members", None)
        if not isinstance(known, dict):
            return
        for mid in ids or self.ids:
            if mid in self.members and mid not in known:
                known[mid] = self.address(mid)
                client.transport.remoting.expected_peers[known[mid]] = mid
            if mid not in client.member_ids:
                client.member_ids.append(mid)

    async def metadata(self, client: Any, mid: str, timeout: float = 0.5) -> Any:
        """Member ``mid``'s detailed metadata, or None if it does not answer."""
        self.teach(client, mid)
        try:
            return await client.transport.send(mid, _metadata_request(self.group, mid), timeout=timeout)
        except DLedgerError:
            return None

    async def wait_for_leader(self, client: Any, timeout: float, exclude: tuple[str, ...] = ()) -> Any:
        """The metadata of a member that says it is LEADER (not one of ``exclude``)."""

        async def leader():
            for mid in self.ids:
                if mid in exclude or not self.members[mid].running:
                    continue
                meta = await self.metadata(client, mid)
                if meta is not None and meta.role == Role.LEADER.name:
                    return meta
            return None

        return await self.wait_for(leader, timeout, "a leader", interval=0.05)

    async def start_and_wait(self, timeout: float = 30.0) -> Any:
        """Start every member, wait until each serves and a leader is elected; the leader's metadata."""
        self.start()
        admin = self.client(request_timeout=0.5)
        try:
            for mid in self.ids:
                await self.wait_ready(admin, mid, timeout)
            return await self.wait_for_leader(admin, timeout)
        finally:
            await admin.close()

    async def wait_converged(self, client: Any, timeout: float,
                             what: str = "every member to hold and commit the same log") -> list:
        """Every member's metadata once all hold and commit the same log in the same term under one leader."""
        async def converged():
            metas = [await self.metadata(client, mid) for mid in self.ids]
            if any(m is None or m.peers is None for m in metas):
                return None
            ends = {(m.ledger_end_index, m.committed_index, m.term, m.leader_id) for m in metas}
            return metas if len(ends) == 1 and metas[0].ledger_end_index == metas[0].committed_index else None
        return await self.wait_for(converged, timeout, what)

    async def wait_ready(self, client: Any, mid: str, timeout: float) -> Any:
        """Member ``mid`` answers metadata (it is started and serving)."""
        return await self.wait_for(lambda: self.metadata(client, mid), timeout, f"{mid} to serve")

    def rss_bytes(self, mid: str) -> int:
        """Resident set size of member ``mid`` now (from /proc), 0 if unknown."""
        return self._proc_status(mid, "VmRSS:")

    def peak_rss_bytes(self, mid: str) -> int:
        """Peak resident set size of member ``mid`` since it started (VmHWM), 0 if unknown."""
        return self._proc_status(mid, "VmHWM:")

    def cpu_seconds(self, mid: str) -> float:
        """User + system CPU seconds member ``mid``'s process used so far (from /proc), 0.0 if unknown.

        On a shared machine throughput follows whatever else runs; the CPU a
        member spends per entry or message does not, so benchmarks report it.
        """
        try:
            with open(f"/proc/{self.members[mid].pid}/stat", encoding="ascii") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError, TypeError):
            return 0.0

    def _proc_status(self, mid: str, key: str) -> int:
        pid = self.members[mid].pid
        try:
            with open(f"/proc/{pid}/status", encoding="ascii") as fh:
                for line in fh:
                    if line.startswith(key):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, TypeError):
            pass
        return 0

    def log_lines(self, mid: str, containing: str = "") -> list[str]:
        """Lines of member ``mid``'s output that contain ``containing``."""
        try:
            text = self.members[mid].log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return []
        return [line for line in text.splitlines() if containing in line]

    async def read_log(self, mid: str) -> StoredLog:
        """Member ``mid``'s log, read from its store files (the member must be stopped)."""
        if (self.members.get(mid) or self.retired[mid]).running:
            raise RuntimeError(f"{mid} is running; stop it before reading its store")
        return await read_stored_log(self.configs[mid])

    def store_checksums(self, mid: str) -> dict[str, str]:
        """sha256 of every file of member ``mid``'s store, by path in its directory, except the checkpoint (rewritten
        on its own schedule) and lock files: what a test compares before and after hostile traffic."""
        root = self.configs[mid].member_dir
        out = {}
        for path in sorted(p for p in root.rglob("*") if p.is_file()):
            if path.name.startswith("checkpoint") or path.suffix == ".lock" or path.name == "lock.mdb":
                continue
            out[str(path.relative_to(root))] = hashlib.sha256(path.read_bytes()).hexdigest()
        return out

    async def read_logs(self) -> dict[str, StoredLog]:
        """Every member's log, read from its store files (all members must be stopped)."""
        return {mid: await self.read_log(mid) for mid in self.ids}


def processes_mentioning(text: str) -> list[int]:
    """Pids of live processes whose command line contains ``text`` (a test's "nothing left running" check)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if text.encode() in fh.read():
                    pids.append(int(pid))
        except OSError:
            pass
    return pids


def differing_logs(logs: dict[str, StoredLog], reference: str) -> list[str]:
    """The members whose stored log is not, entry for entry, ``reference``'s (index, term, pos, magic, CRC, body).

    What a process test asserts empty after stopping a group: every member
    ends with the same log, whatever was killed or forged meanwhile.
    """
    def key(e: Entry) -> tuple:
        return e.index, e.term, e.pos, e.magic, e.body_crc, e.body
    want = [key(e) for e in logs[reference].entries]
    return [mid for mid, lg in logs.items() if [key(e) for e in lg.entries] != want]


@dataclass
class StoredLog:
    """What a stopped member's store holds."""

    member: str
    begin: int
    end: int
    committed: int
    entries: list[Entry]


async def read_stored_log(config: DLedgerConfig, chunk: int = 4096) -> StoredLog:
    """Open the store of a *stopped* member through its store plugin (start-up recovery included), read every entry.

    This is what the member itself would find on restart.
    """
    from dledger.testing.store_contract import FakeMemberState

    store_type = plugins.get_store_type(config.store_type)
    store = store_type.make_log_store(config, FakeMemberState(self_id=config.self_id, role=Role.CANDIDATE,
                                                              curr_term=-1, leader_id=None))
    store.startup()
    try:
        entries: list[Entry] = []
        index, end = store.ledger_begin_index, store.ledger_end_index
        while 0 <= index <= end:
            batch = store.get_range(index, chunk, 64 << 20)
            entries.extend(batch)
            index = batch[-1].index + 1
        return StoredLog(config.self_id, store.ledger_begin_index, end, store.committed_index, entries)
    finally:
        await maybeDeferred(store.shutdown)


def _metadata_request(group: str, mid: str):
    from dledger.messages import MetadataRequest

    return MetadataRequest(group=group, remote_id=mid, detail=True)


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
