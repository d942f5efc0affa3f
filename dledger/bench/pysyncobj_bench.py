"""PySyncObj on the same machine, for the ratio in ``dledger bench cluster`` (the node is ``pysyncobj_node.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dledger.bench.load import pause
from dledger.bench.runner import progress
from dledger.launcher import LocalGroup, free_ports

if TYPE_CHECKING:
    from dledger.bench.options import Options

#: The PySyncObj node script (a data file of this package: run with ``python``, never imported).
PYSYNCOBJ_NODE_SCRIPT = Path(__file__).with_name("pysyncobj_node.py")


def pysyncobj_version() -> str | None:
    try:
        from importlib.metadata import version

        return version("pysyncobj")
    except Exception:
        return None


async def measure_pysyncobj(reactor: Any, base: Path, opts: Options, group: LocalGroup | None) -> dict:
    """Three PySyncObj nodes on 127.0.0.1 with journal files; node 0 drives one-entry calls, ``in_flight`` at once."""
    ports = free_ports(3)
    addrs = [f"127.0.0.1:{p}" for p in ports]
    base = base / "pysyncobj"
    base.mkdir(parents=True, exist_ok=True)
    procs = []
    try:
        for i, me in enumerate(addrs):
            partners = ",".join(a for a in addrs if a != me)
            argv = [sys.executable, str(PYSYNCOBJ_NODE_SCRIPT), me, partners, str(base / f"node{i}.journal"),
                    "driver" if i == 0 else "node", str(opts.duration), str(opts.warmup), str(opts.pysyncobj_in_flight),
                    str(opts.size)]
            with open(base / f"node{i}.err", "wb") as err:
                procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE if i == 0 else subprocess.DEVNULL,
                                              stderr=err, start_new_session=True))
        progress(f"pysyncobj: 3 nodes, one entry per call, {opts.pysyncobj_in_flight} in flight")
        driver = procs[0]
        deadline = reactor.seconds() + opts.duration + opts.warmup + 150
        while driver.poll() is None:
            if reactor.seconds() > deadline:
                raise TimeoutError("PySyncObj driver did not finish")
            await pause(reactor, 0.1)
        out = driver.stdout.read().decode()
        if out.strip():
            result = json.loads(out.strip().splitlines()[-1])
        else:
            errors = (base / "node0.err").read_text(errors="replace").strip().splitlines()
            result = {"error": "PySyncObj driver failed: " + (errors[-1] if errors else "no output")}
    finally:
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, 9)
                except ProcessLookupError:
                    pass
                p.wait(5)
    result["version"] = pysyncobj_version()
    result["in_flight"] = opts.pysyncobj_in_flight
    return result


# -- the whole run ---------------------------------------------------------------------------------
