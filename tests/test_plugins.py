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

ROOT = Path(__file__).parent.parent


OWN_DISTRIBUTION = "dledger"


def own_plugins_only(pm):
    """Unregister every entry-point plugin not shipped by dledger itself (e.g. an installed dledger-rocketmq).

    The hook tests below check exact answers (the options declared, the store names known); a plugin
    the developer happens to have installed must not change them.  Built-ins still come from dledger's
    own entry points, as in production.
    """
    for plugin, dist in pm.list_plugin_distinfo():
        if dist.project_name != OWN_DISTRIBUTION:
            pm.unregister(plugin)
    return pm


@pytest.fixture
def pm():
    """A plugin manager holding dledger's own plugins only, whatever else is installed."""
    return own_plugins_only(plugins.make_plugin_manager())


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
    """The hook tests' manager ignores installed third-party plugins but keeps dledger's entry-point built-ins."""
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
    with pytest.raises(ConfigError, match="plugins.sync_interval: bad value"):
        plugins.resolve_extras({"sync_interval": "often"}, pm)


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
