"""TLS for the member port and its outgoing connections, through Twisted's TLS (pyOpenSSL) layer.

Why wrap instead of only accepting ``ssl:`` strings: Twisted's ``ssl:`` *server* endpoint string
cannot ask for or verify client certificates, which mutual TLS needs.  So a member with ``tlsCert``
wraps whatever ``listen`` endpoint it has (``tcp:``, ``tcp6:``, ``unix:``) in TLS with
:func:`server_options`, and wraps every outgoing connection with :func:`client_options`.
Client certificates are requested and verified against ``tlsCa`` but not required: a client without
one (a Java ``DLedgerClient`` behind a TLS proxy, ``dledger client`` without ``--tls-cert``) is
anonymous and gets ``anonymousRole``.  ``tlsCa`` may hold several CA certificates (rotation).
"""

from __future__ import annotations

import re
from typing import Any

_PEM_CERT = re.compile(rb"-----BEGIN CERTIFICATE-----.+?-----END CERTIFICATE-----", re.S)


class TLSConfigError(ValueError):
    """A certificate, key or CA file that cannot be used (one line, names the file)."""


def _read(path: str, what: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError as exc:
        raise TLSConfigError(f"{what}: cannot read {path!r}: {exc.strerror or exc}") from None


def _ssl():
    try:
        from twisted.internet import ssl
        ssl.CertificateOptions  # noqa: B018 -- raises AttributeError without pyOpenSSL
        return ssl
    except (ImportError, AttributeError):
        raise TLSConfigError("TLS needs pyOpenSSL and service_identity: pip install 'twisted[tls]'") from None


def load_ca_certs(path: str, what: str = "tlsCa") -> list[Any]:
    """Every CA certificate of a PEM file (several during a CA rotation), as pyOpenSSL objects."""
    _ssl()
    from cryptography import x509
    from OpenSSL import crypto

    data = _read(path, what)
    blocks = _PEM_CERT.findall(data)
    if not blocks:
        raise TLSConfigError(f"{what}: {path!r} holds no PEM certificate")
    try:
        return [crypto.X509.from_cryptography(x509.load_pem_x509_certificate(b)) for b in blocks]
    except Exception as exc:
        raise TLSConfigError(f"{what}: {path!r}: not a valid certificate ({exc})") from None


def load_private_certificate(cert_path: str, key_path: str) -> tuple[Any, Any]:
    """``(certificate, private key)`` (cryptography objects); TLSConfigError if unreadable or not a pair."""
    _ssl()
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_pem = _read(cert_path, "tlsCert")
    key_pem = _read(key_path, "tlsKey")
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except Exception as exc:
        raise TLSConfigError(f"tlsCert: {cert_path!r}: not a valid PEM certificate ({exc})") from None
    try:
        key = serialization.load_pem_private_key(key_pem, None)
    except Exception as exc:
        raise TLSConfigError(f"tlsKey: {key_path!r}: not a valid unencrypted PEM private key ({exc})") from None
    raw = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if cert.public_key().public_bytes(*raw) != key.public_key().public_bytes(*raw):
        raise TLSConfigError(f"tlsKey: {key_path!r} is not the private key of {cert_path!r}")
    return cert, key


def server_options(private: tuple[Any, Any], cas: list[Any]) -> Any:
    """Context options of a serving port: our certificate; client certificates asked for, verified, optional.

    The context records why a client certificate failed verification (:func:`verify_error_of`), so a
    refused handshake is logged as "expired" or "unknown CA", not only as OpenSSL's "certificate verify failed".
    """
    ssl = _ssl()
    cert, key = private

    class _RecordingOptions(ssl.CertificateOptions):
        def getContext(self) -> Any:
            ctx = super().getContext()
            if not getattr(self, "_dledger_recording", False):
                self._dledger_recording = True
                ctx.set_verify(ctx.get_verify_mode(), _record_verify_error)
            return ctx

    return _RecordingOptions(privateKey=key, certificate=cert, verify=True, caCerts=cas,
                             requireCertificate=False, raiseMinimumTo=ssl.TLSVersion.TLSv1_2)


_VERIFY_ERRORS: Any = None  # weak map: OpenSSL Connection -> the first X.509 error of its peer's chain


def _record_verify_error(conn: Any, cert: Any, errno: int, depth: int, ok: int) -> bool:
    global _VERIFY_ERRORS
    if not ok and errno:
        if _VERIFY_ERRORS is None:
            import weakref

            _VERIFY_ERRORS = weakref.WeakKeyDictionary()
        try:
            _VERIFY_ERRORS.setdefault(conn, errno)
        except TypeError:
            pass
    return bool(ok)


def verify_error_of(transport: Any) -> int | None:
    """The X.509 verification error (OpenSSL's number, e.g. 10 = expired) of the peer certificate a TLS
    transport refused, or None (no TLS, nothing refused, or a context that does not record it)."""
    get = getattr(transport, "getHandle", None)
    if _VERIFY_ERRORS is None or get is None:
        return None
    try:
        return _VERIFY_ERRORS.get(get())
    except TypeError:
        return None


def client_options(private: tuple[Any, Any] | None, cas: list[Any]) -> Any:
    """Context options of an outgoing connection: the server's certificate must chain to ``tlsCa``.

    Which member (or whether a member at all) the certificate names is checked by the connection once
    the handshake is done (:func:`subject_of`, :meth:`dledger.security.guard.ClientCredentials.check_server`).
    """
    ssl = _ssl()
    kw: dict[str, Any] = {}
    if private is not None:
        kw = dict(certificate=private[0], privateKey=private[1])
    return ssl.CertificateOptions(verify=True, caCerts=cas, requireCertificate=True,
                                  raiseMinimumTo=ssl.TLSVersion.TLSv1_2, **kw)


def subject_of(transport: Any) -> dict[str, str] | None:
    """The subject fields (``CN``, ``O``, ``OU``) of the verified peer certificate on ``transport``; None if none."""
    get = getattr(transport, "getPeerCertificate", None)
    if get is None:
        return None
    try:
        cert = get()
    except Exception:
        return None
    if cert is None:
        return None
    from cryptography.x509.oid import NameOID

    subject = cert.to_cryptography().subject
    out: dict[str, str] = {}
    for key, oid in (("CN", NameOID.COMMON_NAME), ("O", NameOID.ORGANIZATION_NAME),
                     ("OU", NameOID.ORGANIZATIONAL_UNIT_NAME)):
        values = subject.get_attributes_for_oid(oid)
        if len(values) == 1:  # a field given twice proves nothing
            out[key] = str(values[0].value)
    return out


def wrap_server_factory(options: Any, factory: Any) -> Any:
    """``factory`` behind TLS; a connection the factory refuses (None, over maxConnections) stays refused."""
    from twisted.protocols.tls import TLSMemoryBIOFactory

    class _Factory(TLSMemoryBIOFactory):
        noisy = False

        def buildProtocol(self, addr: Any) -> Any:
            inner = self.wrappedFactory.buildProtocol(addr)
            if inner is None:
                return None
            return self.protocol(self, inner)

    return _Factory(options, False, factory)


def wrap_client_endpoint(options: Any, endpoint: Any, clock: Any = None) -> Any:
    """A client endpoint whose connections speak TLS with ``options``.

    ``clock``: the reactor the connection runs on.  Twisted's TLS layer schedules its buffered writes
    with ``callLater`` on this clock (the global reactor when None), so a client on a private reactor
    (:class:`dledger.blocking.BlockingClient`) must pass its own, or its writes wait for a reactor that
    never runs.
    """
    from twisted.internet.endpoints import wrapClientTLS

    return wrapClientTLS(options, endpoint, clock=clock)
