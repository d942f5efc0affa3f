"""The security decisions as tables: which code needs which credential, claims, certificates, the secret
handshake's MACs, the credential files and config options (issue #13).  Pure functions, no I/O."""

import pytest

from dledger.codes import RequestCode
from dledger.config import make_config
from dledger.errors import ConfigError
from dledger.security import policy, secret
from dledger.security.policy import Identity, Verdict, decide, decide_request, identity_from_subject

MEMBER = Identity.member("n1")
READ, WRITE, ADMIN = Identity.client("r", "read"), Identity.client("w", "write"), Identity.client("a", "admin")
ANON = Identity.anonymous()
ANON_WRITE = Identity.anonymous("write")
C = RequestCode

# (code, identity, verdict) with authentication on
TABLE = [
    (C.VOTE, MEMBER, Verdict.ALLOW), (C.HEART_BEAT, MEMBER, Verdict.ALLOW), (C.PUSH, MEMBER, Verdict.ALLOW),
    (C.PULL, MEMBER, Verdict.ALLOW), (C.INSTALL_SNAPSHOT, MEMBER, Verdict.ALLOW),
    (C.LEADERSHIP_TRANSFER, MEMBER, Verdict.ALLOW), (C.APPEND, MEMBER, Verdict.ALLOW),
    (C.VOTE, ADMIN, Verdict.DENY), (C.PUSH, ADMIN, Verdict.DENY), (C.HEART_BEAT, WRITE, Verdict.DENY),
    (C.VOTE, ANON, Verdict.DENY), (C.PUSH, ANON_WRITE, Verdict.DENY),
    (C.METADATA, READ, Verdict.ALLOW), (C.GET, READ, Verdict.ALLOW), (C.APPEND, READ, Verdict.DENY),
    (C.APPEND, WRITE, Verdict.ALLOW), (C.GET, WRITE, Verdict.ALLOW), (C.LEADERSHIP_TRANSFER, WRITE, Verdict.DENY),
    (C.LEADERSHIP_TRANSFER, ADMIN, Verdict.ALLOW), (C.APPEND, ADMIN, Verdict.ALLOW),
    (C.METADATA, ANON, Verdict.REDACT), (C.GET, ANON, Verdict.DENY), (C.APPEND, ANON, Verdict.DENY),
    (C.APPEND, ANON_WRITE, Verdict.ALLOW), (C.METADATA, ANON_WRITE, Verdict.ALLOW),
    (52000, ADMIN, Verdict.DENY), (52000, ANON, Verdict.DENY), (52000, MEMBER, Verdict.ALLOW),
    # membership (issue #23): list and changes need the admin role
    (C.MEMBERS, ADMIN, Verdict.ALLOW), (C.MEMBERS, WRITE, Verdict.DENY), (C.MEMBERS, READ, Verdict.DENY),
    (C.MEMBERS, ANON_WRITE, Verdict.DENY), (C.MEMBERS, MEMBER, Verdict.ALLOW),
]


@pytest.mark.parametrize("code,identity,verdict", TABLE)
def test_which_code_needs_which_credential(code, identity, verdict):
    """Each (request code, identity) pair gets the verdict of the table; unknown codes are member-only."""
    assert decide("tls", code, identity).verdict is verdict
    assert decide("secret", code, identity).verdict is verdict


@pytest.mark.parametrize("code", [*C, 52000, 0, -1])
def test_auth_mode_none_allows_everything(code):
    """authMode=none is Java's behaviour: every code from anyone."""
    assert decide("none", code, ANON).verdict is Verdict.ALLOW


PLUGIN_TABLE = [  # (code, the role its handler declares, identity, verdict) with authentication on
    (55000, "read", READ, Verdict.ALLOW), (55000, "read", ANON, Verdict.DENY), (55000, "read", MEMBER, Verdict.ALLOW),
    (55001, "write", READ, Verdict.DENY), (55001, "write", WRITE, Verdict.ALLOW), (55001, "write", ANON_WRITE,
                                                                                    Verdict.ALLOW),
    (55002, "admin", WRITE, Verdict.DENY), (55002, "admin", ADMIN, Verdict.ALLOW),
    (55003, "member", ADMIN, Verdict.DENY), (55003, "member", MEMBER, Verdict.ALLOW),
    (55004, None, ADMIN, Verdict.DENY), (55004, None, MEMBER, Verdict.ALLOW),  # no plugin serves it: member-only
    (52000, "read", READ, Verdict.DENY),  # outside the plugins' range a declared role counts for nothing
]


@pytest.mark.parametrize("code,role,identity,verdict", PLUGIN_TABLE)
def test_plugin_request_codes_need_the_role_their_handler_declares(code, role, identity, verdict):
    """A plugin's request code needs its handler's role; a code no plugin serves is member-only."""
    assert decide("tls", code, identity, role).verdict is verdict
    assert decide("secret", code, identity, role).verdict is verdict


@pytest.mark.parametrize("ids,identity,refused", [
    ({}, READ, False), (dict(remote_id="n0", group="g0"), WRITE, False), (dict(leader_id="n0"), WRITE, True),
    (dict(local_id="n1"), MEMBER, False), (dict(local_id="n2"), MEMBER, True), ({}, MEMBER, False),
])
def test_plugin_request_ids_are_checked_as_client_codes(ids, identity, refused):
    """Plugin requests follow the client codes' id rule: a client names no member, a member only itself."""
    assert (policy.id_refusal(55000, ids, identity) is not None) is refused
    assert decide_request("tls", 55000, identity, ids, None, "read").allowed is not refused


def test_plugin_id_rule_covers_every_id_field_of_plugin_requests():
    """PluginRequest's id fields are exactly the ones the plugin codes' rule names."""
    import dataclasses

    from dledger import messages

    names = {f.name for f in dataclasses.fields(messages.PluginRequest) if f.name.endswith("_id") or f.name == "group"}
    assert names == set(policy.PLUGIN_ID_RULE.fields)
    assert policy.id_rule(55999) is policy.PLUGIN_ID_RULE and policy.id_rule(56000) is policy.DEFAULT_ID_RULE


def test_every_request_code_has_a_permission():
    """Every code of codes.RequestCode is in the table (a new one must be placed on purpose)."""
    assert set(policy.REQUIRED) == set(C)


IDS = [  # (code, ids the request names, identity, current leader, refused?)
    (C.VOTE, dict(leader_id="n1", local_id="n1"), MEMBER, None, False),
    (C.VOTE, dict(leader_id="n2", local_id="n1"), MEMBER, None, True),
    (C.VOTE, dict(leader_id="n1", local_id="n2"), MEMBER, None, True),
    (C.PUSH, dict(leader_id="n1"), MEMBER, None, False), (C.PUSH, dict(local_id="n1"), MEMBER, None, False),
    (C.PUSH, {}, MEMBER, None, True),
    (C.HEART_BEAT, dict(leader_id="n0", local_id="n0"), MEMBER, "n0", True),
    (C.PUSH, dict(leader_id="n0", local_id="n0"), MEMBER, "n0", True),
    (C.PULL, dict(local_id="n1"), MEMBER, None, False), (C.INSTALL_SNAPSHOT, dict(local_id="n0"), MEMBER, None, True),
    (52000, dict(local_id="n1"), MEMBER, None, False), (52000, {}, MEMBER, None, True),
    # LEADERSHIP_TRANSFER: the leader asking the transferee in its own name ...
    (C.LEADERSHIP_TRANSFER, dict(leader_id="n1", local_id="n1", transfer_id="n1", transferee_id="n0"), MEMBER, "n1",
     False),
    # ... but not a member that is not the leader, nor one speaking for the leader (issue #21: n2 moved n1 -> n0)
    (C.LEADERSHIP_TRANSFER, dict(leader_id="n1", local_id="n1", transfer_id="n1", transferee_id="n0"), MEMBER, "n0",
     True),
    (C.LEADERSHIP_TRANSFER, dict(leader_id="n0", local_id="n0", transfer_id="n0", transferee_id="n2"), MEMBER, "n0",
     True),
    (C.LEADERSHIP_TRANSFER, dict(transfer_id="n0", transferee_id="n2"), MEMBER, "n0", True),
    (C.LEADERSHIP_TRANSFER, dict(leader_id="n1", local_id="n1", transfer_id="n0"), MEMBER, "n1", True),
    (C.LEADERSHIP_TRANSFER, dict(leader_id="n1", transfer_id="n1", transferee_id="n2"), MEMBER, None, True),
    # an admin client asks the leader; it speaks for no member
    (C.LEADERSHIP_TRANSFER, dict(transfer_id="n0", transferee_id="n2"), ADMIN, "n1", False),
    (C.LEADERSHIP_TRANSFER, dict(leader_id="n0", transfer_id="n0", transferee_id="n2"), ADMIN, "n0", True),
    (C.METADATA, {}, MEMBER, None, False), (C.APPEND, dict(remote_id="n0", group="g9"), MEMBER, None, False),
    (C.APPEND, dict(local_id="n2"), MEMBER, None, True), (C.APPEND, dict(local_id="n0"), WRITE, None, True),
    (C.GET, dict(remote_id="n0"), READ, None, False), (C.METADATA, dict(leader_id="n0"), ANON_WRITE, None, True),
    (C.MEMBERS, dict(remote_id="n0", member_id="n3"), ADMIN, "n0", False),
]


@pytest.mark.parametrize("code,ids,identity,leader,refused", IDS)
def test_every_id_is_checked_against_the_identity(code, ids, identity, leader, refused):
    """A member names only itself; a client names no member; a member moves leadership only as the current leader."""
    assert (policy.id_refusal(code, ids, identity, leader) is not None) is refused
    assert decide_request("tls", code, identity, ids, leader).allowed is not refused


def test_every_request_code_has_an_id_rule_covering_every_id_field():
    """A new request code, or a new ``*_id`` field of a request, fails here until its row says how it is checked."""
    import dataclasses

    from dledger import messages

    assert set(policy.ID_RULES) == set(C)
    for code, (cls, _) in messages.RPCS.items():
        names = {f.name for f in dataclasses.fields(cls) if f.name.endswith("_id") or f.name == "group"}
        assert names == set(policy.ID_RULES[code].fields), (code.name, names ^ set(policy.ID_RULES[code].fields))
    for rule in policy.ID_RULES.values():
        assert all(why for why in rule.free.values())


def test_ids_are_not_checked_without_auth_and_roles_come_first():
    """authMode=none checks nothing; a client is refused member codes by role before any id is looked at."""
    assert decide_request("none", C.PUSH, ANON, {"leader_id": "n0"}).allowed
    assert "member-only" in decide_request("tls", C.PUSH, ADMIN, {"leader_id": "n0"}).reason


GROUP, MEMBERS, ROLES = "g0", {"n0", "n1", "n2"}, {"app1": "write", "ops": "admin"}
SUBJECTS = [  # (subject, expected identity, explained?)
    ({"O": "g0", "OU": "member", "CN": "n1"}, Identity.member("n1"), False),
    ({"O": "g0", "OU": "member", "CN": "n9"}, ANON, True),
    ({"O": "g1", "OU": "member", "CN": "n1"}, ANON, True),
    ({"O": "g0", "OU": "client", "CN": "app1"}, Identity.client("app1", "write"), False),
    ({"O": "g0", "OU": "client", "CN": "ops"}, Identity.client("ops", "admin"), False),
    ({"O": "g0", "OU": "client", "CN": "n1"}, ANON, True),  # a client certificate named like a member
    ({"O": "g0", "OU": "ca", "CN": "n1"}, ANON, True),
    ({"O": "g0", "OU": "member"}, ANON, True),
    ({}, ANON, True),
]


@pytest.mark.parametrize("subject,identity,explained", SUBJECTS)
def test_identity_from_certificate_subject(subject, identity, explained):
    """Only O=<group>, OU=member, CN=<a member id> proves a member; clients need a clientsFile entry."""
    got, why = identity_from_subject(subject, GROUP, MEMBERS, ROLES)
    assert got == identity
    assert (why is not None) is explained


def test_request_mac_binds_every_field():
    """Changing the sequence number, code, flag, opaque, encoding or body changes the MAC; the key matters."""
    key = secret.session_key(b"s" * 32, "g0", "member", "n1", "a" * 32, "b" * 32)
    base = dict(seq=3, code=51004, flag=0, opaque=7, encoding="bin", body=b"push")
    mac = secret.request_mac(key, **base)
    for field, other in (("seq", 4), ("code", 51001), ("flag", 2), ("opaque", 8), ("encoding", None),
                         ("body", b"pusH")):
        assert secret.request_mac(key, **{**base, field: other}) != mac, field
    other_key = secret.session_key(b"s" * 32, "g0", "member", "n1", "a" * 32, "c" * 32)
    assert secret.request_mac(other_key, **base) != mac  # another connection: another server nonce
    assert secret.macs_equal(mac, secret.request_mac(key, **base))
    assert not secret.macs_equal(mac, None)


def test_session_key_depends_on_who_logs_in():
    """The same nonces with another name, kind or group give another key (no cross-identity reuse)."""
    args = (b"s" * 32, "g0", "member", "n1", "a" * 32, "b" * 32)
    key = secret.session_key(*args)
    assert key != secret.session_key(b"s" * 32, "g0", "member", "n2", "a" * 32, "b" * 32)
    assert key != secret.session_key(b"s" * 32, "g0", "client", "n1", "a" * 32, "b" * 32)
    assert key != secret.session_key(b"s" * 32, "g1", "member", "n1", "a" * 32, "b" * 32)


@pytest.mark.parametrize("body", [b"", b"[]", b"{}", b'{"kind":"member","name":"n1","keyId":"k","nonce":"short"}',
                                  b'{"kind":"root","name":"n1","keyId":"k","nonce":"' + b"a" * 32 + b'"}',
                                  b'{"kind":"member","name":1,"keyId":"k","nonce":"' + b"a" * 32 + b'"}',
                                  b"\xff"])
def test_malformed_hello_is_refused(body):
    """A login body that is not exactly the expected object raises AuthError (never another exception)."""
    with pytest.raises(secret.AuthError):
        secret.parse_hello(body)


def test_secret_files(tmp_path):
    """Secrets: one a line, comments skipped, at least 16 bytes; clientsFile: NAME ROLE [TOKEN ...]."""
    f = tmp_path / "s"
    f.write_text("# rotated 2026-11\n" + "a" * 32 + "\n\n" + "b" * 20 + "\n")
    assert secret.read_secrets(str(f)) == [b"a" * 32, b"b" * 20]
    f.write_text("short\n")
    with pytest.raises(secret.AuthError, match="at least 16"):
        secret.read_secrets(str(f))
    with pytest.raises(secret.AuthError, match="cannot read"):
        secret.read_secrets(str(tmp_path / "missing"))
    clients = secret.parse_clients("app1 write " + "t" * 20 + "\nops admin  # no token: TLS only\n", "c",
                                   policy.ROLES)
    assert clients["app1"].role == "write" and clients["app1"].tokens == (b"t" * 20,)
    assert clients["ops"].tokens == ()
    for bad, match in (("app1\n", "expected"), ("app1 root\n", "role"), ("a read x\n", "at least"),
                       ("a read\na write\n", "twice")):
        with pytest.raises(secret.AuthError, match=match):
            secret.parse_clients(bad, "c", policy.ROLES)


PEERS = "n0-127.0.0.1:1;n1-127.0.0.1:2"


@pytest.mark.parametrize("options,message", [
    ({"auth_mode": "kerberos"}, "authMode: 'kerberos' is not one of none, tls, secret"),
    ({"auth_mode": "tls"}, "authMode: 'tls' needs tlsCert"),
    ({"auth_mode": "secret"}, "authMode: 'secret' needs groupSecretFile"),
    ({"tls_cert": "a.crt"}, "tlsKey, tlsCa: must be set together"),
    ({"anonymous_role": "admin"}, "anonymousRole: 'admin' is not one of none, read, write"),
])
def test_security_config_errors(options, message):
    """Each bad combination of security options is one ConfigError line naming the option."""
    with pytest.raises(ConfigError) as err:
        make_config(group="g0", self_id="n0", peers=PEERS, **options)
    assert message in str(err.value)


def test_self_id_placeholder_in_certificate_paths():
    """One config file for every member: {selfId} in tlsCert/tlsKey becomes the member's id."""
    cfg = make_config(group="g0", self_id="n1", peers=PEERS, auth_mode="tls", tls_cert="/c/{selfId}.crt",
                      tls_key="/c/{selfId}.key", tls_ca="/c/ca.crt")
    assert (cfg.tls_cert, cfg.tls_key) == ("/c/n1.crt", "/c/n1.key")
    assert cfg.replace(max_pending_size=5).tls_cert == "/c/n1.crt"
