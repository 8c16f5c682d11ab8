"""fiber-nng passes the transport conformance suite the built-in transport passes, in plain
TCP and over nng's own TLS."""

from __future__ import annotations

from fiber_nng.transport import NngTransport, _port_of

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


def test_endpoints_work_when_descriptors_are_numbered_past_1023():
    """A long-running master holds many descriptors: its sockets get numbers select() refuses
    (the suite's CI run found every listener unanswered that way). Waits use poll()."""
    import os
    import resource

    from fibercore.transport import Authenticator

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2048:
        import pytest

        pytest.skip(f"the open-files hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2048), hard))
    held = [os.pipe() for _ in range(600)]
    key = b"k" * 32
    auth = Authenticator(key, "router", service="conformance")
    listener = NngTransport().listen("router", "127.0.0.1", auth=auth)
    try:
        dialer = NngTransport().dial("router", listener.address,
                                     auth=Authenticator(key, "router", service="conformance", expect=auth.identity))
        dialer.send_parts([b"past 1023"])
        assert bytes(listener.recv(10)[0]) == b"past 1023"
        dialer.close()
    finally:
        listener.close()
        for r, w in held:
            os.close(r)
            os.close(w)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_stranger_dialling_a_peers_data_port_does_not_cut_the_peer_off():
    """Pair0 refuses a second connection to a peer's data socket, and nng reports that refused
    connection as removed: the peer's own connection must stay (a CI run lost a worker's queue
    connection to an attacker's dial)."""
    import time

    import pynng

    from fibercore.transport import Authenticator

    key = b"k" * 32
    auth = Authenticator(key, "router", service="conformance")
    listener = NngTransport().listen("router", "127.0.0.1", auth=auth)
    dialer = NngTransport().dial("router", listener.address,
                                 auth=Authenticator(key, "router", service="conformance", expect=auth.identity))
    try:
        dialer.send_parts([b"before"])
        frame, peer = listener.recv(10)
        assert bytes(frame) == b"before"
        (conn,) = listener._peers.values()
        data_port = _port_of(conn.sock.listeners[0])
        for _ in range(3):
            with pynng.Pair0(dial=f"tcp://127.0.0.1:{data_port}", send_timeout=300) as stranger:
                try:
                    stranger.send(b"not the token")
                except pynng.Timeout:
                    pass
        time.sleep(1.0)  # past the accept thread's IDLE_STEP: a departure would have been noticed
        assert listener.peer_count == 1
        dialer.send_parts([b"after"])
        assert bytes(listener.recv(10)[0]) == b"after"
        listener.send_parts([b"back"], peer)
        assert bytes(dialer.recv(10)[0]) == b"back"
    finally:
        dialer.close()
        listener.close()
