"""The plugin manager: finds built-in and third-party plugins and answers "which store is called X".

Built-in plugins are listed in the ``dledger`` entry-point group of our own
``setup.py``, exactly like a third-party plugin would be, and are loaded from
there.  :data:`BUILTIN_PLUGINS` is the fallback for a source tree that is
not installed or when ``DLEDGER_DISABLE_PLUGIN_AUTOLOAD`` is set (which turns
off third-party autoloading, as ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` does).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from dledger import hookspecs
from dledger.config import coerce_typed
from dledger.errors import ConfigError
from dledger.plugin_types import CORE_TYPES

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


def _entry_points_not_of(distributions: frozenset[str]) -> list[str]:
    """Names in our entry-point group that other distributions declare (read from metadata, nothing imported)."""
    return [ep.name for dist in importlib.metadata.distributions()
            if (dist.metadata["Name"] or "").lower() not in distributions
            for ep in dist.entry_points if ep.group == GROUP]


def make_plugin_manager(*, autoload: bool | None = None,
                        distributions: frozenset[str] | set[str] | None = None) -> pluggy.PluginManager:
    """A fresh manager with the hook specs, entry-point plugins and built-ins registered.

    ``distributions`` (lower-case distribution names) limits autoloading to the entry points those
    distributions declare; the others are never imported.  Tests use ``{"dledger"}``
    (:func:`dledger.testing.isolated_plugin_manager`) so an installed third-party plugin cannot
    change their answers.
    """
    pm = pluggy.PluginManager(GROUP)
    pm.add_hookspecs(hookspecs)
    # Historic: every plugin registered from now on may add hook specs before its own hooks are checked.
    pm.hook.dledger_add_hookspecs.call_historic(kwargs={"pluginmanager": pm})
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if autoload:
        foreign = _entry_points_not_of(frozenset(distributions)) if distributions is not None else []
        for name in foreign:
            pm.set_blocked(name)
        pm.load_setuptools_entrypoints(GROUP)
        for name in foreign:
            pm.unblock(name)
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
    """Forget the process-wide manager, so the next use builds it again from the current environment."""
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


def flatten_extras(extras: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """``{"rocketmq": {"port": 1}}`` (a ``[plugins.rocketmq]`` TOML table) as ``{"rocketmq.port": 1}``."""
    out: dict[str, Any] = {}
    for key, value in extras.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten_extras(value, name + "."))
        else:
            out[name] = value
    return out


def coerce_option(opt: Any, value: Any) -> Any:
    """``value`` for plugin option ``opt``: core types as core options are checked, else its ``coerce``."""
    label = f"plugins.{opt.name}"
    kind = CORE_TYPES.get(opt.coerce)
    if kind is not None:
        return coerce_typed(label, kind, value, text=True)
    try:
        return opt.coerce(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{label}: bad value {value!r} (expected {opt.type_name}): {exc}") from None


def resolve_extras(extras: Mapping[str, Any], pm: pluggy.PluginManager | None = None) -> dict[str, Any]:
    """Plugin option values (nested tables flattened to dotted names) with defaults filled in.

    Unknown names and values of the wrong type are a one-line ConfigError.
    """
    declared = extra_options(pm)
    out = {name: opt.default for name, opt in declared.items()}
    for key, value in flatten_extras(extras).items():
        opt = declared.get(key)
        if opt is None:
            raise ConfigError(f"plugins.{key}: no installed plugin declares this option "
                              f"(known: {', '.join(sorted(declared)) or 'none'})")
        out[key] = coerce_option(opt, value)
    return out


def resolve_config(config: Any, pm: pluggy.PluginManager | None = None) -> Any:
    """``config`` with its ``extras`` resolved (:func:`resolve_extras`): what a server runs with."""
    return config.replace(extras=resolve_extras(config.extras, pm))


def plugin_options(config: Any, plugin: str) -> dict[str, Any]:
    """The options of one plugin by their short names: ``{"port": ...}`` for ``myplugin.port``."""
    prefix = plugin + "."
    return {name[len(prefix):]: value for name, value in config.extras.items() if name.startswith(prefix)}


def options_help(pm: pluggy.PluginManager | None = None) -> str:
    """The plugin options section of ``twistd dledger --help`` (empty when no plugin declares one)."""
    try:
        declared = extra_options(pm)
    except Exception as exc:
        return f"\nPlugin options: cannot list them: {exc}\n"
    if not declared:
        return ""
    lines = ["", "Plugin options (--plugin-opt NAME=VALUE, or NAME's key in the TOML [plugins] table,",
             "e.g. [plugins.rocketmq] listen = ... for rocketmq.listen):"]
    for name in sorted(declared):
        opt = declared[name]
        lines.append(f"  {name} ({opt.type_name}, default {opt.default!r})")
        lines.append(f"      {opt.help}")
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ServerExtensions:
    """What plugins attach to one server: role-change handlers, append hooks and commit listeners."""

    role_change_handlers: list
    append_hooks: list
    commit_listeners: list
    leader_ready_listeners: list = dataclasses.field(default_factory=list)


def server_extensions(server: Any, pm: pluggy.PluginManager | None = None) -> ServerExtensions:
    """Ask every plugin what to attach to ``server``, flattening the per-plugin lists in registration order."""
    pm = pm or get_plugin_manager()

    def flat(results: list) -> list:
        return [item for items in reversed(results) for item in (items or ())]

    return ServerExtensions(
        flat(pm.hook.dledger_role_change_handlers(server=server)),
        flat(pm.hook.dledger_append_hooks(server=server)),
        flat(pm.hook.dledger_commit_listeners(server=server)),
        flat(pm.hook.dledger_leader_ready_listeners(server=server)),
    )


def add_services(server: Any, collection: Any, pm: pluggy.PluginManager | None = None) -> None:
    """Let every plugin add its services for ``server`` to ``collection`` (``dledger_services``)."""
    (pm or get_plugin_manager()).hook.dledger_services(server=server, collection=collection)
