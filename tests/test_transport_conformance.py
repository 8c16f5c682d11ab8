"""The built-in transport passes the transport conformance suite a second transport binds to
(fibercore.testing.TransportConformance): over TCP and Unix sockets, and over TLS."""

from __future__ import annotations

import tempfile
from pathlib import Path

from fibercore.builtins.tcp_transport import TcpTransport
from fibercore.testing import TransportConformance
from tests.helpers import make_ca, node_cert


class TestBuiltinTransport(TransportConformance):
    def make_transport(self) -> TcpTransport:
        return TcpTransport()


class TestBuiltinTransportOverTLS(TransportConformance):
    def make_transport(self) -> TcpTransport:
        where = Path(tempfile.mkdtemp(prefix="fiber-tls-"))
        ca_file, ca = make_ca(where)
        node = node_cert(where, ca, "localhost", "127.0.0.1")
        return TcpTransport({"cert": str(node), "ca": str(ca_file), "server_name": "localhost"})
