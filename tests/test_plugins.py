"""The plugin manager: built-ins through the entry point, third-party loading, and one test per hook."""

import importlib.metadata
import inspect
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
from zope.interface import implementer

from dledger import hookspecs, plugins
from dledger.errors import ConfigError
from dledger.hookspecs import hookimpl
from dledger.interfaces import IAppendHook, ICommitListener, IRoleChangeHandler
from dledger.plugin_types import ExtraOption, StoreType, TransportType
from dledger.testing import isolated_plugin_manager

ROOT = Path(__file__).parent.parent


@pytest.fixture
def pm():
    """A plugin manager holding dledger's own plugins only, whatever else is installed (none is even imported).

    The hook tests below check exact answers (the options declared, the store names known); a plugin
    the developer happens to have installed (e.g. dledger-rocketmq) must not change them.  Built-ins
    still come from dledger's own entry points, as in production.
    """
    return isolated_plugin_manager()


@pytest.fixture
def third_party(tmp_path, monkeypatch):
    """A fake installed distribution with a module in the ``dledger`` entry-point group."""
    (tmp_path / "fake_dledger_plugin.py").write_text(textwrap.dedent('''
        from dledger.hookspecs import hookimpl
        from dledger.plugin_types import ExtraOption, StoreType

        @hookimpl
        def dledger_store_types():
            return [StoreType("fake", lambda c, s: None, lambda c: None, "test store")]

        @hookimpl
        def dledger_extra_options():
            return [ExtraOption("fake_option", 1, "an option of the fake plugin", int)]
    '''))
    dist = tmp_path / "fake_dledger_plugin-1.2.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-dledger-plugin\nVersion: 1.2\n")
    (dist / "entry_points.txt").write_text("[dledger]\nfake = fake_dledger_plugin\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    yield
    sys.modules.pop("fake_dledger_plugin", None)


def test_builtin_memory_store_comes_from_the_entry_point(pm):
    """The installed package registers its memory store through the 'dledger' entry-point group."""
    eps = {ep.name: ep.value for ep in importlib.metadata.entry_points(group="dledger")}
    assert eps.get("memory") == "dledger.store.memory"
    info = {p.name: p for p in plugins.describe_plugins(pm)}
    assert info["memory"].module == "dledger.store.memory"
    assert info["memory"].source.startswith("entry point 'dledger' of dledger")


def test_every_builtin_is_declared_as_an_entry_point():
    """setup.py lists every built-in plugin in the entry-point group, so built-ins load like third-party ones."""
    setup = (ROOT / "setup.py").read_text()
    for name, module in plugins.BUILTIN_PLUGINS.items():
        assert f'"{name} = {module}' in setup


def test_autoload_can_be_disabled(monkeypatch, third_party):
    """DLEDGER_DISABLE_PLUGIN_AUTOLOAD keeps third-party plugins out; built-ins stay (as fallback)."""
    monkeypatch.setenv(plugins.DISABLE_AUTOLOAD_ENV, "1")
    pm = plugins.make_plugin_manager()
    assert "fake" not in plugins.store_types(pm)
    info = {p.name: p for p in plugins.describe_plugins(pm)}
    assert "built-in fallback" in info["memory"].source
    assert "memory" in plugins.store_types(pm)


def test_third_party_plugin_loads_from_entry_point(third_party):
    """A distribution declaring the 'dledger' group is loaded and its hooks answer."""
    pm = plugins.make_plugin_manager()
    assert plugins.get_store_type("fake", pm).description == "test store"
    sources = {p.name: p.source for p in plugins.describe_plugins(pm)}
    assert sources["fake"] == "entry point 'dledger' of fake-dledger-plugin 1.2"


def test_hook_tests_are_isolated_from_installed_plugins(third_party, pm):
    """The hook tests' manager never imports installed third-party plugins but keeps dledger's entry-point built-ins."""
    assert "fake_dledger_plugin" not in sys.modules, "a third-party plugin was imported"
    assert "fake" not in plugins.store_types(pm)
    assert "fake_option" not in plugins.extra_options(pm)
    assert all(p.source.startswith("entry point 'dledger' of dledger ") for p in plugins.describe_plugins(pm))
    assert sorted(p.name for p in plugins.describe_plugins(pm)) == sorted(plugins.BUILTIN_PLUGINS)


def test_check_pending_catches_hooks_without_spec(pm):
    """A plugin implementing a hook that has no spec is refused at registration."""
    class Typo:
        @hookimpl
        def dledger_store_type(self):
            return []
    with pytest.raises(Exception, match="unknown hook"):
        pm.register(Typo())
        pm.check_pending()


# -- one test per hook spec ---------------------------------------------------

def test_hook_dledger_store_types(pm):
    """Store types are collected by name; duplicates and unknown names are clear errors."""
    assert isinstance(plugins.get_store_type("memory", pm), StoreType)
    with pytest.raises(ConfigError, match="unknown store 'nope'; installed: .*memory"):
        plugins.get_store_type("nope", pm)

    class Dup:
        @hookimpl
        def dledger_store_types(self):
            return [StoreType("memory", None, None)]
    pm.register(Dup())
    with pytest.raises(ConfigError, match="two plugins provide a store type named 'memory'"):
        plugins.store_types(pm)


def test_a_plugin_store_without_flush_rounds_is_refused_with_one_line(pm):
    """``ILogStore.flush_rounds`` is read as an attribute: a plugin store lacking it fails the build clearly."""
    from dledger.config import make_config
    from dledger.server import DLedgerServer
    from dledger.store.memory import MemoryLogStore, MemoryTermVoteStore
    from dledger.testing import SimClock
    from dledger.transport.inprocess import InProcessNetwork

    class Old:  # a store written before the attribute was declared
        def __init__(self, state):
            self.inner = MemoryLogStore(state)

        def __getattr__(self, name):
            if name == "flush_rounds":
                raise AttributeError(name)
            return getattr(self.inner, name)

    class P:
        @hookimpl
        def dledger_store_types(self):
            return [StoreType("old", lambda c, s, **kw: Old(s), lambda c: MemoryTermVoteStore(), "an old store")]
    pm.register(P())
    clock = SimClock()
    with pytest.raises(ConfigError, match="store type 'old': its log store has no flush_rounds attribute"):
        DLedgerServer.build(make_config(transport_type="inprocess", store_type="old"), clock=clock,
                            transport=InProcessNetwork(clock).transport("n0"), plugin_manager=pm)


def test_hook_dledger_transport_types(pm):
    """A plugin-provided transport is found by name; unknown names list the installed ones."""
    class P:
        @hookimpl
        def dledger_transport_types(self):
            return [TransportType("carrier-pigeon", lambda config, reactor: "pigeon")]
    pm.register(P())
    assert plugins.get_transport_type("carrier-pigeon", pm).make_transport(None, None) == "pigeon"
    with pytest.raises(ConfigError, match="unknown transport 'owl'"):
        plugins.get_transport_type("owl", pm)


@implementer(IRoleChangeHandler)
class Handler:
    def role_changed(self, term, role):
        pass


@implementer(IAppendHook)
class Hook:
    def before_append(self, entry, buffer, body_offset):
        pass


@implementer(ICommitListener)
class Listener:
    def start_index(self):
        return 0

    def entries_committed(self, entries):
        pass


def _register_server_plugin(pm, name, kind, factory):
    class P:
        pass
    setattr(P, name, hookimpl(lambda self, server: [factory(server)]))
    pm.register(P(), name=f"test-{kind}")


def test_hook_dledger_role_change_handlers(pm):
    """Role-change handlers are asked for per server and returned in a flat list."""
    server = SimpleNamespace(id="n0")
    _register_server_plugin(pm, "dledger_role_change_handlers", "rc", lambda s: (Handler(), s))
    ext = plugins.server_extensions(server, pm)
    assert len(ext.role_change_handlers) == 1 and ext.role_change_handlers[0][1] is server


def test_hook_dledger_append_hooks(pm):
    """Append hooks are asked for per server."""
    _register_server_plugin(pm, "dledger_append_hooks", "ah", lambda s: Hook())
    assert [type(h) for h in plugins.server_extensions(SimpleNamespace(), pm).append_hooks] == [Hook]


def test_hook_dledger_commit_listeners(pm):
    """Commit listeners are asked for per server."""
    _register_server_plugin(pm, "dledger_commit_listeners", "cl", lambda s: Listener())
    assert [type(h) for h in plugins.server_extensions(SimpleNamespace(), pm).commit_listeners] == [Listener]


def test_hook_dledger_state_machines(pm, tmp_path):
    """State machines are asked for per server and reach ``server.snapshots``, fed committed entries."""
    from dledger.testing import Cluster
    from dledger.testing.statemachine import DictMachine

    made = []
    _register_server_plugin(pm, "dledger_state_machines", "sm", lambda s: made.append(DictMachine()) or made[-1])
    assert [type(m) for m in plugins.server_extensions(SimpleNamespace(), pm).state_machines] == [DictMachine]
    cluster = Cluster(1, plugin_manager=pm, store_base_dir=str(tmp_path))
    cluster.start()
    cluster.wait_for_leader()
    d = cluster.client().append(b"k=v")
    assert cluster.run_until(lambda: d.called, 5)
    cluster.wait_applied()
    assert cluster.servers["n0"].snapshots.machines == [made[-1]]
    assert made[-1].data == {"k": "v"}


def test_hook_dledger_extra_options(pm):
    """Plugin options get defaults, are coerced, and unknown [plugins] keys are refused."""
    class P:
        @hookimpl
        def dledger_extra_options(self):
            return [ExtraOption("broker_name", "broker-a", "the broker's name"),
                    ExtraOption("sync_interval", 10, "seconds", int)]
    pm.register(P())
    assert plugins.resolve_extras({}, pm) == {"broker_name": "broker-a", "sync_interval": 10}
    assert plugins.resolve_extras({"sync_interval": "5"}, pm)["sync_interval"] == 5
    with pytest.raises(ConfigError, match="plugins.color: no installed plugin"):
        plugins.resolve_extras({"color": "red"}, pm)
    with pytest.raises(ConfigError, match="^plugins.sync_interval: expected an integer, got .often.$"):
        plugins.resolve_extras({"sync_interval": "often"}, pm)


def test_extra_options_come_from_plugin_tables_and_dotted_plugin_opts(pm):
    """A dotted option is the key of a [plugins.<name>] table or --plugin-opt name.opt=value; flat keys still work."""
    class P:
        @hookimpl
        def dledger_extra_options(self):
            return [ExtraOption("rmq.port", 10911, "broker port", int), ExtraOption("rmq.enabled", False, "on", bool),
                    ExtraOption("flat", "x", "an old-style option")]
    pm.register(P())
    nested = plugins.resolve_extras({"rmq": {"port": 1, "enabled": "yes"}, "flat": "y"}, pm)
    assert nested == {"rmq.port": 1, "rmq.enabled": True, "flat": "y"}
    assert plugins.resolve_extras({"rmq.port": "2"}, pm)["rmq.port"] == 2
    with pytest.raises(ConfigError, match=r"^plugins.rmq.port: expected an integer, got 'abc'$"):
        plugins.resolve_extras({"rmq": {"port": "abc"}}, pm)
    with pytest.raises(ConfigError, match=r"^plugins.rmq.enabled: expected true or false, got 3$"):
        plugins.resolve_extras({"rmq": {"enabled": 3}}, pm)
    with pytest.raises(ConfigError, match=r"^plugins.rmq.colour: no installed plugin declares this option"):
        plugins.resolve_extras({"rmq": {"colour": "red"}}, pm)
    assert plugins.plugin_options(SimpleNamespace(extras=nested), "rmq") == {"port": 1, "enabled": True}


def test_plugin_option_with_custom_coerce_names_its_type(pm):
    """A custom coerce's failure is a one-line ConfigError naming the option and the expected type."""
    def endpoint(value):
        if not str(value).startswith("tcp:"):
            raise ValueError("not a tcp endpoint")
        return str(value)
    class P:
        @hookimpl
        def dledger_extra_options(self):
            return [ExtraOption("rmq.listen", None, "endpoint", endpoint)]
    pm.register(P())
    assert plugins.resolve_extras({}, pm) == {"rmq.listen": None}
    with pytest.raises(ConfigError, match=r"^plugins.rmq.listen: bad value 'udp:1' \(expected endpoint\): not a tcp"):
        plugins.resolve_extras({"rmq.listen": "udp:1"}, pm)


def test_plugin_option_defaults_reach_embedded_servers_and_clusters(pm):
    """DLedgerServer (embedded) and testing.Cluster members get plugin option defaults and checked values."""
    from dledger.config import make_config
    from dledger.server import DLedgerServer
    from dledger.testing import Cluster

    class P:
        @hookimpl
        def dledger_extra_options(self):
            return [ExtraOption("rmq.port", 10911, "broker port", int)]
    pm.register(P())
    config = make_config(transport_type="inprocess", extras={"rmq": {"port": "7"}})
    from dledger.testing import SimClock
    from dledger.transport.inprocess import InProcessNetwork
    clock = SimClock()
    server = DLedgerServer.build(config, clock=clock, transport=InProcessNetwork(clock).transport("n0"),
                                 plugin_manager=pm)
    assert server.config.extras == {"rmq.port": 7}
    cluster = Cluster(3, plugin_manager=pm)
    cluster.start()
    assert all(s.config.extras == {"rmq.port": 10911} for s in cluster.servers.values())
    with pytest.raises(ConfigError, match="plugins.rmq.port: expected an integer"):
        Cluster(1, plugin_manager=pm, extras={"rmq.port": "x"}).start()


def test_twistd_help_lists_plugin_options(pm, monkeypatch):
    """`twistd dledger --help` shows every plugin option with its type, default and help."""
    from dledger import tap

    class P:
        @hookimpl
        def dledger_extra_options(self):
            return [ExtraOption("rmq.listen", "tcp:10911", "where the broker listens"),
                    ExtraOption("rmq.sync_interval", 10, "seconds between metadata syncs", int)]
    pm.register(P())
    monkeypatch.setattr(plugins, "_manager", pm)
    usage = str(tap.Options())
    assert "--plugin-opt" in usage and "Plugin options" in usage
    assert "rmq.listen (str, default 'tcp:10911')" in usage and "where the broker listens" in usage
    assert "rmq.sync_interval (int, default 10)" in usage


def test_twistd_options_validate_plugin_options(pm, monkeypatch, tmp_path):
    """twistd dledger fills plugin defaults, reads [plugins.<name>] tables and refuses a wrong type in one line."""
    from twisted.python import usage as tusage

    from dledger import tap

    class P:
        @hookimpl
        def dledger_extra_options(self):
            return [ExtraOption("rmq.port", 10911, "broker port", int), ExtraOption("rmq.name", "b", "name")]
    pm.register(P())
    monkeypatch.setattr(plugins, "_manager", pm)
    conf = tmp_path / "d.toml"
    conf.write_text('[plugins.rmq]\nname = "broker-a"\n')
    opts = tap.Options()
    opts.parseOptions(["--config", str(conf), "--plugin-opt", "rmq.port=5"])
    assert opts.config.extras == {"rmq.port": 5, "rmq.name": "broker-a"}
    with pytest.raises(tusage.UsageError, match=r"^plugins.rmq.port: expected an integer, got 'five'$"):
        tap.Options().parseOptions(["--plugin-opt", "rmq.port=five"])


from zope.interface import implementer as _implementer  # noqa: E402

from dledger.interfaces import ILeaderReadyListener  # noqa: E402


@_implementer(ILeaderReadyListener)
class ReadyRecorder:
    def __init__(self, server, events):
        self.server, self.events = server, events

    def leader_ready(self, term):
        store, rep = self.server.store, self.server.replicator
        self.events.append(("ready", self.server.self_id, term, store.committed_index >= rep.term_start_index >= 0))


@implementer(IRoleChangeHandler)
class RoleRecorder:
    def __init__(self, server, events):
        self.server, self.events = server, events

    def role_changed(self, term, role):
        self.events.append((role.name, self.server.self_id, term))


def test_hook_dledger_leader_ready_listeners(pm):
    """Only the leader is told leader_ready(term), after its LEADER role change and once its NOOP committed."""
    from dledger.testing import Cluster

    events = []

    class P:
        @hookimpl
        def dledger_leader_ready_listeners(self, server):
            return [ReadyRecorder(server, events)]

        @hookimpl
        def dledger_role_change_handlers(self, server):
            return [RoleRecorder(server, events)]
    pm.register(P())
    cluster = Cluster(3, seed=3, plugin_manager=pm)
    cluster.start()
    leader = cluster.wait_for_leader()
    term = cluster.servers[leader].state.curr_term
    assert cluster.run_until(lambda: any(e[0] == "ready" for e in events), 10)
    cluster.run(1.0)
    ready = [e for e in events if e[0] == "ready"]
    assert ready == [("ready", leader, term, True)]
    assert events.index(("LEADER", leader, term)) < events.index(ready[0])
    assert cluster.servers[leader].leader_ready.is_ready
    # A new leader (new term) is told again; the old one never is.
    cluster.crash(leader)
    new = cluster.wait_for_leader()
    assert cluster.run_until(lambda: len([e for e in events if e[0] == "ready"]) == 2, 10)
    new_term = cluster.servers[new].state.curr_term
    assert [e for e in events if e[0] == "ready"][1] == ("ready", new, new_term, True) and new_term > term


def test_leader_ready_listener_added_late_is_told_at_once(pm):
    """A listener added while its member is already leader-ready hears about the current term."""
    from dledger.testing import Cluster

    cluster = Cluster(1, plugin_manager=pm)
    cluster.start()
    leader = cluster.wait_for_leader()
    server = cluster.servers[leader]
    assert cluster.run_until(lambda: server.leader_ready.is_ready, 5)
    events = []
    server.add_leader_ready_listener(ReadyRecorder(server, events))
    cluster.run(0.1)
    assert events == [("ready", leader, server.state.curr_term, True)]


def test_hook_dledger_services(pm):
    """Plugin services start after the member serves and are stopped (awaited) before the store closes."""
    from twisted.application.service import IServiceCollection, Service
    from twisted.internet.defer import Deferred

    from dledger.testing import Cluster

    log = []
    stopping = {}

    class Broker(Service):
        def __init__(self, server):
            self.server = server

        def startService(self):
            super().startService()
            log.append(("start", self.server.self_id, self.server.running, self.server.store.closed))

        def stopService(self):
            super().stopService()
            log.append(("stop", self.server.self_id, self.server.store.closed))
            stopping[self.server.self_id] = d = Deferred()
            return d

    class P:
        @hookimpl
        def dledger_services(self, server, collection):
            assert IServiceCollection.providedBy(collection)
            Broker(server).setServiceParent(collection)
    pm.register(P())
    cluster = Cluster(3, plugin_manager=pm)
    cluster.start()
    assert sorted(log) == [("start", mid, True, False) for mid in ("n0", "n1", "n2")]
    cluster.wait_for_leader()
    servers = dict(cluster.servers)
    done = cluster.stop()
    cluster.run(1.0)
    assert sorted(log[3:]) == [("stop", mid, False) for mid in ("n0", "n1", "n2")]
    assert not done.called and not any(s.store.closed for s in servers.values())  # waits for the services
    for d in stopping.values():
        d.callback(None)
    cluster.run(1.0)
    assert done.called and all(s.store.closed for s in servers.values())


def test_plugin_service_that_never_stops_does_not_hang_the_member(pm):
    """A plugin service whose stopService never fires is given up on after stop_timeout; the store still closes."""
    from twisted.application.service import Service
    from twisted.internet.defer import Deferred

    from dledger.testing import Cluster

    class Stuck(Service):
        def stopService(self):
            super().stopService()
            return Deferred()

    class P:
        @hookimpl
        def dledger_services(self, server, collection):
            Stuck().setServiceParent(collection)
    pm.register(P())
    cluster = Cluster(1, plugin_manager=pm)
    cluster.start()
    server = cluster.servers["n0"]
    done = cluster.stop()
    cluster.run(server.services.stop_timeout - 1)
    assert not done.called
    cluster.run(2)
    assert done.called and server.store.closed


@pytest.mark.parametrize("error, level", [
    (OSError(98, "port 10911 in use"), "debug"),  # an operator's error: the member's start reports it in one line
    (RuntimeError("port 10911 in use: a bug"), "critical"),
])
def test_plugin_service_that_cannot_start_fails_the_member_start(pm, error, level):
    """A plugin service raising in startService fails server.start() and the member; a bug logs critical."""
    from twisted.application.service import Service
    from twisted.logger import globalLogPublisher

    from dledger.testing import Cluster

    class Broken(Service):
        def startService(self):
            raise error

    class P:
        @hookimpl
        def dledger_services(self, server, collection):
            Broken().setServiceParent(collection)
    pm.register(P())
    cluster = Cluster(1, plugin_manager=pm)
    server = cluster.build("n0")
    events = []
    failures = []
    globalLogPublisher.addObserver(events.append)
    try:
        server.start().addErrback(failures.append)
        cluster.run(1.0)
    finally:
        globalLogPublisher.removeObserver(events.append)
    assert failures and "port 10911 in use" in str(failures[0].value)
    assert not server.running and server.store.closed
    levels = [e["log_level"].name for e in events if "failed to start" in e.get("log_format", "")]
    assert levels == [level]


def test_hook_dledger_add_hookspecs(pm):
    """A plugin adds its own hook specs; its plugins implement them and are checked like dledger's hooks."""
    from dledger.hookspecs import hookspec

    class MySpecs:
        @hookspec
        def myplugin_topics(self, broker):
            """Topics to create on ``broker``."""

    class Owner:
        @hookimpl
        def dledger_add_hookspecs(self, pluginmanager):
            pluginmanager.add_hookspecs(MySpecs)

    class Extension:
        @hookimpl
        def myplugin_topics(self, broker):
            return [f"{broker}-orders"]

    pm.register(Owner())
    pm.register(Extension())
    pm.check_pending()
    assert pm.hook.myplugin_topics(broker="b0") == [["b0-orders"]]

    class Typo:
        @hookimpl
        def myplugin_topic(self, broker):
            return []
    pm.register(Typo())
    with pytest.raises(Exception, match="unknown hook 'myplugin_topic'"):
        pm.check_pending()


def test_added_hookspecs_apply_to_the_plugin_that_adds_them(pm):
    """A plugin may add specs and implement them in the same object (the historic call runs at registration)."""
    from dledger.hookspecs import hookspec

    class Specs:
        @hookspec
        def myplugin_hello(self):
            """Say hello."""

    class Both:
        @hookimpl
        def dledger_add_hookspecs(self, pluginmanager):
            pluginmanager.add_hookspecs(Specs)

        @hookimpl
        def myplugin_hello(self):
            return "hello"

    pm.register(Both())
    pm.check_pending()
    assert pm.hook.myplugin_hello() == ["hello"]


def test_hook_dledger_cli_commands(pm, monkeypatch):
    """A plugin's sub-command appears in the dledger parser and runs with its exit status."""
    from dledger import cli

    class Cmd:
        @hookimpl
        def dledger_cli_commands(self, subparsers):
            p = subparsers.add_parser("hello-plugin", help="say hello")
            p.add_argument("--times", type=int, default=1)
            p.set_defaults(func=lambda args: 40 + args.times)

    pm.register(Cmd())
    monkeypatch.setattr(plugins, "get_plugin_manager", lambda: pm)
    assert "hello-plugin" in cli.build_parser().format_help()
    assert cli.main(["hello-plugin", "--times", "2"]) == 42


def test_hook_dledger_bench_subjects(pm, monkeypatch):
    """A plugin's benchmark appears under ``dledger bench`` and runs with its exit status."""
    from dledger import cli

    class Bench:
        @hookimpl
        def dledger_bench_subjects(self, subparsers):
            p = subparsers.add_parser("hello-bench", help="a plugin benchmark")
            p.add_argument("--count", type=int, default=1)
            p.set_defaults(func=lambda args: 10 + args.count)

    pm.register(Bench())
    monkeypatch.setattr(plugins, "get_plugin_manager", lambda: pm)
    bench_parser = cli.build_parser()._subparsers._group_actions[0].choices["bench"]
    assert "hello-bench" in bench_parser.format_help()
    assert cli.main(["bench", "hello-bench", "--count", "3"]) == 13


def test_hook_dledger_request_handlers(pm):
    """A plugin's request codes are served by every member: the client reaches the leader, gets the handler's bytes
    or its refusal with the reason; an unserved code is UNSUPPORTED; a bad code or a taken one stops the build."""
    from dledger.codes import ResponseCode
    from dledger.errors import DLedgerError
    from dledger.plugin_types import RequestHandler
    from dledger.testing import Cluster

    class P:
        @hookimpl
        def dledger_request_handlers(self, server):
            def echo(body):
                if not server.leads():
                    raise server.not_leader()
                return server.read_index().addCallback(lambda index: body + f" {server.self_id} {index}".encode())

            def refuse(body):
                raise DLedgerError(ResponseCode.UNEXPECTED_ARGUMENT, f"no {body.decode()} here")
            return [RequestHandler(55000, "test.echo", "read", echo), RequestHandler(55001, "test.refuse", "write",
                                                                                     refuse)]
    pm.register(P())
    cluster = Cluster(3, seed=5, plugin_manager=pm)
    cluster.start()
    leader = cluster.wait_for_leader()
    cluster.wait_applied()
    client = cluster.client()
    results = {}
    for code, body in [(55000, b"hi"), (55001, b"cheese"), (55002, b"")]:
        client.request(code, body).addBoth(lambda r, code=code: results.__setitem__(code - 55000, r))
    cluster.wait_until(lambda: len(results) == 3, 10, "three answers")
    committed = cluster.servers[leader].store.committed_index
    assert results[0] == f"hi {leader} {committed}".encode()
    assert results[1].value.code is ResponseCode.UNEXPECTED_ARGUMENT and "no cheese here" in results[1].value.message
    assert results[2].value.code is ResponseCode.UNSUPPORTED
    assert cluster.servers[leader].plugin_role(55001) == "write" and cluster.servers[leader].plugin_role(55002) is None
    # A follower's read_index refuses: NOT_LEADER naming the leader.
    follower = next(m for m in cluster.ids if m != leader)
    failed = []
    cluster.servers[follower].read_index().addErrback(failed.append)
    assert failed and failed[0].value.code is ResponseCode.NOT_LEADER and failed[0].value.leader_id == leader
    server = cluster.servers[leader]
    for bad, why in [(RequestHandler(54999, "low", "read", bytes), "outside the plugins' range 55000-55999"),
                     (RequestHandler(55000, "again", "read", bytes), "'test.echo' and 'again' both use request code"),
                     (RequestHandler(55003, "who", "root", bytes), "role 'root' is not one of")]:
        with pytest.raises(ConfigError, match=why):
            server.add_request_handler(bad)


def test_hook_dledger_status_sections(pm):
    """Section providers are asked once per server; each provider's sections reach /status.json, in order."""
    from dledger.status.board import StatusBoard
    from dledger.status.model import section
    from dledger.testing import Cluster

    asked = []

    class P:
        @hookimpl
        def dledger_status_sections(self, server):
            asked.append(server.self_id)
            return [lambda: section("p1", f"sections of {server.self_id}", summary=[("term", server.state.curr_term)]),
                    lambda: [section("p2", "two"), section("p3", "three")]]
    pm.register(P())
    cluster = Cluster(1, plugin_manager=pm)
    cluster.start()
    try:
        cluster.wait_for_leader()
        board = StatusBoard(lambda: cluster.servers["n0"], cluster.clock, pm)
        first, second = board.document(), board.document()
        term = cluster.servers["n0"].state.curr_term
    finally:
        cluster.stop()
    assert asked == ["n0"]
    assert [s["id"] for s in first["sections"]] == ["p1", "p2", "p3"]
    assert first["sections"][0]["title"] == "sections of n0" and first["sections"][0]["summary"] == [["term", term]]
    assert second["sections"] == first["sections"]


def test_hook_dledger_metric_families(pm):
    """Metric providers are asked once per server and their families appear in every scrape of it; a provider
    that raises is left out of the scrape, the others still answer."""
    from prometheus_client import generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from dledger.metrics import make_registry
    from dledger.testing import Cluster

    asked, scrapes = [], []

    class P:
        @hookimpl
        def dledger_metric_families(self, server):
            asked.append(server.self_id)

            def families():
                scrapes.append(1)
                g = GaugeMetricFamily("myplugin_widgets", "Widgets", labels=["group", "self_id"])
                g.add_metric([server.config.group, server.self_id], 42)
                return [g]

            def broken():
                raise RuntimeError("boom")
            return [broken, families]
    pm.register(P())
    cluster = Cluster(1, plugin_manager=pm)
    cluster.start()
    try:
        registry = make_registry(lambda: cluster.servers["n0"], cluster.clock, "g0", "n0", plugin_manager=pm)
        texts = [generate_latest(registry).decode() for _ in range(2)]
    finally:
        cluster.stop()
    assert asked == ["n0"] and len(scrapes) == 2
    assert all('myplugin_widgets{group="g0",self_id="n0"} 42.0' in t for t in texts)


# -- meta-tests ----------------------------------------------------------------

HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if name.startswith("dledger_")]


def test_hooks_exist():
    """The hook list is not empty (guards the meta-tests below)."""
    assert len(HOOKS) >= 6


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_has_a_test(hook):
    """Each hook spec has a test named test_hook_<name> in this module."""
    assert f"test_hook_{hook}" in globals()


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented(hook):
    """Each hook spec has a section in docs/plugins.md."""
    assert f"`{hook}" in (ROOT / "docs" / "plugins.md").read_text()


def test_built_server_attaches_every_plugin_extension(pm):
    """DLedgerServer.build attaches each per-server extension a plugin returns: each one is called in use."""
    from twisted.application.service import Service

    from dledger.testing import Cluster

    seen = []

    @implementer(IRoleChangeHandler)
    class Role:
        def role_changed(self, term, role):
            seen.append(("role", role.name))

    @implementer(IAppendHook)
    class Append:
        def before_append(self, entry, buffer, body_offset):
            seen.append(("append", bytes(buffer[body_offset:])))

    @implementer(ICommitListener)
    class Commit:
        def start_index(self):
            return 0

        def entries_committed(self, entries):
            seen.extend(("commit", e.body) for e in entries)

    class Ready:
        def leader_ready(self, term):
            seen.append(("ready", term))

    class Started(Service):
        def startService(self):
            super().startService()
            seen.append(("service", "started"))

    class P:
        @hookimpl
        def dledger_role_change_handlers(self, server):
            return [Role()]

        @hookimpl
        def dledger_append_hooks(self, server):
            return [Append()]

        @hookimpl
        def dledger_commit_listeners(self, server):
            return [Commit()]

        @hookimpl
        def dledger_leader_ready_listeners(self, server):
            return [Ready()]

        @hookimpl
        def dledger_services(self, server, collection):
            Started().setServiceParent(collection)
    pm.register(P())
    cluster = Cluster(1, plugin_manager=pm)
    cluster.start()
    cluster.wait_for_leader()
    d = cluster.client().append(b"hello")
    assert cluster.run_until(lambda: d.called and ("commit", b"hello") in seen, 5)
    kinds = {kind for kind, _ in seen}
    assert kinds == {"role", "append", "commit", "ready", "service"}, seen
    assert ("append", b"hello") in seen and ("role", "LEADER") in seen
