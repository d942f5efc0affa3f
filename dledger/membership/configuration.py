"""A group configuration: who the members are, where they listen, and which of them vote.

A configuration is carried by a log entry of magic ``CONFIG_CHANGE`` (3): replicated and committed
like any entry, and in force on a member from the moment the entry is in its log, committed or not
(Raft's rule for single-server changes).  The bootstrap configuration -- every ``--peers`` member a
voter, or with ``joinExisting`` this member a learner -- applies only while the log holds no
configuration entry.

The body is UTF-8 JSON, so it reads well in ``dledger store dump`` and a Java DLedger member that
somehow receives one stores it as opaque bytes (Java never parses entry bodies)::

    {"dledgerConfig": 1, "members": [{"id": "n0", "address": "127.0.0.1:20911", "role": "voter"}, ...]}
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import dataclass

from dledger.quorum import majority

#: The body's format version; a member refuses a configuration of a version it does not know (loudly: it
#: cannot know who its voters are).
FORMAT = 1
_ID_RE = re.compile(r"^[A-Za-z0-9_.]+$")
_ADDRESS_RE = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):\d{1,5}$")


class ConfigurationError(ValueError):
    """A configuration body or a change request that is not a valid configuration (one line)."""


class MemberRole(enum.Enum):
    """What a member does in a configuration: voters elect and count toward quorums; learners only receive."""

    VOTER = "voter"
    LEARNER = "learner"


@dataclass(frozen=True, slots=True)
class MemberInfo:
    """One member of a configuration."""

    id: str
    address: str
    role: MemberRole = MemberRole.VOTER
    #: A learner the leader promotes to voter by itself once it has caught up (``dledger members add``
    #: without ``--learner``); False for a voter and for a learner that stays one until ``promote``.
    promote: bool = False

    @property
    def voter(self) -> bool:
        return self.role is MemberRole.VOTER

    def as_voter(self) -> MemberInfo:
        return MemberInfo(self.id, self.address, MemberRole.VOTER)

    def to_json(self) -> dict:
        doc = {"id": self.id, "address": self.address, "role": self.role.value}
        if self.promote and not self.voter:
            doc["promote"] = True
        return doc


def check_member(member_id: str, address: str) -> None:
    """Raise :class:`ConfigurationError` unless ``member_id`` and ``address`` are well formed."""
    if not _ID_RE.match(member_id or ""):
        raise ConfigurationError(f"member id {member_id!r} may only contain letters, digits, '_' and '.'")
    if not _ADDRESS_RE.match(address or ""):
        raise ConfigurationError(f"member {member_id}: address {address!r} is not 'host:port'")
    port = int(address.rsplit(":", 1)[1])
    if not 1 <= port <= 65535:
        raise ConfigurationError(f"member {member_id}: port {port} is out of range 1-65535")


@dataclass(frozen=True, slots=True)
class Configuration:
    """The members of a group, in order, and where this configuration came from.

    ``index``/``term`` are those of the log entry that carries it; 0/0 for the bootstrap configuration
    (``--peers``), and a snapshot's index/term for one restored from a snapshot manifest.
    """

    members: tuple[MemberInfo, ...]
    index: int = 0
    term: int = 0

    def __post_init__(self) -> None:
        seen: set[str] = set()
        for m in self.members:
            if m.id in seen:
                raise ConfigurationError(f"member {m.id!r} appears twice in the configuration")
            seen.add(m.id)

    # -- views ---------------------------------------------------------------
    @property
    def ids(self) -> tuple[str, ...]:
        """Every member, voters and learners, in order."""
        return tuple(m.id for m in self.members)

    @property
    def voters(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members if m.voter)

    @property
    def learners(self) -> tuple[str, ...]:
        return tuple(m.id for m in self.members if not m.voter)

    @property
    def quorum(self) -> int:
        """Votes or acknowledgements (the leader's own included, if it votes) that make a majority."""
        return majority(len(self.voters))

    @property
    def addresses(self) -> dict[str, str]:
        return {m.id: m.address for m in self.members}

    def get(self, member_id: str) -> MemberInfo | None:
        for m in self.members:
            if m.id == member_id:
                return m
        return None

    def is_voter(self, member_id: str) -> bool:
        m = self.get(member_id)
        return m is not None and m.voter

    def at(self, index: int, term: int) -> Configuration:
        """The same members, carried by the entry at ``index``/``term``."""
        return Configuration(self.members, index, term)

    def same_members(self, other: Configuration) -> bool:
        return self.members == other.members

    def describe(self) -> str:
        """``n0=127.0.0.1:20911 n1=... n3=...(learner)`` for logs and one-line errors."""
        return " ".join(f"{m.id}={m.address}" + ("" if m.voter else "(learner)") for m in self.members)

    def replace(self, member: MemberInfo) -> Configuration:
        """The members with ``member`` in place of the one of its id (appended when new); index/term unset."""
        if self.get(member.id) is None:
            return Configuration(self.members + (member,))
        return Configuration(tuple(member if m.id == member.id else m for m in self.members))

    def without(self, member_id: str) -> Configuration:
        return Configuration(tuple(m for m in self.members if m.id != member_id))

    # -- the entry body ----------------------------------------------------------
    def to_json(self) -> dict:
        return {"dledgerConfig": FORMAT, "members": [m.to_json() for m in self.members]}

    def encode(self) -> bytes:
        """The body of the CONFIG_CHANGE entry that carries this configuration."""
        return json.dumps(self.to_json(), separators=(",", ":"), sort_keys=True).encode("utf-8")


def decode(body: bytes | memoryview, index: int = 0, term: int = 0) -> Configuration:
    """The configuration in a CONFIG_CHANGE entry's body; :class:`ConfigurationError` (one line) if it is not one."""
    try:
        doc = json.loads(bytes(body).decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ConfigurationError(f"configuration entry {index}: not JSON ({e})") from None
    return from_json(doc, index, term)


def from_json(doc: object, index: int = 0, term: int = 0) -> Configuration:
    """A configuration from its JSON document (an entry body, a snapshot manifest, a reply)."""
    where = f"configuration entry {index}" if index else "configuration"
    if not isinstance(doc, dict) or doc.get("dledgerConfig") != FORMAT:
        raise ConfigurationError(f"{where}: not a dledger configuration of format {FORMAT}")
    members = doc.get("members")
    if not isinstance(members, list) or not members:
        raise ConfigurationError(f"{where}: 'members' must be a non-empty list")
    out = []
    for m in members:
        if not isinstance(m, dict):
            raise ConfigurationError(f"{where}: a member is not an object")
        mid, address, role = m.get("id"), m.get("address"), m.get("role", "voter")
        if not isinstance(mid, str) or not isinstance(address, str):
            raise ConfigurationError(f"{where}: member id and address must be strings")
        check_member(mid, address)
        try:
            parsed = MemberRole(role)
        except ValueError:
            raise ConfigurationError(f"{where}: member {mid}: unknown role {role!r}") from None
        promote = m.get("promote") is True and parsed is not MemberRole.VOTER
        out.append(MemberInfo(mid, address, parsed, promote=promote))
    if not any(m.voter for m in out):
        raise ConfigurationError(f"{where}: no voter")
    return Configuration(tuple(out), index, term)


def bootstrap(peers: dict, self_id: str, *, join_existing: bool = False) -> Configuration:
    """The configuration of an empty log: every peer (``config.members``) a voter.

    With ``join_existing`` this member is a learner of it: a member started to join a running group
    never stands for election before the group's log made it a voter.
    """
    members = []
    for pid, peer in peers.items():
        address = getattr(peer, "address", None) or f"{peer.host}:{peer.port}"
        role = MemberRole.LEARNER if join_existing and pid == self_id else MemberRole.VOTER
        members.append(MemberInfo(pid, address, role))
    return Configuration(tuple(members))
