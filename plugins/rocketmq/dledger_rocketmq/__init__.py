"""RocketMQ 4.x broker layer on dledger (SPEC §7), shipped as a dledger plugin.

So far: the CommitLog record codec (:mod:`.message`), SEND_BATCH_MESSAGE
bodies (:mod:`.batch`), consume queues (:mod:`.consumequeue`) and reading a
store migrated from a plain CommitLog (:mod:`.migration`).  See
``docs/rocketmq.md``.
"""

__version__ = "0.1.0"
