"""RocketMQ ACL inside a member, in process on virtual time: the log carries it, the port and name server ask it."""

from __future__ import annotations

import json
import stat

import pytest
from dledger_rocketmq.broker.port import BrokerPort, Request
from dledger_rocketmq.broker.port_acl import PortAccess
from dledger_rocketmq.common import acl
from dledger_rocketmq.common.control import KIND_ACL_CONFIG, ControlError, decode_control, encode_metadata
from dledger_rocketmq.namesrv.namesrv import NameServer
from dledger_rocketmq.plugin import anonymous_surface_error, broker_for
from dledger_rocketmq.store.metadata import ACL_FILE, AclTable, BrokerMetadata
from rmq_cluster_util import broker_cluster, master
from twisted.internet.task import Clock

ACL_TEXT = """\
accounts:
- {accessKey: producer1, secretKey: producer-secret, defaultTopicPerm: DENY, topicPerms: [T=PUB]}
- {accessKey: rocketmq-admin, secretKey: admin-secret-1, admin: true}
"""
CONFIG = acl.load_acl_text(ACL_TEXT, "t")
PRODUCER = acl.Credentials("producer1", "producer-secret")
ADMIN = acl.Credentials("rocketmq-admin", "admin-secret-1")


def wait(cluster, d):
    out = []
    d.addBoth(out.append)
    assert cluster.run_until(lambda: bool(out), 10), "no result"
    assert not hasattr(out[0], "getErrorMessage"), out[0]
    return out[0]


def test_the_acl_control_entry_round_trips():
    """Kind 7 carries one ACL object (no name check), up to 1 MiB; decode gives it back."""
    obj = {"acl": CONFIG.to_dict(), "source": "admin", "file": "file:x"}
    entry = decode_control(encode_metadata(KIND_ACL_CONFIG, [obj], 42))
    assert entry.kind == KIND_ACL_CONFIG and entry.configs == (obj,) and entry.timestamp == 42
    with pytest.raises(ControlError, match="exceeds"):
        encode_metadata(KIND_ACL_CONFIG, [{"acl": {"accounts": [], "x": "y" * (1 << 20)}}], 1)


def test_the_acl_is_persisted_private_and_loaded(tmp_path):
    """config/aclConfig.json is written (mode 0600: it holds secret keys) before the applied index, and loads back."""
    meta = BrokerMetadata(tmp_path)
    meta.load()
    assert meta.acl.apply({"acl": CONFIG.to_dict(), "source": "admin", "file": "file:abc"}, 7)
    assert not meta.acl.apply({"acl": CONFIG.to_dict(), "source": "admin", "file": "file:abc"}, 8)  # no change
    written = meta.snapshot()
    names = [n for n, _ in written]
    assert names.index(ACL_FILE) < names.index("consumerOffset.json.dledger")
    meta._write(written)
    assert stat.S_IMODE((tmp_path / "config" / ACL_FILE).stat().st_mode) == 0o600
    again = BrokerMetadata(tmp_path)
    again.load()
    assert again.acl.config == CONFIG and again.acl.file_source == "file:abc" and again.acl.timestamp == 7


def test_a_damaged_acl_file_is_one_line(tmp_path):
    """A damaged aclConfig.json without a .bak stops the load with one line naming it."""
    from dledger_rocketmq.store.metadata import MetadataError

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / ACL_FILE).write_text(json.dumps({"acl": {"accounts": [{"accessKey": "x"}]}}))
    with pytest.raises(MetadataError, match=r"aclConfig.json: damaged \(aclConfig.json: accounts\[0\]: accessKey "
                                            r"and secretKey are required\)"):
        BrokerMetadata(tmp_path).load()
    assert AclTable.from_json(AclTable().to_json()).config is None


def test_an_acl_change_reaches_every_member_through_the_log(tmp_path):
    """Broker.change_acl appends kind 7: every member's table holds it; an admin change keeps the file's tag."""
    cluster = broker_cluster(tmp_path)
    b = master(cluster)
    wait(cluster, b.change_acl(CONFIG, "file:one", "file:one"))
    changed = CONFIG.without_account("producer1")
    wait(cluster, b.change_acl(changed, "admin"))
    assert cluster.run_until(lambda: all(broker_for(s).meta.acl.config == changed for s in cluster.servers.values()),
                             10)
    assert {broker_for(s).meta.acl.file_source for s in cluster.servers.values()} == {"file:one"}
    assert {broker_for(s).meta.acl.source for s in cluster.servers.values()} == {"admin"}


def test_the_master_puts_its_file_in_effect_once(tmp_path):
    """PortAccess.on_master appends the member's file unless the group applied that file already."""
    f = tmp_path / "plain_acl.yml"
    f.write_text(ACL_TEXT)
    cluster = broker_cluster(tmp_path / "c")
    b = master(cluster)
    access = PortAccess(b, acl_file=str(f), enabled=True)
    assert b.meta.acl.config is None and access.config() == CONFIG  # the member's own file until the log has one
    wait(cluster, access.on_master(b))
    assert b.meta.acl.file_source == access.file_source and b.meta.acl.config == CONFIG
    assert access.on_master(b) is None


def request(code, ext, body=b"", credentials=None):
    return Request(code, credentials.sign(ext, body) if credentials else ext, body)


def test_the_port_asks_before_any_handler(tmp_path):
    """BrokerPort.process refuses before the handler runs (unknown codes too) and lets signed requests through."""
    f = tmp_path / "plain_acl.yml"
    f.write_text(ACL_TEXT)
    cluster = broker_cluster(tmp_path / "c")
    b = master(cluster)
    port = BrokerPort(b, "tcp:0", access=PortAccess(b, acl_file=str(f), enabled=True))
    for code, ext in ((215, {"topic": "T"}), (9999, {}), (30, {"topic": "T", "queueId": "0"})):
        reply = port.process(request(code, ext))
        assert reply.code == 1 and "No accessKey is configured" in reply.remark
    assert port.process(request(30, {"topic": "T", "queueId": "0"}, credentials=PRODUCER)).code == 0
    assert port.process(request(9999, {}, credentials=PRODUCER)).code == 3  # then: not supported
    reply = port.process(request(215, {"topic": "T"}, credentials=PRODUCER))
    assert reply.code == 1 and "Need admin permission for request code=215" in reply.remark
    assert port.access.refused == 4


def test_mqadmin_acl_codes_need_the_acl_and_an_admin(tmp_path):
    """Codes 50/51/53 change the ACL through the log (admin only); without aclEnable they say so."""
    f = tmp_path / "plain_acl.yml"
    f.write_text(ACL_TEXT)
    cluster = broker_cluster(tmp_path / "c")
    b = master(cluster)
    port = BrokerPort(b, "tcp:0", access=PortAccess(b, acl_file=str(f), enabled=True))
    new = {"accessKey": "consumer1", "secretKey": "consumer-secret", "defaultGroupPerm": "SUB",
           "topicPerms": "T=SUB"}
    assert "Need admin permission" in port.process(request(50, new, credentials=PRODUCER)).remark
    assert wait(cluster, port.process(request(50, new, credentials=ADMIN))).code == 0
    assert b.meta.acl.config.accounts["consumer1"].perms == {"T": acl.SUB}
    assert wait(cluster, port.process(request(53, {"globalWhiteAddrs": "10.0.0.*"}, credentials=ADMIN))).code == 0
    assert wait(cluster, port.process(request(51, {"accessKey": "consumer1"}, credentials=ADMIN))).code == 0
    assert set(b.meta.acl.config.accounts) == {"producer1", "rocketmq-admin"}
    assert [p.text for p in b.meta.acl.config.global_white] == ["10.0.0.*"]
    bad = port.process(request(50, {**new, "secretKey": "short"}, credentials=ADMIN))  # refused before the log
    assert bad.code == 1 and "longer than 6" in bad.remark
    plain = BrokerPort(b, "tcp:0")
    assert plain.process(request(50, new)).remark == "The broker does not enable acl"


def test_the_name_server_checks_accounts_and_admin_for_registrations():
    """With an ACL the name server refuses unsigned requests and registrations from non-admin accounts."""
    ns = NameServer("tcp:0", reactor=Clock(), acl=lambda: CONFIG)
    assert "No accessKey" in ns.process(request(105, {"topic": "T"})).remark
    assert ns.process(request(105, {"topic": "T"}, credentials=PRODUCER)).code == 17  # no route: it went on
    reply = ns.process(request(103, {"brokerName": "b"}, credentials=PRODUCER))
    assert reply.code == 1 and "Need admin permission for request code=103" in reply.remark
    open_ns = NameServer("tcp:0", reactor=Clock())
    assert open_ns.process(request(105, {"topic": "T"})).code == 17


def test_twistd_namesrv_acl_file_errors_are_one_line(tmp_path):
    """twistd rocketmq-namesrv --acl-file with a bad file: a usage error of one line."""
    from dledger_rocketmq.namesrv.namesrv import Options
    from twisted.python import usage

    f = tmp_path / "bad.yml"
    f.write_text("accounts:\n- {accessKey: x}\n")
    with pytest.raises(usage.UsageError) as info:
        Options().parseOptions(["--listen", "tcp:0:interface=127.0.0.1", "--acl-file", str(f)])
    assert str(info.value).startswith("--acl-file: ") and "\n" not in str(info.value)


@pytest.mark.parametrize("auth, port, ns, acl_on, tls, anon, refused", [
    ("none", True, True, False, False, False, False),   # auth off: Java's behaviour
    ("tls", True, False, False, False, False, True),
    ("secret", False, True, False, False, False, True),  # an open name server too
    ("tls", True, False, True, False, False, False),
    ("tls", True, False, False, True, False, False),     # client certificates
    ("tls", True, True, False, True, False, True),       # ... but the name server is open
    ("tls", True, True, False, False, True, False),      # the explicit opt-out
    ("tls", False, False, False, False, False, False),   # no RocketMQ surface
])
def test_when_a_member_refuses_to_start(auth, port, ns, acl_on, tls, anon, refused):
    """No anonymous writes by accident: authMode on + an open broker port or name server -> one line."""
    why = anonymous_surface_error(auth_mode=auth, broker_port=port, namesrv=ns, acl_enable=acl_on,
                                  tls_client_auth=tls, allow_anonymous=anon)
    assert (why is not None) is refused
    if why:
        assert "rocketmq.aclEnable" in why and "rocketmq.allowAnonymous = true" in why and "\n" not in why
