"""Plugin services of one member: started after it serves, stopped (flushed) before it stops serving.

A plugin adds Twisted services (its own listening endpoints, its own timers)
through the ``dledger_services(server, collection)`` hook, the way ``twistd``
plugins receive the application's ``IServiceCollection``.  The member owns
the collection -- not twistd's top ``MultiService`` -- because the order
matters: a plugin service may read the store or append through the server
until its ``stopService()`` Deferred fires, so every plugin service has
stopped before the member stops its transport and closes its store, under
``twistd dledger``, for embedded :class:`~dledger.server.DLedgerServer`\\ s and
in :class:`dledger.testing.Cluster` alike.
"""

from __future__ import annotations

from twisted.application.service import MultiService
from twisted.internet.defer import Deferred, inlineCallbacks, maybeDeferred
from twisted.internet.error import CannotListenError
from twisted.logger import Logger, LogLevel
from twisted.python.failure import Failure

from dledger.errors import ConfigError, StoreError

log = Logger()

#: Seconds a member waits for one plugin service's ``stopService()`` before it goes on stopping.
STOP_TIMEOUT = 30.0


class MemberServices(MultiService):
    """The ``IServiceCollection`` plugins add a member's services to.

    :meth:`start` starts the children in the order they were added;
    :meth:`stop` stops them in reverse order, one at a time, waiting for each
    ``stopService()`` Deferred (at most ``stop_timeout`` seconds each: a
    service that never finishes stopping is logged and left behind rather
    than hanging the member's shutdown).  A failing ``stopService`` is logged
    and does not keep the others from stopping.
    """

    def __init__(self, member_id: str, clock, *, stop_timeout: float = STOP_TIMEOUT):
        super().__init__()
        self.member_id = member_id
        self.clock = clock
        self.stop_timeout = stop_timeout
        #: True while :meth:`stop` waits for the services (the member is stopping).
        self.stopping = False
        #: ``id(service)`` -> the name of the plugin that added it (:func:`dledger.plugins.add_services`).
        self.origins: dict[int, str] = {}

    def label(self, svc) -> str:
        """``'newplug-port' of plugin 'newplug'``: how logs and start errors name a service."""
        name = getattr(svc, "name", None)
        text = repr(name) if name else repr(svc)
        plugin = self.origins.get(id(svc))
        return f"{text} of plugin {plugin!r}" if plugin else text

    def start(self) -> None:
        """Start every service; if one raises, those already started are stopped again and the error propagates."""
        if self.running:
            return
        self.running = 1
        started = []
        try:
            for svc in self:
                svc.startService()
                started.append(svc)
        except Exception:
            failure = Failure()
            # The error propagates to whoever starts the member, which reports it (twistd: one line for an
            # operator's mistake, such as a port in use or a damaged file); a traceback here would say it
            # twice, so it is kept for debug level unless the error looks like a bug.
            level = LogLevel.debug if failure.check(ConfigError, StoreError, OSError, CannotListenError) \
                else LogLevel.critical
            log.failure("{id}: plugin service {svc} failed to start", failure, level=level, id=self.member_id,
                        svc=self.label(svc))
            self.running = 0
            for other in reversed(started):
                maybeDeferred(other.stopService).addErrback(lambda f: None)
            raise ServiceStartError(self.label(svc), failure.value) from failure.value

    @inlineCallbacks
    def stop(self):
        """Stop every running service, last added first, each awaited (bounded by ``stop_timeout``)."""
        if not self.running:
            return
        self.running = 0
        self.stopping = True
        try:
            yield self._stop_each()
        finally:
            self.stopping = False

    @inlineCallbacks
    def _stop_each(self):
        for svc in reversed(list(self)):
            if not svc.running:
                continue
            try:
                yield _bounded(maybeDeferred(svc.stopService), self.stop_timeout, self.clock)
            except _StopTimedOut:
                log.error("{id}: plugin service {svc} did not finish stopping within {t} s; going on without it",
                          id=self.member_id, svc=self.label(svc), t=self.stop_timeout)
            except Exception:
                log.failure("{id}: plugin service {svc} failed to stop", id=self.member_id, svc=self.label(svc))

    def startService(self) -> None:
        self.start()

    def stopService(self) -> Deferred:
        return self.stop()


class ServiceStartError(Exception):
    """A plugin service raised in ``startService``: ``cause`` is what it raised, ``service`` names it and its plugin.

    ``twistd dledger`` prints ``plugin service 'x' of plugin 'p' failed to start: <cause in one line>``
    for an operator's mistake (a port in use, say), the traceback for anything else.
    """

    def __init__(self, service: str, cause: BaseException):
        super().__init__(f"plugin service {service} failed to start: {cause}")
        self.service = service
        self.cause = cause


class _StopTimedOut(Exception):
    pass


def _bounded(d: Deferred, timeout: float, clock) -> Deferred:
    """A Deferred with ``d``'s result, or failing with _StopTimedOut after ``timeout`` seconds (``d`` not cancelled)."""
    out: Deferred = Deferred()

    def expire() -> None:
        if not out.called:
            out.errback(_StopTimedOut())

    timer = clock.callLater(timeout, expire)

    def done(result):
        if timer.active():
            timer.cancel()
        if not out.called:
            if isinstance(result, Failure):
                out.errback(result)
            else:
                out.callback(result)

    d.addBoth(done)
    return out
