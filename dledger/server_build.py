"""How a member's server is put together from its config: the store, term store and transport plugins.

Kept out of :class:`dledger.server.DLedgerServer` (which is the running member) so that class holds what a
member does, not how the pieces are chosen; ``DLedgerServer.build`` is this function.
"""

from __future__ import annotations

import random

from dledger import plugins
from dledger.diskio import INLINE
from dledger.election.state import MemberState
from dledger.errors import ConfigError


def build(cls, config, *, clock=None, transport=None, store=None, term_store=None,
          rng: random.Random | None = None, plugin_manager=None, blocking_io=None,
          **transport_kwargs):
    """A ``cls`` (a :class:`dledger.server.DLedgerServer`) from ``config``: store and transport come from the
    plugins named in the config unless given.

    ``blocking_io`` (a :class:`dledger.diskio.BlockingIO`) says where the
    store's fsyncs run: inline by default (tests, tools), on the reactor's
    thread pool for a running member (``BlockingIO(reactor, threaded=True)``).
    Term/vote writes use it too when the term store allows it
    (``save_off_reactor``, :mod:`dledger.election.state`).
    """
    if clock is None:
        from twisted.internet import reactor as clock
    store_type = None
    if store is None or term_store is None:
        store_type = plugins.get_store_type(config.store_type, plugin_manager)
    if term_store is None:
        term_store = store_type.make_term_store(config)
    # Term/vote writes go off the reactor thread too when the term store says its save may run on a
    # pool thread (``save_off_reactor``); otherwise (and for plugin stores that do not say) inline.
    term_io = (blocking_io or INLINE) if getattr(term_store, "save_off_reactor", False) else INLINE
    state = MemberState(config.self_id, list(config.members), term_store, config.group, blocking_io=term_io)
    if store is None:
        store = store_type.make_log_store(config, state, clock=clock, blocking_io=blocking_io or INLINE)
        if not hasattr(store, "flush_rounds"):  # a plugin's store written before ILogStore declared it
            raise ConfigError(f"store type {config.store_type!r}: its log store has no flush_rounds attribute "
                              "(ILogStore: 1 unless its flush rounds may run two at once; docs/plugins.md)")
    elif callable(store) and not hasattr(store, "append_as_leader"):
        store = store(config, state)
    if transport is None:
        ttype = plugins.get_transport_type(config.transport_type, plugin_manager)
        transport = ttype.make_transport(config, clock, **transport_kwargs)
    return cls(config, state, store, transport, clock, rng=rng, plugin_manager=plugin_manager,
               blocking_io=blocking_io)

