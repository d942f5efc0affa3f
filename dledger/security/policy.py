"""The authorisation decisions: which request code needs which credential, and does a claimed id match.

Every function here is pure (no I/O, no clock) and table-tested in tests/test_security_policy.py.
The remoting protocol (:mod:`dledger.transport.protocol`) asks :func:`decide` about every request
before the member's handler sees it -- the one place -- so a request code added later is covered
by default: a code this table does not know needs the ``member`` permission.  Once a request is decoded,
:func:`decide_request` checks every id it names against the authenticated identity (:data:`ID_RULES`, one
row per request code).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dledger.codes import PLUGIN_REQUEST_CODES, RequestCode

AUTH_MODES = ("none", "tls", "secret")
#: Client roles (``clientsFile``) and what each may do; ``member`` is implied by a member credential.
ROLES = ("read", "write", "admin")
ANONYMOUS_ROLES = ("none", "read", "write")


class Permission(enum.Enum):
    """What a request needs."""

    READ = "read"      # GET, METADATA with the peer map
    WRITE = "write"    # APPEND
    ADMIN = "admin"    # LEADERSHIP_TRANSFER from a client, SNAPSHOT, MEMBERS (list and change the configuration)
    MEMBER = "member"  # VOTE, HEART_BEAT, PUSH, PULL, INSTALL_SNAPSHOT and every code not listed below


#: The permission each known request code needs.  Codes missing here need ``MEMBER``.
REQUIRED: dict[int, Permission] = {
    RequestCode.METADATA: Permission.READ,
    RequestCode.GET: Permission.READ,
    RequestCode.APPEND: Permission.WRITE,
    RequestCode.LEADERSHIP_TRANSFER: Permission.ADMIN,
    RequestCode.SNAPSHOT: Permission.ADMIN,
    # One code for "list" and the changes, decided before the request is decoded: admin for all of them.  A
    # read-only client sees the members' roles in METADATA (``dledger metadata``) instead.
    RequestCode.MEMBERS: Permission.ADMIN,
    RequestCode.VOTE: Permission.MEMBER,
    RequestCode.HEART_BEAT: Permission.MEMBER,
    RequestCode.PULL: Permission.MEMBER,
    RequestCode.PUSH: Permission.MEMBER,
    RequestCode.INSTALL_SNAPSHOT: Permission.MEMBER,
}

_GRANTS: dict[str, frozenset[Permission]] = {
    "none": frozenset(),
    "read": frozenset({Permission.READ}),
    "write": frozenset({Permission.READ, Permission.WRITE}),
    "admin": frozenset({Permission.READ, Permission.WRITE, Permission.ADMIN}),
    "member": frozenset(Permission),
}


def required_permission(code: int, plugin_role: str | None = None) -> Permission:
    """The permission request ``code`` needs (``MEMBER`` for a code not in :data:`REQUIRED`: deny by default).

    A plugin request code (``codes.PLUGIN_REQUEST_CODES``) needs the role its handler declares
    (``plugin_role``: ``read``, ``write``, ``admin`` or ``member``); one no plugin serves here needs ``MEMBER``.
    """
    if plugin_role is not None and code in PLUGIN_REQUEST_CODES:
        return Permission(plugin_role)
    return REQUIRED.get(code, Permission.MEMBER)


@dataclass(frozen=True)
class Identity:
    """Who is on the other end of a connection: a member, a client with a role, or nobody known."""

    kind: str                      # "member", "client" or "anonymous"
    name: str = ""
    role: str = "none"             # a client's role; "member" for members
    grants: frozenset[Permission] = field(default=frozenset(), compare=False)

    @classmethod
    def member(cls, name: str) -> Identity:
        return cls("member", name, "member", _GRANTS["member"])

    @classmethod
    def client(cls, name: str, role: str) -> Identity:
        return cls("client", name, role, grants_of(role))

    @classmethod
    def anonymous(cls, role: str = "none") -> Identity:
        return cls("anonymous", "", role, grants_of(role))

    def __str__(self) -> str:
        if self.kind == "anonymous":
            return "an unauthenticated peer"
        return f"{self.kind} {self.name!r}" + (f" (role {self.role})" if self.kind == "client" else "")


def grants_of(role: str) -> frozenset[Permission]:
    """The permissions of a role name (ValueError for an unknown one)."""
    try:
        return _GRANTS[role]
    except KeyError:
        raise ValueError(f"unknown role {role!r}; expected one of {', '.join(ROLES)}") from None


class Verdict(enum.Enum):
    ALLOW = "allow"
    REDACT = "redact"  # METADATA without READ: answered, but with no peer map and no leader
    DENY = "deny"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""

    @property
    def allowed(self) -> bool:
        return self.verdict is not Verdict.DENY


ALLOW = Decision(Verdict.ALLOW)


@dataclass(frozen=True)
class IdRule:
    """How the id fields of one request code are checked against the connection's authenticated identity.

    ``sender``: fields that say who sends (``leader_id``, ``local_id``): a member must name itself there, a
    client names no member (they must be empty).  ``member_self``: more fields a *member* must fill with its
    own id (a transfer's ``transfer_id``).  ``needs_sender``: a member must name itself in at least one sender
    field.  ``leader_only``: a member may send it only while the receiving member follows it (the current
    leader, speaking for itself).  ``free``: the other id fields, each with why it is no claim about the sender.
    """

    sender: tuple[str, ...] = ("leader_id", "local_id")
    member_self: tuple[str, ...] = ()
    needs_sender: bool = False
    leader_only: bool = False
    free: dict[str, str] = field(default_factory=dict)

    @property
    def fields(self) -> tuple[str, ...]:
        """Every id field this row covers."""
        return (*self.sender, *self.member_self, *self.free)


_RECEIVER = "names the receiving member; a request for another member is answered by the member itself"
_GROUP = "names the group; a request for another group is answered UNKNOWN_GROUP by the member"
_CLIENT_CODE = {"remote_id": _RECEIVER, "group": _GROUP}
_MEMBER_CODE = dict(needs_sender=True, free={"remote_id": _RECEIVER, "group": _GROUP})

#: Request code -> how its id fields are checked (issue #21 item 3).  Every :class:`RequestCode` has a row
#: (tests/test_security_policy.py fails for a code without one, and for an id field of a request class that
#: its row does not name); a code that is not in the table is refused to every identity but the member
#: naming itself (:data:`DEFAULT_ID_RULE`).
ID_RULES: dict[int, IdRule] = {
    RequestCode.METADATA: IdRule(free=_CLIENT_CODE),
    RequestCode.APPEND: IdRule(free=_CLIENT_CODE),
    RequestCode.GET: IdRule(free=_CLIENT_CODE),
    RequestCode.SNAPSHOT: IdRule(free=_CLIENT_CODE),
    RequestCode.MEMBERS: IdRule(free={**_CLIENT_CODE,
                                      "member_id": "the member to add, promote or remove: the admin's choice, "
                                                   "checked by the leader against the configuration"}),
    RequestCode.VOTE: IdRule(**_MEMBER_CODE),
    RequestCode.HEART_BEAT: IdRule(**_MEMBER_CODE),
    RequestCode.PULL: IdRule(**_MEMBER_CODE),
    RequestCode.PUSH: IdRule(**_MEMBER_CODE),
    RequestCode.INSTALL_SNAPSHOT: IdRule(**_MEMBER_CODE),
    # An admin client asks the leader (transferId = the leader, no sender); the leader then asks the transferee
    # in its own name (leaderId = localId = transferId = itself).  No other member may move leadership.
    RequestCode.LEADERSHIP_TRANSFER: IdRule(member_self=("transfer_id",), needs_sender=True, leader_only=True,
                                            free={"transferee_id": "whom leadership goes to: the admin's or the "
                                                  "leader's choice, checked by the leader (a member, caught up)",
                                                  "remote_id": _RECEIVER, "group": _GROUP}),
}
DEFAULT_ID_RULE = IdRule(**_MEMBER_CODE)
#: Every plugin request code (``codes.PLUGIN_REQUEST_CODES``, a :class:`dledger.messages.PluginRequest`) is
#: checked as the client codes are: a member names only itself, a client names no member.
PLUGIN_ID_RULE = IdRule(free=_CLIENT_CODE)


def id_rule(code: int) -> IdRule:
    """The row of :data:`ID_RULES` for ``code`` (:data:`PLUGIN_ID_RULE` for a plugin's code,
    :data:`DEFAULT_ID_RULE` for any other code it does not list)."""
    rule = ID_RULES.get(code)
    if rule is None:
        return PLUGIN_ID_RULE if code in PLUGIN_REQUEST_CODES else DEFAULT_ID_RULE
    return rule


def request_ids(code: int, request: object) -> dict[str, str | None]:
    """The id fields of a decoded request that :func:`id_refusal` checks (missing attributes read as None)."""
    return {name: getattr(request, name, None) for name in id_rule(code).fields}


def id_refusal(code: int, ids: dict[str, str | None], identity: Identity,
               current_leader: str | None = None) -> str | None:
    """Why a request carrying ``ids`` may not come from ``identity``; None if every id it names is its own.

    ``current_leader`` is the member the receiving member follows now (LEADERSHIP_TRANSFER from a member
    needs it).  Only authenticated connections are asked (``authMode`` tls or secret).
    """
    rule = id_rule(code)
    claimed = {f: ids.get(f) for f in rule.sender if ids.get(f) is not None}
    if identity.kind != "member":
        if claimed:
            f, v = next(iter(claimed.items()))
            return f"{identity} claims to be member {v!r} ({_json_name(f)}); only a member speaks for itself"
        return None
    member = identity.name
    for f, v in {**claimed, **{f: ids.get(f) for f in rule.member_self}}.items():
        if v != member:
            return (f"it claims to come from {v!r} ({_json_name(f)}) but the connection is authenticated as "
                    f"member {member!r}")
    if rule.needs_sender and not claimed:
        return f"it names no member ({' and '.join(_json_name(f) for f in rule.sender)} are empty)"
    if rule.leader_only and current_leader != member:
        return (f"member {member!r} is not the leader this member follows ({current_leader or 'none'}); only "
                "the current leader or an admin client may move leadership")
    return None


def _json_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


def decide(auth_mode: str, code: int, identity: Identity, plugin_role: str | None = None) -> Decision:
    """May ``identity`` send request ``code`` at all?  (Asked before the request is decoded.)

    With ``authMode = none`` everything is allowed (Java DLedger's behaviour).  Otherwise the code's
    permission (:func:`required_permission`; ``plugin_role``: the role a plugin's handler of ``code``
    declares) must be among the identity's grants.  METADATA without
    READ is REDACTed, not refused: a client can still learn it reached the right group, but no peer map.
    """
    if auth_mode == "none":
        return ALLOW
    need = required_permission(code, plugin_role)
    if need not in identity.grants:
        if code == RequestCode.METADATA:
            return Decision(Verdict.REDACT, f"{identity} has no read role: no peer map")
        if need is Permission.MEMBER:
            return Decision(Verdict.DENY, f"request code {code} is member-only; refused for {identity}")
        return Decision(Verdict.DENY, f"request code {code} needs the {need.value} role; refused for {identity}")
    return ALLOW


def decide_request(auth_mode: str, code: int, identity: Identity, ids: dict[str, str | None],
                   current_leader: str | None = None, plugin_role: str | None = None) -> Decision:
    """:func:`decide`, then (once decoded) every id the request names (:func:`id_refusal`, :data:`ID_RULES`)."""
    decision = decide(auth_mode, code, identity, plugin_role)
    if decision.verdict is not Verdict.ALLOW or auth_mode == "none":
        return decision
    why = id_refusal(code, ids, identity, current_leader)
    if why is not None:
        return Decision(Verdict.DENY, f"request code {code} refused: {why}")
    return ALLOW


def identity_from_subject(subject: dict[str, str], group: str, members: frozenset[str] | set[str],
                          client_roles: dict[str, str], anonymous_role: str = "none") -> tuple[Identity, str | None]:
    """The identity a verified certificate's subject proves, and why it proves less than it claims (or None).

    Certificates made by ``dledger certs init`` carry ``O=<group>``, ``OU=member`` or ``OU=client`` and
    ``CN=<id>``.  A member certificate of another group, or for an id that is not a member, proves
    nothing (anonymous); a client certificate gets the role ``clientsFile`` gives its name (none if absent).
    """
    org, unit, name = subject.get("O"), subject.get("OU"), subject.get("CN")
    anonymous = Identity.anonymous(anonymous_role)
    if not name:
        return anonymous, "the certificate has no common name (CN)"
    if org != group:
        return anonymous, f"the certificate is for group {org!r}, not {group!r}"
    if unit == "member":
        if name not in members:
            return anonymous, f"the certificate names {name!r}, which is not a member"
        return Identity.member(name), None
    if unit == "client":
        role = client_roles.get(name)
        if role is None:
            return anonymous, f"client {name!r} has no entry in clientsFile"
        return Identity.client(name, role), None
    return anonymous, f"the certificate's OU is {unit!r}, not 'member' or 'client'"
