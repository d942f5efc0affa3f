"""BlockingClient (its own reactor in a thread) against a live group with mutual TLS (real twistd processes).

Twisted's TLS layer flushes its writes with ``callLater`` on a clock that defaults to the *global*
reactor; a client on a private reactor whose TLS endpoints did not pass their own clock sent nothing
and timed out (issue #21: the Spark source, which reads through BlockingClient, could not read a TLS group).
"""

import pytest

from dledger.blocking import BlockingClient
from dledger.errors import DLedgerError
from dledger.launcher import LocalGroup, durable_store
from dledger.security.certs import local_group_security
from dledger.testing import wait_until

STORE = durable_store()
pytestmark = [pytest.mark.process, pytest.mark.skipif(STORE is None, reason="no durable store (mmap or lmdb)")]


def test_blocking_client_appends_and_reads_over_mutual_tls(tmp_path):
    """Over TLS with a client certificate, BlockingClient finds the leader, appends and reads back."""
    options, admin = local_group_security(tmp_path / "certs", "g0", ["n0", "n1", "n2"], mode="tls")
    group = LocalGroup(tmp_path, n=3, store=STORE, preset="fast", options=options)
    group.start()
    client = BlockingClient(group.peers, "g0", timeout=10, credentials=admin)
    try:
        def leader():
            try:
                return client.find_leader(timeout=3)
            except DLedgerError:
                return None

        meta = wait_until(leader, 60, "a leader reached over TLS")
        r = client.append(b"over tls")
        [entry] = client.get(r.index)
        assert entry.body == b"over tls" and meta.leader_id in ("n0", "n1", "n2")
    finally:
        client.close()
        group.close()
