"""A queue's broker: its items, in the process that created the queue.

Two threads: one receives what clients send (and answers at once when no reply is being
sent), one sends the replies the receiving thread left (grants, RECALLs, acknowledgements).
The creator's own ``put``/``get`` reach the broker directly (:meth:`Broker.put_local`,
:meth:`Broker.get_local`), with no network. Where the transport can wake a waiting receive
(:class:`~fibercore.transport.Wakeable`), a ``get`` of the creator that waits receives on the
channel itself and the receiving thread rests meanwhile: an item from another process then
reaches the getter with no hand-off between threads (one at a time receives, so frames are
handled in the order they came). The rules (leases, grants, recalls, the byte
budget) are in :mod:`fibercore.queues`.
"""

from __future__ import annotations

import itertools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

from fibercore import liveness
from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.observe import registry
from fibercore.queues.protocol import (
    ACK,
    CANCEL,
    CANCELLED,
    COUNT,
    COUNT_WAIT,
    COUNTED,
    DONE,
    EMPTY,
    GET,
    GRANT_BYTES,
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
    STANDING_CREDIT,
    TASKDONE,
    Empty,
    Full,
    item_bytes,
    items_bytes,
    read_intro,
    read_u64,
    u64,
)
from fibercore.runtime import get_runtime
from fibercore.wire import malformed
from fibercore.wire.frames import owned
from fibercore.wire.outbox import Outboxes
from fibercore.wire.sender import BURST_GAP

_clock = time.perf_counter

#: The brokers of the queues this process created, by queue id.
brokers: dict[str, Broker] = {}


#: Seconds a reader's connection may take nothing before the reader is dropped.
STUCK_AFTER = 30.0
#: Bytes of replies a slow reader may have waiting (at least: the queue's byte budget).
OUTBOX_BYTES = 64 << 20


def _replies_bytes(messages: list[tuple[int, list[Any]]]) -> int:
    """The bytes of a frame of replies (its items, mostly)."""
    return sum(item_bytes(parts) for _op, parts in messages)


class Reader:
    __slots__ = ("leased", "acked", "recalled", "asked", "asked_at", "mute")

    def __init__(self) -> None:
        self.leased: deque[list[Any]] = deque()
        self.acked = 0
        self.recalled = False
        self.asked: bytes | None = None  # the COUNT it has not answered yet
        self.asked_at = -math.inf  # when a put last sent it a COUNT (_ask_counts)
        self.mute = False  # did not answer a COUNT in time: not asked again until it speaks


class Broker:
    """The queue's state, in the creating process."""

    def __init__(self, qid: str, maxsize: int) -> None:
        rt = get_runtime()
        self.qid = qid
        self.maxsize = maxsize
        self._lock = lock = threading.Lock()  # ``with self._lock`` on hot paths: a C call, not Condition's
        self.cv = threading.Condition(lock)  # local getters, putters and joiners wait here
        # The dispatch thread waits on its own condition, woken only when it has work: a
        # wake-up per queue operation (the GIL taken and given back for nothing) cost a
        # 100-byte round trip through two queues five thread switches in this process.
        self.work = threading.Condition(lock)
        self.items: deque[list[Any]] = deque()
        self.unfinished = 0
        self.readers: dict[Hashable, Reader] = {}
        #: GETs not answered yet: (peer, want, nowait, standing), first come first served.
        self.waiting: deque[tuple[Hashable, int, bool, bool]] = deque()
        self.local_getters = 0
        self.pending_puts: deque[tuple[Hashable, bytes, list[Any]]] = deque()
        self.join_waiters: list[tuple[Hashable, bytes]] = []
        self.outbox: list[tuple[Hashable, list[Any]]] = []
        self.last_put = 0.0  # perf_counter() of the last local put
        # The last local put came within BURST_GAP of the one before: a standing GET is then
        # answered for the last time (DONE), so that a stream of puts reaches its reader in
        # grants of many items per frame, not a frame per put.
        self.burst = False
        # Bytes of items held here (queued or leased to a reader that has not acknowledged
        # them); above the budget, remote writers are paused and local puts block.
        self.held = 0
        self.budget = int(rt.config.get("queue_max_bytes"))
        self.paused: set[Hashable] = set()
        self.channel = rt.listen("router", service="queue")
        self.address = self.channel.address
        self.channel.on_peer_event(self._peer_event)
        self.origins: dict[Hashable, tuple[str, int, str]] = {}  # peer -> (host, pid, machine): INTRO
        liveness.on_lost(self._job_lost)
        # Readers whose replies wait for room, each with a sending thread of its own.
        self.slow = Outboxes(self.channel, f"queue {qid[:8]}", max(self.budget, OUTBOX_BYTES), self._slow_reader,
                             sizer=_replies_bytes)
        self.closed = False
        self.peers = 0
        self.departed: deque[tuple[Hashable, float]] = deque()
        self.sending = False  # a thread sends replies (one at a time, in the order they were made)
        # Who receives on the channel now (one thread at a time, so frames are handled in the
        # order they came): the receiving thread, or a local getter when the transport can
        # wake it (then a get costs no hand-off between threads).
        self.reader: threading.Thread | None = None
        self.getter_read_at = -math.inf  # when a local getter last received
        self.getters_read = self.channel.wakeable
        self.resting = threading.Condition(lock)  # the receiving thread, while getters read
        self.rest_untimed = False  # it waits for the reading getter to finish (no timed looks)
        self._counts = itertools.count(1)  # ids of COUNT requests
        self.recalled_at: dict[Hashable, float] = {}  # readers asked to give back, since when

        self._ready: tuple[int, int] | None = None  # a pipe readable while items wait (ready_fd)
        self._ready_set = False
        self._receiver: threading.Thread | None = None
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
        self.held += item_bytes(parts)
        self.unfinished += 1
        if self._ready is not None:
            self._sync_ready()

    def _released(self, size: int) -> None:
        """Items of ``size`` bytes left this process for good: below half the budget, paused
        writers resume."""
        self.held -= size
        if self.paused and self.held <= self.budget // 2:
            for peer in self.paused:
                self.channel.resume(peer)
            self.paused.clear()

    def _ack(self, reader: Reader, consumed_total: int) -> None:
        reader.mute = False  # it speaks: a COUNT may go to it again
        # Bounded by what is leased: a peer's count is a u64 it chose (2**64-1 must not loop).
        count = max(0, min(consumed_total - reader.acked, len(reader.leased)))
        if count:
            popleft = reader.leased.popleft
            self._released(items_bytes([popleft() for _ in range(count)]))
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
                self.recalled_at[peer] = time.monotonic()
                self.outbox.append((peer, [(RECALL, [])]))
                self.work.notify()  # the dispatch thread watches for an answer from now on

    def _recall_for_starved(self) -> None:
        """RECALL lent items when a remote reader waits with nothing lent and nothing is here
        (cv held). A waiting reader that still holds items asked ahead of need: it is not
        starved, and recalling for it alone would undo every prefetch of a reader keeping up."""
        if self.items or not self.waiting:
            return
        for entry in self.waiting:
            reader = self.readers.get(entry[0])
            if reader is not None and not reader.leased:
                self._recall(None)
                return

    def _changed(self) -> None:
        if self._ready is not None:
            self._sync_ready()
        # Only whoever waits is notified: every waiter looks at its condition under the lock
        # (held here) before it waits, so a notify with no waiter changes nothing, and
        # Condition.notify costs a busy queue tens of bytecodes per operation for nothing.
        if self.cv._waiters:  # type: ignore[attr-defined]  # CPython's Condition, since 3.0
            self.cv.notify_all()
        if self.work._waiters and self._dispatch_due():  # type: ignore[attr-defined]
            self.work.notify()
        if self.items and self.reader is not None and self.reader is not self._receiver:
            self.channel.wake()  # a getter receiving on the channel: items came another way

    def _dispatch_due(self) -> bool:
        """Whether the dispatch thread has replies to send (cv held)."""
        return not self.sending and bool(self.outbox or (self.waiting and (self.items or self._nowait_pending())))

    def release(self) -> None:
        """The queue's last handle here is gone: its threads end once no process uses it."""
        with self.cv:
            self.closed = True
            self._rouse()

    def ready_fd(self) -> int:
        """A descriptor that is readable while items wait here (``multiprocessing.connection.wait``
        on ``Queue._reader``, as ``concurrent.futures`` does on its result queue)."""
        with self.cv:
            if self._ready is None:
                r, w = os.pipe()
                os.set_blocking(r, False)
                self._ready, self._ready_set = (r, w), False
                self._sync_ready()
                self.resting.notify()  # the receiving thread reads for the descriptor's watchers
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
        parts = owned(parts)  # held here: the caller's array may change after put(); copied outside the lock
        with self._lock:
            while self.held >= self.budget or (self.maxsize > 0 and not self._room()):
                # Lent items count as held until their reader acknowledges them: ask the
                # readers what they consumed (at most every QUIET seconds each), without
                # waiting for the answers here: a COUNTED frees room as an ACK does, and
                # wakes this put if it waits.
                asked = self._ask_counts(again=False)
                if asked:
                    self._changed()  # the dispatch thread sends the COUNTs (no notify otherwise:
                    # two waiting putters would wake each other for ever)
                if not block:
                    raise Full
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise Full
                if asked or self._leased_count():  # look (and ask) again within QUIET seconds
                    remaining = QUIET if remaining is None else min(QUIET, remaining)
                self.cv.wait(remaining)
            self._append(parts)
            now = _clock()
            self.burst, self.last_put = now - self.last_put < BURST_GAP, now
            sends: list[tuple[Hashable, list[Any]]] = []
            if self.waiting or self.local_getters:  # wake only who waits for an item
                # A remote reader waits: answer it from this thread (as the receive thread
                # does), not through a hand-off to the dispatch thread.
                sends = self._sends_for_this_thread() if self.waiting else []
                self._changed()
        if sends:
            self._send_replies(sends)

    def get_local(self, block: bool, timeout: float | None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            if not self.items and not block and self._may_read():
                self._read(0.0)  # what the kernel holds already
            if not self.items:
                if not block:
                    raise Empty
                self.local_getters += 1
                try:
                    while not self.items:
                        if self.readers:
                            self._recall(None)
                        self._changed()
                        remaining = None if deadline is None else deadline - time.monotonic()
                        if remaining is not None and remaining <= 0:
                            raise Empty
                        if self._may_read():
                            self._read(remaining)
                        else:
                            if self.reader is self._receiver:
                                self.getter_read_at = time.monotonic()  # it leaves the next read to us
                            self.cv.wait(remaining)
                finally:
                    self.local_getters -= 1
            parts = self.items.popleft()
            self._released(item_bytes(parts))
            if self.pending_puts:
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

    def view(self) -> dict[str, Any]:
        """What ``fiber top`` and the dashboard show of this queue."""
        with self.cv:
            return {"id": self.qid[:8], "depth": len(self.items) + self._leased_count(), "bytes": self.held,
                    "maxsize": self.maxsize, "readers": len(self.readers) + self.local_getters,
                    "processes": self.peers}

    def qsize_local(self) -> int:
        with self.cv:
            if self._may_read():
                self._read(0.0)
            self._count_leases()
            return len(self.items) + self._leased_count()

    def _count_leases(self) -> None:
        """Ask each reader holding lent items what it has consumed, and wait for the answers
        (cv held; at most :data:`COUNT_WAIT`): items a reader took before an action this
        process has seen (an Event it set, a message it sent) are then no longer counted,
        as with multiprocessing, where the reader's ``get`` took them out of the pipe."""
        asked = self._ask_counts(again=True)
        if not asked:
            return
        self._changed()  # the dispatch thread sends the COUNTs
        deadline = time.monotonic() + COUNT_WAIT
        while any(r.asked is not None for r in asked):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                for reader in asked:
                    if reader.asked is not None:
                        reader.asked, reader.mute = None, True
                return
            if self._may_read():
                self._read(remaining)
            else:
                self.cv.wait(remaining)

    def _ask_counts(self, again: bool) -> list[Reader]:
        """Send COUNT to each reader holding lent items (cv held; not to one that did not
        answer in time before): the readers asked. ``again`` (``qsize``) asks every one; else
        (a put finding no room) not one whose answer is still due, nor one asked within
        QUIET seconds (a loop of ``put_nowait`` on a full queue sends no COUNT per call)."""
        asked = []
        now = time.monotonic()
        for peer, reader in self.readers.items():
            if not reader.leased or reader.mute:
                continue
            if not again:
                if reader.asked is not None or now - reader.asked_at < QUIET:
                    continue
                reader.asked_at = now
            reader.asked = req = u64(next(self._counts))
            self.outbox.append((peer, [(COUNT, [req])]))
            asked.append(reader)
        return asked

    # -- network -----------------------------------------------------------------------------
    def _peer_event(self, peer: Hashable, added: bool) -> None:
        with self.cv:
            self.peers += 1 if added else -1
            if not added:
                self.origins.pop(peer, None)
                # Frames the peer sent before leaving may still be queued in the
                # transport: settle its leases a little later, in the receive thread.
                self.departed.append((peer, time.monotonic()))
                self._rouse()

    def _job_lost(self, host: str, pid: int, machine: str) -> None:
        """A job was declared lost (silent past heartbeat_timeout): drop its connections now,
        so what it was lent comes back at once (not after a RECALL it will never answer)."""
        with self.cv:
            peers = [peer for peer, origin in self.origins.items() if liveness.same_job(origin, host, pid, machine)]
        for peer in peers:
            self.channel.drop(peer)

    def _rouse(self) -> None:
        """The receiving thread has something to do (cv held): a departure to settle, or the
        queue was released; wake it wherever it waits."""
        self.resting.notify()
        self.work.notify()
        if self.reader is not None and self.reader is self._receiver:
            self.channel.wake()

    def _settle_departed(self) -> None:
        """Take back what departed peers held, once their last frames were read (cv held)."""
        now = time.monotonic()
        while self.departed and now - self.departed[0][1] > 0.3:
            peer, _ = self.departed.popleft()
            self._forget_peer(peer)

    def _forget_peer(self, peer: Hashable) -> None:
        reader = self.readers.pop(peer, None)
        self.recalled_at.pop(peer, None)
        if reader is not None:
            self.items.extendleft(reversed(reader.leased))
            reader.leased.clear()
            reader.asked = None  # a COUNT it will never answer: its items are back here
        self.waiting = deque(w for w in self.waiting if w[0] is not peer)
        self.pending_puts = deque(p for p in self.pending_puts if p[0] is not peer)
        self.join_waiters = [j for j in self.join_waiters if j[0] is not peer]
        self._changed()

    # -- receiving: by the receiving thread, or by a local getter -----------------------------
    def _may_read(self) -> bool:
        """Whether this (local getter's) thread may receive on the channel now (cv held):
        the transport can wake it, nobody else receives, and no descriptor watches the
        queue (whoever waits on ``ready_fd`` relies on the receiving thread)."""
        return self.getters_read and self.reader is None and self._ready is None and not self.closed

    def _read(self, timeout: float | None) -> None:
        """Receive one frame on this thread and handle it (cv held on entry and exit; released
        while receiving and sending). A put from another thread wakes it (``channel.wake``)."""
        self.reader = threading.current_thread()
        self.cv.release()
        got = None
        try:
            got = self.channel.recv(timeout=timeout)
        except TransportTimeout:
            pass
        except TransportClosed:  # getters wait on the condition from now on (no loop on this)
            self.getters_read = False
        finally:
            self.cv.acquire()
            self.reader = None
            self.getter_read_at = time.monotonic()
            if self.cv._waiters:  # type: ignore[attr-defined]  # another getter may read now
                self.cv.notify_all()
            if self.rest_untimed:  # the receiving thread looks again (once per long read)
                self.rest_untimed = False
                self.resting.notify()
        if self.departed:
            self._settle_departed()
        if got is not None:
            sends = self._took(*got)
            if sends:
                self.cv.release()
                try:
                    self._send_replies(sends)
                finally:
                    self.cv.acquire()

    def _getters_read(self) -> bool:
        """Whether the receiving thread leaves the channel to local getters (cv held): one
        reads now, or one did within QUIET seconds (a loop of gets: the next comes soon)."""
        if self.reader is not None:
            return True
        return self._may_read() and time.monotonic() - self.getter_read_at < QUIET

    def _receive(self) -> None:
        self._receiver = threading.current_thread()
        while True:
            with self.cv:
                while True:
                    if self.departed:
                        self._settle_departed()
                    if not self._getters_read():
                        break
                    # While a getter reads, wait for that read to end (no wake-ups during a
                    # long get); between reads, look again after QUIET; settle departures soon.
                    self.rest_untimed = self.reader is not None and not self.departed
                    self.resting.wait(None if self.rest_untimed else 0.1 if self.departed else QUIET)
                    self.rest_untimed = False
                self.reader = self._receiver
                # Idle, it sleeps until a frame or a wake-up (a departure, the queue's release).
                wait = 0.25 if self.departed or self.closed or not self.getters_read else None
            got, ended = None, False
            try:
                got = self.channel.recv(timeout=wait)
            except TransportTimeout:
                pass
            except TransportClosed:
                ended = True
            with self.cv:  # the frame is handled before another thread may receive the next
                self.reader = None
                if got is None:
                    self.cv.notify_all()  # a getter may receive now
                    sends = []
                else:
                    sends = self._took(*got)
            if ended:
                return
            if got is None:
                if self.closed and self.peers <= 0 and not self.departed:
                    self.channel.close()
                    return
                continue
            if sends:
                self._send_replies(sends)

    def _took(self, messages: list[tuple[int, list[Any]]], peer: Hashable) -> list[tuple[Hashable, list[Any]]]:
        """Handle a frame's messages (cv held); the replies this thread is to send now."""
        for op, parts in messages:
            try:
                self._handle(op, parts, peer)
            except Exception as exc:  # authentic but malformed: counted and skipped
                malformed(self.address, peer, op, exc)
        if self.held > self.budget and peer not in self.paused and any(op == PUT for op, _ in messages):
            # A writer beyond the byte budget: stop reading its connection (its puts
            # then block, as on a full queue) until readers take items out. Lent items
            # count until acknowledged: readers are asked what they consumed (put_local).
            self.paused.add(peer)
            self.channel.pause(peer)
            self._ask_counts(again=False)
        # Answer at once from this thread when no other is sending (a hand-off to
        # the dispatch thread costs a GIL switch, up to 5 ms in a busy process).
        sends = self._sends_for_this_thread()
        self._changed()
        return sends

    def _handle(self, op: int, parts: list[Any], peer: Hashable) -> None:
        if op == PUT:
            self._append(parts)
        elif op == INTRO:
            origin = read_intro(parts[0]) if parts else None
            if origin is not None:
                self.origins[peer] = origin
        elif op == GET:
            reader = self.readers.get(peer)
            if reader is None:
                reader = self.readers[peer] = Reader()
            self._ack(reader, read_u64(parts[1]))
            standing = len(parts) > 3 and read_u64(parts[3]) == 1
            self.waiting.append((peer, read_u64(parts[0]), read_u64(parts[2]) == 1, standing))
        elif op == ACK:
            reader = self.readers.get(peer)
            if reader is not None:
                self._ack(reader, read_u64(parts[0]))
        elif op == COUNTED:
            reader = self.readers.get(peer)
            if reader is not None:
                self._ack(reader, read_u64(parts[1]))
                if reader.asked == bytes(parts[0]):
                    reader.asked = None
        elif op == RETURN:
            reader = self.readers.get(peer)
            if reader is not None:
                self._ack(reader, read_u64(parts[0]))
                n = min(read_u64(parts[1]), len(reader.leased))
                back = [reader.leased.pop() for _ in range(n)]
                self.items.extendleft(back)  # popped last-first: extendleft restores order
                reader.recalled = False
                self.recalled_at.pop(peer, None)
                # A RETURN withdraws the reader's GET (the client counts it answered).
                if any(w[0] is peer for w in self.waiting):
                    self.waiting = deque(w for w in self.waiting if w[0] is not peer)
        elif op == PUTSYNC:
            self.pending_puts.append((peer, bytes(parts[0]), parts[1:]))
            self._admit_puts()
            if self.pending_puts:  # no room: readers may have consumed lent items (put_local)
                self._ask_counts(again=False)
        elif op == CANCEL:
            original = bytes(parts[1])
            before = len(self.pending_puts)
            self.pending_puts = deque(p for p in self.pending_puts if not (p[0] is peer and p[1] == original))
            done = u64(len(self.pending_puts) < before)
            self.outbox.append((peer, [(CANCELLED, [bytes(parts[0]), done])]))
        elif op == SIZE:
            reader = self.readers.get(peer)
            if reader is not None:
                self._ack(reader, read_u64(parts[1]))
            self.outbox.append((peer, [(SIZEIS, [bytes(parts[0]), u64(len(self.items) + self._leased_count())])]))
        elif op == TASKDONE:
            self._task_done(read_u64(parts[0]))
        elif op == JOIN:
            if self.unfinished == 0:
                self.outbox.append((peer, [(JOINED, [bytes(parts[0])])]))
            else:
                self.join_waiters.append((peer, bytes(parts[0])))

    def _dispatch(self) -> None:
        """Serve waiting readers and send the replies of local operations; while a reader is
        slow (its replies wait in ``self.slow``) or asked to give back what it holds, look
        every second whether it is stuck (:meth:`_check_stuck`)."""
        checked = time.monotonic()
        while True:
            if self._watching() and time.monotonic() - checked >= 1.0:
                checked = time.monotonic()
                self._check_stuck()
            sends = None
            with self.cv:
                while True:
                    self._recall_for_starved()
                    if self._dispatch_due():
                        sends = self._take_sends()
                        self.sending = True
                        break
                    if self.closed and self.peers <= 0:
                        return
                    if self._watching() and time.monotonic() - checked >= 1.0:
                        break
                    self.work.wait(1.0 if self._watching() else None)
            if sends is not None:
                self._send_replies(sends)

    def _watching(self) -> bool:
        """Whether a reader may be stuck: its replies wait, or a RECALL is unanswered."""
        return self.slow.any() or bool(self.recalled_at)

    def _check_stuck(self) -> None:
        """Drop readers stuck for :data:`STUCK_AFTER` seconds (not under cv): replies waiting
        for room, or a RECALL not answered (a stopped reader, or one whose transport buffers
        what it never reads): what they were lent goes to the others."""
        self.slow.check_stuck(STUCK_AFTER)
        now = time.monotonic()
        with self.cv:
            silent = [peer for peer, since in self.recalled_at.items() if now - since > STUCK_AFTER]
            for peer in silent:
                self.recalled_at.pop(peer, None)
        for peer in silent:
            self.slow.give_up(peer, f"it did not give back what it was lent within {STUCK_AFTER:.0f} s of being asked")

    def _send_replies(self, sends: list[tuple[Hashable, list[Any]]]) -> None:
        """Send replies (one thread at a time: ``sending``, so each reader gets its replies in
        the order they were made); none waits for a reader's room: what does not fit now waits
        in that reader's own outbox (``self.slow``), so one stopped reader holds up no other,
        and is dropped when stuck (:data:`STUCK_AFTER`)."""
        deliver = self.slow.deliver  # send now, or into the reader's own outbox when its connection is full
        for peer, messages in sends:
            deliver(peer, messages)
        with self._lock:
            self.sending = False
            # What others left while this thread sent (they skip sending meanwhile): a reader
            # that came to wait, items for waiting readers. The dispatch thread takes it.
            self._recall_for_starved()
            if self._dispatch_due():
                self._changed()

    def _slow_reader(self) -> None:
        with self.cv:
            self.work.notify()  # the dispatch thread looks at slow readers every second from now on

    def _sends_for_this_thread(self) -> list[tuple[Hashable, list[Any]]]:
        """Replies this thread may send itself, with ``block=False`` (cv held): none while
        another thread sends (replies leave in the order they were made)."""
        if self.sending or not (self.outbox or self.waiting or self.pending_puts):
            return []  # (what _take_sends() would find: nothing due)
        sends = self._take_sends()
        if sends:
            self.sending = True
        return sends

    def _take_sends(self) -> list[tuple[Hashable, list[Any]]]:
        """Replies due now (cv held): the outbox, then batches for the waiting readers, then
        RECALLs when a reader is left waiting with nothing (all of it in one list, in order)."""
        sends = self.outbox
        self.outbox = []
        recalled: list[tuple[Hashable, int, bool, bool]] = []
        standing: list[tuple[Hashable, int, bool, bool]] = []
        while self.waiting and (self.items or self.waiting[0][2]):
            entry = peer, want, nowait, stands = self.waiting.popleft()
            reader = self.readers.get(peer)
            if reader is None:
                continue
            if reader.recalled:
                # Nothing is lent to a reader asked to give back: its RETURN counts items from
                # the end of its lease, and withdraws this GET (the client asks again if a
                # thread of it really waits).
                recalled.append(entry)
                continue
            if not self.items:
                sends.append((peer, [(EMPTY, [])]))
                continue
            grant = 1 if len(self.items) == 1 else self._grant(want)  # one item: _grant() gives 1
            popleft = self.items.popleft
            if grant == 1:
                batch = [popleft()]
            elif self.held <= GRANT_BYTES:  # what is queued (and lent) is less than a grant's bytes
                batch = [popleft() for _ in range(grant)]
            else:
                batch = []
                size = 0
                for _ in range(grant):
                    if batch and size >= GRANT_BYTES:
                        break
                    batch.append(popleft())
                    size += item_bytes(batch[-1])
            reader.leased.extend(batch)
            messages: list[tuple[int, list[Any]]] = [(ITEM, parts) for parts in batch]
            if stands:
                if not self.items and not self.burst and self._sole() and len(reader.leased) < STANDING_CREDIT:
                    standing.append(entry)  # the next item goes to it as soon as it is put
                else:
                    messages.append((DONE, []))
            sends.append((peer, messages))
        if recalled:
            self.waiting.extendleft(reversed(recalled))
        if standing:
            self.waiting.extend(standing)
        if self.pending_puts:
            self._admit_puts()
        self._recall_for_starved()
        if self.outbox:
            sends += self.outbox
            self.outbox = []
        return sends

    def _nowait_pending(self) -> bool:
        return any(w[2] for w in self.waiting)

    def _sole(self) -> bool:
        """Whether one process reads the queue (and no getter in this one)."""
        return not self.local_getters and len(self.readers) == 1


#: Seconds without a thread waiting on a queue client before its background thread reads
#: the connection (while threads wait, one of them reads it: no hand-off per item).


def _views() -> list[dict[str, Any]]:
    """What ``fiber top`` and the dashboard show of this process's queues."""
    return [b.view() for b in list(brokers.values()) if not b.closed]


registry.provide("queues", _views)
