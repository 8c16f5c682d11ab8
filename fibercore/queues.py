"""``SimpleQueue``, ``Queue`` and ``JoinableQueue`` shared by any number of jobs.

A queue lives in a broker in the process that created it; every other process
talks to the broker over one authenticated ``router`` connection::

    writer process                    creator process                     reader process
    put() ─▶ Sender thread ═PUT═▶  broker: receiver thread ─▶ items  ◀═GET(want)═ get()
            (batches items)                dispatcher thread ═ITEMS═▶ buffer ─▶ get()
                                           ◀═RETURN══ (on RECALL)

Exactly once, with batching:
  1. writers pack many items per frame (``put`` returns at once, as mp's feeder);
  2. a reader asks for items when its local buffer is empty; the broker grants a
     fair share (enough to amortise a round trip, never more than half of the
     backlog per reader) and keeps them *leased* to that reader;
  3. the reader acknowledges what it consumed in its next request (or, after
     ``QUIET`` seconds without one, from its background thread);
  4. when another reader waits on an empty queue, the broker RECALLs leased but
     unconsumed items, and the holder RETURNs them (they go back to the front);
  5. a reader whose connection drops has its unacknowledged items put back.
The creator's own ``put``/``get`` touch the broker directly (no network).
``qsize()`` counts queued and leased items, so it is exact when readers are idle.
A queue lives as long as the process that created it.
"""

from __future__ import annotations

import atexit
import itertools
import math
import os
import queue as _stdlib_queue
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from fibercore.errors import SerializationError, TransportClosed, TransportTimeout
from fibercore.lifetime import PerProcess, at_process_end, current_pid
from fibercore.runtime import adopt_credentials, credentials_for_child, get_runtime
from fibercore.serialization import dumps_or_explain
from fibercore.wire import Sender, malformed
from fibercore.wire.frames import nbytes

Empty = _stdlib_queue.Empty
Full = _stdlib_queue.Full

(PUT, PUTSYNC, PUTACK, CANCEL, CANCELLED, GET, ITEM, EMPTY, RECALL, RETURN, SIZE, SIZEIS,
 TASKDONE, JOIN, JOINED) = range(1, 16)

#: Most items, and bytes (at least one item), a reader is lent per request. A grant is one
#: frame: 1 MiB ones measured 1.5-1.9x the rate of 4 MiB ones for 10-1,000 KB items (a frame
#: over the transport's record size is joined from pieces, and a reader's fresh multi-MiB
#: buffer costs a page fault per page).
MAX_GRANT = 4096
GRANT_BYTES = 1 << 20
_brokers: dict[str, _Broker] = {}
_clients: PerProcess[str, _Client] = PerProcess()  # by queue id


def _size(parts: list[Any]) -> int:
    return sum(nbytes(p) for p in parts)


def _int(part: Any) -> int:
    return int(bytes(part))


def _b(n: int) -> bytes:
    return str(n).encode()


class _Reader:
    __slots__ = ("leased", "acked", "recalled")

    def __init__(self) -> None:
        self.leased: deque[list[Any]] = deque()
        self.acked = 0
        self.recalled = False


class _Broker:
    """The queue's state, in the creating process."""

    def __init__(self, qid: str, maxsize: int) -> None:
        rt = get_runtime()
        self.qid = qid
        self.maxsize = maxsize
        self.cv = threading.Condition(threading.Lock())
        self.items: deque[list[Any]] = deque()
        self.unfinished = 0
        self.readers: dict[Hashable, _Reader] = {}
        self.waiting: deque[tuple[Hashable, int, bool]] = deque()
        self.local_getters = 0
        self.pending_puts: deque[tuple[Hashable, bytes, list[Any]]] = deque()
        self.join_waiters: list[tuple[Hashable, bytes]] = []
        self.outbox: list[tuple[Hashable, list[Any]]] = []
        # Bytes of items held here (queued or leased to a reader that has not acknowledged
        # them); above the budget, remote writers are paused and local puts block.
        self.held = 0
        self.budget = int(rt.config.get("queue_max_bytes"))
        self.paused: set[Hashable] = set()
        self.channel = rt.listen("router", service="queue")
        self.address = self.channel.address
        self.channel.on_peer_event(self._peer_event)
        self.closed = False
        self.peers = 0
        self.departed: deque[tuple[Hashable, float]] = deque()
        self.sending = False  # a thread sends replies (one at a time, in the order they were made)
        self._ready: tuple[int, int] | None = None  # a pipe readable while items wait (ready_fd)
        self._ready_set = False
        threading.Thread(target=self._receive, name=f"fiber-queue-{qid[:8]}-in", daemon=True).start()
        threading.Thread(target=self._dispatch, name=f"fiber-queue-{qid[:8]}-out", daemon=True).start()

    # -- helpers (cv held) ------------------------------------------------------------------
    def _grant(self, want: int) -> int:
        readers = max(1, len(self.readers) + self.local_getters)
        share = math.ceil(len(self.items) / (2 * readers))
        return max(1, min(want, share, MAX_GRANT))

    def _leased_count(self) -> int:
        return sum(len(r.leased) for r in self.readers.values())

    def _room(self) -> bool:
        return self.maxsize <= 0 or len(self.items) + self._leased_count() < self.maxsize

    def _append(self, parts: list[Any]) -> None:
        self.items.append(parts)
        self.held += _size(parts)
        self.unfinished += 1
        if self._ready is not None:
            self._sync_ready()

    def _released(self, parts: list[Any]) -> None:
        """An item left this process for good: below half the budget, paused writers resume."""
        self.held -= _size(parts)
        if self.paused and self.held <= self.budget // 2:
            for peer in self.paused:
                self.channel.resume(peer)
            self.paused.clear()

    def _ack(self, reader: _Reader, consumed_total: int) -> None:
        for _ in range(consumed_total - reader.acked):
            if reader.leased:
                self._released(reader.leased.popleft())
        reader.acked = max(reader.acked, consumed_total)

    def _admit_puts(self) -> None:
        while self.pending_puts and self._room():
            peer, req, parts = self.pending_puts.popleft()
            self._append(parts)
            self.outbox.append((peer, [(PUTACK, [req])]))

    def _recall(self, exclude: Hashable | None) -> None:
        for peer, reader in self.readers.items():
            if peer is not exclude and not reader.recalled and len(reader.leased) > 0:
                reader.recalled = True
                self.outbox.append((peer, [(RECALL, [])]))

    def _changed(self) -> None:
        self._sync_ready()
        self.cv.notify_all()

    def ready_fd(self) -> int:
        """A descriptor that is readable while items wait here (``multiprocessing.connection.wait``
        on ``Queue._reader``, as ``concurrent.futures`` does on its result queue)."""
        with self.cv:
            if self._ready is None:
                r, w = os.pipe()
                os.set_blocking(r, False)
                self._ready, self._ready_set = (r, w), False
                self._sync_ready()
            return self._ready[0]

    def _sync_ready(self) -> None:
        """Keep the ready descriptor's level equal to "items are here" (cv held)."""
        if self._ready is None or bool(self.items) == self._ready_set:
            return
        if self.items:
            os.write(self._ready[1], b"x")
        else:
            try:
                os.read(self._ready[0], 1)
            except BlockingIOError:
                pass
        self._ready_set = bool(self.items)

    # -- local operations (the creating process) --------------------------------------------
    def put_local(self, parts: list[Any], block: bool, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cv:
            while not self._room() or self.held >= self.budget:
                if not block:
                    raise Full
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Full
                self.cv.wait(remaining)
            self._append(parts)
            sends: list[tuple[Hashable, list[Any]]] = []
            if self.waiting or self.local_getters:  # wake only who waits for an item
                # A remote reader waits: answer it from this thread (as the receive thread
                # does), not through a hand-off to the dispatch thread.
                sends = self._sends_for_this_thread() if self.waiting else []
                self._changed()
        if sends:
            self._send_replies(sends, block=False)

    def get_local(self, block: bool, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cv:
            if not self.items:
                if not block:
                    raise Empty
                self.local_getters += 1
                try:
                    while not self.items:
                        self._recall(None)
                        self._changed()
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise Empty
                        self.cv.wait(remaining)
                finally:
                    self.local_getters -= 1
            parts = self.items.popleft()
            self._released(parts)
            self._admit_puts()
            self._changed()
            return parts

    def task_done_local(self, n: int = 1) -> None:
        with self.cv:
            self._task_done(n)

    def _task_done(self, n: int) -> None:
        self.unfinished = max(0, self.unfinished - n)
        if self.unfinished == 0:
            for peer, req in self.join_waiters:
                self.outbox.append((peer, [(JOINED, [req])]))
            self.join_waiters.clear()
        self._changed()

    def join_local(self) -> None:
        with self.cv:
            while self.unfinished:
                self.cv.wait()

    def qsize_local(self) -> int:
        with self.cv:
            return len(self.items) + self._leased_count()

    # -- network -----------------------------------------------------------------------------
    def _peer_event(self, peer: Hashable, added: bool) -> None:
        with self.cv:
            self.peers += 1 if added else -1
            if not added:
                # Frames the peer sent before leaving may still be queued in the
                # transport: settle its leases a little later, in the receive thread.
                self.departed.append((peer, time.monotonic()))

    def _settle_departed(self) -> None:
        now = time.monotonic()
        while self.departed and now - self.departed[0][1] > 0.3:
            peer, _ = self.departed.popleft()
            self._forget_peer(peer)

    def _forget_peer(self, peer: Hashable) -> None:
        with self.cv:
            reader = self.readers.pop(peer, None)
            if reader is not None:
                self.items.extendleft(reversed(reader.leased))
            self.waiting = deque(w for w in self.waiting if w[0] is not peer)
            self.pending_puts = deque(p for p in self.pending_puts if p[0] is not peer)
            self.join_waiters = [j for j in self.join_waiters if j[0] is not peer]
            self._changed()

    def _receive(self) -> None:
        while True:
            if self.departed:
                self._settle_departed()
            try:
                messages, peer = self.channel.recv(timeout=0.25)
            except TransportTimeout:
                if self.closed and self.peers <= 0 and not self.departed:
                    self.channel.close()
                    return
                continue
            except TransportClosed:
                return
            with self.cv:
                for op, parts in messages:
                    try:
                        self._handle(op, parts, peer)
                    except Exception as exc:  # authentic but malformed: counted and skipped
                        malformed(self.address, peer, op, exc)
                if self.held > self.budget and peer not in self.paused and any(op == PUT for op, _ in messages):
                    # A writer beyond the byte budget: stop reading its connection (its puts
                    # then block, as on a full queue) until readers take items out.
                    self.paused.add(peer)
                    self.channel.pause(peer)
                # Answer at once from this thread when no other is sending (a hand-off to
                # the dispatch thread costs a GIL switch, up to 5 ms in a busy process).
                sends = self._sends_for_this_thread()
                self._changed()
            if sends:
                self._send_replies(sends, block=False)

    def _handle(self, op: int, parts: list[Any], peer: Hashable) -> None:
        if op == PUT:
            self._append(parts)
        elif op == GET:
            reader = self.readers.get(peer)
            if reader is None:
                reader = self.readers[peer] = _Reader()
            self._ack(reader, _int(parts[1]))
            self.waiting.append((peer, _int(parts[0]), parts[2] == b"1"))
        elif op == RETURN:
            reader = self.readers.get(peer)
            if reader is not None:
                self._ack(reader, _int(parts[0]))
                n = min(_int(parts[1]), len(reader.leased))
                back = [reader.leased.pop() for _ in range(n)]
                self.items.extendleft(back)  # popped last-first: extendleft restores order
                reader.recalled = False
        elif op == PUTSYNC:
            self.pending_puts.append((peer, bytes(parts[0]), parts[1:]))
            self._admit_puts()
        elif op == CANCEL:
            original = bytes(parts[1])
            before = len(self.pending_puts)
            self.pending_puts = deque(p for p in self.pending_puts if not (p[0] is peer and p[1] == original))
            done = b"1" if len(self.pending_puts) < before else b"0"
            self.outbox.append((peer, [(CANCELLED, [bytes(parts[0]), done])]))
        elif op == SIZE:
            reader = self.readers.get(peer)
            if reader is not None:
                self._ack(reader, _int(parts[1]))
            self.outbox.append((peer, [(SIZEIS, [bytes(parts[0]), _b(len(self.items) + self._leased_count())])]))
        elif op == TASKDONE:
            self._task_done(_int(parts[0]))
        elif op == JOIN:
            if self.unfinished == 0:
                self.outbox.append((peer, [(JOINED, [bytes(parts[0])])]))
            else:
                self.join_waiters.append((peer, bytes(parts[0])))

    def _dispatch(self) -> None:
        """Serve waiting readers and send replies that the receive thread could not send
        without waiting (a reader whose socket is full), and those of local operations."""
        while True:
            with self.cv:
                while True:
                    if self.waiting and not self.items:
                        self._recall(None)
                    if not self.sending and (self.outbox or (self.waiting and (self.items or self._nowait_pending()))):
                        break
                    if self.closed and self.peers <= 0:
                        return
                    self.cv.wait(1.0)
                sends = self._take_sends()
                self.sending = True
            self._send_replies(sends, block=True)

    def _send_replies(self, sends: list[tuple[Hashable, list[Any]]], block: bool) -> None:
        """Send replies in order (one thread at a time: ``sending``); without ``block``,
        what cannot go now goes back to the front of the outbox, for the dispatch thread."""
        for i, (peer, messages) in enumerate(sends):
            try:
                self.channel.send(messages, peer, block=block)
            except TransportTimeout:
                with self.cv:
                    self.outbox[:0] = sends[i:]
                    self.sending = False
                    self._changed()
                return
            except Exception:  # the peer left; its leases come back via _peer_event
                pass
        with self.cv:
            self.sending = False
            if self.outbox:
                self._changed()

    def _sends_for_this_thread(self) -> list[tuple[Hashable, list[Any]]]:
        """Replies this thread may send itself, with ``block=False`` (cv held): none while
        another thread sends (replies leave in the order they were made)."""
        sends = [] if self.sending else self._take_sends()
        if sends:
            self.sending = True
        return sends

    def _take_sends(self) -> list[tuple[Hashable, list[Any]]]:
        """Replies due now (cv held): the outbox, then batches for the waiting readers."""
        if self.waiting and not self.items:
            self._recall(None)
        sends = self.outbox
        self.outbox = []
        while self.waiting and (self.items or self.waiting[0][2]):
            peer, want, nowait = self.waiting.popleft()
            reader = self.readers.get(peer)
            if reader is None:
                continue
            if not self.items:
                sends.append((peer, [(EMPTY, [])]))
                continue
            batch: list[list[Any]] = []
            size = 0
            for _ in range(self._grant(want)):
                if batch and size >= GRANT_BYTES:
                    break
                batch.append(self.items.popleft())
                size += _size(batch[-1])
            reader.leased.extend(batch)
            sends.append((peer, [(ITEM, parts) for parts in batch]))
        self._admit_puts()
        return sends

    def _nowait_pending(self) -> bool:
        return any(w[2] for w in self.waiting)


#: Seconds without a thread waiting on a queue client before its background thread reads
#: the connection (while threads wait, one of them reads it: no hand-off per item).
QUIET = 0.05


class _Client:
    """One process's connection to a remote broker (shared by every handle of the queue).

    Whoever waits for the broker (a ``get``, a request) receives on the connection itself,
    one thread at a time; a background thread reads it only after :data:`QUIET` seconds
    without a waiting thread, so that RECALLs are answered while the process does other
    things, and what it consumed is acknowledged (a ``get`` leaves that to the next request).
    """

    def __init__(self, address: str, qid: str) -> None:
        rt = get_runtime()
        self.channel = rt.dial("router", address, service="queue")
        self.sender = Sender(self.channel, name=f"fiber-queue-{qid[:8]}-feed")
        self.cv = threading.Condition(threading.Lock())
        self.buffer: deque[list[Any]] = deque()
        self.consumed = 0
        self.outstanding = False
        self.empty_reply = False
        self.replies: dict[bytes, list[Any]] = {}
        self.req = itertools.count(1)
        self.closed = False
        self.gets = 0
        self.dones = 0
        self.last_grant = 0  # items in the latest batch: the next is asked for at half of it
        self.wrote = False
        self.reading = False  # a thread receives on the connection
        self.waiters = 0  # threads waiting for the broker
        self.quiet_since = time.monotonic()  # when the last of them stopped waiting
        self.owe_ack = False  # items consumed that the broker has not been told of
        self.lost = False  # the connection ended
        threading.Thread(target=self._background, name=f"fiber-queue-{qid[:8]}-recv", daemon=True).start()

    def _file(self, messages: list[tuple[int, list[Any]]]) -> None:
        """What the broker sent (cv held)."""
        granted = sum(1 for op, _ in messages if op == ITEM)
        if granted:
            self.last_grant = granted
        for op, parts in messages:
            if op == ITEM:
                self.buffer.append(parts)
                self.outstanding = False
            elif op == EMPTY:
                self.outstanding = False
                self.empty_reply = True
            elif op == RECALL:
                n = len(self.buffer)
                self.buffer.clear()
                self.owe_ack = False
                self.sender.put((RETURN, [_b(self.consumed), _b(n)]))
            elif op in (PUTACK, SIZEIS, JOINED, CANCELLED):
                self.replies[bytes(parts[0])] = [op, *parts[1:]]

    def _receive_once(self, timeout: float | None) -> None:
        """Receive one frame, with the cv released meanwhile (cv held on entry and exit)."""
        self.reading = True
        self.cv.release()
        messages = None
        try:
            messages, _ = self.channel.recv(timeout=timeout)
        except TransportTimeout:
            pass
        except TransportClosed:
            self.lost = True
        finally:
            self.cv.acquire()
            self.reading = False
        if messages:
            self._file(messages)
        self.cv.notify_all()  # what came, and the reading is free again

    def _wait(self, done: Callable[[], bool], deadline: float | None) -> bool:
        """Until ``done()`` (cv held): receive on the connection while no other thread does,
        else wait for the one that does. False once ``deadline`` passed."""
        self.waiters += 1
        try:
            while not done():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                if not self.reading and not self.lost:
                    self._receive_once(remaining)
                else:
                    self.cv.wait(remaining)
            return True
        finally:
            self.waiters -= 1
            if not self.waiters:
                self.quiet_since = time.monotonic()
                self.cv.notify_all()

    def _background(self) -> None:
        with self.cv:
            while not self.lost:
                if self.waiters or self.reading:
                    self.cv.wait()
                    continue
                quiet = time.monotonic() - self.quiet_since
                if quiet < QUIET:
                    self.cv.wait(QUIET - quiet)
                    continue
                if self.owe_ack and not self.outstanding:
                    self.owe_ack = False
                    self.sender.put((RETURN, [_b(self.consumed), _b(0)]))
                self._receive_once(1.0)

    def request(self, op: int, extra: list[Any], timeout: float | None,
                req: bytes | None = None) -> list[Any] | None:
        req = req or _b(next(self.req))
        self.sender.put((op, [req, *extra]))
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cv:
            if not self._wait(lambda: req in self.replies, deadline):
                return None
            return self.replies.pop(req)

    def get(self, block: bool, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cv:
            self.empty_reply = False
            if not block and not self.buffer and self.outstanding:
                raise Empty  # a blocking request is already out; nothing has arrived
            while not self.buffer:
                if not self.outstanding:
                    self.sender.put((GET, [_b(MAX_GRANT), _b(self.consumed), b"0" if block else b"1"]))
                    self.outstanding = True
                    self.owe_ack = False  # the request carries it
                if not block and self.empty_reply:
                    raise Empty
                if deadline is not None and time.monotonic() >= deadline:
                    raise Empty
                self._wait(lambda: bool(self.buffer) or not self.outstanding or self.empty_reply,
                           deadline if block or deadline is not None else time.monotonic() + 5.0)
            parts = self.buffer.popleft()
            self.consumed += 1
            self.gets += 1
            if not self.buffer and not self.outstanding:
                # The last item lent to this process is taken: the broker learns it with the
                # next request, or from the background thread within QUIET seconds, so that
                # the queue's creator sees it empty, as multiprocessing's would be once
                # another process took everything.
                self.owe_ack = True
            if block and not self.outstanding and self.buffer and len(self.buffer) <= self.last_grant // 2:
                # Ask for the next batch when half of this one is left: the round trip to
                # the broker (slow when its process is busy: a GIL switch per reply)
                # overlaps with consuming what is here (items stay leased, so a waiting
                # reader elsewhere still gets its share through RECALL).
                self.sender.put((GET, [_b(MAX_GRANT), _b(self.consumed), b"0"]))
                self.outstanding = True
                self.owe_ack = False
            return parts

    def give_back(self) -> None:
        """Return unconsumed items and flush pending puts (process exit, close)."""
        with self.cv:
            n = len(self.buffer)
            self.buffer.clear()
            if n or self.consumed:
                try:
                    self.sender.put((RETURN, [_b(self.consumed), _b(n)]))
                except TransportClosed:
                    pass
        self.sender.flush(timeout=10.0)
        if self.wrote:
            self.wrote = False
            # A round trip proves the broker has taken every item this process put, so
            # that (as with multiprocessing) a process's puts are in the queue once it exited.
            self.request(SIZE, [_b(self.consumed)], 10.0)


def _client(address: str, qid: str) -> _Client:
    """This process's connection to the broker of queue ``qid``."""
    client = _clients.peek(qid)  # every get/put asks: no closure made on that path
    if client is not None:
        return client

    def make() -> _Client:
        at_process_end(_at_exit)
        return _Client(address, qid)

    return _clients.get(qid, make)


@atexit.register
def _at_exit() -> None:
    for client in _clients.here():
        client.give_back()


class Queue:
    """A FIFO queue shared by processes on any backend (``multiprocessing.Queue`` API)."""

    def __init__(self, maxsize: int = 0, *, ctx: Any = None) -> None:
        if maxsize < 0:
            raise ValueError("maxsize must be >= 0")
        self._maxsize = maxsize
        self._qid = uuid.uuid4().hex
        broker = _Broker(self._qid, maxsize)
        _brokers[self._qid] = broker
        self._address = broker.address
        self._creator = os.getpid()
        self._closed = False
        self._finalizer = weakref.finalize(self, _release, self._qid)

    # -- plumbing -----------------------------------------------------------------------------
    def _local(self) -> _Broker | None:
        return _brokers.get(self._qid) if current_pid() == self._creator else None

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self._qid, self._address, self._creator, self._maxsize,
                           credentials_for_child()))

    def _dumps(self, obj: Any) -> list[Any]:
        return dumps_or_explain(get_runtime().serializer, obj, "an object through a Queue")

    @property
    def _reader(self) -> _ReadyReader:
        """multiprocessing's ``Queue._reader`` as ``concurrent.futures`` uses it: waitable with
        ``multiprocessing.connection.wait`` and ``recv()`` an item (in the creating process)."""
        broker = self._local()
        if broker is None:
            raise AttributeError("Queue._reader exists in the process that created the queue only")
        return _ReadyReader(self, broker.ready_fd())

    def _check_closed(self) -> None:
        if self._closed:
            raise ValueError(f"Queue {self!r} is closed")

    # -- the multiprocessing API ------------------------------------------------------------------
    def put(self, obj: Any, block: bool = True, timeout: float | None = None) -> None:
        self._check_closed()
        try:
            parts = self._dumps(obj)
        except SerializationError:
            # As multiprocessing's feeder thread: the object is dropped, the error printed,
            # and the queue keeps working (put() itself does not raise there).
            import traceback

            traceback.print_exc()
            return
        broker = self._local()
        if broker is not None:
            broker.put_local(parts, block, timeout)
            return
        client = _client(self._address, self._qid)
        client.wrote = True
        if self._maxsize <= 0:
            client.sender.put((PUT, parts))
            return
        wait = None if block and timeout is None else (timeout if block else 0.05)
        req = _b(next(client.req))
        reply = client.request(PUTSYNC, parts, wait, req=req)
        if reply is None:  # no room in time: take the put back unless it already landed
            result = client.request(CANCEL, [req], None)
            if result is not None and bytes(result[1]) == b"1":
                raise Full
            with client.cv:  # raced: it was admitted meanwhile, so the put succeeded
                client.replies.pop(req, None)

    def put_nowait(self, obj: Any) -> None:
        self.put(obj, False)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        self._check_closed()
        if timeout is not None and timeout < 0:
            raise ValueError("'timeout' must be a non-negative number")
        broker = self._local()
        if broker is not None:
            parts = broker.get_local(block, timeout)
        else:
            client = _client(self._address, self._qid)
            parts = client.get(block, timeout)
        return get_runtime().serializer.loads(parts)

    def get_nowait(self) -> Any:
        return self.get(False)

    def qsize(self) -> int:
        """Items queued or handed to readers and not yet consumed."""
        broker = self._local()
        if broker is not None:
            return broker.qsize_local()
        client = _client(self._address, self._qid)
        client.sender.flush()
        reply = client.request(SIZE, [_b(client.consumed)], None)
        assert reply is not None
        return int(bytes(reply[1])) - len(client.buffer)

    def empty(self) -> bool:
        broker = self._local()
        if broker is None:
            client = _client(self._address, self._qid)
            if client.buffer:
                return False
        return self.qsize() <= 0

    def full(self) -> bool:
        return self._maxsize > 0 and self.qsize() >= self._maxsize

    def close(self) -> None:
        """No more puts from this process; what was put is still delivered."""
        self._closed = True
        client = _clients.peek(self._qid)
        if client is not None:
            client.sender.flush(timeout=10.0)

    def join_thread(self) -> None:
        """Wait until everything this process put has been handed to the broker."""
        if not self._closed:
            raise AssertionError("Queue.join_thread() requires close() first")
        client = _clients.peek(self._qid)
        if client is not None:
            client.sender.flush()

    def cancel_join_thread(self) -> None:
        """Compatibility: puts are flushed at exit with a bounded wait."""

    def __repr__(self) -> str:
        return f"<fibercore.{type(self).__name__} {self._address} maxsize={self._maxsize}>"


class _ReadyReader:
    """A queue's read side as a connection-like object (``fileno``, ``poll``, ``recv``)."""

    def __init__(self, queue: Queue, fd: int) -> None:
        self._queue, self._fd = queue, fd

    def fileno(self) -> int:
        return self._fd

    def poll(self, timeout: float | None = 0.0) -> bool:
        import select

        return bool(select.select([self._fd], [], [], timeout)[0])

    def recv(self) -> Any:
        return self._queue.get()

    def close(self) -> None:
        pass


class JoinableQueue(Queue):
    """A Queue with ``task_done()`` and ``join()``."""

    def task_done(self) -> None:
        broker = self._local()
        if broker is not None:
            with broker.cv:
                if broker.unfinished <= 0:
                    raise ValueError("task_done() called too many times")
                broker._task_done(1)
            return
        client = _client(self._address, self._qid)
        if client.dones >= client.gets:
            raise ValueError("task_done() called too many times")
        client.dones += 1
        client.sender.put((TASKDONE, [b"1"]))

    def join(self) -> None:
        broker = self._local()
        if broker is not None:
            broker.join_local()
            return
        _client(self._address, self._qid).request(JOIN, [], None)


class SimpleQueue(Queue):
    """An unbounded queue with ``get``, ``put``, ``empty`` and ``close`` only."""

    def __init__(self, *, ctx: Any = None) -> None:
        super().__init__(0)

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self._qid, self._address, self._creator, 0, credentials_for_child()))


def _rebuild(cls: type[Queue], qid: str, address: str, creator: int, maxsize: int,
             credentials: tuple[str, bytes] | None = None) -> Queue:
    adopt_credentials(credentials)
    q = cls.__new__(cls)
    q._qid, q._address, q._creator, q._maxsize, q._closed = qid, address, creator, maxsize, False
    return q


def _release(qid: str) -> None:
    broker = _brokers.pop(qid, None)
    if broker is not None:
        broker.closed = True
