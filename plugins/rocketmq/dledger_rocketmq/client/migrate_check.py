"""``dledger rocketmq migrate-check``: is the next step of a live migration safe? (issue #27)

Why: each step of "Migrating a RocketMQ DLedger group" (docs/rocketmq.md)
stops one broker of a running group.  If a slave has not indexed every
message yet, or its consumer / delay offsets lag the master's, the step turns
a routine restart into re-deliveries (offsets behind), skipped delayed
messages (a delay offset ahead of the master's) or, if the master goes next,
a new master that lacks messages.  The check asks the group itself, through
the same codes RocketMQ's own slaves and tools use, so it works on Java
brokers, dledger members and any mix:

* the name server (GET_BROKER_CLUSTER_INFO) names the group's brokers;
* the master's topics (GET_ALL_TOPIC_CONFIG) give the queues; every broker's
  GET_MAX_OFFSET of each queue must reach the master's (read first);
* GET_ALL_CONSUMER_OFFSET of every slave must hold every offset of the
  master's within ``max_offset_lag`` messages;
* GET_ALL_DELAY_OFFSET: no slave ahead of the master (it would skip pending
  delayed messages when it takes over), the pending count reported;
* GET_ALL_TOPIC_CONFIG of every slave must hold every topic of the master's
  (a slave without a topic answers TOPIC_NOT_EXIST to its pulls, and as
  master to its sends; a Java slave under a dledger master learns topics
  only through the master's VIP channel, ``rocketmq.vipListen``).

:func:`assess` is the pure decision (a table test); :func:`gather` only asks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dledger_rocketmq.common import fastjson

GET_MAX_OFFSET = 30
GET_ALL_TOPIC_CONFIG = 21
GET_ALL_CONSUMER_OFFSET = 43
GET_ALL_DELAY_OFFSET = 45
GET_BROKER_CLUSTER_INFO = 106
SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
#: RocketMQ's topics that never carry messages (BenchmarkTest alone has 1024 queues): not asked.
QUIET_TOPICS = frozenset({"BenchmarkTest", "TBW102", "SELF_TEST_TOPIC"})
#: Reasons shown in the one line before "and N more".
SHOWN = 3


@dataclass
class BrokerView:
    """What one broker answered (``error``: why it could not be asked)."""

    broker_id: int
    addr: str
    max_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    consumer_offsets: dict[str, dict[int, int]] = field(default_factory=dict)
    delay_offsets: dict[int, int] = field(default_factory=dict)
    error: str | None = None
    #: The topics it holds (GET_ALL_TOPIC_CONFIG); None: not asked.
    topics: set[str] | None = None


@dataclass
class Verdict:
    safe: bool
    line: str
    reasons: list[str]
    figures: dict[str, Any]


def assess(name: str, brokers: dict[int, BrokerView], *, members: int | None = None,
           max_offset_lag: int = 100) -> Verdict:
    """Whether stopping one broker of group ``name`` next is safe, from what its brokers answered.

    ``brokers``: broker id -> view (id 0 is the master); ``members``: how many brokers the group should
    have registered (None: do not check).  The master's max offsets must have been read before the
    slaves' (so a slave that is caught up has at least them, whatever arrived since).
    """
    reasons: list[str] = []
    master = brokers.get(0)
    slaves = sorted((b for i, b in brokers.items() if i != 0), key=lambda b: b.broker_id)
    figures: dict[str, Any] = {"master": master.addr if master else None, "slaves": len(slaves), "queues": 0,
                               "largestOffsetLag": 0, "pendingDelayed": 0}
    if master is None:
        return Verdict(False, f"not safe: {name}: no master registered with the name server", ["no master"],
                       figures)
    if master.error:
        return Verdict(False, f"not safe: {name}: master {master.addr} did not answer: {master.error}",
                       [master.error], figures)
    if members is not None and len(brokers) < members:
        reasons.append(f"{len(brokers)} of {members} brokers registered")
    figures["queues"] = len(master.max_offsets)
    for s in slaves:
        who = f"slave {s.broker_id} ({s.addr})"
        if s.error:
            reasons.append(f"{who} did not answer: {s.error}")
            continue
        for (topic, q), want in sorted(master.max_offsets.items()):
            have = s.max_offsets.get((topic, q), 0)
            if have < want:
                reasons.append(f"{who} is behind on {topic}/{q} ({have} < {want})")
        for key, queues in sorted(master.consumer_offsets.items()):
            for q, want in sorted(queues.items()):
                have = s.consumer_offsets.get(key, {}).get(q)
                lag = want - (have if have is not None else 0)
                figures["largestOffsetLag"] = max(figures["largestOffsetLag"], lag)
                if have is None or lag > max_offset_lag:
                    reasons.append(f"{who} consumer offset {key}/{q} " + (
                        "missing" if have is None else f"{lag} behind the master's ({have} < {want})"))
        if master.topics is not None and s.topics is not None:
            lacking = sorted(master.topics - s.topics - QUIET_TOPICS)
            if lacking:
                reasons.append(f"{who} does not know topic(s) {', '.join(lacking[:5])}"
                               f"{f' and {len(lacking) - 5} more' if len(lacking) > 5 else ''} of the master's "
                               "(its slave sync has not copied them)")
        for level, want in sorted(master.delay_offsets.items()):
            have = s.delay_offsets.get(level)
            if have is not None and have > want:
                reasons.append(f"{who} delay level {level} offset {have} is ahead of the master's {want} "
                               f"(it would skip delayed messages as master)")
    pending = 0
    for level, done in master.delay_offsets.items():
        pending += max(0, master.max_offsets.get((SCHEDULE_TOPIC, level - 1), done) - done)
    figures["pendingDelayed"] = pending
    if reasons:
        more = f"; and {len(reasons) - SHOWN} more" if len(reasons) > SHOWN else ""
        return Verdict(False, f"not safe: {name}: " + "; ".join(reasons[:SHOWN]) + more, reasons, figures)
    line = (f"safe: {name}: master {master.addr} and {len(slaves)} slave(s) caught up on {figures['queues']} "
            f"queue(s); consumer offsets synced (largest lag {figures['largestOffsetLag']}); {pending} delayed "
            f"message(s) pending, delay offsets synced")
    return Verdict(True, line, [], figures)


def _json(body: bytes | None) -> dict:
    return fastjson.loads(body) if body else {}


def _topic_table(body: bytes | None) -> dict:
    """The ``topicConfigTable`` of a GET_ALL_TOPIC_CONFIG answer (topic -> config)."""
    return _json(body).get("topicConfigTable") or {}


def _int_keys(table: dict) -> dict[int, int]:
    return {int(k): int(v) for k, v in (table or {}).items()}


async def _ask(connect, addr: str, code: int, ext: dict[str, Any]) -> tuple[int, bytes, dict]:
    c = await connect(addr)
    try:
        header, body = await c.request(code, ext)
        return header.code, body, dict(header.ext_fields or {})
    finally:
        c.close()


async def gather(connect, namesrv: str, name: str) -> dict[int, BrokerView]:
    """Ask the name server and every broker of group ``name``; ``connect(addr)`` -> a connected client.

    The master's max offsets are read before any slave's.  A broker that does not answer gets ``error``.
    """
    code, body, _ = await _ask(connect, namesrv, GET_BROKER_CLUSTER_INFO, {})
    if code != 0:
        raise ValueError(f"name server {namesrv} answered code {code} to GET_BROKER_CLUSTER_INFO")
    data = (_json(body).get("brokerAddrTable") or {}).get(name)
    if not data:
        raise ValueError(f"name server {namesrv} knows no broker group {name!r}")
    views = {int(k): BrokerView(int(k), v) for k, v in (data.get("brokerAddrs") or {}).items()}
    master = views.get(0)
    queues: list[tuple[str, int]] = []
    if master is not None:
        try:
            code, body, _ = await _ask(connect, master.addr, GET_ALL_TOPIC_CONFIG, {})
            topics = _topic_table(body) if code == 0 else {}
            if code == 0:
                master.topics = set(topics)
            queues = [(t, q) for t, cfg in sorted(topics.items()) if t not in QUIET_TOPICS and t != name
                      for q in range(int(cfg.get("readQueueNums", 0)))]
        except Exception as exc:
            master.error = str(exc) or type(exc).__name__
    for view in sorted(views.values(), key=lambda v: v.broker_id):  # the master first
        if view.error:
            continue
        try:
            c = await connect(view.addr)
        except Exception as exc:
            view.error = str(exc) or type(exc).__name__
            continue
        if view.broker_id != 0 and master is not None:  # a queue the master has nothing in needs no look
            queues = [k for k in queues if master.max_offsets.get(k, 0) > 0]
        try:
            for topic, q in queues:
                header, _body = await c.request(GET_MAX_OFFSET, {"topic": topic, "queueId": q})
                if header.code == 0:
                    view.max_offsets[(topic, q)] = int((header.ext_fields or {}).get("offset", 0))
            header, body = await c.request(GET_ALL_CONSUMER_OFFSET, {})
            if header.code == 0:
                view.consumer_offsets = {k: _int_keys(v) for k, v in (_json(body).get("offsetTable") or {}).items()}
            header, body = await c.request(GET_ALL_DELAY_OFFSET, {})
            if header.code == 0 and body:
                view.delay_offsets = _int_keys(_json(body).get("offsetTable") or {})
            if view.broker_id != 0:
                header, body = await c.request(GET_ALL_TOPIC_CONFIG, {})
                if header.code == 0:
                    view.topics = set(_topic_table(body))
        except Exception as exc:
            view.error = str(exc) or type(exc).__name__
        finally:
            c.close()
    return views
