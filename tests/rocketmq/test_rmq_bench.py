"""``dledger bench rocketmq`` keeps working: a tiny run of its load phases (figures printed, never asserted)."""

import json
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
    from dledger_rocketmq.broker.port import SEND_MESSAGE_V2, decode_header, encode_command, send_args
    from dledger_rocketmq.tools.bench import RawSends
    from twisted.internet.testing import StringTransport

    from dledger.transport.remoting import FrameSplitter, Header

    raw = RawSends("pg", TOPIC, b"body", BATCH_PROPERTIES, 8)
    raw.makeConnection(StringTransport())
    got = []
    raw.send(3, lambda h: got.append(("a", h)))
    raw.send(5, lambda h: got.append(("b", h)))
    frames = list(FrameSplitter(header_decoder=decode_header).feed(raw.transport.value()))
    assert [f.header.opaque for f in frames] == [1, 2] and all(f.body == b"body" for f in frames)
    assert {f.header.code for f in frames} == {SEND_MESSAGE_V2} and not any(f.header.is_response for f in frames)
    args = [send_args(f.header.code, f.header.ext_fields) for f in frames]
    assert [(a.topic, a.queue_id, a.properties, a.producer_group) for a in args] == [
        (TOPIC, 3, BATCH_PROPERTIES, "pg"), (TOPIC, 5, BATCH_PROPERTIES, "pg")]
    raw.dataReceived(encode_command(Header(0, 2, 1, "JAVA", 409, None, {"queueOffset": "7"})))
    assert [(k, h.ext_fields["queueOffset"]) for k, h in got] == [("b", "7")]
    raw.connectionLost()
    assert got[-1] == ("a", None) and raw.waiting == {}
