"""Network namespaces on a private bridge: where the nemesis's members, name server and clients live.

Layout of one run (``tag`` is unique per run, so two runs never share a name)::

    netns <tag>-hub    bridge "br0" (no address), one veth end per node
    netns <tag>-<node> veth "eth0" = 10.213.0.<k>/24, lo up; its peer "v<k>" sits in the hub, enslaved to br0

Addresses come from 10.213.0.0/24 and exist only inside these namespaces: nothing
is created in the namespace the harness was started from, so nothing is routed
anywhere else. Faults on the wire are blackhole routes installed inside a node's
namespace (``ip route add blackhole <peer>/32``): the node's packets to that peer
are dropped silently (a connect or send to it fails locally, an established TCP
connection stops getting its data and acks through). A symmetric cut is a
blackhole on both sides; a one-way cut only on the sending side.

Everything made here is listed in :attr:`NetNS.made` and removed by :meth:`close`
(idempotent; also what ``atexit`` and the runner's SIGTERM handler call). Deleting
a namespace deletes its veth ends; processes still inside are killed first by the
runner. :func:`leftovers` lists what a tag still has (tests assert it is empty).
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from dataclasses import dataclass, field

SUBNET = "10.213.0"
CLONE_NEWNET = 0x40000000


class NetError(RuntimeError):
    """An ``ip`` command failed: its command line and stderr in one line."""


def _ip(*args: str, check: bool = True) -> str:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and proc.returncode != 0:
        raise NetError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def unavailable() -> str | None:
    """Why this machine cannot build namespaces (not root, no ``ip``, netns refused), or None if it can."""
    if os.geteuid() != 0:
        return "the nemesis needs root (network namespaces, veth pairs, a bridge)"
    if shutil.which("ip") is None:
        return "the nemesis needs iproute2's ip command"
    probe = f"nmprobe{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (NetError, OSError) as exc:
        return f"network namespaces are not available: {exc}"
    try:
        _ip("netns", "exec", probe, "ip", "link", "add", "b0", "type", "bridge")
    except NetError as exc:
        return f"bridges are not available in a namespace: {exc}"
    finally:
        _ip("netns", "del", probe, check=False)
    return None


def leftovers(tag: str) -> list[str]:
    """Namespaces whose name starts with ``tag`` that still exist."""
    out = _ip("netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.split() and line.split()[0].startswith(tag)]


def enter(namespace: str) -> None:
    """Move the calling thread into ``namespace`` (call it before any thread is started: new threads inherit it)."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{namespace}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise NetError(f"setns({namespace}): {os.strerror(err)}")
    finally:
        os.close(fd)


@dataclass
class NetNS:
    """The bridge and one namespace per node; cuts between nodes as blackhole routes."""

    tag: str
    nodes: list[str]
    addrs: dict[str, str] = field(default_factory=dict)
    made: list[str] = field(default_factory=list)  # namespaces, in creation order
    cuts: set[tuple[str, str]] = field(default_factory=set)  # (src, dst): src's packets to dst are dropped

    @property
    def hub(self) -> str:
        return f"{self.tag}-hub"

    def ns(self, node: str) -> str:
        return f"{self.tag}-{node}"

    def build(self) -> NetNS:
        """Create the hub with its bridge and every node's namespace, veth and address; lo up everywhere."""
        try:
            _ip("netns", "add", self.hub)
            self.made.append(self.hub)
            hub = ["netns", "exec", self.hub, "ip"]
            _ip(*hub, "link", "add", "br0", "type", "bridge")
            _ip(*hub, "link", "set", "br0", "up")
            _ip(*hub, "link", "set", "lo", "up")
            for k, node in enumerate(self.nodes, start=2):
                ns = self.ns(node)
                _ip("netns", "add", ns)
                self.made.append(ns)
                addr = f"{SUBNET}.{k}"
                self.addrs[node] = addr
                _ip(*hub, "link", "add", f"v{k}", "type", "veth", "peer", "name", "eth0", "netns", ns)
                _ip(*hub, "link", "set", f"v{k}", "master", "br0")
                _ip(*hub, "link", "set", f"v{k}", "up")
                inner = ["netns", "exec", ns, "ip"]
                _ip(*inner, "addr", "add", f"{addr}/24", "dev", "eth0")
                _ip(*inner, "link", "set", "eth0", "up")
                _ip(*inner, "link", "set", "lo", "up")
        except BaseException:
            self.close()
            raise
        return self

    def exec_prefix(self, node: str) -> list[str]:
        """The argv prefix running a command inside ``node``'s namespace."""
        return ["ip", "netns", "exec", self.ns(node)]

    # -- faults ----------------------------------------------------------------------------
    def set_cuts(self, cuts: set[tuple[str, str]]) -> None:
        """Make the blackholes exactly ``cuts`` (pairs ``(src, dst)``): add the missing, remove the healed."""
        for src, dst in sorted(self.cuts - cuts):
            _ip("netns", "exec", self.ns(src), "ip", "route", "del", "blackhole", f"{self.addrs[dst]}/32", check=False)
        for src, dst in sorted(cuts - self.cuts):
            _ip("netns", "exec", self.ns(src), "ip", "route", "add", "blackhole", f"{self.addrs[dst]}/32")
        self.cuts = set(cuts)

    def routes(self, node: str) -> str:
        """``ip route`` inside ``node``'s namespace (what a test or a replay looks at)."""
        return _ip("netns", "exec", self.ns(node), "ip", "route", check=False)

    def close(self) -> None:
        """Delete every namespace this made (their veths and routes go with them); safe to call twice."""
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made.clear()
        self.cuts.clear()
