"""Helpers of the Spark tests (a unique module name: other test directories import their own `conftest`).

ONE local[2] session per module (fixture `spark`), and live 3-member groups of real twistd processes (`group`).
"""

from pathlib import Path

import pytest

pyspark = pytest.importorskip("pyspark", reason="dledger-spark's tests need pyspark (pip install -e spark)")

from dledger.blocking import BlockingClient  # noqa: E402
from dledger.errors import DLedgerError  # noqa: E402
from dledger.launcher import LocalGroup, durable_store  # noqa: E402
from dledger.testing import wait_until  # noqa: E402 (the Spark tests import it from here)

STORE = durable_store()
MEMBERS = ["n0", "n1", "n2"]


def secure(directory: Path, group: str, auth: str) -> tuple[dict, object, dict[str, str]]:
    """Certificates, secrets and clientsFile for a group: (member options, admin credentials, reader options)."""
    from dledger.security.certs import CA_CERT, CLIENTS_FILE, SECRET_FILE, ClientSpec, cert_paths, init_group
    from dledger.security.guard import ClientCredentials

    init_group(directory, group, MEMBERS, [ClientSpec("admin", "admin"), ClientSpec("reader", "read")])
    tokens = {}
    for line in (directory / CLIENTS_FILE).read_text().splitlines():
        if line and not line.startswith("#"):
            name, _role, token = line.split()
            tokens[name] = directory / f"{name}.token"
            tokens[name].write_text(token + "\n")
    options = {"authMode": auth, "clientsFile": str(directory / CLIENTS_FILE)}
    if auth == "secret":
        options["groupSecretFile"] = str(directory / SECRET_FILE)
        admin = ClientCredentials.for_client(group, name="admin", token_file=str(tokens["admin"]))
        return options, admin, {"clientName": "reader", "tokenFile": str(tokens["reader"])}
    options.update(tlsCert=str(directory / "{selfId}.crt"), tlsKey=str(directory / "{selfId}.key"),
                   tlsCa=str(directory / CA_CERT))
    crt, key = cert_paths(directory, "client", "admin")
    admin = ClientCredentials.for_client(group, tls_ca=str(directory / CA_CERT), tls_cert=str(crt), tls_key=str(key))
    crt, key = cert_paths(directory, "client", "reader")
    return options, admin, {"tlsCa": str(directory / CA_CERT), "tlsCert": str(crt), "tlsKey": str(key)}


class Group:
    """A LocalGroup driven from plain (blocking) test code, with a blocking client.

    ``auth``: None (an open group), ``"tls"`` or ``"secret"`` (docs/security.md): ``dledger certs init`` material
    in ``base_dir/certs`` with an ``admin`` client (the test's own client) and a ``reader`` client of role
    ``read``; :attr:`reader` holds the reader's credentials as data source options.
    """

    def __init__(self, base_dir, name: str = "g0", auth: str | None = None, **kw):
        self.name = name
        self.auth = auth
        self.credentials = None
        self.reader: dict[str, str] = {}
        if auth is not None:
            options, self.credentials, self.reader = secure(Path(base_dir) / "certs", name, auth)
            kw["options"] = {**options, **kw.get("options", {})}
        self.local = LocalGroup(base_dir, n=3, group=name, store=STORE, preset="fast", **kw)
        self.peers = self.local.peers
        self.client: BlockingClient | None = None

    def start(self) -> "Group":
        self.local.start()
        self.client = BlockingClient(self.peers, self.name, timeout=20, credentials=self.credentials)
        self.wait_leader()
        return self

    def leader_meta(self):
        try:
            return self.client.find_leader(timeout=2)
        except DLedgerError:
            return None

    def wait_leader(self, timeout: float = 30.0):
        return wait_until(self.leader_meta, timeout, f"a leader of {self.name}")

    def append(self, bodies) -> int:
        """Append ``bodies`` in batches of 256; the index of the last one."""
        last = -1
        bodies = list(bodies)
        for i in range(0, len(bodies), 256):
            last = self.client.append_batch(bodies[i:i + 256]).index
        return last

    def committed(self) -> list:
        """Every committed non-NOOP entry, read from the leader."""
        meta = self.wait_leader()
        out, index = [], meta.ledger_begin_index
        while index <= meta.committed_index:
            got = self.client.get(index, 4096)
            if not got:
                break
            out.extend(e for e in got if e.index <= meta.committed_index)
            index = got[-1].index + 1
        return out

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
        self.local.close()


@pytest.fixture(scope="module", name="spark")
def spark_fixture():
    """One local[2] SparkSession for the whole module (start-up costs ~5 s and ~1 GB), stopped at the end."""
    from dledger_spark.session import get_session

    session = get_session("local[2]", app_name="dledger-spark-tests")
    yield session
    session.stop()


@pytest.fixture(name="group")
def group_fixture(tmp_path):
    """A started 3-member group g0 (real twistd processes), killed at the end."""
    g = Group(tmp_path / "g0")
    try:
        yield g.start()
    finally:
        g.close()
