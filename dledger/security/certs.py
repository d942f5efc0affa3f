"""A certificate authority and certificates for a local group (``dledger certs init`` / ``issue``).

Why: mutual TLS needs a CA that signs one certificate per member and per client, with the member id
where the other members look for it.  Every certificate made here has the subject
``O=<group>, OU=member|client, CN=<id>`` (:func:`dledger.security.policy.identity_from_subject`
reads exactly that) and a ``subjectAltName`` with the id and ``localhost``/``127.0.0.1``.  Keys are
ECDSA P-256 (fast handshakes), written with mode 0600.  For real deployments an organisation's own
CA can issue certificates with the same subject fields instead.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import secrets as pysecrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_CERT, CA_KEY = "ca.crt", "ca.key"
SECRET_FILE, CLIENTS_FILE = "group.secret", "clients.txt"


class CertsError(ValueError):
    """An operator mistake (existing files, bad names): one line."""


def _name(group: str, unit: str, cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, group),
                      x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, unit),
                      x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write(path: Path, data: bytes, private: bool) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def make_ca(group: str, days: int, now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = _name(group, "ca", f"dledger CA for group {group}")
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def issue(ca_cert: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, group: str, unit: str, name: str,
          days: int, now: datetime.datetime) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    """A certificate for member or client ``name`` of ``group`` (usable as TLS server and client)."""
    key = ec.generate_private_key(ec.SECP256R1())
    san = [x509.DNSName(name), x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    cert = (x509.CertificateBuilder().subject_name(_name(group, unit, name)).issuer_name(ca_cert.subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return cert, key


@dataclass(frozen=True)
class ClientSpec:
    name: str
    role: str = "write"


def parse_client_spec(text: str) -> ClientSpec:
    """``app1`` (role write) or ``app1:admin``."""
    from dledger.security.policy import ROLES

    name, _, role = text.partition(":")
    role = role or "write"
    check_id(name, "client name")
    if role not in ROLES:
        raise CertsError(f"client {name!r}: role {role!r} is not one of {', '.join(ROLES)}")
    return ClientSpec(name, role)


def check_id(name: str, what: str) -> None:
    from dledger.config import _ID_RE

    if not name or not _ID_RE.match(name):
        raise CertsError(f"{what} {name!r}: use letters, digits, '_' and '.'")


def cert_paths(directory: Path, unit: str, name: str) -> tuple[Path, Path]:
    stem = name if unit == "member" else f"client-{name}"
    return directory / f"{stem}.crt", directory / f"{stem}.key"


def _save(directory: Path, unit: str, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> None:
    crt, kf = cert_paths(directory, unit, name)
    _write(crt, cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(kf, _key_pem(key), private=True)


def init_group(directory: str | Path, group: str, members: list[str], clients: list[ClientSpec] = (),
               days: int = 365, force: bool = False, now: datetime.datetime | None = None) -> list[Path]:
    """Create ``ca.crt``/``ca.key``, one certificate per member and client, ``group.secret`` and ``clients.txt``.

    ``clients.txt`` lists each client's role and a fresh token (for ``authMode = secret``); the same
    file serves as ``clientsFile`` in TLS mode (the tokens are then unused).
    """
    directory = Path(directory)
    now = now or datetime.datetime.now(datetime.UTC)
    if not members:
        raise CertsError("--members: name at least one member")
    for m in members:
        check_id(m, "member id")
    if len(set(members)) != len(members) or len({c.name for c in clients}) != len(clients):
        raise CertsError("a member or client is named twice")
    if (directory / CA_KEY).exists() and not force:
        raise CertsError(f"{directory / CA_KEY} exists; use 'dledger certs issue' to add certificates to "
                         "that CA, or --force to replace everything")
    directory.mkdir(parents=True, exist_ok=True)
    ca_cert, ca_key = make_ca(group, days, now)
    _write(directory / CA_CERT, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    _write(directory / CA_KEY, _key_pem(ca_key), private=True)
    for m in members:
        _save(directory, "member", m, *issue(ca_cert, ca_key, group, "member", m, days, now))
    lines = []
    for c in clients:
        _save(directory, "client", c.name, *issue(ca_cert, ca_key, group, "client", c.name, days, now))
        lines.append(f"{c.name} {c.role} {pysecrets.token_hex(24)}\n")
    _write(directory / SECRET_FILE, (pysecrets.token_hex(32) + "\n").encode(), private=True)
    _write(directory / CLIENTS_FILE, ("# NAME ROLE [TOKEN ...]  (clientsFile; tokens are for authMode=secret)\n"
                                      + "".join(lines)).encode(), private=True)
    return sorted(directory.iterdir())


def load_ca(directory: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey, str]:
    try:
        cert = x509.load_pem_x509_certificate((directory / CA_CERT).read_bytes())
        key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
    except OSError as exc:
        raise CertsError(f"cannot read the CA in {directory}: {exc.strerror or exc} (run 'dledger certs init' "
                         "first)") from None
    except ValueError as exc:
        raise CertsError(f"the CA in {directory} is not readable PEM: {exc}") from None
    group = cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value
    return cert, key, group


def issue_into(directory: str | Path, unit: str, name: str, days: int = 365,
               now: datetime.datetime | None = None) -> tuple[Path, Path]:
    """Add (or renew) one member or client certificate signed by the CA in ``directory``."""
    directory = Path(directory)
    check_id(name, f"{unit} name")
    ca_cert, ca_key, group = load_ca(directory)
    now = now or datetime.datetime.now(datetime.UTC)
    _save(directory, unit, name, *issue(ca_cert, ca_key, group, unit, name, days, now))
    return cert_paths(directory, unit, name)


def local_group_security(directory: str | Path, group: str, members: list[str], mode: str = "tls",
                         admin: str = "admin") -> tuple[dict[str, str], object]:
    """Credentials for a local group (demo, tests, benchmarks): member options and an admin client.

    Creates a CA, certificates, a group secret and ``clients.txt`` (with ``admin`` as an admin client)
    in ``directory``; returns the config options every member shares (``{selfId}`` in the certificate
    paths) and the :class:`~dledger.security.guard.ClientCredentials` of the admin client.
    """
    from dledger.security.guard import ClientCredentials

    d = Path(directory)
    init_group(d, group, members, [ClientSpec(admin, "admin")], force=True)
    options = {"authMode": mode, "clientsFile": str(d / CLIENTS_FILE)}
    if mode == "secret":
        options["groupSecretFile"] = str(d / SECRET_FILE)
        token = d / f"{admin}.token"
        line = next(x for x in (d / CLIENTS_FILE).read_text().splitlines() if x.startswith(admin + " "))
        _write(token, (line.split()[2] + "\n").encode(), private=True)
        return options, ClientCredentials.for_client(group, name=admin, token_file=str(token))
    options.update(tlsCert=str(d / "{selfId}.crt"), tlsKey=str(d / "{selfId}.key"), tlsCa=str(d / CA_CERT))
    crt, key = cert_paths(d, "client", admin)
    return options, ClientCredentials.for_client(group, tls_ca=str(d / CA_CERT), tls_cert=str(crt), tls_key=str(key))
