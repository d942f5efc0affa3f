"""What the status page keeps between requests: the sample ring, the disk usage, the plugins' sections.

One :class:`StatusBoard` per member process, next to the metrics registry; it runs only while the
metrics endpoint does (:class:`dledger.metrics.MetricsService` starts and stops it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from dledger import diskio
from dledger.ratelog import RateLimitedLog
from dledger.stats import LATENCY_BUCKETS_US
from dledger.status.history import History, Sampler
from dledger.status.model import status_document

log = Logger()

#: How often the partition's used ratio is read (off the reactor thread).
DISK_INTERVAL = 2.0


class StatusBoard:
    """The sample ring and the section providers of the member ``get_server()`` returns (None before start)."""

    def __init__(self, get_server: Callable[[], Any], clock: Any, plugin_manager: Any = None):
        self.get_server = get_server
        self.clock = clock
        self.plugin_manager = plugin_manager
        self.history = History(LATENCY_BUCKETS_US)
        self.sampler = Sampler(get_server, self.history, clock)
        #: The used fraction of the partition holding the member's store (file stores), read every few seconds.
        self.disk_used_ratio: float | None = None
        self._disk = LoopingCall(self._read_disk)
        self._disk.clock = clock
        self._disk_busy = False
        self._providers: tuple[Any, list] = (None, [])
        self._errors = RateLimitedLog(log, clock, interval=60.0)

    def start(self) -> None:
        self.sampler.start()
        if not self._disk.running:
            self._disk.start(DISK_INTERVAL, now=True)

    def stop(self) -> None:
        self.sampler.stop()
        if self._disk.running:
            self._disk.stop()

    def _read_disk(self) -> None:
        server = self.get_server()
        if server is None or not server.running or self._disk_busy:
            return
        path = server.config.member_dir
        if server.config.store_type == "memory":
            return
        self._disk_busy = True

        def done(ratio: float) -> None:
            self.disk_used_ratio = round(ratio, 4)

        def failed(_f: Any) -> None:
            self.disk_used_ratio = None

        def free(_: Any) -> None:
            self._disk_busy = False

        server.blocking_io.run(diskio.disk_used_ratio, path).addCallbacks(done, failed).addBoth(free)

    def providers_for(self, server: Any) -> list:
        """The ``dledger_status_sections`` providers for ``server``, asked once per server."""
        if self._providers[0] is not server:
            from dledger import plugins

            self._providers = (server, plugins.status_providers(server, self.plugin_manager))
        return self._providers[1]

    def provider_failed(self, provider: Any, exc: BaseException) -> None:
        name = getattr(provider, "__qualname__", type(provider).__name__)
        self._errors.warn(("section", name), "status section {name} failed: {exc}", name=name, exc=exc)

    def document(self) -> dict[str, Any] | None:
        """``/status.json``'s document, or None while the member is not built yet."""
        server = self.get_server()
        if server is None:
            return None
        return status_document(server, self, self.clock.seconds())
