"""RocketMQ ACL (dledger_rocketmq.common.acl): signatures, plain_acl.yml, the code -> resource map, the decision."""

from __future__ import annotations

import json
import os

import pytest
from dledger_rocketmq.common import acl
from dledger_rocketmq.common.acl import DENY, PUB, SUB, AclConfigError, AddressPattern

# -- signatures: vectors made by the real Java client (AclClientRPCHook of rocketmq-acl 4.9.8) -------------------

#: SendMessageRequestHeaderV2 (a=pg, b=TopicTest, ..., i=TAGS\x01TagA\x02WAIT\x01true), body "hello",
#: SessionCredentials("RocketMQ", "12345678"): the extFields AclClientRPCHook produced.
JAVA_SEND_V2 = {"AccessKey": "RocketMQ", "a": "pg", "b": "TopicTest", "c": "TBW102", "d": "4", "e": "1", "f": "0",
                "g": "1700000000000", "h": "0", "i": "TAGS\x01TagA\x02WAIT\x01true", "j": "0", "k": "false",
                "m": "false"}
JAVA_SEND_V2_SIGNATURE = "lyIVIt0osMOUrzLf3mm+n+G3wnQ="
#: GET_BROKER_CLUSTER_INFO (no header, no body) with a security token "tok123".
JAVA_TOKEN_SIGNATURE = "gm5RPyaZhUkVgj4IR7npYU0bzXA="


def test_signature_equals_the_java_clients():
    """HmacSHA1 over the sorted values and the body, Base64: the signature the Java client computed."""
    assert acl.signature(JAVA_SEND_V2, b"hello", "12345678") == JAVA_SEND_V2_SIGNATURE
    assert acl.signature({"AccessKey": "RocketMQ", "SecurityToken": "tok123"}, None, "12345678") \
        == JAVA_TOKEN_SIGNATURE


def test_sign_adds_access_key_token_and_signature_as_the_java_hook():
    """sign() gives the extFields AclClientRPCHook gives (the header's fields plus AccessKey and Signature)."""
    header = {k: v for k, v in JAVA_SEND_V2.items() if k != "AccessKey"}
    signed = acl.sign(header, b"hello", "RocketMQ", "12345678")
    assert signed == {**JAVA_SEND_V2, "Signature": JAVA_SEND_V2_SIGNATURE}
    token = acl.Credentials("RocketMQ", "12345678", "tok123").sign({}, b"")
    assert token == {"AccessKey": "RocketMQ", "SecurityToken": "tok123", "Signature": JAVA_TOKEN_SIGNATURE}


@pytest.mark.parametrize("change", [
    {"b": "OtherTopic"},                      # a field changed
    {"z": "1"},                               # a field added
    {"AccessKey": "RocketMQ2"},               # another account's name
])
def test_a_changed_request_does_not_verify(change):
    """Any change to the signed fields (or the body) breaks the signature."""
    ext = {**JAVA_SEND_V2, **change}
    assert acl.signature(ext, b"hello", "12345678") != JAVA_SEND_V2_SIGNATURE
    assert acl.signature(JAVA_SEND_V2, b"hellO", "12345678") != JAVA_SEND_V2_SIGNATURE


def test_unsigned_fields_are_left_out():
    """Signature, _UNIQUE_KEY_QUERY and the forwarding mark are not part of the signed content."""
    ext = {**JAVA_SEND_V2, "Signature": "x", "_UNIQUE_KEY_QUERY": "true", "dledgerForwardedBy": "n1"}
    assert acl.signature(ext, b"hello", "12345678") == JAVA_SEND_V2_SIGNATURE


def test_keys_sort_as_java_strings():
    """Keys are ordered by UTF-16 code units (Java's TreeMap), not by code points."""
    ext = {"\U0001F600": "b", "\uFF21": "a"}  # U+1F600 is D83D DE00 in UTF-16: before U+FF21
    assert acl.signed_content(ext, b"") == b"ba"


# -- plain_acl.yml ---------------------------------------------------------------------------------------------

SAMPLE = """\
globalWhiteRemoteAddresses:
- 10.10.103.*
- 192.168.0.*

accounts:
- accessKey: RocketMQ
  secretKey: 12345678
  whiteRemoteAddress:
  admin: false
  defaultTopicPerm: DENY
  defaultGroupPerm: SUB
  topicPerms:
  - topicA=DENY
  - topicB=PUB|SUB
  - topicC=SUB
  groupPerms:
  # the group should convert to retry topic
  - groupA=DENY
  - groupB=PUB|SUB
  - groupC=SUB

- accessKey: rocketmq2
  secretKey: 12345678
  whiteRemoteAddress: 192.168.1.*
  # if it is admin, it could access all resources
  admin: true
"""


def test_rocketmqs_sample_file_parses():
    """RocketMQ's distribution plain_acl.yml: accounts, perms (groups as %RETRY%), white addresses."""
    config = acl.load_acl_text(SAMPLE, "plain_acl.yml")
    assert [p.text for p in config.global_white] == ["10.10.103.*", "192.168.0.*"]
    user, admin = config.accounts["RocketMQ"], config.accounts["rocketmq2"]
    assert user.secret_key == "12345678" and not user.admin and user.white is None
    assert user.default_topic_perm == DENY and user.default_group_perm == SUB
    assert user.perms == {"topicA": DENY, "topicB": PUB | SUB, "topicC": SUB, "%RETRY%groupA": DENY,
                          "%RETRY%groupB": PUB | SUB, "%RETRY%groupC": SUB}
    assert admin.admin and admin.perms is None and admin.white.match("192.168.1.77")


def test_the_plain_form_round_trips():
    """to_dict() parses back to the same configuration (what the log and aclConfig.json carry)."""
    config = acl.load_acl_text(SAMPLE, "x")
    again = acl.parse_acl(json.loads(json.dumps(config.to_dict())), "y")
    assert again == config and again.digest() == config.digest()


@pytest.mark.parametrize("text, message", [
    ("accounts: [", "plain_acl.yml: not valid YAML at line 1"),
    ("- a\n- b\n", "plain_acl.yml: expected a mapping with globalWhiteRemoteAddresses and accounts"),
    ("acounts: []\n", "plain_acl.yml: unknown key 'acounts' (did you mean 'accounts'?)"),
    ("accounts:\n- accessKey: RocketMQ\n", "plain_acl.yml: accounts[0]: accessKey and secretKey are required"),
    ("accounts:\n- accessKey: short\n  secretKey: 12345678\n",
     "plain_acl.yml: accounts[0] (accessKey short): accessKey and secretKey must be longer than 6 characters"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, topicPerm: [a=PUB]}\n",
     "plain_acl.yml: accounts[0]: unknown key 'topicPerm' (did you mean 'topicPerms'?)"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, topicPerms: [a=WRITE]}\n",
     "plain_acl.yml: accounts[0] (accessKey RocketMQ) topicPerms a: 'WRITE' is not one of DENY, PUB, SUB, PUB|SUB"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, groupPerms: [g1]}\n",
     "plain_acl.yml: accounts[0] (accessKey RocketMQ) groupPerms: 'g1' is not NAME=PERM (e.g. TopicA=PUB|SUB)"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, defaultTopicPerm: ALL}\n",
     "plain_acl.yml: accounts[0] (accessKey RocketMQ) defaultTopicPerm: 'ALL' is not one of DENY, PUB, SUB, PUB|SUB"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678, whiteRemoteAddress: 10.1.300.*}\n",
     "plain_acl.yml: accounts[0] (accessKey RocketMQ) whiteRemoteAddress: '300' is not within 0-255"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: 12345678}\n- {accessKey: RocketMQ, secretKey: 87654321}\n",
     "plain_acl.yml: accounts[1]: accessKey 'RocketMQ' is given twice"),
    ("globalWhiteRemoteAddresses: 10.0.0.1\n",
     "plain_acl.yml: globalWhiteRemoteAddresses must be a list of addresses"),
    ("accounts:\n- {accessKey: RocketMQ, secretKey: [1]}\n",
     "plain_acl.yml: accounts[0] secretKey: expected a string, got list"),
])
def test_a_bad_file_is_one_line_naming_what(text, message):
    """Every unusable file gives one line naming the file, the account and the field."""
    with pytest.raises(AclConfigError) as info:
        acl.load_acl_text(text, "plain_acl.yml")
    assert str(info.value).startswith(message)
    assert "\n" not in str(info.value)


def test_a_missing_or_binary_file_is_one_line(tmp_path):
    """A file that cannot be read, or is not text, is one line too."""
    with pytest.raises(AclConfigError, match=r"nope.yml: cannot read: No such file"):
        acl.load_acl_file(str(tmp_path / "nope.yml"))
    (tmp_path / "bin.yml").write_bytes(b"\xff\xfe\x00")
    with pytest.raises(AclConfigError, match=r"bin.yml: not UTF-8 text"):
        acl.load_acl_file(str(tmp_path / "bin.yml"))


@pytest.mark.parametrize("pattern, host, matches", [
    ("*", "1.2.3.4", True),
    ("*.*.*.*", "::1", True),
    ("192.168.0.1", "192.168.0.1", True),
    ("192.168.0.1", "192.168.0.2", False),
    ("192.168.0.*", "192.168.0.200", True),
    ("192.168.*", "192.168.7.9", True),
    ("192.168.*", "192.169.7.9", False),
    ("192.168.0.1-100", "192.168.0.100", True),
    ("192.168.0.1-100", "192.168.0.101", False),
    ("192.168.0.{1,2,5}", "192.168.0.5", True),
    ("192.168.0.{1,2,5}", "192.168.0.3", False),
    ("10.0.0.1,10.0.0.2", "10.0.0.2", True),
    ("127.0.0.1", "::ffff:127.0.0.1", True),
    ("::1", "::1", True),
    ("::1", "127.0.0.1", False),
    ("10.0.0.*", None, False),
])
def test_white_address_patterns(pattern, host, matches):
    """RocketMQ's address forms: exact, *, trailing *, ranges, {a,b}, lists, IPv6."""
    assert AddressPattern.parse(pattern, "w").match(host) is matches


def test_a_blank_white_address_matches_nothing():
    """An empty whiteRemoteAddress is no white list (RocketMQ's blank strategy)."""
    assert AddressPattern.parse("", "w") is None and AddressPattern.parse(None, "w") is None


# -- permissions --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("needed, owned, ok", [
    (PUB, PUB, True), (PUB, SUB, False), (SUB, PUB | SUB, True), (PUB, DENY, False),
    (PUB, DENY | PUB, False), (acl.ANY, SUB, True), (acl.ANY, DENY, False),
])
def test_check_permission(needed, owned, ok):
    """Permission.checkPermission: DENY wins, ANY needs PUB or SUB, else a common bit."""
    assert acl.check_permission(needed, owned) is ok


@pytest.mark.parametrize("code, ext, body, expected", [
    (10, {"topic": "T"}, b"", {"T": PUB}),
    (310, {"b": "T", "a": "pg"}, b"", {"T": PUB}),
    (320, {"b": "T"}, b"", {"T": PUB}),
    (310, {"b": "%RETRY%g"}, b"", {"%RETRY%g": SUB}),
    (11, {"topic": "T", "consumerGroup": "g"}, b"", {"T": SUB, "%RETRY%g": SUB}),
    (12, {"topic": "T"}, b"", {"T": SUB}),
    (14, {"topic": "T", "consumerGroup": "g"}, b"", {"%RETRY%g": SUB, "T": SUB}),
    (15, {"topic": "T", "consumerGroup": "g"}, b"", {"%RETRY%g": SUB, "T": SUB}),
    (35, {"consumerGroup": "g"}, b"", {"%RETRY%g": SUB}),
    (36, {"group": "g", "originTopic": "T"}, b"", {"%RETRY%g": SUB, "T": PUB}),
    (38, {"consumerGroup": "g"}, b"", {"%RETRY%g": SUB}),
    (34, {}, json.dumps({"clientID": "c", "producerDataSet": [{"groupName": "pg"}], "consumerDataSet": [
        {"groupName": "g", "subscriptionDataSet": [{"topic": "T"}, {"topic": "%RETRY%g"}]}]}).encode(),
     {"%RETRY%g": SUB, "T": SUB}),
    (215, {"topic": "T"}, b"", {}),
    (30, {"topic": "T", "queueId": "0"}, b"", {}),
])
def test_what_each_code_needs(code, ext, body, expected):
    """The request-code -> resource/permission table (RocketMQ's, plus batch sends and QUERY_CONSUMER_OFFSET)."""
    assert acl.needs(code, ext, body) == expected


def test_every_code_the_port_answers_has_a_row():
    """A code the broker port answers is mapped, admin-only, or listed as signature-only: a new code fails here."""
    from dledger_rocketmq.broker.port import BrokerPort

    class Broker:  # what the extensions look at while installing
        server = type("S", (), {"clock": None, "self_id": "n0"})()
        options = None
    port = BrokerPort.__new__(BrokerPort)
    BrokerPort.__init__(port, Broker(), "tcp:0")
    rows = acl.MAPPED_CODES | acl.ADMIN_CODES | acl.SIGNATURE_ONLY
    assert set(port.handlers) - rows == set()
    assert not acl.MAPPED_CODES & acl.SIGNATURE_ONLY and not acl.ADMIN_CODES & acl.SIGNATURE_ONLY


# -- the decision ------------------------------------------------------------------------------------------

CONFIG = acl.load_acl_text(SAMPLE.replace("- 192.168.0.*\n", "") + """
- accessKey: producer1
  secretKey: producer-secret
  defaultTopicPerm: DENY
  topicPerms:
  - TopicTest=PUB
- accessKey: hostonly
  secretKey: whatever-secret
  whiteRemoteAddress: 127.0.0.9
""", "t")


def signed(code_ext: dict, ak: str, sk: str, body: bytes = b"") -> dict:
    return acl.sign(code_ext, body, ak, sk)


@pytest.mark.parametrize("code, ext, host, remark", [
    (310, {"b": "TopicTest"}, "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: No accessKey is configured, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:664)"),
    (310, {"b": "TopicTest", "AccessKey": "nobody123", "Signature": "x"}, "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: No acl config for nobody123, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:668)"),
    (310, {"b": "TopicTest", "AccessKey": "producer1", "Signature": "AAAA"}, "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: Check signature failed for accessKey=producer1, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.validate(PlainPermissionManager.java:684)"),
    (310, signed({"b": "Other"}, "producer1", "producer-secret"), "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: No default permission for topic:Other, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:606)"),
    (11, signed({"topic": "topicA", "consumerGroup": "groupC"}, "RocketMQ", "12345678"), "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: No default permission for topic:topicA, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:611)"),
    (11, signed({"topic": "topicC", "consumerGroup": "groupA"}, "RocketMQ", "12345678"), "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: No default permission for group:groupA, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:611)"),
    (215, signed({"topic": "TopicTest"}, "producer1", "producer-secret"), "127.0.0.1",
     "org.apache.rocketmq.acl.common.AclException: Need admin permission for request code=215, but "
     "accessKey=producer1 is not, "
     "org.apache.rocketmq.acl.plain.PlainPermissionManager.checkPerm(PlainPermissionManager.java:581)"),
])
def test_refusals_answer_as_a_4_9_8_broker(code, ext, host, remark):
    """Each refusal's remark is the one a real 4.9.8 broker sent for the same request (code 1, SYSTEM_ERROR)."""
    refusal = acl.decide(CONFIG, code, ext, b"", host)
    assert refusal is not None and refusal.remark == remark


@pytest.mark.parametrize("code, ext, host", [
    (310, signed({"b": "TopicTest"}, "producer1", "producer-secret"), "127.0.0.1"),  # PUB granted
    (11, signed({"topic": "topicC", "consumerGroup": "groupC"}, "RocketMQ", "12345678"), "127.0.0.1"),
    (11, signed({"topic": "topicC", "consumerGroup": "other"}, "RocketMQ", "12345678"), "127.0.0.1"),  # default SUB
    (215, signed({"topic": "T"}, "rocketmq2", "12345678"), "127.0.0.1"),  # admin, no perms listed: everything
    (215, {"topic": "T"}, "10.10.103.7"),  # global white list: nothing checked
    (310, {"b": "Anything", "AccessKey": "hostonly"}, "127.0.0.9"),  # the account's white address: no signature
    (30, signed({"topic": "T", "queueId": "0"}, "producer1", "producer-secret"), "127.0.0.1"),  # signature only
])
def test_allowed(code, ext, host):
    """Granted, default-granted, admin, white-listed and signature-only requests go on."""
    assert acl.decide(CONFIG, code, ext, b"", host) is None


def test_the_body_is_signed():
    """A body changed after signing is refused (the signature covers it)."""
    ext = signed({"b": "TopicTest"}, "producer1", "producer-secret", b"original")
    assert acl.decide(CONFIG, 310, ext, b"original", "127.0.0.1") is None
    assert "Check signature failed" in acl.decide(CONFIG, 310, ext, b"tampered", "127.0.0.1").message


def test_name_server_codes():
    """On the name server, registrations need an admin account; reads any signed account; no resources."""
    reg = signed({"brokerName": "b"}, "producer1", "producer-secret")
    assert "Need admin permission for request code=103" in acl.decide(
        CONFIG, 103, reg, b"", "127.0.0.1", admin_codes=acl.NAMESRV_ADMIN_CODES, resources=False).message
    assert acl.decide(CONFIG, 103, signed({"brokerName": "b"}, "rocketmq2", "12345678"), b"", "127.0.0.1",
                      admin_codes=acl.NAMESRV_ADMIN_CODES, resources=False) is None
    assert acl.decide(CONFIG, 105, signed({"topic": "Nope"}, "producer1", "producer-secret"), b"", "127.0.0.1",
                      admin_codes=acl.NAMESRV_ADMIN_CODES, resources=False) is None


@pytest.mark.parametrize("role, code, ext, ok", [
    ("read", 11, {"topic": "T", "consumerGroup": "g"}, True),
    ("read", 310, {"b": "T"}, False),
    ("write", 310, {"b": "T"}, True),
    ("write", 215, {"topic": "T"}, False),
    ("admin", 215, {"topic": "T"}, True),
    ("member", 21, {}, True),
    (None, 30, {"topic": "T", "queueId": "0"}, False),
])
def test_certificate_roles(role, code, ext, ok):
    """Client-certificate roles: read = SUB, write = PUB|SUB, admin = admin codes too; no certificate: refused."""
    assert (acl.decide_role(role, code, ext, b"") is None) is ok


def test_acl_changes_keep_the_rest():
    """updateAclConfig / deleteAccessConfig / updateGlobalWhiteAddr change one thing of the configuration."""
    from dledger_rocketmq.broker.port_acl import account_from_header

    raw = account_from_header({"accessKey": "producer1", "topicPerms": "A=PUB,B=SUB", "admin": "false"},
                              dict(CONFIG.accounts["producer1"].raw))
    changed = CONFIG.with_account(raw)
    assert changed.accounts["producer1"].perms == {"A": PUB, "B": SUB}
    assert changed.accounts["producer1"].secret_key == "producer-secret"
    assert set(changed.without_account("producer1").accounts) == set(CONFIG.accounts) - {"producer1"}
    assert [p.text for p in CONFIG.with_global_white(["1.2.3.4"]).global_white] == ["1.2.3.4"]


def test_credentials_from_a_file(tmp_path):
    """The secret key comes from a file's first line; an empty or missing file is one line."""
    f = tmp_path / "secret"
    f.write_text("producer-secret\n")
    assert acl.Credentials.from_file("producer1", str(f)).secret_key == "producer-secret"
    f.write_text("\n")
    with pytest.raises(AclConfigError, match="empty"):
        acl.Credentials.from_file("producer1", str(f))
    with pytest.raises(AclConfigError, match="cannot read"):
        acl.Credentials.from_file("producer1", os.fspath(tmp_path / "missing"))


def test_alions_numbers_and_booleans_verify():
    """ali-ons sends numbers and booleans in a JSON header and signs their toString(): the port reads them as
    those strings, so the signature verifies (and a changed number does not)."""
    from dledger_rocketmq.broker.port import decode_json_header

    fields = {"producerGroup": "pg", "topic": "TopicTest", "queueId": 3, "sysFlag": 0, "bornTimestamp": 1700000000000,
              "flag": 0, "batch": False, "unitMode": False, "OnsChannel": "ALIYUN", "AccessKey": "producer1"}
    as_js = {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in fields.items()}  # JS toString()
    fields["Signature"] = acl.signature(as_js, b"body", "producer-secret")
    header = decode_json_header(json.dumps({"code": 10, "opaque": 1, "flag": 0, "extFields": fields}).encode())
    assert acl.decide(CONFIG, 10, header.ext_fields, b"body", "127.0.0.1") is None
    fields["queueId"] = 4
    header = decode_json_header(json.dumps({"code": 10, "opaque": 1, "flag": 0, "extFields": fields}).encode())
    assert "Check signature failed" in acl.decide(CONFIG, 10, header.ext_fields, b"body", "127.0.0.1").message
