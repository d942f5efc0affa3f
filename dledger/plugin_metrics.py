"""Plugins' Prometheus metrics on the member's metrics endpoint (the ``dledger_metrics`` hook).

Why apart from :mod:`dledger.metrics`: that collector reads dledger's own
state; a plugin (the RocketMQ broker layer: its runtime statistics) knows its
own figures and returns them as metric families.  This collector asks every
plugin at scrape time, on the reactor thread (``blockingCallFromThread``,
like the member's collector), so a plugin's state is only ever read by the
reactor thread.  A plugin whose hook fails is logged (rate-limited) and
skipped: the rest of the scrape still answers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from twisted.internet.threads import blockingCallFromThread
from twisted.logger import Logger
from twisted.python.threadable import isInIOThread

from dledger import plugins
from dledger.ratelog import RateLimitedLog

log = Logger()


class PluginMetricsCollector:
    """A ``prometheus_client`` collector of every plugin's ``dledger_metrics(server)`` families."""

    def __init__(self, get_server: Callable[[], Any], reactor: Any, plugin_manager: Any = None):
        self.get_server = get_server
        self.reactor = reactor
        self.plugin_manager = plugin_manager
        self.failures = RateLimitedLog(log, reactor, 60.0)

    def describe(self) -> list:
        return []  # nothing at registration time (the member may not exist yet)

    def _families(self) -> list:
        server = self.get_server()
        if server is None:
            return []
        pm = self.plugin_manager or plugins.get_plugin_manager(report=False)
        out: list = []
        for impl in reversed(pm.hook.dledger_metrics.get_hookimpls()):
            try:
                out.extend(impl.function(server=server) or ())
            except Exception as exc:  # one plugin's bug must not take the scrape down
                self.failures.warn(impl.plugin_name, "plugin {p}: metrics failed: {e}", p=impl.plugin_name, e=exc)
        return out

    def collect(self) -> Iterator:
        families = self._families() if isInIOThread() else blockingCallFromThread(self.reactor, self._families)
        yield from families
