"""Hook specifications: every way a plugin can extend dledger.

Plugins are ordinary modules (or objects) with functions decorated by
:data:`hookimpl`; built-ins register through the same manager and the same
``dledger`` entry-point group as third-party plugins.  Each hook below has a
test (``tests/test_plugins.py`` checks that) and an entry in
``docs/plugins.md``.
"""

from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("dledger")
hookimpl = pluggy.HookimplMarker("dledger")


@hookspec
def dledger_store_types():
    """Return a list of :class:`dledger.plugin_types.StoreType` this plugin provides.

    The name is what ``storeType`` / ``--store`` selects; two plugins
    providing the same name is an error.
    """


@hookspec
def dledger_transport_types():
    """Return a list of :class:`dledger.plugin_types.TransportType` this plugin provides."""


@hookspec
def dledger_role_change_handlers(server):
    """Return a list of ``IRoleChangeHandler`` to attach to ``server``.

    Called once when a server is built.  Handlers receive every role change
    of that member, in order, one at a time.
    """


@hookspec
def dledger_append_hooks(server):
    """Return a list of ``IAppendHook`` to run on every leader append of ``server``'s store."""


@hookspec
def dledger_commit_listeners(server):
    """Return a list of ``ICommitListener`` that receive ``server``'s committed entries in order."""


@hookspec
def dledger_extra_options():
    """Return a list of :class:`dledger.plugin_types.ExtraOption` this plugin accepts.

    Values come from the ``[plugins]`` table of the TOML config or
    ``--plugin-opt name=value`` and reach the plugin as ``config.extras``.
    """
