"""``twistd dledger`` operator mistakes and log hygiene: one line and exit 1, endpoints checked before the store."""

import signal
import socket

import pytest
import pytest_twisted
from twisted.internet.error import CannotListenError
from twisted.logger import LogLevel, PredicateResult

from dledger import logfilter, tap
from dledger.errors import ConfigError, StoreError
from dledger.launcher import LocalGroup, durable_store

STORE = durable_store() or "memory"


class SomeStoreProblem(StoreError):
    """Stands for the StoreError subclasses other modules add (store in use, damaged store, lost currterm)."""


@pytest.mark.parametrize("exc, line", [
    (ConfigError("maxFrameSize: must be at least 65536 bytes"), "maxFrameSize: must be at least 65536 bytes"),
    (StoreError("dledger-n0/currterm: cannot read"), "dledger-n0/currterm: cannot read"),
    (SomeStoreProblem("store dir X is in use by pid 7"), "store dir X is in use by pid 7"),
    (CannotListenError("127.0.0.1", 20911, OSError(98, "Address already in use")),
     "cannot listen on 127.0.0.1:20911: port 20911 is already in use"),
    (tap.EndpointError("metrics", "tcp:9108", CannotListenError("", 9108, OSError(13, "Permission denied"))),
     "cannot listen on tcp:9108 (metrics): permission denied for port 9108"),
    (PermissionError(13, "Permission denied", "/var/lib/dledger/dledger-n0"),
     "Permission denied: /var/lib/dledger/dledger-n0"),
    (NotADirectoryError(20, "Not a directory", "/tmp/f/dledger-n0/lmdb"), "Not a directory: /tmp/f/dledger-n0/lmdb"),
    (ZeroDivisionError("a bug"), None),
    (KeyError("also a bug"), None),
])
def test_start_errors_an_operator_can_fix_are_one_line(exc, line):
    """Config, store (any StoreError subclass), endpoint and file errors give one line; anything else is a bug."""
    got = tap.start_error_line(exc)
    if line is None:
        assert got is None
    else:
        assert got is not None and got.startswith(line) and "\n" not in got


def test_store_dir_checks(tmp_path, monkeypatch):
    """A store dir that is a regular file, or under one, or not writable is refused before any file is opened."""
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(StoreError, match="is a regular file, not a directory"):
        tap.check_store_dir(afile)
    with pytest.raises(StoreError, match=f"cannot create store dir {afile}/dledger-n0: {afile} is a regular file"):
        tap.check_store_dir(afile / "dledger-n0")
    tap.check_store_dir(tmp_path / "new" / "dledger-n0")  # created later by the store
    assert not (tmp_path / "new").exists()
    monkeypatch.setattr(tap.os, "access", lambda path, mode: False)  # as a non-root user would see it
    with pytest.raises(StoreError, match="is not writable by this user"):
        tap.check_store_dir(tmp_path)
    with pytest.raises(StoreError, match=f"cannot create store dir {tmp_path}/x: {tmp_path} is not writable"):
        tap.check_store_dir(tmp_path / "x")


@pytest.mark.parametrize("level, event, shown", [
    (LogLevel.info, {"log_level": LogLevel.debug, "log_format": "n0: vote round term 3"}, False),
    (LogLevel.info, {"log_level": LogLevel.info, "log_format": "n0: now LEADER"}, True),
    (LogLevel.info, {"log_level": LogLevel.info, "log_format": "Starting factory {factory!r}"}, False),
    (LogLevel.info, {"log_level": LogLevel.info, "log_format": "Stopping factory {factory!r}"}, False),
    (LogLevel.debug, {"log_level": LogLevel.info, "log_format": "Starting factory {factory!r}"}, True),
    (LogLevel.debug, {"log_level": LogLevel.debug, "log_format": "n0: vote round term 3"}, True),
    (LogLevel.warn, {"log_level": LogLevel.info, "log_format": "n0: now LEADER"}, False),
    (LogLevel.warn, {"log_level": LogLevel.error, "log_format": "could not start"}, True),
])
def test_member_log_predicate(level, event, shown):
    """The member's log drops events below --log-level, and Twisted's factory chatter unless at debug."""
    result = logfilter.MemberLogPredicate(level)(event)
    assert (result is not PredicateResult.no) == shown


def test_log_level_option_is_checked():
    """--log-level accepts debug/info/warn/error and refuses anything else as a usage error."""
    from twisted.python import usage

    options = tap.Options()
    options.parseOptions(["--id", "n0", "--peers", "n0-127.0.0.1:20911", "--log-level", "debug"])
    assert options["log-level"] == "debug"
    with pytest.raises(usage.UsageError, match="--log-level: 'loud' is not one of debug, info, warn, error"):
        tap.Options().parseOptions(["--id", "n0", "--peers", "n0-127.0.0.1:20911", "--log-level", "loud"])


def _blocker(port):
    sock = socket.socket()
    sock.bind(("127.0.0.1", port))
    sock.listen(1)
    return sock


def _one_failure_line(group, mid):
    text = group.members[mid].log_path.read_text()
    assert "Traceback" not in text, text
    lines = [line for line in text.splitlines() if "could not start" in line]
    assert len(lines) == 1, text
    return lines[0]


@pytest.mark.process
@pytest_twisted.ensureDeferred
@pytest.mark.parametrize("which", ["member", "metrics"])
async def test_port_in_use_is_one_line_exit_1_and_the_store_is_untouched(tmp_path, reactor, which):
    """A member (or metrics) port in use: one line naming the port, exit 1, and the store dir never created."""
    group = LocalGroup(tmp_path, n=1, store=STORE, reactor=reactor, metrics=True)
    m = group.members["n0"]
    port = m.port if which == "member" else m.metrics_port
    blocker = _blocker(port)
    try:
        group.start()
        assert await group.wait_exit("n0", 30) == 1
        line = _one_failure_line(group, "n0")
        assert f"port {port} is already in use" in line
        assert ("(metrics)" in line) == (which == "metrics")
        assert not group.configs["n0"].member_dir.exists()
    finally:
        blocker.close()
        group.close()


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_store_dir_that_is_a_file_is_one_line_exit_1(tmp_path, reactor):
    """storeBaseDir naming a regular file: one line saying so, exit 1, and the file is left as it was."""
    afile = tmp_path / "not-a-dir"
    afile.write_text("precious")
    group = LocalGroup(tmp_path / "g", n=1, store=STORE, reactor=reactor, options={"storeBaseDir": str(afile)})
    try:
        group.start()
        assert await group.wait_exit("n0", 30) == 1
        assert f"{afile} is a regular file, not a directory" in _one_failure_line(group, "n0")
        assert afile.read_text() == "precious"
    finally:
        group.close()


@pytest.mark.process
@pytest_twisted.ensureDeferred
@pytest.mark.filterwarnings("ignore:Using readBody with a transport")
async def test_member_logs_have_no_factory_vote_round_or_scrape_lines(tmp_path, reactor):
    """Reconnects, elections and scrapes log no 'Starting factory', debug 'vote round' or access-log lines."""
    from twisted.web.client import Agent, readBody

    group = LocalGroup(tmp_path, n=3, store="memory", reactor=reactor, metrics=True)
    client = group.client()
    try:
        group.start()
        for mid in group.ids:
            await group.wait_ready(client, mid, 30)
        leader = (await group.wait_for_leader(client, 30)).leader_id
        follower = next(mid for mid in group.ids if mid != leader)
        group.signal(follower, signal.SIGTERM)  # the others lose it and reconnect when it is back
        assert await group.wait_exit(follower, 20) == 0
        group.start(follower)
        await group.wait_ready(client, follower, 30)
        await client.append(b"after the restart")
        for _ in range(3):
            resp = await Agent(reactor).request(b"GET", f"http://127.0.0.1:{group.members[leader].metrics_port}/"
                                                        f"metrics".encode())
            assert resp.code == 200 and b"dledger_up" in await readBody(resp)
        for mid in group.ids:
            assert group.log_lines(mid, "serving on")  # the logs are there
            for noise in ("Starting factory", "Stopping factory", "vote round", '"GET /metrics'):
                assert group.log_lines(mid, noise) == [], (mid, noise)
    finally:
        await client.close()
        group.close()
