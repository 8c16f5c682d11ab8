"""A listener's admission, on the reactor thread: accept a connection (another user's Unix
connection is refused before it costs anything), keep within the limits (at a limit the
oldest unauthenticated TCP connection goes, :mod:`fibercore.wire.admission`, never one younger
than a second), run the TLS and fibercore handshakes, hand an authenticated connection to the
listener's reading side, and drop connections that broke, left or did not authenticate in
``Limits.handshake_timeout``.

Before its connection has authenticated (:mod:`fibercore.wire.handshake`) a peer may send only
records of ``MAX_HANDSHAKE_FRAME`` bytes; each listener holds at most ``Limits.max_pending``
unauthenticated connections, ``Limits.max_pending_per_peer`` of them from one uid (Unix) or
address (TCP; all of loopback is one), and ``Limits.max_peers`` authenticated ones.
"""

from __future__ import annotations

import collections
import errno
import os
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from fibercore.errors import TransportTimeout
from fibercore.transport import PeerCallback
from fibercore.wire.admission import make_room, peer_identity
from fibercore.wire.frames import reject
from fibercore.wire.handshake import Authenticator, HandshakeFailed, Limits, Session

from .connection import WOULD_BLOCK, Broken, Conn, Gone
from .local import peer_uid
from .options import large_send_buffer, tcp_options
from .reactor import Reactor


def is_uid(who: Hashable) -> bool:
    """``who`` is a uid (Unix peers: another user's are refused before they count)."""
    return isinstance(who, tuple) and who[0] == "uid"


class Admission:
    """The reactor side of :class:`~fibercore.builtins.tcp.listener.TcpListener` (its state is
    made by the listener; selector changes for the reading side go through ``_own_call``)."""

    address: str
    _sock: socket.socket
    _local: socket.socket | None
    _auth: Authenticator
    _limits: Limits
    _tls: ssl.SSLContext | None
    _spin: float
    _silence: float
    _pending: dict[Conn, None]
    _pending_by: collections.Counter[Hashable]
    _peers: dict[Session, Conn]
    _sole: Conn | None
    _inbox: collections.deque[tuple[memoryview, Session]]
    _cv: threading.Condition
    _callbacks: list[PeerCallback]
    _closed: bool
    _reading: threading.Lock
    _lane: Any
    _wake: tuple[int, int] | None
    _reactor: Reactor

    # The reading side's, used here (:class:`~fibercore.builtins.tcp.listener.TcpListener`).
    def _own_call(self, fn: Callable[[], None]) -> None:
        raise NotImplementedError

    def _watch(self, conn: Conn) -> None:
        raise NotImplementedError

    def _unwatch(self, conn: Conn) -> None:
        raise NotImplementedError

    def _wake_reader(self) -> None:
        raise NotImplementedError

    def _close_reading(self) -> None:
        raise NotImplementedError

    def _start(self) -> None:
        if self._closed:
            return
        self._reactor.serve(self)
        self._reactor.sel.register(self._sock, selectors.EVENT_READ, lambda: self._accept(self._sock))
        if self._local is not None:
            local = self._local
            self._reactor.sel.register(local, selectors.EVENT_READ, lambda: self._accept(local))

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(64):
            try:
                sock, addr = listening.accept()
            except WOULD_BLOCK:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    reject(self.address, "?", f"cannot accept: {exc}", "refused_connections")
                    self._make_room(None)
                return
            if sock.family == socket.AF_UNIX:
                uid = peer_uid(sock)
                label, who = f"unix uid {uid}", ("uid", str(uid))
                if uid != os.geteuid():  # another user: refused before it costs anything
                    sock.close()
                    reject(self.address, label, "a Unix connection from another user", "refused_connections")
                    continue
            else:
                label, who = f"{addr[0]}:{addr[1]}", ("ip", peer_identity(addr[0]))
            if len(self._peers) >= self._limits.max_peers:
                sock.close()
                reject(self.address, label, "too many peers", "refused_connections")
                continue
            if not self._make_room(who):
                sock.close()  # the newest waits its turn (its dialer retries); none in progress is cut
                reject(self.address, label, "too many unauthenticated connections from it", "refused_connections")
                continue
            sock.setblocking(self._tls is None)  # plain: the reactor reads with MSG_DONTWAIT
            if sock.family != socket.AF_UNIX:
                tcp_options(sock, self._silence)
            else:
                large_send_buffer(sock)
            private = sock.family == socket.AF_UNIX and self._tls is None  # its user checked above
            conn = Conn(sock, self._auth.listener(label, private), label, self._spin)
            conn.who = who
            self._pending[conn] = None
            self._pending_by[who] += 1
            if self._tls is not None:
                try:
                    conn.sock = self._tls.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
                except (OSError, ValueError):
                    self._drop(conn)
                    continue
                conn.tls = True
                self._reactor.sel.register(conn.sock, selectors.EVENT_READ, lambda c=conn: self._tls_step(c))
                self._tls_step(conn)
            else:
                self._greet(conn)

    def _make_room(self, newcomer: Hashable | None) -> bool:
        """Room for one more unauthenticated connection from ``newcomer`` (None: the process
        is out of descriptors), closing the oldest one :func:`~fibercore.wire.admission.make_room`
        picks if need be (never a uid's own: another user's are refused before they count, so
        the same user's connections are handshakes in progress). True if there is room."""
        limits = self._limits
        if newcomer is not None and self._pending_by[newcomer] < limits.max_pending_per_peer and (
                len(self._pending) < limits.max_pending):
            return True  # the usual case: no list made
        room, victim = make_room([(conn, conn.who, None if is_uid(conn.who) else conn.opened)
                                  for conn in self._pending], newcomer, limits, time.monotonic())
        if victim is not None:
            reject(self.address, victim.label, "unauthenticated the longest while the table was full: closed",
                   "refused_connections")
            self._drop(victim)
        return room

    def _tls_step(self, conn: Conn) -> None:
        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except WOULD_BLOCK:
            return
        except (OSError, ValueError) as exc:
            reject(self.address, conn.label, f"TLS handshake failed: {exc}", "refused_connections")
            self._drop(conn)
            return
        self._reactor.sel.unregister(conn.sock)
        self._greet(conn)

    def _greet(self, conn: Conn) -> None:
        hello = conn.hs.start()
        try:
            if hello is not None:
                conn.write([hello], block=False)
        except (TransportTimeout, Broken):
            self._drop(conn)
            return
        self._reactor.sel.register(conn.sock, selectors.EVENT_READ, lambda: self._readable(conn))

    def _readable(self, conn: Conn) -> None:
        try:
            conn.pump(lambda frame: self._frame(conn, frame))
        except WOULD_BLOCK:
            pass
        except (Broken, HandshakeFailed, TransportTimeout) as exc:
            if conn.session is None:  # quiet when the peer just went (a job that died while it started)
                reject(self.address, conn.label, f"did not authenticate: {exc}", "refused_connections",
                       quiet=isinstance(exc, Gone))
            self._drop(conn)
            return
        if conn.session is not None and not self._closed:
            # Authenticated: from now on the thread waiting in recv reads this socket.
            try:
                self._reactor.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                return
            self._own_call(lambda: self._watch(conn))

    def _frame(self, conn: Conn, frame: memoryview) -> None:
        session = conn.session
        if session is not None:  # sent right behind the handshake, before the hand-over
            with self._cv:
                self._inbox.append((frame, session))
                self._cv.notify()
            self._wake_reader()
            return
        reply = conn.hs.feed(frame)  # HandshakeFailed closes the connection
        if reply is not None:
            conn.write([reply], block=False)
        if conn.hs.session is not None:
            conn.authenticated(conn.hs.session, self._limits.max_frame)
            self._forget_pending(conn)
            self._peers[conn.hs.session] = conn
            self._sole = conn if len(self._peers) == 1 else None
            for cb in list(self._callbacks):
                cb(conn.hs.session, True)

    def _drop(self, conn: Conn) -> None:
        try:
            self._reactor.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        self._forget_pending(conn)
        session = conn.session
        if session is not None:
            self._own_call(lambda: self._unwatch(conn))
        lane = self._lane
        if lane is not None and lane[0] is conn:  # its descriptor's number may soon be another's
            self._lane = None
        # Forgotten before it is closed: a line's reader looks for it in _sole before each read
        # (and reads through the socket object, which refuses a closed one: never another
        # file's descriptor that took its number).
        known = session is not None and self._peers.pop(session, None) is not None
        if known:
            self._sole = next(iter(self._peers.values())) if len(self._peers) == 1 else None
        conn.close()
        if known:
            for cb in list(self._callbacks):
                try:
                    cb(session, False)
                except Exception:  # pragma: no cover - a callback must not stop the reactor
                    pass

    def _forget_pending(self, conn: Conn) -> None:
        if self._pending.pop(conn, False) is None:  # it was pending: its peer's budget frees
            self._pending_by[conn.who] -= 1
            if self._pending_by[conn.who] <= 0:
                del self._pending_by[conn.who]

    def next_expiry(self, now: float) -> float | None:
        """Seconds from ``now`` until the oldest unauthenticated connection times out (None:
        there is none)."""
        soonest = None
        for conn in list(self._pending):
            left = conn.opened + self._limits.handshake_timeout - now
            soonest = left if soonest is None else min(soonest, left)
        return soonest

    def expire(self, now: float) -> None:
        """Close connections that did not authenticate in time."""
        for conn in list(self._pending):
            if now - conn.opened > self._limits.handshake_timeout:
                reject(self.address, conn.label, "did not authenticate in time", "refused_connections")
                self._drop(conn)

    def _close_all(self) -> None:
        """Close the listening sockets and every connection (on the reactor thread)."""
        self._reactor.forget(self)
        for listening in (self._sock, self._local):
            if listening is None:
                continue
            try:
                self._reactor.sel.unregister(listening)
            except (KeyError, ValueError):
                pass
            listening.close()
        for conn in list(self._pending) + list(self._peers.values()):
            self._drop(conn)
        self._close_reading()

