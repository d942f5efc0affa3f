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


#: Option types checked with the same rules (and messages) as core options.
CORE_TYPES: dict[Any, str] = {bool: "bool", int: "int", float: "float", str: "str"}


@dataclass(frozen=True)
class ExtraOption:
    """A configuration option a plugin adds (``[plugins]`` table in TOML, ``--plugin-opt`` on the command line).

    ``name`` may be dotted: ``"myplugin.port"`` is key ``port`` of the TOML
    table ``[plugins.myplugin]`` and ``--plugin-opt myplugin.port=VALUE``.
    ``coerce`` is the option's type: ``int``, ``float``, ``bool`` or ``str``
    are validated like core options (``plugins.myplugin.port: expected an
    integer, got 'x'``); any other callable converts a value or raises
    ValueError/TypeError; it is called once per value set.  ``default`` is
    used as it is and never checked (``None`` for "unset", whatever the type).
    """

    name: str
    default: Any
    help: str
    coerce: Callable[[Any], Any] = str

    @property
    def type_name(self) -> str:
        """What ``--help`` shows as the option's type."""
        return CORE_TYPES.get(self.coerce) or getattr(self.coerce, "__name__", "value")


#: The roles a plugin request may need (docs/security.md): what a client's role in ``clientsFile`` grants.
REQUEST_ROLES = ("read", "write", "admin", "member")


@dataclass(frozen=True)
class RequestHandler:
    """A request code a plugin serves on a member (``dledger_request_handlers``).

    ``code`` is in ``dledger.codes.PLUGIN_REQUEST_CODES`` (55000-55999); ``role`` is what a connection
    must hold when authentication is on (``read``: a read client or better, ``write``, ``admin``,
    ``member``: members only), checked before the request is decoded, exactly as for APPEND or GET;
    ``handle(body)`` gets the request's bytes and returns the reply's bytes, or a Deferred of them.
    A :class:`dledger.errors.DLedgerError` it raises (or fails with) is the reply's code, its message the
    client's one-line reason (``NOT_LEADER`` with ``leader_id`` makes the client retry at the leader);
    any other exception is INTERNAL_ERROR (logged, rate-limited).  ``name`` names the request in logs
    and errors (``"kv.get"``).
    """

    code: int
    name: str
    role: str
    handle: Callable[[bytes], Any]
    description: str = ""
