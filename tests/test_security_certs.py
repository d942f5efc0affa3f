"""``dledger certs`` and the loading of certificates, keys and secrets: one clear line for every mistake."""

import stat

import pytest
from cryptography import x509
from cryptography.x509.oid import NameOID

from dledger import cli
from dledger.config import make_config
from dledger.errors import ConfigError
from dledger.security.guard import ClientCredentials, ServerGuard

PEERS = "n0-127.0.0.1:1;n1-127.0.0.1:2;n2-127.0.0.1:3"


def subject(path):
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return {k: cert.subject.get_attributes_for_oid(oid)[0].value for k, oid in
            (("O", NameOID.ORGANIZATION_NAME), ("OU", NameOID.ORGANIZATIONAL_UNIT_NAME),
             ("CN", NameOID.COMMON_NAME))}


def test_certs_init_writes_ca_members_clients_secret(tmp_path, capsys):
    """init writes a CA, one certificate per member/client with O/OU/CN, private files 0600, roles and tokens."""
    d = tmp_path / "c"
    assert cli.main(["certs", "init", str(d), "--group", "g0", "--members", "n0,n1,n2",
                     "--clients", "app1,ops:admin"]) == 0
    assert subject(d / "n1.crt") == {"O": "g0", "OU": "member", "CN": "n1"}
    assert subject(d / "client-ops.crt") == {"O": "g0", "OU": "client", "CN": "ops"}
    for name in ("ca.key", "n0.key", "client-app1.key", "group.secret", "clients.txt"):
        assert stat.S_IMODE((d / name).stat().st_mode) == 0o600, name
    lines = [x.split() for x in (d / "clients.txt").read_text().splitlines() if not x.startswith("#")]
    assert [(x[0], x[1]) for x in lines] == [("app1", "write"), ("ops", "admin")]
    assert all(len(x[2]) >= 32 for x in lines)
    assert "wrote 14 files" in capsys.readouterr().out


def test_certs_init_refuses_to_replace_a_ca_and_issue_adds_a_member(tmp_path, capsys):
    """A second init into the same directory exits 2 with one line; issue signs a new member with that CA."""
    d = tmp_path / "c"
    assert cli.main(["certs", "init", str(d), "--group", "g0", "--members", "n0"]) == 0
    ca = (d / "ca.crt").read_bytes()
    assert cli.main(["certs", "init", str(d), "--group", "g0", "--members", "n0"]) == 2
    err = capsys.readouterr().err
    assert "exists" in err and err.count("\n") == 1
    assert cli.main(["certs", "issue", str(d), "--member", "n3"]) == 0
    assert (d / "ca.crt").read_bytes() == ca and subject(d / "n3.crt")["CN"] == "n3"
    assert cli.main(["certs", "issue", str(tmp_path / "nowhere"), "--client", "x"]) == 2
    assert cli.main(["certs", "init", str(d / "x"), "--group", "g0", "--members", "n0,bad-id"]) == 2
    assert cli.main(["certs", "init", str(d / "y"), "--group", "g0", "--members", "n0", "--clients", "a:root"]) == 2


@pytest.fixture
def certdir(tmp_path):
    d = tmp_path / "c"
    assert cli.main(["certs", "init", str(d), "--group", "g0", "--members", "n0,n1,n2", "--clients", "app1"]) == 0
    return d


def cfg(d, **kw):
    base = dict(auth_mode="tls", tls_cert=str(d / "{selfId}.crt"), tls_key=str(d / "{selfId}.key"),
                tls_ca=str(d / "ca.crt"))
    return make_config(group="g0", self_id="n0", peers=PEERS, **{**base, **kw})


@pytest.mark.parametrize("change,message", [
    (lambda d: {"tls_cert": str(d / "missing.crt")}, "tlsCert: cannot read"),
    (lambda d: {"tls_key": str(d / "n1.key")}, "is not the private key of"),
    (lambda d: {"tls_key": str(d / "n0.crt")}, "tlsKey:"),
    (lambda d: {"tls_ca": str(d / "n0.key")}, "tlsCa:"),
    (lambda d: {"auth_mode": "secret", "group_secret_file": str(d / "nope")}, "groupSecretFile: cannot read"),
    (lambda d: {"clients_file": str(d / "group.secret")}, "clientsFile:"),
])
def test_unusable_credential_files_are_one_config_error_line(certdir, change, message):
    """A missing, mismatched or wrong file stops the member with one ConfigError line naming the option."""
    with pytest.raises(ConfigError) as err:
        config = cfg(certdir, **change(certdir))
        ServerGuard.from_config(config, None)
        ClientCredentials.for_member(config)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_no_guard_without_tls_or_authentication(certdir):
    """authMode=none without tlsCert: no guard, no credentials (the plain, Java-compatible port)."""
    config = make_config(group="g0", self_id="n0", peers=PEERS)
    assert ServerGuard.from_config(config, None) is None and ClientCredentials.for_member(config) is None
    guard = ServerGuard.from_config(cfg(certdir, auth_mode="none"), None)
    assert guard is not None and guard.tls_options is not None and not guard.enforcing
