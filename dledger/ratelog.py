"""Rate-limited log lines: one line per key per interval, with a count of what was held back.

Why: a member that refuses a hostile frame, a leader whose follower is down, or a follower
receiving entries it cannot accept sees the same condition hundreds of times a second. An
operator needs the first line at once and then a periodic reminder with a count, not
thousands of identical lines (issue #9: 8,914 traceback lines from one EMFILE condition).

The limiter only decides; the caller logs. Time comes from an injected ``IReactorTime``
(``seconds()``), so tests drive it with ``task.Clock``.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import Logger, LogLevel


class RateLimiter:
    """Decides whether the next line for ``key`` may be logged now.

    ``check(key)`` returns ``None`` while the key is muted, else the number of lines held
    back since the last one that passed (0 for the first). Keys are independent, so one
    noisy peer does not mute another's lines. The table is bounded (``max_keys``): a flood
    of distinct keys (e.g. forged remote addresses) cannot grow it without bound.
    """

    def __init__(self, clock: Any, interval: float = 10.0, max_keys: int = 4096):
        self.clock = clock
        self.interval = float(interval)
        self.max_keys = max_keys
        self._last: dict[Any, float] = {}
        self._held: dict[Any, int] = {}

    def check(self, key: Any) -> int | None:
        """``None`` if a line for ``key`` was let through less than ``interval`` ago, else how many were held."""
        now = self.clock.seconds()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._held[key] = self._held.get(key, 0) + 1
            return None
        if last is None and len(self._last) >= self.max_keys:
            self._last.clear()
            self._held.clear()
        self._last[key] = now
        return self._held.pop(key, 0)

    def __len__(self) -> int:
        """How many keys the table tracks now (never more than ``max_keys``)."""
        return len(self._last)

    def forget(self, key: Any) -> int:
        """Drop ``key`` (its condition ended); returns the lines held back since the last one."""
        self._last.pop(key, None)
        return self._held.pop(key, 0)


class RateLimitedLog:
    """A ``twisted.logger.Logger`` front that lets one line per key through per interval.

    ``log.warn(key, "format {x}", x=1)`` logs at once the first time, then at most once per
    ``interval`` for the same key; a line after a muted period ends with
    ``(N similar lines suppressed)``.
    """

    def __init__(self, logger: Logger, clock: Any, interval: float = 10.0):
        self.logger = logger
        self.limiter = RateLimiter(clock, interval)

    def emit(self, level: LogLevel, key: Any, fmt: str, **kw: Any) -> bool:
        """Log ``fmt`` at ``level`` unless ``key`` is muted; True if the line was logged."""
        held = self.limiter.check(key)
        if held is None:
            return False
        if held:
            fmt = fmt + " ({suppressed} similar lines suppressed)"
            kw["suppressed"] = held
        self.logger.emit(level, fmt, **kw)
        return True

    def info(self, key: Any, fmt: str, **kw: Any) -> bool:
        """Rate-limited info line."""
        return self.emit(LogLevel.info, key, fmt, **kw)

    def warn(self, key: Any, fmt: str, **kw: Any) -> bool:
        """Rate-limited warning."""
        return self.emit(LogLevel.warn, key, fmt, **kw)

    def error(self, key: Any, fmt: str, **kw: Any) -> bool:
        """Rate-limited error line."""
        return self.emit(LogLevel.error, key, fmt, **kw)
