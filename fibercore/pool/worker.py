"""The loop every pool worker job runs (the target of its Process).

The main thread runs chunks one by one and sends their results; while it has
nothing to run it receives by itself, so a task reaches it without a thread
hand-off. While a chunk runs long, a poller thread drains the socket, so STEAL and
STOP are answered at once. Small results that finish while more work is queued
locally share a frame; anything slower goes out at once.
"""

from __future__ import annotations

import collections
import os
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.pool import protocol as P
from fibercore.util import with_traceback

#: Results of tasks shorter than this may wait (≤ BATCH_AGE) to share a frame.
SHORT_TASK = 0.0002
BATCH_AGE = 0.002
BATCH_BYTES = 1 << 20
BATCH_COUNT = 64


class _Func:
    """A batch's function: its pickled parts until first use, then the object."""

    __slots__ = ("parts", "obj")

    def __init__(self, parts: list[Any]) -> None:
        self.parts: list[Any] | None = parts
        self.obj: Any = None

    def load(self, serializer: Any) -> Any:
        if self.parts is not None:
            self.obj = serializer.loads(self.parts)
            self.parts = None
        return self.obj


def _run_chunk(kind: int, func: _Func | None, payload: list[Any], serializer: Any) -> Any:
    data = serializer.loads(payload)
    payload.clear()  # the received frame goes now, unless what was loaded is built on it (arrays)
    if kind == P.APPLY:
        fn, args, kwds = data
        return fn(*args, **kwds)
    fn = func.load(serializer)  # type: ignore[union-attr]
    if kind == P.MAP:
        return [fn(x) for x in data]
    return [fn(*x) for x in data]


def _encode(serializer: Any, ok: bool, value: Any) -> tuple[bool, list[Any]]:
    try:
        return ok, serializer.dumps(value)
    except Exception as exc:  # an unpicklable result or exception: say which
        from multiprocessing.pool import MaybeEncodingError  # type: ignore[attr-defined]

        wrapped = MaybeEncodingError(exc, value)
        return False, serializer.dumps(with_traceback(wrapped))


class _Inbox:
    """Chunks received but not started, and the messages that change them.

    The main thread receives by itself while it is idle (no thread hand-off on the
    latency path). Once a chunk has run for :data:`POLL_AFTER`, a poller thread
    takes over the socket, blocked in a receive (the GIL is free: the task runs at
    full speed), so STEAL and STOP are answered during a long task. The poller
    wakes only for a message or every :data:`POLL_BLOCK`; when the chunk ends, the
    main thread waits for the poller's receive to return before it receives again,
    and meanwhile whatever arrives is filed by the poller.
    """

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.lock = threading.Lock()
        self.changed = threading.Condition(self.lock)
        self.tasks: collections.deque[tuple[int, int, _Func | None, list[Any]]] = collections.deque()
        self.funcs: collections.OrderedDict[int, _Func] = collections.OrderedDict()
        self.stopping = False
        self.closed = False
        self.running_since = 0.0  # when the current chunk started; 0 while idle
        self.polling = False  # the poller owns the socket (it is in, or about to enter, a receive)
        self.busy = threading.Event()
        self.sending = False  # the main thread is sending results (see send())
        self.returned: list[int] = []  # given back by the poller, reported by the main thread
        self.typical = 0.0  # moving average of chunk durations

    def file(self, messages: list[tuple[int, list[Any]]], reply: bool = True) -> None:
        """Take in one frame's messages (either thread; the poller passes ``reply=False``:
        it never writes, since the main thread may hold the socket in a long send)."""
        give_back: list[int] | None = None
        with self.lock:
            for op, parts in messages:
                if op == P.TASK:
                    cid, bid, kind, nfunc = P.read_task_header(parts[0])
                    func = None
                    if nfunc:
                        func = _Func(parts[1:1 + nfunc])
                        self.funcs[bid] = func
                        if len(self.funcs) > P.FUNC_CACHE:
                            self.funcs.popitem(last=False)
                    elif kind != P.APPLY:
                        func = self.funcs.get(bid)
                    self.tasks.append((cid, kind, func, parts[1 + nfunc:]))
                elif op in (P.STEAL, P.STOP):
                    give_back = [task[0] for task in self.tasks]
                    self.tasks.clear()
                    if op == P.STOP:
                        self.stopping = True
            self.changed.notify_all()
        if give_back is not None:
            if reply:
                self.channel.send([(P.RETURNED, [P.ids(give_back)])])
            else:
                self._return_from_poller(give_back)

    def _return_from_poller(self, give_back: list[int]) -> None:
        """Report given-back ids now if the socket is free and takes them at once; else the
        main thread reports them (take_returned). The poller must never block on a write: it
        is the worker's only reader while the main thread runs or sends."""
        with self.lock:  # held across the (non-blocking) send: the main thread cannot start one
            if self.sending:
                self.returned.extend(give_back)
                return
            try:
                self.channel.send([(P.RETURNED, [P.ids(give_back)])], block=False)
            except TransportTimeout:
                self.returned.extend(give_back)

    def take_returned(self) -> list[int]:
        """Ids the poller gave back (STEAL/STOP) that the main thread must report."""
        with self.lock:
            out, self.returned = self.returned, []
        return out

    def poll_after(self) -> float:
        """How long a chunk runs before the poller takes over the socket: longer than
        :data:`POLL_AFTER` and than a few typical chunks, so that only an unusually
        long chunk (the one others may be waiting behind) pays for a second thread."""
        return max(POLL_AFTER, POLL_SLOW_FACTOR * self.typical)

    def note_duration(self, seconds: float) -> None:
        self.typical = seconds if not self.typical else 0.8 * self.typical + 0.2 * seconds

    def started_chunk(self, when: float) -> None:
        with self.lock:
            self.running_since = when
            self.busy.set()

    def finished_chunk(self) -> None:
        with self.lock:
            self.running_since = 0.0
            self.sending = False

    def send(self, messages: list[Any]) -> None:
        """Send results; if the send stalls (the master's socket buffer is full because the
        master is itself blocked writing the next big task to us), the poller reads that task
        meanwhile, so that both sides move. Without it, two 10 MB frames crossing deadlock."""
        with self.lock:
            self.running_since = time.perf_counter()
            self.sending = True
            self.busy.set()
        try:
            self.channel.send(messages)
        finally:
            self.finished_chunk()

    def poll_while_busy(self) -> None:
        """The poller thread: receive for the main thread while a long chunk runs."""
        while True:
            self.busy.wait()
            with self.lock:
                started = self.running_since
                if not started:
                    self.busy.clear()
                    continue
            wait = (SEND_POLL_AFTER if self.sending else self.poll_after()) - (time.perf_counter() - started)
            if wait > 0:
                time.sleep(wait)
                continue
            while True:
                with self.lock:
                    if self.running_since != started:
                        break
                    self.polling = True
                messages = None
                try:
                    messages, _ = self.channel.recv(timeout=POLL_BLOCK)
                except TransportTimeout:
                    pass
                except TransportClosed:
                    with self.lock:
                        self.polling = False
                        self.changed.notify_all()
                    return
                if messages:
                    self.file(messages, reply=False)
                    messages = None  # the chunks filed alone hold their frame
                with self.lock:
                    self.polling = False
                    self.changed.notify_all()

    def wait_for_poller(self) -> bool:
        """True when the main thread may block in receive (no poll in flight, nothing queued)."""
        with self.lock:
            while self.polling and not self.tasks and not self.stopping:
                self.changed.wait()
            return not (self.tasks or self.stopping)


#: A chunk running longer than this (and than POLL_SLOW_FACTOR typical chunks) gets the
#: poller; shorter ones answer STEAL and STOP at their end.
POLL_AFTER = 0.05
POLL_SLOW_FACTOR = 4.0
#: The poller's receive timeout: how often it checks whether the chunk ended.
POLL_BLOCK = 0.2
#: A results send still blocked after this long gets the poller (see _Inbox.send).
SEND_POLL_AFTER = 0.02


def run_worker(address: str, wid: int, initializer: Callable[..., Any] | None,
               initargs: tuple[Any, ...], maxtasks: int | None) -> None:
    """Serve one pool: connect, run the initializer, then run chunks until told to stop.

    The terminal's Ctrl-C reaches the workers too (they share the master's process group, as
    multiprocessing's do). A worker running a task shows the task's traceback, as
    multiprocessing's; an idle one leaves quietly (the pool replaces it if the master lives on).
    """
    in_task = [False]
    try:
        _serve(address, wid, initializer, initargs, maxtasks, in_task)
    except KeyboardInterrupt:
        if in_task[0]:
            raise
        from fibercore.worker import exit_job

        exit_job(None, 128 + 2)


def _serve(address: str, wid: int, initializer: Callable[..., Any] | None,
           initargs: tuple[Any, ...], maxtasks: int | None, in_task: list[bool]) -> None:
    from fibercore.runtime import get_runtime
    from fibercore.worker import EXIT_MASTER_GONE, exit_job

    rt = get_runtime()
    serializer = rt.serializer
    channel = rt.dial("router", address, service="pool")
    leaving = threading.Event()

    def on_peer(peer: object, added: bool) -> None:
        if not added and not leaving.is_set():
            exit_job(f"the pool at {address} closed its connection (pool terminated or master gone)",
                 EXIT_MASTER_GONE)

    channel.on_peer_event(on_peer)
    wid_b = str(wid).encode()
    if initializer is not None:
        try:
            in_task[0] = True
            initializer(*initargs)
            in_task[0] = False
        except BaseException as exc:
            text = traceback.format_exc()
            try:
                parts = serializer.dumps(exc)
            except Exception:
                parts = serializer.dumps(RuntimeError(f"{type(exc).__name__}: {exc}"))
            leaving.set()
            channel.send([(P.INITFAIL, [wid_b, text.encode(), *parts])])
            raise SystemExit(f"the pool initializer raised:\n{text}") from None
    channel.send([(P.READY, [wid_b, str(os.getpid()).encode()])])

    inbox = _Inbox(channel)
    threading.Thread(target=inbox.poll_while_busy, name="fiber-pool-poll", daemon=True).start()
    outbox: list[Any] = []
    out_bytes = 0
    first_buffered = 0.0
    done = 0
    while True:
        given_back = inbox.take_returned()
        if given_back:  # after the results already computed, so none of them is rerun needlessly
            inbox.send([*outbox, (P.RETURNED, [P.ids(given_back)])])
            outbox, out_bytes = [], 0
        with inbox.lock:
            task = inbox.tasks.popleft() if inbox.tasks else None
            more = bool(inbox.tasks)
            stopping = inbox.stopping
        if task is None:
            if outbox:
                inbox.send(outbox)
                outbox, out_bytes = [], 0
            if stopping:
                break
            if not inbox.wait_for_poller():
                continue
            try:
                messages, _ = channel.recv()
            except TransportClosed:
                break
            inbox.file(messages)
            del messages  # the chunk's parts alone hold its frame
            continue
        cid, kind, func, payload = task
        task = None
        start = time.perf_counter()
        inbox.started_chunk(start)
        in_task[0] = True
        try:
            ok, value = True, _run_chunk(kind, func, payload, serializer)
        except Exception as exc:
            ok, value = False, with_traceback(exc)
        in_task[0] = False
        inbox.finished_chunk()
        elapsed = time.perf_counter() - start
        inbox.note_duration(elapsed)
        ok, parts = _encode(serializer, ok, value)
        if not outbox:
            first_buffered = time.perf_counter()
        outbox.append((P.RESULT, [P.result_header(cid, ok, int(elapsed * 1e6)), *parts]))
        out_bytes += sum(len(p) if not isinstance(p, memoryview) else p.nbytes for p in parts)
        done += 1
        last = maxtasks is not None and done >= maxtasks
        if (not more or last or elapsed > SHORT_TASK or len(outbox) >= BATCH_COUNT
                or out_bytes >= BATCH_BYTES or time.perf_counter() - first_buffered > BATCH_AGE):
            inbox.send(outbox)
            outbox, out_bytes = [], 0
        if last:
            break
    leaving.set()
    reason = b"maxtasksperchild" if maxtasks is not None and done >= maxtasks else b"stop"
    with inbox.lock:
        unstarted = [t[0] for t in inbox.tasks]
        inbox.tasks.clear()
    unstarted += inbox.take_returned()
    try:
        channel.send([*outbox, (P.BYE, [reason, P.ids(unstarted)])])
    except TransportClosed:
        pass
