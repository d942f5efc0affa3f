"""Broker registration with name servers and the slave's fetches from its master (golden frames, task.Clock)."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytest_twisted
from conftest import GOLDEN
from dledger_rocketmq.broker import port as port_module
from dledger_rocketmq.broker.port import BrokerPort, Reply, decode_header, encode_command
from dledger_rocketmq.broker.sync import SlaveSync, SyncKind, apply_sync, master_body
from dledger_rocketmq.client.client import RocketMQClient, RocketMQError, client_factory
from dledger_rocketmq.namesrv import registration, routes
from dledger_rocketmq.namesrv.namesrv import NameServer
from dledger_rocketmq.namesrv.registration import MasterFetcher, Registration
from dledger_rocketmq.plugin import broker_for, registration_for
from dledger_rocketmq.store.metadata import BrokerMetadata, topic_config, topic_table
from rmq_cluster_util import settled
from twisted.internet import task
from twisted.internet.defer import fail, succeed
from twisted.internet.error import ConnectionRefusedError
from twisted.test.iosim import FakeTransport, connect

from dledger import plugins
from dledger.testing import wait_until
from dledger.transport.remoting import FrameSplitter, Header

FRAMES = GOLDEN / "frames"


def frame(name: str):
    [f] = FrameSplitter(header_decoder=decode_header).feed((FRAMES / f"{name}.bin").read_bytes())
    return f


# -- pure decisions --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, addrs", [
    ("127.0.0.1:9876", ["127.0.0.1:9876"]),
    ("a:1;b:2", ["a:1", "b:2"]),
    (" a:1 ; ;b:2;", ["a:1", "b:2"]),
    ("", []),
])
def test_parse_namesrv_addrs(text, addrs):
    """namesrvAddr is RocketMQ's ';'-separated host:port list (blanks ignored)."""
    assert registration.parse_namesrv_addrs(text) == addrs


@pytest.mark.parametrize("text", ["localhost", "a:1;b", "a:0", "a:99999", ":9876", "a:x"])
def test_parse_namesrv_addrs_errors(text):
    """A malformed namesrvAddr entry is a one-line ValueError naming it."""
    with pytest.raises(ValueError, match="is not host:port"):
        registration.parse_namesrv_addrs(text)


@pytest.mark.parametrize("is_master, known, delay", [
    (True, False, 30.0),
    (True, True, 30.0),
    (False, True, 30.0),
    (False, False, 2.0),  # a slave without a master asks again soon (RocketMQ: 30 s, apache/rocketmq#7790)
])
def test_next_delay(is_master, known, delay):
    """Registrations every period; a slave that has not learned its master retries every 2 s."""
    assert registration.next_delay(is_master=is_master, master_known=known, period=30.0) == delay


def test_ha_server_addr():
    """haServerAddr is listenPort + 1 on the broker's host, as a 4.9.8 broker reports it."""
    assert registration.ha_server_addr("127.0.0.1:31911") == "127.0.0.1:31912"


@pytest.mark.parametrize("name", ["103-register-broker-master-request", "103-register-broker-slave-request",
                                  "103-register-broker-master-compressed-request",
                                  "103-register-broker-slave-compressed-request",
                                  "103-register-broker-failover-old-master-n0-rejoined-as-slave-oneway-request"])
def test_our_register_request_equals_the_recorded_one(name):
    """From the same topic table our REGISTER_BROKER has the recorded extFields and body, byte for byte."""
    want = frame(name)
    ext = want.header.ext_fields
    compressed = ext["compressed"] == "true"
    decoded = routes.decode_register_body(want.body, compressed=compressed)
    # the broker's table as our metadata holds it: loaded in some other order, written in Java's map order
    table = topic_table({"dataVersion": decoded.data_version,
                         "topicConfigTable": dict(sorted(decoded.topics.items()))}).to_dict()
    got_ext, got_body = registration.register_request(
        cluster=ext["clusterName"], broker_name=ext["brokerName"], broker_addr=ext["brokerAddr"],
        broker_id=int(ext["brokerId"]), data_version=table["dataVersion"],
        topics=list(table["topicConfigTable"].values()), compressed=compressed)
    assert got_body == want.body
    assert got_ext == ext and list(got_ext) == list(ext)  # values and Java's HashMap key order


# -- an in-memory network of name servers and broker ports -------------------------------------------------------

class Net:
    """``connect_client`` over iosim: addresses map to server factories; ``pump()`` moves the bytes."""

    def __init__(self):
        self.servers: dict[str, object] = {}
        self.pumps: list = []
        self.connects = 0

    def connect(self, reactor, host, port, *, timeout=10.0, **kw):
        self.connects += 1
        factory = self.servers.get(f"{host}:{port}")
        if factory is None:
            return fail(ConnectionRefusedError(f"{host}:{port}"))
        client = RocketMQClient(reactor, timeout=timeout)
        cp = client_factory(client).buildProtocol(None)
        sp = factory.buildProtocol(None)
        self.pumps.append(connect(sp, FakeTransport(sp, True), cp, FakeTransport(cp, False), greet=False))
        return succeed(client)

    def pump(self, rounds: int = 10) -> None:
        """Move bytes both ways ``rounds`` times (a reply may trigger the next request)."""
        for _ in range(rounds):
            for p in list(self.pumps):
                p.pump()
                if p.clientIO.disconnected and p.serverIO.disconnected:
                    self.pumps.remove(p)


@pytest.fixture
def net(monkeypatch):
    n = Net()
    monkeypatch.setattr(registration, "connect_client", n.connect)
    return n


def fake_broker(tmp_path, clock, *, addr="127.0.0.1:10911", role="SLAVE", broker_id=1):
    """What Registration uses of a Broker: options, role/broker_id, callbacks, metadata, server state."""
    meta = BrokerMetadata(tmp_path / addr.replace(":", "_"), cluster_name="C", broker_name="g", clock=clock)
    server = SimpleNamespace(clock=clock, running=True, self_id="n0",
                             state=SimpleNamespace(curr_term=1, leader_id="n9"))
    return SimpleNamespace(options=SimpleNamespace(cluster_name="C", broker_name="g", store_host=addr),
                           role=role, broker_id=broker_id, master_callbacks=[], slave_callbacks=[], meta=meta,
                           server=server)


def settle(clock, net, seconds=0.0, step=0.5):
    """Advance the clock ``seconds`` in steps, moving bytes before and after each step."""
    net.pump()
    clock.advance(0)  # calls scheduled for the end of this turn (callLater(0))
    net.pump()
    t = 0.0
    while t < seconds:
        clock.advance(step)
        net.pump()
        t += step
    net.pump()


def test_registration_lifecycle_on_task_clock(tmp_path, net):
    """Register at start, every period, at once on role and topic changes; unregister at stop."""
    clock = task.Clock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    m = fake_broker(tmp_path, clock, addr="10.0.0.1:10911", role="MASTER", broker_id=0)
    s = fake_broker(tmp_path, clock, addr="10.0.0.2:10911")
    rm = Registration(m, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    rs = Registration(s, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    rs.startService()
    settle(clock, net)
    assert rs.registrations == 1 and not rs.fetcher.known()
    settle(clock, net, 2.0)  # no master yet: the slave asks again after 2 s
    assert rs.registrations == 2
    rm.startService()
    settle(clock, net, 2.0)
    assert rs.fetcher.known() and rs.fetcher.master_addr == "10.0.0.1:10911"
    assert ns.table.route("TBW102")["brokerDatas"][0]["brokerAddrs"] == {0: "10.0.0.1:10911", 1: "10.0.0.2:10911"}
    n = rs.registrations
    settle(clock, net, 29.0)
    assert rs.registrations == n  # back to the 30 s period once the master is known
    settle(clock, net, 1.5)
    assert rs.registrations == n + 1
    before = rm.registrations
    m.meta.topics.put(topic_config("NewTopic", 2, 2))
    m.meta.topics.put(topic_config("NewTopic2", 2, 2))
    settle(clock, net)
    assert rm.registrations == before + 1  # two changes, one registration at the end of the turn
    assert ns.table.route("NewTopic2")["queueDatas"][0]["writeQueueNums"] == 2
    # roles swap: the slave's registration at once as id 0; the old master's as a slave
    s.role, s.broker_id, s.server.state.curr_term, s.server.state.leader_id = "MASTER", 0, 2, "n1"
    m.role, m.broker_id, m.server.state.curr_term, m.server.state.leader_id = "SLAVE", 2, 2, "n1"
    for cb in s.master_callbacks:
        cb(s)
    for cb in m.slave_callbacks:
        cb(m)
    settle(clock, net)
    assert ns.table.masters("g") == ["10.0.0.2:10911"]
    assert ns.table.brokers["g"]["brokerAddrs"] == {0: "10.0.0.2:10911", 2: "10.0.0.1:10911"}
    assert rm.fetcher.known() and rm.fetcher.master_addr == "10.0.0.2:10911"
    d = rm.stopService()
    settle(clock, net)
    assert d.called and ns.table.brokers["g"]["brokerAddrs"] == {0: "10.0.0.2:10911"}
    assert "10.0.0.1:10911" not in ns.table.live
    rs.stopService()
    settle(clock, net)
    assert ns.table.brokers == {}


def test_crash_drops_connections_without_unregistering(tmp_path, net):
    """A killed member says no goodbye: its connection closes and the name server drops it at once."""
    clock = task.Clock()
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    m = fake_broker(tmp_path, clock, addr="10.0.0.1:10911", role="MASTER", broker_id=0)
    rm = Registration(m, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    rm.startService()
    settle(clock, net)
    assert ns.table.masters("g") == ["10.0.0.1:10911"]
    codes = []
    real = ns.handle
    ns.handle = lambda conn, header, body: (codes.append(header.code), real(conn, header, body))
    m.server.running = False  # DLedgerServer.crash() stops services with running already False
    rm.stopService()
    settle(clock, net)
    assert codes == [] and ns.table.masters("g") == [] and ns.table.brokers == {}


def test_unreachable_name_server_is_retried_each_period(tmp_path, net):
    """A name server that refuses connections is logged and tried again at the next registration."""
    clock = task.Clock()
    m = fake_broker(tmp_path, clock, role="MASTER", broker_id=0)
    rm = Registration(m, ["127.0.0.1:9876"], period=30.0, reactor=clock)
    rm.startService()
    settle(clock, net)
    assert net.connects == 1 and rm.registrations == 0
    ns = NameServer("tcp:9876", reactor=clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    settle(clock, net, 30.0)
    assert net.connects == 2 and rm.registrations == 1 and ns.table.masters("g") == ["127.0.0.1:10911"]
    rm.stopService()


# -- the slave's fetches (SlaveSync's fetch) -------------------------------------------------------------------

GOLDEN_SYNC = {SyncKind.TOPIC_CONFIG: "021-get-all-topic-config-end-of-run-with-data-response",
               SyncKind.CONSUMER_OFFSET: "043-get-all-consumer-offset-end-of-run-with-data-response",
               SyncKind.DELAY_OFFSET: "045-get-all-delay-offset-end-of-run-with-data-response",
               SyncKind.SUBSCRIPTION_GROUP: "201-get-all-subscriptiongroup-config-end-of-run-with-data-response"}


def bare_port() -> BrokerPort:
    """A broker port without a broker: no extensions (they need one), handlers set by the test."""
    saved = port_module.EXTENSIONS[:]
    port_module.EXTENSIONS.clear()
    try:
        return BrokerPort(SimpleNamespace(), "tcp:0")
    finally:
        port_module.EXTENSIONS[:] = saved


def golden_port(requests: list):
    """A broker port answering GET_ALL_* with the recorded master's bodies (records the codes it got)."""
    port = bare_port()

    def answer(kind):
        def handler(req):
            requests.append(req.code)
            f = frame(GOLDEN_SYNC[kind])
            return Reply(f.header.code, f.header.remark, f.header.ext_fields, f.body)
        return handler
    port.handlers = {int(kind): answer(kind) for kind in GOLDEN_SYNC}
    return port


def test_fetch_waits_for_the_master_address_then_syncs_golden_bodies(tmp_path, net):
    """A slave's sync waits for the master address from the registration answer, then copies the golden tables."""
    clock = task.Clock()
    requests: list[int] = []
    net.servers["10.0.0.1:10911"] = golden_port(requests).factory
    server = SimpleNamespace(clock=clock, state=SimpleNamespace(curr_term=3, leader_id="n1"))
    fetcher = MasterFetcher(server, reactor=clock, timeout=10.0)
    meta = BrokerMetadata(tmp_path / "slave", cluster_name="RaftCluster", broker_name="RaftNode00", clock=clock)
    sync = SlaveSync(meta, fetcher.fetch, clock=clock)
    sync.startService()
    sync.become_slave("n1")
    settle(clock, net, 1.0)
    assert requests == [] and sync.rounds == 0  # no master address yet: nobody is asked
    fetcher.learned("10.0.0.9:10911", (2, "n0"))  # an answer to a registration sent before the change
    settle(clock, net, 1.0)
    assert requests == [] and not fetcher.known()
    fetcher.learned("10.0.0.1:10911", (3, "n1"))
    settle(clock, net, 1.0)
    assert requests == [21, 43, 45, 201] and sync.rounds == 1 and sync.errors == 0
    want = BrokerMetadata(tmp_path / "want", cluster_name="RaftCluster", broker_name="RaftNode00", clock=clock)
    for kind, name in GOLDEN_SYNC.items():
        apply_sync(want, kind, frame(name).body)
    assert meta.topics.to_dict() == want.topics.to_dict() and meta.groups.to_dict() == want.groups.to_dict()
    assert meta.offsets.to_dict() == want.offsets.to_dict()
    assert meta.delay_offsets.to_dict() == want.delay_offsets.to_dict()
    assert net.connects == 1
    settle(clock, net, 10.0)  # the next round reuses the connection
    assert requests[4:] == [21, 43, 45, 201] and net.connects == 1
    sync.stopService()
    fetcher.stop()


def test_fetch_without_a_master_fails_after_the_timeout_and_error_codes_fail(tmp_path, net):
    """No master address within the timeout, or a non-SUCCESS answer, fails the fetch with RocketMQError."""
    clock = task.Clock()
    server = SimpleNamespace(clock=clock, state=SimpleNamespace(curr_term=1, leader_id="n1"))
    fetcher = MasterFetcher(server, reactor=clock, timeout=5.0)
    out = []
    fetcher.fetch(SyncKind.TOPIC_CONFIG).addErrback(out.append)
    clock.advance(5.1)
    assert out and out[0].check(RocketMQError) and "no master address" in out[0].getErrorMessage()
    out.clear()
    fetcher.fetch(SyncKind.CONSUMER_OFFSET).addErrback(out.append)  # same term and leader: no second wait
    assert out and "no master address" in out[0].getErrorMessage()
    port = bare_port()
    port.handlers = {}
    net.servers["10.0.0.1:10911"] = port.factory
    fetcher.learned("10.0.0.1:10911", (1, "n1"))
    out.clear()
    fetcher.fetch(SyncKind.TOPIC_CONFIG).addErrback(out.append)
    settle(clock, net)
    assert out and out[0].value.code == 3  # REQUEST_CODE_NOT_SUPPORTED from a port without the handler
    server.state.curr_term = 2  # a new term: the address must be learned again, fetches wait for it
    waiting = []
    fetcher.fetch(SyncKind.TOPIC_CONFIG).addErrback(waiting.append)
    assert waiting == []
    fetcher.stop()  # the member stops: waiting and later fetches fail at once (a sync round ends quickly)
    out.clear()
    fetcher.fetch(SyncKind.DELAY_OFFSET).addErrback(out.append)
    assert len(waiting) == 1 and out and "stopping" in out[0].getErrorMessage()


# -- a 3-member in-process group with the plugin, a name server, failover ----------------------------------------

def serve_sync(port, broker):
    """Test stand-in for the admin codes' serving side: GET_ALL_* answered from the broker's metadata."""
    for kind in SyncKind:
        port.handlers[int(kind)] = lambda req, k=kind: Reply(0, None, {} if k == SyncKind.TOPIC_CONFIG else None,
                                                             master_body(broker.meta, k))


def group_with_namesrv(tmp_path, net, **extras):
    from dledger.testing import Cluster

    opts = {"rocketmq.enabled": True, "rocketmq.mappedFileSizeConsumeQueue": 1000,
            "rocketmq.namesrvAddr": "127.0.0.1:9876", "rocketmq.brokerName": "RaftNode00",
            "rocketmq.brokerClusterName": "RaftCluster", **extras}
    cluster = Cluster(3, seed=5, plugin_manager=plugins.make_plugin_manager(), store_base_dir=str(tmp_path),
                      extras=opts)
    for k, mid in enumerate(cluster.ids):
        cfg = cluster.configs[mid]
        cluster.configs[mid] = dataclasses.replace(cfg, extras={**cfg.extras,
                                                                "rocketmq.storeHost": f"127.0.0.1:{30911 + k}"})
    ns = NameServer("tcp:9876", reactor=cluster.clock)
    net.servers["127.0.0.1:9876"] = ns.factory
    cluster.start()
    ports = {}
    for k, mid in enumerate(cluster.ids):
        b = broker_for(cluster.servers[mid])
        ports[mid] = BrokerPort(b, "tcp:0")
        serve_sync(ports[mid], b)
        net.servers[f"127.0.0.1:{30911 + k}"] = ports[mid].factory
    return cluster, ns


def run(cluster, net, predicate, timeout=30.0):
    def check():
        net.pump()
        return predicate()
    return cluster.run_until(check, timeout)


def test_group_registers_and_failover_names_exactly_one_new_master(tmp_path, net):
    """In-process group: the master registers as id 0; after its kill the new master is id 0 at once, one master."""
    cluster, ns = group_with_namesrv(tmp_path, net)
    addr = {mid: f"127.0.0.1:{30911 + k}" for k, mid in enumerate(cluster.ids)}

    def master_id():
        found = [mid for mid, s in cluster.servers.items() if broker_for(s).role == "MASTER"]
        return found[0] if len(found) == 1 else None
    assert run(cluster, net, lambda: master_id() is not None and len(ns.table.live) == 3)
    old = master_id()
    assert run(cluster, net, lambda: ns.table.masters("RaftNode00") == [addr[old]])
    addrs = ns.table.route("TBW102")["brokerDatas"][0]["brokerAddrs"]
    assert sorted(addrs.values()) == sorted(addr.values()) and addrs[0] == addr[old]
    broker_for(cluster.servers[old]).meta.topics.put(topic_config("Before", 4, 4))
    assert run(cluster, net, lambda: ns.table.route("Before") is not None, 5)
    slaves = [mid for mid in cluster.ids if mid != old]
    assert run(cluster, net, lambda: all(broker_for(cluster.servers[m]).meta.topics.get("Before") for m in slaves),
               15)
    cluster.crash(old)
    run(cluster, net, lambda: False, 0.1)
    assert addr[old] not in ns.table.live and ns.table.masters("RaftNode00") == []  # connection closed: gone
    assert run(cluster, net, lambda: master_id() is not None)
    new = master_id()
    assert run(cluster, net, lambda: ns.table.masters("RaftNode00") == [addr[new]], 5)
    route = ns.table.route("Before")["brokerDatas"][0]["brokerAddrs"]
    assert route[0] == addr[new] and list(route.values()).count(addr[new]) == 1 and addr[old] not in route.values()
    # the remaining slave learned the new master at once and copies a topic created there
    other = next(m for m in slaves if m != new)
    assert run(cluster, net, lambda: registration_for(cluster.servers[other]).fetcher.master_addr == addr[new], 5)
    broker_for(cluster.servers[new]).meta.topics.put(topic_config("After", 2, 2))
    assert run(cluster, net, lambda: broker_for(cluster.servers[other]).meta.topics.get("After") is not None, 15)
    assert settled(cluster)
    cluster.stop()
    run(cluster, net, lambda: False, 1.0)
    assert ns.table.brokers == {}  # graceful stops unregistered (or closed) every broker


# -- real sockets: a name server on 127.0.0.1 and an in-process group on the real reactor -------------------------

@pytest.mark.network
@pytest_twisted.inlineCallbacks
def test_failover_over_real_sockets(reactor, tmp_path):
    """127.0.0.1: members register with a real name server; after the master's kill the new one is the only id 0."""
    from dledger_rocketmq.client.client import connect as rmq_connect
    from dledger_rocketmq.plugin import namesrv_for

    from dledger.testing import Cluster

    ns = NameServer("tcp:0:interface=127.0.0.1", reactor=reactor)
    ns.startService()
    port = (yield ns.listening).getHost().port
    opts = {"rocketmq.enabled": True, "rocketmq.mappedFileSizeConsumeQueue": 1000,
            "rocketmq.namesrvAddr": f"127.0.0.1:{port}", "rocketmq.brokerName": "RaftNode00",
            "rocketmq.namesrvListen": "tcp:0:interface=127.0.0.1"}  # each member also runs one (unused here)
    cluster = Cluster(3, seed=7, clock=reactor, plugin_manager=plugins.make_plugin_manager(),
                      store_base_dir=str(tmp_path), extras=opts)
    addr = {}
    for k, mid in enumerate(cluster.ids):
        addr[mid] = f"127.0.0.1:{40911 + k}"
        cfg = cluster.configs[mid]
        cluster.configs[mid] = dataclasses.replace(cfg, extras={**cfg.extras, "rocketmq.storeHost": addr[mid]})
    cluster.start()
    client = None
    try:
        for s in cluster.servers.values():
            assert (yield namesrv_for(s).listening).getHost().port > 0

        def master_id():
            found = [mid for mid, s in cluster.servers.items() if broker_for(s).role == "MASTER"]
            return found[0] if len(found) == 1 else None
        yield cluster.when(lambda: master_id() is not None and ns.table.masters("RaftNode00") == [addr[master_id()]]
                           and len(ns.table.live) == 3, 20)
        old = master_id()
        cluster.crash(old)  # its registration connection is aborted, as a killed process's
        yield cluster.when(lambda: addr[old] not in ns.table.live, 5)
        yield cluster.when(lambda: master_id() is not None, 20)
        new = master_id()
        yield cluster.when(lambda: ns.table.masters("RaftNode00") == [addr[new]], 10)
        client = yield rmq_connect(reactor, "127.0.0.1", port, timeout=5)
        header, body = yield client.request(105, {"topic": "TBW102"})
        route = json.loads(body)["brokerDatas"]
        assert header.code == 0 and len(route) == 1
        assert route[0]["brokerAddrs"]["0"] == addr[new] and addr[old] not in route[0]["brokerAddrs"].values()
        assert sorted(route[0]["brokerAddrs"].values()) == sorted(addr[m] for m in cluster.servers)
    finally:
        if client is not None:
            client.close()
        yield cluster.stop()
        yield ns.stopService()


# -- twistd rocketmq-namesrv as a real process ------------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.process
def test_twistd_rocketmq_namesrv_process(tmp_path):
    """`twistd --help` lists rocketmq-namesrv; it serves on 127.0.0.1; bad options and a busy port are one line."""
    twistd = [str(Path(sys.executable).parent / "twistd")]  # the venv's script (what operators run)
    listed = subprocess.run([*twistd, "--help"], capture_output=True, text=True, timeout=60)
    assert "rocketmq-namesrv" in listed.stdout
    bad = subprocess.run([*twistd, "rocketmq-namesrv", "--listen", "bogus:1"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and "is not a server endpoint" in bad.stdout + bad.stderr
    assert "Traceback" not in bad.stdout + bad.stderr
    port = _free_port()
    log = tmp_path / "namesrv.log"
    proc = subprocess.Popen([*twistd, "-n", "--logfile", str(log),
                             "--pidfile", "", "rocketmq-namesrv", "--listen", f"tcp:{port}:interface=127.0.0.1"],
                            cwd=tmp_path)
    try:
        def topic_list():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
                    sock.sendall(encode_command(Header(206, 1, 0, "JAVA", 409, None, None)))
                    data = b""
                    while len(data) < 8 or len(data) < 4 + int.from_bytes(data[:4], "big"):
                        chunk = sock.recv(65536)
                        if not chunk:
                            break
                        data += chunk
                    return list(FrameSplitter(header_decoder=decode_header).feed(data))
            except OSError:
                return None  # not listening yet
        reply = wait_until(topic_list, 20, "the name server to answer on its port", interval=0.1)
        assert reply and reply[0].header.code == 0 and json.loads(reply[0].body) == {"topicList": []}
        busy = subprocess.run([*twistd, "rocketmq-namesrv", "--listen",
                               f"tcp:{port}:interface=127.0.0.1"], capture_output=True, text=True, timeout=60)
        assert busy.returncode != 0 and "already in use" in busy.stdout + busy.stderr
        assert "Traceback" not in busy.stdout + busy.stderr
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.mark.parametrize("key, value, why", [
    ("namesrvAddr", "localhost", "is not host:port"),
    ("namesrvAddr", "127.0.0.1:9876;x:0", "is not host:port"),
    ("registerNameServerPeriod", 0, "not a positive number of milliseconds"),
    ("namesrvListen", "bogus:1", "is not a server endpoint"),
])
def test_bad_registration_options_are_one_line_errors(key, value, why):
    """Bad name-server options fail when the config is read, naming the option and the reason."""
    pm = plugins.make_plugin_manager()
    with pytest.raises(Exception, match=f"rocketmq.{key}.*{why}") as info:
        plugins.resolve_extras({"rocketmq": {key: value}}, pm)
    assert "\n" not in str(info.value)
