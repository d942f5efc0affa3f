"""Debian's ``chromium`` driven headless from a test, over the DevTools protocol on a pipe.

``chromium --remote-debugging-pipe`` reads protocol messages (JSON, each ended by a NUL byte) on its
file descriptor 3 and writes answers and events on descriptor 4: no port to find, no websocket
library, nothing left listening.  :class:`HeadlessBrowser` opens one page and can evaluate JavaScript
in it and take a screenshot; every call is bounded by a timeout, and :meth:`HeadlessBrowser.stop`
ends the process (SIGKILL after a grace period).  ``make test`` installs chromium (``make systools``);
:func:`find_chromium` returns None where it is not installed, and the browser tests skip saying so.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from twisted.internet import protocol
from twisted.internet.defer import Deferred

#: Names Debian and other distributions give the browser.
CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


def find_chromium() -> str | None:
    """The browser's path, or None (``DLEDGER_CHROMIUM`` names one explicitly)."""
    explicit = os.environ.get("DLEDGER_CHROMIUM")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    for name in CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(Exception):
    """The browser answered a call with an error, or exited."""


class _Pipe(protocol.ProcessProtocol):
    def __init__(self, browser: HeadlessBrowser):
        self.browser = browser
        self.buffer = b""
        self.stderr = b""

    def childDataReceived(self, fd: int, data: bytes) -> None:
        if fd == 4:
            self.buffer += data
            while b"\0" in self.buffer:
                message, self.buffer = self.buffer.split(b"\0", 1)
                self.browser._received(json.loads(message))
        elif fd == 2:
            self.stderr = (self.stderr + data)[-8192:]

    def processEnded(self, reason: Any) -> None:
        self.browser._ended(reason)


class HeadlessBrowser:
    """One headless chromium with one page (see the module docstring)."""

    def __init__(self, reactor: Any, executable: str, profile_dir: str | Path, *, width: int = 1280,
                 height: int = 1600, timeout: float = 20.0, extra_args: tuple[str, ...] = ()):
        self.reactor = reactor
        self.executable = executable
        self.profile_dir = Path(profile_dir)
        self.width, self.height = width, height
        self.timeout = timeout
        #: More chromium switches (e.g. ``--ignore-certificate-errors`` for a test CA the browser does not know).
        self.extra_args = tuple(extra_args)
        self._next = 0
        self._calls: dict[int, Deferred] = {}
        self._pipe: _Pipe | None = None
        self._process: Any = None
        self._exited: Deferred = Deferred()
        self.session: str | None = None

    def argv(self) -> list[str]:
        return [self.executable, "--headless=new", "--remote-debugging-pipe", "--no-first-run",
                "--no-default-browser-check", "--disable-gpu", "--disable-dev-shm-usage", "--no-sandbox",
                "--disable-extensions", "--disable-background-networking", "--disable-sync",
                f"--user-data-dir={self.profile_dir}", f"--window-size={self.width},{self.height}", *self.extra_args,
                "about:blank"]

    async def start(self) -> None:
        """Start the browser and attach to its page."""
        self.profile_dir.mkdir(parents=True, exist_ok=True)
        self._pipe = _Pipe(self)
        env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
        self._process = self.reactor.spawnProcess(self._pipe, self.executable, self.argv(), env=env,
                                                  childFDs={0: "w", 1: "r", 2: "r", 3: "w", 4: "r"})
        targets = await self.call("Target.getTargets")
        pages = [t for t in targets["targetInfos"] if t["type"] == "page"]
        if pages:
            target = pages[0]["targetId"]
        else:
            target = (await self.call("Target.createTarget", {"url": "about:blank"}))["targetId"]
        attached = await self.call("Target.attachToTarget", {"targetId": target, "flatten": True})
        self.session = attached["sessionId"]
        await self.call("Page.enable", session=True)
        await self.call("Emulation.setDeviceMetricsOverride", {"width": self.width, "height": self.height,
                                                                "deviceScaleFactor": 1, "mobile": False}, session=True)

    def call(self, method: str, params: dict | None = None, *, session: bool = False) -> Deferred:
        """One protocol call; fires with its result, fails with BrowserError (or a timeout)."""
        if self._exited.called:
            raise BrowserError("the browser has exited")
        self._next += 1
        message: dict[str, Any] = {"id": self._next, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = self.session
        d: Deferred = Deferred()
        self._calls[self._next] = d
        self._process.writeToChild(3, json.dumps(message).encode() + b"\0")
        d.addTimeout(self.timeout, self.reactor)
        return d

    def _received(self, message: dict) -> None:
        d = self._calls.pop(message.get("id"), None)
        if d is None or d.called:
            return  # an event, or an answer to a call that timed out
        if "error" in message:
            d.errback(BrowserError(f"{message['error'].get('message')}"))
        else:
            d.callback(message.get("result", {}))

    def _ended(self, reason: Any) -> None:
        calls, self._calls = self._calls, {}
        for d in calls.values():
            if not d.called:
                d.errback(BrowserError("the browser exited: " + (self._pipe.stderr[-400:].decode(errors="replace")
                                                                  if self._pipe else "")))
        if not self._exited.called:
            self._exited.callback(None)

    async def navigate(self, url: str) -> None:
        await self.call("Page.navigate", {"url": url}, session=True)

    async def evaluate(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (JSON-able values only)."""
        out = await self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session=True)
        if "exceptionDetails" in out:
            raise BrowserError(f"{expression}: {out['exceptionDetails'].get('text')}")
        return out["result"].get("value")

    async def texts(self, selectors: Sequence[str]) -> list[str | None]:
        """The text of the first element matching each CSS selector (None where nothing matches)."""
        expr = "[" + ",".join(f"(document.querySelector({json.dumps(s)})||{{}}).textContent||null"
                              for s in selectors) + "]"
        return await self.evaluate(expr)

    async def screenshot(self, path: str | Path, *, full_page: bool = True) -> bytes:
        """A PNG of the page (the whole document when ``full_page``), written to ``path``."""
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = await self.evaluate("Math.ceil(document.documentElement.scrollHeight)")
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": max(int(height or 0), 200), "scale": 1}
            params["captureBeyondViewport"] = True
        png = base64.b64decode((await self.call("Page.captureScreenshot", params, session=True))["data"])
        Path(path).write_bytes(png)
        return png

    async def stop(self, grace: float = 5.0) -> None:
        """Close the browser (Browser.close), killing it if it has not exited after ``grace`` seconds."""
        if self._process is None or self._exited.called:
            return
        try:
            self._process.writeToChild(3, json.dumps({"id": 0, "method": "Browser.close"}).encode() + b"\0")
        except Exception:
            pass
        timer = self.reactor.callLater(grace, self._kill)
        await self._exited
        if timer.active():
            timer.cancel()

    def _kill(self) -> None:
        try:
            self._process.signalProcess("KILL")
        except Exception:
            pass
