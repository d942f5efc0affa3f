"""The request codes plugins serve on a member's port (``dledger_request_handlers``, issue #22 item 7).

A plugin's handler gets the request body and answers bytes (or a Deferred of them); a refusal is a
:class:`dledger.errors.DLedgerError`, which reaches the client as the reply's code and reason.  The
member's connection checks the role a code needs (:meth:`PluginRequests.role`, the server's
``IPluginRequests``) before the request is decoded, like the core codes'.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, fail, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import PLUGIN_REQUEST_CODES, ResponseCode
from dledger.errors import ConfigError, DLedgerError
from dledger.messages import PluginRequest, PluginResponse
from dledger.plugin_types import REQUEST_ROLES
from dledger.ratelog import RateLimitedLog

log = Logger()


class PluginRequests:
    """One member's plugin request handlers, by code."""

    def __init__(self, self_id: str, clock):
        self.self_id = self_id
        #: Plugin request code -> :class:`dledger.plugin_types.RequestHandler`.
        self.handlers: dict = {}
        self._log = RateLimitedLog(log, clock, interval=60.0)

    def add(self, handler) -> None:
        """Serve ``handler.code``; a one-line ConfigError for a code outside the range, a bad role or a taken code."""
        code = handler.code
        if code not in PLUGIN_REQUEST_CODES:
            raise ConfigError(f"plugin request {handler.name!r}: code {code} is outside the plugins' range "
                              f"{PLUGIN_REQUEST_CODES.start}-{PLUGIN_REQUEST_CODES.stop - 1}")
        if handler.role not in REQUEST_ROLES:
            raise ConfigError(f"plugin request {handler.name!r}: role {handler.role!r} is not one of "
                              f"{', '.join(REQUEST_ROLES)}")
        taken = self.handlers.get(code)
        if taken is not None:
            raise ConfigError(f"plugin requests {taken.name!r} and {handler.name!r} both use request code {code}")
        self.handlers[code] = handler

    def role(self, code: int) -> str | None:
        """The role request ``code`` needs; None if no plugin serves it (then it stays member-only)."""
        handler = self.handlers.get(code)
        return handler.role if handler is not None else None

    def handle(self, request: PluginRequest) -> Deferred:
        """The handler's bytes as the reply, or its refusal as the reply's code and reason."""
        code = request.request_code
        handler = self.handlers.get(code)
        if handler is None:
            return fail(DLedgerError(ResponseCode.UNSUPPORTED, f"no plugin serves request code {code} on "
                                                               f"{self.self_id}"))

        def answered(body):
            if not isinstance(body, (bytes, bytearray, memoryview)):
                raise TypeError(f"plugin request {handler.name!r} answered {type(body).__name__}, not bytes")
            return request.base_reply(PluginResponse, body=bytes(body))

        def refused(failure: Failure):
            exc = failure.value
            if isinstance(exc, DLedgerError):
                extra = {"leader_id": exc.leader_id} if exc.leader_id is not None else {}
                return request.base_reply(PluginResponse, exc.code, reason=exc.message[:500] or None, **extra)
            self._log.error(("plugin request", code), "{id}: plugin request {name!r} (code {code}) failed: "
                            "{error}; answering INTERNAL_ERROR", id=self.self_id, name=handler.name,
                            code=code, error=f"{type(exc).__name__}: {exc}")
            return request.base_reply(PluginResponse, ResponseCode.INTERNAL_ERROR,
                                      reason=f"{handler.name} failed ({type(exc).__name__})")

        d = maybeDeferred(handler.handle, request.body or b"")
        return d.addCallback(answered).addErrback(refused)
