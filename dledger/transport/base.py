"""What every transport's server side does with a handler's answer: failures become error replies.

Java DLedger answers a failed request with a response of the matching type
whose ``code`` says what went wrong and whose base fields are copied from
the request; clients never see an exception cross the wire.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import RequestOrResponse, error_response

log = Logger()


def failure_response(request: RequestOrResponse, exc: BaseException) -> RequestOrResponse:
    """The reply to ``request`` when handling it raised ``exc``."""
    if isinstance(exc, DLedgerError):
        reply = error_response(request, exc.code)
        if exc.leader_id is not None:
            reply.leader_id = exc.leader_id
        return reply
    log.error("internal error answering {req!r}: {exc!r}", req=type(request).__name__, exc=exc)
    return error_response(request, ResponseCode.INTERNAL_ERROR)


def answer(handler, request: RequestOrResponse) -> Deferred:
    """Ask ``handler`` to answer ``request``; always fires with a response, never fails."""
    d = maybeDeferred(handler.handle_request, request)
    d.addErrback(lambda f: failure_response(request, f.value))
    return d
