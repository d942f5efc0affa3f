"""RocketMQ's ``namesrv``: route tables, the name server (``twistd rocketmq-namesrv``) and a broker's
registration with name servers (which uses the client).  Imports client, broker, store and common.
"""
