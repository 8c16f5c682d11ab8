"""TLS for the built-in transport: both sides show a certificate that the configured CA (and
only it) signed; a dialler checks the listener's name."""

from __future__ import annotations

import socket
import ssl
from typing import Any

from fibercore.errors import AuthenticationError, ConfigError, TransportError


def contexts(tls: dict[str, Any]) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server and client contexts for ``tls`` ({"cert", "ca", "server_name"})."""
    if not tls.get("ca"):
        raise ConfigError("tls = true needs tls_ca_file (the CA that signed every node's certificate): "
                          "without it any certificate the system trusts would be accepted")
    if not tls.get("cert"):
        raise ConfigError("tls = true needs tls_cert_file (this node's certificate and key, one PEM file)")
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the name by default
    for ctx in (server, client):
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_verify_locations(cafile=tls["ca"])  # only this CA, not the system's
        ctx.load_cert_chain(tls["cert"])
        ctx.verify_mode = ssl.CERT_REQUIRED  # both sides show a certificate the CA signed
    return server, client


def wrap_client(sock: socket.socket, ctx: ssl.SSLContext, address: str, host: str,
                server_name: str | None) -> ssl.SSLSocket:
    """``sock`` after a TLS handshake as the client; the socket is closed on failure."""
    try:
        return ctx.wrap_socket(sock, server_hostname=server_name or host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise AuthenticationError(
            f"{address}: the listener's certificate is not valid for {server_name or host!r} ({exc.verify_message}): "
            "give each node a certificate naming its address, or set tls_server_name to the name the "
            "certificates carry") from None
    except (OSError, ValueError) as exc:
        sock.close()
        raise TransportError(f"cannot connect to {address}: TLS failed: {exc}") from exc
