"""mqadmin 4.9.8 against a real RocketMQ 4.9.8 broker group and against ours, command by command (slow).

A real Java NameServer and a real Java broker (DLedger mode, from ../shared/javakit) beside our name server
and a 3-member group of ours; the Java broker registers with both name servers (a real Java broker
registering with ours).  The same data goes to each (messages with keys and a unique key, a batch, a
consumer's heartbeat, pulls and an offset), then every mqadmin command of docs/rocketmq.md's table runs as
its own process against each: the exit status must be the same, neither may print a stack trace, and the
fields (column heads of ``#`` lines, ``Key:`` labels) must be the same.  Marked slow: every command is about
40 JVM starts, so `make test` compares a bounded set (``BOUNDED``) and ``-m slow`` / ``DLEDGER_SLOW=1`` all.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import pytest_twisted
from dledger_rocketmq.client.client import connect
from dledger_rocketmq.tools.bench_java import broker_ports
from dledger_rocketmq.tools.localgroup import wait_for_master
from test_rmq_java_process import (
    GROUP,
    KIT,
    RMQ_JAVA,
    TOPIC,
    LogFile,
    broker_group,
    cluster_brokers,
    route_master,
    start_java_namesrv,
    start_namesrv,
    stop_child,
    uniq_key,
)
from twisted.internet import task, utils

from dledger.launcher import child_env, free_ports

pytestmark = [
    pytest.mark.process,
    pytest.mark.slow,
    pytest.mark.skipif(not RMQ_JAVA.exists(), reason=f"the Java kit is not at {KIT} (set DLEDGER_JAVAKIT)"),
]

MQADMIN = KIT / "bin" / "mqadmin"


#: What `make test` compares (bounded: two JVM starts per command, ~4 s each); with -m slow (make soak) or
#: DLEDGER_SLOW=1, every command of docs/rocketmq.md's table.  One command per output shape: a table with
#: ``#`` heads (clusterList), ``Key: value`` labels (brokerStatus), a message view (queryMsgById).  The rest
#: of the table is checked against our group in one JVM by test_rmq_java_process.py in every run.
BOUNDED = ("clusterList", "brokerStatus", "queryMsgById")


def every_command(request) -> bool:
    return "slow" in (request.config.getoption("markexpr") or "") or bool(os.environ.get("DLEDGER_SLOW"))


#: Labels whose value names the store path or the machine: compared by name up to the path.
PATH_KEYS = re.compile(r"^(commitLogDiskRatio)_/.*$")


def fields(text: str) -> set[str]:
    """The field names of an mqadmin output: ``#`` column heads and ``Label:`` / ``label : value`` keys."""
    out: set[str] = set()
    for line in text.splitlines():
        line = line.rstrip()
        if line.startswith("#"):
            out.update(c.strip() for c in re.split(r"\s{2,}|\s(?=#)", line) if c.strip().lstrip("#"))
            continue
        # ``:`` then a value, or nothing: a 4.9.8 broker prints ``getFoundTps : `` (blank) until its first
        # one-minute stats sample, and the line's trailing blanks were stripped above
        m = re.match(r"^([A-Za-z][A-Za-z0-9_ ./-]*?)\s*:(?:\s|$)", line)
        if m and not line.startswith(("\tat ", "Caused by")):
            key = PATH_KEYS.sub(r"\1_<path>", m.group(1).strip())
            out.add(key)
    return out


async def mqadmin(reactor, tmp_path: Path, *args: str) -> tuple[int, str]:
    env = child_env({"RMQ_LOG_ROOT": str(tmp_path / "rmq-logs"), "RMQ_HEAP": "-Xms32m -Xmx192m"})
    d = utils.getProcessOutputAndValue(str(MQADMIN), list(args), env=env, path=str(tmp_path), reactor=reactor)
    d.addTimeout(90, reactor)
    out, err, code = await d
    return code, (out + err).decode(errors="replace")


async def prepare(reactor, host_port: int, uniq: str):
    """The same data on a broker: 3 keyed messages (one with ``uniq``), a batch of 5, a consumer's heartbeat,
    a pull and an offset; (the first message's offset msgId, the client: its connection keeps the heartbeat)."""
    c = await connect(reactor, "127.0.0.1", host_port, timeout=5, producer_group="java_admin_pg")
    try:
        sent = await c.send(TOPIC, b"admin-0", tags="TagA", keys="admin-key", queue_id=1,
                            properties={"UNIQ_KEY": uniq})
        await c.send(TOPIC, b"admin-1", keys="admin-key", queue_id=1)
        await c.send(TOPIC, b"admin-2", queue_id=1)
        await c.send_batch(TOPIC, [b"b%d" % i for i in range(5)], queue_id=2)
        heartbeat = {"clientID": "127.0.0.1@java-admin", "producerDataSet": [{"groupName": "java_admin_pg"}],
                     "consumerDataSet": [{"groupName": GROUP, "consumeType": "CONSUME_PASSIVELY",
                                          "messageModel": "CLUSTERING",
                                          "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "unitMode": False,
                                          "subscriptionDataSet": [{"topic": TOPIC, "subString": "*", "tagsSet": [],
                                                                   "codeSet": [], "subVersion": 1,
                                                                   "classFilterMode": False,
                                                                   "expressionType": "TAG"}]}]}
        header, _ = await c.request(34, {}, json.dumps(heartbeat).encode())
        assert header.code == 0, header.remark
        # clients heartbeat every 30 s; a broker forgets a silent one after 120 s (the commands take minutes)
        beat = task.LoopingCall(lambda: c.request(34, {}, json.dumps(heartbeat).encode()).addErrback(lambda _: None))
        beat.clock = reactor
        beat.start(20.0, now=False)
        c.heartbeat_loop = beat
        await c.pull(GROUP, TOPIC, 1, 0, 32)
        await c.commit_offset(GROUP, TOPIC, 1, 2)
        return sent.msg_id, c
    except Exception:
        c.close()
        raise


def commands(ns: str, cluster: str, addr: str, msg_id: str, uniq: str) -> list[tuple[str, ...]]:
    """docs/rocketmq.md's mqadmin commands (consumerStatus and the ACL commands aside: see the docs)."""
    return [
        ("clusterList", "-n", ns), ("topicList", "-n", ns), ("topicRoute", "-n", ns, "-t", TOPIC),
        ("updateTopic", "-n", ns, "-c", cluster, "-t", "AdminNewTopic", "-r", "2", "-w", "2"),
        ("updateSubGroup", "-n", ns, "-c", cluster, "-g", "admin_sg"),
        ("topicStatus", "-n", ns, "-t", TOPIC), ("brokerStatus", "-n", ns, "-b", addr),
        ("consumerProgress", "-n", ns, "-g", GROUP), ("consumerConnection", "-n", ns, "-g", GROUP),
        ("producerConnection", "-n", ns, "-g", "java_admin_pg", "-t", TOPIC),
        ("queryMsgById", "-n", ns, "-i", msg_id), ("queryMsgByKey", "-n", ns, "-t", TOPIC, "-k", "admin-key"),
        ("queryMsgByUniqueKey", "-n", ns, "-t", TOPIC, "-i", uniq), ("statsAll", "-n", ns),
        ("brokerConsumeStats", "-n", ns, "-b", addr), ("topicClusterList", "-n", ns, "-t", TOPIC),
        ("deleteSubGroup", "-n", ns, "-c", cluster, "-g", "admin_sg"),
        ("deleteTopic", "-n", ns, "-c", cluster, "-t", "AdminNewTopic"),
    ]


@pytest.mark.parametrize("text, expected", [
    ("#Cluster Name  #Broker Name  #BID\n", {"#Cluster Name", "#Broker Name", "#BID"}),
    ("putTps                          : 1.0 2.0\n", {"putTps"}),
    # a Java broker before its first stats sample: the key with a blank value (stripped: nothing after ':')
    ("getFoundTps                     :   \n", {"getFoundTps"}),
    ("\tat org.apache.rocketmq.X.y(X.java:1)\n", set()),
])
def test_fields_of_an_mqadmin_output(text, expected):
    assert fields(text) == expected


@pytest_twisted.ensureDeferred
async def test_mqadmin_on_a_real_java_group_and_on_ours_gives_the_same_fields(tmp_path, reactor, capsys, request):
    """Each mqadmin command: the same exit status and the same fields on a real 4.9.8 group and on ours; the Java
    broker also registered with our name server."""
    namesrv_port, java_ns_port, *rest = free_ports(5)
    ports = dict(zip(["n0", "n1", "n2"], rest, strict=True))
    namesrv, java_ns = f"127.0.0.1:{namesrv_port}", f"127.0.0.1:{java_ns_port}"
    jport, dport = broker_ports()
    store = tmp_path / "java-store"
    conf = tmp_path / "broker.conf"
    conf.write_text("\n".join([
        "brokerClusterName=JavaCluster", "brokerName=RaftNode00", f"listenPort={jport}",
        f"namesrvAddr={java_ns};{namesrv}", f"storePathRootDir={store}", f"storePathCommitLog={store}/commitlog",
        "enableDLegerCommitLog=true", "dLegerGroup=RaftNode00", f"dLegerPeers=n0-127.0.0.1:{dport}",
        "dLegerSelfId=n0", "sendMessageThreadPoolNums=4", "autoCreateTopicEnable=true",
        "mappedFileSizeCommitLog=134217728", "mappedFileSizeConsumeQueue=600000", "brokerIP1=127.0.0.1",
        "brokerIP2=127.0.0.1", "registerNameServerPeriod=10000", ""]))
    group = broker_group(tmp_path / "ours", namesrv, ports, name="broker-ours",
                         **{"plugins.rocketmq.registerNameServerPeriod": 2000})
    (tmp_path / "ours").mkdir(exist_ok=True)
    admin = group.client(request_timeout=0.3)
    ns, ns_proc = start_namesrv(reactor, group, tmp_path, namesrv_port)
    jns, jns_proc = start_java_namesrv(reactor, tmp_path, java_ns_port)
    jb = LogFile(tmp_path / "java-broker.log")
    env = child_env({"RMQ_LOG_ROOT": str(tmp_path / "rmq-logs"), "RMQ_HEAP": "-Xms128m -Xmx256m "
                     "-XX:MaxDirectMemorySize=256m"})
    jb_proc = reactor.spawnProcess(jb, str(KIT / "bin" / "mqbroker"), [str(KIT / "bin" / "mqbroker"), "-c",
                                                                        str(conf)], env=env, path=str(tmp_path))
    clients = []
    try:
        await group.start_and_wait(60)
        master = await wait_for_master(group, admin, ports, topic=TOPIC, body=b"warm-up")

        async def java_master():
            try:
                c = await connect(reactor, "127.0.0.1", jport, timeout=2, default_topic_queue_nums=4)
            except Exception:
                return False
            try:
                await c.send(TOPIC, b"warm-up", queue_id=0)
                return True
            except Exception:
                return False
            finally:
                c.close()
        await group.wait_for(java_master, 120, "the Java broker to take a send", interval=0.5)
        for port in (namesrv_port, java_ns_port):
            await group.wait_for(lambda p=port: route_master(reactor, p, TOPIC), 60, "the topic's routes")
        # a real Java broker registered with our name server
        await group.wait_for(lambda: _has(cluster_brokers(reactor, namesrv_port), "RaftNode00"), 60,
                             "the Java broker on our name server")

        uniq_ours = uniq_key(int(reactor.seconds() * 1000) - 10, 1)
        ours_id, c1 = await prepare(reactor, ports[master], uniq_ours)
        clients.append(c1)
        uniq_java = uniq_key(int(reactor.seconds() * 1000) - 10, 2)
        java_id, c2 = await prepare(reactor, jport, uniq_java)
        clients.append(c2)
        targets = {
            "java": commands(java_ns, "JavaCluster", f"127.0.0.1:{jport}", java_id, uniq_java),
            "ours": commands(namesrv, "DefaultCluster", f"127.0.0.1:{ports[master]}", ours_id, uniq_ours),
        }
        report, problems = [], []
        everything = every_command(request)
        for java_cmd, our_cmd in zip(targets["java"], targets["ours"], strict=True):
            if not everything and java_cmd[0] not in BOUNDED:
                continue
            jcode, jout = await mqadmin(reactor, tmp_path, *java_cmd)
            ocode, oout = await mqadmin(reactor, tmp_path, *our_cmd)
            name = java_cmd[0]
            jf, of = fields(jout), fields(oout)
            same = jcode == ocode and jf == of and "\tat org.apache" not in oout
            report.append(f"{name:22s} exit {jcode}/{ocode} fields {'same' if jf == of else 'DIFFER'}")
            if not same:
                problems.append(f"{name}: exit java {jcode} ours {ocode}; only java {sorted(jf - of)}; "
                                f"only ours {sorted(of - jf)}\n--- java\n{jout[-1500:]}\n--- ours\n{oout[-1500:]}")
        with capsys.disabled():
            print("\nmqadmin, real 4.9.8 group vs ours:\n  " + "\n  ".join(report), flush=True)
        assert not problems, "\n\n".join(problems)
    finally:
        for c in clients:
            c.heartbeat_loop.stop()
            c.close()
        await admin.close()
        await group.stop_all()
        group.close()
        await stop_child(jb, jb_proc)
        await stop_child(ns, ns_proc)
        await stop_child(jns, jns_proc)


async def _has(brokers_d, name: str) -> bool:
    return name in await brokers_d

