"""The kv map's hooks (entry point ``kv`` of the dledger-example distribution); inert unless ``kv.enabled``.

On a member with ``kv.enabled``: one :class:`.machine.KVMachine` registered with the member's state
machines (``dledger_state_machines``: fed committed entries, snapshotted, restored) and its two
request codes (``dledger_request_handlers``).  On every ``dledger`` command line: ``dledger kv``.
docs/plugins.md ("Writing a state machine") walks through it.
"""

from __future__ import annotations

import weakref

from dledger.hookspecs import hookimpl
from dledger.plugin_types import ExtraOption
from dledger.plugins import plugin_options
from dledger_example.kv.handlers import KVHandlers
from dledger_example.kv.machine import KVMachine

#: The default of ``kv.max_value``.
MAX_VALUE = 1024 * 1024


def byte_count(value) -> int:
    """``kv.max_value``'s type: a whole number of bytes, 0 or more (ValueError otherwise: a one-line config error)."""
    try:
        number = int(value) if not isinstance(value, (bool, float)) else None
    except ValueError:
        number = None
    if number is None or number < 0:
        raise ValueError("expected a whole number of bytes, 0 or more")
    return number


@hookimpl
def dledger_extra_options():
    """``kv.enabled`` and ``kv.max_value`` (``[plugins.kv]`` in the TOML file, ``--plugin-opt kv.NAME=VALUE``)."""
    return [
        ExtraOption("kv.enabled", False, "run the replicated kv map (dledger kv) on this member", bool),
        ExtraOption("kv.max_value", MAX_VALUE, "the largest value (and cas expected value), in bytes, the leader "
                                               "accepts", byte_count),
    ]


class KV:
    """One member's kv map: its machine and request handlers."""

    def __init__(self, server):
        options = plugin_options(server.config, "kv")
        self.machine = KVMachine(server.clock, server.config.self_id)
        self.handlers = KVHandlers(server, self.machine, options["max_value"])


_members: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def kv_of(server) -> KV | None:
    """The member's :class:`KV` (made on first use); None unless ``kv.enabled``."""
    if not server.config.extras.get("kv.enabled"):
        return None
    if server not in _members:
        _members[server] = KV(server)
    return _members[server]


@hookimpl
def dledger_state_machines(server):
    kv = kv_of(server)
    return [kv.machine] if kv else []


@hookimpl
def dledger_request_handlers(server):
    kv = kv_of(server)
    return kv.handlers.request_handlers() if kv else []


@hookimpl
def dledger_cli_commands(subparsers):
    from dledger_example.kv.command import register

    register(subparsers)
