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


#: Error replies that carry their reason as the frame's remark (all others are Java's bare error replies).
REMARKED = frozenset({ResponseCode.UNEXPECTED_ARGUMENT, ResponseCode.APPEND_REFUSED})


def refusal_error(response: RequestOrResponse, remark: str | None) -> DLedgerError:
    """What a client's request fails with when the reply says APPEND_REFUSED: the plugin's reason, from the remark.

    An append hook refused the entry (:class:`dledger.errors.AppendHookError`); the code alone would not
    tell the client why, and it is not worth retrying.
    """
    return DLedgerError(ResponseCode.APPEND_REFUSED, remark or "an append hook refused the entry (no reason given)",
                        leader_id=response.leader_id)


def answer(handler, request: RequestOrResponse, *, refusals: bool = False) -> Deferred:
    """Ask ``handler`` to answer ``request``; fires with a response (an error response if it failed).

    With ``refusals``, an APPEND_REFUSED failure fires with its :class:`DLedgerError` instead (the in-process
    transport hands it to the client as the TCP transport does with the remark, :func:`refusal_error`).
    """
    d = maybeDeferred(handler.handle_request, request)

    def failed(f: Failure):
        exc = f.value
        if refusals and isinstance(exc, DLedgerError) and exc.code is ResponseCode.APPEND_REFUSED:
            return DLedgerError(exc.code, exc.message[:500], leader_id=exc.leader_id)
        return failure_response(request, f)

    d.addErrback(failed)
    return d
