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
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pluggy

from dledger import hookspecs
from dledger.config import ResolvedExtras, coerce_typed
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


@dataclass(frozen=True)
class DistInfo:
    """The distribution a plugin came from (what ``pluggy``'s ``list_plugin_distinfo`` pairs plugins with)."""

    project_name: str
    version: str


@dataclass(frozen=True)
class BrokenPlugin:
    """An entry point of our group that could not be loaded; every command goes on without it."""

    name: str
    distribution: str  # "dledger-myplugin 0.1.0"
    error: str  # "ModuleNotFoundError: No module named 'x'"

    def line(self) -> str:
        """The one line an operator reads (``dledger`` commands print it on stderr, ``twistd dledger`` refuses)."""
        return (f"dledger: plugin {self.name!r} of distribution {self.distribution} cannot be loaded "
                f"({self.error}); left out: fix or uninstall it, or set {DISABLE_AUTOLOAD_ENV}=1 to run "
                f"without third-party plugins")


class DLedgerPluginManager(pluggy.PluginManager):
    """A pluggy manager that loads our entry points one at a time: one that fails is recorded, not fatal.

    A third-party plugin that cannot be imported, registered or checked (an unknown hook name) is
    left out and listed in :attr:`broken`, so ``dledger plugins`` -- the command that diagnoses it --
    and every other command still run (pluggy's own ``load_setuptools_entrypoints`` raises on the
    first bad one, and ``dledger`` built its parser through it).
    """

    def __init__(self) -> None:
        super().__init__(GROUP)
        #: Entry points that could not be loaded, in the order they were tried.
        self.broken: list[BrokenPlugin] = []
        self._dists: list[tuple[Any, DistInfo]] = []

    def list_plugin_distinfo(self) -> list[tuple[Any, Any]]:
        return list(self._dists)

    def load_entry_points(self) -> None:
        """Register every entry point of our group that is not registered or blocked yet."""
        loaded: dict[int, BrokenPlugin] = {}
        for dist in importlib.metadata.distributions():
            info = DistInfo(dist.metadata["Name"] or "?", dist.version or "?")
            label = f"{info.project_name} {info.version}"
            for ep in dist.entry_points:
                if ep.group != GROUP or self.get_plugin(ep.name) is not None or self.is_blocked(ep.name):
                    continue
                try:
                    plugin = ep.load()
                    self.register(plugin, name=ep.name)
                except Exception as exc:
                    self.broken.append(BrokenPlugin(ep.name, label, _one_line(exc)))
                    continue
                self._dists.append((plugin, info))
                loaded[id(plugin)] = BrokenPlugin(ep.name, label, "")
        # Unknown hook names are found only once every plugin (and the specs it adds) is registered.
        while True:
            try:
                self.check_pending()
                return
            except pluggy.PluginValidationError as exc:
                entry = loaded.pop(id(exc.plugin), None)
                if entry is None:
                    raise
                self.unregister(exc.plugin)
                self._dists = [(p, d) for p, d in self._dists if p is not exc.plugin]
                self.broken.append(dataclasses.replace(entry, error=_one_line(exc)))


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def make_plugin_manager(*, autoload: bool | None = None,
                        distributions: frozenset[str] | set[str] | None = None) -> DLedgerPluginManager:
    """A fresh manager with the hook specs, entry-point plugins and built-ins registered.

    ``distributions`` (lower-case distribution names) limits autoloading to the entry points those
    distributions declare; the others are never imported.  Tests use ``{"dledger"}``
    (:func:`dledger.testing.isolated_plugin_manager`) so an installed third-party plugin cannot
    change their answers.  An entry point that cannot be loaded is left out and listed in the
    manager's ``broken`` (:class:`BrokenPlugin`), never an exception.
    """
    pm = DLedgerPluginManager()
    pm.add_hookspecs(hookspecs)
    # Historic: every plugin registered from now on may add hook specs before its own hooks are checked.
    pm.hook.dledger_add_hookspecs.call_historic(kwargs={"pluginmanager": pm})
    if autoload is None:
        autoload = not os.environ.get(DISABLE_AUTOLOAD_ENV)
    if autoload:
        foreign = _entry_points_not_of(frozenset(distributions)) if distributions is not None else []
        for name in foreign:
            pm.set_blocked(name)
        pm.load_entry_points()
        for name in foreign:
            pm.unblock(name)
    for name, module in BUILTIN_PLUGINS.items():
        if pm.get_plugin(name) is None and not pm.is_blocked(name):
            if not any(getattr(p, "__name__", None) == module for p in pm.get_plugins()):
                pm.register(importlib.import_module(module), name=name)
    pm.check_pending()
    return pm


def get_plugin_manager(*, report: bool = True) -> pluggy.PluginManager:
    """The process-wide plugin manager (created on first use).

    The first call prints one line on stderr per plugin that could not be loaded (:class:`BrokenPlugin`),
    unless ``report`` is false (``twistd dledger`` refuses to start instead, with that line).
    """
    global _manager
    if _manager is None:
        _manager = make_plugin_manager()
        for broken in _manager.broken if report else ():  # once per process: commands go on without it
            print(broken.line(), file=sys.stderr)
    return _manager


def broken_plugins(pm: pluggy.PluginManager | None = None) -> list[BrokenPlugin]:
    """The entry points of our group that could not be loaded (``dledger plugins`` lists them)."""
    return list(getattr(pm or get_plugin_manager(), "broken", ()))


def call_each(pm: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> list[str]:
    """Call every implementation of ``hook_name`` on its own; one that raises is skipped, not fatal.

    For the hooks that add ``dledger`` sub-commands (``dledger_cli_commands``, ``dledger_bench_subjects``):
    a plugin whose command cannot be added (a name taken, a bug) must not take the built-in commands
    down with it.  Returns one line per failing plugin.
    """
    problems = []
    hook = getattr(pm.hook, hook_name)
    for impl in reversed(hook.get_hookimpls()):  # the order pluggy calls them in
        try:
            impl.function(**{name: kwargs[name] for name in impl.argnames})
        except Exception as exc:
            problems.append(f"dledger: plugin {impl.plugin_name!r} could not add its commands ({_one_line(exc)}); "
                            f"going on without them (set {DISABLE_AUTOLOAD_ENV}=1 to run without third-party "
                            "plugins)")
    return problems


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


def resolve_extras(extras: Mapping[str, Any], pm: pluggy.PluginManager | None = None) -> ResolvedExtras:
    """Plugin option values (nested tables flattened to dotted names) with defaults filled in.

    Unknown names and values of the wrong type are a one-line ConfigError.  Only values that were
    set are checked: a default is used as the plugin gave it (``None`` for "not set" is fine for a
    ``str`` option), and resolving a :class:`~dledger.config.ResolvedExtras` again (``twistd
    dledger`` resolves before the member does) keeps its values as they are instead of checking
    them a second time.
    """
    declared = extra_options(pm)
    out = {name: opt.default for name, opt in declared.items()}
    already = extras.explicit if isinstance(extras, ResolvedExtras) else None
    explicit = set()
    for key, value in flatten_extras(extras).items():
        opt = declared.get(key)
        if opt is None:
            raise ConfigError(f"plugins.{key}: no installed plugin declares this option "
                              f"(known: {', '.join(sorted(declared)) or 'none'})")
        if already is not None:
            if key in already:
                out[key] = value  # converted when it was set
                explicit.add(key)
            continue  # a default filled in by the first resolution: the default of this manager stands
        if value is opt.default:
            continue
        out[key] = coerce_option(opt, value)
        explicit.add(key)
    return ResolvedExtras(out, explicit)


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
    """What plugins attach to one server: role-change handlers, append hooks, commit listeners, request handlers."""

    role_change_handlers: list
    append_hooks: list
    commit_listeners: list
    leader_ready_listeners: list = dataclasses.field(default_factory=list)
    state_machines: list = dataclasses.field(default_factory=list)
    request_handlers: list = dataclasses.field(default_factory=list)


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
        flat(pm.hook.dledger_state_machines(server=server)),
        flat(pm.hook.dledger_request_handlers(server=server)),
    )


def add_services(server: Any, collection: Any, pm: pluggy.PluginManager | None = None) -> None:
    """Let every plugin add its services for ``server`` to ``collection`` (``dledger_services``).

    Each plugin's hook is called on its own, so that the collection knows which plugin added which
    service (``collection.origins``): a service that cannot start is reported with its plugin's name.
    """
    hook = (pm or get_plugin_manager()).hook.dledger_services
    origins = getattr(collection, "origins", None)
    for impl in reversed(hook.get_hookimpls()):  # the order pluggy calls them in
        before = set(map(id, collection))
        impl.function(**{name: {"server": server, "collection": collection}[name] for name in impl.argnames})
        if origins is not None:
            for svc in collection:
                if id(svc) not in before:
                    origins[id(svc)] = impl.plugin_name


def _providers(results: list) -> list:
    return [item for items in reversed(results) for item in (items or ())]


def status_providers(server: Any, pm: pluggy.PluginManager | None = None) -> list:
    """The section providers every plugin offers for ``server``'s status page (``dledger_status_sections``)."""
    return _providers((pm or get_plugin_manager()).hook.dledger_status_sections(server=server))


def metric_providers(server: Any, pm: pluggy.PluginManager | None = None) -> list:
    """The metric-family providers every plugin offers for ``server`` (``dledger_metric_families``)."""
    return _providers((pm or get_plugin_manager()).hook.dledger_metric_families(server=server))
