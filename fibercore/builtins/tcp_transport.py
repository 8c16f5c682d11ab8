"""Built-in transport: TCP streams (or TLS over TCP with one config switch), stdlib only.

One TCP connection per peer, frames as length-prefixed records on the stream::

    record = u32 LE header (bits 0-30: length, bit 31: more records follow) || bytes
    frame  = the bytes of one or more records, the last without the "more" bit

A frame is at most :data:`RECORD_MAX` bytes per record, so memory grows only with
bytes that actually arrived, never with a claimed length. Before its connection has
authenticated (:mod:`fibercore.wire.handshake`) a peer may send only records of
``MAX_HANDSHAKE_FRAME`` bytes; a connection that has not authenticated within
``Limits.handshake_timeout`` is closed; each listener holds at most
``Limits.max_pending`` unauthenticated connections, ``Limits.max_pending_per_peer`` of
them from one uid (Unix) or address (TCP; all of loopback is one), and
``Limits.max_peers`` authenticated ones. At a limit the oldest unauthenticated TCP
connection goes (:mod:`fibercore.wire.admission`), never one younger than a second: a
handshake in progress is not cut, the newcomer is refused then and its dialer retries.

Addresses are ``tcp://host:port[/machine]`` (``tls+tcp://`` with TLS); ``machine`` says
the listener also answers on a Unix socket named after its identity, on the machine
(and network namespace) with that :func:`~fibercore.util.machine_identity`.

Threads: one reactor thread per process accepts and authenticates the connections
of every listening endpoint. An authenticated connection is then read by the thread
waiting in the listener's ``recv`` (one at a time, through the listener's own
selector), so a frame reaches the thread that handles it with no hand-off between
threads. A dialling endpoint has no thread: ``recv`` reads its socket on the
caller's thread, and ``send`` writes on the caller's thread. Why not nng: a
round trip over pynng's Pair0 measured 176 µs against 23 µs for a
multiprocessing Pipe and 22 µs for a Python TCP socket (README, Benchmarks).
"""

from __future__ import annotations

import collections
import errno
import functools
import itertools
import os
import random
import select
import selectors
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from fibercore.errors import (
    AuthenticationError,
    ConfigError,
    TransportClosed,
    TransportError,
    TransportTimeout,
)
from fibercore.hookspecs import hookimpl
from fibercore.transport import PeerCallback
from fibercore.util import machine_identity
from fibercore.wire.admission import make_room, peer_identity
from fibercore.wire.frames import reject
from fibercore.wire.handshake import (
    MAX_HANDSHAKE_FRAME,
    Authenticator,
    Handshake,
    HandshakeFailed,
    Session,
)

#: Also listen on an abstract Unix socket named after the listener's identity, for peers of
#: the same user in this network namespace (Linux only; never with TLS).
LOCAL_SOCKETS = sys.platform.startswith("linux")
#: Bytes a Unix connection may queue towards its reader (the kernel caps it at net.core.wmem_max).
UNIX_SEND_BUFFER = 4 << 20
#: Seconds a non-blocking write that got part of a frame out waits for room for the rest
#: before it gives the peer up (the stream cannot carry another frame before this one ends).
PARTIAL_WAIT = 5.0
#: Longest a reading thread polls before it looks again at what changed (closed, handed over).
READ_STEP = 0.05
#: Longest a waiting read sleeps before it looks again (closing an endpoint, and every change
#: a reader must see, wake it at once): an idle process does not wake up.
IDLE_STEP = 30.0
#: A listener's reading thread polls before sleeping only this soon after its last frame
#: (an idle endpoint sleeps at once instead of spinning every READ_STEP).
SPIN_AFTER = 0.05
#: Largest record on the stream; bigger frames are sent as several records.
RECORD_MAX = 4 << 20
_MORE = 1 << 31
_HEADER = struct.Struct("<I")
_SCRATCH = 64 << 10  # read buffer of an authenticated connection (before: a handshake frame's size)
_IOV_MAX = 512
_WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_readv, _writev = os.readv, os.writev
#: Seconds a waiting read polls the socket before it sleeps in the kernel (config ``spin_wait``,
#: in microseconds), when a CPU is free for it (:func:`cpu_to_spare`). Off by default: in the
#: usual RL set-up (more simulators than cores) the gate let a master poll while the processes
#: it waited for needed the CPUs, and polling cost 15-18% of the steps (docs/performance.md).
DEFAULT_SPIN = 0.0
#: How long a TCP peer may be silent before its connection is closed, by default (each
#: transport takes the configuration's ``heartbeat_timeout``): a peer whose machine is lost
#: or cut off (no FIN ever comes) is noticed then, so its locks are released, its pool tasks
#: rerun and a Pipe waiting on it raises instead of hanging. A process that dies is noticed
#: at once: its kernel closes the socket.
DEFAULT_SILENCE = 20.0
#: Seconds between two looks at how many tasks this machine runs (:func:`cpu_to_spare`).
LOAD_LOOK_EVERY = 0.005
_TIMEVAL = struct.Struct("@ll")


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return os.cpu_count() or 1


_CPUS = _usable_cpus()
_load_look: list[Any] = [0.0, False]  # when this process last looked, and what it saw


class SpinGate:
    """Whether one reader's next wait may poll: only with a CPU to spare (:func:`cpu_to_spare`)
    and while polls pay off. A poll that ran out before the data came skips the next 1, 2,
    4 ... 64 chances to poll (a reader that waits long, as a simulator waits for its next
    action behind seven others, stops polling); one that caught its data opens the gate again."""

    __slots__ = ("_skip", "_backoff")

    def __init__(self) -> None:
        self._skip = 0
        self._backoff = 0

    def open(self) -> bool:
        if self._skip:
            self._skip -= 1
            return False
        return cpu_to_spare()

    def result(self, caught: bool) -> None:
        if caught:
            self._backoff = 0
        else:
            self._backoff = min(64, 2 * self._backoff or 1)
            self._skip = self._backoff


def cpu_to_spare() -> bool:
    """Whether a waiting read may poll for a while: no more tasks runnable on this machine
    than it has CPUs, so polling takes a CPU nobody else wants.

    When processes outnumber cores (several simulators per core, the usual RL set-up),
    the process being waited for needs the CPU a poller would hold: there a poll halved a
    stepped simulator's throughput, while on an idle CPU it saves the wake-up of a sleeping
    reader (a 1:1 round trip in about half the time). Read from ``/proc/loadavg``'s
    running count at most every :data:`LOAD_LOOK_EVERY` seconds; without it, never poll.
    """
    now = time.perf_counter()
    look = _load_look
    if now - look[0] < LOAD_LOOK_EVERY:
        return look[1]
    try:
        with open("/proc/loadavg", "rb") as fh:
            running = int(fh.read().split()[3].split(b"/")[0])
    except (OSError, ValueError, IndexError):
        running = _CPUS + 1
    look[0], look[1] = now, running <= _CPUS
    return look[1]


class _Broken(Exception):
    """The connection ended or broke its limits: close it."""


class _Gone(_Broken):
    """The peer closed or reset the connection (not a broken limit)."""


def _byte_view(part: Any) -> memoryview:
    view = part if isinstance(part, memoryview) else memoryview(part)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _after(iov: list[Any], n: int) -> list[Any]:
    """What is left of ``iov`` once its first ``n`` bytes went out, as non-empty byte views."""
    rest = []
    for part in iov:
        view = _byte_view(part)
        if n >= view.nbytes:
            n -= view.nbytes
            continue
        rest.append(view[n:])
        n = 0
    return rest


def _split_address(address: str) -> tuple[str, str, int, str]:
    """``scheme://host:port[/machine]``: scheme, host, port and the machine tag (or "")."""
    scheme, _, rest = address.partition("://")
    where, _, machine = rest.partition("/")
    host, _, port = where.rpartition(":")
    if scheme not in ("tcp", "tls+tcp") or not host or not port.isdigit():
        raise TransportError(f"not a tcp:// or tls+tcp:// address: {address!r}")
    return scheme, host.strip("[]"), int(port), machine


def _format_address(scheme: str, host: str, port: int, machine: str = "") -> str:
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return f"{scheme}://{where}/{machine}" if machine else f"{scheme}://{where}"


class _Conn:
    """One connection: record framing in both directions, and its handshake state."""

    def __init__(self, sock: socket.socket, hs: Handshake, label: str, spin: float = DEFAULT_SPIN) -> None:
        self.sock = sock
        self.spin = spin
        self.spin_gate = SpinGate()
        self.tls = isinstance(sock, ssl.SSLSocket)
        self._rcvtimeo: float | None = -1.0  # SO_RCVTIMEO last set (-1: never)
        self.hs = hs
        self.session: Session | None = None
        self.label = label
        self.who: Hashable = None  # the peer identity whose pending budget it uses (listeners)
        self.opened = time.monotonic()
        self.send_lock = threading.Lock()
        self.max_frame = MAX_HANDSHAKE_FRAME
        self.max_record = MAX_HANDSHAKE_FRAME
        self._max_one = MAX_HANDSHAKE_FRAME  # the largest one-record frame: both limits hold
        self._scratch = bytearray(MAX_HANDSHAKE_FRAME + 4)  # grown once authenticated
        self.fd = sock.fileno()
        self._header = bytearray(4)
        self._hpos = 0
        self._body: bytearray | None = None
        self._bpos = 0
        self._more = False
        self._records: list[bytearray] = []
        self._size = 0

    # -- writing ----------------------------------------------------------------------------
    def write(self, parts: list[Any], block: bool = True, deadline: float | None = None) -> None:
        """Write one frame (the parts back to back) as records; all or, with block=False, nothing
        (once part of it is out, the rest within :data:`PARTIAL_WAIT`, or the connection breaks)."""
        total = 0
        for part in parts:  # frames.nbytes, inlined: this is every message's path
            total += part.nbytes if type(part) is memoryview else len(part)
        if total <= RECORD_MAX:
            iov: list[Any] = [_HEADER.pack(total), *parts]
            if block and deadline is None and not self.tls and len(iov) <= _IOV_MAX:
                # The usual case, one call: a frame that fits the socket's buffer (os.writev:
                # the same write as sendmsg, for less Python).
                try:
                    n = _writev(self.fd, iov)
                except _WOULD_BLOCK:
                    n = 0
                except OSError as exc:
                    raise _Gone(str(exc)) from None
                if n == total + 4:
                    return
                iov = _after(iov, n)
            else:
                iov = [iov[0], *(v for v in map(_byte_view, parts) if v.nbytes)]
            self._write_all(iov, block, deadline)  # byte views only, none empty (a send of 0 bytes loops)
            return
        views = [v for v in map(_byte_view, parts) if len(v)]
        iov = []
        left = total
        room = 0
        for view in views:
            while view:
                if room == 0:
                    room = min(left, RECORD_MAX)
                    left -= room
                    iov.append(_HEADER.pack(room | (_MORE if left else 0)))
                take = min(room, len(view))
                iov.append(view[:take])
                view = view[take:]
                room -= take
        self._write_all(iov, block, deadline)

    def _write_all(self, iov: list[Any], block: bool, deadline: float | None) -> None:
        sent_any = False
        started = not block and deadline is None  # a non-blocking write that got a part out ...
        while iov:
            try:
                if self.tls:
                    chunk = b"".join(iov[:_IOV_MAX])
                    n = self.sock.send(chunk)
                else:  # a plain socket is in blocking mode: MSG_DONTWAIT when we must not wait
                    n = self.sock.sendmsg(iov[:_IOV_MAX], [], 0 if block and deadline is None else _DONTWAIT)
            except _WOULD_BLOCK:
                if not block and not sent_any:
                    raise TransportTimeout(f"{self.label} cannot take a frame now") from None
                if started and deadline is None:  # ... finishes it within PARTIAL_WAIT, or the peer is stuck
                    deadline = time.monotonic() + PARTIAL_WAIT
                try:
                    self._wait(select.POLLOUT, deadline)
                except TransportTimeout:
                    if not sent_any:
                        raise
                    raise _Broken(f"the peer stopped reading in the middle of a frame for {PARTIAL_WAIT:.0f} "
                                  "s") from None
                continue
            except OSError as exc:
                raise _Gone(str(exc)) from None
            sent_any = True
            while n:
                first = iov[0]
                size = len(first)
                if n >= size:
                    n -= size
                    iov.pop(0)
                else:
                    iov[0] = memoryview(first)[n:]
                    n = 0

    def _wait(self, events: int, deadline: float | None) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), events)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if remaining is not None and remaining <= 0:
            raise TransportTimeout(f"{self.label}: timed out")
        ready = poller.poll(None if remaining is None else remaining * 1000)
        for _, ev in ready:
            if ev & (select.POLLERR | select.POLLNVAL):
                raise _Broken("connection failed")

    # -- reading ----------------------------------------------------------------------------
    def pump(self, deliver: Callable[[memoryview], None], wait: bool = False) -> None:
        """Read what the socket has and ``deliver`` each complete frame.

        ``wait``: the first read blocks in the kernel up to the socket's receive timeout
        (:meth:`receive_timeout`; a plain socket only) — no poll(), which costs a
        multiple of a blocking read's wake-up on virtual machines. Raises _Broken at EOF
        or when the peer breaks the limits; BlockingIOError-like errors mean "nothing
        (more) now".
        """
        while True:
            body = self._body
            if body is not None and len(body) - self._bpos >= len(self._scratch):
                n = self._recv_into(memoryview(body)[self._bpos:], wait)
                wait = False
                self._bpos += n
                if self._bpos == len(body):
                    self._end_record(deliver)
                continue
            n = self._recv_into(memoryview(self._scratch), wait)
            wait = False
            self._parse(memoryview(self._scratch)[:n], deliver)
            if n < len(self._scratch) and not (self.tls and self.sock.pending()):  # type: ignore[attr-defined]
                return

    @property
    def idle(self) -> bool:
        """Between frames (no record begun), authenticated, on a plain socket."""
        return (self._body is None and self._hpos == 0 and not self._records and not self.tls
                and self.session is not None)

    def read_one(self, deliver: Callable[[memoryview], None], wait: bool = True) -> memoryview | None:
        """One read (``wait``: a waiting one, or one of a socket seen readable): the frame,
        when it brought exactly one whole one-record frame; otherwise None, with what it
        brought parsed (whole frames to ``deliver``). The connection must be :attr:`idle`.
        Raises what :meth:`pump` raises."""
        scratch = self._scratch
        n = self._recv_into(scratch, wait)
        if n > 4:  # _whole_record, inlined: every step of a simulator comes here
            (word,) = _HEADER.unpack_from(scratch)  # the "more" bit set: over any max_record
            if word + 4 == n and word <= self._max_one:
                return memoryview(scratch[4:n])  # a copy: the scratch buffer is read into again
        view = memoryview(scratch)[:n]
        self._parse(view, deliver)
        if n == len(scratch):  # more may wait behind
            try:
                self.pump(deliver)
            except _WOULD_BLOCK:
                pass
        return None

    def wait_at_most(self, seconds: float | None) -> None:
        """Let a waiting read block up to ``seconds`` (None: until data or EOF), at most
        :data:`IDLE_STEP`; a receive timeout already set within half of that (or a hair
        over) is kept, so waits of similar lengths cost no setsockopt() each."""
        if seconds is None:
            self.receive_timeout(None)
            return
        target = min(seconds, IDLE_STEP)
        current = self._rcvtimeo
        if current is not None and current > 0 and target * 0.5 <= current <= target * 1.001:
            return
        self.receive_timeout(target)

    def receive_timeout(self, seconds: float | None) -> None:
        """How long a waiting read blocks (None: until data or EOF); a plain socket only."""
        if seconds is not None:
            seconds = max(0.001, seconds)  # 0 would mean "forever"
        if seconds == self._rcvtimeo:
            return
        whole = 0 if seconds is None else int(seconds)
        micros = 0 if seconds is None else int((seconds - whole) * 1e6)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL.pack(whole, micros))
        self._rcvtimeo = seconds

    def _recv_into(self, view: memoryview | bytearray, wait: bool = False) -> int:
        try:
            if self.tls:
                n = self.sock.recv_into(view)
            elif wait and self.spin > 0 and self.spin_gate.open():
                n = self._spin_then_wait(view)
            elif wait:  # os.readv: the same read as recv_into, for half its cost in Python
                n = _readv(self.fd, [view])
            else:
                n = self.sock.recv_into(view, 0, _DONTWAIT)
        except _WOULD_BLOCK:
            raise
        except OSError as exc:
            raise _Gone(str(exc)) from None
        if n == 0:
            raise _Gone("closed by the peer")
        return n

    def _spin_then_wait(self, view: memoryview | bytearray) -> int:
        """A waiting read: poll for ``spin`` seconds, then block in the kernel.

        A reply often comes within tens of microseconds; a thread that sleeps for it
        pays the wake-up of an idle CPU (on virtual machines, a hypervisor exit costing
        more than the reply's own work), and so does the sender, whose write must wake
        it. Polling briefly first keeps both sides on the fast path; a longer wait costs
        at most ``spin`` seconds of one core.
        """
        end = time.perf_counter() + self.spin
        recv_into = self.sock.recv_into
        while True:
            try:
                n = recv_into(view, 0, _DONTWAIT)
                self.spin_gate.result(True)
                return n
            except _WOULD_BLOCK:
                if time.perf_counter() > end:
                    self.spin_gate.result(False)
                    return recv_into(view, 0, 0)

    def _parse(self, view: memoryview, deliver: Callable[[memoryview], None]) -> None:
        while view:
            if self._body is None and self._hpos == 0 and not self._records:
                end = self._whole_record(view)
                if end:  # the usual case: a whole one-record frame in what was read (one copy)
                    frame = bytearray(view[4:end])
                    view = view[end:]
                    deliver(memoryview(frame))
                    continue
            if self._body is None:
                take = min(4 - self._hpos, len(view))
                self._header[self._hpos:self._hpos + take] = view[:take]
                self._hpos += take
                view = view[take:]
                if self._hpos < 4:
                    return
                self._hpos = 0
                (word,) = _HEADER.unpack(self._header)
                length, self._more = word & ~_MORE, bool(word & _MORE)
                if length > self.max_record or (self._more and self.session is None):
                    raise _Broken(f"a record of {length} bytes is over the limit ({self.max_record})")
                if self._size + length > self.max_frame:
                    raise _Broken(f"a frame of over {self.max_frame} bytes is over the limit")
                self._body = bytearray(length)
                self._bpos = 0
                if length == 0:
                    self._end_record(deliver)
                continue
            take = min(len(self._body) - self._bpos, len(view))
            self._body[self._bpos:self._bpos + take] = view[:take]
            self._bpos += take
            view = view[take:]
            if self._bpos == len(self._body):
                self._end_record(deliver)

    def _whole_record(self, view: memoryview) -> int:
        """Where a one-record frame that ``view`` begins with ends, when it is all there and
        within the limits; 0 otherwise (then the record is parsed piece by piece)."""
        if len(view) < 4:
            return 0
        (word,) = _HEADER.unpack_from(view)  # the "more" bit set: over any max_record
        if word > self.max_record or word > self.max_frame or len(view) < 4 + word:
            return 0
        return 4 + word

    def _end_record(self, deliver: Callable[[memoryview], None]) -> None:
        body, self._body = self._body, None
        assert body is not None
        self._size += len(body)
        self._records.append(body)
        if self._more:
            return
        records, self._records, self._size = self._records, [], 0
        frame = records[0] if len(records) == 1 else bytearray().join(records)
        deliver(memoryview(frame))

    def authenticated(self, session: Session, max_frame: int) -> None:
        self.session = session
        self._scratch = bytearray(_SCRATCH)
        self.max_record = RECORD_MAX
        self.max_frame = max_frame
        self._max_one = min(RECORD_MAX, max_frame)

    def close(self, shutdown: bool = True) -> None:
        try:
            if shutdown:
                self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class _Looker:
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
        if self._data.pop(fd, _Looker) is not _Looker:
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


class _TcpLine:
    """:class:`fibercore.transport.LineEndpoint`: one authenticated plain connection's frames,
    written and read on the caller's thread with no look-up per call (a connected Pipe end's
    every message). ``read`` is the endpoint's ``recv_frame`` for this connection."""

    __slots__ = ("_conn", "_broken", "read")

    def __init__(self, conn: _Conn, broken: Callable[[_Conn, str], TransportClosed],
                 read: Callable[..., memoryview | None]) -> None:
        self._conn = conn
        #: What the endpoint does with a connection that broke, and the error to raise.
        self._broken = broken
        self.read = read

    def write(self, parts: list[Any], peer: Hashable = None, block: bool = True) -> None:
        """The endpoint's ``send_parts`` to this connection, without its send lock: the
        caller holds the peer's session lock, as the core does for every frame it sends."""
        try:
            self._conn.write(parts, block)
        except _Broken as exc:
            raise self._broken(self._conn, str(exc)) from None


# ---------------------------------------------------------------------------------------
# Listening: one reactor thread per process
# ---------------------------------------------------------------------------------------


class _Reactor:
    """Accepts, authenticates and reads every listener's connections in one thread."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self._todo: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.listeners: set[TcpListener] = set()
        self.thread = threading.Thread(target=self._run, name="fiber-reactor", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the reactor thread (selector changes happen only there)."""
        self._todo.append(fn)
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def _next_expiry(self) -> float | None:
        """Seconds until a pending handshake times out (None: none pending, sleep until woken)."""
        now = time.monotonic()
        soonest = None
        for listener in list(self.listeners):
            for conn in list(listener._pending):
                left = conn.opened + listener._limits.handshake_timeout - now
                soonest = left if soonest is None else min(soonest, left)
        return None if soonest is None else max(0.01, soonest + 0.01)

    def _run(self) -> None:
        while True:
            try:
                events = self.sel.select(self._next_expiry())
            except OSError:  # pragma: no cover - a descriptor closed under us
                events = []
            for key, _mask in events:
                if key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                try:
                    key.data()
                except Exception as exc:  # pragma: no cover - a handler bug must not stop the reactor
                    reject("reactor", key.data, f"internal error: {exc!r}", "reactor_errors")
            while self._todo:
                fn = self._todo.popleft()
                try:
                    fn()
                except Exception as exc:  # pragma: no cover
                    reject("reactor", fn, f"internal error: {exc!r}", "reactor_errors")
            now = time.monotonic()
            for listener in list(self.listeners):
                listener.expire(now)


_reactor: _Reactor | None = None
_reactor_lock = threading.Lock()


def _get_reactor() -> _Reactor:
    global _reactor
    if _reactor is None:
        with _reactor_lock:
            if _reactor is None:
                _reactor = _Reactor()
    return _reactor


class TcpListener:
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
        self._pending: dict[_Conn, None] = {}  # unauthenticated, oldest first
        self._pending_by: collections.Counter[Hashable] = collections.Counter()  # per peer identity
        self._peers: dict[Session, _Conn] = {}
        self._inbox: collections.deque[tuple[memoryview, Session]] = collections.deque()
        self._lock = threading.Lock()  # ``with self._lock`` where nothing waits: a C call
        self._cv = threading.Condition(self._lock)
        self._waiters = 0  # threads in self._cv.wait (notify only when one is there)
        self._woken = False  # wake() was called: the waiting recv raises TransportTimeout
        self._callbacks: list[PeerCallback] = []
        self._closed = False
        # Authenticated connections are read by the thread waiting in recv (one at a time:
        # ``_reading``), through this listener's own selector; other threads change that
        # selector only through ``_todo``, applied by the reader, and wake it with ``_wake``.
        self._own = _Looker()
        self._last_frame = 0.0  # when a frame last arrived (a listener spins only while busy)
        self._reading = threading.Lock()
        #: recv_frame's connection, its poll, descriptor, what takes frames it reads past, and peer
        self._lane: tuple[_Conn, Callable[..., list[tuple[int, int]]], int, Callable[[memoryview], None],
                          Hashable] | None = None
        self._todo: collections.deque[Callable[[], None]] = collections.deque()
        r, w = os.pipe()
        os.set_blocking(r, False)
        os.set_blocking(w, False)
        self._wake: tuple[int, int] | None = (r, w)
        self._own.register(r, None)
        self._reactor = _get_reactor()
        self._reactor.call(self._start)

    # -- reactor side -------------------------------------------------------------------------
    def _start(self) -> None:
        if self._closed:
            return
        self._reactor.listeners.add(self)
        self._reactor.sel.register(self._sock, selectors.EVENT_READ, lambda: self._accept(self._sock))
        if self._local is not None:
            local = self._local
            self._reactor.sel.register(local, selectors.EVENT_READ, lambda: self._accept(local))

    def _accept(self, listening: socket.socket) -> None:
        for _ in range(64):
            try:
                sock, addr = listening.accept()
            except _WOULD_BLOCK:
                return
            except OSError as exc:
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    reject(self.address, "?", f"cannot accept: {exc}", "refused_connections")
                    self._make_room(None)
                return
            if sock.family == socket.AF_UNIX:
                uid = _peer_uid(sock)
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
                _tcp_options(sock, self._silence)
            else:
                _large_send_buffer(sock)
            private = sock.family == socket.AF_UNIX and self._tls is None  # its user checked above
            conn = _Conn(sock, self._auth.listener(label, private), label, self._spin)
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
        room, victim = make_room([(conn, conn.who, None if _is_uid(conn.who) else conn.opened)
                                  for conn in self._pending], newcomer, limits, time.monotonic())
        if victim is not None:
            reject(self.address, victim.label, "unauthenticated the longest while the table was full: closed",
                   "refused_connections")
            self._drop(victim)
        return room

    def _tls_step(self, conn: _Conn) -> None:
        try:
            conn.sock.do_handshake()  # type: ignore[attr-defined]
        except _WOULD_BLOCK:
            return
        except (OSError, ValueError) as exc:
            reject(self.address, conn.label, f"TLS handshake failed: {exc}", "refused_connections")
            self._drop(conn)
            return
        self._reactor.sel.unregister(conn.sock)
        self._greet(conn)

    def _greet(self, conn: _Conn) -> None:
        hello = conn.hs.start()
        try:
            if hello is not None:
                conn.write([hello], block=False)
        except (TransportTimeout, _Broken):
            self._drop(conn)
            return
        self._reactor.sel.register(conn.sock, selectors.EVENT_READ, lambda: self._readable(conn))

    def _readable(self, conn: _Conn) -> None:
        try:
            conn.pump(lambda frame: self._frame(conn, frame))
        except _WOULD_BLOCK:
            pass
        except (_Broken, HandshakeFailed, TransportTimeout) as exc:
            if conn.session is None:  # quiet when the peer just went (a job that died while it started)
                reject(self.address, conn.label, f"did not authenticate: {exc}", "refused_connections",
                       quiet=isinstance(exc, _Gone))
            self._drop(conn)
            return
        if conn.session is not None and not self._closed:
            # Authenticated: from now on the thread waiting in recv reads this socket.
            try:
                self._reactor.sel.unregister(conn.sock)
            except (KeyError, ValueError):
                return
            self._own_call(lambda: self._watch(conn))

    def _frame(self, conn: _Conn, frame: memoryview) -> None:
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
            for cb in list(self._callbacks):
                cb(conn.hs.session, True)

    def _drop(self, conn: _Conn) -> None:
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
        conn.close()
        if session is not None and self._peers.pop(session, None) is not None:
            for cb in list(self._callbacks):
                try:
                    cb(session, False)
                except Exception:  # pragma: no cover - a callback must not stop the reactor
                    pass

    def _forget_pending(self, conn: _Conn) -> None:
        if self._pending.pop(conn, False) is None:  # it was pending: its peer's budget frees
            self._pending_by[conn.who] -= 1
            if self._pending_by[conn.who] <= 0:
                del self._pending_by[conn.who]

    def _own_call(self, fn: Callable[[], None]) -> None:
        """Change the reading selector: ``fn`` runs on the next reading thread, before it polls."""
        self._todo.append(fn)
        self._wake_reader()

    def _watch(self, conn: _Conn) -> None:
        if conn.session not in self._peers:
            return  # dropped meanwhile
        fd = conn.fd
        self._own.unregister(fd)  # a closed connection's number, reused
        try:
            self._own.register(fd, conn)
        except (KeyError, ValueError, OSError):
            pass

    def _unwatch(self, conn: _Conn) -> None:
        try:
            watched = self._own.get(conn.fd)
        except KeyError:
            return
        if watched is conn:
            self._own.unregister(conn.fd)

    def wake(self) -> None:
        """:class:`fibercore.transport.Wakeable`: the thread waiting in :meth:`recv` raises
        TransportTimeout now (the wake-up pipe ends its poll)."""
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

    def expire(self, now: float) -> None:
        """Close connections that did not authenticate in time."""
        for conn in list(self._pending):
            if now - conn.opened > self._limits.handshake_timeout:
                reject(self.address, conn.label, "did not authenticate in time", "refused_connections")
                self._drop(conn)

    def _close_all(self) -> None:
        self._reactor.listeners.discard(self)
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
        except _Broken as exc:
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
        One poll of that socket and this listener's wake-up pipe (anything that changes,
        such as a second peer or a frame left for :meth:`recv`, wakes it and returns None:
        :meth:`recv` takes over)."""
        lane = self._lane
        if lane is None or lane[4] is not peer:
            lane = self._lane_to(peer)
            if lane is None:
                return None
        conn = lane[0]
        if (self._inbox or self._todo or self._closed or len(self._peers) != 1 or conn._body is not None
                or conn._hpos or conn._records or (timeout is not None and timeout <= 0)):
            return None
        if not self._reading.acquire(False):
            return None
        try:
            poll = lane[1]
            ready: list[tuple[int, int]] = []
            if self._spin > 0 and time.perf_counter() - self._last_frame < SPIN_AFTER \
                    and self._spin_gate.open():  # busy, and a CPU to spare: the next frame is likely soon
                end = time.perf_counter() + self._spin
                while not ready and time.perf_counter() < end:
                    ready = poll(0)
                self._spin_gate.result(bool(ready))
            if not ready:
                ready = poll(-1 if timeout is None else min(timeout, IDLE_STEP) * 1000)
            if len(ready) != 1 or ready[0][0] != lane[2]:
                return None  # the time passed, or something changed: recv() looks
            try:  # readable (and read by this thread only): the read does not wait
                frame = conn.read_one(lane[3], True)
            except _WOULD_BLOCK:
                return None
            except (_Broken, OSError, ValueError):
                self._unwatch(conn)
                self._reactor.call(lambda: self._drop(conn))
                return None
            if self._spin > 0:  # what the spinning decides on
                self._last_frame = time.perf_counter()
            if self._inbox and self._waiters:  # that read brought more: another thread waits for it
                with self._cv:
                    self._cv.notify(len(self._inbox))
            return frame
        finally:
            self._reading.release()

    def _lane_to(self, peer: Hashable) -> tuple[_Conn, Callable[..., list[tuple[int, int]]], int,
                                                 Callable[[memoryview], None], Hashable] | None:
        """:meth:`recv_frame`'s connection to ``peer``, its poll (with the wake-up pipe),
        descriptor, what takes the frames it reads past, and the peer; None for a peer that
        is gone, a TLS one, or a closed listener."""
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        wake = self._wake
        if conn is None or conn.tls or wake is None:
            return None
        poller = select.poll()
        poller.register(conn.fd, select.POLLIN)
        poller.register(wake[0], select.POLLIN)
        self._lane = (conn, poller.poll, conn.fd, lambda f: self._inbox.append((f, peer)), peer)  # type: ignore[arg-type]
        return self._lane

    def line(self, peer: Hashable) -> _TcpLine | None:
        """:class:`fibercore.transport.LineEndpoint`: ``peer``'s plain connection (None for
        a TLS one, or a peer that is gone)."""
        conn = self._peers.get(peer)  # type: ignore[call-overload]
        if conn is None or conn.tls:
            return None
        return _TcpLine(conn, self._broken_line, self.recv_frame)

    def _broken_line(self, conn: _Conn, why: str) -> TransportClosed:
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
            except _WOULD_BLOCK:
                pass
            except (_Broken, OSError, ValueError):
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

    def _reading_on(self, conn: _Conn, on: bool) -> None:
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


# ---------------------------------------------------------------------------------------
# Dialling: no thread, reads on the caller's thread
# ---------------------------------------------------------------------------------------


class TcpDialer:
    """A dialling endpoint: one authenticated connection, read and written by its callers."""

    def __init__(self, conn: _Conn, address: str) -> None:
        self.address = address
        self._conn = conn
        assert conn.session is not None
        self.peer: Session = conn.session
        self._inbox: collections.deque[memoryview] = collections.deque()
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
        except _Broken as exc:
            self._gone(str(exc))
            raise TransportClosed(f"the connection to {self.address} is gone: {exc}") from None

    def line(self, peer: Hashable = None) -> _TcpLine | None:
        """:class:`fibercore.transport.LineEndpoint`: the connection (None over TLS)."""
        return None if self._conn.tls else _TcpLine(self._conn, self._broken_line, self._read_frame)

    def _broken_line(self, conn: _Conn, why: str) -> TransportClosed:
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
                or conn._records or conn.tls):  # conn.idle, inlined
            return None
        if timeout is None:
            if conn._rcvtimeo is not None:
                conn.receive_timeout(None)
        elif timeout <= 0:
            return None
        else:
            conn.wait_at_most(timeout)
        try:
            return conn.read_one(self._inbox.append)
        except _WOULD_BLOCK:
            return None
        except _Broken as exc:
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
                    except _WOULD_BLOCK:
                        pass
                    except _Broken as exc:
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
                        except _WOULD_BLOCK:
                            pass
                        if not self._inbox:
                            raise TransportTimeout("timed out")
                        continue
                    # A blocking read (no poll() wake-up) of at most IDLE_STEP; the receive
                    # timeout is set again only when it is far from what is left.
                    self._conn.wait_at_most(remaining)
                    self._conn.pump(self._inbox.append, wait=True)
                except _WOULD_BLOCK:
                    continue  # the receive timeout passed (checked above on the next turn)
                except TransportTimeout:
                    raise TransportTimeout(f"no frame on {self.address} within {timeout} s") from None
                except _Broken as exc:
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


def keepalive_timers(bound: float) -> dict[str, int]:
    """Keepalive options that close an idle connection whose peer stopped answering for about
    ``bound`` seconds: the first probe after half of it, then three more. (Not
    ``TCP_USER_TIMEOUT``: Linux applies it to a zero window too, and would cut a live reader
    that is only slow, where multiprocessing blocks.)"""
    bound = min(max(bound, 2.0), 60000.0)  # the kernel's limits: KEEPIDLE and KEEPINTVL <= 32767
    idle = max(1, round(bound / 2))
    return {"TCP_KEEPIDLE": idle, "TCP_KEEPINTVL": max(1, round((bound - idle) / 3)), "TCP_KEEPCNT": 3}


def _tcp_options(sock: socket.socket, silence: float = DEFAULT_SILENCE) -> None:
    """No Nagle delay (frames are already batched), and keepalive (:func:`keepalive_timers`)."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in keepalive_timers(silence).items():
        option = getattr(socket, name, None)
        if option is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, option, value)
            except OSError:
                pass


def _large_send_buffer(sock: socket.socket) -> None:
    """Let a Unix socket hold a whole batch (:data:`UNIX_SEND_BUFFER`): a write that must wait
    for the reader costs its thread a GIL switch (up to 5 ms in a busy process) per part."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
    except OSError:  # capped by net.core.wmem_max: the kernel keeps what it allows
        pass


def _local_name(identity: bytes) -> str:
    """The abstract Unix socket name of the listener with this identity (Linux).

    Unguessable before the listener binds it (the identity is 16 random bytes), so no
    other user can take it first; who connects is checked by its uid (:func:`_peer_uid`).
    """
    return f"\0fibercore-{identity.hex()}"


def _peer_uid(sock: socket.socket) -> int:
    """The user id of the process at the other end of a Unix socket (-1: unknown)."""
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return -1
    return int(struct.unpack("3i", creds)[1])


#: Seconds a dialer waits for the same-machine Unix socket to take its connection before it
#: uses TCP (a backlog that never drains). Its handshake then has the usual handshake_timeout:
#: the listener is our own user's (checked), and a busy master is slow, not hostile.
LOCAL_DEADLINE = 2.0
#: A dialer whose connection is closed before the listener's HELLO (refused for room: many
#: jobs of one node connecting at once, or a flood) tries again after these pauses, the last
#: one repeated, for up to :data:`DIAL_PATIENCE` seconds (each pause scaled by a random
#: 0.5-1.5, so a crowd does not come back at one instant). 4,096 workers connecting to one
#: master at once on 2 cores took longer than the first seven pauses.
DIAL_RETRIES = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
DIAL_PATIENCE = 120.0


def _dial_local(address: str, auth: Authenticator, spin: float) -> TcpDialer | None:
    """The listener's Unix socket, if it is on this machine, takes the connection within
    :data:`LOCAL_DEADLINE` and belongs to this user; None means: use TCP."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(LOCAL_DEADLINE)
        sock.connect(_local_name(auth.expect))  # type: ignore[arg-type]
        if _peer_uid(sock) != os.geteuid():  # not our user's listener: never speak to it
            reject(address, "unix", "the Unix socket belongs to another user", "refused_connections")
            sock.close()
            return None
        _large_send_buffer(sock)
    except OSError:
        sock.close()
        return None
    try:
        return _handshake(sock, address, auth, spin)
    except (TransportError, AuthenticationError, _Refused):
        return None


def _dial(address: str, auth: Authenticator, tls: ssl.SSLContext | None, server_name: str | None,
          spin: float = DEFAULT_SPIN, silence: float = DEFAULT_SILENCE) -> TcpDialer:
    scheme, host, port, machine = _split_address(address)
    if tls is not None and scheme != "tls+tcp":
        raise TransportError(f"{address} is a plain tcp:// address but this process has tls = true: it never "
                             "dials without TLS. Give the listener's tls+tcp:// address (start it with tls = true)")
    if scheme == "tls+tcp" and tls is None:
        raise TransportError(f"{address} expects TLS: set tls = true (with tls_cert_file and tls_ca_file)")
    if tls is None and LOCAL_SOCKETS and auth.expect is not None and machine and machine == machine_identity():
        # Same machine and network namespace: a Unix socket costs a tenth of TCP loopback per message.
        dialer = _dial_local(address, auth, spin)
        if dialer is not None:
            return dialer
    give_up = time.monotonic() + DIAL_PATIENCE
    for attempt in itertools.count():
        try:
            return _dial_tcp(address, host, port, auth, tls, server_name, spin, silence)
        except _Refused as exc:
            pause = DIAL_RETRIES[min(attempt, len(DIAL_RETRIES) - 1)] * (0.5 + random.random())
            if time.monotonic() + pause > give_up:
                raise TransportError(f"{address} refused the connection before authenticating ({exc}), "
                                     f"{attempt + 1} times in {DIAL_PATIENCE:.0f} s: the listener is overloaded "
                                     "or closing") from None
            time.sleep(pause)
    raise AssertionError("unreachable")  # pragma: no cover


def _is_uid(who: Hashable) -> bool:
    """``who`` is a uid (Unix peers: another user's are refused before they count)."""
    return isinstance(who, tuple) and who[0] == "uid"


class _Refused(Exception):
    """The listener closed the connection before it greeted (no room now): try again."""


def _dial_tcp(address: str, host: str, port: int, auth: Authenticator, tls: ssl.SSLContext | None,
              server_name: str | None, spin: float, silence: float = DEFAULT_SILENCE) -> TcpDialer:
    timeout = auth.limits.handshake_timeout
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as exc:
        raise TransportError(f"cannot connect to {address}: {exc}") from exc
    _tcp_options(sock, silence)
    try:
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=server_name or host)
    except ssl.SSLCertVerificationError as exc:
        sock.close()
        raise AuthenticationError(
            f"{address}: the listener's certificate is not valid for {server_name or host!r} ({exc.verify_message}): "
            "give each node a certificate naming its address, or set tls_server_name to the name the "
            "certificates carry") from None
    except (OSError, ValueError) as exc:
        sock.close()
        raise TransportError(f"cannot connect to {address}: TLS failed: {exc}") from exc
    return _handshake(sock, address, auth, spin)


def _handshake(sock: socket.socket, address: str, auth: Authenticator, spin: float = DEFAULT_SPIN,
               timeout: float | None = None) -> TcpDialer:
    """Authenticate a connected socket as the dialling side; the endpoint, or an error."""
    timeout = auth.limits.handshake_timeout if timeout is None else timeout
    deadline = time.monotonic() + timeout
    sock.setblocking(False)
    hs = auth.dialer(address, private=sock.family == socket.AF_UNIX)
    conn = _Conn(sock, hs, address, spin)
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
            except _WOULD_BLOCK:
                if conn.session is None:
                    conn._wait(select.POLLIN, deadline)
    except TransportTimeout:
        conn.close()
        raise TransportError(f"{address} did not complete authentication within {timeout:.0f} s") from None
    except _Broken as exc:
        conn.close()
        if not hs.greeted:
            raise _Refused(str(exc)) from None
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
    dialer = TcpDialer(conn, address)
    dialer._inbox.extend(frames)
    return dialer


class TcpTransport:
    """Opens :class:`TcpListener` and :class:`TcpDialer` endpoints (tcp:// or tls+tcp://)."""

    name = "tcp"

    def __init__(self, tls: dict[str, Any] | None = None, spin: float = DEFAULT_SPIN,
                 silence: float = DEFAULT_SILENCE) -> None:
        self._tls_options = tls
        self._spin = max(0.0, spin)
        self._silence = silence
        self._scheme = "tls+tcp" if tls else "tcp"
        self._server_ctx: ssl.SSLContext | None = None
        self._client_ctx: ssl.SSLContext | None = None
        if tls:
            if not tls.get("ca"):
                raise ConfigError("tls = true needs tls_ca_file (the CA that signed every node's certificate): "
                                  "without it any certificate the system trusts would be accepted")
            if not tls.get("cert"):
                raise ConfigError("tls = true needs tls_cert_file (this node's certificate and key, one PEM file)")
            self._server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self._client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # checks the name by default
            for ctx in (self._server_ctx, self._client_ctx):
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2
                ctx.load_verify_locations(cafile=tls["ca"])  # only this CA, not the system's
                ctx.load_cert_chain(tls["cert"])
                ctx.verify_mode = ssl.CERT_REQUIRED  # both sides show a certificate the CA signed

    def listen(self, kind: str, bind_host: str, advertise_host: str | None = None,
               auth: Authenticator | None = None, port: int = 0) -> TcpListener:
        if auth is None:
            raise TransportError("fibercore's tcp transport authenticates every connection: pass auth=")
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((bind_host, port))
            sock.listen(512)
        except OSError as exc:
            sock.close()
            raise TransportError(
                f"cannot listen on {bind_host}: {exc}. Set listen_host/bind_host to an address of this machine."
            ) from exc
        sock.setblocking(False)
        port = sock.getsockname()[1]
        adv = advertise_host or bind_host
        local = self._bind_local(auth) if self._server_ctx is None and LOCAL_SOCKETS else None
        machine = machine_identity() if local is not None else ""
        address = _format_address(self._scheme, adv, port, machine)
        return TcpListener(sock, address, auth, self._server_ctx, local, self._spin, self._silence)

    @staticmethod
    def _bind_local(auth: Authenticator) -> socket.socket | None:
        """The listener's same-machine Unix socket, named after its identity (a name that is
        taken, which no one could have guessed, makes the listener draw a new identity)."""
        for _ in range(3):
            local = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                local.bind(_local_name(auth.identity))
                local.listen(512)
                local.setblocking(False)
                return local
            except OSError as exc:
                local.close()
                if exc.errno != errno.EADDRINUSE:
                    return None  # no abstract sockets here: TCP only (the address says so)
                auth.new_identity()
        raise TransportError("three random Unix socket names in a row were taken: another process on this "
                             "machine is binding fibercore's names; find it with `ss -xlp | grep fibercore`")

    def dial(self, kind: str, address: str, auth: Authenticator | None = None) -> TcpDialer:
        if auth is None:
            raise TransportError("fibercore's tcp transport authenticates every connection: pass auth=")
        server_name = (self._tls_options or {}).get("server_name")
        return _dial(address, auth, self._client_ctx, server_name, self._spin, self._silence)


def _after_fork_in_child() -> None:
    """The parent's reactor thread does not exist here: a new one starts when needed."""
    global _reactor, _reactor_lock
    _reactor = None
    _reactor_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class TcpPlugin:
    FIBER_CONTRACT = 3

    @hookimpl(trylast=True)
    def fiber_transport(self, config: Any) -> TcpTransport | None:
        if config is not None and (config.get("transport") or "tcp") != "tcp":
            return None  # another transport was asked for: its plugin answers (or none does)
        tls = None
        if config is not None and config.get("tls"):
            tls = {
                "cert": config.get("tls_cert_file"),
                "ca": config.get("tls_ca_file"),
                "server_name": config.get("tls_server_name"),
            }
        spin = DEFAULT_SPIN
        if config is not None and config.get("spin_wait") is not None:
            spin = float(config.get("spin_wait")) * 1e-6
        silence = float(config.get("heartbeat_timeout") or DEFAULT_SILENCE) if config is not None else DEFAULT_SILENCE
        return TcpTransport(tls, spin, silence)


plugin = TcpPlugin()
