"""HTTP listeners behind the connection guard (:mod:`dledger.transport.listener`): request bodies are bounded.

Why (issue #21): a metrics POST with ``Content-Length: 99999999999`` made ``twisted.web`` spool the body into a
temporary file until it held 200 MB.  A :class:`BoundedSite` refuses a body over ``max_body`` (413) from its
headers, before a byte of it is buffered, and tells the guard when a request is unfinished so that its read
timeout applies to headers trickling in.  A module of its own so that the member port does not import
``twisted.web``.
"""

from __future__ import annotations

from typing import Any

from twisted.web.http import HTTPChannel
from twisted.web.server import Site

from dledger.transport.listener import KiB, warn_peer

_TOO_LARGE = (b"HTTP/1.1 413 Content Too Large\r\nContent-Type: text/plain\r\nConnection: close\r\n"
              b"Content-Length: %d\r\n\r\n%s")


class BoundedHTTPChannel(HTTPChannel):
    """An HTTP channel that refuses a request body over the site's ``max_body`` before buffering any of it,
    and tells the guard when a request is unfinished (its read timeout then applies)."""

    _unfinished = 0
    _body = 0
    _refused = False

    def unfinished_request(self) -> int:
        return self._unfinished

    def dataReceived(self, data: bytes) -> None:
        if self._refused:
            return
        self._unfinished += len(data)
        super().dataReceived(data)

    def allHeadersReceived(self) -> None:
        limit = getattr(self.site, "max_body", None)
        if limit is not None and self.length is not None and self.length > limit:
            self._refuse(f"Content-Length {self.length}")
            return
        self._body = 0
        super().allHeadersReceived()

    def rawDataReceived(self, data: bytes) -> None:
        limit = getattr(self.site, "max_body", None)
        self._body += len(data)
        if limit is not None and self._body > limit + 64 * KiB and self.length is None:  # chunked, framing slack
            self._refuse(f"a chunked body over {limit} bytes")
            return
        super().rawDataReceived(data)

    def allContentReceived(self) -> None:
        self._unfinished = 0
        super().allContentReceived()

    def _refuse(self, what: str) -> None:
        self._refused = True
        self._unfinished = 0
        limit = self.site.max_body
        text = f"request body too large: at most {limit} bytes (maxHttpBodyBytes)\n".encode()
        warn_peer(self, "body", "refusing an HTTP request from {peer}: {what} exceeds maxHttpBodyBytes {limit}",
                  peer=getattr(self.transport, "peer_host", "?"), what=what, limit=limit)
        self.transport.write(_TOO_LARGE % (len(text), text))
        self.transport.loseConnection()

    def timeoutConnection(self) -> None:  # the guard's timeouts apply, with a line; Twisted's are off
        self.transport.loseConnection()


class BoundedSite(Site):
    """A ``Site`` for a guarded listener: :class:`BoundedHTTPChannel` channels, no access log, no
    Twisted idle timeout (the listener's guard has the timeouts)."""

    protocol = BoundedHTTPChannel
    noisy = False

    def __init__(self, resource: Any, max_body: int = 64 * KiB, **kw: Any):
        kw.setdefault("timeout", None)
        super().__init__(resource, **kw)
        self.max_body = max_body

    def log(self, request: Any) -> None:
        pass



__all__ = ["BoundedHTTPChannel", "BoundedSite"]
