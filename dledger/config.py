"""Member configuration: DLedger's option names and defaults, validated up front.

Options are snake_case attributes of :class:`DLedgerConfig`; TOML files and
command lines may use DLedger's camelCase names (``heartBeatTimeIntervalMs``)
or the snake_case ones.  Every problem is reported with the option's name,
the bad value and what would be accepted, because a member that starts with a
wrong peer list or timer is far harder to debug than one that refuses to
start.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dledger.entry import INDEX_UNIT_SIZE, MIN_BLANK_LEN
from dledger.errors import ConfigError
from dledger.quorum import majority

GiB = 1024 * 1024 * 1024
MiB = 1024 * 1024

FLUSH_POLICIES = ("sync", "async")
_ID_RE = re.compile(r"^[A-Za-z0-9_.]+$")


@dataclass(frozen=True, slots=True)
class Peer:
    """One member of the group: its id and the host/port it listens on."""

    id: str
    host: str
    port: int

    @property
    def address(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        return f"{self.id}-{self.address}"


def parse_peers(text: str) -> dict[str, Peer]:
    """Parse ``n0-127.0.0.1:20911;n1-127.0.0.1:20912`` into an ordered ``{id: Peer}``.

    The id is everything before the first ``-`` (as in DLedger), so host
    names may contain dashes; IPv6 hosts are written in brackets.
    """
    if not isinstance(text, str) or not text.strip():
        raise ConfigError("peers: empty; expected 'id-host:port' items separated by ';', "
                          "e.g. 'n0-127.0.0.1:20911;n1-127.0.0.1:20912'")
    peers: dict[str, Peer] = {}
    for pos, item in enumerate(text.strip().split(";")):
        item = item.strip()
        if not item:
            raise ConfigError(f"peers: empty item #{pos + 1} in {text!r} (stray ';' separator)")
        peer_id, dash, address = item.partition("-")
        if not dash:
            raise ConfigError(f"peers: item {item!r} has no '-' between id and address (expected 'id-host:port')")
        if not peer_id:
            raise ConfigError(f"peers: item {item!r} has an empty member id")
        if not _ID_RE.match(peer_id):
            raise ConfigError(f"peers: member id {peer_id!r} may only contain letters, digits, '_' and '.'")
        host, port = _parse_address(address, item)
        if peer_id in peers:
            raise ConfigError(f"peers: duplicate member id {peer_id!r} in {text!r}")
        peers[peer_id] = Peer(peer_id, host, port)
    return peers


def _parse_address(address: str, item: str) -> tuple[str, int]:
    if address.startswith("["):
        host, sep, rest = address[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ConfigError(f"peers: item {item!r}: bad IPv6 address, expected '[host]:port'")
        port_text = rest[1:]
    else:
        host, sep, port_text = address.rpartition(":")
        if not sep:
            raise ConfigError(f"peers: item {item!r} has no ':port' after the host")
    if not host:
        raise ConfigError(f"peers: item {item!r} has an empty host")
    if not port_text.isdigit():
        raise ConfigError(f"peers: item {item!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ConfigError(f"peers: item {item!r}: port {port} is out of range 1-65535")
    return host, port


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


@dataclass(frozen=True)
class DLedgerConfig:
    """Configuration of one member. Defaults are Java DLedger 0.3.2's unless noted."""

    # identity
    group: str = "default"
    self_id: str = "n0"
    peers: str = "n0-127.0.0.1:20911"
    preferred_leader_ids: str = ""
    # stores
    store_type: str = "memory"  # dledger: plugin name (memory, mmap, lmdb, ...)
    store_base_dir: str = "/tmp/dledgerstore"
    adopt_store: bool = False  # dledger: take over a store whose identity names another group/member (once)
    mapped_file_size_for_entry_data: int = 1 * GiB
    mapped_file_size_for_entry_index: int = 5242880 * INDEX_UNIT_SIZE  # 160 MiB
    max_entry_size: int = 4 * MiB  # dledger: refuse larger entries with a clear error
    flush_policy: str = "sync"  # dledger: "async" is Java's behaviour
    flush_file_interval: int = 10  # ms, async policy
    check_point_interval: int = 3000  # ms
    file_reserved_hours: int = 72
    delete_when: str = "04"
    disk_space_ratio_to_check_expired: float = 0.70
    disk_space_ratio_to_force_clean: float = 0.85
    enable_disk_force_clean: bool = True
    disk_full_ratio: float = 0.90
    accept_java_zero_crc: bool = True  # dledger: accept entries whose bodyCrc is 0 (Java-written) as unverified
    lmdb_map_size: int = 1 * GiB  # dledger: initial LMDB map size; grows on demand
    truncate_damaged: bool = False  # dledger: let mmap recovery cut the log at damage it would refuse to cut
    scrub_interval_seconds: float = 86400.0  # dledger: seconds between background scrub passes (0: no scrub)
    scrub_bytes_per_second: int = 8 * MiB  # dledger: how fast a scrub pass reads the data files
    # snapshots and compaction (issue #22, docs/snapshots.md); used only when a state machine is registered
    snapshot_threshold: int = 8192  # entries applied since the last snapshot that trigger one (0: off; Java 1000)
    snapshot_threshold_bytes: int = 256 * MiB  # dledger: bytes of entries since the last snapshot (0: off)
    max_snapshot_reserved_num: int = 3  # complete snapshots kept (Java's maxSnapshotReservedNum)
    trailing_entries: int = 10240  # dledger: entries kept below a snapshot's index when the log is compacted
    snapshot_chunk_size: int = 256 * 1024  # dledger: bytes of one InstallSnapshot chunk
    snapshot_file_size: int = 64 * MiB  # dledger: the most bytes of one snapshot chunk file
    # transport
    transport_type: str = "tcp"  # dledger: plugin name (tcp, inprocess, ...)
    listen: str = ""  # dledger: endpoint string; default tcp:<port of selfId>
    max_frame_size: int = 16 * MiB  # dledger: larger frames are refused
    max_connections: int = 1024  # dledger: incoming connections per member
    max_connections_per_address: int = 256  # dledger: incoming connections from one host
    connection_idle_timeout_ms: int = 120000  # dledger: close a connection with no complete frame for this long
    max_buffered_bytes_per_connection: int = 17 * MiB  # dledger: unfinished-frame bytes per connection
    max_buffered_bytes_total: int = 64 * MiB  # dledger: unfinished-frame bytes across connections; reading pauses
    connection_handshake_timeout_ms: int = 10000  # dledger: every port: a TLS handshake must finish within this
    request_read_timeout_ms: int = 10000  # dledger: every port: a request must arrive within this of its first byte
    max_http_body_bytes: int = 64 * 1024  # dledger: metrics/status port: larger request bodies are refused (413)
    fd_reserve: int = 64  # dledger: file descriptors no listener may take (stores, peer links, logs)
    # security (issue #13, docs/security.md)
    auth_mode: str = "none"  # dledger: none (Java's behaviour), tls (mutual TLS) or secret (group secret HMAC)
    tls_cert: str = ""  # dledger: this member's certificate (PEM); set: the port and peer links speak TLS
    tls_key: str = ""  # dledger: its private key (PEM)
    tls_ca: str = ""  # dledger: the group's CA certificate(s) (PEM; several while rotating the CA)
    group_secret_file: str = ""  # dledger: authMode=secret: the group secret(s), one a line, the first is used
    clients_file: str = ""  # dledger: client names, roles (read, write, admin) and tokens: 'NAME ROLE [TOKEN ...]'
    anonymous_role: str = "none"  # dledger: with authentication on, what unauthenticated clients may do
    # election
    enable_leader_elector: bool = True
    heart_beat_time_interval_ms: int = 2000
    max_heart_beat_leak: int = 3
    min_vote_interval_ms: int = 300
    max_vote_interval_ms: int = 1000
    # leadership transfer
    max_leadership_transfer_wait_index: int = 1000
    min_take_leadership_vote_interval_ms: int = 30
    max_take_leadership_vote_interval_ms: int = 100
    leadership_transfer_wait_timeout: int = 1000  # ms
    # replication
    max_pending_requests_num: int = 10000
    max_wait_ack_time_ms: int = 2500
    max_push_time_out_ms: int = 1000
    enable_batch_push: bool = True  # dledger: on by default (Java: off)
    max_batch_push_size: int = MiB  # bytes per push (Java: 4 KiB); each push is a flush round on a follower
    max_pending_size: int = 1000  # in-flight pushes per follower
    # dledger: bytes of pushes in flight per follower, in full pushes (maxBatchPushSize each); see docs/configuration.md
    max_in_flight_full_pushes: int = 4
    enable_fast_advance_commit_index: bool = True  # dledger: NOOP at term start (Java: off)
    # membership change (issue #23, docs/operations.md "Replacing a member")
    join_existing: bool = False  # dledger: this member joins a running group: a learner until the log says otherwise
    learner_promote_lag: int = 1000  # dledger: a learner to be a voter is promoted within this lag (-1: never)
    # the member process (issue #28, docs/configuration.md)
    switch_interval_ms: float = 5.0  # dledger: the interpreter's GIL switch interval (Python's own: 5 ms)
    # plugins may add options; they arrive here, validated against their declarations
    extras: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _validate(self)

    # -- derived -------------------------------------------------------------
    @functools.cached_property
    def members(self) -> dict[str, Peer]:
        """The parsed peer list, in configuration order."""
        return parse_peers(self.peers)

    @property
    def self_peer(self) -> Peer:
        return self.members[self.self_id]

    @property
    def preferred_leaders(self) -> tuple[str, ...]:
        return tuple(p.strip() for p in self.preferred_leader_ids.split(";") if p.strip())

    @property
    def quorum(self) -> int:
        return majority(len(self.members))

    @property
    def member_dir(self) -> Path:
        """``<storeBaseDir>/dledger-<selfId>``, where a durable store keeps its files."""
        return Path(self.store_base_dir) / f"dledger-{self.self_id}"

    def replace(self, **changes: Any) -> DLedgerConfig:
        """A copy with some options changed (camelCase or snake_case names)."""
        return dataclasses.replace(self, **_normalize(changes, "override"))

    def to_dict(self, camel: bool = True) -> dict[str, Any]:
        """Options as a dict, keyed by DLedger's camelCase names by default."""
        out = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            out[_camel(f.name) if camel else f.name] = dict(value) if f.name == "extras" else value
        return out


OPTION_NAMES: dict[str, str] = {}
for _f in dataclasses.fields(DLedgerConfig):
    OPTION_NAMES[_f.name] = _f.name
    OPTION_NAMES[_camel(_f.name)] = _f.name
# Java's boolean getter spelling.
OPTION_NAMES["isEnableBatchPush"] = "enable_batch_push"

#: Timer presets.  ``fast`` is for tests, demos and benchmarks on loopback.
PRESETS: dict[str, dict[str, Any]] = {
    "default": {},
    "fast": {
        "heart_beat_time_interval_ms": 100,
        "max_heart_beat_leak": 3,
        "min_vote_interval_ms": 50,
        "max_vote_interval_ms": 150,
        "max_wait_ack_time_ms": 1500,
        "max_push_time_out_ms": 300,
        "leadership_transfer_wait_timeout": 500,
        "check_point_interval": 500,
    },
}


def _normalize(options: Mapping[str, Any], source: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in options.items():
        name = OPTION_NAMES.get(key)
        if name is None:
            close = difflib.get_close_matches(key, list(OPTION_NAMES), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"{source}: unknown option {key!r}{hint}")
        if name in out:
            raise ConfigError(f"{source}: option {key!r} given twice (camelCase and snake_case)")
        out[name] = value
    return out


_FIELD_TYPES = {f.name: f.type for f in dataclasses.fields(DLedgerConfig)}


class ResolvedExtras(dict):
    """Plugin option values already resolved (:func:`dledger.plugins.resolve_extras`): checked, defaults filled in.

    ``explicit`` names the options a file, a command line or a caller set; every other value is its
    option's default.  Resolving these again checks nothing twice: set values were converted once
    (an option's ``coerce`` need not accept its own result) and defaults are never type-checked
    (``None`` is a fine default for a ``str`` option), so ``twistd dledger``, which resolves a
    member's config before the member does, behaves as the in-process ``Cluster``.
    """

    def __init__(self, values: Mapping[str, Any] = (), explicit: frozenset[str] | set[str] = frozenset()):
        super().__init__(values)
        self.explicit = frozenset(explicit)

    def copy(self) -> ResolvedExtras:
        return ResolvedExtras(self, self.explicit)


def _coerce(name: str, value: Any) -> Any:
    if name == "extras":
        if not isinstance(value, Mapping):
            raise ConfigError(f"extras: expected a table, got {value!r}")
        return value.copy() if isinstance(value, ResolvedExtras) else dict(value)
    return coerce_typed(_camel(name), _FIELD_TYPES[name], value)


def coerce_typed(label: str, kind: str, value: Any, *, text: bool = False) -> Any:
    """``value`` as a ``kind`` option (``"bool"``, ``"int"``, ``"float"``, ``"str"``); ConfigError naming ``label``.

    One rule for core options and plugin options (:mod:`dledger.plugins`). Core options come from
    TOML, which has real numbers and booleans, so a quoted ``"100"`` or ``"yes"`` there is refused
    (``text=False``): the docs promise wrong types are refused, and a string that looks like a number
    is usually a value meant for another option. Plugin options may also come from
    ``--plugin-opt name=value`` on a command line, where every value is text, so they are parsed
    from text (``text=True``: ``"5"``, ``"true"``/``"yes"``/``"1"``).
    """
    unquoted = "" if text else " (unquoted)"
    if kind == "bool":
        if isinstance(value, bool):
            return value
        if text and isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        what = "true or false" if text else "true or false (a TOML boolean, unquoted)"
        raise ConfigError(f"{label}: expected {what}, got {value!r}")
    if kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text and isinstance(value, str) and re.fullmatch(r"-?\d+", value.strip()):
            return int(value)
        raise ConfigError(f"{label}: expected an integer{unquoted}, got {value!r}")
    if kind == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if text and isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(f"{label}: expected a number{unquoted}, got {value!r}")
    if kind == "str":
        if isinstance(value, (str, int)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(f"{label}: expected a string, got {value!r}")
    return value


def _validate(cfg: DLedgerConfig) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        coerced = _coerce(f.name, value)
        if coerced is not value:
            object.__setattr__(cfg, f.name, coerced)

    def positive(*names: str) -> None:
        for n in names:
            if getattr(cfg, n) <= 0:
                raise ConfigError(f"{_camel(n)}: must be > 0, got {getattr(cfg, n)}")

    members = parse_peers(cfg.peers)
    if not cfg.group:
        raise ConfigError("group: must not be empty")
    if cfg.self_id not in members:
        raise ConfigError(f"selfId: {cfg.self_id!r} is not one of the peers {list(members)} "
                          f"(peers={cfg.peers!r})")
    for pid in cfg.preferred_leaders:
        if pid not in members:
            raise ConfigError(f"preferredLeaderIds: {pid!r} is not one of the peers {list(members)}")
    positive("heart_beat_time_interval_ms", "max_heart_beat_leak", "min_vote_interval_ms",
             "max_vote_interval_ms", "max_pending_requests_num", "max_wait_ack_time_ms",
             "max_push_time_out_ms", "mapped_file_size_for_entry_data",
             "mapped_file_size_for_entry_index", "max_entry_size", "flush_file_interval",
             "check_point_interval", "max_batch_push_size", "max_pending_size", "max_in_flight_full_pushes",
             "min_take_leadership_vote_interval_ms",
             "max_take_leadership_vote_interval_ms", "leadership_transfer_wait_timeout",
             "max_frame_size", "lmdb_map_size")
    if cfg.min_vote_interval_ms > cfg.max_vote_interval_ms:
        raise ConfigError(f"minVoteIntervalMs ({cfg.min_vote_interval_ms}) must not exceed "
                          f"maxVoteIntervalMs ({cfg.max_vote_interval_ms})")
    if cfg.min_take_leadership_vote_interval_ms > cfg.max_take_leadership_vote_interval_ms:
        raise ConfigError("minTakeLeadershipVoteIntervalMs must not exceed maxTakeLeadershipVoteIntervalMs")
    if cfg.mapped_file_size_for_entry_index % INDEX_UNIT_SIZE:
        raise ConfigError(f"mappedFileSizeForEntryIndex: {cfg.mapped_file_size_for_entry_index} is not a "
                          f"multiple of the {INDEX_UNIT_SIZE}-byte index record")
    if cfg.mapped_file_size_for_entry_data < 64 + MIN_BLANK_LEN:
        raise ConfigError(f"mappedFileSizeForEntryData: {cfg.mapped_file_size_for_entry_data} is too small")
    if cfg.flush_policy not in FLUSH_POLICIES:
        raise ConfigError(f"flushPolicy: {cfg.flush_policy!r} is not one of {', '.join(FLUSH_POLICIES)}")
    if cfg.file_reserved_hours < 0:
        raise ConfigError(f"fileReservedHours: must be >= 0, got {cfg.file_reserved_hours}")
    for hour in cfg.delete_when.split(";"):
        if not (hour.isdigit() and 0 <= int(hour) <= 23):
            raise ConfigError(f"deleteWhen: {cfg.delete_when!r} must be hours 00-23 separated by ';'")
    for n in ("disk_space_ratio_to_check_expired", "disk_space_ratio_to_force_clean", "disk_full_ratio"):
        if not 0 < getattr(cfg, n) <= 1:
            raise ConfigError(f"{_camel(n)}: must be in (0, 1], got {getattr(cfg, n)}")
    if cfg.max_leadership_transfer_wait_index < 0:
        raise ConfigError("maxLeadershipTransferWaitIndex: must be >= 0")
    if not 0 < cfg.switch_interval_ms <= 1000:
        raise ConfigError(f"switchIntervalMs: must be > 0 and <= 1000 ms (Python's own is 5), "
                          f"got {cfg.switch_interval_ms}")
    if cfg.scrub_interval_seconds < 0:
        raise ConfigError(f"scrubIntervalSeconds: must be >= 0 (0 turns the scrub off), "
                          f"got {cfg.scrub_interval_seconds}")
    positive("scrub_bytes_per_second")
    _check_sizes(cfg)
    _validate_snapshots(cfg)
    _validate_membership(cfg)
    _validate_connection_limits(cfg)
    _validate_security(cfg)


#: The smallest ``maxFrameSize`` accepted: room for a remoting header and an empty request.
MIN_FRAME_SIZE = 64 * 1024
#: What a frame carries besides the entry: the remoting header and the request's JSON fields.
FRAME_OVERHEAD = 64 * 1024


def max_entry_size_for_frame(max_frame_size: int) -> int:
    """The largest ``maxEntrySize`` whose entry still fits in one frame of ``max_frame_size`` bytes.

    A push to a Java follower and a JSON APPEND carry the body in Base64 (4 bytes per 3), plus the
    remoting header and the request's other fields; an entry that cannot travel in one frame could be
    appended on the leader but never replicated.
    """
    return (max_frame_size - FRAME_OVERHEAD) * 3 // 4


def push_budget(max_batch_push_size: int, max_frame_size: int) -> int:
    """The bytes of entries a leader puts in one push: ``maxBatchPushSize``, but never more than a frame holds.

    A push travels in one frame (as JSON with Base64 bodies to a Java follower), so with a small
    ``maxFrameSize`` the default 1 MiB push is cut to what :func:`max_entry_size_for_frame` allows;
    otherwise the follower would refuse the frame and replication would stop.
    """
    return max(1, min(max_batch_push_size, max_entry_size_for_frame(max_frame_size)))


def _check_sizes(cfg: DLedgerConfig) -> None:
    """Options whose valid range depends on another option, and strings that must not be empty."""
    for n in ("store_base_dir", "store_type", "transport_type"):
        if not getattr(cfg, n).strip():
            raise ConfigError(f"{_camel(n)}: must not be empty")
    if cfg.max_frame_size < MIN_FRAME_SIZE:
        raise ConfigError(f"maxFrameSize: must be at least {MIN_FRAME_SIZE} bytes (64 KiB), got {cfg.max_frame_size}")
    limit = max_entry_size_for_frame(cfg.max_frame_size)
    if cfg.max_entry_size > limit:
        raise ConfigError(f"maxEntrySize: {cfg.max_entry_size} does not fit in a frame of maxFrameSize "
                          f"{cfg.max_frame_size} bytes (Base64 plus header); use at most {limit}, or raise "
                          f"maxFrameSize")




def _validate_membership(cfg: DLedgerConfig) -> None:
    """The membership options (issue #23): a promotion lag of -1 (never automatically) or more."""
    if cfg.learner_promote_lag < -1:
        raise ConfigError(f"learnerPromoteLag: must be -1 (promote only by command) or >= 0 entries, "
                          f"got {cfg.learner_promote_lag}")


def _validate_snapshots(cfg: DLedgerConfig) -> None:
    """The snapshot options (issue #22): counts >= 0, at least one snapshot kept, chunks that fit a frame."""
    for n in ("snapshot_threshold", "snapshot_threshold_bytes", "trailing_entries"):
        if getattr(cfg, n) < 0:
            raise ConfigError(f"{_camel(n)}: must be >= 0 (0 turns it off), got {getattr(cfg, n)}")
    if cfg.max_snapshot_reserved_num < 1:
        raise ConfigError(f"maxSnapshotReservedNum: must be >= 1 (the newest snapshot is always kept), "
                          f"got {cfg.max_snapshot_reserved_num}")
    if cfg.snapshot_file_size < 4096:
        raise ConfigError(f"snapshotFileSize: must be at least 4096 bytes, got {cfg.snapshot_file_size}")
    if not 1024 <= cfg.snapshot_chunk_size <= max_entry_size_for_frame(cfg.max_frame_size):
        raise ConfigError(f"snapshotChunkSize: must be between 1024 and "
                          f"{max_entry_size_for_frame(cfg.max_frame_size)} bytes (what one frame of maxFrameSize "
                          f"{cfg.max_frame_size} carries), got {cfg.snapshot_chunk_size}")


def _validate_connection_limits(cfg: DLedgerConfig) -> None:
    """The transport's resource limits (issue #9, item 14): positive, and consistent with maxFrameSize."""
    for n in ("max_connections", "max_connections_per_address", "connection_idle_timeout_ms",
              "max_buffered_bytes_per_connection", "max_buffered_bytes_total", "connection_handshake_timeout_ms",
              "request_read_timeout_ms", "max_http_body_bytes", "fd_reserve"):
        if getattr(cfg, n) <= 0:
            raise ConfigError(f"{_camel(n)}: must be > 0, got {getattr(cfg, n)}")
    if cfg.max_connections_per_address > cfg.max_connections:
        raise ConfigError(f"maxConnectionsPerAddress ({cfg.max_connections_per_address}) must not exceed "
                          f"maxConnections ({cfg.max_connections})")
    if cfg.max_buffered_bytes_per_connection < cfg.max_frame_size:
        raise ConfigError(f"maxBufferedBytesPerConnection ({cfg.max_buffered_bytes_per_connection}) must be at "
                          f"least maxFrameSize ({cfg.max_frame_size}), or no frame of that size could arrive")
    if cfg.max_buffered_bytes_total < cfg.max_buffered_bytes_per_connection:
        raise ConfigError(f"maxBufferedBytesTotal ({cfg.max_buffered_bytes_total}) must be at least "
                          f"maxBufferedBytesPerConnection ({cfg.max_buffered_bytes_per_connection})")


def _validate_security(cfg: DLedgerConfig) -> None:
    """authMode and its credentials (issue #13): what each mode needs is present (files are read at start)."""
    from dledger.security.policy import ANONYMOUS_ROLES, AUTH_MODES

    for name in ("tls_cert", "tls_key"):  # one shared config file for every member: "{selfId}" in the paths
        value = getattr(cfg, name)
        if "{selfId}" in value:
            object.__setattr__(cfg, name, value.replace("{selfId}", cfg.self_id))
    if cfg.auth_mode not in AUTH_MODES:
        raise ConfigError(f"authMode: {cfg.auth_mode!r} is not one of {', '.join(AUTH_MODES)}")
    if cfg.anonymous_role not in ANONYMOUS_ROLES:
        raise ConfigError(f"anonymousRole: {cfg.anonymous_role!r} is not one of {', '.join(ANONYMOUS_ROLES)}")
    tls = {"tlsCert": cfg.tls_cert, "tlsKey": cfg.tls_key, "tlsCa": cfg.tls_ca}
    if any(tls.values()) and not all(tls.values()):
        missing = ", ".join(k for k, v in tls.items() if not v)
        raise ConfigError(f"{missing}: must be set together with the other TLS options (tlsCert, tlsKey, tlsCa)")
    if cfg.auth_mode == "tls" and not cfg.tls_cert:
        raise ConfigError("authMode: 'tls' needs tlsCert, tlsKey and tlsCa (see 'dledger certs init')")
    if cfg.auth_mode == "secret" and not cfg.group_secret_file:
        raise ConfigError("authMode: 'secret' needs groupSecretFile (a file with a secret of 16+ bytes)")


def make_config(*, preset: str = "default", file: str | Path | None = None,
                **overrides: Any) -> DLedgerConfig:
    """Build a config from a preset, then a TOML file, then keyword overrides (later wins).

    >>> make_config(group="g0", self_id="n1", peers="n0-127.0.0.1:20911;n1-127.0.0.1:20912").quorum
    2
    """
    if preset not in PRESETS:
        raise ConfigError(f"preset: {preset!r} is not one of {', '.join(PRESETS)}")
    options: dict[str, Any] = dict(PRESETS[preset])
    if file is not None:
        options.update(load_toml(file))
    options.update(_normalize(overrides, "override"))
    return DLedgerConfig(**options)


def load_toml(path: str | Path) -> dict[str, Any]:
    """Read a TOML config file into normalized options.

    Top-level keys are options; a ``[plugins]`` table is passed to plugins as
    ``extras``; a ``preset = "fast"`` key applies a timer preset first.
    """
    path = Path(path)
    try:
        with path.open("rb") as fh:
            data = tomllib.load(fh)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {str(path)!r}: {exc}") from None
    data = dict(data)
    options: dict[str, Any] = {}
    preset = data.pop("preset", None)
    if preset is not None:
        if preset not in PRESETS:
            raise ConfigError(f"{path}: preset {preset!r} is not one of {', '.join(PRESETS)}")
        options.update(PRESETS[preset])
    plugins = data.pop("plugins", None)
    options.update(_normalize(data, str(path)))
    if plugins is not None:
        options["extras"] = plugins
    return options
