"""``dledger bench rocketmq``: messages/s through the broker plugin on a 3-member group, and dispatch lag.

Starts its own group (three ``twistd dledger`` processes on 127.0.0.1 with
the broker plugin enabled and a broker port each, :class:`dledger.launcher.LocalGroup`),
finds the master, and drives its broker port over one connection with the
plugin's own client (RocketMQ remoting, as a stock client speaks it):

``batch``   SEND_BATCH_MESSAGE of ``--batch`` messages, ``--batch-in-flight`` requests outstanding; by default
            as many messages as RocketMQ's batch example (``ListSplitter``) puts in one list (:func:`splitter_batch`)
``single``  SEND_MESSAGE_V2 of one message, ``--in-flight`` requests outstanding, pre-encoded frames
            (:class:`RawSends`, as the plain log's generator sends its appends)

Messages are ``--size`` bytes, spread round-robin over ``--queues`` queues
of one topic.  While a phase runs, the consume queues of the master and of
one slave are sampled (GET_MAX_OFFSET) against the acknowledged queue
offsets: the *dispatch lag* is how many acknowledged messages a consumer of
that member could not see yet; after the phase, *drain* is the time until
every member's queues hold every acknowledged message.  Progress lines go to
stderr; figures are printed, never asserted.  The ``dispatch`` phase runs
the in-process dispatcher benchmark (:mod:`dledger_rocketmq.tools.bench_dispatch`).
"""

from __future__ import annotations

import re
import shutil
import struct
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from twisted.internet import protocol
from twisted.internet.defer import Deferred
from twisted.internet.endpoints import TCP4ClientEndpoint, connectProtocol
from twisted.internet.task import deferLater

from dledger.bench.load import reply_frames
from dledger.bench.runner import progress, run_benchmark
from dledger.commands.argtypes import positive_float, positive_int
from dledger.launcher import LocalGroup, durable_store, free_ports
from dledger.transport.remoting import Header
from dledger.transport.sockopts import set_no_delay
from dledger_rocketmq.broker.port import SEND_MESSAGE_V2, VERSION
from dledger_rocketmq.client.client import RocketMQError, connect, message_properties
from dledger_rocketmq.common.batch import BatchItem, encode_batch
from dledger_rocketmq.tools.localgroup import broker_port_args, wait_for_master

PHASES = ("batch", "single", "dispatch")
TOPIC = "BenchTopic"
#: The properties of every benchmark message (one tag).
BATCH_PROPERTIES = message_properties("TagA")
#: Issue #10's target for batched 1 KiB messages on the 2-core machine (plain dledger: ~69,000 entries/s).
TARGET_BATCH = 50_000
#: RocketMQ's batch example (docs/en/Example_Batch.md, ``ListSplitter``) cuts a producer's messages into lists of at
#: most this many bytes, counting each message as topic + body + properties + 20 bytes of log overhead.
SPLITTER_SIZE_LIMIT = 1000 * 1000
SPLITTER_OVERHEAD = 20


def splitter_batch(size: int, topic: str = "BenchTopic", properties: str = "") -> int:
    """How many messages of ``size`` body bytes RocketMQ's example ``ListSplitter`` puts in one batch (at least 1).

    A stock producer sends a batch with ``producer.send(list)``; the documented
    way to keep a batch under the broker's 4 MiB limit is that splitter, so
    its lists are what "batched" means to a RocketMQ user.  Its size counts
    the topic, the body, each property's key and value and 20 bytes per message.
    """
    props = 0
    for item in properties.split("\x02"):
        if item:
            key, _, value = item.partition("\x01")
            props += len(key) + len(value)
    return max(1, SPLITTER_SIZE_LIMIT // (len(topic) + size + props + SPLITTER_OVERHEAD))


@dataclass
class Options:
    size: int = 1024
    duration: float = 5.0
    warmup: float = 1.0
    batch: int = 0  # 0: splitter_batch(size)
    batch_in_flight: int = 8
    in_flight: int = 64
    queues: int = 8
    store: str | None = None
    preset: str = "default"
    flush: str = "sync"
    phases: tuple[str, ...] = ("batch", "single")
    directory: str | None = None
    keep: bool = False
    json: bool = False

    def __post_init__(self):
        if self.batch <= 0:
            self.batch = splitter_batch(self.size, TOPIC, BATCH_PROPERTIES)


def register(bench_subparsers) -> None:
    """Add ``dledger bench rocketmq`` (called through the ``dledger_bench_subjects`` hook)."""
    p = bench_subparsers.add_parser(
        "rocketmq", help="messages/s through the RocketMQ broker plugin on a 3-member group",
        description=__doc__.split("\n\n")[1].replace("\n", " "))
    p.add_argument("--size", type=positive_int, default=1024, help="message body bytes (default 1024)")
    p.add_argument("--duration", type=positive_float, default=5.0, help="seconds measured per phase (default 5)")
    p.add_argument("--warmup", type=float, default=1.0, help="seconds of load before measuring (default 1)")
    p.add_argument("--batch", type=positive_int, default=0,
                   help="messages per SEND_BATCH_MESSAGE (default: as many as RocketMQ's example ListSplitter puts "
                        "in one batch of at most 1,000,000 bytes: 941 of 1 KiB)")
    p.add_argument("--batch-in-flight", type=positive_int, default=8,
                   help="batch requests outstanding (default 8)")
    p.add_argument("--in-flight", type=positive_int, default=64,
                   help="single-message sends outstanding (default 64)")
    p.add_argument("--queues", type=positive_int, default=8, help="queues of the topic (default 8)")
    p.add_argument("--store", choices=("mmap", "lmdb"), default=None, help="store (default: mmap)")
    p.add_argument("--preset", default="default", help="timing preset of the members (default: default)")
    p.add_argument("--flush", choices=("sync", "async"), default="sync", help="members' flush policy (default sync)")
    p.add_argument("--phases", default="batch,single",
                   help=f"comma-separated phases out of {', '.join(PHASES)} (default batch,single)")
    p.add_argument("--dir", dest="directory", default=None, help="directory for the members (default: temp)")
    p.add_argument("--keep", action="store_true", help="keep the members' files afterwards")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=cmd_bench_rocketmq)


def options_from_args(args) -> Options:
    phases = tuple(p.strip() for p in args.phases.split(",") if p.strip())
    unknown = [p for p in phases if p not in PHASES]
    if unknown or not phases:
        raise SystemExit(f"dledger bench rocketmq: error: unknown phase(s) {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(PHASES)}")
    return Options(size=args.size, duration=args.duration, warmup=max(args.warmup, 0.0), batch=args.batch,
                   batch_in_flight=args.batch_in_flight, in_flight=args.in_flight, queues=args.queues,
                   store=args.store, preset=args.preset, flush=args.flush, phases=phases,
                   directory=args.directory, keep=args.keep, json=args.json)


def cmd_bench_rocketmq(args) -> int:
    opts = options_from_args(args)
    return run_benchmark(lambda reactor, say: run(reactor, opts, say), format_results, as_json=opts.json)


# -- the load ----------------------------------------------------------------------------------------
_OPAQUE_MARK = 987654321  # a placeholder opaque, cut out of the encoded header to make a template
_FRAME_HEAD = struct.Struct(">iI")


class RawSends(protocol.Protocol):
    """The single-send load: pre-encoded SEND_MESSAGE_V2 frames over one connection, replies read for their code
    and queueOffset.

    Per send only the opaque changes (one template per queue: the header the
    plugin's client writes, born timestamp fixed when the phase starts); no
    header encoding, Deferred or timer per send, and no header decode per reply
    (code, opaque and queueOffset read by pattern).  The plain log's generator
    (:class:`dledger.bench.load.RawAppends`) works the same way, so the two
    benchmarks' rates compare the servers, not their clients' costs
    (the plugin's full client spent ~50 us of CPU per single send, on the
    same 2 cores as the members).
    """

    def __init__(self, producer_group: str, topic: str, body: bytes, properties: str, queues: int):
        self.buffer = bytearray()
        self.waiting: dict[int, Callable[[int | None, int], None]] = {}
        self.opaque = 0
        self.body = body
        born = str(int(time.time() * 1000))
        self.templates = []
        for q in range(queues):
            fields = {"a": producer_group, "b": topic, "c": "TBW102", "d": str(queues), "e": str(q), "f": "0",
                      "g": born, "h": "0", "i": properties, "j": "0", "k": "false", "m": "false"}
            head = Header(SEND_MESSAGE_V2, _OPAQUE_MARK, 0, "JAVA", VERSION, None, fields).to_json()
            before, after = head.split(b'"opaque":%d' % _OPAQUE_MARK)
            self.templates.append((before + b'"opaque":', after))

    def connectionMade(self):
        set_no_delay(self.transport)

    def send(self, queue_id: int, on_reply: Callable[[int | None, int], None]) -> None:
        """Send one message to ``queue_id``; ``on_reply(code, queue_offset)`` with the reply's code and queueOffset
        (-1 when it has none; code None: connection lost)."""
        self.opaque = opaque = self.opaque + 1
        before, after = self.templates[queue_id]
        head = b"%s%d%s" % (before, opaque, after)
        self.transport.write(_FRAME_HEAD.pack(4 + len(head) + len(self.body), len(head)) + head + self.body)
        self.waiting[opaque] = on_reply

    def dataReceived(self, data: bytes):
        """Replies read for their code, opaque and queueOffset only, by pattern over the JSON header (as the
        plain log's generator reads its replies): no header decode per reply.  A frame without a readable code or
        opaque (or a length out of range) closes the connection."""
        buf = self.buffer
        buf += data
        try:
            for head, head_end, _ in reply_frames(buf):
                code = _REPLY_CODE.match(buf, head, head_end)
                opaque = _REPLY_OPAQUE.search(buf, head, head_end)
                if code is None or opaque is None:
                    raise ValueError("a reply header without a code or an opaque")
                offset = _REPLY_QUEUE_OFFSET.search(buf, head, head_end)
                on_reply = self.waiting.pop(int(opaque[1]), None)
                if on_reply is not None:
                    on_reply(int(code[1]), int(offset[1]) if offset is not None else -1)
        except ValueError:
            self.transport.loseConnection()

    def connectionLost(self, reason=None):
        waiting, self.waiting = self.waiting, {}
        for on_reply in waiting.values():
            on_reply(None, -1)


#: A reply header's code (the first key of a compact, sorted JSON header: ``{"code":0,...``), opaque, queueOffset.
_REPLY_CODE = re.compile(rb'\{"code":(-?\d+)[,}]')
_REPLY_OPAQUE = re.compile(rb'"opaque":(-?\d+)')
_REPLY_QUEUE_OFFSET = re.compile(rb'"queueOffset":"(-?\d+)"')


class Phase:
    """One closed-loop phase: ``in_flight`` requests outstanding, each answered request replaced at once."""

    def __init__(self, reactor, client, opts: Options, *, batch: int, in_flight: int, raw: RawSends | None = None):
        self.reactor, self.client, self.opts = reactor, client, opts
        self.raw = raw  # single sends go through it when given
        self.batch, self.in_flight = batch, in_flight
        props = BATCH_PROPERTIES
        body = b"x" * opts.size
        self.batch_body = encode_batch([BatchItem(body, props.encode())] * batch) if batch > 1 else None
        self.body, self.props = body, props
        self.acked = 0
        self.errors: dict[str, int] = {}
        self.ends = [0] * opts.queues  # acknowledged queue offset + 1, per queue
        self.next_queue = 0
        self.stopping = False
        self.outstanding = 0
        self.done: Deferred | None = None

    def _one(self) -> None:
        if self.stopping:
            if self.outstanding == 0 and self.done is not None and not self.done.called:
                self.done.callback(None)
            return
        q = self.next_queue
        self.next_queue = (q + 1) % self.opts.queues
        self.outstanding += 1
        if self.raw is not None:
            self.raw.send(q, lambda code, offset: self._raw_answered(q, code, offset))
            return
        c = self.client
        if self.batch_body is not None:
            d = c.send_encoded_batch(TOPIC, self.batch_body, queue_id=q)
        else:
            d = c.send(TOPIC, self.body, tags="TagA", queue_id=q)

        def ok(result):
            self.acked += self.batch
            self.ends[q] = max(self.ends[q], result.queue_offset + self.batch)

        def failed(f):
            key = f"code {f.value.code}" if isinstance(f.value, RocketMQError) else f.getErrorMessage()
            self.errors[key] = self.errors.get(key, 0) + 1

        def next_(_):
            self.outstanding -= 1
            self._one()
        d.addCallbacks(ok, failed).addBoth(next_)

    def _raw_answered(self, q: int, code: int | None, queue_offset: int) -> None:
        if code is None:
            self.errors["connection lost"] = self.errors.get("connection lost", 0) + 1
        elif code != 0:
            key = f"code {code}"
            self.errors[key] = self.errors.get(key, 0) + 1
        else:
            self.acked += 1
            self.ends[q] = max(self.ends[q], queue_offset + 1)
        self.outstanding -= 1
        self._one()

    async def run(self, say, name: str, lag_probes: dict[str, Any],
                  cpu: Callable[[], dict[str, float]] = dict) -> dict:
        """Measure for ``opts.duration`` after the warm-up; ``cpu()``: CPU seconds so far of each member (and of
        this process, as ``client``: it shares the machine with the members)."""
        opts, reactor = self.opts, self.reactor
        for _ in range(self.in_flight):
            self._one()
        await deferLater(reactor, opts.warmup, lambda: None)
        start_acked, start, start_cpu = self.acked, reactor.seconds(), cpu()
        lag_max = dict.fromkeys(lag_probes, 0)
        tick = 0
        while reactor.seconds() - start < opts.duration:
            await deferLater(reactor, 0.5, lambda: None)
            tick += 1
            for mid, probe in lag_probes.items():
                held = sum([await probe.max_offset(TOPIC, q) for q in range(opts.queues)])
                lag_max[mid] = max(lag_max[mid], sum(self.ends) - held)
            if tick % 2 == 0:
                rate = (self.acked - start_acked) / (reactor.seconds() - start)
                say(f"{name}: {rate:,.0f} msg/s, dispatch lag {', '.join(f'{m} {v}' for m, v in lag_max.items())}")
        elapsed = reactor.seconds() - start
        measured = self.acked - start_acked
        used = {mid: seconds - start_cpu.get(mid, 0.0) for mid, seconds in cpu().items()}
        self.stopping = True
        self.done = Deferred()
        if self.outstanding == 0:
            self.done.callback(None)
        # Bounded: the client's requests time out by themselves, raw sends do not (a lost reply must not hang us).
        self.done.addTimeout(30, reactor, onTimeoutCancel=lambda *_: None)
        await self.done
        if self.outstanding:
            self.errors["unanswered"] = self.outstanding
        return {"msgs_per_s": round(measured / elapsed), "messages": measured, "seconds": round(elapsed, 2),
                "batch": self.batch, "in_flight": self.in_flight, "dispatch_lag_max_msgs": lag_max,
                "cpu_us_per_msg": {mid: round(s * 1e6 / measured, 1) for mid, s in used.items()} if measured else {},
                "errors": self.errors}


async def _drain(reactor, probes: dict[str, Any], ends: list[int], queues: int, limit: float = 60.0) -> float | None:
    """Seconds until every member's queues hold ``ends`` (None if not within ``limit``)."""
    start = reactor.seconds()
    while reactor.seconds() - start < limit:
        held = []
        for probe in probes.values():
            held.append(all([await probe.max_offset(TOPIC, q) >= ends[q] for q in range(queues)]))
        if all(held):
            return round(reactor.seconds() - start, 3)
        await deferLater(reactor, 0.01, lambda: None)
    return None


async def run(reactor: Any, opts: Options, say=progress) -> dict:
    """Run the selected phases; a dict of results (see :func:`format_results`)."""
    store = opts.store or durable_store() or "mmap"
    results: dict[str, Any] = {"settings": {"members": 3, "store": store, "flush": opts.flush, "preset": opts.preset,
                                            "size": opts.size, "queues": opts.queues, "phases": list(opts.phases),
                                            "python": sys.version.split()[0]}}
    if "dispatch" in opts.phases:
        from dledger_rocketmq.tools import bench_dispatch

        say("dispatch: in-process dispatcher, 200,000 records over the queues")
        r = bench_dispatch.run(200_000, opts.queues, 32, opts.size, bench_dispatch.DEFAULT_FILE_SIZE)
        results["dispatch"] = {"units_per_s": round(r["units"] / r["dispatch_s"]), "flush_s": round(r["flush_s"], 3)}
    load_phases = [p for p in opts.phases if p in ("batch", "single")]
    if not load_phases:
        return results
    base = Path(opts.directory) if opts.directory else Path(tempfile.mkdtemp(prefix="dledger-bench-rocketmq-"))
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    group = LocalGroup(base, n=3, store=store, preset=opts.preset, flush_policy=opts.flush, reactor=reactor,
                       member_args=broker_port_args(ports), options={"plugins.rocketmq.enabled": True})
    clients: list = []
    raw_connections: list = []
    try:
        say(f"starting 3 members with the broker plugin ({store}, flush {opts.flush}, preset {opts.preset}) in {base}")
        await group.start_and_wait(30)
        admin = group.client(request_timeout=0.5)
        try:
            master = await wait_for_master(group, admin, ports, topic=TOPIC, timeout=60, queues=opts.queues)
        finally:
            await admin.close()
        slave = next(mid for mid in group.ids if mid != master)
        results["master"] = master
        probes = {}
        for mid in group.ids:
            probes[mid] = await connect(reactor, "127.0.0.1", ports[mid], timeout=10)
            clients.append(probes[mid])
        load = await connect(reactor, "127.0.0.1", ports[master], timeout=10, producer_group="bench_pg",
                             default_topic_queue_nums=opts.queues)
        clients.append(load)
        for name in load_phases:
            batch, in_flight = (opts.batch, opts.batch_in_flight) if name == "batch" else (1, opts.in_flight)
            say(f"{name}: {batch} message(s) of {opts.size} B per request, {in_flight} in flight, "
                f"{opts.duration:g} s after {opts.warmup:g} s warm-up")
            raw = None
            if name == "single":
                raw = RawSends("bench_pg", TOPIC, b"x" * opts.size, BATCH_PROPERTIES, opts.queues)
                await connectProtocol(TCP4ClientEndpoint(reactor, "127.0.0.1", ports[master], timeout=10), raw)
                raw_connections.append(raw.transport)
            phase = Phase(reactor, load, opts, batch=batch, in_flight=in_flight, raw=raw)
            r = await phase.run(say, name, {master: probes[master], slave: probes[slave]},
                                lambda: {**{mid: group.cpu_seconds(mid) for mid in group.ids},
                                         "client": time.process_time()})
            r["drain_s"] = await _drain(reactor, probes, phase.ends, opts.queues)
            say(f"{name}: {r['msgs_per_s']:,} msg/s; every member dispatched all within {r['drain_s']} s")
            results[name] = r
        return results
    finally:
        for c in clients:
            c.close()
        for transport in raw_connections:
            transport.loseConnection()
        group.close()
        if not (opts.keep or opts.directory):
            shutil.rmtree(base, ignore_errors=True)


def format_results(r: dict) -> str:
    s = r["settings"]
    lines = [f"dledger bench rocketmq: 3 members ({s['store']}, flush {s['flush']}, preset {s['preset']}), "
             f"{s['size']} B messages over {s['queues']} queues, Python {s['python']}"]
    for name, label in (("batch", "batched sends"), ("single", "one message per send")):
        b = r.get(name)
        if not b:
            continue
        target = f"  (target >= {TARGET_BATCH:,})" if name == "batch" else ""
        lag = ", ".join(f"{m} {v}" for m, v in b["dispatch_lag_max_msgs"].items())
        lines.append(f"  {label:22} {b['msgs_per_s']:>9,} msg/s{target}; {b['batch']}/request, "
                     f"{b['in_flight']} in flight")
        lines.append(f"  {'':22} dispatch lag max {lag} msgs; all members dispatched {b['drain_s']} s after "
                     f"the last ack; errors {b['errors'] or 'none'}")
        if b.get("cpu_us_per_msg"):
            cpu = ", ".join(f"{m}{' (master)' if m == r.get('master') else ''} {v:g}"
                            for m, v in b["cpu_us_per_msg"].items())
            lines.append(f"  {'':22} CPU per message (us): {cpu}")
    if "dispatch" in r:
        d = r["dispatch"]
        lines.append(f"  {'dispatcher alone':22} {d['units_per_s']:>9,} units/s (flush {d['flush_s']} s)")
    return "\n".join(lines)
