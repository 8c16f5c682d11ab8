"""fibercore's transport contract (:mod:`fibercore.transport`) on nng, through pynng.

Layout: a socket per peer. nng's one-socket, many-peers protocols drop frames when a
peer's queue is full (Pair1 polyamorous, Bus) or impose request/reply turns (Req/Rep),
while fibercore needs every frame of every peer, in order, both ways. So a listener is:

- a **front** ``Rep0`` socket at the advertised address, where each dialer runs the core's
  handshake (``auth.listener()``/``auth.dialer()``) in two requests: its greeting (answered
  with the listener's HELLO, or ``BUSY`` at the limits: it greets again later) and its
  proof (answered with the listener's proof, a random token and a port). Messages there are
  at most ``MAX_HANDSHAKE_FRAME`` bytes (nng's ``recv_max_size``: a bigger one ends that
  connection); a greeting unanswered by a proof is forgotten after ``handshake_timeout``;
  at most ``max_pending`` dialers (``max_pending_per_peer`` per address) are in a handshake;
- one **Pair0 socket per peer**, made only for a dialer that proved it holds the key, on a
  port of its own. It counts once its first frame is that token, from the address that
  made the handshake (nng fixes a connection's size limit when it is made, so the big limit
  of a data connection is never offered to an unauthenticated one). Pair0 is monogamous
  (nng refuses a second connection while the first stays) and never drops: a send waits
  while the peer's buffers are full (back-pressure), as a TCP stream does.

One thread per process (``fiber-nng-accept``) answers every listener's front socket, checks
tokens and notices peers that left, so an unauthenticated peer never reaches the thread that
receives frames, and a listener (a Pipe's home is one) costs no thread of its own. The core
seals every frame (AES-GCM: nng carries them as opaque bytes), so nothing here can weaken
authentication.

Readiness: each pynng socket has a receive descriptor (nng's ``NNG_OPT_RECVFD``) that is
readable while a message waits; a listener's ``recv`` selects over its peers' descriptors
and a wake-up pipe. pynng's pipe callbacks run on nng's threads: they only record what
happened and write to the wake-up pipe.

TLS: ``tls+tcp`` with nng's own TLS (Mbed TLS, bundled in pynng's wheels), the same
certificate, CA and server name settings as the built-in transport's.
"""

from __future__ import annotations

import hmac
import os
import random
import select
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import pynng

from fibercore.errors import AuthenticationError, TransportClosed, TransportError, TransportTimeout
from fibercore.transport import MAX_HANDSHAKE_FRAME

if TYPE_CHECKING:
    from fibercore.transport import Authenticator, PeerCallback

SCHEME = "nng+tcp://"
TLS_SCHEME = "nng+tls://"
#: How long a dialer keeps asking a listener that answers BUSY (the built-in's patience).
DIAL_PATIENCE = 120.0
#: The longest a waiting select() sleeps before it looks again.
IDLE_STEP = 0.5
#: Seconds one blocking send waits before it looks whether its peer is still there.
SEND_STEP = 0.2
_HELLO = b"FIBER-NNG-1 HELLO?"
_BUSY = b"BUSY"
_REFUSED = b"REFUSED"
#: Bytes of the listener's last handshake message (a MAC).
MAC_SIZE = 32
#: Bytes of the token that binds a data connection to the handshake made on the front socket.
TOKEN = 16


class _Wake:
    """A pipe that makes a select() return (nng's callbacks and close() write to it).

    Its two descriptors are checked to still be this pipe (by inode) before each read or
    write: code elsewhere in the program that closes a descriptor twice could hand the number
    to another file, which a late write or a blocking read must never touch."""

    def __init__(self) -> None:
        self.r, self.w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self.w, False)
        self._ino = os.fstat(self.r).st_ino
        self._lock = threading.Lock()

    def healthy(self) -> bool:
        """Both descriptors are still this pipe."""
        return self._mine(self.r) and self._mine(self.w)

    def _mine(self, fd: int) -> bool:
        try:
            return fd >= 0 and os.fstat(fd).st_ino == self._ino
        except OSError:
            return False

    def set(self) -> None:
        with self._lock:
            if not self._mine(self.w):
                return
            try:
                os.write(self.w, b"!")
            except OSError:  # full: it will be read
                pass

    def clear(self) -> None:
        with self._lock:
            if not self._mine(self.r):
                return
            try:
                while os.read(self.r, 4096):
                    pass
            except OSError:
                pass

    def close(self) -> None:
        with self._lock:
            for fd in (self.r, self.w):
                if self._mine(fd):
                    os.close(fd)
            self.r = self.w = -1


#: Whether this process has used nng: its threads do not survive fork(), so a forked child of
#: such a process cannot use nng at all (its calls would wait forever).
_used_in: int | None = None


#: Every nng socket this process made, so that a forked child can disown them.
_sockets: weakref.WeakSet[pynng.Socket] = weakref.WeakSet()


def _new_socket(kind: type[pynng.Socket]) -> pynng.Socket:
    sock = kind()
    _sockets.add(sock)
    return sock


def _forked_after_use() -> None:
    """In a forked child: the parent's sockets are not ours. Closing one (as the garbage
    collector would) calls into nng, which panics in a forked process: they are disowned."""
    global _used_in
    if _used_in is not None:
        _used_in = -1  # not this process: the parent's nng state is unusable here
    for sock in list(_sockets):
        try:
            del sock._socket  # pynng's close() does nothing without it
        except AttributeError:
            pass
    _sockets.clear()


os.register_at_fork(after_in_child=_forked_after_use)


def _check_usable() -> None:
    global _used_in
    if _used_in == -1:
        raise TransportError(
            "fiber-nng cannot run in a process forked from one that used nng (nng's threads do not "
            "survive fork): start children with the spawn or forkserver method (fibercore's own "
            "Process does), or use the built-in transport (transport = tcp)")
    _used_in = os.getpid()


class NngTransport:
    """Opens nng endpoints (``transport = "nng"``); ``tls``: {"cert", "ca", "server_name"}."""

    name = "nng"

    def __init__(self, tls: dict[str, Any] | None = None) -> None:
        self.tls = tls if tls and tls.get("ca") else None

    def _tls_config(self, server: bool) -> pynng.TLSConfig | None:
        if self.tls is None:
            return None
        mode = pynng.TLSConfig.MODE_SERVER if server else pynng.TLSConfig.MODE_CLIENT
        kwargs: dict[str, Any] = {"ca_files": [self.tls["ca"]], "auth_mode": pynng.TLSConfig.AUTH_MODE_REQUIRED}
        if self.tls.get("cert"):
            kwargs["cert_key_file"] = self.tls["cert"]  # one PEM: the certificate and its key
        if not server and self.tls.get("server_name"):
            kwargs["server_name"] = self.tls["server_name"]
        return pynng.TLSConfig(mode, **kwargs)

    def url(self, host: str, port: int) -> str:
        """nng's URL for ``host:port`` (tls+tcp with TLS)."""
        return f"{'tls+tcp' if self.tls else 'tcp'}://{_bracket(host)}:{port}"

    def listen(self, kind: str, bind_host: str, advertise_host: str | None = None,
               auth: Authenticator | None = None, port: int = 0) -> NngListener:
        if auth is None:
            raise TransportError("fiber-nng needs the core's authenticator (contract 2 or later)")
        _check_usable()
        return NngListener(self, kind, bind_host, advertise_host or bind_host, auth, port)

    def dial(self, kind: str, address: str, auth: Authenticator | None = None) -> NngDialer:
        if auth is None:
            raise TransportError("fiber-nng needs the core's authenticator (contract 2 or later)")
        _check_usable()
        return NngDialer(self, address, auth)


def _readable(fds: list[int], timeout: float | None) -> set[int]:
    """The descriptors among ``fds`` that are readable within ``timeout`` seconds (poll(2): no
    limit on descriptor numbers, where select() refuses any above 1023)."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    events = poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999)))
    return {fd for fd, event in events if event & (select.POLLIN | select.POLLHUP | select.POLLERR)}


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host and not host.startswith("[") else host


def _port_of(listener: pynng.Listener) -> int:
    # pynng's SockAddr.port is in network byte order; its text form is host:port.
    return int(str(listener.local_address).rsplit(":", 1)[1])


def _host_port(address: str) -> tuple[str, int]:
    rest = address.split("://", 1)[-1].split("#", 1)[0].rstrip("/")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        raise TransportError(f"not an nng address: {address!r} (expected nng+tcp://HOST:PORT)")
    return host.strip("[]"), int(port)


def _send(conn: _Conn, data: bytes, block: bool, gone: Callable[[], bool], where: str) -> None:
    """One frame on a Pair0 socket: waits while buffers are full (checking, every
    :data:`SEND_STEP`, that the peer is still there: a Pair0 socket whose peer left would wait
    for another forever); ``block=False``: TransportTimeout rather than wait. Each attempt
    holds the connection's lock, so that no thread closes the socket in the middle of it
    (nng aborted the process when a socket was closed under a send): a close() meanwhile
    is carried out when the attempt returns."""
    if gone():
        raise TransportClosed(f"the connection to {where} is gone")
    while True:
        try:
            try:
                with conn.lock:
                    if conn.closed:
                        raise pynng.Closed(-1, "closed")
                    conn.sock.send(data, block=block)
            finally:
                if conn.closed:
                    conn.close_socket()
            return
        except pynng.TryAgain:
            raise TransportTimeout(f"{where}: nothing could be sent now") from None
        except pynng.Timeout:
            if gone():
                raise TransportClosed(f"the connection to {where} is gone") from None
        except pynng.Closed:
            raise TransportClosed(f"the connection to {where} is closed") from None


class _Conn:
    """One Pair0 socket and what is known of its one connection."""

    def __init__(self, sock: pynng.Socket, wake: _Wake, label: str) -> None:
        self.sock = sock
        self.label = label
        self.connected = False
        self.gone = False
        #: Held by each use of the socket (a send attempt: at most SEND_STEP) and by the one
        #: that closes it: never closed under a send.
        self.lock = threading.Lock()
        #: No use from now on (set at once by close()).
        self.closed = False
        #: The nng socket itself is closed (by close(), or by the use that held the lock then).
        self.sock_closed = False
        self.session: Any = None
        self.paused = False
        #: nng's id of the one connection this socket serves (its first).
        self.pipe_id: int | None = None
        self._wake = wake
        sock.add_post_pipe_connect_cb(self._connected)
        sock.add_post_pipe_remove_cb(self._removed)

    # nng's threads: record, then wake whoever selects
    def _connected(self, pipe: Any) -> None:
        if self.pipe_id is None:
            self.pipe_id = pipe.id
        self.connected = True
        self._wake.set()

    def _removed(self, pipe: Any) -> None:
        # Pair0 refuses a second connection while the first stays, and nng reports that refused
        # one as removed too: only the removal of this socket's own connection ends it (a
        # stranger dialling a peer's data port would otherwise cut the peer off).
        if pipe.id != self.pipe_id:
            return
        self.gone = True
        self._wake.set()

    def recv_fd(self) -> int | None:
        """The descriptor readable while a message waits (None once the socket is closed)."""
        try:
            try:
                with self.lock:
                    if self.closed:
                        raise pynng.Closed(-1, "closed")
                    return int(self.sock.recv_fd)
            finally:
                if self.closed:
                    self.close_socket()
        except pynng.NNGException:
            self.gone = True
            return None

    def recv_now(self) -> bytes | None:
        try:
            try:
                with self.lock:
                    if self.closed:
                        raise pynng.Closed(-1, "closed")
                    return bytes(self.sock.recv(block=False))
            finally:
                if self.closed:
                    self.close_socket()
        except pynng.TryAgain:
            return None
        except pynng.Closed:
            self.gone = True
            return None

    def close(self) -> None:
        """Closed for every use from now on. The socket itself closes now, or, while a send
        waits in nng (up to SEND_STEP, for a peer that may have left), when that send
        returns: close() never waits for a peer."""
        self.gone = True
        self.closed = True
        self.close_socket()

    def close_socket(self) -> None:
        """Close the nng socket unless a thread is using it (that thread calls this again
        when it lets go: each user of the lock checks ``closed`` after releasing it)."""
        if self.sock_closed or not self.lock.acquire(blocking=False):
            return
        try:
            if not self.sock_closed:
                self.sock_closed = True
                try:
                    self.sock.close()
                except Exception:
                    pass
        finally:
            self.lock.release()


class _Acceptor:
    """The one thread (per process) that serves every listener's front socket, checks the
    tokens of new data connections and notices peers that left: a listener costs no thread
    of its own (a Pipe's home is a listener, and programs make many)."""

    def __init__(self) -> None:
        self.wake: _Wake | None = None  # made with the thread, when the first listener comes
        self._listeners: set[NngListener] = set()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def add(self, listener: NngListener) -> _Wake:
        """Serve ``listener``; the wake-up pipe its connections' callbacks write to."""
        with self._lock:
            self._listeners.add(listener)
            if self.wake is None or not self.wake.healthy():
                self.wake = _Wake()
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="fiber-nng-accept", daemon=True)
                self._thread.start()
            wake = self.wake
        wake.set()
        return wake

    def remove(self, listener: NngListener) -> None:
        with self._lock:
            self._listeners.discard(listener)
            wake = self.wake
        if wake is not None:
            wake.set()

    def _run(self) -> None:
        while True:
            with self._lock:
                listeners = list(self._listeners)
                if self.wake is None or not self.wake.healthy():
                    self.wake = _Wake()
                wake = self.wake
            now = time.monotonic()
            fds: list[int] = [wake.r]
            deadlines: list[float] = []
            for listener in listeners:
                fds += listener.accept_fds()
                deadlines += listener.deadlines()
            # At most IDLE_STEP: a wake-up lost (its descriptor taken by code that closed it twice)
            # costs a new listener that long, never an answer.
            wait = min([max(0.0, d - now) for d in deadlines] + [IDLE_STEP])
            try:
                ready = _readable(fds, wait)
            except (OSError, ValueError):  # a socket closed meanwhile: look again
                ready = set()
            wake.clear()
            for listener in listeners:
                try:
                    listener.accept_step(ready)
                except Exception:  # one listener's trouble must not stop the others' handshakes
                    if not listener._closed:
                        raise


_acceptor = _Acceptor()


class NngListener:
    """A listening endpoint: a front socket and a Pair0 socket per peer (module docstring)."""

    def __init__(self, transport: NngTransport, kind: str, bind_host: str, advertise_host: str,
                 auth: Authenticator, port: int) -> None:
        self.kind = kind
        self._transport = transport
        self._auth = auth
        self._bind = bind_host
        self._wake = _Wake()  # the receiving thread
        self._lock = threading.Lock()
        self._peers: dict[Hashable, _Conn] = {}
        # Handshakes on the front socket: its pipe -> (handshake, deadline, address); then the
        # data connections of authenticated dialers: conn -> (token, deadline, address).
        self._greeted: dict[int, tuple[Any, float, str]] = {}
        self._pending: dict[_Conn, tuple[bytes, float, str]] = {}
        self._inbox: deque[tuple[bytes, Hashable]] = deque()
        self._callbacks: list[PeerCallback] = []
        self._closed = False
        self._reading = threading.RLock()
        self._front = _new_socket(pynng.Rep0)
        tls = transport._tls_config(server=True)
        if tls is not None:
            self._front.tls_config = tls
        self._front.recv_max_size = MAX_HANDSHAKE_FRAME + 32
        try:
            listener = self._front.listen(transport.url(bind_host, port))
        except pynng.NNGException as exc:
            self._front.close()
            raise TransportError(f"fiber-nng cannot listen on {bind_host}:{port}: {exc}") from None
        self.port = _port_of(listener)
        self._front_fd = int(self._front.recv_fd)
        scheme = TLS_SCHEME if transport.tls else SCHEME
        self.address = f"{scheme}{_bracket(advertise_host)}:{self.port}"
        self._accept_wake = _acceptor.add(self)

    # -- the accept thread (:class:`_Acceptor`): handshakes, data connections, departures -----------
    def accept_fds(self) -> list[int]:
        """The descriptors the accept thread watches for this listener."""
        if self._closed:
            return []
        with self._lock:
            pending = [c for c in self._pending if c.connected]
        return [self._front_fd] + [fd for c in pending for fd in [c.recv_fd()] if fd is not None]

    def deadlines(self) -> list[float]:
        """When handshakes and data connections in progress run out of time."""
        with self._lock:
            return [d for _, d, _ in self._greeted.values()] + [d for _, d, _ in self._pending.values()]

    def accept_step(self, ready: set[int]) -> None:
        """What the accept thread does for this listener after each wake-up."""
        if self._closed:
            return
        now = time.monotonic()
        with self._lock:
            for pipe_id in [k for k, (_, deadline, _) in self._greeted.items() if deadline < now]:
                del self._greeted[pipe_id]  # it did not prove itself in time
            pending = list(self._pending.items())
        if self._front_fd in ready:
            self._answer_front()
        for conn, (token, deadline, who) in pending:
            self._check_token(conn, token, deadline, who)
        self._notice_departures()

    def _answer_front(self) -> None:
        """One request on the front socket: a dialer's greeting (answered with the listener's
        HELLO, or BUSY at the limits), or its proof (answered with the listener's proof, a
        token and the port of a Pair0 socket for this connection alone)."""
        try:
            msg = self._front.recv_msg(block=False)
        except (pynng.TryAgain, pynng.Closed):
            return
        data, who, pipe_id = bytes(msg.bytes), _remote_host(msg), _pipe_id(msg)
        reply = _BUSY
        with self._lock:
            state = self._greeted.pop(pipe_id, None)
        if data == _HELLO:
            limits = self._auth.limits
            with self._lock:
                waiting = [w for _, _, w in self._greeted.values()] + [w for _, _, w in self._pending.values()]
                room = (len(waiting) < limits.max_pending and waiting.count(who) < limits.max_pending_per_peer
                        and len(self._peers) < limits.max_peers)
                if room:
                    hs = self._auth.listener(label=f"{self.address} <- {who}")
                    self._greeted[pipe_id] = (hs, time.monotonic() + limits.handshake_timeout, who)
                    reply = hs.start() or _BUSY  # a listener's handshake always starts
        elif state is not None:
            hs = state[0]
            try:
                proof = hs.feed(data)
            except Exception:  # a wrong key, a stranger, a relay: refused, nothing delivered
                proof = None
            if proof is not None and hs.session is not None:
                token = os.urandom(TOKEN)
                conn = self._new_pair(hs.session, token, who)
                if conn is not None:
                    reply = proof + token + b"%d" % _port_of(conn.sock.listeners[0])
                else:
                    reply = _REFUSED
            else:
                reply = _REFUSED
        else:
            reply = _REFUSED
        try:
            self._front.send(reply, block=False)
        except (pynng.TryAgain, pynng.Closed):
            pass

    def _new_pair(self, session: Any, token: bytes, who: str) -> _Conn | None:
        """The Pair0 socket of one authenticated dialer, waiting for it (and its token)."""
        sock = _new_socket(pynng.Pair0)
        tls = self._transport._tls_config(server=True)
        if tls is not None:
            sock.tls_config = tls
        sock.recv_max_size = self._auth.limits.max_frame
        sock.send_timeout = int(SEND_STEP * 1000)
        conn = _Conn(sock, self._accept_wake, f"{self.address} <- {who}")
        conn.session = session
        try:
            sock.listen(self._transport.url(self._bind, 0))
        except pynng.NNGException:
            conn.close()
            return None
        with self._lock:
            self._pending[conn] = (token, time.monotonic() + self._auth.limits.handshake_timeout, who)
        return conn

    def _check_token(self, conn: _Conn, token: bytes, deadline: float, who: str) -> None:
        """A data connection counts once its first frame is the token its handshake gave, from
        the address that made the handshake; anything else closes it."""
        if conn.gone or time.monotonic() > deadline:
            self._give_up(conn)
            return
        if not conn.connected:
            return
        frame = conn.recv_now()
        if frame is None:
            if conn.gone:
                self._give_up(conn)
            return
        try:
            pipes = list(conn.sock.pipes)
            there = str(pipes[0].remote_address).rsplit(":", 1)[0] if pipes else "?"
        except pynng.NNGException:
            there = "?"
        if not hmac.compare_digest(frame, token) or there != who:
            self._give_up(conn)
            return
        self._admit(conn, conn.session)

    def _give_up(self, conn: _Conn) -> None:
        with self._lock:
            self._pending.pop(conn, None)
        conn.close()

    def _admit(self, conn: _Conn, session: Any) -> None:
        conn._wake = self._wake  # from now on, the receiving thread watches it
        with self._lock:
            self._pending.pop(conn, None)
            if self._closed:
                conn.close()
                return
            self._peers[session] = conn
        self._wake.set()
        for callback in list(self._callbacks):
            callback(session, True)

    def _notice_departures(self) -> None:
        with self._lock:
            left = [(peer, conn) for peer, conn in self._peers.items() if conn.gone]
        for peer, conn in left:
            self._depart(peer, conn)

    def _depart(self, peer: Hashable, conn: _Conn) -> None:
        """``peer``'s connection ended: what it sent before is still delivered, then it is forgotten."""
        with self._lock:
            if self._peers.get(peer) is not conn:
                return
            while True:
                frame = conn.recv_now()
                if frame is None:
                    break
                self._inbox.append((frame, peer))
            del self._peers[peer]
        conn.close()
        for callback in list(self._callbacks):
            callback(peer, False)
        self._wake.set()

    # -- the endpoint -------------------------------------------------------------------------
    def on_peer_event(self, callback: PeerCallback) -> None:
        self._callbacks.append(callback)

    def recv(self, timeout: float | None = None) -> tuple[bytes | memoryview, Hashable]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reading:
            while True:
                if self._inbox:
                    return self._inbox.popleft()
                if self._closed:
                    raise TransportClosed(f"endpoint {self.address} is closed")
                with self._lock:
                    conns = [(peer, conn) for peer, conn in self._peers.items() if not conn.paused]
                for peer, conn in conns:  # one frame from each, in turn: no peer starves another
                    frame = conn.recv_now()
                    if frame is not None:
                        self._inbox.append((frame, peer))
                    elif conn.gone:
                        self._depart(peer, conn)
                if self._inbox:
                    continue
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
                fds = [self._wake.r] + [fd for _, conn in conns if not conn.gone
                                        for fd in [conn.recv_fd()] if fd is not None]
                step = IDLE_STEP if remaining is None else min(remaining, IDLE_STEP)
                try:
                    _readable(fds, step)
                except (OSError, ValueError):  # a socket closed meanwhile: look again
                    pass
                self._wake.clear()

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        with self._lock:
            conn = self._peers.get(peer) if peer is not None else (
                next(iter(self._peers.values())) if len(self._peers) == 1 else None)
        if conn is None or self._closed:
            raise TransportClosed(f"{self.address}: no connection to {peer!r}")
        _send(conn, b"".join(bytes(p) if not isinstance(p, bytes) else p for p in parts), block,
              lambda: conn.gone or self._closed, conn.label)

    # -- FlowControl ----------------------------------------------------------------------------
    def pause(self, peer: Hashable) -> None:
        """Stop reading ``peer``: nng's queue fills, then TCP's window, then its sends wait."""
        conn = self._peers.get(peer)
        if conn is not None:
            conn.paused = True

    def resume(self, peer: Hashable) -> None:
        conn = self._peers.get(peer)
        if conn is not None:
            conn.paused = False
            self._wake.set()

    def drop(self, peer: Hashable) -> None:
        conn = self._peers.get(peer)
        if conn is not None:
            conn.close()
            self._accept_wake.set()
            self._wake.set()

    @property
    def peer_count(self) -> int:
        return len(self._peers)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        _acceptor.remove(self)
        self._wake.set()
        try:
            self._front.close()
        except Exception:
            pass
        with self._lock:
            conns = list(self._pending) + list(self._peers.values())
            self._pending.clear()
        for conn in conns:
            conn.close()
        _close_after(self._reading, self._wake)

    def __repr__(self) -> str:
        return f"<NngListener {self.kind} {self.address}>"


def _pipe_id(msg: Any) -> int:
    try:
        return int(msg.pipe.id)
    except Exception:
        return -1


def _close_after(reading: threading.RLock, wake: _Wake) -> None:
    """Close ``wake`` once a thread receiving on it has seen the endpoint close and left (this
    thread may be the receiving one, closing from a peer callback: it then sees the close)."""
    if reading.acquire(timeout=2.0):
        try:
            wake.close()
        finally:
            reading.release()


def _remote_host(msg: Any) -> str:
    try:
        return str(msg.pipe.remote_address).rsplit(":", 1)[0]
    except Exception:
        return "?"


class NngDialer:
    """A dialling endpoint: asks the listener's front socket for a Pair0 socket of its own,
    connects to it and runs the handshake; ``peer`` is the session."""

    def __init__(self, transport: NngTransport, address: str, auth: Authenticator) -> None:
        self.address = address
        self._transport = transport
        self._wake = _Wake()
        self._callbacks: list[PeerCallback] = []
        self._closed = False
        self._reading = threading.RLock()
        self._reported = False
        host, port = _host_port(address)
        session, token, pair_port = self._handshake(host, port, auth)
        sock = _new_socket(pynng.Pair0)
        tls = transport._tls_config(server=False)
        if tls is not None:
            sock.tls_config = tls
        sock.recv_max_size = auth.limits.max_frame
        sock.send_timeout = int(SEND_STEP * 1000)
        self._conn = _Conn(sock, self._wake, address)
        try:
            sock.dial(transport.url(host, pair_port), block=True)
            sock.send(token)  # the data connection is the one the handshake made
        except pynng.NNGException as exc:
            self._conn.close()
            raise TransportError(f"fiber-nng cannot connect to {address}: {exc}") from None
        self.peer: Any = session

    def _handshake(self, host: str, port: int, auth: Authenticator) -> tuple[Any, bytes, int]:
        """The core's handshake with the listener, over its front socket: (session, the token of
        the data connection, the port of its Pair0 socket). Greeted again, with pauses, while
        the listener answers BUSY."""
        give_up = time.monotonic() + DIAL_PATIENCE
        pause = 0.05
        while True:
            hs = auth.dialer(label=self.address)
            req = _new_socket(pynng.Req0)
            tls = self._transport._tls_config(server=False)
            if tls is not None:
                req.tls_config = tls
            req.recv_max_size = MAX_HANDSHAKE_FRAME + 32
            req.recv_timeout = int(max(auth.limits.handshake_timeout, 1.0) * 1000)
            req.send_timeout = req.recv_timeout
            try:
                try:
                    req.dial(self._transport.url(host, port), block=True)
                    req.send(_HELLO)
                    hello = bytes(req.recv())
                except pynng.ConnectionRefused:
                    raise TransportError(f"nothing listens at {self.address}") from None
                except pynng.Timeout:  # a listener slow to answer (a flood, a loaded machine): as busy
                    hello = _BUSY
                except pynng.NNGException as exc:
                    raise TransportError(f"fiber-nng cannot reach {self.address}: {exc}") from None
                if hello != _BUSY:
                    try:
                        proof = hs.feed(hello)
                    except Exception as exc:
                        raise AuthenticationError(
                            f"{self.address} answered as no fibercore listener of this session ({exc}): another "
                            "session's, or a manager with another authkey, or not a fibercore endpoint") from None
                    assert proof is not None
                    try:
                        req.send(proof)
                        answer = bytes(req.recv())
                    except pynng.Timeout:
                        # No answer within the listener's own handshake timeout: it has given
                        # this greeting up (and any data socket it made for it), so a new one
                        # is safe. Greeted again, as when busy.
                        answer = _BUSY
                    except pynng.NNGException as exc:
                        raise TransportError(f"the listener at {self.address} went away: {exc}") from None
                    if answer == _BUSY:
                        pass
                    elif answer == _REFUSED or len(answer) <= MAC_SIZE + TOKEN:
                        raise AuthenticationError(
                            f"{self.address} refused this connection: it does not hold the same secret (another "
                            "session's, or a manager with another authkey), or it is closing")
                    else:
                        try:
                            hs.feed(answer[:MAC_SIZE])
                        except Exception as exc:
                            raise AuthenticationError(
                                f"{self.address} did not prove it holds the same secret ({exc}): another "
                                "session's, or a manager with another authkey") from None
                        return hs.session, answer[MAC_SIZE:MAC_SIZE + TOKEN], int(answer[MAC_SIZE + TOKEN:])
            finally:
                req.close()
            if time.monotonic() + pause > give_up:
                raise TransportError(f"the listener at {self.address} stayed busy for {DIAL_PATIENCE:.0f} s")
            time.sleep(pause * random.uniform(0.5, 1.5))
            pause = min(pause * 2, 3.2)

    # -- the endpoint -------------------------------------------------------------------------
    def on_peer_event(self, callback: PeerCallback) -> None:
        self._callbacks.append(callback)

    def _ended(self) -> None:
        self._conn.close()
        if not self._reported:
            self._reported = True
            for callback in list(self._callbacks):
                callback(self.peer, False)

    def recv(self, timeout: float | None = None) -> tuple[bytes | memoryview, Hashable]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._reading:
            while True:
                if self._closed:
                    raise TransportClosed(f"endpoint {self.address} is closed")
                frame = self._conn.recv_now()
                if frame is not None:
                    return frame, self.peer
                if self._conn.gone:
                    self._ended()
                    raise TransportClosed(f"the connection to {self.address} is gone")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
                fd = self._conn.recv_fd()
                step = IDLE_STEP if remaining is None else min(remaining, IDLE_STEP)
                try:
                    _readable([self._wake.r] if fd is None else [fd, self._wake.r], step)
                except (OSError, ValueError):
                    pass
                self._wake.clear()

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        if self._closed:
            raise TransportClosed(f"endpoint {self.address} is closed")
        try:
            _send(self._conn, b"".join(bytes(p) if not isinstance(p, bytes) else p for p in parts), block,
                  lambda: self._conn.gone or self._closed, self.address)
        except TransportClosed:
            if self._conn.gone and not self._closed:
                self._ended()
            raise

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._conn.close()
        self._wake.set()
        _close_after(self._reading, self._wake)

    def __repr__(self) -> str:
        return f"<NngDialer {self.address}>"
