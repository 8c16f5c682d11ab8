"""A process's connection to a queue's broker in another process (shared by every handle
of that queue in the process): gets with a local buffer of leased items, puts through a
sender thread that batches them, bounded puts, and the requests (size, join)."""

from __future__ import annotations

import atexit
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.lifetime import PerProcess, at_process_end
from fibercore.queues.protocol import (
    ACK,
    ACK_EVERY,
    CANCEL,
    CANCELLED,
    COUNT,
    COUNTED,
    DONE,
    EMPTY,
    GET,
    INTRO,
    ITEM,
    JOIN,
    JOINED,
    MAX_GRANT,
    PUT,
    PUTACK,
    PUTSYNC,
    QUIET,
    RECALL,
    RETURN,
    SIZE,
    SIZEIS,
    TASKDONE,
    Empty,
    Full,
    intro,
    item_bytes,
    read_u64,
    u64,
)
from fibercore.runtime import get_runtime
from fibercore.wire import Sender

#: This process's clients, by queue id.
clients: PerProcess[str, Client] = PerProcess()


class Client:
    """One process's connection to a remote broker (shared by every handle of the queue).

    Whoever waits for the broker (a ``get``, a request) receives on the connection itself,
    one thread at a time; a background thread reads it only after :data:`QUIET` seconds
    without a waiting thread, so that RECALLs are answered while the process does other
    things, and what it consumed is acknowledged (a ``get`` leaves that to the next request).
    """

    def __init__(self, address: str, qid: str, maxsize: int = 0) -> None:
        rt = get_runtime()
        self.channel = rt.dial("router", address, service="queue")
        self.channel.send([(INTRO, [intro()])])  # who this is, should its job be declared lost
        self.sender = Sender(self.channel, name=f"fiber-queue-{qid[:8]}-feed")
        self._lock = lock = threading.Lock()  # ``with self._lock`` on hot paths: a C call, not Condition's
        self.cv = threading.Condition(lock)  # threads waiting for the broker
        # The background thread's own condition, so that a reply filed for a waiting
        # thread does not wake it too (it looks again every QUIET seconds while others wait).
        self.quiet = threading.Condition(lock)
        self.buffer: deque[list[Any]] = deque()
        self.consumed = 0
        self.outstanding = False  # a GET is out, not answered yet
        self.standing = False  # ... and it is a standing one (items come until DONE)
        self.stood = False  # ... that the broker answered and kept open: items come as put
        self.acked = 0  # ``consumed`` as the broker last heard it
        # Until the broker hears of them, consumed items count as held there, toward maxsize
        # and the byte budget: a put finding no room asks (COUNT), at most every QUIET
        # seconds. A standing GET's reader acknowledges within a quarter of either, so that
        # a queue its reader keeps empty does not make puts wait for that.
        self.ack_every = ACK_EVERY if maxsize <= 0 else max(1, min(ACK_EVERY, maxsize // 4))
        self.ack_bytes = max(1, int(rt.config.get("queue_max_bytes")) // 4)
        self.unacked_bytes = 0  # of the items consumed since ``acked`` was set
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
        self.bg_untimed = False  # the background thread waits for the waiters to finish
        threading.Thread(target=self._background, name=f"fiber-queue-{qid[:8]}-recv", daemon=True).start()

    def _file(self, messages: list[tuple[int, list[Any]]]) -> None:
        """What the broker sent (cv held)."""
        if len(messages) == 1 and messages[0][0] == ITEM:  # the usual frame: one item (a standing GET's)
            self.last_grant = 1
            self.stood = self.standing
            self.buffer.append(messages[0][1])
            self.outstanding = self.standing
            return
        granted = sum(1 for op, _ in messages if op == ITEM)
        if granted:
            self.last_grant = granted
            self.stood = self.standing  # a DONE below ends it
        for op, parts in messages:
            if op == ITEM:
                self.buffer.append(parts)
                self.outstanding = self.standing
            elif op == DONE:  # the standing GET's last answer
                self.outstanding = self.standing = self.stood = False
            elif op == EMPTY:
                self.outstanding = self.standing = self.stood = False
                self.empty_reply = True
            elif op == RECALL:
                n = len(self.buffer)
                self.buffer.clear()
                self.owe_ack = False
                # The RETURN also withdraws a GET still out (the broker lends nothing to a
                # reader it recalled): a getter that waits asks again, behind the others.
                self.outstanding = self.standing = self.stood = False
                self.sender.put((RETURN, [u64(self.consumed), u64(n)]))
                self._heard()
            elif op == COUNT:  # the creator asks its queue's size: say what was taken
                self.sender.put((COUNTED, [bytes(parts[0]), u64(self.consumed)]))
                self._heard()
                self.owe_ack = False
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
        if self.cv._waiters:  # type: ignore[attr-defined]  # CPython's Condition: only if one waits
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
                if self.bg_untimed:  # the background thread waits for this: once per long wait
                    self.bg_untimed = False
                    self.quiet.notify()

    def _background(self) -> None:
        looked = False
        with self.cv:
            while not self.lost:
                if self.waiters or self.reading:
                    # Looked once already and they still wait (a long get): wait for them to
                    # finish instead of looking every QUIET seconds.
                    self.bg_untimed = looked
                    self.quiet.wait(None if looked else QUIET)
                    self.bg_untimed = False
                    looked = True
                    continue
                looked = False
                quiet = time.monotonic() - self.quiet_since
                if quiet < QUIET:
                    self.quiet.wait(QUIET - quiet)
                    continue
                if self.owe_ack and self.stood:
                    self._ack()
                elif self.owe_ack and not self.outstanding:
                    self.owe_ack = False
                    self.sender.put((RETURN, [u64(self.consumed), u64(0)]))
                    self._heard()
                self._receive_once(None)  # until the broker says something, or the end

    def request(self, op: int, extra: list[Any], timeout: float | None,
                req: bytes | None = None) -> list[Any] | None:
        req = req or u64(next(self.req))
        self.sender.put((op, [req, *extra]))
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.cv:
            if not self._wait(lambda: req in self.replies, deadline):
                return None
            return self.replies.pop(req)

    def _ask(self, nowait: bool) -> None:
        """Send a GET (cv held); a blocking one stands: the broker sends items as they come
        until it answers DONE (see :mod:`fibercore.queues.protocol`). It carries the ack."""
        self.sender.put((GET, [u64(MAX_GRANT), u64(self.consumed), u64(nowait), u64(not nowait)]))
        self.outstanding, self.standing, self.stood = True, not nowait, False
        self._heard()
        self.owe_ack = False

    def _heard(self) -> None:
        """The broker was told (or is being told) everything consumed so far (cv held)."""
        self.acked, self.unacked_bytes = self.consumed, 0

    def _ack(self) -> None:
        """Tell the broker what was consumed (cv held; a standing GET's reader)."""
        self.sender.put((ACK, [u64(self.consumed)]))
        self._heard()
        self.owe_ack = False

    def get(self, block: bool, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self.empty_reply = False
            if not block and not self.buffer and self.outstanding:
                raise Empty  # a blocking request is already out; nothing has arrived
            while not self.buffer:
                if not self.outstanding:
                    self._ask(nowait=not block)
                if not block and self.empty_reply:
                    raise Empty
                if deadline is not None and time.monotonic() >= deadline:
                    raise Empty
                if self.stood and self.consumed > self.acked:
                    # The next item usually comes soon (a loop of gets): acknowledge what was
                    # consumed only if it does not come within QUIET seconds, so that the
                    # queue's creator sees the queue empty once this process took everything.
                    quiet = time.monotonic() + QUIET
                    self._wait(lambda: bool(self.buffer) or not self.outstanding,
                               quiet if deadline is None else min(quiet, deadline))
                    if not self.buffer and self.stood and self.consumed > self.acked:
                        self._ack()
                    continue
                self._wait(lambda: bool(self.buffer) or not self.outstanding or self.empty_reply,
                           deadline if block or deadline is not None else time.monotonic() + 5.0)
            parts = self.buffer.popleft()
            self.consumed += 1
            self.gets += 1
            if self.stood:
                # The broker keeps lending as items come, up to its credit: tell it what was
                # consumed every ``ack_every`` items or ``ack_bytes`` bytes (or, idle, after
                # QUIET seconds).
                self.unacked_bytes += item_bytes(parts)
                if self.consumed - self.acked >= self.ack_every or self.unacked_bytes >= self.ack_bytes:
                    self._ack()
                else:
                    self.owe_ack = True  # the background thread tells it after QUIET seconds
            elif not self.buffer and not self.outstanding:
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
                self._ask(nowait=False)
            return parts

    def put(self, parts: list[Any], bounded: bool, block: bool, timeout: float | None) -> None:
        """Put an item: through the sender (returns at once) on an unbounded queue; on a
        bounded one, wait for the broker to admit it (raises Full when there is no room
        within ``timeout``, or at once when not ``block``)."""
        self.wrote = True
        if not bounded:
            self.sender.put((PUT, parts))
            return
        wait = None if block and timeout is None else (timeout if block else 0.05)
        req = u64(next(self.req))
        reply = self.request(PUTSYNC, parts, wait, req=req)
        if reply is None:  # no room in time: take the put back unless it already landed
            result = self.request(CANCEL, [req], None)
            if result is not None and read_u64(result[1]) == 1:
                raise Full
            with self.cv:  # raced: it was admitted meanwhile, so the put succeeded
                self.replies.pop(req, None)

    def qsize(self) -> int:
        """Items queued or lent out and not yet consumed, as the broker counts them, less the
        ones waiting here (what this process put is flushed first)."""
        self.sender.flush()
        reply = self.request(SIZE, [u64(self.consumed)], None)
        assert reply is not None
        return read_u64(reply[1]) - len(self.buffer)

    def task_done(self) -> None:
        if self.dones >= self.gets:
            raise ValueError("task_done() called too many times")
        self.dones += 1
        self.sender.put((TASKDONE, [u64(1)]))

    def join(self) -> None:
        """Wait until every item put has been got and marked done."""
        self.request(JOIN, [], None)

    def give_back(self) -> None:
        """Return unconsumed items and flush pending puts (process exit, close)."""
        with self.cv:
            n = len(self.buffer)
            self.buffer.clear()
            self.outstanding = self.standing = self.stood = False  # the RETURN withdraws a GET
            if n or self.consumed:
                try:
                    self.sender.put((RETURN, [u64(self.consumed), u64(n)]))
                except TransportClosed:
                    pass
        self.sender.flush(timeout=10.0)
        if self.wrote:
            self.wrote = False
            # A round trip proves the broker has taken every item this process put, so
            # that (as with multiprocessing) a process's puts are in the queue once it exited.
            self.request(SIZE, [u64(self.consumed)], 10.0)


def client_for(address: str, qid: str, maxsize: int = 0) -> Client:
    """This process's connection to the broker of queue ``qid`` (of ``maxsize``: 0 unbounded)."""
    client = clients.peek(qid)  # every get/put asks: no closure made on that path
    if client is not None:
        return client

    def make() -> Client:
        at_process_end(_at_exit)
        return Client(address, qid, maxsize)

    return clients.get(qid, make)


@atexit.register
def _at_exit() -> None:
    for client in clients.here():
        client.give_back()


