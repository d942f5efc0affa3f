"""The broker port's per-send work without the log: ``python -m dledger_rocketmq.tools.bench_send [--calls N]``.

Times (min of 7 rounds of ``--calls`` calls, microseconds per call) the three
steps of a SEND_MESSAGE_V2 from a Java client that the broker layer does on
the master's reactor besides the put: the JSON header decoded
(:func:`~dledger_rocketmq.broker.port.decode_json_header`), the send header read by
the two handlers that look at it (the transaction check and the send), and
the reply frame of a successful send (``send_reply_frame_us``; ``send_ok_frame_us`` the same bytes as the
lean path of single sends builds them).  Run it with another tree first on
``PYTHONPATH`` to compare (docs/benchmarks.md, "Broker layer (perf-broker)"):
any tree that has this module (``dledger_rocketmq.tools``, from ``c695eab``
on) has ``Request.sending`` and ``CommitLog.gather`` too.

``--puts N`` adds the put path itself: a simulated 3-member broker group in
this process (``dledger.testing.Cluster``, mmap stores in a temporary
directory, virtual time), rounds of N single-message puts answered, put one
by one (``put_one_us``) and gathered as the port gathers the sends of one read
(``put_gathered_us``), alternating;
process CPU per put, the whole group's (leader, followers, simulated network).

``--handle`` times the port's own work for one producer frame
(``port_handle_us``): ``dataReceived`` of one SEND_MESSAGE_V2 frame on the
simulated master's port, its put answered at once (no log, no replication).

``--port N`` times whole sends on the same simulated group: rounds of N
SEND_MESSAGE_V2 frames (the stock producer's JSON header, 1 KiB bodies, 8
queues) handed to the master's broker port in one read, until every reply
is written (``port_send_us``: frame decode, send header, put, replication,
commit, consume-queue dispatch, reply; the whole group's process CPU per send),
and of it the master's handling of the read alone (``port_read_us``: the frames
decoded and checked, the records encoded and appended to the master's store in
the read's one append request; per send: the master's own per-send work, steadier
than the whole group's on a loaded machine).

``--batch N`` times SEND_BATCH_MESSAGE requests of N x 1 KiB (the stock
producer's batch header, no TAGS) on the same simulated group, 8 requests
a round, two ways, alternating: each request alone, answered before the
next is handed over (``batch_alone_us``: every request its own append,
push, commit, commit-feed delivery and consume-queue write, as a producer
with a few threads and small batches drives it, e.g. ``rocketmq-java``'s
batch32 from 4 threads), and the 8 handed over together (``batch_together_us``:
their rounds shared); the whole group's process CPU per message.  The
difference is what a request's rounds cost beyond its messages.
"""

from __future__ import annotations

import argparse
import struct
import tempfile
import time
import timeit
from contextlib import contextmanager

from dledger_rocketmq.broker.port import Request, decode_json_header, reply_frame, send_ok_frame, send_reply
from dledger_rocketmq.store.commitlog import PutResult, PutStatus

#: A SEND_MESSAGE_V2 header as the stock 4.9.8 producer writes it (13 extFields, all strings), to topic TOPIC.
JAVA_HEADER = (b'{"code":310,"extFields":{"a":"bench_java_pg","b":"BenchTopic","c":"TBW102","d":"8","e":"3","f":"0",'
               b'"g":"1764258000000","h":"0","i":"TAGS\\u0001TagA\\u0002UNIQ_KEY\\u00017F0000010000","j":"0",'
               b'"k":"false","m":"false","n":"RaftNode00"},"flag":0,"language":"JAVA","opaque":12345,'
               b'"serializeTypeCurrentRPC":"JSON","version":399}')
MSG_ID = "7F00000100002A9F0000000000000000"
TOPIC = "BenchTopic"


def run(calls: int = 20_000) -> dict[str, float]:
    header = decode_json_header(JAVA_HEADER)
    result = PutResult(PutStatus.PUT_OK, msg_id=MSG_ID, queue_id=3, queue_offset=12, msg_ids=(MSG_ID,), count=1)

    def send_header():
        req = Request(310, header.ext_fields)  # decoded once, read by the transaction check and the send
        return req.sending, req.sending

    def per_call(fn) -> float:
        return _per_call(fn, calls)
    return {"decode_json_header_us": per_call(lambda: decode_json_header(JAVA_HEADER)),
            "send_header_us": per_call(send_header),
            "send_reply_frame_us": per_call(lambda: reply_frame(header, send_reply(result))),
            "send_ok_frame_us": per_call(lambda: send_ok_frame(header, result))}


def _per_call(fn, calls: int) -> float:
    """Microseconds of process CPU per call, min of 7 rounds (CPU time: steadier than wall time on a shared
    machine, where another process's turn would count as this call's)."""
    timer = timeit.Timer(fn, timer=time.process_time)
    return round(min(timer.repeat(number=calls, repeat=7)) / calls * 1e6, 2)


@contextmanager
def simulated_master():
    """A simulated 3-member broker group in this process (virtual time, mmap stores in a temporary directory):
    ``(cluster, master broker)``; stopped on exit."""
    from dledger import plugins
    from dledger.testing import Cluster
    from dledger_rocketmq.broker.broker import Broker

    def broker_for(server):
        # The member's Broker among its plugin services (tools sit below the plugin module: no import of it).
        return next((s for s in server.services if isinstance(s, Broker)), None)

    with tempfile.TemporaryDirectory(prefix="bench-send-") as tmp:
        cluster = Cluster(3, seed=1, plugin_manager=plugins.make_plugin_manager(), store_base_dir=tmp,
                          extras={"rocketmq.enabled": True})
        cluster.start()
        try:
            found = []

            def master_found() -> bool:
                brokers = [broker_for(server) for server in cluster.servers.values()]
                found[:] = [b for b in brokers if b is not None and b.role == "MASTER"]
                return len(found) == 1
            if not cluster.run_until(master_found, 60):
                raise RuntimeError("no master in the simulated group")
            yield cluster, found[0]
        finally:
            cluster.stop()


def port_path(sends: int = 64, rounds: int = 40) -> dict[str, float]:
    """Process CPU per single send through the master's broker port (see the module's docstring)."""
    from twisted.internet.testing import StringTransport

    from dledger_rocketmq.broker.port import BrokerPort, BrokerPortProtocol
    from dledger_rocketmq.store.metadata import topic_config

    frames = b"".join(
        struct.pack(">iI", 4 + len(h) + 1024, len(h)) + h + bytes(1024)
        for h in (JAVA_HEADER.replace(b'"e":"3"', b'"e":"%d"' % (k % 8)).replace(b'"opaque":12345', b'"opaque":%d' % k)
                  for k in range(sends)))
    with simulated_master() as (cluster, broker):
        broker.create_topic(topic_config(TOPIC, 8, 8))
        if not cluster.run_until(lambda: broker.meta.topics.get(TOPIC) is not None, 30):
            raise RuntimeError("the bench topic was never created")
        port = BrokerPort(broker, "tcp:0")
        conn = BrokerPortProtocol(port)
        conn.makeConnection(StringTransport())
        answered = _count_answers(conn)

        def one_round() -> tuple[float, float]:
            answered.clear()
            conn.transport.clear()
            began = time.process_time()
            conn.dataReceived(frames)
            read = time.process_time() - began
            if not cluster.run_until(lambda: len(answered) == sends, 30):
                raise RuntimeError("sends never answered")
            spent = time.process_time() - began
            if any(answered):
                raise RuntimeError(f"a send failed: codes {sorted(set(answered))}")
            return spent, read
        one_round()  # warm-up
        totals = [one_round() for _ in range(rounds)]
    per_send = 1e6 / (rounds * sends)
    return {"port_send_us": round(sum(t for t, _ in totals) * per_send, 1),
            "port_read_us": round(sum(r for _, r in totals) * per_send, 2)}


def _count_answers(conn) -> list[int]:
    """The codes of the replies ``conn`` writes, one by one (``answer``) or together (``answer_frames``: the lean
    single sends, JSON replies whose header starts with ``{"code":N``)."""
    answered: list[int] = []
    real_answer, real_frames = conn.answer, conn.answer_frames

    def answer(request, reply) -> None:
        answered.append(reply.code)
        real_answer(request, reply)

    def answer_frames(frames) -> None:
        answered.extend(int(f[8:].split(b",", 1)[0].split(b":")[1]) for f in frames)
        real_frames(frames)
    conn.answer, conn.answer_frames = answer, answer_frames
    return answered


def port_handle(calls: int = 20_000) -> dict[str, float]:
    """The port's own work for one producer frame: ``dataReceived`` of one SEND_MESSAGE_V2 frame on the
    simulated master's port with the put answered at once (no log, no replication): frame split, header,
    send header, topic check, record, put answer, statistics, reply frame (``port_handle_us``, process CPU)."""
    from twisted.internet.defer import succeed
    from twisted.internet.testing import StringTransport

    from dledger_rocketmq.broker.port import BrokerPort, BrokerPortProtocol
    from dledger_rocketmq.store.metadata import topic_config

    frame = struct.pack(">iI", 4 + len(JAVA_HEADER) + 1024, len(JAVA_HEADER)) + JAVA_HEADER + bytes(1024)
    result = PutResult(PutStatus.PUT_OK, msg_id=MSG_ID, queue_id=3, queue_offset=12, msg_ids=(MSG_ID,), count=1)
    with simulated_master() as (cluster, broker):
        broker.create_topic(topic_config(TOPIC, 8, 8))
        if not cluster.run_until(lambda: broker.meta.topics.get(TOPIC) is not None, 30):
            raise RuntimeError("the bench topic was never created")
        broker.put_message = lambda record: succeed(result)

        def put_gathered(record, sink, token) -> bool:  # the lean path's put, answered at once
            sink.put_answered(token, result)
            sink.answers_done()
            return True
        broker.put_gathered = put_gathered
        conn = BrokerPortProtocol(BrokerPort(broker, "tcp:0"))
        conn.makeConnection(StringTransport())

        def one() -> None:
            conn.dataReceived(frame)
            conn.transport.clear()
        conn.dataReceived(frame)
        if b'"code":0' not in conn.transport.value():
            raise RuntimeError(f"the send was not answered SUCCESS: {conn.transport.value()[:200]!r}")
        conn.transport.clear()
        return {"port_handle_us": _per_call(one, calls)}


def batch_frames(size: int, requests: int = 8) -> list[bytes]:
    """``requests`` SEND_BATCH_MESSAGE frames of ``size`` 1 KiB messages each (queue 3, opaques 0..requests-1)."""
    from dledger_rocketmq.common.batch import BatchItem, encode_batch

    body = encode_batch([BatchItem(bytes(1024), b"UNIQ_KEY\x017F000001%014X\x02WAIT\x01true" % k, 0)
                         for k in range(size)])
    head = (JAVA_HEADER.replace(b'"code":310', b'"code":320').replace(b'"m":"false"', b'"m":"true"')
            .replace(b'"i":"TAGS\\u0001TagA\\u0002UNIQ_KEY\\u00017F0000010000"', b'"i":"WAIT\\u0001true"'))
    heads = [head.replace(b'"opaque":12345', b'"opaque":%d' % k) for k in range(requests)]
    return [struct.pack(">iI", 4 + len(h) + len(body), len(h)) + h + body for h in heads]


def batch_path(size: int = 32, rounds: int = 10) -> dict[str, float]:
    """Process CPU per batched message through the master's port, requests alone and together (module docstring)."""
    from twisted.internet.testing import StringTransport

    from dledger_rocketmq.broker.port import BrokerPort, BrokerPortProtocol
    from dledger_rocketmq.store.metadata import topic_config

    frames = batch_frames(size)
    with simulated_master() as (cluster, broker):
        broker.create_topic(topic_config(TOPIC, 8, 8))
        if not cluster.run_until(lambda: broker.meta.topics.get(TOPIC) is not None, 30):
            raise RuntimeError("the bench topic was never created")
        conn = BrokerPortProtocol(BrokerPort(broker, "tcp:0"))
        conn.makeConnection(StringTransport())
        answered = _count_answers(conn)

        def answered_up_to(n: int) -> None:
            if not cluster.run_until(lambda: len(answered) >= n, 30):
                raise RuntimeError("batch sends never answered")

        def one_round(alone: bool) -> float:
            answered.clear()
            conn.transport.clear()
            began = time.process_time()
            for k, frame in enumerate(frames):
                conn.dataReceived(frame)
                if alone:
                    answered_up_to(k + 1)
            answered_up_to(len(frames))
            spent = time.process_time() - began
            if any(answered):
                raise RuntimeError(f"a batch send failed: codes {sorted(set(answered))}")
            return spent
        one_round(True)  # warm-up
        totals = {"batch_alone_us": 0.0, "batch_together_us": 0.0}
        for _ in range(rounds):
            totals["batch_alone_us"] += one_round(True)
            totals["batch_together_us"] += one_round(False)
    return {k: round(v / (rounds * len(frames) * size) * 1e6, 1) for k, v in totals.items()}


def put_path(puts: int = 64, rounds: int = 40) -> dict[str, float]:
    """Process CPU per single put, one by one and gathered (see the module's docstring)."""
    from dledger_rocketmq.common.message import MessageRecord

    with simulated_master() as (cluster, broker):
        body = bytes(1024)

        def one_round(gathered: bool) -> float:
            out: list = []
            began = time.process_time()
            if gathered:
                broker.commitlog.gather()
            for k in range(puts):
                broker.put_message(MessageRecord(topic="BenchTopic", body=body, queue_id=k % 8,
                                                 born_timestamp=1)).addBoth(out.append)
            if gathered:
                broker.commitlog.flush_gathered()
            if not cluster.run_until(lambda: len(out) == puts, 30):
                raise RuntimeError("puts never answered")
            return time.process_time() - began
        one_round(False)  # warm-up
        totals = {"put_one_us": 0.0, "put_gathered_us": 0.0}
        for _ in range(rounds):
            totals["put_one_us"] += one_round(False)
            totals["put_gathered_us"] += one_round(True)
    return {k: round(v / (rounds * puts) * 1e6, 1) for k, v in totals.items()}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m dledger_rocketmq.tools.bench_send",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20_000, help="calls per round (default 20000)")
    p.add_argument("--puts", type=int, default=0,
                   help="also time the put path: rounds of this many single puts in a simulated group (0: not)")
    p.add_argument("--handle", action="store_true",
                   help="also time the port's own work for one frame, the put answered at once (port_handle_us)")
    p.add_argument("--put-rounds", type=int, default=40, help="rounds of --puts puts each way (default 40)")
    p.add_argument("--port", type=int, default=0,
                   help="also time whole sends through the master's broker port: rounds of this many SEND_MESSAGE_V2 "
                        "frames of 1 KiB in one read (0: not)")
    p.add_argument("--batch", type=int, default=0,
                   help="also time SEND_BATCH_MESSAGE requests of this many 1 KiB messages through the master's port, "
                        "alone and 8 together (batch_alone_us, batch_together_us; 0: not)")
    args = p.parse_args(argv)
    figures = run(max(1, args.calls))
    if args.handle:
        figures.update(port_handle(max(1, args.calls)))
    if args.puts > 0:
        figures.update(put_path(args.puts, max(1, args.put_rounds)))
    if args.port > 0:
        figures.update(port_path(args.port, max(1, args.put_rounds)))
    if args.batch > 0:
        figures.update(batch_path(args.batch, max(1, args.put_rounds)))
    print(", ".join(f"{k} {v}" for k, v in figures.items()))


if __name__ == "__main__":
    main()
