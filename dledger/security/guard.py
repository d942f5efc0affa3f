"""What a member's port and its outgoing connections apply: the loaded credentials plus the policy.

:class:`ServerGuard` belongs to a listening port (one per member port, one per broker port), built
from the configuration by :meth:`ServerGuard.from_config`; :class:`ClientCredentials` is what the
connecting side presents.  :mod:`dledger.transport.protocol` calls them; the decisions themselves
are the pure functions of :mod:`dledger.security.policy` and :mod:`dledger.security.secret`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from twisted.logger import Logger

from dledger.errors import ConfigError
from dledger.ratelog import RateLimitedLog
from dledger.security import policy, secret, tls
from dledger.security.policy import Decision, Identity
from dledger.transport import remoting


def _one_line(exc: Exception) -> ConfigError:
    return ConfigError(str(exc))


def security_label(config: Any) -> str:
    """`` (TLS, authMode=tls)`` for the start-up line; `` (authMode=none)`` for a plain port without
    authentication: the line always says whether anyone can send anything (issue #21)."""
    parts = (["TLS"] if config.tls_cert else []) + [f"authMode={config.auth_mode}"]
    return f" ({', '.join(parts)})"


def open_port_warning(config: Any, address: str) -> str | None:
    """The one warning line a member with ``authMode = none`` logs at start (None with authentication on).

    Why: ``none`` is the default (Java DLedger's behaviour), and a group started without a word about it
    lets anyone who can reach the port erase the log.  The line says so and how to turn authentication on.
    """
    if config.auth_mode != "none" or config.transport_type != "tcp":
        return None
    return (f"authMode is none: anyone who can reach {address} can erase or rewrite this member's log, force "
            "elections and move leadership. Turn authentication on with authMode = \"tls\" (certificates from "
            "'dledger certs init') or authMode = \"secret\" (a group secret) on every member; see docs/security.md")


def load_clients(path: str) -> dict[str, secret.ClientEntry]:
    """``clientsFile`` (ConfigError with the file and line for anything wrong)."""
    if not path:
        return {}
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"clientsFile: cannot read {path!r}: {getattr(exc, 'strerror', None) or exc}") from None
    try:
        return secret.parse_clients(text, path, policy.ROLES)
    except secret.AuthError as exc:
        raise ConfigError(f"clientsFile: {exc}") from None


@dataclass
class ServerGuard:
    """A serving port's authentication and authorisation (``authMode`` and its credentials)."""

    auth_mode: str
    group: str
    members: frozenset[str]
    clients: dict[str, secret.ClientEntry] = field(default_factory=dict)
    anonymous_role: str = "none"
    #: key id -> group secret (secret mode)
    secrets: dict[str, bytes] = field(default_factory=dict)
    #: TLS context options of the port (None: plain TCP)
    tls_options: Any = None
    log: RateLimitedLog | None = None

    _logger = Logger(namespace="dledger.security")

    @classmethod
    def from_config(cls, config: Any, clock: Any) -> ServerGuard | None:
        """The guard ``config`` asks for; None with ``authMode = none`` and no ``tlsCert`` (Java's plain port)."""
        if config.auth_mode == "none" and not config.tls_cert:
            return None
        try:
            tls_options = _member_tls(config, tls.server_options)
            secrets: dict[str, bytes] = {}
            if config.auth_mode == "secret":
                secrets = {secret.key_id(s): s for s in secret.read_secrets(config.group_secret_file)}
        except (tls.TLSConfigError, secret.AuthError) as exc:
            raise _one_line(exc) from None
        guard = cls(config.auth_mode, config.group, frozenset(config.members), load_clients(config.clients_file),
                    config.anonymous_role, secrets, tls_options)
        guard.log = RateLimitedLog(cls._logger, clock)
        return guard

    @property
    def enforcing(self) -> bool:
        return self.auth_mode != "none"

    def anonymous(self) -> Identity:
        return Identity.anonymous(self.anonymous_role)

    def identify_tls(self, transport: Any, peer_host: str) -> Identity:
        """The identity the connection's verified client certificate proves (anonymous without one)."""
        subject = tls.subject_of(transport)
        if subject is None:
            return self.anonymous()
        identity, why = policy.identity_from_subject(subject, self.group, self.members,
                                                     {n: c.role for n, c in self.clients.items()},
                                                     self.anonymous_role)
        if why is not None and self.log is not None:
            self.log.warn(("certificate", peer_host, why), "connection from {peer}: {why}; treating it as "
                          "unauthenticated", peer=peer_host, why=why)
        return identity

    def login(self, body: bytes) -> tuple[Identity, bytes, bytes]:
        """Answer an AUTH request: ``(identity, session key, reply body)``; AuthError if it cannot log in."""
        hello = secret.parse_hello(body)
        if hello.kind == "member":
            if hello.name not in self.members:
                raise secret.AuthError(f"{hello.name!r} is not a member of group {self.group!r}")
            key = self.secrets.get(hello.key_id)
            identity = Identity.member(hello.name)
        else:
            entry = self.clients.get(hello.name)
            if entry is None:
                raise secret.AuthError(f"client {hello.name!r} is not in clientsFile")
            key = next((t for t in entry.tokens if secret.key_id(t) == hello.key_id), None)
            identity = Identity.client(hello.name, entry.role)
        if key is None:
            raise secret.AuthError(f"{hello.kind} {hello.name!r} logs in with secret {hello.key_id}, which this "
                                   f"member does not know (groupSecretFile / clientsFile differ?)")
        server_nonce = secret.new_nonce()
        session = secret.session_key(key, self.group, hello.kind, hello.name, hello.nonce, server_nonce)
        return identity, session, secret.welcome_body(server_nonce, secret.server_proof(session))

    def decide(self, code: int, identity: Identity, plugin_role: str | None = None) -> Decision:
        return policy.decide(self.auth_mode, code, identity, plugin_role)

    def refused(self, peer_host: str, code: int, reason: str) -> None:
        """One rate-limited line per address and request code."""
        if self.log is not None:
            self.log.warn(("refused", peer_host, code), "refused a request from {peer}: {reason}",
                          peer=peer_host, reason=reason)


@dataclass
class ClientCredentials:
    """What an outgoing connection presents: who it is, its secret (secret mode), its TLS options."""

    group: str
    kind: str = "member"            # "member" or "client"
    name: str = ""
    secret: bytes | None = None     # secret mode: the group secret (members) or the client's token
    tls_options: Any = None         # TLS: our certificate (optional for clients) and the CA to verify against
    handshake_timeout: float = 5.0

    @classmethod
    def for_member(cls, config: Any) -> ClientCredentials | None:
        """A member's outgoing credentials (None with no TLS and no authentication)."""
        if config.auth_mode == "none" and not config.tls_cert:
            return None
        try:
            tls_options = _member_tls(config, tls.client_options)
            key = secret.read_secrets(config.group_secret_file)[0] if config.auth_mode == "secret" else None
        except (tls.TLSConfigError, secret.AuthError) as exc:
            raise _one_line(exc) from None
        return cls(config.group, "member", config.self_id, key, tls_options)

    @classmethod
    def for_client(cls, group: str, *, name: str = "", token_file: str | None = None, tls_ca: str | None = None,
                   tls_cert: str | None = None, tls_key: str | None = None) -> ClientCredentials | None:
        """A client's credentials: a token (secret mode) and/or TLS (CA, optional certificate)."""
        if not (token_file or tls_ca):
            return None
        try:
            key = None
            if token_file:
                if not name:
                    raise ConfigError("a token needs the client's name (--client-name)")
                key = secret.read_secrets(token_file, "token file")[0]
            tls_options = None
            if tls_ca:
                private = tls.load_private_certificate(tls_cert, tls_key or "") if tls_cert else None
                tls_options = tls.client_options(private, tls.load_ca_certs(tls_ca))
        except (tls.TLSConfigError, secret.AuthError) as exc:
            raise _one_line(exc) from None
        return cls(group, "client", name, key, tls_options)

    def check_server(self, subject: dict[str, str] | None, expected: str | None) -> str | None:
        """Why the server's certificate is not the member we meant to reach; None if it is."""
        if self.tls_options is None:
            return None
        if subject is None:
            return "the server presented no certificate"
        if subject.get("O") != self.group or subject.get("OU") != "member":
            return (f"the server's certificate is not a member certificate of group {self.group!r} "
                    f"(O={subject.get('O')!r}, OU={subject.get('OU')!r})")
        if expected is not None and subject.get("CN") != expected:
            return f"the server's certificate names member {subject.get('CN')!r}, not {expected!r}"
        return None

    def hello(self) -> tuple[bytes, str]:
        """The AUTH request body and our nonce."""
        nonce = secret.new_nonce()
        return secret.hello_body(self.kind, self.name, secret.key_id(self.secret), nonce), nonce

    def session(self, client_nonce: str, server_nonce: str) -> bytes:
        return secret.session_key(self.secret, self.group, self.kind, self.name, client_nonce, server_nonce)


# -- frame signing (secret mode) -----------------------------------------------------------------

def sign_request(data: bytes, key: bytes, seq: int, max_frame_size: int) -> bytes:
    """A request frame with its MAC in ``extFields`` (``seq``: requests sent before it on the connection)."""
    frame = remoting.decode_frame(data, max_frame_size + 4096)
    h = frame.header
    ext = dict(h.ext_fields or {})
    ext[secret.MAC_KEY] = secret.request_mac(key, seq, h.code, h.flag, h.opaque, h.body_encoding, frame.body)
    h.ext_fields = ext
    return remoting.encode_frame(h, frame.body)


def request_authentic(frame: Any, key: bytes, seq: int) -> bool:
    h = frame.header
    given = h.ext_fields.get(secret.MAC_KEY) if h.ext_fields else None
    return secret.macs_equal(secret.request_mac(key, seq, h.code, h.flag, h.opaque, h.body_encoding, frame.body),
                             given)


def _member_tls(config: Any, options_of: Any) -> Any:
    """TLS context options (server or client side) from a member's tlsCert / tlsKey / tlsCa; None without tlsCert."""
    if not config.tls_cert:
        return None
    return options_of(tls.load_private_certificate(config.tls_cert, config.tls_key), tls.load_ca_certs(config.tls_ca))


def sign_reply(opaque: int, body: bytes, remark: str | None, key: bytes, *, binary: bool = False) -> bytes:
    """The reply frame with its MAC (and, for a binary GET reply, the binary marker next to it)."""
    mac = secret.reply_mac(key, opaque, remoting.REMOTING_SUCCESS, remark, body)
    return remoting.encode_reply(opaque, body, remark, binary=binary, ext_fields={secret.MAC_KEY: mac})


def reply_authentic(frame: Any, key: bytes) -> bool:
    h = frame.header
    given = h.ext_fields.get(secret.MAC_KEY) if h.ext_fields else None
    return secret.macs_equal(secret.reply_mac(key, h.opaque, h.code, h.remark, frame.body), given)
