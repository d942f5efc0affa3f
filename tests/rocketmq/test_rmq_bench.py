"""``dledger bench rocketmq`` keeps working: a tiny run of its load phases (figures printed, never asserted)."""

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from dledger_rocketmq.tools.bench import BATCH_PROPERTIES, PHASES, TOPIC, Options, format_results, splitter_batch

from dledger.launcher import child_env, durable_store

ROOT = Path(__file__).resolve().parent.parent.parent


@pytest.mark.process
@pytest.mark.skipif(durable_store() is None, reason="no durable store (mmap or lmdb) is installed")
def test_quick_rocketmq_benchmark_reports_each_phase(tmp_path):
    """A short run starts a broker group, sends batched and single messages, and reports rates and dispatch lag."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "rocketmq", "--duration", "0.5",
                          "--warmup", "0", "--json", "--preset", "fast", "--dir", str(tmp_path)],
                         cwd=ROOT, env=child_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    for phase in ("batch", "single"):
        r = result[phase]
        assert r["msgs_per_s"] > 0 and r["errors"] == {}, r
        assert set(r["dispatch_lag_max_msgs"]) <= {"n0", "n1", "n2"} and len(r["dispatch_lag_max_msgs"]) == 2
        assert r["drain_s"] is not None
        cpu = r["cpu_us_per_msg"]  # every member's CPU per message: the master's work is the largest share
        assert set(cpu) == {"n0", "n1", "n2", "client"} and all(v >= 0 for v in cpu.values())
        assert cpu[result["master"]] == max(v for m, v in cpu.items() if m != "client") > 0
    assert result["batch"]["batch"] == splitter_batch(1024, TOPIC, BATCH_PROPERTIES) and result["single"]["batch"] == 1
    assert ".. batch:" in out.stderr  # progress lines while it runs
    assert "msg/s" in format_results(result)


def test_unknown_phase_is_refused():
    """Asking for a phase that does not exist fails with one line listing the known phases."""
    out = subprocess.run([sys.executable, "-m", "dledger.cli", "bench", "rocketmq", "--phases", "warp"], cwd=ROOT,
                         env=child_env(), capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "unknown phase(s) warp" in out.stderr and all(p in out.stderr for p in PHASES)
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("size, topic, properties, expected", [
    (1024, "BenchTopic", "TAGS\x01TagA", 1_000_000 // (1024 + 10 + 8 + 20)),  # 941: the benchmark's default
    (1024, "T", "", 1_000_000 // (1024 + 1 + 20)),                              # no properties
    (100, "T", "TAGS\x01a\x02KEYS\x01k1 k2", 1_000_000 // (100 + 1 + 5 + 9 + 20)),  # every key and value counted
    (1_000_000, "T", "", 1),                                                    # one message over the limit: alone
    (999_979, "T", "", 1),                                                      # exactly the limit: one
])
def test_splitter_batch_counts_as_rocketmqs_example_splitter(size, topic, properties, expected):
    """The default batch is what RocketMQ's example ListSplitter puts in one list: topic + body + properties + 20."""
    assert splitter_batch(size, topic, properties) == expected


def test_default_batch_follows_the_message_size():
    """Without --batch the benchmark sends splitter-sized batches of its own message size; --batch overrides."""
    assert Options().batch == splitter_batch(1024, TOPIC, BATCH_PROPERTIES) == 941
    assert Options(size=4096).batch == splitter_batch(4096, TOPIC, BATCH_PROPERTIES) < 941
    assert Options(batch=64).batch == 64


def test_raw_sends_write_send_message_v2_frames_and_route_replies_by_opaque():
    """The single-send load generator's pre-encoded frames decode as the broker port reads them (topic, queue,
    body, a fresh opaque each); replies reach their sender by opaque, a lost connection answers the rest None."""
    from dledger_rocketmq.broker.port import SEND_MESSAGE_V2, decode_header, reply_frame, send_args, send_reply
    from dledger_rocketmq.store.commitlog import PutResult, PutStatus
    from dledger_rocketmq.tools.bench import RawSends
    from twisted.internet.testing import StringTransport

    from dledger.transport.remoting import FrameSplitter, Header

    raw = RawSends("pg", TOPIC, b"body", BATCH_PROPERTIES, 8)
    raw.makeConnection(StringTransport())
    got = []
    raw.send(3, lambda code, offset: got.append(("a", code, offset)))
    raw.send(5, lambda code, offset: got.append(("b", code, offset)))
    raw.send(6, lambda code, offset: got.append(("c", code, offset)))
    frames = list(FrameSplitter(header_decoder=decode_header).feed(raw.transport.value()))
    assert [f.header.opaque for f in frames] == [1, 2, 3] and all(f.body == b"body" for f in frames)
    assert {f.header.code for f in frames} == {SEND_MESSAGE_V2} and not any(f.header.is_response for f in frames)
    args = [send_args(f.header.code, f.header.ext_fields) for f in frames]
    assert [(a.topic, a.queue_id, a.properties, a.producer_group) for a in args] == [
        (TOPIC, 3, BATCH_PROPERTIES, "pg"), (TOPIC, 5, BATCH_PROPERTIES, "pg"), (TOPIC, 6, BATCH_PROPERTIES, "pg")]
    # The port's replies as it writes them (the template and the general encoding), split across reads.
    ok = reply_frame(Header(SEND_MESSAGE_V2, 2), send_reply(PutResult(PutStatus.PUT_OK, msg_id="AB", queue_id=5,
                                                                     queue_offset=7, msg_ids=("AB",), count=1)))
    busy = reply_frame(Header(SEND_MESSAGE_V2, 3), send_reply(PutResult(PutStatus.OS_PAGECACHE_BUSY)))
    data = ok + busy
    raw.dataReceived(data[:5])
    raw.dataReceived(data[5:len(ok) + 9])
    assert got == [("b", 0, 7)]
    raw.dataReceived(data[len(ok) + 9:])
    assert got == [("b", 0, 7), ("c", 2, -1)] and raw.buffer == b""
    raw.connectionLost()
    assert got[-1] == ("a", None, -1) and raw.waiting == {}


def test_raw_sends_close_on_a_reply_they_cannot_read():
    """A reply frame without a readable code or opaque closes the generator's connection (nothing answered)."""
    from dledger_rocketmq.tools.bench import RawSends
    from twisted.internet.testing import StringTransport

    raw = RawSends("pg", TOPIC, b"body", BATCH_PROPERTIES, 8)
    raw.makeConnection(StringTransport())
    got = []
    raw.send(0, lambda code, offset: got.append(code))
    head = b'{"flag":1,"opaque":1}'
    raw.dataReceived(struct.pack(">iI", 4 + len(head), len(head)) + head)
    assert raw.transport.disconnecting and got == []
