"""``Pipe()`` and its ``Connection`` ends, on the transport hook.

A Pipe is one ``pair`` endpoint listening in the process that created it. Each end
connects lazily, on first use: in the creating process the first end used takes
the listening socket and the other dials it; in any other process an end dials.
So the usual patterns (keep one end, pass the other to a Process; or pass both and
close one in the child, as baselines' SubprocVecEnv does) connect the two
processes directly, with nothing relayed. Several processes may use the dialling
end at once (the home end receives from all, and sends to the latest; EOF comes
when the last one left). Limit: the two ends must not both be used in processes
other than the creator.

Sending is asynchronous and batched (a :class:`~fibercore.wire.Sender` thread packs
whatever is queued into one frame), receiving is synchronous. ``close()`` flushes
what was sent and tells the other end, whose ``recv`` then raises EOFError.
"""

from __future__ import annotations

import atexit
import os
import pickle
import threading
import time
import uuid
import weakref
from collections import deque
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.lifetime import at_process_end, current_pid
from fibercore.runtime import adopt_credentials, credentials_for_child, get_runtime
from fibercore.serialization import dumps_or_explain
from fibercore.wire import Channel, Sender
from fibercore.wire.channel import Lane

OBJ, BYTES, CLOSE = 1, 2, 3
_homes: dict[str, _PipeHome] = {}
_open: weakref.WeakSet[Connection] = weakref.WeakSet()


class _PipeHome:
    """The listening socket of one Pipe, in the process that created it."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.channel = get_runtime().listen("pair", service="pipe")
        self.address = self.channel.address
        self.claimed = False
        self.closed_sides: set[int] = set()
        self.users = 2
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)  # a message was delivered in memory
        self.ends: list[weakref.ref[Connection] | None] = [None, None]
        # An end is (or may be) used by another process: someone dialled in, or this
        # process forked. Then every message goes over the network.
        self.shared = False
        self.channel.on_peer_event(self._peer_event)

    def _peer_event(self, peer: Any, added: bool) -> None:
        if added:
            self.mark_shared()

    def mark_shared(self) -> None:
        with self.arrived:
            self.shared = True
            self.arrived.notify_all()

    def release(self) -> None:
        with self.lock:
            self.users -= 1
            if self.users > 0:
                return
        _homes.pop(self.id, None)
        self.channel.close()


def _wait_a_step(cond: threading.Condition, deadline: float | None, ended: bool, step: float) -> None:
    """Inside ``cond``, with nothing to read: EOFError at the end of the pipe,
    TransportTimeout past ``deadline``, else wait up to ``step`` for a delivery."""
    if ended:
        raise EOFError("the other end of the pipe is closed")
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise TransportTimeout("no message within the timeout")
    cond.wait(step if remaining is None else min(step, remaining))


class _Ready:
    """A pipe whose read end is readable while a flag is set (a connection's fileno())."""

    def __init__(self) -> None:
        self.r, self._w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self._w, False)
        self._set = False
        self._lock = threading.Lock()

    def set(self) -> None:
        with self._lock:
            if not self._set:
                try:
                    os.write(self._w, b"!")
                    self._set = True
                except OSError:  # closed
                    pass

    def clear(self) -> None:
        with self._lock:
            if self._set:
                try:
                    os.read(self.r, 64)
                except OSError:
                    pass
                self._set = False

    def close(self) -> None:
        with self._lock:
            for fd in (self.r, self._w):
                try:
                    os.close(fd)
                except OSError:
                    pass


class Connection:
    """One end of a Pipe (the ``multiprocessing.connection.Connection`` API)."""

    def __init__(self, pipe_id: str, address: str, creator_pid: int, readable: bool = True,
                 writable: bool = True, side: int = 0) -> None:
        self._side = side
        self._pickled = False
        self._pipe_id = pipe_id
        self._address = address
        self._creator_pid = creator_pid
        self._readable = readable
        self._writable = writable
        self._channel: Channel | None = None
        # The fast path to the other end (the transport's lane): a dialled end's for good, the
        # home end's while one peer is connected (dropped at every peer event).
        self._lane: Lane | None = None
        self._owns_home = False
        self._sender: Sender | None = None
        self._inbox: deque[tuple[int, list[Any]]] = deque()
        self._eof = False
        self._closed = False
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._ready: _Ready | None = None  # the descriptor fileno() returns
        self._watcher: threading.Thread | None = None
        self._filed = threading.Condition()
        self._at_eof = False
        self._wrote_here = False  # the creating process sent through this end
        _open.add(self)

    # -- connecting --------------------------------------------------------------------
    def _forked(self) -> None:
        """In a forked child, forget the parent's socket and threads (they are not ours)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._channel = None
        self._lane = None
        self._sender = None
        self._owns_home = False
        self._ready, self._watcher, self._filed = None, None, threading.Condition()

    def _connect(self) -> Channel:
        if self._closed:
            raise OSError("handle is closed")
        if self._pid != os.getpid():
            self._forked()
        with self._lock:
            if self._channel is not None:
                return self._channel
            home = _homes.get(self._pipe_id) if os.getpid() == self._creator_pid else None
            if home is not None:
                with home.lock:
                    take = not home.claimed
                    home.claimed = True
            else:
                take = False
            if take:
                assert home is not None
                self._channel = home.channel
                self._owns_home = True
            else:
                self._channel = get_runtime().dial("pair", self._address, service="pipe")
                self._lane = self._channel.lane()
            self._channel.on_peer_event(self._on_peer)
            return self._channel

    def _home_lane(self) -> Lane | None:
        """The home end's lane while one peer is connected to it (None otherwise)."""
        channel = self._channel
        if not self._owns_home or channel is None:
            return None
        peer = channel.only_peer
        if peer is not None:
            self._lane = channel.lane(peer)
        return self._lane

    def _on_peer(self, peer: Any, added: bool) -> None:
        if self._owns_home:
            self._lane = None  # made again for the one peer, if there is one
        channel = self._channel
        if added:
            self._eof = False
        elif (channel is None or not channel.listening or channel.peer_count == 0) and not self._twin_still_writes():
            self._eof = True  # the (last) process using the other end left

    def _local_peer(self) -> tuple[_PipeHome, Connection] | None:
        """The other end while both ends are here, in the creator, and neither was sent
        away: then messages go from one to the other in memory (as fast as an OS pipe,
        and readable at once, as multiprocessing's are)."""
        if self._pickled or self._channel is not None or os.getpid() != self._creator_pid:
            return None
        home = _homes.get(self._pipe_id)
        if home is None or home.shared:
            return None
        ref = home.ends[1 - self._side]
        peer = ref() if ref is not None else None
        if peer is None or peer._pickled or peer._channel is not None:
            return None
        return home, peer

    def _send(self, op: int, parts: list[Any]) -> None:
        sender = self._sender
        if sender is not None and not self._closed and self._pid == current_pid() and not self._eof:
            # Connected already (the common case): on an idle line, one message of one part
            # goes out here in one step; otherwise through the sender (order, bursts).
            try:
                if sender.idle():
                    lane = self._lane or self._home_lane()
                    if lane is not None:
                        lane.send(op, parts)
                        sender.sent_aside()
                        return
                    channel = self._channel
                    if channel is not None and channel.has_peer:
                        try:
                            channel.send([(op, parts)])
                            sender.sent_aside()
                            return
                        except TransportTimeout:  # the peer left meanwhile: the sender waits for one
                            pass
                sender.put((op, parts))
                return
            except TransportClosed as exc:
                raise BrokenPipeError(f"the other end of the pipe {self._address} is gone: {exc}") from None
        self._check_closed()
        if not self._writable:
            raise OSError("connection is read-only")
        self._wrote_here = self._wrote_here or current_pid() == self._creator_pid
        local = self._local_peer() if self._sender is None else None
        if local is not None:
            home, peer = local
            if peer._closed:
                raise BrokenPipeError("the other end of the pipe is closed")
            with home.arrived:
                peer._inbox.append((op, [bytes(p) if isinstance(p, memoryview) else p for p in parts]))
                home.arrived.notify_all()
            if peer._ready is not None:
                peer._ready.set()
            return
        if self._sender is None or self._pid != current_pid():
            channel = self._connect()
            with self._lock:
                if self._sender is None:
                    at_process_end(_flush_all)
                    ref = weakref.ref(self)
                    self._sender = Sender(channel, name=f"fiber-pipe-{self._pipe_id[:8]}",
                                          peer_gone=lambda: _peer_gone(ref))
        if self._eof:  # as multiprocessing: writing to a pipe whose reader is gone
            raise BrokenPipeError(f"the other end of the pipe {self._address} is closed")
        try:
            self._sender.put((op, parts))
        except TransportClosed as exc:
            raise BrokenPipeError(f"the other end of the pipe {self._address} is gone: {exc}") from None

    def _take(self) -> tuple[int, list[Any]]:
        """Pop the next message; the readiness descriptor stays readable while more wait."""
        msg = self._inbox.popleft()
        if not self._inbox and self._ready is not None and not self._at_eof:
            self._ready.clear()
        return msg

    def _next(self, timeout: float | None) -> tuple[int, list[Any]]:
        """Next message; raises TransportTimeout after ``timeout``, EOFError at the end."""
        lane = self._lane or self._home_lane()
        if (lane is not None and not self._inbox and self._watcher is None and not self._eof
                and not self._closed and self._readable and self._pid == current_pid()):
            # Connected, nothing buffered (a stepped simulator and its master): the lane. In
            # the process holding the home it waits in steps, as the general path does, which
            # also watches the other end closing there without a word.
            started = time.monotonic() if timeout else 0.0
            wait = timeout if self._creator_pid != current_pid() else 0.5 if timeout is None else min(timeout, 0.5)
            try:
                messages = lane.recv(wait)
            except TransportClosed:
                self._set_eof()
                raise EOFError("the pipe was closed") from None
            if messages is not None:
                if len(messages) == 1 and messages[0][0] != CLOSE and self._ready is None:
                    return messages[0]
                self._file(messages)
                if self._inbox:
                    return self._take()
            if timeout:
                timeout = max(0.0, timeout - (time.monotonic() - started))
        channel = self._channel
        if (channel is not None and not self._inbox and self._watcher is None and not self._closed
                and self._readable and self._pid == current_pid()):
            # Connected, nothing buffered (the hot path of a stepped simulator): receive.
            deadline = None if timeout is None else time.monotonic() + timeout
            while not self._inbox:
                msg = self._pull(channel, deadline, direct=True)
                if msg is not None:
                    return msg
            return self._take()
        self._check_closed()
        if not self._readable:
            raise OSError("connection is write-only")
        if self._inbox:
            return self._take()
        deadline = None if timeout is None else time.monotonic() + timeout
        local = self._local_peer()
        while local is not None:
            home, peer = local
            with home.arrived:
                if self._inbox:
                    return self._take()
                _wait_a_step(home.arrived, deadline, ended=peer._closed, step=0.1)
            local = self._local_peer()  # the other end may have been sent away meanwhile
        if self._inbox:
            return self._take()
        if self._watcher is not None:  # a thread receives for this end (fileno() was used)
            with self._filed:
                while not self._inbox:
                    _wait_a_step(self._filed, deadline, ended=self._at_eof, step=0.5)
                return self._take()
        channel = self._connect()
        while not self._inbox:
            self._pull(channel, deadline)
        return self._take()

    def _pull(self, channel: Channel, deadline: float | None, step: float = 0.5,
              direct: bool = False) -> tuple[int, list[Any]] | None:
        """Receive one frame into the inbox; EOFError at the end, TransportTimeout after ``deadline``.

        ``direct``: a frame of one message (the usual one) is returned instead, when nothing
        waits in the inbox and no descriptor reports readiness."""
        if deadline is not None:
            step = min(step, max(0.0, deadline - time.monotonic()))
        if not self._eof and current_pid() == self._creator_pid:
            home = _homes.get(self._pipe_id)
            if home is not None and (1 - self._side) in home.closed_sides:
                self._eof = True  # the other end was closed here without ever connecting
        if self._eof:
            step = 0.2  # drain frames still in flight when the peer left, then stop
        try:
            messages, _ = channel.recv(step)
        except TransportTimeout:
            if self._eof:
                self._set_eof()
                raise EOFError("the other end of the pipe is closed") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise
            return None
        except TransportClosed:
            self._set_eof()
            raise EOFError("the pipe was closed") from None
        if direct and len(messages) == 1 and messages[0][0] != CLOSE and not self._inbox and self._ready is None:
            return messages[0]
        self._file(messages)
        return None

    def _file(self, messages: list[tuple[int, list[Any]]]) -> None:
        """Put received messages in the inbox; a CLOSE ends the pipe unless the other end still writes."""
        for op, parts in messages:
            if op == CLOSE:
                if not self._twin_still_writes():
                    self._eof = True
            else:
                self._inbox.append((op, parts))
        if self._inbox and self._ready is not None:
            self._ready.set()
        return None

    def _twin_still_writes(self) -> bool:
        """A copy of the other end closed, but another may still write: more processes are
        connected, or the other end is still open here in the creator (as with an OS pipe,
        the end comes when every copy of the writing end is closed). An end the creator
        never wrote through counts as handed off: its copy elsewhere decides."""
        channel = self._channel
        if channel is not None and channel.listening and channel.peer_count > 1:
            return True
        home = _homes.get(self._pipe_id) if os.getpid() == self._creator_pid else None
        if home is None:
            return False
        ref = home.ends[1 - self._side]
        twin = ref() if ref is not None else None
        return twin is not None and not twin._closed and twin._writable and twin._wrote_here

    def _set_eof(self) -> None:
        self._at_eof = True
        if self._ready is not None:
            self._ready.set()  # as a pipe at EOF: readable, and recv() raises EOFError

    def _watch(self) -> None:
        """The receiving thread of an end whose fileno() is used (select/selectors/wait)."""
        while not self._closed:
            local = self._local_peer()
            if local is not None:  # in memory: senders signal the descriptor themselves
                with local[0].arrived:
                    local[0].arrived.wait(0.2)
                continue
            try:
                self._pull(self._connect(), None, 0.2)
            except EOFError:
                with self._filed:
                    self._filed.notify_all()
                return
            except Exception:  # closed meanwhile
                return
            if self._inbox:
                with self._filed:
                    self._filed.notify_all()

    # -- the multiprocessing API ----------------------------------------------------------
    def send(self, obj: Any) -> None:
        """Send a picklable object to the other end."""
        serializer = get_runtime().serializer
        try:
            parts = serializer.dumps(obj)
        except Exception:  # said again with what and where
            parts = dumps_or_explain(serializer, obj, "an object through a Pipe")
        self._send(OBJ, parts)

    def recv(self) -> Any:
        """Receive an object sent with send(); EOFError when the other end is closed."""
        op, parts = self._next(None)
        if op == BYTES:  # as multiprocessing: recv() unpickles whatever bytes arrive
            return get_runtime().serializer.loads([parts[0]])
        return get_runtime().serializer.loads(parts)

    def send_bytes(self, buf: Any, offset: int = 0, size: int | None = None) -> None:
        if type(buf) is bytes and offset == 0 and size is None:  # immutable: sent as it is
            self._send(BYTES, [buf])
            return
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset is negative or out of range")
        if size is None:
            size = len(view) - offset
        if size < 0 or offset + size > len(view):
            raise ValueError("size is negative or buffer too short")
        self._send(BYTES, [bytes(view[offset : offset + size])])

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        if maxlength is not None and maxlength < 0:
            raise ValueError("negative maxlength")
        op, parts = self._next(None)
        if op == BYTES or len(parts) == 1:
            data = bytes(parts[0])  # for an object: its pickle, as multiprocessing's recv_bytes()
        else:  # a pickle with out-of-band buffers: the same object as one in-band pickle
            data = pickle.dumps(get_runtime().serializer.loads(parts), protocol=5)
        if maxlength is not None and len(data) > maxlength:
            raise OSError("bad message length")
        return data

    def recv_bytes_into(self, buf: Any, offset: int = 0) -> int:
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("negative offset or offset too large")
        data = self.recv_bytes()
        if len(data) > len(view) - offset:
            import multiprocessing

            raise multiprocessing.BufferTooShort(data)
        view[offset : offset + len(data)] = data
        return len(data)

    def poll(self, timeout: float | None = 0.0) -> bool:
        """Whether there is data to read, waiting up to ``timeout`` seconds (None: forever)."""
        try:
            msg = self._next(timeout)
        except TransportTimeout:
            return False
        except EOFError:
            return True  # as multiprocessing: readable at EOF, recv() raises
        self._inbox.appendleft(msg)
        if self._ready is not None:
            self._ready.set()
        return True

    def fileno(self) -> int:
        """A descriptor that is readable while a message (or the end of the pipe) waits, for
        ``select``, ``selectors`` and ``multiprocessing.connection.wait``; using it starts
        a thread that receives for this end."""
        self._check_closed()
        with self._lock:
            if self._ready is None:
                self._ready = _Ready()
                if self._inbox or self._at_eof:
                    self._ready.set()
                if self._readable:
                    self._watcher = threading.Thread(target=self._watch, name=f"fiber-pipe-{self._pipe_id[:8]}-watch",
                                                     daemon=True)
                    self._watcher.start()
        return self._ready.r

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def readable(self) -> bool:
        return self._readable

    @property
    def writable(self) -> bool:
        return self._writable

    def close(self) -> None:
        """Flush what was sent, tell the other end, and release the socket."""
        self._close(10.0)

    def _close(self, flush_timeout: float) -> None:
        if self._closed:
            return
        if self._pid != os.getpid():
            self._forked()
        local = self._local_peer()
        if self._sender is not None:
            try:
                self._sender.put((CLOSE, []))
            except TransportClosed:
                pass
            self._sender.close(flush=True, timeout=flush_timeout)
        elif self._channel is not None and self._writable:
            try:  # never wait: the other end may be gone (a pair's send would block)
                self._channel.send([(CLOSE, [])], block=False)
            except Exception:
                pass
        self._closed = True
        if local is not None:  # a reader of the other end, here, learns of the EOF now
            with local[0].arrived:
                local[0].arrived.notify_all()
            if local[1]._ready is not None:
                local[1]._ready.set()
        if self._ready is not None:
            self._ready.close()
        if self._channel is not None and not self._owns_home:
            self._channel.close()
        home = _homes.get(self._pipe_id) if os.getpid() == self._creator_pid else None
        if home is not None:
            if not self._pickled:  # no copy elsewhere can still write: the reader sees EOF
                home.closed_sides.add(self._side)
            home.release()
        self._channel = None

    def _check_closed(self) -> None:
        if self._closed:
            raise OSError("handle is closed")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        local = self._local_peer()
        self._pickled = True
        if local is not None and self._inbox:
            # Sent to this end in memory but not read: the copy being made must get them,
            # so the other end sends them again, over the network, before anything else.
            _home, peer = local
            pending, self._inbox = list(self._inbox), deque()
            for op, parts in pending:
                peer._send(op, parts)
        return (_rebuild, (self._pipe_id, self._address, self._creator_pid, self._readable,
                           self._writable, self._side, credentials_for_child()))

    def __repr__(self) -> str:
        return f"<fibercore Connection {self._address} {'closed' if self._closed else 'open'}>"


def _forking() -> None:
    """A forked child may use either end of every pipe that exists now."""
    for home in list(_homes.values()):
        home.shared = True


os.register_at_fork(before=_forking)


def _peer_gone(ref: weakref.ref[Connection]) -> bool:
    conn = ref()
    return conn is None or conn._eof or conn._closed


def _rebuild(pipe_id: str, address: str, creator_pid: int, readable: bool, writable: bool,
             side: int, credentials: tuple[str, bytes] | None = None) -> Connection:
    adopt_credentials(credentials)
    return Connection(pipe_id, address, creator_pid, readable, writable, side)


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """A pair of connected ends; with ``duplex=False``, (receive-only, send-only)."""
    home = _PipeHome()
    _homes[home.id] = home
    pid = os.getpid()
    if duplex:
        ends = (Connection(home.id, home.address, pid, side=0),
                Connection(home.id, home.address, pid, side=1))
    else:
        ends = (Connection(home.id, home.address, pid, writable=False, side=0),
                Connection(home.id, home.address, pid, readable=False, side=1))
    home.ends = [weakref.ref(ends[0]), weakref.ref(ends[1])]
    return ends


def wait(object_list: list[Any], timeout: float | None = None) -> list[Any]:
    """Like ``multiprocessing.connection.wait``: the ready ones among connections, sockets and
    descriptors (anything with ``fileno()``, or an int), waiting up to ``timeout`` (None:
    forever) without using the CPU. A connection waits through the descriptor its
    ``fileno()`` gives (readable while a message or the end of the pipe waits)."""
    import selectors

    ready = [o for o in object_list if isinstance(o, Connection) and o.poll(0)]
    if ready:  # what is there already, without a thread or a system call
        return ready + _ready_now([o for o in object_list if not isinstance(o, Connection)])
    deadline = None if timeout is None else time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        for obj in object_list:
            selector.register(obj.fileno() if isinstance(obj, Connection) else obj, selectors.EVENT_READ, obj)
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            found = [key.data for key, _ in selector.select(remaining)]
            # A connection's descriptor may lag its inbox (a message taken meanwhile): ask it.
            ready = [o for o in found if not isinstance(o, Connection) or o.poll(0)]
            if ready or (deadline is not None and time.monotonic() >= deadline):
                return ready


def _ready_now(objects: list[Any]) -> list[Any]:
    """The descriptors among ``objects`` that are readable now (no waiting)."""
    import selectors

    if not objects:
        return []
    with selectors.DefaultSelector() as selector:
        for obj in objects:
            selector.register(obj, selectors.EVENT_READ, obj)
        return [key.data for key, _ in selector.select(0)]


#: Seconds the exit handler spends, in all, delivering what open pipes still hold.
EXIT_FLUSH_BUDGET = 5.0


@atexit.register
def _flush_all() -> None:
    """At exit, deliver what was sent and tell peers (their recv() then raises EOFError).

    One budget for every pipe: a peer that is gone cannot take its data, and exit
    must not wait for it pipe after pipe.
    """
    import time

    deadline = time.monotonic() + EXIT_FLUSH_BUDGET
    for conn in list(_open):
        if conn._sender is not None and not conn._closed:
            try:
                conn._close(max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
