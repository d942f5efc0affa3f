"""twistd dropin: ``twistd rocketmq-namesrv`` runs a RocketMQ 4.x-compatible name server
(dledger_rocketmq.namesrv.namesrv)."""

from twisted.application.service import ServiceMaker

rocketmq_namesrv = ServiceMaker(
    "rocketmq-namesrv",
    "dledger_rocketmq.namesrv.namesrv",
    "Run a RocketMQ 4.x-compatible name server (routes for dledger brokers and RocketMQ clients).",
    "rocketmq-namesrv",
)
