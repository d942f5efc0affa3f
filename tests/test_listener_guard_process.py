"""Issue #21 item 4 against a live ``twistd dledger`` member with every port: the member port, the RocketMQ
broker port and name server of the plugin, and the metrics port, all behind one connection guard.

Before: each side port accepted 2,000 idle connections; under ``ulimit -n 200`` 260 idle connections to the
metrics port made the member log ``checkpoint write failed`` with a traceback twice a second; a metrics POST
with ``Content-Length: 99999999999`` filled a 200 MB temporary file; 2,000 bad frames to the broker port gave
2,024 log lines (1,000 to the name server 1,004); a slow-loris connection stayed open 120 s on every port.
"""

import socket
import struct
import sys
import time

import pytest
import pytest_twisted
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from dledger import plugins
from dledger.launcher import LocalGroup, durable_store, free_ports

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed"),
              pytest.mark.skipif("rocketmq.enabled" not in plugins.options_help(),
                                 reason="the RocketMQ broker plugin is not installed")]
#: requestReadTimeoutMs's default: a slow sender must be gone this long after its first byte (plus slack).
READ_TIMEOUT = 10.0


def member_with_every_port(base, reactor, python=sys.executable, options=None):
    broker, namesrv = free_ports(2)
    args = ["--plugin-opt", "rocketmq.enabled=true",
            "--plugin-opt", f"rocketmq.listen=tcp:{broker}:interface=127.0.0.1",
            "--plugin-opt", f"rocketmq.storeHost=127.0.0.1:{broker}",
            "--plugin-opt", f"rocketmq.namesrvListen=tcp:{namesrv}:interface=127.0.0.1"]
    group = LocalGroup(base, n=1, store=STORE, preset="fast", metrics=True, reactor=reactor, python=python,
                       member_args={"n0": args}, options=options)
    m = group.members["n0"]
    ports = {"member port": m.port, "broker port": broker, "name server": namesrv, "metrics port": m.metrics_port}
    return group, ports


async def ready(group, ports, timeout=30):
    await group.start_and_wait(timeout)

    def all_listening():
        for p in ports.values():
            try:
                socket.create_connection(("127.0.0.1", p), timeout=1).close()
            except OSError:
                return False
        return True

    await group.wait_for(all_listening, timeout, "every port to listen")


def closed(sock):
    try:
        return sock.recv(65536) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def post_huge_body(port):
    """A metrics POST announcing 99,999,999,999 bytes: the status line of the answer, and how long it took."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n" + b"x" * 4096)
        s.settimeout(10)
        try:
            return s.recv(4096).split(b"\r\n", 1)[0]
        except OSError as exc:
            return repr(exc).encode()


def bad_frames(port, n):
    """``n`` connections each sending a frame whose length field is below the minimum (a FrameLengthError)."""
    for _ in range(n):
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
                s.sendall(b"\x00\x00\x00\x01abcd")
                s.settimeout(5)
                try:
                    s.recv(16)
                except OSError:
                    pass
        except OSError:
            pass


@pytest_twisted.ensureDeferred
async def test_hostile_input_on_every_port(tmp_path, reactor):
    """Slow loris closed within seconds on each port; a huge HTTP body refused at once; bad frames are few lines."""
    group, ports = member_with_every_port(tmp_path, reactor)
    lorises = {}
    try:
        await ready(group, ports)
        start = reactor.seconds()
        for name, p in ports.items():
            s = socket.create_connection(("127.0.0.1", p), timeout=2)
            s.setblocking(False)
            lorises[name] = s
        # A well-formed start of a 1,004-byte remoting frame (and of an HTTP request), one byte each 0.5 s.
        trickle = {name: struct.pack(">II", 1000, 2) + b"{}" + b"x" * 100 for name in ports}
        trickle["metrics port"] = b"GET /metrics HTTP/1.1\r\n" + b"X-Slow: " + b"y" * 100
        gone, sent = {}, 0
        while len(gone) < len(lorises) and reactor.seconds() - start < READ_TIMEOUT + 20:
            for name, s in lorises.items():
                if name in gone:
                    continue
                if closed(s):
                    gone[name] = reactor.seconds() - start
                    continue
                try:
                    s.send(trickle[name][sent:sent + 1])
                except OSError:
                    gone[name] = reactor.seconds() - start
            sent += 1
            await deferLater(reactor, 0.5, lambda: None)
        assert set(gone) == set(ports), f"still open after {reactor.seconds() - start:.0f}s: {set(ports) - set(gone)}"
        assert all(t < READ_TIMEOUT + 5 for t in gone.values()), gone  # seconds, not the 120 s idle timeout
        slow = group.log_lines("n0", "requestReadTimeoutMs")
        assert len(slow) >= 3, slow  # side ports: "not complete ... after its first byte" (the member port too)

        t0 = time.monotonic()
        status = await deferToThread(post_huge_body, ports["metrics port"])
        assert status.startswith(b"HTTP/1.1 413"), status
        assert time.monotonic() - t0 < 5

        await deferToThread(bad_frames, ports["broker port"], 2000)
        await deferToThread(bad_frames, ports["name server"], 1000)
        text = group.members["n0"].log_path.read_text(encoding="utf-8", errors="replace")
        broker_lines = [x for x in text.splitlines() if "broker port" in x and "closing connection" in x]
        namesrv_lines = [x for x in text.splitlines() if "name server" in x and "closing connection" in x]
        assert 1 <= len(broker_lines) <= 5, broker_lines  # rate-limited per address, not 2,024
        assert 1 <= len(namesrv_lines) <= 5, namesrv_lines
        assert len(text.splitlines()) < 200, len(text.splitlines())
        assert await group.stop_all() == {"n0": 0}
        assert "Traceback" not in group.members["n0"].log_path.read_text(errors="replace")
    finally:
        for s in lorises.values():
            s.close()
        group.close()


@pytest_twisted.ensureDeferred
async def test_every_port_flooded_at_once_under_a_low_fd_limit(tmp_path, reactor):
    """``ulimit -n 200`` and 150 idle connections to each of the four ports at once: connections beyond the shared
    descriptor budget are refused with a few lines, store files keep rolling and checkpoints keep being written,
    appends commit, nothing logs a traceback; once the flood ends every port serves again."""
    wrapper = tmp_path / "python-ulimit"
    wrapper.write_text(f'#!/bin/sh\nulimit -n 200 || exit 99\nexec "{sys.executable}" "$@"\n', encoding="utf-8")
    wrapper.chmod(0o755)
    group, ports = member_with_every_port(tmp_path / "g", reactor, python=str(wrapper),
                                          options={"mappedFileSizeForEntryData": 1 << 20,
                                                   "checkPointInterval": 200})
    admin = group.client(request_timeout=2.0)
    flood = []
    try:
        await ready(group, ports)
        await admin.append(b"before the flood")  # the client's connection exists before the flood
        for _ in range(150):
            for p in ports.values():  # every port at once, interleaved
                s = socket.socket()
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", p))
                flood.append(s)
        log_path = group.members["n0"].log_path

        def flooded():  # refused beyond the budget -- or, without a budget, out of descriptors
            text = log_path.read_text(encoding="utf-8", errors="replace")
            return any(x in text for x in ("refusing a connection", "EMFILE", "checkpoint write failed"))

        await group.wait_for(flooded, 20, "the member to refuse connections beyond its budget")
        body = b"x" * 4096
        for i in range(400):  # 1.6 MiB: the data file (1 MiB) rolls under the flood
            await admin.append(body + str(i).encode())
        meta = await group.metadata(admin, "n0", timeout=2)
        assert meta is not None and meta.committed_index == meta.ledger_end_index >= 400
        data_files = list((group.configs["n0"].member_dir / "data").iterdir())
        assert len(data_files) >= 2, data_files
        for s in flood:
            s.close()
        flood.clear()

        def serves_again():
            try:
                for p in ports.values():
                    socket.create_connection(("127.0.0.1", p), timeout=1).close()
                return True
            except OSError:
                return False

        await group.wait_for(serves_again, 20, "every port to accept again")
        await admin.append(b"after the flood")
        await admin.close()
        assert await group.stop_all() == {"n0": 0}
        text = log_path.read_text(encoding="utf-8", errors="replace")
        assert "Traceback" not in text
        assert "checkpoint write failed" not in text and "Too many open files" not in text, text[-3000:]
        assert "accepting at most" in text  # the budget across all ports is announced once
        assert all(f"{name}: refusing a connection" in text for name in ports), text[-3000:]
        refusals = [x for x in text.splitlines() if "refusing a connection" in x]
        assert 4 <= len(refusals) <= 16, refusals  # about one per port per 10 s, not one per connection
        assert len(text.splitlines()) < 200
    finally:
        for s in flood:
            s.close()
        await admin.close()
        group.close()
