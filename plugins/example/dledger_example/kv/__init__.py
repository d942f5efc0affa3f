"""A replicated key-value map on dledger: the example state machine (issue #22 item 7; docs/plugins.md).

``codec``: the entry, request and reply encodings (pure); ``machine``: the :class:`IStateMachine`;
``handlers``: the plugin request codes a member serves (linearizable get, put/delete/cas);
``client``: :class:`KVClient` (Deferreds) and :class:`ReplicatedDict` (blocking, dict-like);
``command``: ``dledger kv``; ``history``: recording and checking a kv history (tests, the nemesis);
``plugin``: the hooks (entry point ``kv`` of the dledger-example distribution).
"""
