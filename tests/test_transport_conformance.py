"""The built-in transport passes the transport conformance suite a second transport binds to
(fibercore.testing.TransportConformance): over TCP and Unix sockets, and over TLS."""

from __future__ import annotations

from fibercore.builtins.tcp_transport import TcpTransport
from fibercore.testing import TransportConformance
from tests.helpers import tls_settings


class TestBuiltinTransport(TransportConformance):
    def make_transport(self) -> TcpTransport:
        return TcpTransport()


class TestBuiltinTransportOverTLS(TransportConformance):
    def make_transport(self) -> TcpTransport:
        return TcpTransport(tls_settings())


def test_a_transport_no_plugin_provides_is_one_clear_line():
    import os
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import fibercore; fibercore.Queue()"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, "FIBER_TRANSPORT": "carrier-pigeon"})
    assert done.returncode != 0
    assert "no installed transport plugin answers to transport = 'carrier-pigeon'" in done.stderr
    assert "pip install fiber-carrier-pigeon" in done.stderr and "Traceback" not in done.stderr
