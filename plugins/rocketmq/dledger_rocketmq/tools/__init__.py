"""RocketMQ's ``tools``/``example``: benchmarks (``dledger bench rocketmq``, ``rocketmq-java``, the dispatch and
send micro-benchmarks), the demo and the local broker group they start.  On top: nothing imports them but
:mod:`dledger_rocketmq.plugin`.
"""
