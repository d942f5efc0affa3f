"""The attacks of issue #13 against a live ``twistd dledger`` group with authentication on (127.0.0.1).

The issue's attacker knows the group name and a member's port and sends well-formed frames with
plausible terms and indexes -- what bounds checks cannot catch: a PUSH TRUNCATE past the end from
the "current leader" (erases every follower), a PUSH APPEND with a commit index past the end (plants
entries), a VOTE with an absurd or a plausible higher term, a HEART_BEAT with a higher term, a
forged LEADERSHIP_TRANSFER.  With ``authMode`` tls or secret each one is refused (NOT_AUTHORIZED,
or no TLS session at all), the stores are byte for byte what they were, the term and leader do not
move, and the group keeps committing.
"""


import pytest
import pytest_twisted

from dledger import messages
from dledger.codes import PushType, ResponseCode
from dledger.entry import Entry
from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, differing_logs, durable_store
from dledger.messages import INT64_MAX
from dledger.security import certs
from dledger.security.guard import ClientCredentials
from dledger.security.tls import client_options, load_ca_certs, load_private_certificate
from dledger.transport.client import RemotingClient

STORE = durable_store()
pytestmark = [pytest.mark.process,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb) is installed")]


def token_of(certdir, name):
    line = next(x for x in (certdir / "clients.txt").read_text().splitlines() if x.startswith(name + " "))
    path = certdir / f"{name}.token"
    path.write_text(line.split()[2] + "\n")
    return str(path)


def secured_group(tmp_path, reactor, mode):
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0", "n1", "n2"], [certs.ClientSpec("ops", "admin"),
                                                    certs.ClientSpec("app1", "write")])
    options = {"authMode": mode, "clientsFile": str(d / "clients.txt")}
    if mode == "tls":
        options.update(tlsCert=str(d / "{selfId}.crt"), tlsKey=str(d / "{selfId}.key"), tlsCa=str(d / "ca.crt"))
        admin = ClientCredentials.for_client("g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-ops.crt"),
                                             tls_key=str(d / "client-ops.key"))
    else:
        options.update(groupSecretFile=str(d / "group.secret"))
        admin = ClientCredentials.for_client("g0", name="ops", token_file=token_of(d, "ops"))
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", reactor=reactor, options=options,
                       client_credentials=admin)
    return group, d


def attackers(reactor, d, mode, impostor):
    """Connections an outsider can make: plain; TLS without a certificate or a write-role client; a member
    credential of ``impostor`` used to speak for another member."""
    out = {"plain": RemotingClient(reactor, timeout=2.0, connect_timeout=2.0)}
    if mode == "tls":
        ca = load_ca_certs(str(d / "ca.crt"))
        out["anonymous TLS"] = RemotingClient(reactor, timeout=2.0, credentials=ClientCredentials(
            "g0", "client", "", None, client_options(None, ca)))
        out["write client"] = RemotingClient(reactor, timeout=2.0, credentials=ClientCredentials.for_client(
            "g0", tls_ca=str(d / "ca.crt"), tls_cert=str(d / "client-app1.crt"), tls_key=str(d / "client-app1.key")))
        priv = load_private_certificate(str(d / f"{impostor}.crt"), str(d / f"{impostor}.key"))
        out["impostor member"] = RemotingClient(reactor, timeout=2.0, credentials=ClientCredentials(
            "g0", "member", impostor, None, client_options(priv, ca)))
    else:
        out["write client"] = RemotingClient(reactor, timeout=2.0, credentials=ClientCredentials.for_client(
            "g0", name="app1", token_file=token_of(d, "app1")))
        out["wrong secret"] = RemotingClient(reactor, timeout=2.0, credentials=ClientCredentials(
            "g0", "member", impostor, b"not-the-group-secret-at-all"))
        out["impostor member"] = RemotingClient(reactor, timeout=2.0, credentials=ClientCredentials(
            "g0", "member", impostor, (d / "group.secret").read_bytes().strip()))
    return out


@pytest.mark.parametrize("mode", ["tls", "secret"])
@pytest_twisted.ensureDeferred
async def test_forged_frames_are_refused_and_change_nothing(tmp_path, reactor, mode):
    """Erase, plant, term bomb, forced election and forged transfer: each refused, stores unchanged, commits go on."""
    group, d = secured_group(tmp_path, reactor, mode)
    admin = group.client(request_timeout=2.0)
    clients = {}
    try:
        leader = (await group.start_and_wait(30)).leader_id
        for i in range(20):
            await admin.append(f"before {i}".encode())

        metas = await group.wait_converged(admin, 20)
        term, end = metas[0].term, metas[0].ledger_end_index
        before = {mid: group.store_checksums(mid) for mid in group.ids}
        followers = [mid for mid in group.ids if mid != leader]
        victim, impostor = followers
        addr = {mid: f"127.0.0.1:{group.members[mid].port}" for mid in group.ids}
        clients = attackers(reactor, d, mode, impostor)

        far = Entry(b"forged", end + 5000, term, 10 ** 6).sealed()
        forged = [
            ("erase", victim, messages.PushEntryRequest(
                group="g0", remote_id=victim, local_id=leader, leader_id=leader, term=term, commit_index=end,
                type=PushType.TRUNCATE, entry=far)),
            ("plant", victim, messages.PushEntryRequest(
                group="g0", remote_id=victim, local_id=leader, leader_id=leader, term=term,
                commit_index=end + 1, type=PushType.APPEND, entry=Entry(b"planted", end + 1, term, 0).sealed())),
            ("term bomb", victim, messages.VoteRequest(
                group="g0", remote_id=victim, local_id=impostor, leader_id=leader, term=INT64_MAX - 1,
                ledger_end_index=end + 10, ledger_end_term=term)),
            ("term bomb 10^30", victim, messages.VoteRequest(
                group="g0", remote_id=victim, local_id=leader, leader_id=leader, term=10 ** 30,
                ledger_end_index=end + 10, ledger_end_term=term)),
            ("forced election", victim, messages.VoteRequest(
                group="g0", remote_id=victim, local_id=leader, leader_id=leader, term=term + 1,
                ledger_end_index=end + 10, ledger_end_term=term)),
            ("heartbeat", victim, messages.HeartBeatRequest(
                group="g0", remote_id=victim, local_id=leader, leader_id=leader, term=term + 1)),
            ("transfer", leader, messages.LeadershipTransferRequest(
                group="g0", remote_id=leader, transfer_id=leader, transferee_id=victim, term=term)),
            ("take leadership", victim, messages.LeadershipTransferRequest(
                group="g0", remote_id=victim, local_id=leader, leader_id=leader, transfer_id=leader,
                transferee_id=victim, term=term)),
        ]
        outcomes = {}
        for who, client in clients.items():
            for what, target, request in forged:
                for binary in ((False, True) if isinstance(request, messages.PushEntryRequest) else (False,)):
                    try:
                        resp = await client.send(addr[target], request, binary=binary)
                        outcomes[(who, what, binary)] = ResponseCode.of(resp.code).name
                    except DLedgerError as exc:
                        outcomes[(who, what, binary)] = f"no session ({exc.code.name})"
        # an authenticated member's out-of-range VOTE is refused by the bounds check (issue #9) when decoded
        refused = ("NOT_AUTHORIZED", "UNEXPECTED_ARGUMENT")
        accepted = {k: v for k, v in outcomes.items() if not (v in refused or v.startswith("no session"))}
        assert all(v != "UNEXPECTED_ARGUMENT" or k[1] == "term bomb 10^30" for k, v in outcomes.items()), outcomes
        assert not accepted, accepted
        assert outcomes and all(k[0] in clients for k in outcomes)
        anonymous = clients["anonymous TLS" if mode == "tls" else "plain"]
        meta = await anonymous.send(addr[victim], messages.MetadataRequest(group="g0", remote_id=victim))
        assert meta.code == ResponseCode.SUCCESS and meta.peers is None and meta.leader_id is None, meta

        after = await group.wait_converged(admin, 10, "the group to answer metadata after the attacks")
        assert (after[0].term, after[0].leader_id) == (term, leader), "a forged frame moved the term or leader"
        assert {mid: group.store_checksums(mid) for mid in group.ids} == before, "a forged frame changed a store"
        for i in range(10):
            await admin.append(f"after {i}".encode())
        metas = await group.wait_converged(admin, 15, "the group to commit after the attacks")
        assert metas[0].committed_index >= end + 10
        refusals = sum(len(group.log_lines(mid, "refused a request from")) for mid in group.ids)
        assert 1 <= refusals <= 30, refusals  # rate-limited: one line per address and code per interval

        for c in clients.values():
            await c.close()
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
        logs = await group.read_logs()
        bodies = [e.body for e in logs[leader].entries if e.body]
        assert bodies == [f"before {i}".encode() for i in range(20)] + [f"after {i}".encode() for i in range(10)]
        assert differing_logs(logs, leader) == []
        assert not any(group.log_lines(mid, "Traceback") for mid in group.ids)
    finally:
        for c in clients.values():
            await c.close()
        group.close()


@pytest_twisted.ensureDeferred
async def test_cli_client_with_and_without_credentials(tmp_path, reactor):
    """dledger append with the admin certificate succeeds; without credentials it exits 1 with NOT_AUTHORIZED
    and a hint; a member log says why it refused."""
    import subprocess
    import sys

    from twisted.internet.threads import deferToThread

    from dledger.launcher import child_env

    group, d = secured_group(tmp_path, reactor, "tls")
    admin = group.client(request_timeout=2.0)
    try:
        await group.start_and_wait(30)
        base = [sys.executable, "-m", "dledger.cli", "append", "--peers", group.peers, "--group", "g0",
                "--body", "hello", "--timeout", "3"]
        creds = ["--tls-ca", str(d / "ca.crt"), "--tls-cert", str(d / "client-app1.crt"),
                 "--tls-key", str(d / "client-app1.key")]
        ok = await deferToThread(subprocess.run, base + creds, env=child_env(), capture_output=True, text=True,
                                 timeout=60)
        assert ok.returncode == 0, ok.stderr
        anon = await deferToThread(subprocess.run, base + ["--tls-ca", str(d / "ca.crt")], env=child_env(),
                                   capture_output=True, text=True, timeout=60)
        assert anon.returncode == 1 and "NOT_AUTHORIZED (430)" in anon.stderr and "--tls-cert" in anon.stderr
        assert anon.stderr.count("\n") == 1, anon.stderr
        lines = [line for mid in group.ids for line in group.log_lines(mid, "refused a request from")]
        assert any("needs the write role" in line for line in lines), lines
        await admin.close()
        assert await group.stop_all() == {mid: 0 for mid in group.ids}
    finally:
        await admin.close()
        group.close()


@pytest.mark.parametrize("options,line", [
    (lambda d: {"authMode": "tls", "tlsCert": str(d / "n1.crt"), "tlsKey": str(d / "n0.key"),
                "tlsCa": str(d / "ca.crt")}, "is not the private key of"),
    (lambda d: {"authMode": "tls", "tlsCert": str(d / "missing.crt"), "tlsKey": str(d / "n0.key"),
                "tlsCa": str(d / "ca.crt")}, "tlsCert: cannot read"),
    (lambda d: {"authMode": "secret", "groupSecretFile": str(d / "ca.crt") + ".nope"}, "groupSecretFile: cannot read"),
], ids=["mismatched key", "missing certificate", "missing secret"])
@pytest_twisted.ensureDeferred
async def test_unusable_credentials_stop_the_member_with_one_line(tmp_path, reactor, options, line):
    """twistd dledger with a wrong key, a missing certificate or secret: one line naming the option, exit 1."""
    d = tmp_path / "certs"
    certs.init_group(d, "g0", ["n0", "n1"])
    group = LocalGroup(tmp_path / "g", n=1, store=STORE, reactor=reactor, options=options(d))
    try:
        group.start()
        assert await group.wait_exit("n0", 30) == 1
        failures = [x for x in group.log_lines("n0") if "could not start" in x]
        assert len(failures) == 1 and line in failures[0], group.log_lines("n0")
        assert not any("Traceback" in x for x in group.log_lines("n0"))
    finally:
        group.close()
