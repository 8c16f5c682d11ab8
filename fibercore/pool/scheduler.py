"""The master side of a Pool: task queue, pending table, workers (paper: Error Handling).

::

    map_async ─▶ chunks ─▶ task queue ──pump──▶ worker W (≤ prefetch chunks in flight)
                               ▲                      │ RESULT
                               │ requeue              ▼
                      pending table W ◀── dispatcher thread ──▶ result objects
                               │ W died (connection lost / job exited)
                      supervisor thread: requeue W's chunks, start a replacement

* A chunk leaves the queue into the pending table of the worker it was sent to; its
  RESULT removes it. The first result of a chunk wins; a late duplicate (from a
  worker declared dead whose result was already in flight) is dropped, so each
  result is delivered exactly once.
* Workers pull: a worker holds at most ``prefetch`` chunks (2, more for tiny tasks,
  adapted from measured chunk times). When the queue is empty and a worker idles,
  chunks prefetched by busy workers but not started are stolen back (STEAL), so
  no task waits behind a slow worker.
* A worker's death (SIGKILL, OOM, node loss, job deleted) puts its pending chunks
  back at the front of the queue; each such chunk is retried up to
  ``max_task_retries`` times, then fails with :class:`~fibercore.errors.WorkerLostError`
  naming the task, the worker's exit status and its logs. A task that *raises* is
  not retried: its exception goes to the caller, as in multiprocessing.
* ``resize(n)`` starts jobs concurrently or retires workers (STOP: finish the
  running chunk, give back the rest, exit); the adaptive mode moves the target
  between a minimum and a maximum with the backlog.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Hashable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from fibercore.errors import (
    JobStartError,
    ProcessError,
    SerializationError,
    TransportError,
    WorkerLostError,
)
from fibercore.pool import protocol as P
from fibercore.pool.worker import run_worker
from fibercore.process import Process
from fibercore.runtime import get_runtime
from fibercore.serialization import dumps_or_explain
from fibercore.util import describe_exit, log_tail
from fibercore.wire import malformed

log = logging.getLogger("fibercore.pool")

STARTING, READY, RETIRING, LEAVING, DEAD = "starting", "ready", "retiring", "leaving", "dead"
RUN, CLOSE, TERMINATE = "running", "closed", "terminated"

MAX_PREFETCH = 32
#: Chunks at least this long (on average) are prefetched one at a time.
LONG_CHUNK = 0.02


class Batch:
    """One map/apply call: its function (pickled once) and the object its results go to."""

    __slots__ = ("bid", "kind", "func_parts", "sink", "name")

    def __init__(self, bid: int, kind: int, func_parts: list[Any] | None, sink: Any, name: str) -> None:
        self.bid = bid
        self.kind = kind
        self.func_parts = func_parts
        self.sink = sink
        self.name = name


class Chunk:
    """A slice of a batch; the unit that is queued, sent, retried and answered."""

    __slots__ = ("cid", "batch", "index", "payload", "attempts", "done", "last_worker")

    def __init__(self, cid: int, batch: Batch, index: int, payload: list[Any]) -> None:
        self.cid = cid
        self.batch = batch
        self.index = index
        self.payload = payload
        self.attempts = 0
        self.done = False
        self.last_worker: WorkerSlot | None = None


class WorkerSlot:
    """What the scheduler knows of one worker job."""

    def __init__(self, wid: int, process: Process | None, deadline: float) -> None:
        self.wid = wid
        self.process = process  # None for an external worker (test harness)
        self.state = STARTING
        self.peer: Hashable | None = None
        self.pending: dict[int, Chunk] = {}
        self.known: OrderedDict[int, None] = OrderedDict()  # mirror of the worker's function cache
        self.sent = 0  # chunks handed over and not given back (for maxtasksperchild)
        self.steal_sent = False
        self.in_idle = self.in_room = False
        self.deadline = deadline
        self.launch_error: BaseException | None = None
        self.launched = False  # handed to the backend (see Scheduler.start_concurrency)
        self.settled = False  # ready, failed or gone since its launch
        self.killed_by_pool = False
        self.exitcode: int | None = None

    @property
    def name(self) -> str:
        return self.process.name if self.process is not None else f"external-worker-{self.wid}"

    def poll(self) -> int | None:
        if self.process is None or not self.process.launched:
            return None
        return self.process.exitcode


def _items(chunk: Chunk) -> str:
    """Which items of the user's call a chunk holds: "item 7", "items 20-29"."""
    if chunk.batch.kind == P.APPLY:
        return "the call"
    size = getattr(chunk.batch.sink, "_chunksize", 1) or 1
    first = chunk.index * size
    last = first + size - 1
    values = getattr(chunk.batch.sink, "_value", None)
    if isinstance(values, list) and values:  # a MapResult knows how many items there are
        last = min(last, len(values) - 1)
    return f"item {first}" if last <= first else f"items {first}-{last}"


def _likely_cause(code: int | None) -> str:
    """What usually ends a worker this way, and what to do."""
    if code == -signal.SIGKILL:
        return ("SIGKILL usually means the kernel's out-of-memory killer (or a job deleted by hand): "
                "raise the workers' memory with Pool(..., memory=MiB) or @fibercore.meta, or allow more "
                "retries (max_task_retries).")
    if code is not None and code < 0:
        return ("A signal other than SIGKILL usually means a crash in native code (SIGSEGV, SIGABRT) or a "
                "job stopped from outside (SIGTERM): see the logs below.")
    if code is not None and code > 0:
        return (f"The worker process exited with status {code} while running the task: the task (or a "
                "library it calls) ended the process, with sys.exit() in a thread or os._exit(); see the logs below.")
    return "The job vanished without an exit status (node lost, job deleted): see the logs below."


def _func_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


class Scheduler:
    """Owns the pool's endpoint, its worker jobs and every outstanding chunk."""

    def __init__(self, *, processes: int, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...],
                 maxtasks: int | None, resources: dict[str, Any], retries: int, name: str,
                 min_size: int | None = None, max_size: int | None = None, idle_timeout: float = 10.0) -> None:
        rt = get_runtime()
        self.rt = rt
        self.serializer = rt.serializer
        self.name = name
        self.initializer = initializer
        self.initargs = initargs
        self.maxtasks = maxtasks
        self.resources = resources
        self.retries = retries
        self.start_timeout = float(rt.config.get("start_timeout"))
        self.start_concurrency = int(rt.config.get("pool_start_concurrency") or 0)
        self._unlaunched: deque[WorkerSlot] = deque()
        self._launching = 0
        self.channel = rt.listen("router")
        self.address = self.channel.address

        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.queue: deque[Chunk] = deque()
        self.chunks: dict[int, Chunk] = {}  # outstanding: queued, pending or being delivered
        self.workers: dict[int, WorkerSlot] = {}
        self.by_peer: dict[Hashable, WorkerSlot] = {}
        self.idle_q: deque[WorkerSlot] = deque()
        self.room_q: deque[WorkerSlot] = deque()
        self.prefetched: set[WorkerSlot] = set()
        self.prefetch = 2
        self.avg_chunk: float | None = None
        self.state = RUN
        self.target = processes
        self.min_size = min_size
        self.max_size = max_size
        self.idle_timeout = idle_timeout
        self._low_since: float | None = None
        self.feeders = 0
        self.broken: BaseException | None = None
        self.failures_in_a_row = 0
        self.next_spawn_at = 0.0
        self.finished = False
        self._cids = itertools.count(1)
        self._bids = itertools.count(1)
        self._function_ids: OrderedDict[int, tuple[list[Any], int]] = OrderedDict()
        self._wids = itertools.count(1)
        self._events: deque[tuple[str, Any]] = deque()
        self._wake = threading.Event()
        self._launcher = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"{name}-launch")
        self.stats = {"retried_chunks": 0, "replaced_workers": 0, "stolen_chunks": 0}

        self.channel.on_peer_event(self._peer_event)
        self._dispatcher = threading.Thread(target=self._serve, name=f"{name}-dispatch", daemon=True)
        self._supervisor = threading.Thread(target=self._supervise, name=f"{name}-supervise", daemon=True)
        with self.lock:
            self._spawn(processes)
        self._dispatcher.start()
        self._supervisor.start()

    # ------------------------------------------------------------------ submitting
    def check_running(self) -> None:
        if self.state != RUN:
            raise ValueError("Pool not running")
        if self.broken is not None:
            raise ProcessError(f"{self.name} cannot run tasks: {self.broken}") from self.broken

    def new_batch(self, kind: int, func: Callable[..., Any] | None, sink: Any, what: str) -> Batch:
        """A batch for one call. Its ``bid`` names its function in the workers' caches:
        batches whose pickled function is the very same (a serializer returns the same
        parts for an unchanged function) share it, so workers get the function once."""
        func_parts = None
        if kind == P.APPLY:
            return Batch(next(self._bids), kind, None, sink, f"{what}({_func_name(func)})")
        func_parts = dumps_or_explain(self.serializer, func, f"the function given to {what}")
        with self.lock:
            known = self._function_ids.get(id(func_parts))
            if known is not None and known[0] is func_parts:
                bid = known[1]
                self._function_ids.move_to_end(id(func_parts))
            else:
                bid = next(self._bids)
                self._function_ids[id(func_parts)] = (func_parts, bid)
                if len(self._function_ids) > P.FUNC_CACHE:
                    self._function_ids.popitem(last=False)
        return Batch(bid, kind, func_parts, sink, f"{what}({_func_name(func)})")

    def add_chunk(self, batch: Batch, index: int, payload: list[Any]) -> None:
        with self.lock:
            if self.state == TERMINATE:
                raise ValueError("Pool not running")
            chunk = Chunk(next(self._cids), batch, index, payload)
            self.chunks[chunk.cid] = chunk
            self.queue.append(chunk)
            self._pump()

    def fail_chunk_now(self, batch: Batch, index: int, exc: BaseException) -> None:
        """Deliver a failure that happened in the master (e.g. the input iterable raised)."""
        batch.sink._set(index, False, exc)

    def submit_iterable(self, batch: Batch, kind: int, iterable: Iterable[Any], chunksize: int,
                        on_length: Callable[[int], None] | None, lazy: bool) -> None:
        """Cut ``iterable`` into chunks and queue them, here or in a feeder thread."""
        def feed() -> None:
            index = 0
            try:
                for items in _chunks(iterable, chunksize):
                    try:
                        payload = dumps_or_explain(self.serializer, items, f"an item of {batch.name}")
                    except SerializationError as exc:  # as multiprocessing: raised by get(),
                        original = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
                        if original is not exc:  # the pickling error itself, with the explanation
                            original.add_note(str(exc))
                        self.fail_chunk_now(batch, index, original)
                        index += 1
                        continue
                    self.add_chunk(batch, index, payload)
                    index += 1
            except Exception as exc:
                if not lazy:
                    raise
                if self.state == TERMINATE:
                    return
                self.fail_chunk_now(batch, index, exc)
                index += 1
            finally:
                if lazy:
                    with self.lock:
                        self.feeders -= 1
                        self.changed.notify_all()
            if on_length is not None:
                on_length(index)

        if not lazy:
            feed()
            return
        with self.lock:
            self.feeders += 1
        threading.Thread(target=feed, name=f"{self.name}-feed", daemon=True).start()

    # ------------------------------------------------------------------ dispatching (lock held)
    def _capacity(self, w: WorkerSlot) -> int:
        room = self.prefetch - len(w.pending)
        if self.maxtasks is not None:
            room = min(room, self.maxtasks - w.sent)
        return room

    def _classify(self, w: WorkerSlot) -> None:
        if len(w.pending) >= 2:
            self.prefetched.add(w)
        else:
            self.prefetched.discard(w)
        if w.state != READY or self._capacity(w) <= 0:
            return
        if not w.pending:
            if not w.in_idle:
                w.in_idle = True
                self.idle_q.append(w)
        elif not w.in_room:
            w.in_room = True
            self.room_q.append(w)

    def _next_worker(self) -> WorkerSlot | None:
        while self.idle_q:
            w = self.idle_q.popleft()
            w.in_idle = False
            if w.state == READY and not w.pending and self._capacity(w) > 0:
                return w
            self._classify(w)
        while self.room_q:
            w = self.room_q.popleft()
            w.in_room = False
            if w.state == READY and self._capacity(w) > 0:
                return w
            self._classify(w)
        return None

    def _task_message(self, w: WorkerSlot, chunk: Chunk) -> tuple[int, list[Any]]:
        batch = chunk.batch
        if batch.func_parts is None or batch.bid in w.known:
            return P.TASK, [P.task_header(chunk.cid, batch.bid, batch.kind, 0), *chunk.payload]
        w.known[batch.bid] = None
        if len(w.known) > P.FUNC_CACHE:
            w.known.popitem(last=False)
        head = P.task_header(chunk.cid, batch.bid, batch.kind, len(batch.func_parts))
        return P.TASK, [head, *batch.func_parts, *chunk.payload]

    def _pump(self) -> None:
        """Hand queued chunks to workers with room, idle workers first; then steal if needed."""
        if self.state == TERMINATE:
            return
        sends: dict[WorkerSlot, list[tuple[int, list[Any]]]] = {}
        while self.queue:
            chunk = self.queue[0]
            if chunk.done:
                self.queue.popleft()
                continue
            w = self._next_worker()
            if w is None:
                break
            self.queue.popleft()
            sends.setdefault(w, []).append(self._task_message(w, chunk))
            w.pending[chunk.cid] = chunk
            w.sent += 1
            chunk.last_worker = w
            self._classify(w)
        for w, messages in sends.items():
            try:
                self.channel.send(messages, w.peer)
            except TransportError:  # the worker is going; its loss puts the chunks back
                pass
        if not self.queue and self.idle_q and self.prefetched:
            self._steal()

    def _steal(self) -> None:
        budget = len(self.idle_q)
        for w in list(self.prefetched):
            if budget <= 0:
                break
            if w.state == READY and not w.steal_sent and len(w.pending) >= 2:
                w.steal_sent = True
                budget -= 1
                try:
                    self.channel.send([(P.STEAL, [])], w.peer)
                except TransportError:
                    pass

    def _requeue_front(self, chunks: Iterable[Chunk]) -> None:
        items = sorted((c for c in chunks if not c.done), key=lambda c: c.cid)
        self.queue.extendleft(reversed(items))

    def _note_time(self, micros: int) -> None:
        seconds = micros / 1e6
        self.avg_chunk = seconds if self.avg_chunk is None else 0.8 * self.avg_chunk + 0.2 * seconds
        if self.avg_chunk >= LONG_CHUNK:
            # A round trip is small next to the chunk: pull one at a time, as
            # multiprocessing's workers do, so nothing waits behind a running chunk.
            self.prefetch = 1
        else:
            self.prefetch = max(2, min(MAX_PREFETCH, 1 + int(0.0005 / max(self.avg_chunk, 1e-6))))

    # ------------------------------------------------------------------ the dispatcher thread
    def _serve(self) -> None:
        while True:
            try:
                messages, peer = self.channel.recv()
            except TransportError:
                return
            try:
                self._handle_frame(messages, peer)
            except Exception:  # an authentic but malformed message must not stop the pool
                log.exception("%s: could not handle a message from %r", self.name, peer)

    def _handle_frame(self, messages: list[tuple[int, list[Any]]], peer: Hashable) -> None:
        deliveries: list[tuple[Chunk, bool, list[Any]]] = []
        with self.lock:
            w = self.by_peer.get(peer)
            for op, parts in messages:
                try:
                    w = self._handle_message(op, parts, peer, w, deliveries)
                except Exception as exc:  # authentic but malformed: counted, the rest still handled
                    malformed(self.address, peer, op, exc)
            if w is not None:
                self._classify(w)
            self._pump()
        for chunk, ok, parts in deliveries:
            self._deliver(chunk, ok, parts)

    def _handle_message(self, op: int, parts: list[Any], peer: Hashable, w: WorkerSlot | None,
                        deliveries: list[tuple[Chunk, bool, list[Any]]]) -> WorkerSlot | None:
        """One message of a worker's frame (lock held); returns the worker slot it concerns."""
        if op == P.RESULT:
            cid, ok, micros = P.read_result_header(parts[0])
            chunk = w.pending.pop(cid, None) if w is not None else None
            if chunk is None:
                chunk = self.chunks.get(cid)
            if chunk is None or chunk.done:
                return w  # a duplicate: the chunk's first result already won
            chunk.done = True
            self._note_time(micros)
            deliveries.append((chunk, ok, parts[1:]))
        elif op == P.READY:
            w = self._on_ready(int(bytes(parts[0])), peer)
        elif op == P.INITFAIL:
            failed = self.workers.get(int(bytes(parts[0])))
            if failed is not None:
                self._on_initfail(failed, bytes(parts[1]).decode(errors="replace"), parts[2:])
        elif w is None:
            return w
        elif op == P.RETURNED:
            self._take_back(w, P.read_ids(parts[0]))
            w.steal_sent = False
        elif op == P.BYE:
            if w.state != DEAD:
                w.state = LEAVING
            self._take_back(w, P.read_ids(parts[1]) if len(parts) > 1 else [])
            self._maintain()
        return w

    def _take_back(self, w: WorkerSlot, cids: list[int]) -> None:
        back = [w.pending.pop(cid) for cid in cids if cid in w.pending]
        w.sent -= len(back)
        self.stats["stolen_chunks"] += len(back)
        self._requeue_front(back)

    def _on_ready(self, wid: int, peer: Hashable) -> WorkerSlot | None:
        w = self.workers.get(wid)
        if w is None or w.peer is not None:
            log.warning("%s: READY from an unknown or already connected worker %s; ignored", self.name, wid)
            return None
        w.peer = peer
        self.by_peer[peer] = w
        self._started(w)
        if w.state == STARTING:
            w.state = READY
            self.failures_in_a_row = 0
        elif w.state == RETIRING:  # retired while it was starting
            self._send_stop(w)
        return w

    def _on_initfail(self, w: WorkerSlot, text: str, parts: list[Any]) -> None:
        from multiprocessing.pool import RemoteTraceback

        try:
            exc = self.serializer.loads(parts)
        except Exception as load_error:
            exc = ProcessError(f"the pool initializer raised (and its exception could not be unpickled: {load_error})")
        exc.__cause__ = RemoteTraceback(text)
        self._break(exc, f"its initializer raised {type(exc).__name__} in {w.name}", deliver_cause=True)

    def _deliver(self, chunk: Chunk, ok: bool, parts: list[Any]) -> None:
        try:
            value = self.serializer.loads(parts)
        except Exception as exc:
            ok, value = False, SerializationError(
                f"the result of task {chunk.index} of {chunk.batch.name} arrived but could not be "
                f"unpickled in the master ({type(exc).__name__}: {exc}); results must be importable here"
            )
        self._settle(chunk, ok, value)

    def _settle(self, chunk: Chunk, ok: bool, value: Any) -> None:
        """Hand a finished chunk's outcome to its result object; the chunk is no longer outstanding."""
        try:
            chunk.batch.sink._set(chunk.index, ok, value)
        finally:
            with self.lock:
                self.chunks.pop(chunk.cid, None)
                self.changed.notify_all()

    # ------------------------------------------------------------------ workers
    def _spawn(self, n: int) -> None:
        for _ in range(max(0, n)):
            wid = next(self._wids)
            process = Process(
                target=run_worker,
                args=(self.address, wid, self.initializer, self.initargs, self.maxtasks),
                name=f"{self.name}-Worker-{wid}",
                daemon=True,
            )
            process.resources = dict(self.resources)
            w = WorkerSlot(wid, process, float("inf"))
            self.workers[wid] = w
            self._unlaunched.append(w)
        self._launch_more()

    def _launch_more(self) -> None:
        """Launch waiting slots while fewer than ``start_concurrency`` jobs are starting (lock held)."""
        if self.state == TERMINATE or self.broken is not None:
            return
        window = self.start_concurrency or len(self._unlaunched)
        while self._unlaunched and self._launching < window:
            w = self._unlaunched.popleft()
            if w.state != STARTING:
                continue
            w.launched = True
            self._launching += 1
            w.deadline = time.monotonic() + self.start_timeout
            self._submit(self._launch, w)

    def _started(self, w: WorkerSlot) -> None:
        """``w`` is ready, failed or gone: let the next job start (lock held)."""
        if w.launched and not w.settled:
            w.settled = True
            self._launching -= 1
            self._launch_more()

    def _launch(self, w: WorkerSlot) -> None:
        try:
            w.process.launch()  # type: ignore[union-attr]
        except BaseException as exc:
            w.launch_error = exc
            self._events.append(("launch_failed", w))
            self._wake.set()
            return
        if self.state == TERMINATE or w.state in (RETIRING, DEAD):
            self._kill(w)

    def _submit(self, fn: Callable[[WorkerSlot], None], w: WorkerSlot) -> None:
        """Run ``fn(w)`` on the launcher threads (job calls may be slow network calls)."""
        try:
            self._launcher.submit(fn, w)
        except RuntimeError:  # shut down: the pool is ending, do it here
            if fn == self._kill:
                fn(w)

    def live_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.state in (STARTING, READY))

    def ready_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.state == READY)

    def _work_left(self) -> bool:
        return bool(self.chunks) or self.feeders > 0

    def _maintain(self) -> None:
        """Start jobs until ``target`` workers are starting or ready (lock held)."""
        if self.state == TERMINATE or self.broken is not None or self.finished:
            return
        if self.state == CLOSE and not self._work_left():
            return
        missing = self.target - self.live_count()
        if missing > 0 and time.monotonic() >= self.next_spawn_at:
            self._spawn(missing)

    def _send_stop(self, w: WorkerSlot) -> None:
        try:
            self.channel.send([(P.STOP, [])], w.peer)
        except TransportError:
            pass

    def _retire(self, count: int) -> None:
        """Let ``count`` workers go: starting ones first, then the least busy (lock held)."""
        live = [w for w in self.workers.values() if w.state in (STARTING, READY)]
        live.sort(key=lambda w: (w.state != STARTING, len(w.pending), -w.wid))
        for w in live[:count]:
            if not w.launched:
                self._drop(w)
            elif w.state == STARTING and w.peer is None:
                w.state = RETIRING
                w.killed_by_pool = True
                self._submit(self._kill, w)
            else:
                w.state = RETIRING
                self._send_stop(w)

    def _drop(self, w: WorkerSlot) -> None:
        """Forget a slot whose job was never launched (lock held)."""
        w.state = DEAD
        self.workers.pop(w.wid, None)

    def resize(self, n: int) -> None:
        with self.lock:
            if self.state == TERMINATE:
                raise ValueError("Pool not running")
            self.target = n
            live = self.live_count()
            if live < n:
                self.next_spawn_at = 0.0
                self._spawn(n - live)
            elif live > n:
                self._retire(live - n)
        self._wake.set()

    def _kill(self, w: WorkerSlot) -> None:
        if w.process is not None and w.process.launched:
            try:
                w.process.kill()
            except Exception as exc:  # the job may be gone already
                log.debug("%s: kill %s: %s", self.name, w.name, exc)

    # ------------------------------------------------------------------ the supervisor thread
    def _peer_event(self, peer: Hashable, added: bool) -> None:
        if not added:
            self._events.append(("lost", peer))
            self._wake.set()

    def _supervise(self) -> None:
        last_poll = 0.0
        while True:
            self._wake.wait(0.1)
            self._wake.clear()
            if self.state == TERMINATE or self.finished:
                return
            try:
                while self._events:
                    kind, what = self._events.popleft()
                    if kind == "lost":
                        with self.lock:
                            w = self.by_peer.get(what)
                        if w is not None:
                            self._worker_gone(w, "its connection to the pool closed")
                    elif kind == "launch_failed":
                        self._start_failed(what, f"the backend could not create its job: {what.launch_error}")
                now = time.monotonic()
                poll_every = 0.1 if len(self.workers) <= 64 else 0.5
                if now - last_poll >= poll_every:
                    last_poll = now
                    self._poll_workers(now)
                if self.min_size is not None or self.max_size is not None:
                    self._autoscale(now)
                with self.lock:
                    self._maintain()
            except Exception:
                log.exception("%s: supervisor error (the pool keeps going)", self.name)

    def _poll_workers(self, now: float) -> None:
        with self.lock:
            workers = [w for w in self.workers.values() if w.state != DEAD and w.process is not None]
        for w in workers:
            if not w.process.launched:  # type: ignore[union-attr]
                continue
            code = w.poll()
            if code is not None:
                w.exitcode = code
                if w.state == STARTING:
                    self._start_failed(w, f"its job ended ({describe_exit(code)}) before it joined the pool")
                else:
                    self._worker_gone(w, f"its job ended ({describe_exit(code)})")
            elif w.state == STARTING and now > w.deadline:
                self._start_failed(w, f"it did not join the pool within {self.start_timeout:.0f} s (start_timeout)")

    def _worker_gone(self, w: WorkerSlot, why: str) -> None:
        with self.lock:
            if w.state == DEAD:
                return
            was = w.state
            w.state = DEAD
            self.by_peer.pop(w.peer, None)
            self.prefetched.discard(w)
            pending = list(w.pending.values())
            w.pending.clear()
        if w.poll() is None:
            self._kill(w)
        if w.process is not None and w.process.launched:
            w.process.join(5.0)
            w.exitcode = w.process.exitcode
        clean = was in (LEAVING, RETIRING) and not pending
        failed: list[Chunk] = []
        with self.lock:
            self.workers.pop(w.wid, None)
            self._started(w)
            if not clean and self.state != TERMINATE:
                log.warning("%s: worker %s is gone (%s; %s); %d task chunk(s) go back to the queue",
                            self.name, w.name, why, describe_exit(w.exitcode), len(pending))
                self.stats["replaced_workers"] += 1
            requeue = []
            for chunk in pending:
                if chunk.done:
                    continue
                if not w.killed_by_pool:
                    chunk.attempts += 1
                if chunk.attempts > self.retries:
                    failed.append(chunk)
                else:
                    requeue.append(chunk)
            self.stats["retried_chunks"] += len(requeue)
            self._requeue_front(requeue)
            self._maintain()
            self._pump()
            self.changed.notify_all()
        if failed:
            logs = self._logs(w)
            for chunk in failed:
                err = WorkerLostError(
                    f"{_items(chunk)} of {chunk.batch.name} {'were' if _items(chunk).startswith('items') else 'was'} "
                    f"lost: its worker {w.name} ({self._job_name(w)}) died ({why}; "
                    f"{describe_exit(w.exitcode)}), and it had already been retried {self.retries} "
                    f"time(s) on fresh workers (max_task_retries={self.retries}). "
                    f"{_likely_cause(w.exitcode)}\n  session: {self.rt.session}\n  last worker's logs:\n{logs}"
                )
                self._fail(chunk, err)

    def _fail(self, chunk: Chunk, exc: BaseException) -> None:
        with self.lock:
            if chunk.done:
                return
            chunk.done = True
        self._settle(chunk, False, exc)

    def _job_name(self, w: WorkerSlot) -> str:
        job = w.process.job if w.process is not None else None
        return f"job {job.jid} on {self.rt.backend}" if job is not None else "no job"

    def _logs(self, w: WorkerSlot) -> str:
        if w.process is None:
            return "(external worker: no logs)"
        try:
            text = w.process.logs().strip()
        except Exception as exc:
            return f"(logs unavailable: {exc})"
        return log_tail(text)

    def _start_failed(self, w: WorkerSlot, what: str) -> None:
        with self.lock:
            if w.state == DEAD:
                return
            was = w.state
            w.state = DEAD
            self.workers.pop(w.wid, None)
            self._started(w)
        if was == RETIRING or self.broken is not None:
            return
        self._kill(w)
        if w.process is not None and w.process.launched:
            err: BaseException = w.process.start_error(what)
        elif isinstance(w.launch_error, BaseException):
            err = w.launch_error
        else:  # pragma: no cover - a slot without a job
            err = JobStartError(f"{w.name} failed to start: {what}")
        log.warning("%s: worker %s failed to start: %s", self.name, w.name, what)
        with self.lock:
            self.failures_in_a_row += 1
            k = self.failures_in_a_row
            if self.ready_count() == 0 and k >= max(3, self.target):
                self._break(err, f"{k} worker jobs in a row failed to start and none is running")
                return
            self.next_spawn_at = time.monotonic() + min(5.0, 0.25 * 2 ** min(k, 5))

    def _break(self, exc: BaseException, why: str, deliver_cause: bool = False) -> None:
        """Nothing can run (initializer raises, jobs never start): fail every task with why.

        Tasks get a ProcessError that says why and carries the cause, or the cause
        itself when it is the user's own exception (``deliver_cause``).
        """
        with self.lock:
            if self.broken is not None:
                return
            self.broken = ProcessError(f"{why}:\n{exc}")
            self.broken.__cause__ = exc
            if not deliver_cause:
                exc = self.broken
            pending = list(self.chunks.values())
            self.queue.clear()
            workers = list(self.workers.values())
        log.error("%s: cannot run tasks: %s", self.name, why)
        for w in workers:
            w.killed_by_pool = True
            self._submit(self._kill, w)
        for chunk in pending:
            self._fail(chunk, exc)

    def _autoscale(self, now: float) -> None:
        lo = self.min_size if self.min_size is not None else 0
        hi = self.max_size if self.max_size is not None else max(self.target, lo)
        with self.lock:
            if self.state == TERMINATE:
                return
            busy = sum(1 for w in self.workers.values() if w.state == READY and w.pending)
            want = max(lo, min(hi, busy + len(self.queue)))
            if want > self.target:
                self._low_since = None
                self.resize(want)
            elif want < self.target:
                if self._low_since is None:
                    self._low_since = now
                elif now - self._low_since >= self.idle_timeout:
                    self._low_since = None
                    self.resize(want)
            else:
                self._low_since = None

    # ------------------------------------------------------------------ shutting down
    def close(self) -> None:
        with self.lock:
            if self.state == RUN:
                self.state = CLOSE
                self.changed.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait for outstanding tasks (after close), then let every worker go and wait for them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.state == TERMINATE:  # terminate() already killed and waited for every job
            return
        with self.changed:
            while self.state == CLOSE and self._work_left() and self.broken is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                self.changed.wait(0.2 if remaining is None else min(0.2, remaining))
            self.finished = True
            workers = list(self.workers.values())
            for w in workers:
                if w.state == READY:
                    w.state = RETIRING
                    self._send_stop(w)
                elif w.state == STARTING and not w.launched:
                    self._drop(w)
                elif w.state == STARTING:
                    w.state = RETIRING
                    w.killed_by_pool = True
                    self._submit(self._kill, w)
        for w in workers:
            if w.process is None or not w.launched:
                continue
            while not w.process.launched and w.launch_error is None and self.state != TERMINATE:
                time.sleep(0.01)  # still being launched
            if w.process.launched:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                w.process.join(remaining)
                if w.process.exitcode is None and deadline is not None:
                    return
        self._shutdown()

    def terminate(self) -> None:
        with self.lock:
            if self.state == TERMINATE:
                return
            self.state = TERMINATE
            workers = list(self.workers.values())
            pending = [c for c in self.chunks.values() if not c.done]
            self.queue.clear()
        for w in workers:
            w.killed_by_pool = True
        # Jobs being created now are killed once created (see _launch); wait for them.
        self._launcher.shutdown(wait=True, cancel_futures=True)
        self._kill_all(workers)
        for chunk in pending:
            self._fail(chunk, ProcessError(
                f"{self.name} was terminated before task {chunk.index} of {chunk.batch.name} finished"))
        for w in workers:
            if w.process is not None and w.process.launched:
                w.process.join(10.0)
        self._shutdown()

    def _kill_all(self, workers: list[WorkerSlot]) -> None:
        """Kill many jobs at once (each kill may be a network call on a cluster backend)."""
        if len(workers) > 1:
            try:
                with ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"{self.name}-kill") as ex:
                    list(ex.map(self._kill, workers))
                return
            except RuntimeError:  # at interpreter exit no executor takes work: one by one
                pass
        for w in workers:
            self._kill(w)

    def _shutdown(self) -> None:
        self.finished = True
        self._wake.set()
        self.channel.close()
        self._launcher.shutdown(wait=False)

    def worker_processes(self) -> list[Process]:
        with self.lock:
            return [w.process for w in self.workers.values() if w.process is not None and w.state != DEAD]



def _chunks(iterable: Iterable[Any], size: int) -> Iterator[list[Any]]:
    it = iter(iterable)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk


__all__ = ["Scheduler", "WorkerLostError"]
