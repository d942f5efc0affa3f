"""RocketMQ 4.x ACL: ``plain_acl.yml`` accounts and the request signature stock clients send.

What a stock client speaks: the Java client's ``AclClientRPCHook`` (and
ali-ons' ``accessKey``/``secretKey`` options) add ``AccessKey``,
``Signature`` (and ``SecurityToken`` when one is set) to every request's
extFields.  The signature is HmacSHA1, keyed with the account's secretKey,
over the values of every extField except ``Signature`` taken in key order,
followed by the body, Base64-encoded (``AclUtils.combineRequestContent`` /
``AclSigner``).  The broker checks, in this order, as a 4.9.8
``PlainPermissionManager.validate`` does:

1. the peer address is in ``globalWhiteRemoteAddresses``: allowed, nothing else checked;
2. no ``AccessKey``: refused; an unknown one: refused;
3. the peer address matches the account's ``whiteRemoteAddress``: allowed;
4. the signature does not verify: refused;
5. an admin code from a non-admin account: refused; each resource the request
   touches (:func:`needs`: a topic, or a group as its ``%RETRY%`` topic) must
   be granted by ``topicPerms``/``groupPerms``, else by
   ``defaultTopicPerm``/``defaultGroupPerm`` (an admin account without any
   perms list may touch everything).

A refusal is answered as RocketMQ answers it: SYSTEM_ERROR (1) with the
exception text the Java broker puts in the remark (:class:`Refusal`).  Every
decision here is a pure function, table-tested; the port and the name server
only call :func:`decide`.  Differences from RocketMQ are listed in
docs/rocketmq.md ("ACL").
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import ipaddress
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

# -- permissions (org.apache.rocketmq.acl.common.Permission) ---------------------------------------------------
DENY = 1
ANY = 2
PUB = 4
SUB = 8
PERM_NAMES = {"DENY": DENY, "PUB": PUB, "SUB": SUB, "PUB|SUB": PUB | SUB, "SUB|PUB": PUB | SUB}

ACCESS_KEY = "AccessKey"
SIGNATURE = "Signature"
SECURITY_TOKEN = "SecurityToken"
#: extFields a signature never covers: the signature itself, the query flag RocketMQ leaves out, and the mark a
#: slave adds when it relays a client's send to the master (dledger_rocketmq.broker.forward), so the master checks the
#: client's own signature.
UNSIGNED_FIELDS = frozenset({SIGNATURE, "_UNIQUE_KEY_QUERY", "dledgerForwardedBy"})
RETRY_PREFIX = "%RETRY%"
#: RocketMQ's account key and secret rule: longer than 6 characters.
MIN_KEY_LENGTH = 7

# Request codes the mapping needs (RocketMQ's RequestCode).
SEND_MESSAGE = 10
PULL_MESSAGE = 11
QUERY_MESSAGE = 12
QUERY_CONSUMER_OFFSET = 14
UPDATE_CONSUMER_OFFSET = 15
UPDATE_AND_CREATE_TOPIC = 17
UPDATE_BROKER_CONFIG = 25
HEART_BEAT = 34
UNREGISTER_CLIENT = 35
CONSUMER_SEND_MSG_BACK = 36
GET_CONSUMER_LIST_BY_GROUP = 38
UPDATE_AND_CREATE_ACL_CONFIG = 50
DELETE_ACL_CONFIG = 51
UPDATE_GLOBAL_WHITE_ADDRS_CONFIG = 53
UPDATE_AND_CREATE_SUBSCRIPTIONGROUP = 200
DELETE_SUBSCRIPTIONGROUP = 207
DELETE_TOPIC_IN_BROKER = 215
INVOKE_BROKER_TO_RESET_OFFSET = 222
SEND_MESSAGE_V2 = 310
SEND_BATCH_MESSAGE = 320
REGISTER_BROKER = 103
UNREGISTER_BROKER = 104
QUERY_DATA_VERSION = 322

#: Codes only an admin account may send on the broker port: RocketMQ's ADMIN_CODE (17, 25, 200, 207, 215) plus
#: the ACL changes and the offset reset, which RocketMQ 4.9.8 lets any signed account send.
ADMIN_CODES = frozenset({UPDATE_AND_CREATE_TOPIC, UPDATE_BROKER_CONFIG, UPDATE_AND_CREATE_SUBSCRIPTIONGROUP,
                         DELETE_SUBSCRIPTIONGROUP, DELETE_TOPIC_IN_BROKER, UPDATE_AND_CREATE_ACL_CONFIG,
                         DELETE_ACL_CONFIG, UPDATE_GLOBAL_WHITE_ADDRS_CONFIG, INVOKE_BROKER_TO_RESET_OFFSET})
#: Codes only an admin account may send to the name server (what changes routes; RocketMQ's name server has no
#: ACL at all).
#: DELETE_TOPIC_IN_NAMESRV (216, mqadmin deleteTopic) takes a topic's route away: admin too.
NAMESRV_ADMIN_CODES = frozenset({REGISTER_BROKER, UNREGISTER_BROKER, QUERY_DATA_VERSION, 216})

#: Codes :func:`needs` maps to resources.
MAPPED_CODES = frozenset({SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE, CONSUMER_SEND_MSG_BACK, PULL_MESSAGE,
                          QUERY_MESSAGE, UPDATE_CONSUMER_OFFSET, QUERY_CONSUMER_OFFSET, UNREGISTER_CLIENT,
                          GET_CONSUMER_LIST_BY_GROUP, HEART_BEAT})
#: Codes the broker port answers that touch no single topic or group (reads of offsets, stats, runtime info, the
#: slave-sync bodies, ordered-consumer locks): a valid signature of any account is enough, as in RocketMQ.  A code
#: the port answers must be in MAPPED_CODES, ADMIN_CODES or here (tests/rocketmq/test_rmq_acl.py checks).
SIGNATURE_ONLY = frozenset({21, 28, 29, 30, 31, 32, 33, 37, 40, 41, 42, 43, 45, 201, 202, 203, 204, 208, 300, 307,
                            315, 317})

EXCEPTION = "org.apache.rocketmq.acl.common.AclException"
WHERE = "org.apache.rocketmq.acl.plain.PlainPermissionManager"


class AclConfigError(ValueError):
    """A plain_acl.yml (or an ACL change) that cannot be used; the message is one line naming what and where."""


def check_permission(needed: int, owned: int) -> bool:
    """Permission.checkPermission: DENY owned refuses all; ANY needs PUB or SUB; else a common bit."""
    if owned & DENY:
        return False
    if needed & ANY:
        return bool(owned & (PUB | SUB))
    return bool(needed & owned)


def parse_perm(text: Any, what: str) -> int:
    """``DENY``, ``PUB``, ``SUB``, ``PUB|SUB`` or ``SUB|PUB`` (RocketMQ silently reads anything else as DENY:
    here it is an error naming ``what``)."""
    perm = PERM_NAMES.get(str(text).strip()) if isinstance(text, str) else None
    if perm is None:
        raise AclConfigError(f"{what}: {text!r} is not one of DENY, PUB, SUB, PUB|SUB")
    return perm


def retry_topic(group: str) -> str:
    """A group as an ACL resource: its retry topic (RocketMQ keys groupPerms this way)."""
    return RETRY_PREFIX + group


def resource_text(resource: str) -> str:
    """``topic:T`` or ``group:G`` as RocketMQ's refusals print a resource."""
    if resource.startswith(RETRY_PREFIX):
        return "group:" + resource[len(RETRY_PREFIX):]
    return "topic:" + resource


# -- addresses (RemoteAddressStrategyFactory) ----------------------------------------------------------------------

def _segment(text: str, what: str) -> tuple[int, int]:
    """One IPv4 pattern segment: ``*``, ``N`` or ``N-M`` -> (low, high)."""
    if text == "*":
        return 0, 255
    low, dash, high = text.partition("-")
    try:
        lo, hi = int(low), int(high) if dash else int(low)
    except ValueError:
        raise AclConfigError(f"{what}: {text!r} is not a number, a range N-M or *") from None
    if not 0 <= lo <= hi <= 255:
        raise AclConfigError(f"{what}: {text!r} is not within 0-255")
    return lo, hi


@dataclass(frozen=True)
class AddressPattern:
    """One ``whiteRemoteAddress`` / ``globalWhiteRemoteAddresses`` entry; :meth:`match` takes a peer's IP."""

    text: str
    any: bool = False
    ipv4: tuple[tuple[tuple[int, int], ...], ...] = ()  # alternatives, each 4 (low, high) segments
    exact: frozenset[str] = frozenset()  # IPv6 (and IPv4) addresses in normal form

    @classmethod
    def parse(cls, text: Any, what: str) -> AddressPattern | None:
        """The pattern in ``text``; None for a blank one (matches nothing, as in RocketMQ).

        Forms: ``*`` (any), ``192.168.0.1``, ``192.168.0.*`` / ``192.168.*``,
        ``192.168.0.1-100``, ``192.168.0.{1,2,5}``, several separated by ``,``,
        IPv6 addresses.
        """
        if text is None:
            return None
        text = str(text).strip()
        if not text:
            return None
        if text in ("*", "*.*.*.*", "*:*:*:*:*:*:*:*"):
            return cls(text, any=True)
        alternatives: list[tuple[tuple[int, int], ...]] = []
        exact: set[str] = set()
        if text.endswith("}") and "{" in text:
            head, _, tail = text.partition("{")
            items = [head + item.strip() for item in tail[:-1].split(",")]
        else:
            items = [item.strip() for item in text.split(",")]
        for item in items:
            if not item:
                raise AclConfigError(f"{what}: {text!r} has an empty address")
            if ":" in item:
                try:
                    exact.add(str(ipaddress.ip_address(item)))
                except ValueError:
                    raise AclConfigError(f"{what}: {item!r} is not an IPv6 address") from None
                continue
            parts = item.split(".")
            if len(parts) > 4 or (len(parts) < 4 and parts[-1] != "*"):
                raise AclConfigError(f"{what}: {item!r} is not an IPv4 address or pattern (e.g. 192.168.0.*)")
            parts += ["*"] * (4 - len(parts))
            alternatives.append(tuple(_segment(p, what) for p in parts))
        return cls(text, ipv4=tuple(alternatives), exact=frozenset(exact))

    def match(self, host: str | None) -> bool:
        if self.any:
            return True
        if not host:
            return False
        try:
            addr = ipaddress.ip_address(host.strip("[]"))
        except ValueError:
            return False
        if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
            addr = addr.ipv4_mapped
        if str(addr) in self.exact:
            return True
        if isinstance(addr, ipaddress.IPv4Address):
            octets = addr.packed
            return any(all(lo <= o <= hi for o, (lo, hi) in zip(octets, alt)) for alt in self.ipv4)
        return False


# -- accounts and the configuration --------------------------------------------------------------------------

ACCOUNT_KEYS = ("accessKey", "secretKey", "whiteRemoteAddress", "admin", "defaultTopicPerm", "defaultGroupPerm",
                "topicPerms", "groupPerms")
TOP_KEYS = ("globalWhiteRemoteAddresses", "accounts", "dataVersion")


@dataclass(frozen=True)
class Account:
    """One account of plain_acl.yml (PlainAccessResource as the broker builds it from the file)."""

    access_key: str
    secret_key: str
    white: AddressPattern | None = None
    admin: bool = False
    default_topic_perm: int = DENY
    default_group_perm: int = DENY
    #: Resource (topic, or ``%RETRY%group``) -> perm; None when the account lists no perms at all.
    perms: Mapping[str, int] | None = None
    #: The account as given (plain values), for the replicated and persisted form.
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False)


def _text(value: Any, what: str) -> str:
    """A scalar as the string Java's loader makes of it (YAML reads ``secretKey: 12345678`` as a number)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (str, int)):
        return str(value)
    raise AclConfigError(f"{what}: expected a string, got {type(value).__name__}")


def _closest(name: str, valid: Iterable[str]) -> str:
    import difflib

    near = difflib.get_close_matches(name, list(valid), n=1)
    return f" (did you mean {near[0]!r}?)" if near else ""


def _resource_perms(items: Any, what: str, *, group: bool) -> dict[str, int]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise AclConfigError(f"{what}: expected a list of NAME=PERM")
    out = {}
    for item in items:
        text = _text(item, what)
        parts = [p for p in text.split("=") if p]
        if len(parts) != 2 or not parts[0].strip():
            raise AclConfigError(f"{what}: {text!r} is not NAME=PERM (e.g. TopicA=PUB|SUB)")
        name = parts[0].strip()
        out[retry_topic(name) if group else name] = parse_perm(parts[1], f"{what} {name}")
    return out


def parse_account(raw: Any, what: str) -> Account:
    """One account mapping; AclConfigError naming ``what`` and the field when it is unusable."""
    if not isinstance(raw, dict):
        raise AclConfigError(f"{what}: expected a mapping of accessKey, secretKey, ...")
    for key in raw:
        if key not in ACCOUNT_KEYS:
            raise AclConfigError(f"{what}: unknown key {key!r}{_closest(str(key), ACCOUNT_KEYS)}")
    ak, sk = raw.get("accessKey"), raw.get("secretKey")
    if ak is None or sk is None:
        raise AclConfigError(f"{what}: accessKey and secretKey are required")
    ak, sk = _text(ak, f"{what} accessKey"), _text(sk, f"{what} secretKey")
    where = f"{what} (accessKey {ak})"
    if len(ak) < MIN_KEY_LENGTH or len(sk) < MIN_KEY_LENGTH:
        raise AclConfigError(f"{where}: accessKey and secretKey must be longer than 6 characters")
    admin = raw.get("admin", False)
    if admin is None:
        admin = False
    if not isinstance(admin, bool):
        if str(admin).lower() not in ("true", "false"):
            raise AclConfigError(f"{where}: admin must be true or false, got {admin!r}")
        admin = str(admin).lower() == "true"
    topic_perms = _resource_perms(raw.get("topicPerms"), f"{where} topicPerms", group=False)
    group_perms = _resource_perms(raw.get("groupPerms"), f"{where} groupPerms", group=True)
    listed = raw.get("topicPerms") is not None or raw.get("groupPerms") is not None
    default_topic = raw.get("defaultTopicPerm")
    default_group = raw.get("defaultGroupPerm")
    plain = {k: raw[k] for k in ACCOUNT_KEYS if raw.get(k) is not None}
    plain["accessKey"], plain["secretKey"] = ak, sk
    return Account(
        access_key=ak, secret_key=sk,
        white=AddressPattern.parse(raw.get("whiteRemoteAddress"), f"{where} whiteRemoteAddress"),
        admin=admin,
        default_topic_perm=DENY if default_topic is None else parse_perm(default_topic, f"{where} defaultTopicPerm"),
        default_group_perm=DENY if default_group is None else parse_perm(default_group, f"{where} defaultGroupPerm"),
        perms={**topic_perms, **group_perms} if listed else None, raw=plain)


@dataclass(frozen=True)
class AclConfig:
    """The accounts and global white list in effect (one plain_acl.yml)."""

    accounts: Mapping[str, Account]
    global_white: tuple[AddressPattern, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """The plain form (what the log carries and ``config/aclConfig.json`` holds)."""
        return {"globalWhiteRemoteAddresses": [p.text for p in self.global_white],
                "accounts": [dict(a.raw) for a in self.accounts.values()]}

    def digest(self) -> str:
        """SHA-256 of the canonical plain form: equal configurations, equal digests."""
        data = json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(data).hexdigest()

    def with_account(self, raw: Mapping[str, Any]) -> AclConfig:
        """This configuration with one account created or replaced (mqadmin updateAclConfig)."""
        account = parse_account(dict(raw), "account")
        accounts = dict(self.accounts)
        accounts[account.access_key] = account
        return AclConfig(accounts, self.global_white)

    def without_account(self, access_key: str) -> AclConfig:
        accounts = {k: v for k, v in self.accounts.items() if k != access_key}
        return AclConfig(accounts, self.global_white)

    def with_global_white(self, addresses: Iterable[str]) -> AclConfig:
        white = tuple(p for i, text in enumerate(addresses)
                      if (p := AddressPattern.parse(text, f"globalWhiteRemoteAddresses[{i}]")) is not None)
        return AclConfig(self.accounts, white)


def parse_acl(data: Any, source: str = "plain_acl.yml") -> AclConfig:
    """An AclConfig from the parsed YAML/JSON of a plain_acl.yml; AclConfigError (one line naming ``source``)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise AclConfigError(f"{source}: expected a mapping with globalWhiteRemoteAddresses and accounts")
    for key in data:
        if key not in TOP_KEYS:
            raise AclConfigError(f"{source}: unknown key {key!r}{_closest(str(key), TOP_KEYS)}")
    white_raw = data.get("globalWhiteRemoteAddresses") or []
    if not isinstance(white_raw, list):
        raise AclConfigError(f"{source}: globalWhiteRemoteAddresses must be a list of addresses")
    white = []
    for i, text in enumerate(white_raw):
        pattern = AddressPattern.parse(_text(text, f"{source}: globalWhiteRemoteAddresses[{i}]"),
                                       f"{source}: globalWhiteRemoteAddresses[{i}]")
        if pattern is not None:
            white.append(pattern)
    accounts_raw = data.get("accounts") or []
    if not isinstance(accounts_raw, list):
        raise AclConfigError(f"{source}: accounts must be a list of accounts")
    accounts: dict[str, Account] = {}
    for i, raw in enumerate(accounts_raw):
        account = parse_account(raw, f"{source}: accounts[{i}]")
        if account.access_key in accounts:
            raise AclConfigError(f"{source}: accounts[{i}]: accessKey {account.access_key!r} is given twice")
        accounts[account.access_key] = account
    return AclConfig(accounts, tuple(white))


def load_acl_text(text: str | bytes, source: str) -> AclConfig:
    """Parse a plain_acl.yml's text (YAML; JSON is YAML too)."""
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise AclConfigError(f"{source}: not valid YAML{where}: {problem}") from None
    return parse_acl(data, source)


def load_acl_file(path: str) -> AclConfig:
    """Read and parse a plain_acl.yml; AclConfigError with one line for a missing, unreadable or bad file."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except OSError as exc:
        raise AclConfigError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return load_acl_text(text.decode("utf-8"), path)
    except UnicodeDecodeError:
        raise AclConfigError(f"{path}: not UTF-8 text") from None


# -- signatures (AclUtils.combineRequestContent, AclSigner) --------------------------------------------------------

def _java_order(key: str) -> bytes:
    """Java's TreeMap<String> order: UTF-16 code units."""
    return key.encode("utf-16-be")


def signed_content(ext: Mapping[str, str], body: bytes | None) -> bytes:
    """What the signature covers: every extField value but the unsigned ones, in key order, then the body."""
    text = "".join(ext[k] for k in sorted(ext, key=_java_order) if k not in UNSIGNED_FIELDS and ext[k] is not None)
    return text.encode("utf-8") + (bytes(body) if body else b"")


def signature(ext: Mapping[str, str], body: bytes | None, secret_key: str) -> str:
    """Base64(HmacSHA1(secretKey, content))."""
    mac = hmac.new(secret_key.encode("utf-8"), signed_content(ext, body), hashlib.sha1)
    return base64.b64encode(mac.digest()).decode("ascii")


def sign(ext: Mapping[str, Any], body: bytes | None, access_key: str, secret_key: str,
         security_token: str | None = None) -> dict[str, str]:
    """``ext`` with ``AccessKey`` (and ``SecurityToken``) and its ``Signature`` added, as AclClientRPCHook does."""
    out = {k: str(v) for k, v in ext.items() if v is not None}
    out[ACCESS_KEY] = access_key
    if security_token is not None:
        out[SECURITY_TOKEN] = security_token
    out.pop(SIGNATURE, None)
    out[SIGNATURE] = signature(out, body, secret_key)
    return out


@dataclass(frozen=True)
class Credentials:
    """An access key and secret a client signs its requests with."""

    access_key: str
    secret_key: str
    security_token: str | None = None

    @classmethod
    def from_file(cls, access_key: str, secret_key_file: str) -> Credentials:
        """The secret from a file (its first line, stripped); AclConfigError with one line if unusable."""
        try:
            with open(secret_key_file, encoding="utf-8") as f:
                secret = f.readline().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise AclConfigError(f"{secret_key_file}: cannot read the secret key: "
                                 f"{getattr(exc, 'strerror', None) or exc}") from None
        if not secret:
            raise AclConfigError(f"{secret_key_file}: empty (expected the account's secretKey on its first line)")
        return cls(access_key, secret)

    def sign(self, ext: Mapping[str, Any], body: bytes | None) -> dict[str, str]:
        return sign(ext, body, self.access_key, self.secret_key, self.security_token)


# -- what a request touches (PlainAccessResource.parse) --------------------------------------------------------

class RequestParseError(ValueError):
    """A request whose resources cannot be read (e.g. a heartbeat body that is not JSON): refused."""


def needs(code: int, ext: Mapping[str, str], body: bytes = b"") -> dict[str, int]:
    """Resource -> permission a request needs (topics by name, groups as ``%RETRY%group``).

    As RocketMQ 4.9.8 maps them, plus SEND_BATCH_MESSAGE (as SEND_MESSAGE_V2)
    and QUERY_CONSUMER_OFFSET (as UPDATE_CONSUMER_OFFSET), which 4.9.8 leaves
    unchecked.  A code without a row needs only a valid signature (and admin
    for :data:`ADMIN_CODES`).
    """
    out: dict[str, int] = {}

    def add(resource: str | None, perm: int) -> None:
        if resource:
            out[resource] = perm

    def group(name: str | None) -> str | None:
        return retry_topic(name) if name else None

    if code in (SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE):
        v2 = code != SEND_MESSAGE and "b" in ext
        topic = ext.get("b" if v2 else "topic")
        if topic and topic.startswith(RETRY_PREFIX):  # a consumer's send-back through its producer
            add(topic, SUB)
        else:
            add(topic, PUB)
    elif code == CONSUMER_SEND_MSG_BACK:
        add(group(ext.get("group")), SUB)
        add(ext.get("originTopic"), PUB)
    elif code == PULL_MESSAGE:
        add(ext.get("topic"), SUB)
        add(group(ext.get("consumerGroup")), SUB)
    elif code == QUERY_MESSAGE:
        add(ext.get("topic"), SUB)
    elif code in (UPDATE_CONSUMER_OFFSET, QUERY_CONSUMER_OFFSET):
        add(group(ext.get("consumerGroup")), SUB)
        add(ext.get("topic"), SUB)
    elif code in (UNREGISTER_CLIENT, GET_CONSUMER_LIST_BY_GROUP):
        add(group(ext.get("consumerGroup")), SUB)
    elif code == HEART_BEAT:
        from dledger_rocketmq.common.heartbeat import HeartbeatError, parse_heartbeat

        try:
            heartbeat = parse_heartbeat(body)
        except HeartbeatError as exc:
            raise RequestParseError(str(exc)) from None
        for consumer in heartbeat.consumers:
            add(group(consumer.group), SUB)
            for sub in consumer.subscriptions:
                add(sub.topic, SUB)
    return out


# -- the decision ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Refusal:
    """Why a request is refused, and where the Java broker says it threw (its remark's second half)."""

    message: str
    where: str

    @property
    def remark(self) -> str:
        """The remark a 4.9.8 broker sends (``RemotingHelper.exceptionSimpleDesc`` of the AclException)."""
        return f"{EXCEPTION}: {self.message}, {WHERE}.{self.where}"


def _validate(line: int) -> str:
    return f"validate(PlainPermissionManager.java:{line})"


def _check_perm(line: int) -> str:
    return f"checkPerm(PlainPermissionManager.java:{line})"


def decide(acl: AclConfig, code: int, ext: Mapping[str, str], body: bytes | None, host: str | None, *,
           admin_codes: frozenset[int] = ADMIN_CODES, resources: bool = True) -> Refusal | None:
    """None if the request may go on, else the :class:`Refusal` (the order of the module docstring).

    ``resources=False`` checks identity and admin codes only (the name server).
    """
    if any(p.match(host) for p in acl.global_white):
        return None
    access_key = ext.get(ACCESS_KEY)
    if access_key is None:
        return Refusal("No accessKey is configured", _validate(664))
    account = acl.accounts.get(access_key)
    if account is None:
        return Refusal(f"No acl config for {access_key}", _validate(668))
    if account.white is not None and account.white.match(host):
        return None
    expected = signature(ext, body, account.secret_key)
    if not hmac.compare_digest(expected.encode(), (ext.get(SIGNATURE) or "").encode()):
        return Refusal(f"Check signature failed for accessKey={access_key}", _validate(684))
    if code in admin_codes and not account.admin:
        return Refusal(f"Need admin permission for request code={code}, but accessKey={access_key} is not",
                       _check_perm(581))
    if not resources:
        return None
    try:
        needed = needs(code, ext, body or b"")
    except RequestParseError as exc:
        return Refusal(str(exc), "parse(PlainAccessResource.java)")
    return check_perms(account, needed)


def check_perms(account: Account, needed: Mapping[str, int]) -> Refusal | None:
    """PlainPermissionManager.checkPerm for the resources a request touches."""
    if not needed:
        return None
    owned = account.perms
    if owned is None and account.admin:
        return None
    for resource, perm in needed.items():
        is_group = resource.startswith(RETRY_PREFIX)
        if owned is None or resource not in owned:
            if not check_permission(perm, account.default_group_perm if is_group else account.default_topic_perm):
                return Refusal(f"No default permission for {resource_text(resource)}", _check_perm(606))
            continue
        if not check_permission(perm, owned[resource]):
            return Refusal(f"No default permission for {resource_text(resource)}", _check_perm(611))
    return None


# -- roles of client certificates (rocketmq.listen over ssl: with the group CA) -----------------------------------

#: A dledger client role -> what it may do on the broker port: read = SUB everywhere, write = PUB and SUB, admin =
#: everything.  Members may do everything (a slave relays sends and syncs metadata from its master).
ROLE_PERMS = {"read": SUB, "write": PUB | SUB, "admin": PUB | SUB, "member": PUB | SUB}


def decide_role(role: str | None, code: int, ext: Mapping[str, str], body: bytes | None, *,
                admin_codes: frozenset[int] = ADMIN_CODES) -> Refusal | None:
    """The decision for a connection authenticated by its client certificate (``role`` None: no certificate)."""
    if role is None or role not in ROLE_PERMS:
        return Refusal(f"No client certificate with a role (read, write, admin) for request code={code}",
                       "validate(certificate)")
    if code in admin_codes and role not in ("admin", "member"):
        return Refusal(f"Need admin permission for request code={code}, but the certificate's role is {role}",
                       _check_perm(581))
    owned = ROLE_PERMS[role]
    try:
        needed = needs(code, ext, body or b"")
    except RequestParseError as exc:
        return Refusal(str(exc), "parse(PlainAccessResource.java)")
    for resource, perm in needed.items():
        if not check_permission(perm, owned):
            return Refusal(f"No permission for {resource_text(resource)} with the certificate's role {role}",
                           _check_perm(611))
    return None
