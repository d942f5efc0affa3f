"""Broker groups as local ``twistd dledger`` processes (:class:`dledger.launcher.LocalGroup`) for tests and benchmarks.

What differs per member of a broker group sharing one config file is its
broker port: :func:`broker_port_args` gives each member its ``rocketmq.listen``
and the matching ``rocketmq.storeHost``.  :func:`wait_for_master` waits until
the dledger leader's broker takes a send, i.e. it has switched to master
(caught up and dispatched), which is later than dledger's own leader election.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from dledger_rocketmq.client.client import connect


def broker_port_args(ports: Mapping[str, int], host: str = "127.0.0.1") -> dict[str, list[str]]:
    """``LocalGroup(member_args=...)`` giving member ``mid`` a broker port on ``host:ports[mid]``."""
    return {mid: ["--plugin-opt", f"rocketmq.listen=tcp:{p}:interface={host}",
                  "--plugin-opt", f"rocketmq.storeHost={host}:{p}"] for mid, p in ports.items()}


async def wait_for_master(group: Any, admin: Any, ports: Mapping[str, int], *, topic: str, body: bytes = b"probe",
                          timeout: float = 30.0, live: Container[str] | None = None, queues: int = 4) -> str:
    """The id of the member whose broker took one send of ``body`` to ``topic`` (queue 0) as master.

    ``live``: members that may be it (a killed one is not asked); ``queues``: the queues a topic the
    send auto-creates gets.  TimeoutError (from ``group.wait_for``) naming what was awaited.
    """
    async def probe():
        meta = await group.wait_for_leader(admin, timeout)
        mid = meta.leader_id
        if live is not None and mid not in live:
            return None
        try:
            c = await connect(group.reactor, group.host, ports[mid], timeout=2, default_topic_queue_nums=queues)
        except Exception:
            return None
        try:
            await c.send(topic, body, queue_id=0)
        except Exception:
            return None
        finally:
            c.close()
        return mid
    return await group.wait_for(probe, timeout, "a master broker", interval=0.05)
