"""The plugin manager: finds built-in and third-party plugins and answers "which store is called X".

Built-in plugins are listed in the ``dledger`` entry-point group of our own
``setup.py``, exactly like a third-party plugin would be, and are loaded from
there.  :data:`BUILTIN_PLUGINS` is the fallback for a source tree that is
not installed or when ``DLEDGER_DISABLE_PLUGIN_AUTOLOAD`` is set (which turns
off third-party autoloading, as ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` does).
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import pluggy

from dledger import hookspecs
from dledger.errors import ConfigError

GROUP = "dledger"
DISABLE_AUTOLOAD_ENV = "DLEDGER_DISABLE_PLUGIN_AUTOLOAD"

#: entry-point name -> module, for every plugin shipped with dledger.
BUILTIN_PLUGINS: dict[str, str] = {
    "memory": "dledger.store.memory",
    "mmap": "dledger.store.mmapfile",
    "lmdb": "dledger.store.lmdbstore",
    "inprocess": "dledger.transport.inprocess",
    "tcp": "dledger.transport.tcp",
}

_manager: pluggy.PluginManager | None = None


def make_plugin_manager(*, autoload: bool | None = None) -> pluggy.PluginManager:
    """A fresh manager with the hook specs, entry-point plugins and built-ins registered."""
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if autoload:
        pm.load_setuptools_entrypoints(GROUP)
    for name, module in BUILTIN_PLUGINS.items():
        if pm.get_plugin(name) is None and not pm.is_blocked(name):
            if not any(getattr(p, "__name__", None) == module for p in pm.get_plugins()):
                pm.register(importlib.import_module(module), name=name)
    pm.check_pending()
    return pm


def get_plugin_manager() -> pluggy.PluginManager:
    """The process-wide plugin manager (created on first use)."""
    global _manager
    if _manager is None:
        _manager = make_plugin_manager()
    return _manager


def reset_plugin_manager() -> None:
    """Forget the process-wide manager (tests that change the environment call this)."""
    global _manager
    _manager = None


def register(plugin: Any, name: str | None = None) -> None:
    """Register a plugin object or module at run time (embedded use and tests)."""
    pm = get_plugin_manager()
    pm.register(plugin, name=name)
    pm.check_pending()


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    source: str  # "entry point <dist> <version>" or "built-in fallback" / "registered"


def describe_plugins(pm: pluggy.PluginManager | None = None) -> list[PluginInfo]:
    """Every registered plugin and where it came from (``dledger plugins`` prints this)."""
    pm = pm or get_plugin_manager()
    dists = {id(plugin): dist for plugin, dist in pm.list_plugin_distinfo()}
    out = []
    for name, plugin in pm.list_name_plugin():
        if plugin is None:
            continue
        dist = dists.get(id(plugin))
        if dist is not None:
            source = f"entry point {GROUP!r} of {dist.project_name} {dist.version}"
        elif name in BUILTIN_PLUGINS:
            source = "built-in fallback (not installed, or autoload disabled)"
        else:
            source = "registered"
        out.append(PluginInfo(name, getattr(plugin, "__name__", type(plugin).__name__), source))
    return out


def _collect(hook_results: list[list[Any]], kind: str) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for items in hook_results:
        for item in items or ():
            if item.name in table:
                raise ConfigError(f"two plugins provide a {kind} named {item.name!r}")
            table[item.name] = item
    return table


def store_types(pm: pluggy.PluginManager | None = None) -> dict:
    """``{name: StoreType}`` of every store a plugin provides."""
    return _collect((pm or get_plugin_manager()).hook.dledger_store_types(), "store type")


def transport_types(pm: pluggy.PluginManager | None = None) -> dict:
    """``{name: TransportType}`` of every transport a plugin provides."""
    return _collect((pm or get_plugin_manager()).hook.dledger_transport_types(), "transport type")


def extra_options(pm: pluggy.PluginManager | None = None) -> dict:
    """``{name: ExtraOption}`` declared by plugins."""
    return _collect((pm or get_plugin_manager()).hook.dledger_extra_options(), "plugin option")


def get_store_type(name: str, pm: pluggy.PluginManager | None = None):
    """The store type called ``name``; ConfigError listing the known ones otherwise."""
    known = store_types(pm)
    try:
        return known[name]
    except KeyError:
        raise ConfigError(f"storeType: unknown store {name!r}; installed: {', '.join(sorted(known))}") from None


def get_transport_type(name: str, pm: pluggy.PluginManager | None = None):
    """The transport type called ``name``; ConfigError listing the known ones otherwise."""
    known = transport_types(pm)
    try:
        return known[name]
    except KeyError:
        raise ConfigError(f"transportType: unknown transport {name!r}; installed: {', '.join(sorted(known))}") from None


def resolve_extras(extras: dict[str, Any], pm: pluggy.PluginManager | None = None) -> dict[str, Any]:
    """Plugin option values with defaults filled in; unknown names are a ConfigError."""
    declared = extra_options(pm)
    out = {name: opt.default for name, opt in declared.items()}
    for key, value in extras.items():
        opt = declared.get(key)
        if opt is None:
            raise ConfigError(f"plugins.{key}: no installed plugin declares this option "
                              f"(known: {', '.join(sorted(declared)) or 'none'})")
        try:
            out[key] = opt.coerce(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"plugins.{key}: bad value {value!r}: {exc}") from None
    return out


@dataclass(frozen=True)
class ServerExtensions:
    """What plugins attach to one server: role-change handlers, append hooks and commit listeners."""

    role_change_handlers: list
    append_hooks: list
    commit_listeners: list


def server_extensions(server: Any, pm: pluggy.PluginManager | None = None) -> ServerExtensions:
    """Ask every plugin what to attach to ``server``, flattening the per-plugin lists in registration order."""
    pm = pm or get_plugin_manager()

    def flat(results: list) -> list:
        return [item for items in reversed(results) for item in (items or ())]

    return ServerExtensions(
        flat(pm.hook.dledger_role_change_handlers(server=server)),
        flat(pm.hook.dledger_append_hooks(server=server)),
        flat(pm.hook.dledger_commit_listeners(server=server)),
    )
