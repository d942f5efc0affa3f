"""A member added to a group with mutual TLS (issue #23, the runbook's certificate step), through BlockingClient.

``dledger certs issue DIR --member n3`` signs n3's certificate with the group's CA; n3 starts with
``--join`` and the shared config (``tlsCert = DIR/{selfId}.crt``); an admin client adds it, the leader
promotes it once caught up, and the members then accept n3's certificate as a member's.  A member
certificate for an id the configuration does not hold proves nothing (docs/security.md), so before the
change n3 could not have been a member.
"""

import pytest

from dledger import cli
from dledger.blocking import BlockingClient
from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, durable_store
from dledger.security.certs import local_group_security
from dledger.testing import wait_until

STORE = durable_store()
pytestmark = [pytest.mark.process, pytest.mark.network,
              pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb)")]


def test_a_member_with_a_certificate_from_certs_issue_joins_a_tls_group(tmp_path):
    certs = tmp_path / "certs"
    options, admin = local_group_security(certs, "g0", ["n0", "n1", "n2"], mode="tls")
    group = LocalGroup(tmp_path / "group", n=3, store=STORE, preset="fast", options=options)
    group.start()
    client = BlockingClient(group.peers, "g0", timeout=20, credentials=admin)
    try:
        def leader():
            try:
                return client.find_leader(timeout=3)
            except DLedgerError:
                return None

        wait_until(leader, 60, "a leader reached over TLS")
        for i in range(20):
            client.append(b"before n3 %d" % i)
        assert cli.main(["certs", "issue", str(certs), "--member", "n3"]) == 0
        assert (certs / "n3.crt").exists() and (certs / "n3.key").exists()
        new = group.new_member("n3")
        group.start("n3")
        view = client.add_member("n3", group.address("n3"))
        assert view.role("n3") == "learner"

        def voter():
            return client.members().configuration.is_voter("n3")

        wait_until(voter, 60, "n3 to be promoted")
        r = client.append(b"after n3")
        meta = wait_until(lambda: _caught_up(client, r.index), 30, "n3 to hold the new entry")
        assert meta.committed_index >= r.index and new.running
    finally:
        client.close()
        group.close()


def _caught_up(client, index):
    try:
        meta = client.metadata("n3", timeout=3)
    except DLedgerError:
        return None
    return meta if meta.ledger_end_index >= index else None
