"""The authorisation decisions: which request code needs which credential, and does a claimed id match.

Every function here is pure (no I/O, no clock) and table-tested in tests/test_security_policy.py.
The remoting protocol (:mod:`dledger.transport.protocol`) asks :func:`decide` about every request
before the member's handler sees it -- the one place -- so a request code added later is covered
by default: a code this table does not know needs the ``member`` permission.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from dledger.codes import RequestCode

AUTH_MODES = ("none", "tls", "secret")
#: Client roles (``clientsFile``) and what each may do; ``member`` is implied by a member credential.
ROLES = ("read", "write", "admin")
ANONYMOUS_ROLES = ("none", "read", "write")


class Permission(enum.Enum):
    """What a request needs."""

    READ = "read"      # GET, METADATA with the peer map
    WRITE = "write"    # APPEND
    ADMIN = "admin"    # LEADERSHIP_TRANSFER from a client (later: membership changes)
    MEMBER = "member"  # VOTE, HEART_BEAT, PUSH, PULL, INSTALL_SNAPSHOT and every code not listed below


#: The permission each known request code needs.  Codes missing here need ``MEMBER``.
REQUIRED: dict[int, Permission] = {
    RequestCode.METADATA: Permission.READ,
    RequestCode.GET: Permission.READ,
    RequestCode.APPEND: Permission.WRITE,
    RequestCode.LEADERSHIP_TRANSFER: Permission.ADMIN,
    RequestCode.VOTE: Permission.MEMBER,
    RequestCode.HEART_BEAT: Permission.MEMBER,
    RequestCode.PULL: Permission.MEMBER,
    RequestCode.PUSH: Permission.MEMBER,
    RequestCode.INSTALL_SNAPSHOT: Permission.MEMBER,
}

#: Member-to-member codes whose ``leaderId``/``localId`` must name the authenticated member.
CLAIMS_CHECKED = frozenset({RequestCode.VOTE, RequestCode.HEART_BEAT, RequestCode.PULL, RequestCode.PUSH,
                            RequestCode.INSTALL_SNAPSHOT})

_GRANTS: dict[str, frozenset[Permission]] = {
    "none": frozenset(),
    "read": frozenset({Permission.READ}),
    "write": frozenset({Permission.READ, Permission.WRITE}),
    "admin": frozenset({Permission.READ, Permission.WRITE, Permission.ADMIN}),
    "member": frozenset(Permission),
}


def required_permission(code: int) -> Permission:
    """The permission request ``code`` needs (``MEMBER`` for a code not in :data:`REQUIRED`: deny by default)."""
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


def claim_mismatch(code: int, leader_id: str | None, local_id: str | None, member: str) -> str | None:
    """Why a member-to-member request claiming ``leaderId``/``localId`` may not come from ``member``; None if it may.

    A member can only speak for itself: a certificate for n1 cannot carry a VOTE for candidate n2 or a
    PUSH from leader n2.  A member-to-member request that names no member at all is refused too.
    """
    if code not in CLAIMS_CHECKED:
        return None
    claimed = [c for c in (leader_id, local_id) if c is not None]
    if not claimed:
        return "it names no member (leaderId and localId are empty)"
    for c in claimed:
        if c != member:
            return f"it claims to come from {c!r} but the connection is authenticated as member {member!r}"
    return None


def decide(auth_mode: str, code: int, identity: Identity) -> Decision:
    """May ``identity`` send request ``code`` at all?  (Asked before the request is decoded.)

    With ``authMode = none`` everything is allowed (Java DLedger's behaviour).  Otherwise the code's
    permission (:func:`required_permission`) must be among the identity's grants.  METADATA without
    READ is REDACTed, not refused: a client can still learn it reached the right group, but no peer map.
    """
    if auth_mode == "none":
        return ALLOW
    need = required_permission(code)
    if need not in identity.grants:
        if code == RequestCode.METADATA:
            return Decision(Verdict.REDACT, f"{identity} has no read role: no peer map")
        if need is Permission.MEMBER:
            return Decision(Verdict.DENY, f"request code {code} is member-only; refused for {identity}")
        return Decision(Verdict.DENY, f"request code {code} needs the {need.value} role; refused for {identity}")
    return ALLOW


def decide_request(auth_mode: str, code: int, identity: Identity, leader_id: str | None,
                   local_id: str | None) -> Decision:
    """:func:`decide`, then (once decoded) a member's claims: a member-to-member request must name the
    authenticated member itself (:func:`claim_mismatch`)."""
    decision = decide(auth_mode, code, identity)
    if decision.verdict is not Verdict.ALLOW or auth_mode == "none" or identity.kind != "member":
        return decision
    why = claim_mismatch(code, leader_id, local_id, identity.name)
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
