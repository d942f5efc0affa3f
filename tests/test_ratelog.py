"""Rate-limited log lines (dledger.ratelog)."""

from twisted.internet import task
from twisted.logger import Logger, LogLevel

from dledger.ratelog import RateLimitedLog, RateLimiter


def test_first_line_passes_then_muted_until_interval():
    """The first line for a key passes at once; repeats within the interval are held and counted."""
    clock = task.Clock()
    limiter = RateLimiter(clock, interval=10)
    assert limiter.check("a") == 0
    assert limiter.check("a") is None
    assert limiter.check("a") is None
    clock.advance(9.9)
    assert limiter.check("a") is None
    clock.advance(0.1)
    assert limiter.check("a") == 3


def test_keys_are_independent():
    """One noisy key does not mute another's lines."""
    clock = task.Clock()
    limiter = RateLimiter(clock, interval=10)
    assert limiter.check("a") == 0
    assert limiter.check("b") == 0
    assert limiter.check("a") is None


def test_forget_returns_held_count_and_unmutes():
    """forget() reports what was held back and lets the next line through at once."""
    clock = task.Clock()
    limiter = RateLimiter(clock, interval=10)
    limiter.check("a")
    limiter.check("a")
    assert limiter.forget("a") == 1
    assert limiter.check("a") == 0


def test_key_table_is_bounded():
    """A flood of distinct keys never grows the table past max_keys."""
    clock = task.Clock()
    limiter = RateLimiter(clock, interval=10, max_keys=8)
    for i in range(100):
        assert limiter.check(i) == 0
    assert len(limiter) <= 8


def test_rate_limited_log_suffixes_suppressed_count():
    """A line after a muted period says how many similar lines were suppressed."""
    clock = task.Clock()
    events = []
    log = RateLimitedLog(Logger(observer=events.append), clock, interval=5)
    assert log.warn("k", "peer {p} bad", p="x") is True
    assert log.warn("k", "peer {p} bad", p="x") is False
    assert log.warn("k", "peer {p} bad", p="x") is False
    clock.advance(5)
    assert log.error("k", "peer {p} bad", p="x") is True
    assert [e["log_level"] for e in events] == [LogLevel.warn, LogLevel.error]
    assert events[1]["suppressed"] == 2
    assert events[1]["log_format"].endswith("({suppressed} similar lines suppressed)")
