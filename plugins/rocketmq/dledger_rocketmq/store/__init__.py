"""RocketMQ's ``store`` on dledger: the CommitLog facade over the replicated log, consume queues and their
dispatch, reading and migrating a plain CommitLog, topic/group/ACL metadata and consumer offsets, scheduled
messages, and the state machine applying control entries.  Imports only :mod:`dledger_rocketmq.common`.
"""
