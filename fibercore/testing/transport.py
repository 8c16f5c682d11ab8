"""The transport conformance suite: what every transport plugin must do (``fibercore.transport``).

Bind it in your package's tests, as backends bind :class:`BackendConformance`::

    from fibercore.testing import TransportConformance

    class TestMyTransport(TransportConformance):
        def make_transport(self):
            return MyTransport()

Each test opens real endpoints on 127.0.0.1 with the core's own handshake
(:class:`fibercore.wire.handshake.Authenticator`) and checks one obligation of the
contract: authentication before anything is delivered, refusal of another key, frame
sizes, ordering per peer, peer events, close semantics, timeouts, large frames, many
peers, and flow control where the transport offers it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Hashable, Iterator
from typing import Any, ClassVar

import pytest

from fibercore.errors import AuthenticationError, TransportClosed, TransportError, TransportTimeout
from fibercore.transport import DialEndpoint, Endpoint, FlowControl, LineEndpoint, Pieces, Transport, Wakeable
from fibercore.wire.handshake import Authenticator, Limits, Session


class TransportConformance:
    """Subclass and override :meth:`make_transport` to run the suite on a transport."""

    #: Where listeners bind and what dialers connect to.
    host: ClassVar[str] = "127.0.0.1"
    #: Seconds any single wait in the suite may take.
    timeout: ClassVar[float] = 20.0
    #: The frame size limit the suite sets (large frames just under it must pass).
    max_frame: ClassVar[int] = 64 << 20

    def make_transport(self) -> Transport:
        """The transport under test (the built-in TCP one by default)."""
        from fibercore.builtins.tcp_transport import TcpTransport

        return TcpTransport()

    # -- helpers ---------------------------------------------------------------------------
    @pytest.fixture
    def transport(self) -> Iterator[Transport]:
        made = self.make_transport()
        self._opened: list[Endpoint] = []
        yield made
        for endpoint in self._opened:
            try:
                endpoint.close()
            except Exception:
                pass

    def limits(self) -> Limits:
        return Limits(handshake_timeout=5.0, max_frame=self.max_frame)

    def listen(self, transport: Transport, kind: str = "router",
               key: bytes = b"k" * 32) -> tuple[Endpoint, Authenticator]:
        auth = Authenticator(key, kind, self.limits(), "conformance")
        endpoint = transport.listen(kind, self.host, self.host, auth=auth)
        self._opened.append(endpoint)
        return endpoint, auth

    def dial(self, transport: Transport, listener: tuple[Endpoint, Authenticator], kind: str = "router",
             key: bytes = b"k" * 32) -> DialEndpoint:
        endpoint, auth = listener
        dialer = transport.dial(kind, endpoint.address, auth=Authenticator(key, kind, self.limits(), "conformance",
                                                                             auth.identity))
        self._opened.append(dialer)
        return dialer

    def recv(self, endpoint: Endpoint) -> tuple[bytes, Hashable]:
        data, peer = endpoint.recv(self.timeout)
        return bytes(data), peer

    @staticmethod
    def events(endpoint: Endpoint) -> tuple[list[tuple[Hashable, bool]], threading.Condition]:
        seen: list[tuple[Hashable, bool]] = []
        cv = threading.Condition()

        def note(peer: Hashable, added: bool) -> None:
            with cv:
                seen.append((peer, added))
                cv.notify_all()

        endpoint.on_peer_event(note)
        return seen, cv

    def wait_for(self, cv: threading.Condition, done: Any, receiving: Endpoint | None = None) -> bool:
        """Wait until ``done()``; ``receiving``: an endpoint to receive on meanwhile (a listener
        may notice a connection's end only while a thread receives on it, as the core's do)."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            with cv:
                if cv.wait_for(done, 0.05 if receiving is not None else self.timeout):
                    return True
            if receiving is not None:
                try:
                    receiving.recv(0.2)
                except (TransportTimeout, TransportClosed):
                    pass
        with cv:
            return bool(done())

    # -- handshake ---------------------------------------------------------------------------
    def test_a_dialler_is_a_peer_only_after_the_handshake(self, transport: Transport) -> None:
        listener = self.listen(transport)
        seen, cv = self.events(listener[0])
        dialer = self.dial(transport, listener)
        assert isinstance(dialer, DialEndpoint)
        assert isinstance(dialer.peer, Session), "dial returns after the handshake, with the session as peer"
        assert self.wait_for(cv, lambda: seen), "the listener reports the authenticated peer"
        peer, added = seen[0]
        assert added and isinstance(peer, Session)
        dialer.send_parts([b"hello"])
        data, sender = self.recv(listener[0])
        assert data == b"hello" and sender is peer

    def test_another_key_is_refused_and_nothing_is_delivered(self, transport: Transport) -> None:
        listener = self.listen(transport)
        seen, cv = self.events(listener[0])
        with pytest.raises((AuthenticationError, TransportError)):
            self.dial(transport, listener, key=b"x" * 32)
        with pytest.raises(TransportTimeout):
            listener[0].recv(0.3)
        assert not any(added for _, added in seen)

    def test_a_dialler_refuses_a_listener_with_another_identity(self, transport: Transport) -> None:
        listener = self.listen(transport)
        endpoint, _ = listener
        wrong = Authenticator(b"k" * 32, "router", self.limits(), "conformance", os.urandom(16))
        with pytest.raises((AuthenticationError, TransportError)):
            self._opened.append(transport.dial("router", endpoint.address, auth=wrong))

    def test_nothing_listens_there(self, transport: Transport) -> None:
        listener = self.listen(transport)
        address = listener[0].address
        listener[0].close()
        with pytest.raises(TransportError):
            self.dial(transport, listener)
        assert address

    # -- frames -----------------------------------------------------------------------------
    def test_frames_of_one_peer_arrive_whole_and_in_order(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        sizes = [0, 1, 7, 4096, 65_537, 3, 1 << 20, 100]

        def send_all() -> None:  # while this thread receives: buffers need not hold it all
            for i, size in enumerate(sizes * 5):
                dialer.send_parts([i.to_bytes(4, "little"), bytes([i % 256]) * size])

        threading.Thread(target=send_all, daemon=True).start()
        for i, size in enumerate(sizes * 5):
            data, _ = self.recv(listener[0])
            assert int.from_bytes(data[:4], "little") == i and len(data) == 4 + size
            assert data[4:] == bytes([i % 256]) * size

    def test_parts_are_sent_as_one_frame(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        dialer.send_parts([b"ab", memoryview(b"cd"), bytearray(b"ef"), b""])
        assert self.recv(listener[0])[0] == b"abcdef"

    def test_a_large_frame_crosses_intact_both_ways(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        big = os.urandom(1 << 20) * 40  # 40 MiB
        threading.Thread(target=dialer.send_parts, args=([big],), daemon=True).start()
        data, peer = self.recv(listener[0])
        assert data == big
        threading.Thread(target=listener[0].send_parts, args=([big], peer), daemon=True).start()
        assert self.recv(dialer)[0] == big

    def test_a_frame_of_pieces_crosses_intact_where_the_transport_takes_them(self, transport: Transport) -> None:
        """Where a transport calls ``session.stream_large_frames()``, a frame whose last part is
        :class:`~fibercore.transport.Pieces` arrives as the parts and pieces back to back, each
        piece written before the next is made (they share one buffer, as the core's do)."""
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        session = dialer.peer
        assert isinstance(session, Session)
        if not session.sealer.pieces:
            pytest.skip("this transport does not take Pieces (optional)")
        pieces = _Counting(9 << 20, 1 << 20)
        expected = b"head" + pieces.expected()
        threading.Thread(target=dialer.send_parts, args=([b"he", memoryview(b"ad"), pieces],), daemon=True).start()
        data, peer = self.recv(listener[0])
        assert len(data) == len(expected) and data == expected, "a piece was sent after its buffer was reused"
        assert isinstance(peer, Session) and peer.sealer.pieces, "both ends of one transport take Pieces"
        small = _Counting(1000, 300)  # a frame of pieces under a record's size
        threading.Thread(target=listener[0].send_parts, args=([small], peer), daemon=True).start()
        assert self.recv(dialer)[0] == small.expected()

    def test_a_frame_over_the_limit_ends_that_connection_only(self, transport: Transport) -> None:
        listener = self.listen(transport)
        seen, cv = self.events(listener[0])
        greedy = self.dial(transport, listener)
        polite = self.dial(transport, listener)

        def send_too_much() -> None:  # a listener reads only while someone receives on it
            try:
                greedy.send_parts([bytes(self.max_frame + 1)])
            except (TransportClosed, TransportError):
                pass

        threading.Thread(target=send_too_much, daemon=True).start()
        polite.send_parts([b"still served"])
        got = []
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline and b"still served" not in got:
            try:
                got.append(bytes(listener[0].recv(0.5)[0]))
            except TransportTimeout:
                pass
        assert got == [b"still served"], "only the other peer's frame is delivered"
        assert self.wait_for(cv, lambda: any(not added for _, added in seen), receiving=listener[0]), \
            "the greedy peer is dropped"
        assert len([peer for peer, added in seen if not added]) == 1, "and only that one"

    # -- peers ------------------------------------------------------------------------------
    def test_a_router_answers_each_of_many_peers(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialers = [self.dial(transport, listener) for _ in range(40)]
        for i, d in enumerate(dialers):
            d.send_parts([str(i).encode()])
        for _ in dialers:
            data, peer = self.recv(listener[0])
            listener[0].send_parts([b"re:" + data], peer)
        for i, d in enumerate(dialers):
            assert self.recv(d)[0] == f"re:{i}".encode()

    def test_a_peer_that_closes_is_reported_gone_once(self, transport: Transport) -> None:
        listener = self.listen(transport)
        seen, cv = self.events(listener[0])
        dialer = self.dial(transport, listener)
        assert self.wait_for(cv, lambda: seen)
        dialer.close()
        assert self.wait_for(cv, lambda: len(seen) == 2, receiving=listener[0])
        time.sleep(0.2)
        assert [added for _, added in seen] == [True, False] and seen[0][0] is seen[1][0]

    def test_a_pair_listener_serves_its_peer(self, transport: Transport) -> None:
        listener = self.listen(transport, kind="pair")
        dialer = self.dial(transport, listener, kind="pair")
        dialer.send_parts([b"ping"])
        data, peer = self.recv(listener[0])
        listener[0].send_parts([b"pong"], peer)
        assert data == b"ping" and self.recv(dialer)[0] == b"pong"

    # -- timeouts and closing ------------------------------------------------------------------
    def test_recv_times_out(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        for endpoint in (listener[0], dialer):
            started = time.monotonic()
            with pytest.raises(TransportTimeout):
                endpoint.recv(0.2)
            assert 0.15 <= time.monotonic() - started < 5.0

    def test_a_closed_endpoint_refuses_calls(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        dialer.close()
        with pytest.raises(TransportClosed):
            dialer.recv(0.5)
        with pytest.raises(TransportClosed):
            dialer.send_parts([b"late"])
        listener[0].close()
        with pytest.raises(TransportClosed):
            listener[0].recv(0.5)

    def test_a_dialler_sees_its_listener_close(self, transport: Transport) -> None:
        listener = self.listen(transport)
        dialer = self.dial(transport, listener)
        seen, cv = self.events(dialer)
        listener[0].close()
        with pytest.raises(TransportClosed):
            deadline = time.monotonic() + self.timeout
            while time.monotonic() < deadline:
                dialer.recv(0.5)
        assert self.wait_for(cv, lambda: seen == [(dialer.peer, False)])

    def test_a_blocked_recv_is_woken_by_close(self, transport: Transport) -> None:
        listener = self.listen(transport)
        raised: list[BaseException] = []

        def wait() -> None:
            try:
                listener[0].recv(None)
            except BaseException as exc:  # what it raised is the point
                raised.append(exc)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        time.sleep(0.2)
        listener[0].close()
        t.join(self.timeout)
        assert not t.is_alive() and raised and isinstance(raised[0], TransportClosed)

    # -- waking a receiver (a declared capability) ---------------------------------------------------
    def test_wake_ends_a_waiting_recv_and_loses_no_frame(self, transport: Transport) -> None:
        listener = self.listen(transport)
        endpoint = listener[0]
        if not isinstance(endpoint, Wakeable):
            pytest.skip(f"{type(endpoint).__name__} does not declare Wakeable")
        dialer = self.dial(transport, listener)
        outcome: list[Any] = []

        def wait() -> None:
            started = time.monotonic()
            try:
                outcome.append(endpoint.recv(30.0))
            except BaseException as exc:  # what it raised is the point
                outcome.append(exc)
            outcome.append(time.monotonic() - started)

        t = threading.Thread(target=wait, daemon=True)
        t.start()
        time.sleep(0.3)
        endpoint.wake()
        t.join(self.timeout)
        assert not t.is_alive() and isinstance(outcome[0], TransportTimeout) and outcome[1] < 5.0
        for i in range(20):  # frames sent around more wakes all arrive, in order
            dialer.send_parts([i.to_bytes(4, "little")])
            if i % 5 == 0:
                endpoint.wake()
        got: list[int] = []
        deadline = time.monotonic() + self.timeout
        while len(got) < 20 and time.monotonic() < deadline:
            try:
                data, _ = endpoint.recv(1.0)
            except TransportTimeout:
                continue
            got.append(int.from_bytes(bytes(data[:4]), "little"))
        assert got == list(range(20))

    # -- lines (a declared capability) ---------------------------------------------------------------
    def test_a_line_carries_frames_both_ways_in_order_with_the_endpoints_own_calls(
            self, transport: Transport) -> None:
        listener = self.listen(transport, kind="pair")
        seen, cv = self.events(listener[0])
        dialer = self.dial(transport, listener, kind="pair")
        if not isinstance(dialer, LineEndpoint) or not isinstance(listener[0], LineEndpoint):
            pytest.skip(f"{type(dialer).__name__} does not declare LineEndpoint")
        assert self.wait_for(cv, lambda: seen, receiving=listener[0])
        home_peer = seen[0][0]
        near, far = dialer.line(dialer.peer), listener[0].line(home_peer)
        if near is None or far is None:
            pytest.skip("this transport offers no line on this connection (TLS, say)")
        # The core writes under the peer's session lock and reads under its receive lock.
        # A line's optional write_two(head, body) is write([head, body]); a body may be a view.
        sizes = [0, 5, 4096, 1 << 20, 9, 3, 70000]
        two = getattr(near, "write_two", None)
        for i, size in enumerate(sizes):
            head, body = i.to_bytes(4, "little"), bytes([i]) * size
            with dialer.peer.lock:  # type: ignore[attr-defined]
                if i >= 5 and two is not None:
                    two(head, body if i == 5 else memoryview(bytearray(body)))
                else:
                    (near.write if i % 2 else dialer.send_parts)([head, body])
        got: list[bytes] = []
        deadline = time.monotonic() + self.timeout
        while len(got) < len(sizes) and time.monotonic() < deadline:
            frame = far.read(1.0, home_peer)
            if frame is None:  # the line's path is not open now (a frame came in pieces): recv takes it
                try:
                    frame, _ = listener[0].recv(0.2)
                except TransportTimeout:
                    continue
            got.append(bytes(frame))
        assert [(int.from_bytes(g[:4], "little"), len(g) - 4) for g in got] == list(enumerate(sizes))
        with home_peer.lock:  # type: ignore[attr-defined]
            far.write([b"back", b"!"], home_peer)
        frame = None
        deadline = time.monotonic() + self.timeout
        while frame is None and time.monotonic() < deadline:
            frame = near.read(1.0, dialer.peer)
        assert frame is not None and bytes(frame) == b"back!"
        dialer.close()
        with pytest.raises(TransportClosed):
            for _ in range(100):  # a write may still fit in buffers before the end is seen
                with home_peer.lock:  # type: ignore[attr-defined]
                    far.write([b"x" * 65536], home_peer)
                time.sleep(0.01)

    # -- flow control (a declared capability) -------------------------------------------------------
    def test_pause_stops_a_writer_and_resume_loses_nothing(self, transport: Transport) -> None:
        listener = self.listen(transport)
        endpoint = listener[0]
        if not isinstance(endpoint, FlowControl):
            pytest.skip(f"{type(endpoint).__name__} does not declare FlowControl")
        seen, cv = self.events(endpoint)
        dialer = self.dial(transport, listener)
        assert self.wait_for(cv, lambda: seen)
        peer = seen[0][0]
        endpoint.pause(peer)
        total, chunk = 2000, bytes(64 << 10)  # 128 MiB: more than any socket buffers
        sent: list[int] = []

        def write() -> None:
            for i in range(total):
                dialer.send_parts([i.to_bytes(4, "little"), chunk])
                sent.append(i)

        writer = threading.Thread(target=write, daemon=True)
        writer.start()
        time.sleep(1.0)
        assert len(sent) < total, "a paused peer's sends go on without end"
        endpoint.resume(peer)
        for i in range(total):
            data, _ = self.recv(endpoint)
            assert int.from_bytes(data[:4], "little") == i
        writer.join(self.timeout)
        assert len(sent) == total
        endpoint.drop(peer)
        assert self.wait_for(cv, lambda: (peer, False) in seen, receiving=endpoint)


class _Counting(Pieces):
    """``size`` bytes made ``step`` at a time into one reused buffer (each piece a different
    byte value): a transport that keeps a piece past the next request sends wrong bytes."""

    def __init__(self, size: int, step: int) -> None:
        self.size, self.step = size, step

    def __len__(self) -> int:
        return self.size

    def _lengths(self) -> Iterator[int]:
        left = self.size
        while left:
            yield min(self.step, left)
            left -= min(self.step, left)

    def __iter__(self) -> Iterator[memoryview]:
        buffer = bytearray(self.step)
        for i, n in enumerate(self._lengths()):
            buffer[:n] = bytes([i % 251]) * n
            yield memoryview(buffer)[:n]

    def expected(self) -> bytes:
        return b"".join(bytes([i % 251]) * n for i, n in enumerate(self._lengths()))
