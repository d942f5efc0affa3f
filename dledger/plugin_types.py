"""The small records plugins hand to dledger through hooks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoreType:
    """A named store implementation.

    ``make_log_store(config, member_state, *, clock, blocking_io)`` returns an
    ``ILogStore`` (``clock`` is the member's ``IReactorTime`` for the store's
    timers, ``blocking_io`` the :class:`dledger.diskio.BlockingIO` its fsyncs
    must go through; accept and ignore what you do not need);
    ``make_term_store(config)`` returns the ``ITermVoteStore`` that goes with
    it (a file store keeps ``currterm`` next to its data, LMDB in the same
    environment, memory in memory).
    """

    name: str
    make_log_store: Callable[[Any, Any], Any]
    make_term_store: Callable[[Any], Any]
    description: str = ""


@dataclass(frozen=True)
class TransportType:
    """A named transport: ``make_transport(config, reactor, **kwargs)`` returns an ``ITransport``."""

    name: str
    make_transport: Callable[..., Any]
    description: str = ""


@dataclass(frozen=True)
class ExtraOption:
    """A configuration option a plugin adds (``[plugins]`` table in TOML, ``--plugin-opt`` on the command line)."""

    name: str
    default: Any
    help: str
    coerce: Callable[[Any], Any] = str
