"""RocketMQ's ``client``: the Twisted and blocking clients, the route client, ``dledger rocketmq`` (CLI) and
its migrate-check.  Above :mod:`dledger_rocketmq.broker` only because the client takes the request codes and
frame helpers from the port (one definition of the wire); the broker never imports the client.
"""
