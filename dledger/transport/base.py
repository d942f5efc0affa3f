"""What every transport's server side does with a handler's answer: failures become error replies.

Java DLedger answers a failed request with a response of the matching type
whose ``code`` says what went wrong and whose base fields are copied from
the request; clients never see an exception cross the wire.
"""

from __future__ import annotations

from twisted.internet.defer import Deferred, maybeDeferred
from twisted.logger import Logger
from twisted.python.failure import Failure

from dledger.codes import ResponseCode
from dledger.errors import DLedgerError
from dledger.messages import RequestOrResponse, error_response

log = Logger()


def failure_response(request: RequestOrResponse, failure: Failure) -> RequestOrResponse:
    """The reply to ``request`` when handling it failed."""
    exc = failure.value
    if isinstance(exc, DLedgerError):
        extra = {"leader_id": exc.leader_id} if exc.leader_id is not None else {}
        return error_response(request, exc.code, **extra)
    log.failure("handler failed on {req}; answering INTERNAL_ERROR", failure, req=type(request).__name__)
    return error_response(request, ResponseCode.INTERNAL_ERROR)


def answer(handler, request: RequestOrResponse) -> Deferred:
    """Ask ``handler`` to answer ``request``; fires with a response (an error response if it failed)."""
    d = maybeDeferred(handler.handle_request, request)
    d.addErrback(lambda f: failure_response(request, f))
    return d
