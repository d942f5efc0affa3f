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
    """Return a list of ``IAppendHook`` to run on every leader append of ``server`` (its write guard runs them)."""


@hookspec
def dledger_commit_listeners(server):
    """Return a list of ``ICommitListener`` that receive ``server``'s committed entries in order."""


@hookspec
def dledger_state_machines(server):
    """Return a list of ``IStateMachine`` to run on ``server`` (docs/snapshots.md, docs/plugins.md).

    Called once when a server is built, before it starts: each machine is
    restored from the newest snapshot and then fed the committed entries
    after it, in lockstep with the others (``server.snapshots``).  Names must
    be unique on a member; each is a section of every snapshot.
    """


@hookspec
def dledger_extra_options():
    """Return a list of :class:`dledger.plugin_types.ExtraOption` this plugin accepts.

    A dotted name ``"myplugin.port"`` is the key ``port`` of the TOML table
    ``[plugins.myplugin]`` (or ``--plugin-opt myplugin.port=VALUE``); a plain
    name is a key of ``[plugins]``.  ``coerce`` is the option's type (``int``,
    ``float``, ``bool``, ``str`` are checked like core options; any other
    callable converts or raises ValueError; a default is never checked, so
    ``None`` means "unset" for any type).  Values reach the plugin as
    ``server.config.extras[name]``, defaults filled in, on every path that
    builds a server (``twistd dledger``, ``DLedgerServer``, ``dledger.testing.Cluster``),
    and ``twistd dledger --help`` lists them.
    """


@hookspec
def dledger_services(server, collection):
    """Add Twisted services for ``server`` to ``collection`` (an ``IServiceCollection``).

    Call ``my_service.setServiceParent(collection)``, as ``twistd`` plugins
    do with the application's ``MultiService``.  Called once when a server is
    built.  The services start after the member serves (store open,
    transport listening, election running) and stop -- in reverse order, each
    ``stopService()`` Deferred awaited -- before the member stops serving
    and closes its store.
    """


@hookspec
def dledger_leader_ready_listeners(server):
    """Return a list of ``ILeaderReadyListener`` to attach to ``server``.

    ``leader_ready(term)`` is called once per leadership in which this member leads
    *and* that leadership's first entry (the NOOP) is committed: every entry of
    earlier terms is committed then, so the leader's log is complete.
    """


@hookspec
def dledger_request_handlers(server):
    """Return a list of :class:`dledger.plugin_types.RequestHandler`: request codes ``server`` serves for this plugin.

    Codes are in ``dledger.codes.PLUGIN_REQUEST_CODES`` (55000-55999); two handlers of one code, or a
    code outside the range, stop the member from being built (one-line ConfigError).  Requests reach a
    handler through the member's port like GET and APPEND: authenticated, and (with authentication on)
    refused unless the connection holds the handler's ``role``.  Clients send them with
    ``DLedgerClient.request(code, body)`` / ``BlockingClient.request``.
    """


@hookspec(historic=True)
def dledger_add_hookspecs(pluginmanager):
    """Add new hook specifications: ``pluginmanager.add_hookspecs(module_or_class)`` (as pytest's ``pytest_addhooks``).

    Called for every plugin as it is registered (historic), before its own
    hook implementations are checked, so a plugin may define hooks for its
    own plugins and implement them in the same module.  Call them with
    ``pluginmanager.hook.<name>(...)``.
    """


@hookspec
def dledger_cli_commands(subparsers):
    """Add sub-commands to the ``dledger`` command (``subparsers`` of its argparse parser).

    Like a built-in command module's ``register(subparsers)``: add a parser
    with ``subparsers.add_parser(name, help=...)`` and set ``func`` (parsed
    arguments -> exit status) with ``set_defaults``.  Called once per
    :func:`dledger.cli.build_parser`, after the built-in commands; the
    command's errors follow the built-ins' rules (one line, exit 2 for bad
    arguments, ``DLedgerError`` -> exit 1).
    """


@hookspec
def dledger_bench_subjects(subparsers):
    """Add subjects to ``dledger bench`` (``subparsers`` of the bench parser), as ``store`` and ``cluster`` are.

    Same contract as :func:`dledger_cli_commands`: ``subparsers.add_parser(name, help=...)`` and
    ``set_defaults(func=...)`` returning the exit status.  Benchmarks of plugin distributions (the broker
    layer's ``dledger bench rocketmq``, the Spark ingest's ``dledger bench ingest``) live with their plugin
    but are found where operators look for benchmarks.
    """


@hookspec
def dledger_status_sections(server):
    """Return a list of section providers for ``server``'s status page (``/status``, ``/status.json``).

    Each provider is an :class:`dledger.interfaces.IStatusSectionProvider` (a plain function will do).

    Asked once per server when its status page is first read.  Each provider is called with no
    arguments on the reactor thread every time the page polls (once a second per open page), and
    returns a section or a list of them, made with :func:`dledger.status.model.section` and
    :func:`~dledger.status.model.table` -- plain JSON data (``id``, ``title``, ``summary`` pairs,
    ``tables`` of ``columns`` and ``rows``), which the page renders like the core's own, paged 25 rows
    at a time.  Keep it cheap and read-only; a provider that raises is shown as unavailable (one
    rate-limited log line) and never fails the page.  The broker plugin's topics, queues, consumer
    groups and delayed messages are one (``dledger_rocketmq.broker.status``).
    """


@hookspec
def dledger_metric_families(server):
    """Return a list of metric providers for ``server``'s Prometheus endpoint (``/metrics``).

    Asked once per server when it is first scraped.  Each provider is called with no arguments on
    the reactor thread at every scrape and returns an iterable of ``prometheus_client`` metric
    families (``GaugeMetricFamily``, ``CounterMetricFamily``, ...), named after the plugin
    (``rocketmq_*``) and labelled with ``group`` and ``self_id`` as the core's are.  A provider that
    raises leaves its families out of that scrape (one rate-limited log line).
    """
