"""The plugin API beyond the registry: append hooks vs NOOPs and failures, reads by position, services under twistd."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import pytest
import pytest_twisted
from twisted.logger import globalLogPublisher
from twisted.python.failure import Failure
from zope.interface import implementer
from zope.interface.verify import verifyObject

from dledger import plugins
from dledger.codes import EntryType, ResponseCode
from dledger.entry import BODY_OFFSET, Entry, decode_entry, encode_entry
from dledger.errors import AppendHookError, DLedgerError
from dledger.hookspecs import hookimpl
from dledger.interfaces import IAppendHook, IBatchAppender, IPositionReader
from dledger.messages import AppendEntryRequest
from dledger.store.guard import LogGuard
from dledger.store.memory import MemoryLogStore
from dledger.testing import Cluster, isolated_plugin_manager
from dledger.testing.store_contract import FakeMemberState, fired, open_small_store


@pytest.fixture
def pm():
    """A plugin manager holding dledger's own plugins only (installed third-party ones are not imported)."""
    return isolated_plugin_manager()


@pytest.fixture
def logged_failures():
    """Failures logged (including unhandled errors in Deferreds) while the test runs."""
    seen = []

    def observer(event):
        if event.get("log_failure") is not None:
            seen.append(event["log_failure"])
    globalLogPublisher.addObserver(observer)
    yield seen
    globalLogPublisher.removeObserver(observer)


@implementer(IAppendHook)
class RaiseOnEverything:
    def __init__(self):
        self.seen = []

    def before_append(self, entry, buffer, body_offset):
        self.seen.append(entry.magic)
        raise ValueError(f"cannot parse {bytes(buffer[body_offset:])!r}")


@implementer(IAppendHook)
class RefuseBad:
    """Stamps the entry's position into bodies starting with b'pos:'; refuses bodies starting with b'bad'."""

    def __init__(self):
        self.seen = []

    def before_append(self, entry, buffer, body_offset):
        self.seen.append((entry.magic, bytes(buffer[body_offset:])))
        body = bytes(buffer[body_offset:])
        if body.startswith(b"bad"):
            raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, "not a record")
        if body.startswith(b"pos:"):
            buffer[body_offset + 4:body_offset + 12] = (entry.pos + BODY_OFFSET).to_bytes(8, "big")


def with_hook(pm, hook):
    class P:
        @hookimpl
        def dledger_append_hooks(self, server):
            return [hook]
    pm.register(P())
    return hook


def append_failure(cluster, body):
    client = cluster.client(at_least_once=False)
    d = client.append(body)
    out = []
    d.addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10)
    return out[0]


def test_a_hook_raising_on_every_entry_does_not_stop_a_leader_from_being_elected(pm, logged_failures):
    """With an append hook that raises on everything, a leader is elected, its term commits and appends fail cleanly."""
    hook = with_hook(pm, RaiseOnEverything())
    cluster = Cluster(3, seed=5, plugin_manager=pm)
    cluster.start()
    leader = cluster.wait_for_leader(timeout=10)
    server = cluster.servers[leader]
    assert cluster.run_until(lambda: server.leader_ready.is_ready, 10), "the leader's NOOP never committed"
    assert cluster.stable_leader() == leader
    result = append_failure(cluster, b"payload")  # over the network: APPEND_REFUSED and the hook's reason
    assert isinstance(result, Failure) and result.value.code is ResponseCode.APPEND_REFUSED
    assert "ValueError: cannot parse b'payload'" in result.value.message
    direct = []
    server.append(b"payload").addErrback(direct.append)
    assert isinstance(direct[0].value, AppendHookError) and direct[0].value.code is ResponseCode.APPEND_REFUSED
    assert direct[0].value.hook_code is ResponseCode.INTERNAL_ERROR  # not a DLedgerError: a plugin bug
    assert "append hook" in str(direct[0].value) and "ValueError: cannot parse b'payload'" in str(direct[0].value)
    cluster.run(2.0)
    assert cluster.stable_leader() == leader  # still leading after the failed append
    assert EntryType.NOOP not in hook.seen and hook.seen  # the hook saw the user entry, never a NOOP
    assert not logged_failures, logged_failures


def test_append_hooks_never_see_noops(pm):
    """Hooks run on every user entry and on no NOOP, across leader changes."""
    hook = with_hook(pm, RefuseBad())
    cluster = Cluster(3, seed=2, plugin_manager=pm)
    cluster.start()
    leader = cluster.wait_for_leader()
    client = cluster.client()
    d = client.append(b"one")
    assert cluster.run_until(lambda: d.called, 10)
    cluster.crash(leader)
    cluster.wait_for_leader()
    d = client.append(b"two")
    assert cluster.run_until(lambda: d.called, 10)
    assert [b for _, b in hook.seen] == [b"one", b"two"]
    assert all(magic != EntryType.NOOP for magic, _ in hook.seen)


def test_a_failing_hook_fails_only_its_request_in_a_batch(pm):
    """Requests read together: the one whose entry a hook refuses fails; the ones before and after it commit."""
    with_hook(pm, RefuseBad())
    cluster = Cluster(3, seed=4, plugin_manager=pm)
    cluster.start()
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    assert cluster.run_until(lambda: server.leader_ready.is_ready, 10)
    reqs = [AppendEntryRequest(group="g0", body=b"pos:" + bytes(8) + b"first"),
            AppendEntryRequest(group="g0", batch_msgs=[b"ok-2a", b"bad-2b", b"ok-2c"]),
            AppendEntryRequest(group="g0", body=b"third")]
    results = server.handle_requests(reqs)
    assert isinstance(results[1], Failure) and isinstance(results[1].value, AppendHookError)
    assert results[1].value.code is ResponseCode.APPEND_REFUSED and "not a record" in str(results[1].value)
    assert results[1].value.hook_code is ResponseCode.UNEXPECTED_ARGUMENT
    answers = {}
    for k in (0, 2):
        results[k].addCallback(lambda r, k=k: answers.__setitem__(k, r))
    assert cluster.run_until(lambda: len(answers) == 2, 10)
    committed = [e.body for e in cluster.committed_entries(leader) if not e.is_noop]
    # The failed request's bodies before its bad one were stored (documented: not atomic); nothing after it.
    assert committed[-3:] == [committed[-3], b"ok-2a", b"third"]
    first = cluster.servers[leader].store.get(answers[0].index)
    assert first.body[4:12] == (first.pos + BODY_OFFSET).to_bytes(8, "big")  # the hook's rewrite was stored
    assert answers[2].index == answers[0].index + 2


def test_hook_changing_the_entry_length_fails_the_entry():
    """A hook that tries to resize its buffer (a memoryview of exactly the entry: it cannot) fails the entry with
    AppendHookError instead of storing a broken entry."""
    @implementer(IAppendHook)
    class Grow:
        def before_append(self, entry, buffer, body_offset):
            buffer.extend(b"xx")

    store = MemoryLogStore(FakeMemberState())
    guard = LogGuard(store, store.member_state)
    guard.add_append_hook(Grow())
    with pytest.raises(AppendHookError, match="failed on entry 0: AttributeError"):
        guard.append_as_leader(Entry(body=b"abc", term=1))
    assert store.ledger_end_index == -1
    noop = guard.append_as_leader(Entry(body=b"", term=1, magic=EntryType.NOOP))
    assert noop.index == 0  # NOOPs bypass hooks


# -- reads by position ---------------------------------------------------------------------------------

def filled(kind, tmp_path, count=20, committed=14):
    state = FakeMemberState()
    store = open_small_store(kind, tmp_path, state)
    entries = [store.append_as_leader(Entry(body=bytes([65 + i % 26]) * (100 + 7 * i), term=1))
               for i in range(count)]
    fired(store.flush())
    store.update_committed_index(1, committed)
    return store, entries


def mmap_bytes(tmp_path, entries):
    """The raw bytes of an mmap store holding ``entries`` (what every store's read_at must return)."""
    store, _ = filled("mmap", Path(tempfile.mkdtemp(dir=tmp_path)), len(entries), len(entries) - 1)
    return store.read_at(0, entries[-1].pos + entries[-1].size)


@pytest.mark.parametrize("kind", ["memory", "mmap", "lmdb"])
def test_position_reader_returns_committed_bytes_only(kind, tmp_path):
    """read_at returns the data-log bytes of committed entries (blank markers included) and refuses the rest."""
    store, entries = filled(kind, tmp_path)
    assert IPositionReader.providedBy(store)
    verifyObject(IPositionReader, store)
    last = entries[14]
    assert store.begin_position() == 0
    assert store.committed_position() == last.pos + last.size
    assert any(b.pos != a.pos + a.size for a, b in zip(entries, entries[1:15]))  # a file boundary is crossed
    for e in entries[:15]:
        raw = store.read_at(e.pos, e.size)
        assert decode_entry(raw) == e
        assert store.read_at(e.pos + BODY_OFFSET, len(e.body)) == e.body
    whole = store.read_at(0, store.committed_position())
    assert whole == mmap_bytes(tmp_path, entries[:15])
    with pytest.raises(DLedgerError, match="past the committed position") as err:
        store.read_at(entries[15].pos, entries[15].size)
    assert err.value.code is ResponseCode.INDEX_OUT_OF_RANGE
    with pytest.raises(DLedgerError) as err:
        store.read_at(last.pos, last.size + 1)  # one byte of uncommitted data is too much
    assert err.value.code is ResponseCode.INDEX_OUT_OF_RANGE
    with pytest.raises(DLedgerError) as err:
        store.read_at(-1, 4)
    assert err.value.code is ResponseCode.UNEXPECTED_ARGUMENT
    store.update_committed_index(1, 19)
    assert store.read_at(entries[19].pos, entries[19].size) == mmap_bytes(tmp_path, entries)[entries[19].pos:]


@pytest.mark.parametrize("kind", ["memory", "mmap", "lmdb"])
def test_position_reader_on_an_empty_or_uncommitted_log(kind, tmp_path):
    """Nothing committed: committed_position is the begin position and every non-empty read is refused."""
    store, entries = filled(kind, tmp_path, count=3, committed=-1)
    assert store.committed_position() == store.begin_position() == 0
    assert store.read_at(0, 0) == b""
    with pytest.raises(DLedgerError) as err:
        store.read_at(0, 1)
    assert err.value.code is ResponseCode.INDEX_OUT_OF_RANGE


def test_position_reader_refuses_reads_before_the_begin_position(tmp_path):
    """A follower whose log starts mid-way (reset to the leader's entry) refuses reads before its first entry."""
    state = FakeMemberState()
    store = open_small_store("memory", tmp_path, state)
    leader_entries = [Entry(body=b"x" * 200, term=1, index=i, pos=i * 248).sealed() for i in range(3)]
    state.follow(1)
    store.truncate(leader_entries[2], 1, "n1")
    store.update_committed_index(1, 2)
    assert store.begin_position() == leader_entries[2].pos
    assert store.read_at(leader_entries[2].pos, 248) == encode_entry(leader_entries[2])
    with pytest.raises(DLedgerError) as err:
        store.read_at(0, 10)
    assert err.value.code is ResponseCode.INDEX_LESS_THAN_LOCAL_BEGIN


def test_cluster_members_read_the_same_committed_bytes(pm):
    """Every member of an in-process cluster answers read_at with the same bytes at the leader's positions."""
    with_hook(pm, RefuseBad())
    cluster = Cluster(3, seed=9, plugin_manager=pm)
    cluster.start()
    cluster.wait_for_leader()
    client = cluster.client()
    ds = [client.append(b"pos:" + bytes(8) + b"m%d" % i) for i in range(5)]
    assert cluster.run_until(lambda: all(d.called for d in ds), 10)
    cluster.run(1.0)
    answers = [d.result for d in ds]
    for a in answers:
        reads = {mid: s.store.read_at(a.pos + BODY_OFFSET, 12) for mid, s in cluster.servers.items()}
        assert len(set(reads.values())) == 1
        assert reads["n0"][4:] == (a.pos + BODY_OFFSET).to_bytes(8, "big")


# -- services under twistd's member service ------------------------------------------------------------

@pytest.mark.network
@pytest_twisted.ensureDeferred
async def test_member_service_runs_plugin_services_inside_the_member_lifetime(pm, monkeypatch, reactor):
    """Under MemberService (twistd) a plugin service starts once the member serves and stops before the store closes."""
    from twisted.application.service import Service
    from twisted.internet import task

    from dledger import tap
    from dledger.launcher import free_ports

    log = []

    class Broker(Service):
        def __init__(self, server):
            self.server = server

        def startService(self):
            super().startService()
            log.append(("start", self.server.running))

        async def _flush(self):
            await task.deferLater(reactor, 0.05, lambda: None)
            log.append(("flushed", self.server.running, self.server.store.ledger_end_index >= -1))

        def stopService(self):
            from twisted.internet.defer import Deferred
            super().stopService()
            return Deferred.fromCoroutine(self._flush())

    class P:
        @hookimpl
        def dledger_services(self, server, collection):
            Broker(server).setServiceParent(collection)
    pm.register(P())
    monkeypatch.setattr(plugins, "_manager", pm)
    [port] = free_ports(1)
    opts = tap.Options()
    opts.parseOptions(["--id", "n0", "--peers", f"n0-127.0.0.1:{port}", "--preset", "fast"])
    member = tap.MemberService(opts.config, reactor)
    member.startService()
    try:
        await member.ready
        assert log == [("start", True)]
        store = member.server.store
        closed = []
        real_shutdown = store.shutdown
        monkeypatch.setattr(store, "shutdown", lambda: (closed.append(list(log)), real_shutdown())[1])
    finally:
        await member.stopService()
        member.forget_exit_status()
    assert log == [("start", True), ("flushed", True, True)]
    assert closed == [log]  # the store closed after the service had flushed
    assert member.stopped_cleanly


# -- a third-party plugin in real twistd processes -----------------------------------------------------

FAKE_PLUGIN = '''
from twisted.application.service import Service
from twisted.internet import reactor, task
from zope.interface import implementer

from dledger.hookspecs import hookimpl
from dledger.interfaces import ILeaderReadyListener
from dledger.plugin_types import ExtraOption


def note(server, line):
    with open(server.config.extras["fakeplug.events"], "a") as fh:
        fh.write(line + "\\n")


class Recorder(Service):
    def __init__(self, server):
        self.server = server

    def startService(self):
        super().startService()
        note(self.server, f"start serving={self.server.running}")

    def stopService(self):
        super().stopService()
        def flushed():
            note(self.server, f"flushed serving={self.server.running}")
        return task.deferLater(reactor, 0.2, flushed)


@implementer(ILeaderReadyListener)
class Ready:
    def __init__(self, server):
        self.server = server

    def leader_ready(self, term):
        note(self.server, "ready")


@hookimpl
def dledger_extra_options():
    return [ExtraOption("fakeplug.events", "plugin-events.txt", "file the fake plugin writes its events to"),
            ExtraOption("fakeplug.count", 3, "a number", int)]


@hookimpl
def dledger_services(server, collection):
    Recorder(server).setServiceParent(collection)


@hookimpl
def dledger_leader_ready_listeners(server):
    return [Ready(server)]
'''


@pytest.fixture
def fake_plugin_path(tmp_path, monkeypatch):
    """A fake installed distribution 'fakeplug' in the 'dledger' entry-point group, visible to child processes."""
    root = tmp_path / "site"
    root.mkdir()
    (root / "fakeplug.py").write_text(FAKE_PLUGIN)
    dist = root / "fakeplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[dledger]\nfakeplug = fakeplug\n")
    monkeypatch.setenv("PYTHONPATH", str(root))
    return root


@pytest.mark.process
def test_twistd_help_and_validation_include_a_third_party_plugins_options(fake_plugin_path):
    """`twistd dledger --help` lists an installed plugin's options; a wrong type is refused with one line."""
    import subprocess
    import sys

    from dledger.launcher import TWISTD, child_env

    out = subprocess.run([sys.executable, "-c", TWISTD, "dledger", "--help"], env=child_env(), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fakeplug.events (str, default 'plugin-events.txt')" in out.stdout
    assert "fakeplug.count (int, default 3)" in out.stdout
    out = subprocess.run([sys.executable, "-c", TWISTD, "-n", "--pidfile=", "dledger", "--id", "n0", "--peers",
                          "n0-127.0.0.1:20911", "--plugin-opt", "fakeplug.count=many"], env=child_env(),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "plugins.fakeplug.count: expected an integer, got 'many'" in out.stdout + out.stderr


@pytest.mark.process
@pytest_twisted.ensureDeferred
async def test_twistd_member_runs_a_plugins_service_and_leader_ready(fake_plugin_path, tmp_path, reactor):
    """A twistd member starts a plugin's service once serving, tells it leader-ready, and awaits its stop on SIGTERM."""
    from dledger.launcher import LocalGroup

    group = LocalGroup(tmp_path / "group", n=1, store="memory", reactor=reactor)
    events = tmp_path / "group" / "plugin-events.txt"
    try:
        group.start()
        await group.wait_for(lambda: group.log_lines("n0", "dledger member "), 20, "the summary line")
        await group.wait_for(lambda: events.exists() and "ready" in events.read_text(), 20, "leader ready")
        group.signal("n0", signal.SIGTERM)
        assert await group.wait_exit("n0", 20) == 0
        assert events.read_text().splitlines() == ["start serving=True", "ready", "flushed serving=True"]
        assert group.log_lines("n0", "stopped cleanly")
    finally:
        group.close()


def test_handle_appends_is_one_store_batch_with_an_answer_each():
    """The public many-requests append: one store batch (one call of the store's batch append), a result per
    request in order; a refused request (wrong group) fails alone; the others commit at consecutive indexes."""
    cluster = Cluster(3, seed=5)
    cluster.start()
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    assert cluster.run_until(lambda: server.leader_ready.is_ready, 10)
    assert IBatchAppender.providedBy(server)
    batches = []
    real = server.client_appends.append_batch
    server.client_appends.append_batch = lambda entries: batches.append(len(entries)) or real(entries)
    reqs = [AppendEntryRequest(group="g0", body=b"one"), AppendEntryRequest(group="nope", body=b"x"),
            AppendEntryRequest(group="g0", batch_msgs=[b"two", b"three"]), AppendEntryRequest(group="g0", body=b"four")]
    results = server.handle_appends(reqs)
    assert batches == [4]
    assert isinstance(results[1], Failure) and results[1].value.code is ResponseCode.UNKNOWN_GROUP
    answers = {}
    for k in (0, 2, 3):
        results[k].addCallback(lambda r, k=k: answers.__setitem__(k, r))
    assert cluster.run_until(lambda: len(answers) == 3, 10)
    assert answers[2].index == answers[0].index + 2 and answers[3].index == answers[0].index + 3
    committed = [e.body for e in cluster.committed_entries(leader) if not e.is_noop]
    assert committed[-4:] == [b"one", b"two", b"three", b"four"]
