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

import atexit
import hmac
import os
import random
import select
import socket
import struct
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import pynng
import pynng.nng

from fibercore.errors import AuthenticationError, TransportClosed, TransportError, TransportTimeout
from fibercore.transport import MAX_HANDSHAKE_FRAME, make_room, peer_identity

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
#: The listener's first message on a data connection: its token was the one expected.
_OK = b"FIBER-NNG-1 OK"
#: Bytes of the listener's last handshake message (a MAC).
MAC_SIZE = 32
#: Bytes of the token that binds a data connection to the handshake made on the front socket.
TOKEN = 16
#: Seconds between two looks at this process's descriptors for TCP connections nng holds
#: before they are pipes (they name no protocol yet: no pipe callback sees them).
SCAN_STEP = 0.25
#: Descriptors the process may gain between two full looks at its connections.
SCAN_MARGIN = 32
#: Milliseconds before nng redials a dialling socket's lost connection: a day, i.e. never in
#: practice. Each of nng's background redials resolves the address on nng's resolver thread,
#: and a socket closed while that resolution is in flight aborts the whole process (nng 1.11:
#: ``panic: pthread_mutex_lock`` in ``resolv_worker``, nanomsg/nng#2110 and #2209; reproduced
#: by the plugin's ``tests/nng_storm.py``). fiber-nng never relies on a redial: a lost data connection
#: is a lost peer, a lost greeting is greeted again on a new socket (:func:`_ask`).
NO_REDIAL_MS = 86_400_000


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


def _collected(sock: pynng.Socket) -> None:
    """A socket's ``__del__``: closed as pynng closes it, except while the interpreter
    finalizes. Then ``nng_close`` would wait for nng's reaper thread, which a pipe callback
    into the finalizing interpreter may have ended (pynng's exit hook, taken out by
    :func:`_replace_exit_hook`, closed everything before that); the process's end frees it."""
    if not sys.is_finalizing():
        pynng.Socket.__del__(sock)


#: Each pynng socket class, with :func:`_collected` as its ``__del__``.
_kinds: dict[type[pynng.Socket], type[pynng.Socket]] = {}


def _new_socket(kind: type[pynng.Socket], dialling: bool = False) -> pynng.Socket:
    """A pynng socket this process tracks (see :func:`_forked_after_use`); a ``dialling`` one
    never redials in the background (:data:`NO_REDIAL_MS`)."""
    safe = _kinds.get(kind)
    if safe is None:
        safe = _kinds[kind] = type(kind.__name__, (kind,), {"__del__": _collected, "__module__": __name__})
    sock = safe()
    _sockets.add(sock)
    if dialling:
        sock.reconnect_time_min = sock.reconnect_time_max = NO_REDIAL_MS
    return sock


def _numeric(host: str) -> str:
    """``host`` as a numeric address, resolved here once: nng's own lookup of it is then a
    parse, not a name service query that keeps nng's resolver busy while the dial waits."""
    try:
        return str(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][4][0])
    except (OSError, IndexError):
        return host  # nng reports the failure in its own words


def _ask(req: pynng.Socket, payload: bytes, timeout: float, cut: threading.Event, wake: _Wake) -> bytes | None:
    """One request and its reply on a dialled Req0 socket that never redials; None when the
    listener ended the connection first (it makes room by closing its oldest) or did not answer
    within ``timeout`` seconds (a flood, a loaded machine): both mean "greet again later"."""
    req.send(payload)
    deadline = time.monotonic() + timeout
    while True:
        try:
            return bytes(req.recv(block=False))
        except pynng.TryAgain:
            pass
        left = deadline - time.monotonic()
        if cut.is_set() or left <= 0:
            return None
        try:
            _readable([int(req.recv_fd), wake.r], min(left, IDLE_STEP))
        except (OSError, ValueError):
            pass
        wake.clear()


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


def _replace_exit_hook() -> None:
    """Take pynng's exit hook out: it calls ``nng_fini()``, which destroys nng's locks while
    another thread of the program may still be inside nng (a job's heartbeat or sender, the
    master's readers and its exit flush): that thread's next lock aborts the whole process
    (``panic: pthread_mutex_lock: Invalid argument``; a job then dies of SIGABRT after its
    work was done). The operating system frees what nng holds when the process ends; a job
    leaves through ``os._exit`` right after its exit hooks, and the master's own exit hooks
    close the connections that still hold data. Without the hook nothing of nng's is torn
    down under a running call."""
    hook = getattr(pynng.nng, "_pynng_atexit", None)
    if hook is not None:
        atexit.unregister(hook)


_replace_exit_hook()


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
    """One Pair0 socket and what is known of its one connection.

    A listener's data socket (``displace``) keeps the connection that presents its token,
    not the first one: until one has, each new connection replaces the one before (Pair0
    serves one connection at a time, so a stranger connecting first would otherwise hold
    it); once one has, every other is refused. A dialer's (``dialing``) counts the
    connection the listener acknowledged (:data:`_OK`) and notes any that ended before."""

    def __init__(self, sock: pynng.Socket, wake: _Wake, label: str, displace: bool = False,
                 dialing: bool = False) -> None:
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
        #: nng's id of the one connection this socket serves (a listener's: its candidate
        #: until ``proven``; a dialer's: set by :meth:`bind`).
        self.pipe_id: int | None = None
        #: The connection presented the token (listener) or was acknowledged (dialer).
        self.proven = not (displace or dialing)
        #: The listener's candidate connection (``displace``), and how many were replaced.
        self.candidate: Any = None
        self.replaced = 0
        #: A dialer's connections that ended before the listener acknowledged one.
        self.ended_early = 0
        self._dialing = dialing
        self._pipes = threading.Lock()  # pipe_id, candidate, proven: nng's threads and ours
        self._wake = wake
        if displace:
            sock.add_pre_pipe_connect_cb(self._arriving)
        sock.add_post_pipe_connect_cb(self._connected)
        sock.add_post_pipe_remove_cb(self._removed)

    # nng's threads: record, then wake whoever selects
    def _arriving(self, pipe: Any) -> None:
        """A new connection to a listener's data socket, before Pair0 takes it."""
        with self._pipes:
            if self.proven or self.closed:
                old, refuse = None, True
            else:
                old, refuse = self.candidate, False
                self.candidate, self.pipe_id = pipe, pipe.id
                self.replaced += old is not None
        _close_pipe(pipe if refuse else old)

    def _connected(self, pipe: Any) -> None:
        if self.pipe_id is None and not self._dialing:
            self.pipe_id = pipe.id
        self.connected = True
        self._wake.set()

    def _removed(self, pipe: Any) -> None:
        # Pair0 refuses a second connection while the first stays, and nng reports that refused
        # one as removed too: only the removal of this socket's own connection ends it (a
        # stranger dialling a peer's data port would otherwise cut the peer off).
        with self._pipes:
            if pipe.id != self.pipe_id:
                if self._dialing and self.pipe_id is None:
                    self.ended_early += 1
                    self._wake.set()
                return
            if not self.proven:  # the candidate left (or was replaced): wait for the next
                self.candidate = self.pipe_id = None
                self.connected = False
                return
        self.gone = True
        self._wake.set()

    def bind(self, pipe_id: int) -> None:
        """A dialer's: ``pipe_id`` is the connection the listener acknowledged."""
        with self._pipes:
            self.pipe_id, self.proven = pipe_id, True
            alive = any(p.id == pipe_id for p in list(self.sock.pipes))
        if not alive:
            self.gone = True

    def prove(self, pipe_id: int) -> bool:
        """A listener's: the token came on ``pipe_id``; True if it is still the candidate
        (from now on no other connection is taken)."""
        with self._pipes:
            if pipe_id != self.pipe_id or self.closed:
                return False
            self.proven = True
            return True

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
        self._next_look = 0.0
        self._look_above: int | None = None  # descriptors beyond which connections are looked at
        self._raw_since: dict[int, float] = {}  # inode -> when first seen, of connections not yet pipes
        self._raw_seen = False  # such connections were beyond the limits at the last look

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
            self._guard_descriptors(listeners, now)
            # At most SCAN_STEP: a wake-up lost (its descriptor taken by code that closed it twice)
            # costs a new listener that long, never an answer.
            wait = min([max(0.0, d - now) for d in deadlines] + [SCAN_STEP])
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


    def _guard_descriptors(self, listeners: list[NngListener], now: float) -> None:
        """Bound the TCP connections nng holds before they are pipes (a connection that never
        names its protocol stays ~10 s in nng, unseen by any callback): every SCAN_STEP the
        process's descriptors are counted; when they grew by SCAN_MARGIN, or such connections
        were seen last time, each listener's are listed (/proc) and, beyond
        ``max_pending_per_peer`` per peer or ``max_pending`` in all, the oldest are ended
        (renewed at once, the newest stay: an age guard would let a flood keep them all)."""
        if now < self._next_look or not listeners:
            return
        self._next_look = now + (SCAN_STEP / 2.5 if self._raw_seen else SCAN_STEP)
        try:
            count = len(os.listdir("/proc/self/fd"))
        except OSError:
            return
        if self._look_above is None:
            self._look_above = count + SCAN_MARGIN
        if count < self._look_above and not self._raw_seen:
            self._look_above = min(self._look_above, count + SCAN_MARGIN)
            return
        owner: dict[int, NngListener] = {}
        known: set[tuple[int, int]] = set()
        for listener in listeners:
            for port, pipes in listener.ports_and_pipes():
                owner[port] = listener
                known.update(pipes)
        raw: dict[NngListener, list[tuple[float, str, int, int]]] = {}
        since: dict[int, float] = {}
        for lport, rport, inode, host, fd in _tcp_connections(set(owner)):
            if (lport, rport) in known:
                continue
            since[inode] = self._raw_since.get(inode, now)
            raw.setdefault(owner[lport], []).append((since[inode], peer_identity(host), inode, fd))
        self._raw_since = since
        shed = 0
        for listener, conns in raw.items():
            for inode, fd in _beyond_limits(conns, listener._auth.limits):
                _shut(fd, inode)
                self._raw_since.pop(inode, None)
                shed += 1
        self._look_above = count - shed + SCAN_MARGIN
        self._raw_seen = shed > 0 or any(len(conns) > listener._auth.limits.max_pending_per_peer
                                         for listener, conns in raw.items())


def _beyond_limits(conns: list[tuple[float, str, int, int]], limits: Any) -> list[tuple[int, int]]:
    """(inode, descriptor) of the connections to end: all but the newest
    ``max_pending_per_peer`` of each peer and the newest ``max_pending`` in all. A dialer's
    connection is a pipe within a round trip, so it is among the newest; one ended anyway
    (a flood of newer ones) is seen by its dialer as a busy listener: it tries again."""
    out: list[tuple[int, int]] = []
    by_peer: dict[str, list[tuple[float, str, int, int]]] = {}
    for conn in sorted(conns):
        by_peer.setdefault(conn[1], []).append(conn)
    kept: list[tuple[float, str, int, int]] = []
    for group in by_peer.values():
        cut = max(0, len(group) - limits.max_pending_per_peer)
        out += [(conn[2], conn[3]) for conn in group[:cut]]
        kept += group[cut:]
    kept.sort()
    cut = max(0, len(kept) - limits.max_pending)
    out += [(conn[2], conn[3]) for conn in kept[:cut]]
    return out


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
        #: Every connection of the front socket (all unauthenticated: a dialer leaves it once
        #: its handshake is done), oldest first: pipe id -> (pipe, since, peer identity, over
        #: the limits: its greeting is answered BUSY).
        self._front_pipes: dict[int, tuple[Any, float, str, bool]] = {}
        self._inbox: deque[tuple[bytes, Hashable]] = deque()
        self._callbacks: list[PeerCallback] = []
        self._closed = False
        self._reading = threading.RLock()
        self._front = _new_socket(pynng.Rep0)
        tls = transport._tls_config(server=True)
        if tls is not None:
            self._front.tls_config = tls
        self._front.recv_max_size = MAX_HANDSHAKE_FRAME + 32
        self._front.add_pre_pipe_connect_cb(self._front_arriving)
        self._front.add_post_pipe_remove_cb(self._front_removed)
        try:
            listener = self._front.listen(transport.url(bind_host, port))
        except pynng.NNGException as exc:
            self._front.close()
            raise TransportError(f"fiber-nng cannot listen on {bind_host}:{port}: {exc}") from None
        self.port = _port_of(listener)
        _defer_accept(self.port)
        self._front_fd = int(self._front.recv_fd)
        scheme = TLS_SCHEME if transport.tls else SCHEME
        self.address = f"{scheme}{_bracket(advertise_host)}:{self.port}"
        self._accept_wake = _acceptor.add(self)

    def ports_and_pipes(self) -> list[tuple[int, set[tuple[int, int]]]]:
        """Each local port of this listener (front and data sockets) with its connections that
        are pipes, as (local port, remote port): the accept thread's look at descriptors."""
        if self._closed:
            return []
        with self._lock:
            front = [p for p, _, _, _ in self._front_pipes.values()]
            conns = list(self._pending) + list(self._peers.values())
        out = [(self.port, {ports for p in front for ports in [_ports_of(p)] if ports is not None})]
        for conn in conns:
            try:
                port = _port_of(conn.sock.listeners[0])
                pipes = list(conn.sock.pipes)
            except Exception:
                continue
            out.append((port, {ports for p in pipes for ports in [_ports_of(p)] if ports is not None}))
        return out

    # -- nng's threads: the front socket's connections, admitted or shed as they come ---------------
    def _front_arriving(self, pipe: Any) -> None:
        """A new connection to the front socket: it counts as unauthenticated until it leaves.
        At the limits the oldest one (:func:`~fibercore.wire.admission.make_room`) is closed
        to make room; with none old enough to close, the newcomer stays over the limits (its
        greeting is answered BUSY) up to twice ``max_pending``, beyond which it is refused."""
        now = time.monotonic()
        who = peer_identity(_host_of(pipe))
        limits = self._auth.limits
        victim = None
        with self._lock:
            entries: list[tuple[Any, Hashable, float | None]] = [
                (pid, w, since) for pid, (_, since, w, _) in self._front_pipes.items()]
            entries += [(conn, w, None) for conn, (_, _, w) in self._pending.items()]
            room, key = make_room(entries, who, limits, now)
            refuse = self._closed or (not room and len(self._front_pipes) >= 2 * limits.max_pending)
            if isinstance(key, int):
                victim = self._front_pipes.pop(key)[0]
                self._greeted.pop(key, None)
            if not refuse:
                self._front_pipes[pipe.id] = (pipe, now, who, not room)
        _close_pipe(victim)
        if refuse:
            _close_pipe(pipe)

    def _front_removed(self, pipe: Any) -> None:
        with self._lock:
            self._front_pipes.pop(pipe.id, None)
            self._greeted.pop(pipe.id, None)

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
        timeout = self._auth.limits.handshake_timeout
        with self._lock:
            return [since + timeout for _, since, _, _ in self._front_pipes.values()] + [
                d for _, d, _ in self._pending.values()]

    def accept_step(self, ready: set[int]) -> None:
        """What the accept thread does for this listener after each wake-up."""
        if self._closed:
            return
        now = time.monotonic()
        late = now - self._auth.limits.handshake_timeout
        with self._lock:  # a front connection that did not prove itself in time is closed
            expired = [k for k, (_, since, _, _) in self._front_pipes.items() if since < late]
            stale = [self._front_pipes.pop(k)[0] for k in expired]
            for pipe_id in expired:
                self._greeted.pop(pipe_id, None)
            pending = list(self._pending.items())
        for pipe in stale:
            _close_pipe(pipe)
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
        data, host, pipe_id = bytes(msg.bytes), _remote_host(msg), _pipe_id(msg)
        who = peer_identity(host)
        reply = _BUSY
        with self._lock:
            state = self._greeted.pop(pipe_id, None)
        if data == _HELLO:
            limits = self._auth.limits
            with self._lock:
                entry = self._front_pipes.get(pipe_id)
                room = entry is not None and not entry[3] and len(self._peers) < limits.max_peers
                if room:
                    hs = self._auth.listener(label=f"{self.address} <- {host}")
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
        conn = _Conn(sock, self._accept_wake, f"{self.address} <- {who}", displace=True)
        conn.session = session
        try:
            sock.listen(self._transport.url(self._bind, 0))
        except pynng.NNGException:
            conn.close()
            return None
        _defer_accept(_port_of(sock.listeners[0]))
        with self._lock:
            self._pending[conn] = (token, time.monotonic() + self._auth.limits.handshake_timeout, who)
        return conn

    def _check_token(self, conn: _Conn, token: bytes, deadline: float, who: str) -> None:
        """A data connection counts once its first frame is the token its handshake gave, from
        the peer (:func:`~fibercore.wire.admission.peer_identity`) that made the handshake: it
        is acknowledged (:data:`_OK`) and no other connection is taken from then on. A
        connection that sends anything else is closed, and the socket waits for the next;
        frames of connections replaced meanwhile are dropped unread."""
        if conn.closed or time.monotonic() > deadline:
            self._give_up(conn)
            return
        while True:
            try:
                with conn.lock:
                    if conn.closed:
                        raise pynng.Closed(-1, "closed")
                    msg = conn.sock.recv_msg(block=False)
            except pynng.TryAgain:
                return
            except pynng.NNGException:
                self._give_up(conn)
                return
            pipe_id = _pipe_id(msg)
            if pipe_id != conn.pipe_id:
                continue  # from a connection replaced since: nothing it sent is read
            if (hmac.compare_digest(bytes(msg.bytes), token) and peer_identity(_remote_host(msg)) == who
                    and conn.prove(pipe_id)):
                try:
                    with conn.lock:
                        conn.sock.send(_OK)  # first, before any frame the core sends on it
                except pynng.NNGException:
                    self._give_up(conn)
                    return
                self._admit(conn, conn.session)
                return
            try:
                _close_pipe(msg.pipe)  # a stranger that spoke: the next connection may be the peer
            except Exception:
                pass

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


def _close_pipe(pipe: Any) -> None:
    if pipe is None:
        return
    try:
        pipe.close()
    except Exception:  # already gone
        pass


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
        return _host_of(msg.pipe)
    except Exception:
        return "?"


def _host_of(pipe: Any) -> str:
    try:
        return str(pipe.remote_address).rsplit(":", 1)[0]
    except Exception:
        return "?"


def _ports_of(pipe: Any) -> tuple[int, int] | None:
    """(local port, remote port) of a pipe's TCP connection."""
    try:
        return int(str(pipe.local_address).rsplit(":", 1)[1]), int(str(pipe.remote_address).rsplit(":", 1)[1])
    except Exception:
        return None


def _socket_descriptors() -> dict[int, int]:
    """This process's sockets: inode -> descriptor (from /proc/self/fd; empty elsewhere)."""
    found: dict[int, int] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if link.startswith("socket:["):
            found[int(link[8:-1])] = int(name)
    return found


def _tcp_table() -> list[tuple[list[str], int]]:
    """The rows of /proc/self/net/tcp and tcp6 (fields split) with their address size."""
    rows = []
    for table, size in (("/proc/self/net/tcp", 4), ("/proc/self/net/tcp6", 16)):
        try:
            with open(table) as f:
                lines = f.read().splitlines()[1:]
        except OSError:
            continue
        rows += [(fields, size) for fields in map(str.split, lines) if len(fields) >= 10]
    return rows


def _tcp_connections(ports: set[int]) -> list[tuple[int, int, int, str, int]]:
    """This process's established TCP connections whose local port is in ``ports``:
    (local port, remote port, remote host, inode, descriptor), from /proc (Linux; elsewhere none)."""
    inodes = _socket_descriptors()
    found = []
    for fields, size in _tcp_table():
        if fields[3] != "01":
            continue
        local, remote, inode = fields[1], fields[2], int(fields[9])
        lport = int(local.rsplit(":", 1)[1], 16)
        if lport not in ports or inode not in inodes:
            continue
        raw, rport = remote.rsplit(":", 1)
        words = bytes.fromhex(raw)
        packed = b"".join(struct.pack("<I", struct.unpack(">I", words[k:k + 4])[0]) for k in range(0, size, 4))
        host = socket.inet_ntop(socket.AF_INET if size == 4 else socket.AF_INET6, packed)
        found.append((lport, int(rport, 16), inode, host, inodes[inode]))
    return found


#: Seconds the kernel keeps a connection that sent nothing before nng may accept it.
DEFER_ACCEPT = 2


def _defer_accept(port: int) -> None:
    """Set TCP_DEFER_ACCEPT on this process's socket listening on ``port`` (nng's, found in
    /proc): a connection that sends nothing waits in the kernel, costing no descriptor here
    (a dialer names its protocol at once, so it is accepted as before). Linux only."""
    option = getattr(socket, "TCP_DEFER_ACCEPT", None)
    if option is None:
        return
    wanted = {int(fields[9]) for fields, _size in _tcp_table()
              if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port}
    if not wanted:
        return
    for inode, fd in _socket_descriptors().items():
        if inode not in wanted:
            continue
        try:
            dup = os.dup(fd)
        except OSError:
            continue
        sock = socket.socket(fileno=dup)
        try:
            if os.fstat(dup).st_ino in wanted:
                sock.setsockopt(socket.IPPROTO_TCP, option, DEFER_ACCEPT)
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate only


def _shut(fd: int, inode: int) -> None:
    """End the TCP connection behind descriptor ``fd`` if it still is socket ``inode`` (nng's
    own: nng sees it end and closes it; this never closes nng's descriptor itself)."""
    try:
        dup = os.dup(fd)
    except OSError:
        return
    try:
        if os.fstat(dup).st_ino != inode:
            return
        sock = socket.socket(fileno=dup)
        dup = -1
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.close()  # the duplicate only
    finally:
        if dup >= 0:
            os.close(dup)


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
        if transport.tls is None or transport.tls.get("server_name"):
            host = _numeric(host)  # (with TLS and no server name, nng checks the name in the URL)
        give_up = time.monotonic() + DIAL_PATIENCE
        lost = 0
        while True:
            session, token, pair_port = self._handshake(host, port, auth, give_up)
            conn = self._data_connection(host, pair_port, token, auth)
            if conn is not None:
                break
            lost += 1  # another connection took its place first: a new handshake, a new port
            if time.monotonic() > give_up:
                raise TransportError(
                    f"fiber-nng could not keep a data connection to {address}: {lost} times in "
                    f"{DIAL_PATIENCE:.0f} s another connection to its port replaced it before the listener "
                    "acknowledged it (another process connects to this listener's ports)")
        self._conn = conn
        self.peer: Any = session

    def _data_connection(self, host: str, pair_port: int, token: bytes, auth: Authenticator) -> _Conn | None:
        """The Pair0 connection the handshake gave: connected, its token sent, and acknowledged
        by the listener (:data:`_OK`); None if the connection ended (replaced by another on
        the listener's side) or went unacknowledged within the handshake timeout."""
        sock = _new_socket(pynng.Pair0, dialling=True)
        tls = self._transport._tls_config(server=False)
        if tls is not None:
            sock.tls_config = tls
        sock.recv_max_size = auth.limits.max_frame
        sock.send_timeout = int(SEND_STEP * 1000)
        conn = _Conn(sock, self._wake, self.address, dialing=True)
        try:
            sock.dial(self._transport.url(host, pair_port), block=True)
            sock.send(token)  # the data connection is the one the handshake made
        except pynng.Timeout:
            conn.close()
            return None
        except pynng.NNGException as exc:
            conn.close()
            raise TransportError(f"fiber-nng cannot connect to {self.address}: {exc}") from None
        deadline = time.monotonic() + max(auth.limits.handshake_timeout, 1.0)
        while not conn.ended_early:
            try:
                msg = sock.recv_msg(block=False)
            except pynng.TryAgain:
                msg = None
            except pynng.NNGException:
                break
            if msg is not None:
                if bytes(msg.bytes) != _OK:
                    break
                conn.bind(_pipe_id(msg))
                if conn.gone:
                    break
                return conn
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                _readable([int(sock.recv_fd), self._wake.r], min(left, IDLE_STEP))
            except (OSError, ValueError, pynng.NNGException):
                pass
            self._wake.clear()
        conn.close()
        return None

    def _handshake(self, host: str, port: int, auth: Authenticator, give_up: float) -> tuple[Any, bytes, int]:
        """The core's handshake with the listener, over its front socket: (session, the token of
        the data connection, the port of its Pair0 socket). Greeted again, with pauses, while
        the listener answers BUSY."""
        pause = 0.05
        wait = max(auth.limits.handshake_timeout, 1.0)
        while True:
            hs = auth.dialer(label=self.address)
            req = _new_socket(pynng.Req0, dialling=True)
            tls = self._transport._tls_config(server=False)
            if tls is not None:
                req.tls_config = tls
            req.recv_max_size = MAX_HANDSHAKE_FRAME + 32
            req.send_timeout = int(wait * 1000)
            cut = threading.Event()

            def _cut(_pipe: Any, cut: threading.Event = cut) -> None:
                cut.set()
                self._wake.set()

            req.add_post_pipe_remove_cb(_cut)
            try:
                try:
                    req.dial(self._transport.url(host, port), block=True)
                    hello = _ask(req, _HELLO, wait, cut, self._wake)
                except pynng.ConnectionRefused:
                    raise TransportError(f"nothing listens at {self.address}") from None
                except (pynng.Timeout, pynng.ConnectionReset, pynng.ConnectionAborted, pynng.Closed):
                    hello = None
                except pynng.NNGException as exc:
                    raise TransportError(f"fiber-nng cannot reach {self.address}: {exc}") from None
                # None: a listener slow to answer (a flood, a loaded machine), or that ended this
                # connection before its greeting (it makes room by closing its oldest): as busy.
                if hello is not None and hello != _BUSY:
                    try:
                        proof = hs.feed(hello)
                    except Exception as exc:
                        raise AuthenticationError(
                            f"{self.address} answered as no fibercore listener of this session ({exc}): another "
                            "session's, or a manager with another authkey, or not a fibercore endpoint") from None
                    assert proof is not None
                    try:
                        # Unanswered within the listener's own handshake timeout (or cut): it has
                        # given this greeting up (and any data socket it made for it), so a new
                        # one is safe. Greeted again, as when busy.
                        answer = _ask(req, proof, wait, cut, self._wake)
                    except pynng.Timeout:
                        answer = None
                    except pynng.NNGException as exc:
                        raise TransportError(f"the listener at {self.address} went away: {exc}") from None
                    if answer is None or answer == _BUSY:
                        pass
                    elif answer == _REFUSED or len(answer) <= MAC_SIZE + TOKEN:
                        raise AuthenticationError(
                            f"{self.address} refused this connection: it does not hold the same secret (another "
                            "session's, or a manager with another authkey), its network_encryption setting "
                            "differs, or it is closing")
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
