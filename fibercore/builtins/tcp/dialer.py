"""A dialling endpoint: one authenticated connection, read and written on its callers' threads
(no thread of its own); and how one is made: the Unix socket on the same machine, else TCP
(or TLS), retried while the listener has no room, then the handshake."""

from __future__ import annotations

import collections
import itertools
import os
import random
import select
import socket
import ssl
import threading
import time
from collections.abc import Hashable, Iterable
from typing import Any

from fibercore.errors import AuthenticationError, TransportClosed, TransportError, TransportTimeout
from fibercore.transport import PeerCallback
from fibercore.util import machine_identity
from fibercore.wire.frames import reject
from fibercore.wire.handshake import Authenticator, HandshakeFailed, Session

from . import local
from .addresses import split_address
from .connection import WOULD_BLOCK, Broken, Conn, Line
from .options import DEFAULT_SILENCE, large_send_buffer, tcp_options
from .spinning import DEFAULT_SPIN
from .tls import wrap_client

#: A dialer whose connection is closed before the listener's HELLO (refused for room: many
#: jobs of one node connecting at once, or a flood) tries again after these pauses, the last
#: one repeated, for up to :data:`DIAL_PATIENCE` seconds (each pause scaled by a random
#: 0.5-1.5, so a crowd does not come back at one instant). 4,096 workers connecting to one
#: master at once on 2 cores took longer than the first seven pauses.
DIAL_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
DIAL_PATIENCE = 120.0


class TcpDialer:
    """A dialling endpoint: one authenticated connection, read and written by its callers."""

    def __init__(self, conn: Conn, address: str, frames: Iterable[memoryview] = ()) -> None:
        self.address = address
        self._conn = conn
        assert conn.session is not None
        self.peer: Session = conn.session
        #: Frames read and not yet taken (first: those that followed the handshake in its read).
        self._inbox: collections.deque[memoryview] = collections.deque(frames)
        self._rlock = threading.Lock()
        self._callbacks: list[PeerCallback] = []
        self._broken: str | None = None
        self._closed = False
        self._pid = os.getpid()

    def _gone(self, why: str) -> None:
        if self._broken is None:
            self._broken = why
            self._conn.close(shutdown=False)  # the descriptor goes now, not when the endpoint is collected
            if not self._closed:
                for cb in list(self._callbacks):
                    try:
                        cb(self.peer, False)
                    except Exception:
                        pass

    def send(self, data: bytes, peer: Hashable | None = None) -> None:
        self.send_parts([data], peer)

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        if self._closed:
            raise TransportClosed(f"endpoint {self.address} is closed")
        if self._broken is not None:
            raise TransportClosed(f"the connection to {self.address} is gone: {self._broken}")
        try:
            with self._conn.send_lock:
                self._conn.write(parts, block)
        except Broken as exc:
            self._gone(str(exc))
            raise TransportClosed(f"the connection to {self.address} is gone: {exc}") from None

    def line(self, peer: Hashable = None) -> Line | None:
        """:class:`fibercore.transport.LineEndpoint`: the connection (None over TLS)."""
        return None if self._conn.tls else Line(self._conn, self._broken_line, self._read_frame)

    def _broken_line(self, conn: Conn, why: str) -> TransportClosed:
        if self._closed:
            return TransportClosed(f"endpoint {self.address} is closed")
        self._gone(why)
        return TransportClosed(f"the connection to {self.address} is gone: {self._broken}")

    def recv_frame(self, timeout: float | None = None, peer: Hashable = None) -> memoryview | None:
        """:class:`fibercore.transport.LaneEndpoint`: one waiting read that brings exactly one
        whole frame, returned; None when this path is not open now (another thread reads,
        frames wait, a frame arrived in pieces: what was read is kept in order) and after
        ``timeout`` without a frame. Raises TransportClosed when the connection ended."""
        if not self._rlock.acquire(False):
            return None
        try:
            return self._read_frame(timeout)
        finally:
            self._rlock.release()

    def _read_frame(self, timeout: float | None, peer: Hashable = None) -> memoryview | None:
        """:meth:`recv_frame` for a caller that reads this endpoint alone (it holds the read
        lock, or is a line: the core reads a connection under its channel's receive lock)."""
        conn = self._conn
        if (self._inbox or self._broken is not None or self._closed or conn._body is not None or conn._hpos
                or conn._partial is not None or conn.tls):  # conn.idle, inlined
            return None
        if timeout is None:
            if conn._rcvtimeo is not None:
                conn.receive_timeout(None)
        elif timeout <= 0:
            return None
        elif timeout != conn.asked:  # a line asks the same wait each time: set once
            conn.wait_at_most(timeout)
        try:
            return conn.read_one(self._inbox.append)
        except WOULD_BLOCK:
            return None
        except Broken as exc:
            self._gone(str(exc))
            raise TransportClosed(f"the connection to {self.address} is gone: {exc}") from None

    def recv(self, timeout: float | None = None) -> tuple[memoryview, Hashable]:
        if not self._inbox and (timeout is None or timeout > 0):
            # The hot path (a simulator waiting for its next action): one blocking read that
            # brings exactly one whole frame. Anything else is parsed as usual, below.
            started = time.monotonic() if timeout is not None else 0.0
            try:
                frame = self.recv_frame(timeout)
            except TransportClosed:
                frame = None
            if frame is not None:
                return frame, self.peer
            if self._inbox:
                timeout = 0.0  # what that read brought is taken below, without waiting
            elif timeout is not None:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._rlock.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
        try:
            while not self._inbox:
                if self._closed:
                    raise TransportClosed(f"endpoint {self.address} is closed")
                if self._broken is not None:
                    raise TransportClosed(f"the connection to {self.address} is gone: {self._broken}")
                if self._conn.tls:  # what the TLS layer holds already is read before waiting
                    try:
                        self._conn.pump(self._inbox.append)
                        continue
                    except WOULD_BLOCK:
                        pass
                    except Broken as exc:
                        self._gone(str(exc))
                        continue
                try:
                    if self._conn.tls:
                        self._conn._wait(select.POLLIN, deadline)
                        continue
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:  # a last look, without waiting
                        try:
                            self._conn.pump(self._inbox.append)
                        except WOULD_BLOCK:
                            pass
                        if not self._inbox:
                            raise TransportTimeout("timed out")
                        continue
                    # A blocking read (no poll() wake-up) of at most IDLE_STEP; the receive
                    # timeout is set again only when it is far from what is left.
                    self._conn.wait_at_most(remaining)
                    self._conn.pump(self._inbox.append, wait=True)
                except WOULD_BLOCK:
                    continue  # the receive timeout passed (checked above on the next turn)
                except TransportTimeout:
                    raise TransportTimeout(f"no frame on {self.address} within {timeout} s") from None
                except Broken as exc:
                    self._gone(str(exc))
            return self._inbox.popleft(), self.peer
        finally:
            self._rlock.release()

    def on_peer_event(self, callback: PeerCallback) -> None:
        self._callbacks.append(callback)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        # shutdown wakes a thread polling this socket; never on a forked child's inherited copy
        self._conn.close(shutdown=os.getpid() == self._pid)

    def __repr__(self) -> str:
        return f"<TcpDialer {self.address}>"


def dial_local(address: str, auth: Authenticator, spin: float) -> TcpDialer | None:
    """The listener's Unix socket, if it is on this machine, takes the connection within
    :data:`~.local.LOCAL_DEADLINE` and belongs to this user; None means: use TCP."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(local.LOCAL_DEADLINE)
        sock.connect(local.local_name(auth.expect))  # type: ignore[arg-type]
        if local.peer_uid(sock) != os.geteuid():  # not our user's listener: never speak to it
            reject(address, "unix", "the Unix socket belongs to another user", "refused_connections")
            sock.close()
            return None
        large_send_buffer(sock)
    except OSError:
        sock.close()
        return None
    try:
        return handshake(sock, address, auth, spin)
    except (TransportError, AuthenticationError, Refused):
        return None


def dial(address: str, auth: Authenticator, tls: ssl.SSLContext | None, server_name: str | None,
         spin: float = DEFAULT_SPIN, silence: float = DEFAULT_SILENCE) -> TcpDialer:
    scheme, host, port, machine = split_address(address)
    if tls is not None and scheme != "tls+tcp":
        raise TransportError(f"{address} is a plain tcp:// address but this process has tls = true: it never "
                             "dials without TLS. Give the listener's tls+tcp:// address (start it with tls = true)")
    if scheme == "tls+tcp" and tls is None:
        raise TransportError(f"{address} expects TLS: set tls = true (with tls_cert_file and tls_ca_file)")
    if tls is None and local.LOCAL_SOCKETS and auth.expect is not None and machine and machine == machine_identity():
        # Same machine and network namespace: a Unix socket costs a tenth of TCP loopback per message.
        dialer = dial_local(address, auth, spin)
        if dialer is not None:
            return dialer
    give_up = time.monotonic() + DIAL_PATIENCE
    for attempt in itertools.count():
        try:
            return dial_tcp(address, host, port, auth, tls, server_name, spin, silence)
        except Refused as exc:
            pause = DIAL_RETRIES[min(attempt, len(DIAL_RETRIES) - 1)] * (0.5 + random.random())
            if time.monotonic() + pause > give_up:
                raise TransportError(f"{address} refused the connection before authenticating ({exc}), "
                                     f"{attempt + 1} times in {DIAL_PATIENCE:.0f} s: the listener is overloaded "
                                     "or closing") from None
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


class Refused(Exception):
    """The listener closed the connection before it greeted (no room now): try again."""


def dial_tcp(address: str, host: str, port: int, auth: Authenticator, tls: ssl.SSLContext | None,
             server_name: str | None, spin: float, silence: float = DEFAULT_SILENCE) -> TcpDialer:
    timeout = auth.limits.handshake_timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise TransportError(f"cannot connect to {address}: {exc}") from exc
    tcp_options(sock, silence)
    if tls is not None:
        sock = wrap_client(sock, tls, address, host, server_name)
    return handshake(sock, address, auth, spin)


def handshake(sock: socket.socket, address: str, auth: Authenticator, spin: float = DEFAULT_SPIN,
              timeout: float | None = None) -> TcpDialer:
    """Authenticate a connected socket as the dialling side; the endpoint, or an error."""
    timeout = auth.limits.handshake_timeout if timeout is None else timeout
    deadline = time.monotonic() + timeout
    sock.setblocking(False)
    hs = auth.dialer(address, private=sock.family == socket.AF_UNIX)
    conn = Conn(sock, hs, address, spin)
    frames: collections.deque[memoryview] = collections.deque()

    def deliver(frame: memoryview) -> None:
        if conn.session is not None:  # data that followed the handshake in the same read
            frames.append(frame)
            return
        reply = hs.feed(frame)
        if reply is not None:
            conn.write([reply], deadline=deadline)
        if hs.session is not None:  # the next record in this very buffer may be a big one
            conn.authenticated(hs.session, auth.limits.max_frame)

    try:
        while conn.session is None:
            try:
                conn.pump(deliver)
            except WOULD_BLOCK:
                if conn.session is None:
                    conn._wait(select.POLLIN, deadline)
    except TransportTimeout:
        conn.close()
        raise TransportError(f"{address} did not complete authentication within {timeout:.0f} s") from None
    except Broken as exc:
        conn.close()
        if not hs.greeted:
            raise Refused(str(exc)) from None
        raise AuthenticationError(
            f"{address} refused this connection ({exc}): it does not hold the same secret (another "
            "session's, or a manager with another authkey), its network_encryption setting differs, or it is not "
            "a fibercore endpoint"
        ) from None
    except HandshakeFailed as exc:
        conn.close()
        raise AuthenticationError(
            f"{address} refused this connection ({exc}): it does not hold the same secret (another "
            "session's, or a manager with another authkey), its network_encryption setting differs, or it is not "
            "a fibercore endpoint"
        ) from None
    if not conn.tls:
        sock.setblocking(True)  # reads wait in the kernel (receive_timeout); MSG_DONTWAIT otherwise
    return TcpDialer(conn, address, frames)
