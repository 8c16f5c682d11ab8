"""fiber-nng passes the transport conformance suite the built-in transport passes, in plain
TCP and over nng's own TLS."""

from __future__ import annotations

from fiber_nng.transport import NngTransport

from fibercore.testing import TransportConformance
from tests.helpers import tls_settings


class TestNngTransport(TransportConformance):
    def make_transport(self) -> NngTransport:
        return NngTransport()


class TestNngTransportOverTLS(TransportConformance):
    def make_transport(self) -> NngTransport:
        return NngTransport(tls_settings())


def _dial_in_a_forked_child(address: str, key: bytes, identity: bytes, out: int) -> None:
    import os

    from fibercore.transport import Authenticator

    try:
        NngTransport().dial("router", address, auth=Authenticator(key, "router", service="conformance",
                                                                  expect=identity))
        os.write(out, b"dialled")
    except Exception as exc:
        os.write(out, f"{type(exc).__name__}: {exc}".encode())
    finally:
        os._exit(0)


def test_a_child_forked_after_nng_was_used_gets_one_line_not_a_hang_or_a_panic():
    """nng's threads do not survive fork(): a forked child that tries fiber-nng gets a
    TransportError naming the fix, and the parent's sockets it inherited are never closed
    into nng (which would panic) when they are collected."""
    import os
    import time

    from fibercore.transport import Authenticator

    key = b"k" * 32
    auth = Authenticator(key, "router", service="conformance")
    listener = NngTransport().listen("router", "127.0.0.1", auth=auth)
    try:
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            _dial_in_a_forked_child(listener.address, key, auth.identity, w)
        os.close(w)
        deadline = time.monotonic() + 20
        _, status = os.waitpid(pid, 0)
        said = os.read(r, 4096).decode()
        os.close(r)
        assert time.monotonic() < deadline
        assert os.waitstatus_to_exitcode(status) == 0, "the child died (nng panicked?)"
        assert said.startswith("TransportError") and "forked" in said and "spawn" in said, said
    finally:
        listener.close()
