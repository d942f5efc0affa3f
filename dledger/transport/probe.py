"""Does a port speak TLS?  What the CLI asks when a connection failed, to say "TLS port reached in plaintext"
(or the reverse) in one line instead of "Connection was closed cleanly" (issue #21, item 7).

A TLS member port closes a plaintext connection without a byte (OpenSSL sends no alert to a peer that
is not speaking TLS), and a plaintext port closes a TLS ClientHello as an oversized frame, so neither side
can tell from the failure alone.  :func:`speaks_tls` asks: it offers a TLS handshake (no certificate, no
verification -- it only listens for TLS coming back).  Blocking, standard library only; run it in a thread.
"""

from __future__ import annotations

import socket
import ssl


def speaks_tls(host: str, port: int, timeout: float = 2.0) -> bool | None:
    """True if ``host:port`` answers a TLS ClientHello in TLS (a handshake or a TLS alert), False if it answers
    otherwise or closes, None if it cannot be reached."""
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    try:
        with ctx.wrap_socket(sock, do_handshake_on_connect=False) as tls:
            tls.settimeout(timeout)
            tls.do_handshake()
            return True
    except ssl.SSLEOFError:
        return False
    except ssl.SSLError as exc:  # an alert is TLS talking (e.g. "certificate required"); garbage is not
        return "ALERT" in (exc.reason or str(exc)).upper()
    except OSError:
        return False
    finally:
        sock.close()


def split_address(address: str) -> tuple[str, int] | None:
    """``host:port`` or ``[v6]:port`` -> ``(host, port)``; None for anything else (an endpoint string)."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def tls_mismatch(addresses: list[str], using_tls: bool, timeout: float = 2.0) -> str | None:
    """One line if one of ``addresses`` speaks TLS and we did not (or the reverse); None if none does."""
    for address in addresses:
        hp = split_address(address)
        if hp is None:
            continue
        tls = speaks_tls(*hp, timeout=timeout)
        if tls is True and not using_tls:
            return (f"{address} is a TLS port and this client spoke plaintext to it: pass --tls-ca CA_FILE (and "
                    "--tls-cert/--tls-key for a role), or set DLEDGER_TLS_CA")
        if tls is False and using_tls:
            return (f"{address} does not speak TLS (a plaintext port) but this client was given --tls-ca: drop "
                    "--tls-ca/--tls-cert/--tls-key, or give the members tlsCert")
    return None
