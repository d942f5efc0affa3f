"""Real processes: RocketMQ ACL on a secured broker group (issue #21 items 1 and 2).

A 3-member ``twistd dledger`` group with ``authMode = "tls"`` and the broker
plugin with ``rocketmq.aclEnable`` (a RocketMQ 4.x plain_acl.yml).  On main
before the ACL an unsigned ``send`` was stored on every member and a raw
DELETE_TOPIC_IN_BROKER (215) without credentials answered 0; here both are
refused with RocketMQ's answer (code 1, ``AclException`` remark), signed ones
go through, an ACL change made with mqadmin's code 50 goes through the log
and the next master (after a SIGKILL) enforces it.  A member whose broker port
would be anonymous while ``authMode`` is on refuses to start with one line.
"""

from __future__ import annotations

import pytest
import pytest_twisted
from dledger_rocketmq.acl import Credentials
from dledger_rocketmq.client import RocketMQError, connect
from dledger_rocketmq.localgroup import broker_port_args

from dledger.launcher import LocalGroup, durable_store, free_ports
from dledger.security import certs
from dledger.security.guard import ClientCredentials

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]

TOPIC = "AclTopic"
PRODUCER = Credentials("producer1", "producer-secret")
ADMIN = Credentials("rocketmq-admin", "admin-secret-1")
LATER = Credentials("added-later", "added-later-secret")
PLAIN_ACL = f"""\
# a RocketMQ 4.x plain_acl.yml
globalWhiteRemoteAddresses:

accounts:
- accessKey: {PRODUCER.access_key}
  secretKey: {PRODUCER.secret_key}
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - {TOPIC}=PUB|SUB

- accessKey: {ADMIN.access_key}
  secretKey: {ADMIN.secret_key}
  admin: true
"""


def secured_options(tmp_path, **extra):
    """authMode tls (certificates from ``dledger certs init``) and the broker plugin with the given options."""
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0", "n1", "n2"], [certs.ClientSpec("ops", "admin")])
    acl_file = tmp_path / "plain_acl.yml"
    acl_file.write_text(PLAIN_ACL)
    options = {"authMode": "tls", "clientsFile": str(d / "clients.txt"), "tlsCert": str(d / "{selfId}.crt"),
               "tlsKey": str(d / "{selfId}.key"), "tlsCa": str(d / "ca.crt"),
               "plugins.rocketmq.enabled": True, "plugins.rocketmq.masterWaitTimeout": 10.0,
               **{f"plugins.rocketmq.{k}": v for k, v in extra.items()}}
    admin = ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-ops.crt"),
                                         tls_key=str(d / "client-ops.key"))
    return options, admin, acl_file


async def answer(reactor, port: int, code: int, ext: dict, body: bytes = b"", credentials=None):
    """One raw request to a broker port: (code, remark) of the reply."""
    c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=credentials)
    try:
        header, _ = await c.request(code, ext, body)
        return header.code, header.remark
    finally:
        c.close()


async def master_of(group, admin, ports, credentials, live=None) -> str:
    """The member whose broker takes a signed send (the master)."""
    async def probe():
        meta = await group.wait_for_leader(admin, 30)
        mid = meta.leader_id
        if live is not None and mid not in live:
            return None
        try:
            c = await connect(group.reactor, "127.0.0.1", ports[mid], timeout=2.0, credentials=credentials)
        except Exception:
            return None
        try:
            await c.send(TOPIC, b"probe", queue_id=0)
        except Exception:
            return None
        finally:
            c.close()
        return mid
    return await group.wait_for(probe, 60, "a master broker taking a signed send", interval=0.1)


async def max_offset(reactor, port: int) -> int:
    c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=ADMIN)
    try:
        return await c.max_offset(TOPIC, 0)
    finally:
        c.close()


@pytest_twisted.ensureDeferred
async def test_a_secured_group_refuses_unsigned_requests_and_takes_signed_ones(tmp_path, reactor):
    """Unsigned send and raw 215 refused (code 1, AclException remark), signed ones accepted; an ACL change
    through the log is enforced by the next master."""
    ports = dict(zip(["n0", "n1", "n2"], free_ports(3), strict=True))
    options, creds, acl_file = secured_options(tmp_path, aclEnable=True, aclFile=str(acl_file_path(tmp_path)))
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", member_args=broker_port_args(ports),
                       options=options, client_credentials=creds)
    admin = group.client(request_timeout=0.5)
    try:
        await group.start_and_wait(30)
        master = await master_of(group, admin, ports, PRODUCER)
        port = ports[master]
        before = await max_offset(reactor, port)

        # Anonymous: the two requests issue #21 found accepted.
        with pytest.raises(RocketMQError) as info:
            c = await connect(reactor, "127.0.0.1", port, timeout=5.0)
            try:
                await c.send(TOPIC, b"anonymous", queue_id=0)
            finally:
                c.close()
        assert info.value.code == 1 and "AclException: No accessKey is configured" in str(info.value)
        code, remark = await answer(reactor, port, 215, {"topic": TOPIC})
        assert code == 1 and "AclException: No accessKey is configured" in remark
        # Signed by an account without the permission: refused too.
        code, remark = await answer(reactor, port, 215, {"topic": TOPIC}, credentials=PRODUCER)
        assert code == 1 and "Need admin permission for request code=215, but accessKey=producer1" in remark
        code, remark = await answer(reactor, port, 310, {"a": "pg", "b": "Elsewhere", "c": "TBW102", "d": "4",
                                                         "e": "0", "f": "0", "g": "0", "h": "0", "i": "",
                                                         "j": "0", "k": "false", "m": "false"},
                                    b"x", credentials=PRODUCER)
        assert code == 1 and "No default permission for topic:Elsewhere" in remark
        assert await max_offset(reactor, port) == before, "a refused send was stored"

        # Signed and permitted: stored.
        c = await connect(reactor, "127.0.0.1", port, timeout=5.0, credentials=PRODUCER)
        try:
            r = await c.send(TOPIC, b"signed", queue_id=0)
        finally:
            c.close()
        assert r.queue_offset == before
        assert await max_offset(reactor, port) == before + 1

        # mqadmin updateAclConfig (50) by the admin account: through the log, on every member.
        code, remark = await answer(reactor, port, 50, {"accessKey": LATER.access_key,
                                                        "secretKey": LATER.secret_key,
                                                        "topicPerms": f"{TOPIC}=PUB"}, credentials=ADMIN)
        assert (code, remark) == (0, None)
        await group.wait_for(lambda: all(group.log_lines(mid, "ACL from log index") for mid in group.ids)
                             and all(len(group.log_lines(mid, "ACL from log index")) >= 2 for mid in group.ids),
                             30, "every member to apply both ACL entries")

        # The next master enforces the same ACL (the change included).
        group.kill(master)
        live = set(group.ids) - {master}
        new_master = await master_of(group, admin, ports, LATER, live=live)
        assert new_master != master
        code, remark = await answer(reactor, ports[new_master], 215, {"topic": TOPIC})
        assert code == 1 and "No accessKey is configured" in remark
        code, remark = await answer(reactor, ports[new_master], 215, {"topic": TOPIC}, credentials=LATER)
        assert code == 1 and "Need admin permission" in remark
        code, remark = await answer(reactor, ports[new_master], 215, {"topic": TOPIC}, credentials=ADMIN)
        assert code == 0, remark
        refusals = [line for mid in live for line in group.log_lines(mid, "rocketmq port refused request 215")]
        assert refusals, "refusals are logged"
    finally:
        await admin.close()
        await group.stop_all()
        group.close()


def acl_file_path(tmp_path):
    return tmp_path / "plain_acl.yml"


@pytest.mark.parametrize("extra, starts", [
    ({}, False),
    ({"allowAnonymous": True}, True),
])
@pytest_twisted.ensureDeferred
async def test_an_anonymous_broker_port_on_an_authenticated_member_refuses_to_start(tmp_path, reactor, extra,
                                                                                     starts):
    """authMode tls + a broker port without aclEnable/tlsClientAuth: one line naming the options, exit 1;
    with rocketmq.allowAnonymous = true the member starts."""
    ports = {"n0": free_ports(1)[0]}
    options, creds, _ = secured_options(tmp_path, **extra)
    group = LocalGroup(tmp_path, n=1, store=STORE, preset="fast", member_args=broker_port_args(ports),
                       options=options, client_credentials=creds)
    try:
        group.start()
        if starts:
            await group.wait_for(lambda: group.log_lines("n0", "RocketMQ broker port on"), 30, "the broker port")
            assert group.members["n0"].running
            return
        status = await group.wait_exit("n0", 30)
        assert status == 1
        lines = group.log_lines("n0", "rocketmq.aclEnable")
        assert len(lines) == 1, group.log_lines("n0")
        assert "rocketmq.allowAnonymous = true" in lines[0] and "authMode is 'tls'" in lines[0]
        assert not group.log_lines("n0", "Traceback")
    finally:
        await group.stop_all()
        group.close()
