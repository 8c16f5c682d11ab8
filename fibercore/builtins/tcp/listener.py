"""A listening endpoint's reading and writing side: many authenticated peers; the thread
waiting in ``recv`` reads their connections itself (one at a time, through the listener's own
selector), so a frame reaches the thread that handles it with no hand-off between threads; a
Pipe's home with its one child reads that connection alone (``recv_frame``), or straight
through a :class:`~fibercore.builtins.tcp.connection.Line`. Accepting and authenticating is
the reactor's (:mod:`.admission`)."""

from __future__ import annotations

import collections
import functools
import os
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.transport import PeerCallback
from fibercore.wire.handshake import Authenticator, Session

from .admission import Admission
from .connection import IDLE_STEP, WOULD_BLOCK, Broken, Conn, Line
from .options import DEFAULT_SILENCE
from .reactor import get_reactor
from .spinning import DEFAULT_SPIN, SpinGate

#: Longest a reading thread polls before it looks again at what changed (closed, handed over).
READ_STEP = 0.05
#: Longest a Pipe home's read of its one connection blocks (:meth:`TcpListener.recv_frame`)
#: before it looks at what else changed: how late a second peer or a wake-up is seen there.
LANE_STEP = 0.1
#: A listener's reading thread polls before sleeping only this soon after its last frame
#: (an idle endpoint sleeps at once instead of spinning every READ_STEP).
SPIN_AFTER = 0.05


class Looker:
    """The descriptors a listener's reading thread waits on, each with its connection (None:
    the wake-up pipe): what ``selectors`` keeps, without its Python on every look (a listener
    looks once per frame it reads). epoll where there is one, else poll(2)."""

    def __init__(self) -> None:
        self._epoll = hasattr(select, "epoll")
        self._poll: Any = select.epoll() if self._epoll else select.poll()
        self._data: dict[int, Any] = {}

    def register(self, fd: int, data: Any) -> None:
        self._poll.register(fd, select.POLLIN)
        self._data[fd] = data

    def unregister(self, fd: int) -> None:
        """Forget ``fd`` (its descriptor may be closed already)."""
        if self._data.pop(fd, Looker) is not Looker:
            try:
                self._poll.unregister(fd)
            except (KeyError, ValueError, OSError):
                pass

    def get(self, fd: int) -> Any:
        """What ``fd`` was registered with; KeyError if it is not."""
        return self._data[fd]

    def select(self, timeout: float | None) -> list[Any]:
        """What the readable descriptors were registered with, within ``timeout`` seconds."""
        if self._epoll:
            events = self._poll.poll(-1 if timeout is None else timeout)
        else:
            events = self._poll.poll(None if timeout is None else int(timeout * 1000 + 0.999))
        data = self._data
        return [data[fd] for fd, _ in events if fd in data]

    def close(self) -> None:
        if self._epoll:
            self._poll.close()
        self._data.clear()


class TcpListener(Admission):
    """A listening endpoint: many authenticated peers, frames handed to ``recv`` callers."""

    def __init__(self, sock: socket.socket, address: str, auth: Authenticator,
                 tls: ssl.SSLContext | None, local: socket.socket | None = None,
                 spin: float = DEFAULT_SPIN, silence: float = DEFAULT_SILENCE) -> None:
        self.address = address
        self._spin = spin
        self._silence = silence
        self._spin_gate = SpinGate()
        self._sock = sock
        self._local = local  # the same endpoint on a Unix socket, for peers on this machine
        self._auth = auth
        self._limits = auth.limits
        self._tls = tls
        self._pid = os.getpid()
        self._pending: dict[Conn, None] = {}  # unauthenticated, oldest first
        self._pending_by: collections.Counter[Hashable] = collections.Counter()  # per peer identity
        self._peers: dict[Session, Conn] = {}
        self._sole: Conn | None = None  # the one peer's connection while there is exactly one
        self._inbox: collections.deque[tuple[memoryview, Session]] = collections.deque()
        self._lock = threading.Lock()  # ``with self._lock`` where nothing waits: a C call
        self._cv = threading.Condition(self._lock)
        self._waiters = 0  # threads in self._cv.wait (notify only when one is there)
        self._woken = False  # wake() was called: the waiting recv raises TransportTimeout
        self._nudged = False  # wake() was called: the next recv_frame returns None
        self._callbacks: list[PeerCallback] = []
        self._closed = False
        # Authenticated connections are read by the thread waiting in recv (one at a time:
        # ``_reading``), through this listener's own selector; other threads change that
        # selector only through ``_todo``, applied by the reader, and wake it with ``_wake``.
        self._own = Looker()
        self._last_frame = 0.0  # when a frame last arrived (a listener spins only while busy)
        self._reading = threading.Lock()
        #: recv_frame's connection, what takes the frames it reads past, and its peer
        self._lane: tuple[Conn, Callable[[memoryview], None], Hashable] | None = None
        self._todo: collections.deque[Callable[[], None]] = collections.deque()
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wake: tuple[int, int] | None = (r, w)
        self._own.register(r, None)
        self._reactor = get_reactor()
        self._reactor.call(self._start)

    def _own_call(self, fn: Callable[[], None]) -> None:
        """Change the reading selector: ``fn`` runs on the next reading thread, before it polls."""
        self._todo.append(fn)
        self._wake_reader()

    def _watch(self, conn: Conn) -> None:
        if conn.session not in self._peers:
            return  # dropped meanwhile
        fd = conn.fd
        self._own.unregister(fd)  # a closed connection's number, reused
        try:
            self._own.register(fd, conn)
        except (KeyError, ValueError, OSError):
            pass

    def _unwatch(self, conn: Conn) -> None:
        try:
            watched = self._own.get(conn.fd)
        except KeyError:
            return
        if watched is conn:
            self._own.unregister(conn.fd)

    def wake(self) -> None:
        """:class:`fibercore.transport.Wakeable`: the thread waiting in :meth:`recv` raises
        TransportTimeout now (the wake-up pipe ends its poll)."""
        self._nudged = True
        with self._lock:
            self._woken = True
            if self._waiters:
                self._cv.notify_all()
        self._wake_reader()

    def _wake_reader(self) -> None:
        """Wake the thread reading this listener's connections (something changed)."""
        if self._wake is not None:
            try:
                os.write(self._wake[1], b"!")
            except OSError:
                pass

    def _close_reading(self) -> None:
        """Close the reading selector and the wake-up pipe, once no thread polls them."""
        if self._wake is not None:
            with self._reading:  # no thread polls them any more
                self._own.close()
                for fd in self._wake:
                    try:
                        os.close(fd)
                    except OSError:
                        pass
                self._wake = None

    # -- caller side --------------------------------------------------------------------------
    def send(self, data: bytes, peer: Hashable | None = None) -> None:
        self.send_parts([data], peer)

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        if conn is None:
            if self._closed:
                raise TransportClosed(f"endpoint {self.address} is closed")
            raise TransportClosed(f"{peer!r} is no longer connected to {self.address}")
        try:
            with conn.send_lock:
                conn.write(parts, block)
        except Broken as exc:
            self._reactor.call(lambda: self._drop(conn))
            raise TransportClosed(f"{peer!r} on {self.address}: {exc}") from None

    def recv(self, timeout: float | None = None) -> tuple[memoryview, Hashable]:
        """The next frame and its peer; this thread reads the connections while it waits
        (another waiting thread takes the frames it finds, or reads when it is done)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        polled = False  # the connections were read at least once (a poll reads them too)
        while True:
            with self._lock:
                if self._inbox:
                    return self._inbox.popleft()
                if self._closed:
                    raise TransportClosed(f"endpoint {self.address} is closed")
                remaining = None if deadline is None else deadline - time.monotonic()
                expired = remaining is not None and remaining <= 0
                if expired and polled:
                    raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
                if not self._reading.acquire(blocking=False):
                    if expired:
                        raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
                    # another thread reads; it hands over what it finds (and the reading, when done)
                    self._waiters += 1
                    try:
                        self._cv.wait(READ_STEP if remaining is None else min(READ_STEP, remaining))
                    finally:
                        self._waiters -= 1
                    if self._woken and not self._inbox:
                        self._woken = False
                        raise TransportTimeout(f"woken while waiting on {self.address}")
                    continue
            try:
                got = self._read_own(max(0.0, remaining) if remaining is not None else None)
            finally:
                self._reading.release()
            with self._lock:
                if got:  # this thread keeps the first frame (no hand-off), waiting threads the rest
                    if len(got) == 1 and not self._inbox and not self._waiters:
                        return got[0]  # the usual case: one frame, nobody else waiting
                    self._inbox.extend(got)  # behind any older ones (delivered before the hand-over)
                    if self._waiters:
                        self._cv.notify(len(self._inbox))  # and one more to take over the reading
                    return self._inbox.popleft()
                if self._waiters:
                    self._cv.notify()  # a waiting thread may take over the reading
                if self._woken:
                    self._woken = False
                    raise TransportTimeout(f"woken while waiting on {self.address}")
            polled = True

    def recv_frame(self, timeout: float | None, peer: Hashable) -> memoryview | None:
        """:class:`fibercore.transport.LaneEndpoint`: ``peer``'s next frame, read on this
        thread, while ``peer`` is the only connection (a Pipe's home with its one child).

        One blocking read of that socket, as a dialled end's, for at most :data:`LANE_STEP`
        (the socket's receive timeout): no poll. What else may happen meanwhile (a second
        peer, :meth:`wake`, a change of the reading selector) is seen when it returns: then
        it returns None and :meth:`recv`, which polls every connection and the wake-up pipe,
        takes over; so a rare event waits at most one step, and a step costs nothing."""
        lane = self._lane
        if lane is None or lane[2] is not peer:
            lane = self._lane_to(peer)
            if lane is None:
                return None
        if not self._reading.acquire(False):
            return None
        try:
            return self._read_line(lane[0], lane[1], timeout, peer)
        finally:
            self._reading.release()

    def _lane_to(self, peer: Hashable) -> tuple[Conn, Callable[[memoryview], None], Hashable] | None:
        """:meth:`recv_frame`'s connection to ``peer``, what takes the frames it reads past,
        and the peer; None for a peer that is gone, a TLS one, or a closed listener."""
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        if conn is None or conn.tls or self._wake is None:
            return None
        self._lane = (conn, lambda f: self._inbox.append((f, peer)), peer)  # type: ignore[arg-type]
        return self._lane

    def line(self, peer: Hashable) -> Line | None:
        """:class:`fibercore.transport.LineEndpoint`: ``peer``'s plain connection, read as
        :meth:`recv_frame` reads it (None for a TLS one, a peer that is gone, a closed listener)."""
        lane = self._lane_to(peer)
        if lane is None:
            return None
        return Line(lane[0], self._broken_line, functools.partial(self._read_line, lane[0], lane[1]))

    def _read_line(self, conn: Conn, deliver: Callable[[memoryview], None], timeout: float | None,
                   peer: Hashable = None) -> memoryview | None:
        """A line's ``read``: :meth:`recv_frame` for a caller that holds its channel's receive
        lock, under which every other read of this endpoint runs too (so no reading lock here),
        with the connection and the peer's hand-over looked up once, when the line was made.
        ``deliver`` takes what one read brings past the frame it returns."""
        if self._nudged:  # wake() was called: the layers look (once) at what changed
            self._nudged = False
            return None
        if (self._sole is not conn or self._inbox or self._todo or self._closed
                or conn._body is not None or conn._hpos or conn._partial is not None
                or (timeout is not None and timeout <= 0)):
            return None
        step = LANE_STEP if timeout is None or timeout > LANE_STEP else timeout
        try:
            if conn._rcvtimeo != step:
                conn.wait_at_most(step)
            frame = conn.read_one(deliver, True)
        except WOULD_BLOCK:  # the step passed
            return None
        except (Broken, OSError, ValueError):  # ended, or closed meanwhile by the reactor
            self._unwatch(conn)
            self._reactor.call(lambda: self._drop(conn))
            return None
        if self._spin > 0:  # what the selector's spinning decides on
            self._last_frame = time.perf_counter()
        if self._inbox and self._waiters:  # that read brought more: another thread waits for it
            with self._cv:
                self._cv.notify(len(self._inbox))
        return frame

    def _broken_line(self, conn: Conn, why: str) -> TransportClosed:
        self._reactor.call(lambda: self._drop(conn))
        return TransportClosed(f"{conn.session!r} on {self.address}: {why}")

    def _read_own(self, timeout: float | None) -> list[tuple[memoryview, Session]]:
        """Poll the connections (spinning briefly, then sleeping) for up to ``timeout``
        (at most :data:`READ_STEP`); the frames that arrived, in order."""
        wake = self._wake
        got: list[tuple[memoryview, Session]] = []
        if wake is None:
            return got
        while self._todo:
            self._todo.popleft()()
        step = IDLE_STEP if timeout is None else min(IDLE_STEP, timeout)
        try:
            ready = None
            if self._spin > 0 and step > 0:  # a spinning read looks first (one look otherwise)
                ready = self._own.select(0)
                now = time.perf_counter()
                if not ready and now - self._last_frame < SPIN_AFTER and self._spin_gate.open():
                    # busy, and a CPU to spare: the next frame is likely soon
                    end = now + min(self._spin, step)
                    while not ready and time.perf_counter() < end:
                        ready = self._own.select(0)
                    self._spin_gate.result(bool(ready))
            if not ready:
                ready = self._own.select(step)
        except (OSError, ValueError):  # closed under us
            return got
        for conn in ready:
            if conn is None:
                try:
                    os.read(wake[0], 4096)
                except OSError:
                    pass
                continue
            session = conn.session
            deliver = lambda frame, s=session: got.append((frame, s))  # noqa: E731
            try:
                if conn.idle:  # the usual case: one read brings one whole frame, taken as it is
                    frame = conn.read_one(deliver, wait=False)
                    if frame is not None:
                        got.append((frame, session))
                else:
                    conn.pump(deliver)
            except WOULD_BLOCK:
                pass
            except (Broken, OSError, ValueError):
                self._unwatch(conn)
                self._reactor.call(functools.partial(self._drop, conn))
        if got and self._spin > 0:
            self._last_frame = time.perf_counter()
        return got

    def on_peer_event(self, callback: PeerCallback) -> None:
        self._callbacks.append(callback)

    def drop(self, peer: Hashable) -> None:
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        if conn is not None:
            self._reactor.call(lambda: self._drop(conn))

    def pause(self, peer: Hashable) -> None:
        """Stop reading ``peer``'s connection: TCP's window closes and its sends block."""
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        if conn is not None:
            self._own_call(lambda: self._reading_on(conn, False))

    def resume(self, peer: Hashable) -> None:
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        if conn is not None:
            self._own_call(lambda: self._reading_on(conn, True))

    def _reading_on(self, conn: Conn, on: bool) -> None:
        if on:
            self._watch(conn)  # what arrived while paused is read at once (level-triggered)
        else:
            self._unwatch(conn)

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        self._wake_reader()
        if os.getpid() != self._pid:  # a forked child's copy: the parent's sockets are not ours
            self._sock.close()
            if self._local is not None:
                self._local.close()
            self._own.close()
            return
        if threading.current_thread() is self._reactor.thread:
            self._close_all()
            return
        done = threading.Event()

        def close_all() -> None:
            try:
                self._close_all()
            finally:
                done.set()

        self._reactor.call(close_all)
        done.wait(2.0)  # descriptors are gone when close() returns (a reactor stuck elsewhere: soon after)

    def __repr__(self) -> str:
        return f"<TcpListener {self.address}>"
