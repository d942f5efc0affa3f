"""The metrics endpoint's resources: ``/metrics`` (Prometheus), ``/`` and ``/status`` (the page),
``/status.json``, ``/status.js`` and ``/status.css``; any other path is 404.

They share the endpoint's site, so its connection guard and its TLS (an ``ssl:`` endpoint string)
cover the page as they cover the metrics.  Every answer is rendered on the reactor thread from the
member's state (a few milliseconds for 1,000 queues); the page and its script come from the member
itself, and a Content-Security-Policy of ``'self'`` keeps it that way.
"""

from __future__ import annotations

import json
from typing import Any

from twisted.web.pages import notFound
from twisted.web.resource import Resource

from dledger.status.page import render_page, render_unavailable, static_file

CSP = b"default-src 'self'; style-src 'self'; script-src 'self'; img-src 'self' data:"


def _headers(request: Any, content_type: bytes) -> None:
    request.setHeader(b"content-type", content_type)
    request.setHeader(b"cache-control", b"no-store")
    request.setHeader(b"x-content-type-options", b"nosniff")
    request.setHeader(b"content-security-policy", CSP)


class StatusPage(Resource):
    """``/`` and ``/status``: the page, rendered from the current document."""

    isLeaf = True

    def __init__(self, board: Any):
        super().__init__()
        self.board = board

    def render_GET(self, request: Any) -> bytes:
        _headers(request, b"text/html; charset=utf-8")
        doc = self.board.document()
        if doc is None:
            return render_unavailable("the member is starting: no status yet").encode()
        return render_page(doc).encode()


class StatusJSON(Resource):
    """``/status.json``: the document (see :mod:`dledger.status.model`); 503 while the member starts."""

    isLeaf = True

    def __init__(self, board: Any):
        super().__init__()
        self.board = board

    def render_GET(self, request: Any) -> bytes:
        _headers(request, b"application/json")
        doc = self.board.document()
        if doc is None:
            request.setResponseCode(503)
            return b'{"error": "the member is starting"}\n'
        return json.dumps(doc, separators=(",", ":"), default=str).encode()


class StaticFile(Resource):
    """A file of the page (its script or style sheet), from the package."""

    isLeaf = True

    def __init__(self, name: str, content_type: bytes):
        super().__init__()
        self.body = static_file(name)
        self.content_type = content_type

    def render_GET(self, request: Any) -> bytes:
        _headers(request, self.content_type)
        return self.body


class StatusRoot(Resource):
    """The endpoint's root: ``metrics`` plus the status resources; 404 for anything else."""

    def __init__(self, metrics: Resource, board: Any):
        super().__init__()
        page = StatusPage(board)
        self.putChild(b"", page)
        self.putChild(b"status", page)
        self.putChild(b"metrics", metrics)
        self.putChild(b"status.json", StatusJSON(board))
        self.putChild(b"status.js", StaticFile("status.js", b"text/javascript; charset=utf-8"))
        self.putChild(b"status.css", StaticFile("status.css", b"text/css; charset=utf-8"))

    def getChild(self, path: bytes, request: Any) -> Any:
        return notFound()
