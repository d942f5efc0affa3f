"""Member processes inside their namespaces: start, SIGSTOP/SIGCONT, SIGKILL and restart, clock skew, stop.

Each member runs ``ip netns exec <ns> python -c <bootstrap> -n dledger --config ... --id ...`` (``ip``
execs the interpreter, so the pid is the member's) in its own session; its output goes to ``<id>.log``
in the run's directory. With libfaketime available every member starts under it with a per-member
timestamp file (``<id>.faketime``, read again every second), so a clock fault is a write to that file:
``+12.5`` jumps the member's wall clock (what Twisted's timers run on) 12.5 s ahead, ``+0`` puts it back.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from dledger.launcher import TWISTD, child_env
from dledger.testing.nemesis.mutations import bootstrap

FAKETIME_LIBS = ("/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
                 "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
                 "/usr/lib/faketime/libfaketimeMT.so.1", "/usr/lib/faketime/libfaketime.so.1")


def faketime_lib() -> str | None:
    """The libfaketime to preload, or None (``make nemesis-deps`` installs Debian's ``faketime``)."""
    return next((p for p in FAKETIME_LIBS if os.path.exists(p)), None)


class Processes:
    """Named processes, each in a namespace of ``net``; all killed by :meth:`kill_all` (idempotent)."""

    def __init__(self, net, base: Path, *, mutation: str | None = None, clock: bool = False):
        self.net, self.base = net, Path(base)
        self.mutation = mutation
        self.lib = faketime_lib() if clock else None
        self.procs: dict[str, subprocess.Popen] = {}
        self.argvs: dict[str, list[str]] = {}
        self.paused: set[str] = set()
        self.offsets: dict[str, float] = {}

    def define(self, name: str, node: str, twistd_args: list[str], *, mutate: bool = True) -> None:
        program = bootstrap(self.mutation if mutate else None, TWISTD)
        self.argvs[name] = [*self.net.exec_prefix(node), sys.executable, "-c", program, "-n", "--pidfile=",
                            *twistd_args]
        self.set_clock(name, 0.0)

    def env(self, name: str) -> dict[str, str]:
        """The environment process ``name`` starts with (libfaketime and its own timestamp file, if clocks skew)."""
        env = child_env()
        if self.lib is not None:
            env.update(LD_PRELOAD=self.lib, FAKETIME_TIMESTAMP_FILE=str(self.base / f"{name}.faketime"),
                       FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1", FAKETIME_DONT_RESET="1")
        return env

    def start(self, name: str) -> None:
        with (self.base / f"{name}.log").open("ab") as out:
            self.procs[name] = subprocess.Popen(self.argvs[name], stdin=subprocess.DEVNULL, stdout=out,
                                                stderr=subprocess.STDOUT, cwd=self.base, env=self.env(name),
                                                start_new_session=True)
        self.paused.discard(name)

    def running(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def signal(self, name: str, sig: int) -> None:
        if self.running(name):
            try:
                os.killpg(self.procs[name].pid, sig)
            except ProcessLookupError:
                pass

    def pause(self, name: str) -> None:
        self.signal(name, signal.SIGSTOP)
        self.paused.add(name)

    def resume(self, name: str) -> None:
        self.signal(name, signal.SIGCONT)
        self.paused.discard(name)

    def kill(self, name: str) -> None:
        self.signal(name, signal.SIGKILL)
        p = self.procs.get(name)
        if p is not None:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                pass
        self.paused.discard(name)

    def set_clock(self, name: str, offset: float) -> None:
        """Member ``name``'s wall clock ``offset`` seconds off real time from the next second on."""
        self.offsets[name] = offset
        (self.base / f"{name}.faketime").write_text(f"{offset:+.3f}\n", encoding="ascii")

    def terminate_all(self) -> None:
        for name in self.procs:
            self.resume(name)
            self.signal(name, signal.SIGTERM)

    def kill_all(self) -> None:
        for name in list(self.procs):
            self.signal(name, signal.SIGCONT)
            self.kill(name)
