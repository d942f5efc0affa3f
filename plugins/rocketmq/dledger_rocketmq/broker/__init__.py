"""RocketMQ's ``broker``: the :class:`~.broker.Broker` facade, roles and mixed groups, slave sync, the broker
port and its handler modules (producer, client sessions and long polling, admin, forwarding, ACL), statistics
and the status section.  Imports only :mod:`dledger_rocketmq.store` and :mod:`dledger_rocketmq.common`.
"""
