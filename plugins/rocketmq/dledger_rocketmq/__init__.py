"""RocketMQ 4.x broker layer on dledger (SPEC §7), shipped as a dledger plugin.

Laid out like RocketMQ's own modules, each sub-package importing only the ones before it: ``common``
(records, properties, batches, fastjson, control entries, ACL), ``store`` (the CommitLog on dledger, consume
queues, dispatch, migration, metadata and offsets, schedule), ``broker`` (the facade, roles, the port and its
handlers), ``client``, ``namesrv``, ``tools``; :mod:`.plugin` (the entry point) wires them.  See
``docs/rocketmq.md`` ("Modules").
"""

__version__ = "0.1.0"
