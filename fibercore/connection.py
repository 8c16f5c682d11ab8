"""``Pipe()`` and its ``Connection`` ends: the thin API over :mod:`fibercore.pipes`.

A Pipe is one ``pair`` endpoint listening in the process that created it. Each end
connects lazily, on first use: in the creating process the first end used takes
the listening socket and the other dials it; in any other process an end dials.
So the usual patterns (keep one end, pass the other to a Process; or pass both and
close one in the child, as baselines' SubprocVecEnv does) connect the two
processes directly, with nothing relayed. Several processes may use the dialling
end at once (the home end receives from all, and sends to the latest; EOF comes
when the last one left). Limit: the two ends must not both be used in processes
other than the creator.

An end picks its delivery path for each call (:mod:`fibercore.pipes`: in memory, over
the network, or through its watcher thread once ``fileno()`` was used); what it
received waits in its :class:`~fibercore.pipes.inbox.Inbox`. Sending is asynchronous
and batched, receiving is synchronous. ``close()`` flushes what was sent and tells
the other end, whose ``recv`` then raises EOFError.
"""

from __future__ import annotations

import atexit
import functools
import os
import pickle
import queue
import threading
import time
import weakref
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.lifetime import at_process_end, current_pid
from fibercore.pipes import BYTES, OBJ, memory
from fibercore.pipes.home import PipeHome, home_of
from fibercore.pipes.inbox import Inbox, Message
from fibercore.pipes.network import NetworkPath
from fibercore.pipes.readiness import Watcher
from fibercore.runtime import adopt_credentials, credentials_for_child, get_runtime
from fibercore.serialization import dumps_or_explain
from fibercore.wire import Channel, Sender

_open: weakref.WeakSet[Connection] = weakref.WeakSet()


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
        self._closed = False
        self._dropped = False  # collected unclosed: closed by the let-go thread
        #: One of the two ends Pipe() made (a copy rebuilt in the creator is not): its close
        #: counts for the pipe's home.
        self._home_share = False
        self._wrote_here = False  # the creating process sent through this end
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._inbox = Inbox()
        # Nothing the end's threads or sockets keep refers back to the end (only weakly), so an
        # end dropped without close() is collected and let go (__del__), as multiprocessing's is.
        self._network = NetworkPath(pipe_id, address, creator_pid, side, self._inbox,
                                    functools.partial(_twin_writes_here, pipe_id, creator_pid, side))
        self._watcher: Watcher | None = None  # receives for this end once fileno() was used
        _open.add(self)
        if _let_go_pid != self._pid:
            _start_letting_go(self._pid)

    # -- which path ---------------------------------------------------------------------
    def _forked(self) -> None:
        """In a forked child, forget the parent's socket and threads (they are not ours)."""
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._network.forked()
        self._inbox.forked()
        self._watcher = None

    def _connect(self) -> Channel:
        if self._closed:
            raise OSError("handle is closed")
        if self._pid != os.getpid():
            self._forked()
        return self._network.connect()

    def _stays_here(self) -> bool:
        """Neither sent to another process nor connected: messages may go in memory."""
        return not self._pickled and self._network.channel is None

    def _local_home(self) -> PipeHome | None:
        local = memory.local_peer(self)
        return local[0] if local is not None else None

    def _start_sending(self) -> Sender:
        self._connect()
        at_process_end(_flush_all)
        ref, inbox = weakref.ref(self), self._inbox
        return self._network.start_sender(lambda: _peer_gone(ref, inbox))

    def _send(self, op: int, parts: list[Any]) -> None:
        line = self._network.line
        if line is not None:  # connected, one peer: the line, when the sender is idle
            try:
                if line.send(op, parts):
                    return
            except TransportClosed as exc:
                raise BrokenPipeError(f"the other end of the pipe {self._address} is gone: {exc}") from None
        self._send_through_layers(op, parts)

    def _send_through_layers(self, op: int, parts: list[Any]) -> None:
        network = self._network
        sender = network.sender
        if sender is not None and not self._closed and self._pid == current_pid() and not self._inbox.eof:
            try:  # connected already: the common case
                network.send(sender, op, parts)
                if network.line is None:
                    self._fit_line()
                return
            except TransportClosed as exc:
                raise BrokenPipeError(f"the other end of the pipe {self._address} is gone: {exc}") from None
        self._check_closed()
        if not self._writable:
            raise OSError("connection is read-only")
        self._wrote_here = self._wrote_here or current_pid() == self._creator_pid
        local = memory.local_peer(self) if sender is None else None
        if local is not None:
            memory.hand_over(local[0], local[1], op, parts)
            return
        if sender is None or self._pid != current_pid():
            sender = self._start_sending()
        if self._inbox.eof:  # as multiprocessing: writing to a pipe whose reader is gone
            raise BrokenPipeError(f"the other end of the pipe {self._address} is closed")
        try:
            sender.put((op, parts))
        except TransportClosed as exc:
            raise BrokenPipeError(f"the other end of the pipe {self._address} is gone: {exc}") from None

    def _fit_line(self) -> None:
        """Give a connected end its line (:mod:`fibercore.pipes.line`) when it may have one."""
        if self._watcher is None and not self._closed and self._pid == current_pid():
            self._network.fit_line(self._readable)

    def _take(self) -> Message:
        """The next message, however long it takes: the line's when the end has one (connected,
        one peer, nothing buffered; it marks the next send an answer), else :meth:`_next`'s."""
        line = self._network.line
        msg = line.recv() if line is not None else None
        return msg if msg is not None else self._next(None)

    def _next(self, timeout: float | None) -> Message:
        """Next message through the layers; raises TransportTimeout after ``timeout``, EOFError at the end."""
        inbox = self._inbox
        if inbox.messages and self._readable and not self._closed:  # a batch's next message
            msg = inbox.take()
        else:
            msg = self._next_through_layers(timeout)
        sender = self._network.sender
        if sender is not None:  # the next send answers this message: not part of a burst
            sender.last_put = 0.0
        return msg

    def _next_through_layers(self, timeout: float | None) -> Message:
        network, inbox = self._network, self._inbox
        if (not inbox and self._watcher is None and not self._closed and self._readable
                and self._pid == current_pid()):
            # Connected, nothing buffered (a stepped simulator and its master): the lane, else
            # the channel, one frame at a time.
            lane = network.current_lane() if not inbox.eof else None
            if lane is not None and network.line is None:
                network.fit_line(True)
            if lane is not None:
                started = time.monotonic() if timeout else 0.0
                msg = network.recv_on_lane(lane, timeout, direct=inbox.ready is None)
                if msg is not None:
                    return msg
                if inbox:
                    return inbox.take()
                if timeout:
                    timeout = max(0.0, timeout - (time.monotonic() - started))
            channel = network.channel
            if channel is not None:
                deadline = None if timeout is None else time.monotonic() + timeout
                while not inbox:
                    msg = network.pull(channel, deadline, direct=True)
                    if msg is not None:
                        return msg
                return inbox.take()
        self._check_closed()
        if not self._readable:
            raise OSError("connection is write-only")
        if inbox:
            return inbox.take()
        deadline = None if timeout is None else time.monotonic() + timeout
        msg = memory.wait_here(self, deadline)
        if msg is not None:
            return msg
        if inbox:
            return inbox.take()
        if self._watcher is not None:  # a thread receives for this end (fileno() was used)
            return self._watcher.next(deadline)
        channel = self._connect()
        while not inbox:
            network.pull(channel, deadline)
        return inbox.take()

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
        op, parts = self._take()
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
        op, parts = self._take()
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
            msg = self._take() if timeout is None else self._next(timeout)
        except TransportTimeout:
            return False
        except EOFError:
            return True  # as multiprocessing: readable at EOF, recv() raises
        self._inbox.put_back(msg)
        return True

    def fileno(self) -> int:
        """A descriptor that is readable while a message (or the end of the pipe) waits, for
        ``select``, ``selectors`` and ``multiprocessing.connection.wait``; using it starts
        a thread that receives for this end."""
        self._check_closed()
        with self._lock:
            fd, made = self._inbox.descriptor()
            if made:
                self._network.line = None  # a thread receives for this end from now on
            if made and self._readable:
                ref = weakref.ref(self)
                self._watcher = Watcher(f"fiber-pipe-{self._pipe_id[:8]}-watch", self._inbox, self._network,
                                        lambda: _end(ref)._connect(), lambda: _gone(ref),
                                        lambda: _local_home_of(ref))
        return fd

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

    def __del__(self) -> None:
        """An end dropped without close() lets go of its socket, thread and the pipe's
        listener, as multiprocessing's Connection closes its handle; what it sent still
        leaves first. Handed to this process's let-go thread: a collection may run on any
        thread, holding any of the locks closing takes (SimpleQueue.put is safe there)."""
        try:
            if not self._closed and self._pid == os.getpid():
                self._dropped = True
                _dropped.put(self)
        except Exception:  # interpreter shutdown, a half-made end: nothing left to let go
            pass

    def _close(self, flush_timeout: float | None) -> None:
        """Close this end; ``flush_timeout`` None: without waiting (an end being collected)."""
        if self._closed:
            return
        network = self._network
        network.line = None
        if self._pid != os.getpid():
            self._forked()
        local = memory.local_peer(self)
        network.say_close(flush_timeout, self._writable)
        self._closed = True
        if local is not None:
            memory.wake_reader(local)
        watcher = self._watcher
        if flush_timeout is None and watcher is not None and watcher.thread is not threading.current_thread():
            # Collected: its receiving thread stops before the socket closes (a read on a
            # closed socket's number may reach the file that reused it). It looks within its step.
            if network.channel is not None:
                network.channel.wake()
            watcher.thread.join(2.0)
        self._inbox.close()
        home = home_of(self._pipe_id, self._creator_pid) if self._home_share else None
        # no copy elsewhere can still write: the reader sees EOF
        let_go = functools.partial(_let_go, network, home, None if self._pickled else self._side)
        sender = network.sender
        if flush_timeout is None and sender is not None:
            _finishing.add(sender)
            sender.finish(functools.partial(_finished, sender, let_go))
        else:
            let_go()

    def _check_closed(self) -> None:
        if self._closed:
            raise OSError("handle is closed")

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        local = memory.local_peer(self)
        self._pickled = True
        if local is not None and self._inbox:
            # Sent to this end in memory but not read: the copy being made must get them,
            # so the other end sends them again, over the network, before anything else.
            peer = local[1]
            for op, parts in self._inbox.drain():
                peer._send(op, parts)
        return (_rebuild, (self._pipe_id, self._address, self._creator_pid, self._readable,
                           self._writable, self._side, credentials_for_child()))

    def __repr__(self) -> str:
        return f"<fibercore Connection {self._address} {'closed' if self._closed else 'open'}>"


def _drop_lines_in_child() -> None:
    """A forked child's ends hold the parent's sockets: their lines go (the layers notice
    the fork on first use)."""
    for conn in list(_open):
        conn._network.line = None


os.register_at_fork(after_in_child=_drop_lines_in_child)


def _twin_writes_here(pipe_id: str, creator_pid: int, side: int) -> bool:
    """The other end of end ``side`` is open in this (the creating) process and wrote through
    it. An end the creator never wrote through counts as handed off: its copy elsewhere decides."""
    home = home_of(pipe_id, creator_pid)
    twin = home.end(1 - side) if home is not None else None
    return twin is not None and not twin._closed and twin._writable and twin._wrote_here


def _end(ref: weakref.ref[Connection]) -> Connection:
    conn = ref()
    if conn is None:
        raise OSError("handle is closed")
    return conn


def _local_home_of(ref: weakref.ref[Connection]) -> PipeHome | None:
    conn = ref()
    return conn._local_home() if conn is not None else None


def _gone(ref: weakref.ref[Connection]) -> bool:
    conn = ref()
    return conn is None or conn._closed


#: Ends collected unclosed, for the let-go thread (resurrected until it closed them).
_dropped: queue.SimpleQueue[Connection] = queue.SimpleQueue()
#: The process whose let-go thread runs (a forked child starts its own with its first end).
_let_go_pid = 0
_let_go_start = threading.Lock()


def _start_letting_go(pid: int) -> None:
    global _let_go_pid
    with _let_go_start:
        if _let_go_pid != pid:
            _let_go_pid = pid
            threading.Thread(target=_letting_go, name="fiber-let-go", daemon=True).start()


def _letting_go() -> None:
    """Close the ends dropped unclosed, without waiting for what they still send."""
    while True:
        conn = _dropped.get()
        try:
            conn._close(None)
        except Exception:
            pass
        del conn


#: Senders of ends collected unclosed that still send what was queued (exit waits for them).
_finishing: set[Sender] = set()


def _finished(sender: Sender, let_go: Any) -> None:
    _finishing.discard(sender)
    let_go()


def _let_go_afresh_in_child() -> None:
    """A forked child lets go of its own ends only: the parent's queue of dropped ends, its
    finishing senders (their threads are not here) and its start lock are not the child's."""
    global _dropped, _finishing, _let_go_start
    _dropped = queue.SimpleQueue()
    _finishing = set()
    _let_go_start = threading.Lock()


os.register_at_fork(after_in_child=_let_go_afresh_in_child)


def _let_go(network: NetworkPath, home: PipeHome | None, closed_side: int | None) -> None:
    """The end's last steps once what it sent left: its dialled socket, its part of the home."""
    network.release()
    if home is not None:
        if closed_side is not None:
            home.side_closed(closed_side)
        home.channel.wake()  # a reader of the home (the other end, this one's watcher) looks
        home.release()


def _peer_gone(ref: weakref.ref[Connection], inbox: Inbox) -> bool:
    """Whether a send that waits may give up: the other process left, or this end was
    closed (its flush ran out of time). An end dropped unclosed still sends all it queued."""
    if inbox.eof:
        return True
    conn = ref()
    return conn is not None and conn._closed and not conn._dropped


def _rebuild(pipe_id: str, address: str, creator_pid: int, readable: bool, writable: bool,
             side: int, credentials: tuple[str, bytes] | None = None) -> Connection:
    adopt_credentials(credentials)
    return Connection(pipe_id, address, creator_pid, readable, writable, side)


def Pipe(duplex: bool = True) -> tuple[Connection, Connection]:
    """A pair of connected ends; with ``duplex=False``, (receive-only, send-only)."""
    home = PipeHome()
    pid = os.getpid()
    if duplex:
        ends = (Connection(home.id, home.address, pid, side=0),
                Connection(home.id, home.address, pid, side=1))
    else:
        ends = (Connection(home.id, home.address, pid, writable=False, side=0),
                Connection(home.id, home.address, pid, readable=False, side=1))
    home.ends = [weakref.ref(ends[0]), weakref.ref(ends[1])]
    for end in ends:
        end._home_share = True
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
        if conn._network.sender is not None and not conn._closed:
            try:
                conn._close(max(0.0, deadline - time.monotonic()))
            except Exception:
                pass
    for sender in list(_finishing):  # ends collected unclosed: what they sent leaves too
        sender.flush(max(0.0, deadline - time.monotonic()))
