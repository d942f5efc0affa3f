"""The broker port's VIP channel (``rocketmq.vipListen``): where a Java slave fetches its master's topic configs.

RocketMQ 4.9.8's ``BrokerOuterAPI.getAllTopicConfig`` sends GET_ALL_TOPIC_CONFIG (21) to the master's VIP
channel only (``MixAll.brokerVIPChannel(true, addr)``: listenPort - 2), while the other three kinds of the
slave sync go to the main port.  Without the VIP endpoint a Java slave under a dledger master logs
``SyncTopicConfig Exception ... connect to <port - 2> failed`` every 10 s and never learns a topic created
after its store was last synced (docs/rocketmq.md "Why a Java broker back on its old store did not learn a
topic").
"""

from __future__ import annotations

import pytest
import pytest_twisted
from dledger_rocketmq.common import fastjson
from dledger_rocketmq.plugin import broker_for, check_surfaces, port_for
from twisted.internet import protocol, task
from twisted.internet.error import CannotListenError

from dledger.errors import ConfigError


@pytest.mark.network
@pytest_twisted.inlineCallbacks
def test_the_vip_endpoint_answers_like_the_broker_port(reactor, tmp_path):
    """A master listening on both endpoints answers GET_ALL_TOPIC_CONFIG on the VIP one (a topic created through
    the main one included), as a Java slave asks it; stopping the port frees both."""
    from dledger_rocketmq.client.client import connect as rmq_connect

    from dledger import plugins
    from dledger.testing import Cluster

    cluster = Cluster(3, seed=5, clock=reactor, plugin_manager=plugins.make_plugin_manager(),
                      store_base_dir=str(tmp_path), extras={"rocketmq.enabled": True,
                                                            "rocketmq.mappedFileSizeConsumeQueue": 1000,
                                                            "rocketmq.listen": "tcp:0:interface=127.0.0.1",
                                                            "rocketmq.vipListen": "tcp:0:interface=127.0.0.1"})
    cluster.start()
    clients = []
    try:
        yield cluster.when(lambda: any(broker_for(s).role == "MASTER" for s in cluster.servers.values()), 20)
        m = next(s for s in cluster.servers.values() if broker_for(s).role == "MASTER")
        port = port_for(m)
        main = (yield port.listening).getHost().port
        assert port.vip_listening_port is not None
        vip = port.vip_listening_port.getHost().port
        assert vip != main
        c = yield rmq_connect(reactor, "127.0.0.1", main, timeout=5)
        clients.append(c)
        first = yield c.send("VipTopic", b"created through the main endpoint", queue_id=0)
        v = yield rmq_connect(reactor, "127.0.0.1", vip, timeout=5)
        clients.append(v)
        header, body = yield v.request(21, {})
        assert header.code == 0
        assert "VipTopic" in fastjson.loads(body)["topicConfigTable"]
        second = yield v.send("VipTopic", b"and a send through the VIP one", queue_id=0)
        assert (first.queue_offset, second.queue_offset) == (0, 1)
        # a slave answers 21 on its main endpoint (migrate-check, mqadmin) but not on the VIP one (a Java slave's
        # topic sync whose master address is stale must not copy a slave's table)
        sl = next(s for s in cluster.servers.values() if s is not m)
        yield cluster.when(lambda: "VipTopic" in broker_for(sl).meta.topics.table, 10)
        slave_port = port_for(sl)
        yield slave_port.listening
        sv = yield rmq_connect(reactor, "127.0.0.1", slave_port.vip_listening_port.getHost().port, timeout=5)
        clients.append(sv)
        header, _ = yield sv.request(21, {})
        assert header.code == 1 and "is not the master" in (header.remark or "")
        sm = yield rmq_connect(reactor, "127.0.0.1", slave_port.listening_port.getHost().port, timeout=5)
        clients.append(sm)
        header, body = yield sm.request(21, {})
        assert header.code == 0 and "VipTopic" in fastjson.loads(body)["topicConfigTable"]
        for c in clients:
            c.close()
        clients.clear()
        yield port.stopService()
        assert port.vip_listening_port is None
        again = reactor.listenTCP(vip, protocol.Factory(), interface="127.0.0.1")  # the VIP port is free again
        yield again.stopListening()
    finally:
        for c in clients:
            c.close()
        yield cluster.stop()


@pytest.mark.network
@pytest_twisted.inlineCallbacks
def test_a_vip_port_in_use_fails_the_start(reactor):
    """Like the main endpoint: a VIP endpoint that cannot bind raises from startService, nothing left listening."""
    from types import SimpleNamespace

    from dledger_rocketmq.broker.port import BrokerPort

    taken = reactor.listenTCP(0, protocol.Factory(), interface="127.0.0.1")
    try:
        broker = SimpleNamespace(server=SimpleNamespace(self_id="n0", clock=reactor))
        port = BrokerPort(broker, "tcp:0:interface=127.0.0.1", reactor=reactor,
                          vip_endpoint=f"tcp:{taken.getHost().port}:interface=127.0.0.1")
        with pytest.raises(CannotListenError):
            port.startService()
        assert not port.running and port.vip_listening_port is None and port.listening_port is None
        assert not port._stats_loop.running
        main = (yield port.listening).getHost().port  # it had bound: free again (closing takes a reactor turn)
        for _ in range(100):
            try:
                again = reactor.listenTCP(main, protocol.Factory(), interface="127.0.0.1")
            except CannotListenError:
                yield task.deferLater(reactor, 0.01, lambda: None)
                continue
            yield again.stopListening()
            break
        else:
            raise AssertionError(f"the main endpoint {main} is still bound after the failed start")
    finally:
        yield taken.stopListening()


def test_vip_listen_needs_listen():
    """rocketmq.vipListen without rocketmq.listen: one line at the start."""
    from types import SimpleNamespace

    server = SimpleNamespace(config=SimpleNamespace(auth_mode="none", extras={
        "rocketmq.enabled": True, "rocketmq.vipListen": "tcp:10909"}))
    with pytest.raises(ConfigError) as info:
        check_surfaces(server)
    assert str(info.value) == ("rocketmq.vipListen needs rocketmq.listen (it is a second endpoint of the broker "
                               "port)")


def test_vip_topic_sync_refusal():
    from dledger_rocketmq.broker.port import vip_topic_sync_refusal

    assert vip_topic_sync_refusal(is_master=True, self_id="n0") is None
    reply = vip_topic_sync_refusal(is_master=False, self_id="n2")
    assert reply.code == 1 and reply.remark.startswith("n2 is not the master")
