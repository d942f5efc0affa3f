"""Group-secret authentication: a login handshake and an HMAC over every frame (``authMode = secret``).

Why: deployments without TLS still need forged VOTE/PUSH frames refused.  Both ends know a secret
(the group secret for members, a per-client token from ``clientsFile`` for clients); it never
travels.  The connecting side sends an AUTH request (code :data:`AUTH_CODE`, a dledger extension)
naming who it is, the id of the secret it uses and a fresh nonce; the serving side answers with its
own fresh nonce and a proof that it knows the secret too.  Both derive a per-connection session key
from the secret and both nonces, so a frame recorded on one connection is worthless on another.

Every later request carries ``extFields["dledger.mac"]``: HMAC-SHA256 under the session key over a
sequence number (the count of requests sent on the connection, never written on the wire: a
replayed or reordered frame has the wrong one), the code, flag, opaque, body encoding and body.
Every reply carries a MAC over its opaque, code, remark and body.  Frames are authenticated, not
encrypted: use TLS as well (``tlsCert``) when bodies are confidential.

Secrets are identified by :func:`key_id` (the first bytes of their SHA-256), so a file may list
several secrets during a rotation: the first is used to log in, all are accepted.
All functions here are pure; :mod:`dledger.transport.protocol` applies them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import struct
from dataclasses import dataclass

#: The AUTH request code (not a Java DLedger code; a Java member answers it REQUEST_CODE_NOT_SUPPORTED).
AUTH_CODE = 59000
MAC_KEY = "dledger.mac"
#: The shortest secret accepted (bytes of the file's line): guessing must not be practical.
MIN_SECRET_LEN = 16
NONCE_BYTES = 16
_LABEL = b"dledger-auth-v1"


class AuthError(ValueError):
    """A login or a frame that does not authenticate."""


def key_id(secret: bytes) -> str:
    """A public name for a secret: which one of several a peer used (12 hex digits of its SHA-256)."""
    return hashlib.sha256(_LABEL + b"\0key-id\0" + secret).hexdigest()[:12]


def new_nonce() -> str:
    return os.urandom(NONCE_BYTES).hex()


def session_key(secret: bytes, group: str, kind: str, name: str, client_nonce: str, server_nonce: str) -> bytes:
    """The connection's key: bound to the secret, the group, who logs in and both nonces."""
    info = b"\0".join(x.encode() for x in (group, kind, name, client_nonce, server_nonce))
    return hmac.new(secret, _LABEL + b"\0session\0" + info, hashlib.sha256).digest()


def server_proof(key: bytes) -> str:
    """What the serving side sends to show it derived the same key (it knows the secret too)."""
    return hmac.new(key, b"server-proof", hashlib.sha256).hexdigest()


def request_mac(key: bytes, seq: int, code: int, flag: int, opaque: int, encoding: str | None, body: bytes) -> str:
    """The MAC of the ``seq``-th request sent on a connection (sequence numbers start at 0)."""
    mac = hmac.new(key, b"Q" + struct.pack(">qiii", seq, code, flag, opaque), hashlib.sha256)
    mac.update((encoding or "").encode() + b"\0")
    mac.update(body)
    return mac.hexdigest()


def reply_mac(key: bytes, opaque: int, code: int, remark: str | None, body: bytes) -> str:
    """The MAC of the reply to request ``opaque`` (an opaque is answered once; a replayed reply finds no caller)."""
    mac = hmac.new(key, b"R" + struct.pack(">ii", opaque, code), hashlib.sha256)
    mac.update((remark or "").encode() + b"\0")
    mac.update(body)
    return mac.hexdigest()


def macs_equal(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(expected, given)


# -- the AUTH exchange: bodies are small JSON objects --------------------------------------------

def hello_body(kind: str, name: str, secret_id: str, nonce: str) -> bytes:
    return json.dumps({"kind": kind, "name": name, "keyId": secret_id, "nonce": nonce}).encode()


@dataclass(frozen=True)
class Hello:
    kind: str
    name: str
    key_id: str
    nonce: str


def parse_hello(body: bytes) -> Hello:
    """The AUTH request's fields (AuthError for anything malformed)."""
    try:
        obj = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise AuthError(f"AUTH body is not JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise AuthError("AUTH body is not an object")
    fields = []
    for key in ("kind", "name", "keyId", "nonce"):
        value = obj.get(key)
        if not isinstance(value, str) or not value or len(value) > 256:
            raise AuthError(f"AUTH body: {key!r} must be a non-empty string")
        fields.append(value)
    if fields[0] not in ("member", "client"):
        raise AuthError(f"AUTH body: kind {fields[0]!r} is not 'member' or 'client'")
    if len(fields[3]) < 2 * NONCE_BYTES:
        raise AuthError("AUTH body: nonce too short")
    return Hello(*fields)


def welcome_body(nonce: str, proof: str) -> bytes:
    return json.dumps({"code": 200, "nonce": nonce, "proof": proof}).encode()


def refusal_body(code: int) -> bytes:
    return json.dumps({"code": code}).encode()


def parse_welcome(body: bytes) -> tuple[int, str, str]:
    """``(code, server nonce, proof)`` of an AUTH reply (AuthError if malformed)."""
    try:
        obj = json.loads(body)
        code = int(obj.get("code", -1))
    except (ValueError, TypeError, AttributeError, UnicodeDecodeError):
        raise AuthError("AUTH reply is not a JSON object with a code") from None
    nonce, proof = obj.get("nonce"), obj.get("proof")
    if code == 200 and not (isinstance(nonce, str) and isinstance(proof, str) and len(nonce) >= 2 * NONCE_BYTES):
        raise AuthError("AUTH reply lacks nonce or proof")
    return code, nonce or "", proof or ""


# -- files -------------------------------------------------------------------------------------

def read_secrets(path: str, what: str = "groupSecretFile") -> list[bytes]:
    """The secrets of a file, one a line (blank lines and ``#`` comments ignored); the first is current."""
    try:
        with open(path, "rb") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise AuthError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None
    secrets = [line.strip() for line in lines if line.strip() and not line.strip().startswith(b"#")]
    if not secrets:
        raise AuthError(f"{what}: {path!r} holds no secret (one a line)")
    for n, s in enumerate(secrets, 1):
        if len(s) < MIN_SECRET_LEN:
            raise AuthError(f"{what}: secret {n} of {path!r} is {len(s)} bytes; use at least {MIN_SECRET_LEN} "
                            "(e.g. the output of 'openssl rand -hex 32')")
    return secrets


@dataclass(frozen=True)
class ClientEntry:
    """One line of ``clientsFile``: a client name, its role, and its tokens (secret mode; may be none)."""

    name: str
    role: str
    tokens: tuple[bytes, ...] = ()


def parse_clients(text: str, source: str, roles: tuple[str, ...]) -> dict[str, ClientEntry]:
    """``clientsFile`` lines ``NAME ROLE [TOKEN ...]`` (several tokens while rotating one)."""
    clients: dict[str, ClientEntry] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) < 2:
            raise AuthError(f"{source}:{lineno}: expected 'NAME ROLE [TOKEN ...]', got {line!r}")
        name, role, tokens = parts[0], parts[1], tuple(t.encode() for t in parts[2:])
        if role not in roles:
            raise AuthError(f"{source}:{lineno}: role {role!r} is not one of {', '.join(roles)}")
        for t in tokens:
            if len(t) < MIN_SECRET_LEN:
                raise AuthError(f"{source}:{lineno}: token of {name!r} is {len(t)} bytes; use at least "
                                f"{MIN_SECRET_LEN}")
        if name in clients:
            raise AuthError(f"{source}:{lineno}: client {name!r} is listed twice")
        clients[name] = ClientEntry(name, role, tokens)
    return clients
