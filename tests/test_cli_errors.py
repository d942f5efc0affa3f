"""Operator mistakes on the ``dledger`` command: one line, the right exit status, no traceback, nothing left behind."""

import io
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import pytest_twisted
from twisted.internet.defer import Deferred, succeed
from twisted.internet.task import Clock, deferLater

from dledger import cli
from dledger.cli import build_parser
from dledger.codes import ResponseCode
from dledger.commands import client as commands
from dledger.errors import DLedgerError
from dledger.launcher import child_env
from dledger.messages import MetadataResponse
from dledger.testing import wait_until

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden" / "java-dledger-0.3.2" / "frames"
#: Nobody listens on these (ports 1-3 are privileged and unused on a test machine).
DOWN = "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"
GROUP = ["--peers", DOWN, "--group", "g0"]


def dledger(*argv, stdin=b"", env=None, timeout=60):
    """Run ``python -m dledger.cli`` as an operator would; the CompletedProcess (text)."""
    return subprocess.run([sys.executable, "-m", "dledger.cli", *argv], input=stdin, capture_output=True,
                          env=env or child_env(), cwd=str(ROOT), timeout=timeout)


def one_line(stream: bytes) -> str:
    lines = stream.decode().strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stream.decode(), stream.decode()
    return lines[0]


@pytest.mark.parametrize("argv, message", [
    (["append", *GROUP, "--count", "0"], "argument --count: must be at least 1, got 0"),
    (["append", *GROUP, "--count", "-5"], "argument --count: must be at least 1, got -5"),
    (["append", *GROUP, "--body", "x", "--timeout", "-1"], "argument --timeout: must be more than 0, got -1"),
    (["append", *GROUP, "--body", "x", "--timeout", "nan"], "argument --timeout: expected a finite number"),
    (["append", *GROUP, "--count", "3", "--size", "-1"], "argument --size: must be 0 or more"),
    (["append", *GROUP, "--count", "3", "--batch", "0"], "argument --batch: must be at least 1"),
    (["get", *GROUP, "--index", "-1"], "argument --index: must be 0 or more, got -1"),
    (["get", *GROUP, "--index", "1", "--count", "0"], "argument --count: must be at least 1, got 0"),
    (["bench", "store", "--batch", "0"], "argument --batch: must be at least 1, got 0"),
    (["bench", "store", "--count", "0"], "argument --count: must be at least 1"),
    (["bench", "store", "--data-file-size", "-1"], "argument --data-file-size: must be at least 1"),
    (["bench", "cluster", "--duration", "0"], "argument --duration: must be more than 0"),
    (["bench", "cluster", "--in-flight", "0"], "argument --in-flight: must be at least 1"),
    (["store", "dump", "/x", "--from", "-2"], "argument --from: must be 0 or more"),
    (["demo", "--entries", "0"], "argument --entries: must be at least 1"),
])
def test_bad_numbers_are_usage_errors(capsys, argv, message):
    """Counts, sizes, batches, timeouts and indexes out of range are refused by argparse: exit 2 and the rule."""
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(argv)
    assert info.value.code == 2
    assert message in capsys.readouterr().err


def test_bench_cluster_refuses_unknown_presets(capsys):
    """bench cluster --presets with an unknown preset is a one-line usage error, not a failure mid-run."""
    assert cli.main(["bench", "cluster", "--presets", "fast,turbo"]) == 2
    assert "--presets: 'fast,turbo': expected default and/or fast" in capsys.readouterr().err


@pytest.mark.process
@pytest.mark.parametrize("argv, stdin, message", [
    (["append", *GROUP, "--file", "/nonexistent/blob"], b"", "dledger: error: --file /nonexistent/blob: No such file"),
    (["append", *GROUP], b"", "dledger: error: nothing to append: stdin was empty"),
    (["append", *GROUP, "--body", "x", "--timeout", "-1"], b"", "argument --timeout: must be more than 0"),
])
def test_append_mistakes_exit_2_with_one_line(argv, stdin, message):
    """An unreadable --file, an empty stdin and a negative --timeout exit 2 with one line and no traceback."""
    out = dledger(*argv, stdin=stdin)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr.decode().strip().splitlines()[-1]
    assert b"Traceback" not in out.stderr


@pytest.mark.process
def test_all_members_down_says_cannot_connect_to_any():
    """With no member listening, a command says 'cannot connect to any of' every member, at once, exit 1."""
    started = time.monotonic()
    out = dledger("append", *GROUP, "--body", "x")
    assert out.returncode == 1
    line = one_line(out.stderr)
    assert line.startswith("dledger: NETWORK_ERROR (302): cannot connect to any of n0 (127.0.0.1:1), "
                           "n1 (127.0.0.1:2), n2 (127.0.0.1:3)")
    assert time.monotonic() - started < 10


@pytest.mark.process
def test_errors_with_json_are_a_json_object():
    """With --json an error is one JSON object on stdout (code, number, message, status), nothing on stderr."""
    import json

    out = dledger("append", *GROUP, "--body", "x", "--json")
    assert out.returncode == 1 and out.stderr == b""
    obj = json.loads(one_line(out.stdout))
    assert obj["status"] == 1 and obj["error"]["code"] == "NETWORK_ERROR" and obj["error"]["number"] == 302
    assert obj["error"]["message"].startswith("cannot connect to any of n0")
    out = dledger("append", *GROUP, "--file", "/nonexistent/blob", "--json")
    assert out.returncode == 2
    expected = {"code": "USAGE", "number": None, "message": "--file /nonexistent/blob: No such file or directory"}
    assert json.loads(one_line(out.stdout))["error"] == expected


@pytest.mark.process
def test_closed_stdout_ends_quietly():
    """`dledger metadata | head -1`: the reader went away; the command ends with 141, no BrokenPipeError traceback."""
    p = subprocess.Popen([sys.executable, "-m", "dledger.cli", "metadata", *GROUP], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, env=child_env(), cwd=str(ROOT))
    p.stdout.close()  # like head after its lines
    _, err = p.communicate(timeout=60)
    assert p.returncode == 141, err
    assert b"Traceback" not in err and b"BrokenPipe" not in err


def test_bench_store_refuses_a_non_empty_directory(capsys, tmp_path):
    """bench store --dir on a non-empty directory is one line and exit 2 (was a ValueError traceback)."""
    (tmp_path / "precious").write_text("keep me")
    assert cli.main(["bench", "store", "--dir", str(tmp_path), "--count", "10", "--store", "memory"]) == 2
    err = capsys.readouterr().err
    assert f"dledger: error: --dir {tmp_path}: not empty" in err and len(err.strip().splitlines()) == 1
    assert (tmp_path / "precious").read_text() == "keep me"


@pytest.mark.process
@pytest.mark.parametrize("io_mode", ["inline", "thread"])
def test_bench_store_removes_its_temp_dir_on_sigterm(tmp_path, io_mode):
    """SIGTERM during bench store removes its temporary store directory and exits 143 (128 + SIGTERM)."""
    env = child_env()
    env["TMPDIR"] = str(tmp_path)
    p = subprocess.Popen([sys.executable, "-m", "dledger.cli", "bench", "store", "--store", "mmap", "--flush", "async",
                          "--io", io_mode, "--size", "16", "--count", "1000000000", "--data-file-size", str(1 << 20),
                          "--index-file-size", str(32 << 10)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         env=env, cwd=str(ROOT))
    try:
        def created():
            assert p.poll() is None, p.communicate()  # the benchmark died before creating its store
            return list(tmp_path.glob("dledger-bench-*/dledger-bench/*"))
        wait_until(created, 30, "the benchmark to create its store")
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 143, err
    assert list(tmp_path.glob("dledger-bench-*")) == []
    assert b"Traceback" not in err


@pytest_twisted.ensureDeferred
async def test_a_cancelled_threaded_store_bench_stops_its_flush_threads_before_removing_its_directory(tmp_path,
                                                                                                  monkeypatch):
    """What a signal does to `bench store --io thread` (the run cancelled mid-way): the store is shut down and its
    BlockingIO's threads stopped before the temporary directory is removed; a flush round still running on a
    worker would otherwise fail on deleted files (a traceback under load, seen in CI)."""
    from twisted.internet import reactor
    from twisted.internet.defer import CancelledError

    from dledger import diskio
    from dledger.bench import store as store_bench

    made, removed = [], []

    class SpyIO(diskio.BlockingIO):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    real_rmtree = store_bench.shutil.rmtree
    monkeypatch.setattr(store_bench.diskio, "BlockingIO", SpyIO)
    monkeypatch.setattr(store_bench.shutil, "rmtree",
                        lambda path, **kw: (removed.append([io.stopped for io in made]), real_rmtree(path, **kw)))
    monkeypatch.setattr(store_bench.tempfile, "tempdir", str(tmp_path))
    opts = store_bench.StoreBenchOptions(store="mmap", size=16, count=10**9, flush="async", io="thread",
                                         data_file_size=1 << 20, index_file_size=32 << 10, flush_interval_ms=1)
    d = Deferred.fromCoroutine(store_bench.run_threaded(reactor, opts))
    await deferLater(reactor, 0.3, lambda: None)
    d.cancel()
    with pytest.raises(CancelledError):
        await d
    assert made and removed == [[True] * len(made)], "the directory went only after the flush threads stopped"
    assert list(tmp_path.iterdir()) == []


@pytest_twisted.ensureDeferred
async def test_timeout_applies_per_request_not_to_the_whole_command():
    """A command whose requests each answer in time is not cut off by --timeout, however long it runs in total."""
    clock = Clock()
    args = build_parser().parse_args(["append", *GROUP, "--body", "x", "--timeout", "1"])

    async def long_action(client, args, out):
        for _ in range(30):  # thirty requests of 0.5 s each: 15 s in all
            await deferLater(clock, 0.5, lambda: None)
        print("done", file=out)
        return 0

    out, err = io.StringIO(), io.StringIO()
    d = Deferred.fromCoroutine(commands.run_command(clock, long_action, args, out, err))
    for _ in range(40):
        clock.advance(0.5)
    assert d.called
    assert (await d) == 0, err.getvalue()
    assert out.getvalue() == "done\n"


def test_help_says_timeout_is_per_request(capsys):
    """`dledger append --help` says that --timeout bounds each request, not the whole command."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["append", "--help"])
    assert "applies per request, not to the whole command" in " ".join(capsys.readouterr().out.split())


def test_oversized_body_names_max_entry_size():
    """An UNEXPECTED_ARGUMENT answer to an append of a big body says it is larger than maxEntrySize (N)."""
    args = build_parser().parse_args(["append", *GROUP, "--body", "x"])
    args.bodies, args.max_entry_size = [b"x" * (5 << 20)], None
    exc = DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "from n0 (attempt 1)")
    assert "largest body is 5242880 bytes: probably larger than maxEntrySize (4194304" in commands.explain(exc, args)
    args.max_entry_size = 1 << 20
    assert "a body of 5242880 bytes is larger than maxEntrySize (1048576)" in commands.explain(exc, args)


def _java_metadata(name):
    from dledger import messages
    from dledger.transport import remoting

    frame = remoting.decode_frame((GOLDEN / f"{name}.bin").read_bytes())
    return remoting.decode_response(frame, messages.MetadataResponse)


def test_metadata_of_a_java_member_does_not_crash():
    """A Java DLedger member sends no role or log range: metadata shows its role from leaderId, the range as unknown."""
    resp = _java_metadata("050000-metadata-from-follower-response")
    assert resp.role is None and resp.ledger_end_index is None
    assert commands.meta_text(resp, "n1").startswith("FOLLOWER  term -1  (no log range")
    assert commands.meta_text(resp, "n0").startswith("LEADER ")
    assert commands.meta_json(resp, "n1")["role"] == "FOLLOWER" and commands.meta_json(resp, "n1")["end"] is None


class _JavaMembers:
    """A transport whose members answer METADATA as Java DLedger does (leaderId, no role)."""

    members = {"n0": "127.0.0.1:1", "n1": "127.0.0.1:2", "n2": "127.0.0.1:3"}

    def send(self, mid, request, timeout=None):
        return succeed(MetadataResponse(group="g0", leader_id="n2", term=-1, peers=dict(self.members)))

    def close(self):
        return succeed(None)


@pytest_twisted.ensureDeferred
async def test_bench_and_client_find_a_java_leader_by_leader_id():
    """bench cluster --peers and the client find the leader of a Java group from leaderId (Java sends no role)."""
    from dledger.bench.cluster import Loader
    from dledger.client import DLedgerClient

    clock = Clock()
    loader = Loader(clock, DOWN, "g0", 8)
    loader.transport = _JavaMembers()
    d = Deferred.fromCoroutine(loader.find_leader(timeout=1.0))
    clock.advance(0.1)
    assert (await d) == "n2"
    client = DLedgerClient(_JavaMembers(), "g0", ["n0", "n1", "n2"], clock=clock)
    d = client.find_leader()
    clock.advance(1)
    assert (await d).leader_id == "n2" and client.leader == "n2"


@pytest.mark.parametrize("options, message", [
    ({"request_timeout": -1}, "request_timeout must be more than 0 seconds, got -1"),
    ({"request_timeout": 0}, "request_timeout must be more than 0 seconds, got 0"),
    ({"connect_timeout": -1}, "connect_timeout must be more than 0 seconds, got -1"),
    ({"max_attempts": 0}, "max_attempts must be at least 1, got 0"),
])
def test_client_library_refuses_bad_timeouts_up_front(options, message):
    """connect() refuses a timeout <= 0 or no attempts with a ValueError naming it (not a later AssertionError)."""
    from dledger.client import connect

    with pytest.raises(ValueError) as info:
        connect(DOWN, "g0", reactor=Clock(), **options)
    assert message in str(info.value)


def test_bench_store_signal_inside_a_flush_is_raised_between_batches(tmp_path, monkeypatch):
    """A SIGTERM arriving inside the inline benchmark's flush (a Deferred chain) still stops it with exit 143.

    The signal used to raise inside the flush's callbacks, which turned it into "flush failed: signal 15"
    and the benchmark went on (seen as a hang in CI).
    """
    from dledger.bench import store as store_bench
    from dledger.cli import Terminated

    real_make_store = store_bench.make_store

    def make_store(*a, **kw):
        store = real_make_store(*a, **kw)
        real_flush = store.flush

        def flush():
            os.kill(os.getpid(), signal.SIGTERM)  # delivered while the flush's Deferred chain runs
            return real_flush()
        store.flush = flush
        return store

    monkeypatch.setattr(store_bench, "make_store", make_store)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    opts = store_bench.StoreBenchOptions(store="mmap", size=16, count=10_000, batch=10, flush="sync", io="inline",
                                         data_file_size=1 << 20, index_file_size=32 << 10)
    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated):
        store_bench.run_inline(opts)
    assert signal.getsignal(signal.SIGTERM) == previous
    assert list(tmp_path.glob("dledger-bench-*")) == []
