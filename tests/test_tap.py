"""``twistd dledger``: option parsing and validation, the service tree, and a real twistd process."""

import signal
import subprocess
import sys
from pathlib import Path

import pytest
import pytest_twisted
from twisted.application.service import IServiceCollection, MultiService
from twisted.python import usage

from dledger import tap
from dledger.launcher import TWISTD, LocalGroup, child_env, free_ports

ROOT = Path(__file__).resolve().parent.parent
PEERS = "n0-127.0.0.1:20911;n1-127.0.0.1:20912;n2-127.0.0.1:20913"


def parse(*argv):
    options = tap.Options()
    options.parseOptions(list(argv))
    return options


def test_command_line_builds_the_config():
    """Each option lands in the member's config, and the preset sets the timers."""
    o = parse("--group", "g1", "--id", "n1", "--peers", PEERS, "--store", "memory", "--store-dir", "/tmp/x",
              "--preset", "fast", "--flush-policy", "async", "--listen", "tcp:0:interface=127.0.0.1")
    c = o.config
    assert (c.group, c.self_id, c.peers, c.store_type, c.store_base_dir) == ("g1", "n1", PEERS, "memory", "/tmp/x")
    assert (c.flush_policy, c.listen, c.heart_beat_time_interval_ms) == ("async", "tcp:0:interface=127.0.0.1", 100)


def test_command_line_overrides_the_config_file(tmp_path):
    """--config is read first; options given on the command line win over it."""
    f = tmp_path / "m.toml"
    f.write_text(f'preset = "fast"\ngroup = "fromfile"\nselfId = "n0"\npeers = "{PEERS}"\nmaxWaitAckTimeMs = 777\n')
    c = parse("--config", str(f), "--id", "n2").config
    assert (c.group, c.self_id, c.max_wait_ack_time_ms, c.heart_beat_time_interval_ms) == ("fromfile", "n2", 777, 100)


@pytest.mark.parametrize("argv, message", [
    (["--id", "n9", "--peers", PEERS], "selfId: 'n9' is not one of the peers"),
    (["--peers", "n0-127.0.0.1"], "has no ':port'"),
    (["--peers", PEERS, "--store", "nosuch"], "--store: 'nosuch' is not an installed store type"),
    (["--peers", PEERS, "--preset", "turbo"], "--preset: 'turbo' is not one of default, fast"),
    (["--peers", PEERS, "--flush-policy", "never"], "--flush-policy: 'never' is not one of sync, async"),
    (["--peers", PEERS, "--metrics", "tcp:notaport"], "--metrics: bad endpoint"),
    (["--peers", PEERS, "--listen", "bogus:1"], "--listen: bad endpoint"),
    (["--peers", PEERS, "--plugin-opt", "novalue"], "--plugin-opt: expected name=value"),
    (["--peers", PEERS, "--plugin-opt", "nosuch=1"], "plugins.nosuch: no installed plugin declares this option"),
    (["--config", "/nonexistent/dledger.toml"], "does not exist"),
    (["--peers", PEERS, "--snapshot-threshold", "lots"], "--snapshot-threshold: expected a whole number"),
])
def test_bad_options_are_usage_errors_naming_the_problem(argv, message):
    """Every bad option becomes a UsageError (twistd prints usage and exits non-zero) that says what is wrong."""
    with pytest.raises(usage.UsageError) as info:
        parse(*(argv if "--id" in argv else ["--id", "n0", *argv]))
    assert message in str(info.value)


def test_plugin_opts_are_collected():
    """--plugin-opt may be repeated; each name=value is recorded (checked against plugin declarations)."""
    o = tap.Options()
    o.opt_plugin_opt("a=1")
    o.opt_plugin_opt("b = x=y")
    assert o["plugin_opts"] == {"a": "1", "b": "x=y"}


def test_make_service_is_a_multiservice_with_the_member():
    """makeService returns a MultiService holding the member service (and nothing is started yet)."""
    svc = tap.makeService(parse("--id", "n0", "--peers", PEERS))
    assert isinstance(svc, MultiService) and IServiceCollection.providedBy(svc)
    member = svc.getServiceNamed("dledger-member")
    assert isinstance(member, tap.MemberService) and member.server is None and not member.running
    with pytest.raises(KeyError):
        svc.getServiceNamed("dledger-metrics")


def test_make_service_adds_metrics_when_asked():
    """--metrics adds the metrics service, started before the member so the summary can name its address."""
    svc = tap.makeService(parse("--id", "n0", "--peers", PEERS, "--metrics", "tcp:0:interface=127.0.0.1"))
    names = [s.name for s in svc]
    assert names == ["dledger-metrics", "dledger-member"]
    assert svc.getServiceNamed("dledger-member").metrics is svc.getServiceNamed("dledger-metrics")


def test_preset_label_names_the_timers():
    """The summary says which preset the effective timers match, or 'custom'."""
    assert tap.preset_label(parse("--id", "n0", "--peers", PEERS, "--preset", "fast").config).startswith("fast (")
    assert tap.preset_label(parse("--id", "n0", "--peers", PEERS).config).startswith("default (heartbeat 2000 ms")
    custom = parse("--id", "n0", "--peers", PEERS).config.replace(heart_beat_time_interval_ms=500)
    assert tap.preset_label(custom).startswith("custom")


# -- real twistd processes ------------------------------------------------------------------------
def twistd(*argv, timeout=60):
    return subprocess.run([sys.executable, "-c", TWISTD, *argv], cwd=ROOT, env=child_env(), capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.process
def test_twistd_help_lists_the_dledger_plugin_and_its_options():
    """`twistd --help` lists dledger, and `twistd dledger --help` shows the member's options."""
    out = twistd("--help")
    assert out.returncode == 0 and "dledger" in out.stdout, out.stderr
    out = twistd("dledger", "--help")
    assert out.returncode == 0, out.stderr
    for option in ("--config", "--group", "--id", "--peers", "--store", "--store-dir", "--preset", "--flush-policy",
                   "--listen", "--metrics", "--plugin-opt"):
        assert option in out.stdout


@pytest.mark.process
def test_twistd_refuses_bad_options_with_usage_and_non_zero_status():
    """A bad option makes twistd print the problem with the usage text and exit non-zero."""
    out = twistd("-n", "--pidfile=", "dledger", "--id", "n9", "--peers", PEERS)
    assert out.returncode != 0
    assert "selfId: 'n9' is not one of the peers" in out.stderr + out.stdout
    assert "--peers" in out.stdout + out.stderr


@pytest.mark.process
@pytest_twisted.ensureDeferred
@pytest.mark.filterwarnings("ignore:Using readBody with a transport")
async def test_twistd_member_prints_its_summary_serves_metrics_and_exits_0_on_sigterm(tmp_path, reactor):
    """A twistd member logs one summary line once serving, serves metrics, and exits 0 on SIGTERM."""
    from twisted.web.client import Agent, readBody

    group = LocalGroup(tmp_path, n=1, store="memory", reactor=reactor, metrics=True)
    client = group.client()
    try:
        group.start()
        await group.wait_ready(client, "n0", 20)
        await group.wait_for(lambda: group.log_lines("n0", "dledger member "), 10, "the summary line")
        [line] = group.log_lines("n0", "dledger member ")
        port = group.members["n0"].port
        metrics = f"http://127.0.0.1:{group.members['n0'].metrics_port}/metrics"
        for part in (f"dledger member n0 of group g0 serving on 127.0.0.1:{port}", f"peers {group.peers}",
                     "store memory", "preset fast (heartbeat 100 ms", f"metrics {metrics}"):
            assert part in line
        await group.wait_for_leader(client, 10)
        await client.append(b"counted")
        resp = await Agent(reactor).request(b"GET", metrics.encode())
        text = (await readBody(resp)).decode()
        assert resp.code == 200
        assert 'dledger_role{group="g0",role="LEADER",self_id="n0"} 1.0' in text
        assert 'dledger_append_entry_latency_count{group="g0",self_id="n0"} 1.0' in text
        group.signal("n0", signal.SIGTERM)
        assert await group.wait_exit("n0", 20) == 0
        assert group.log_lines("n0", "stopped cleanly")
    finally:
        await client.close()
        group.close()


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_twistd_member_that_cannot_listen_exits_1(tmp_path, reactor):
    """A member whose port is taken logs why and exits with status 1 instead of lingering."""
    import socket

    group = LocalGroup(tmp_path, n=1, store="memory", reactor=reactor)
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", group.members["n0"].port))
    blocker.listen(1)
    try:
        group.start()
        assert await group.wait_exit("n0", 20) == 1
        assert group.log_lines("n0", "could not start")
    finally:
        blocker.close()
        group.close()


@pytest.mark.network
@pytest_twisted.ensureDeferred
async def test_member_service_gives_a_durable_store_a_threaded_blocking_io(tmp_path, reactor):
    """The member service builds its store with the reactor's thread pool for fsyncs when the store takes one."""
    from dledger.launcher import durable_store
    from dledger.transport.outbox import send_written

    store = durable_store()
    if store is None:
        pytest.skip("no durable store installed")
    [port] = free_ports(1)
    options = parse("--id", "n0", "--peers", f"n0-127.0.0.1:{port}", "--store", store, "--store-dir", str(tmp_path),
                    "--preset", "fast")
    member = tap.MemberService(options.config, reactor)
    member.startService()
    try:
        await member.ready
        assert member.server.running and member.server.store.io.threaded
        # a flush's results send what their callbacks wrote at once (dledger.transport.outbox)
        assert member.server.blocking_io.after_results is send_written
        assert "dledger member n0 of group default serving on 127.0.0.1:" in member.summary()
        assert f"store {store} in {tmp_path}/dledger-n0 (flush sync)" in member.summary()
    finally:
        await member.stopService()
        member.forget_exit_status()
    assert member.stopped_cleanly and not member.server.running
    assert member.server.blocking_io.stopped  # its worker threads exited with the member


def test_free_ports_are_distinct():
    """free_ports hands out distinct ports."""
    ports = free_ports(8)
    assert len(set(ports)) == 8


def test_member_process_tunes_the_garbage_collector(monkeypatch):
    """tune_gc freezes what start-up allocated and makes the cyclic collector run rarely."""
    import gc

    from dledger import tap

    calls = []
    monkeypatch.setattr(gc, "freeze", lambda: calls.append("freeze"))
    monkeypatch.setattr(gc, "set_threshold", lambda *t: calls.append(t))
    tap.tune_gc()
    assert calls == ["freeze", (50_000, 20, 100)]


def test_switch_interval_option_defaults_to_pythons_own(tmp_path):
    """switchIntervalMs (config file) sets the member's GIL switch interval; 5 ms (Python's own) unless given."""
    assert parse("--id", "n0", "--peers", PEERS).config.switch_interval_ms == 5.0
    cfg = tmp_path / "s.toml"
    cfg.write_text("switchIntervalMs = 0.5\n")
    assert parse("--config", str(cfg), "--id", "n0", "--peers", PEERS).config.switch_interval_ms == 0.5


@pytest.mark.network
@pytest_twisted.ensureDeferred
async def test_member_service_sets_the_switch_interval(tmp_path, reactor, monkeypatch):
    """Starting a member sets the process's switch interval from switchIntervalMs (before it serves)."""
    asked = []
    monkeypatch.setattr(sys, "setswitchinterval", asked.append)
    monkeypatch.setattr(tap, "tune_gc", lambda: None)  # leave this test process's collector alone
    cfg = tmp_path / "s.toml"
    cfg.write_text("switchIntervalMs = 0.25\n")
    [port] = free_ports(1)
    options = parse("--config", str(cfg), "--id", "n0", "--peers", f"n0-127.0.0.1:{port}", "--preset", "fast")
    member = tap.MemberService(options.config, reactor)
    member.startService()
    try:
        await member.ready
        assert asked == [0.00025]
    finally:
        await member.stopService()
        member.forget_exit_status()


def test_adopt_store_flag_and_config_option(tmp_path):
    """--adopt-store (or adoptStore in the config file) sets adopt_store; it is off by default."""
    assert parse("--id", "n0", "--peers", PEERS).config.adopt_store is False
    assert parse("--id", "n0", "--peers", PEERS, "--adopt-store").config.adopt_store is True
    cfg = tmp_path / "d.toml"
    cfg.write_text("adoptStore = true\n")
    assert parse("--config", str(cfg), "--id", "n0", "--peers", PEERS).config.adopt_store is True


def test_join_flag_and_config_option(tmp_path):
    """--join (or joinExisting in the config file) sets join_existing (issue #23); off by default."""
    assert parse("--id", "n0", "--peers", PEERS).config.join_existing is False
    assert parse("--id", "n0", "--peers", PEERS, "--join").config.join_existing is True
    cfg = tmp_path / "j.toml"
    cfg.write_text("joinExisting = true\n")
    assert parse("--config", str(cfg), "--id", "n0", "--peers", PEERS).config.join_existing is True


def test_snapshot_options_from_the_command_line_and_the_config_file(tmp_path):
    """--snapshot-threshold sets snapshotThreshold; the other snapshot options come from the TOML file, checked."""
    assert parse("--id", "n0", "--peers", PEERS, "--snapshot-threshold", "0").config.snapshot_threshold == 0
    cfg = tmp_path / "s.toml"
    cfg.write_text("maxSnapshotReservedNum = 5\ntrailingEntries = 7\nsnapshotFileSize = 8192\n")
    c = parse("--config", str(cfg), "--id", "n0", "--peers", PEERS).config
    assert (c.max_snapshot_reserved_num, c.trailing_entries, c.snapshot_file_size) == (5, 7, 8192)
    cfg.write_text("maxSnapshotReservedNum = 0\n")
    with pytest.raises(usage.UsageError, match="maxSnapshotReservedNum: must be >= 1"):
        parse("--config", str(cfg), "--id", "n0", "--peers", PEERS)
