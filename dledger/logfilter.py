"""What a member's log shows: a level (``twistd dledger --log-level``) and no per-connection chatter.

twistd writes every event it receives, debug included, so without a filter a member logs each vote
round at debug level and Twisted's ``Starting factory <... object at 0x...>`` / ``Stopping factory``
pair on every outgoing connection (the client endpoints wrap our factory in one of their own, whose
``noisy`` we cannot turn off).  :func:`member_observer` wraps twistd's own observer (file, stdout or
syslog, as its options say) in a filter: events below the level are dropped, and so is the factory
chatter unless the level is ``debug``.
"""

from __future__ import annotations

from typing import Any

from twisted.logger import FilteringLogObserver, ILogFilterPredicate, LogLevel, PredicateResult
from zope.interface import implementer

#: ``--log-level`` names, most verbose first.
LEVELS = {"debug": LogLevel.debug, "info": LogLevel.info, "warn": LogLevel.warn, "error": LogLevel.error}

#: Formats of Twisted's per-factory lines (``twisted.internet.protocol.Factory.doStart/doStop``).
FACTORY_CHATTER = frozenset({"Starting factory {factory!r}", "Stopping factory {factory!r}"})


@implementer(ILogFilterPredicate)
class MemberLogPredicate:
    """Drops events below ``level``, and Twisted's factory start/stop lines unless ``level`` is debug."""

    def __init__(self, level: LogLevel):
        self.level = level

    def __call__(self, event: dict[str, Any]) -> PredicateResult:
        level = event.get("log_level", LogLevel.info)
        if level < self.level:
            return PredicateResult.no
        if self.level > LogLevel.debug and event.get("log_format") in FACTORY_CHATTER:
            return PredicateResult.no
        return PredicateResult.maybe


def filtered(observer: Any, level: LogLevel) -> FilteringLogObserver:
    """``observer`` behind :class:`MemberLogPredicate`."""
    return FilteringLogObserver(observer, [MemberLogPredicate(level)])


#: ``(twistd's options, level)`` recorded by :func:`use_for_twistd` for :func:`twistd_observer`.
_twistd_setting: tuple[Any, LogLevel] | None = None


def use_for_twistd(server_options: Any, level: LogLevel) -> None:
    """Make twistd log through :func:`twistd_observer` at ``level`` (unless its ``--logger`` was given).

    twistd resolves its ``logger`` option by name after the sub-command's options are parsed and calls
    it once logging starts, so the level travels in a module variable (one member per process).
    """
    global _twistd_setting
    if server_options.get("logger"):
        return
    _twistd_setting = (server_options, level)
    server_options["logger"] = f"{__name__}.twistd_observer"


def twistd_observer() -> FilteringLogObserver:
    """The observer twistd would have made from its options (``--logfile``, ``--syslog``, ``-n``), filtered."""
    from twisted.scripts.twistd import _SomeApplicationRunner

    server_options, level = _twistd_setting if _twistd_setting is not None else ({}, LogLevel.info)
    return filtered(_SomeApplicationRunner.loggerFactory(server_options)._getLogObserver(), level)
