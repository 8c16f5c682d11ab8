"""Dispatch: the pool's task queue, the pending tables and the pump (paper: the task queue).

* A chunk leaves the queue into the pending table of the worker it was sent to; its
  RESULT removes it. The first result of a chunk wins; a late duplicate (from a
  worker declared dead whose result was already in flight) is dropped, so each
  result is delivered exactly once.
* Workers pull: a worker holds at most ``prefetch`` chunks (2, more for tiny tasks,
  one at a time for long ones, adapted from measured chunk times). When the queue is
  empty and a worker idles, chunks prefetched by busy workers but not started are
  stolen back (STEAL), so no task waits behind a slow worker. A large chunk (1 MiB of
  arguments or more, :data:`~fibercore.pool.records.LARGE_CHUNK`) is never prefetched: it
  waits at the head of the queue for a worker that holds nothing, so no worker keeps a
  large frame besides the task it runs.
* A worker whose current chunk has run far longer than usual (:meth:`Dispatch.straggle_after`:
  a long task among short ones) is given nothing more to hold, and what it holds unstarted
  is stolen back, packing or not: the supervisor's thread checks when the first worker
  that holds more than its running chunk could become such a straggler
  (:meth:`Dispatch.check_stragglers`).

Lock rules: every field below, and the dispatch fields of each
:class:`~fibercore.pool.records.WorkerSlot`, change under the pool's lock
(``shared.lock``, the RLock of :class:`~fibercore.pool.shared.PoolShared`). Unpickling results and handing them to
result objects (which run user callbacks) happen outside it.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from fibercore.errors import SerializationError, TransportError
from fibercore.pool import protocol as P
from fibercore.pool.records import READY, TERMINATE, Batch, Chunk, WorkerSlot, chunk_items, chunked, func_name
from fibercore.serialization import dumps_or_explain
from fibercore.wire.frames import nbytes

if TYPE_CHECKING:
    from fibercore.pool.shared import PoolShared

MAX_PREFETCH = 32
#: Chunks at least this long (on average) are prefetched one at a time.
LONG_CHUNK = 0.02
#: A chunk running this long, and 20 times the average chunk, marks its worker a straggler.
STRAGGLER = 0.02
#: Chunks shorter than this (on average) are packed: a worker that already has work is
#: filled up to its prefetch (about 0.5 ms of work) before an idle one is woken.
PACK_BELOW = 0.00005
#: A map's chunks are queued in groups of this many, or of what was cut in this long.
GROUP_CHUNKS = 16
GROUP_SECONDS = 0.001
#: ... or of this many bytes: big chunks go one by one, as they always did (a worker's frame
#: is sent under the pool's lock; megabytes of them at once waited on a worker whose own
#: results waited on that lock).
GROUP_BYTES = 64 << 10


class Dispatch:
    """Queues chunks and hands them to workers with room."""

    def __init__(self, shared: PoolShared) -> None:
        self.shared = shared
        #: Chunks waiting, oldest first; chunks of a dead worker go back to the front.
        self.queue: deque[Chunk] = deque()
        #: Every outstanding chunk by id: queued, pending at a worker, or being delivered.
        self.chunks: dict[int, Chunk] = {}
        #: READY workers with nothing pending / with room for more (lazily cleaned).
        self.idle_q: deque[WorkerSlot] = deque()
        self.room_q: deque[WorkerSlot] = deque()
        #: Workers holding two chunks or more: where STEAL takes chunks back from.
        self.prefetched: set[WorkerSlot] = set()
        self.prefetch = 2
        #: Tiny chunks: fill awake workers before waking idle ones (see :data:`PACK_BELOW`).
        self.packing = False
        self.avg_chunk: float | None = None
        #: When :meth:`check_stragglers` should next run (None: no worker holds queued chunks),
        #: and how to wake the thread that runs it (set by the supervisor).
        self.straggle_at: float | None = None
        self.wake_checker: Callable[[], None] = lambda: None
        #: Lazy iterables still being cut into chunks by feeder threads.
        self.feeders = 0
        self._cids = itertools.count(1)
        self._bids = itertools.count(1)
        self._function_ids: OrderedDict[int, tuple[list[Any], int]] = OrderedDict()

    # -- submitting (caller threads) --------------------------------------------------
    def new_batch(self, kind: int, func: Callable[..., Any] | None, sink: Any, what: str) -> Batch:
        """A batch for one call. Its ``bid`` names its function in the workers' caches:
        batches whose pickled function is the very same (a serializer returns the same
        parts for an unchanged function) share it, so workers get the function once."""
        if kind == P.APPLY:
            return Batch(next(self._bids), kind, None, sink, f"{what}({func_name(func)})")
        func_parts = dumps_or_explain(self.shared.serializer, func, f"the function given to {what}")
        with self.shared.lock:
            known = self._function_ids.get(id(func_parts))
            if known is not None and known[0] is func_parts:
                bid = known[1]
                self._function_ids.move_to_end(id(func_parts))
            else:
                bid = next(self._bids)
                self._function_ids[id(func_parts)] = (func_parts, bid)
                if len(self._function_ids) > P.FUNC_CACHE:
                    self._function_ids.popitem(last=False)
        return Batch(bid, kind, func_parts, sink, f"{what}({func_name(func)})")

    def add_chunk(self, batch: Batch, index: int, payload: list[Any]) -> None:
        self.add_chunks(batch, [(index, payload)])

    def add_chunks(self, batch: Batch, cut: list[tuple[int, list[Any]]]) -> None:
        """Queue chunks (index, payload) of ``batch`` and hand them out in one pump: a worker
        gets the chunks meant for it in one frame."""
        with self.shared.lock:
            if self.shared.state == TERMINATE:
                raise ValueError("Pool not running")
            failure = self.shared.task_error or batch.cancelled
            if failure is None:
                for index, payload in cut:
                    chunk = Chunk(next(self._cids), batch, index, payload)
                    self.chunks[chunk.cid] = chunk
                    self.queue.append(chunk)
                self.pump()
                return
        # The pool broke after the call checked it (its first job failed to start meanwhile):
        # these chunks fail as the queued ones did, rather than wait for a worker forever.
        for index, _payload in cut:
            self.fail_chunk_now(batch, index, failure)

    def fail_chunk_now(self, batch: Batch, index: int, exc: BaseException) -> None:
        """Deliver a failure that happened in the master (e.g. the input iterable raised)."""
        batch.sink._set(index, False, exc)

    def submit_iterable(self, batch: Batch, kind: int, iterable: Iterable[Any], chunksize: int,
                        on_length: Callable[[int], None] | None, lazy: bool) -> None:
        """Cut ``iterable`` into chunks and queue them, here or in a feeder thread."""
        shared = self.shared

        def feed() -> None:
            index = 0
            # A list's chunks go out in groups (one frame per worker and group); a lazy
            # iterable's one by one, as they come (the next may be long in coming).
            group: list[tuple[int, list[Any]]] = []
            started, size = 0.0, 0
            try:
                for items in chunked(iterable, chunksize):
                    try:
                        payload = dumps_or_explain(shared.serializer, items, f"an item of {batch.name}")
                    except SerializationError as exc:  # as multiprocessing: raised by get(),
                        original = exc.__cause__ if isinstance(exc.__cause__, Exception) else exc
                        if original is not exc:  # the pickling error itself, with the explanation
                            original.add_note(str(exc))
                        self.fail_chunk_now(batch, index, original)
                        index += 1
                        continue
                    if lazy:
                        self.add_chunk(batch, index, payload)
                    else:
                        if not group:
                            started, size = time.perf_counter(), 0
                        group.append((index, payload))
                        size += sum(map(nbytes, payload))
                        if (len(group) >= GROUP_CHUNKS or size >= GROUP_BYTES
                                or time.perf_counter() - started > GROUP_SECONDS):
                            self.add_chunks(batch, group)
                            group = []
                    index += 1
                if group:
                    self.add_chunks(batch, group)
            except Exception as exc:
                if not lazy:
                    raise
                if shared.state == TERMINATE:
                    return
                self.fail_chunk_now(batch, index, exc)
                index += 1
            finally:
                if lazy:
                    with shared.lock:
                        self.feeders -= 1
                        shared.changed.notify_all()
            if on_length is not None:
                on_length(index)

        if not lazy:
            feed()
            return
        with shared.lock:
            self.feeders += 1
        threading.Thread(target=feed, name=f"{shared.name}-feed", daemon=True).start()

    def work_left(self) -> bool:
        """Whether chunks are outstanding or still to come (lock held)."""
        return bool(self.chunks) or self.feeders > 0

    # -- handing out (lock held) ------------------------------------------------------------
    def _capacity(self, w: WorkerSlot) -> int:
        room = self.prefetch - len(w.pending)
        if self.shared.settings.maxtasks is not None:
            room = min(room, self.shared.settings.maxtasks - w.sent)
        return room

    def classify(self, w: WorkerSlot) -> None:
        """File ``w`` under idle, with-room or prefetched after its pending table changed."""
        if len(w.pending) >= 2:
            self.prefetched.add(w)
            if self.straggle_at is None:  # the first worker to hold queued chunks: watch it
                self.straggle_at = w.busy_since + self.straggle_after()
                self.wake_checker()
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

    def forget(self, w: WorkerSlot) -> list[Chunk]:
        """``w`` is gone: no more chunks go to it or are stolen from it; the chunks it held,
        which the caller requeues or fails (lock held)."""
        self.prefetched.discard(w)
        pending = list(w.pending.values())
        w.pending.clear()
        return pending

    def queued_tasks(self) -> int:
        """The user's tasks waiting in the queue (lock held)."""
        return sum(chunk_items(c) for c in self.queue if not c.done)

    def held_tasks(self, w: WorkerSlot) -> int:
        """The user's tasks ``w`` holds: running or waiting at the worker (lock held)."""
        return sum(chunk_items(c) for c in w.pending.values())

    def queued(self) -> int:
        """Chunks waiting for a worker (lock held)."""
        return len(self.queue)

    def _next_worker(self) -> WorkerSlot | None:
        """Idle workers first (work spreads); when packing, workers with work and room first.

        Packing is for chunks that take less time than waking a worker: eight workers on two
        cores each woken for a few microseconds of work made a map of 64 small numpy tasks
        3x slower than multiprocessing, whose running workers take the next task themselves.
        """
        if self.packing:
            return self._with_room() or self._idle()
        return self._idle() or self._with_room()

    def _idle(self) -> WorkerSlot | None:
        while self.idle_q:
            # packing: the worker idle the shortest time (its cache and maybe its CPU still warm)
            w = self.idle_q.pop() if self.packing else self.idle_q.popleft()
            w.in_idle = False
            if w.state == READY and not w.pending and self._capacity(w) > 0:
                return w
            self.classify(w)
        return None

    def _with_room(self) -> WorkerSlot | None:
        """A worker with work and room, unless it is a straggler (:meth:`straggling`): nothing
        waits behind a long task. A straggler is filed again when its result comes."""
        now = time.monotonic()
        while self.room_q:
            w = self.room_q.popleft()
            w.in_room = False
            if self.straggling(w, now):
                continue
            if w.state == READY and self._capacity(w) > 0:
                return w
            self.classify(w)
        return None

    def straggle_after(self) -> float:
        """Seconds after which a running chunk marks its worker a straggler."""
        return max(STRAGGLER, 20 * self.avg_chunk) if self.avg_chunk is not None else STRAGGLER

    def straggling(self, w: WorkerSlot, now: float) -> bool:
        """Whether ``w`` has run its current chunk far longer than usual (lock held)."""
        return bool(w.pending) and now - w.busy_since > self.straggle_after()

    def check_stragglers(self, now: float) -> None:
        """Take back what stragglers hold unstarted (lock held; the supervisor's thread, at
        :attr:`straggle_at`), and say when to look again."""
        after = self.straggle_after()
        soonest: float | None = None
        for w in list(self.prefetched):
            if w.state != READY or len(w.pending) < 2 or w.steal_sent:
                continue
            if now - w.busy_since > after:
                w.steal_sent = True
                try:
                    self.shared.channel.send([(P.STEAL, [])], w.peer)
                except TransportError:
                    pass
            elif soonest is None or w.busy_since + after < soonest:
                soonest = w.busy_since + after
        self.straggle_at = soonest

    def _task_message(self, w: WorkerSlot, chunk: Chunk) -> tuple[int, list[Any]]:
        batch = chunk.batch
        if batch.func_parts is None or batch.bid in w.known:
            return P.TASK, [P.task_header(chunk.cid, batch.bid, batch.kind, 0), *chunk.payload]
        w.known[batch.bid] = None
        if len(w.known) > P.FUNC_CACHE:
            w.known.popitem(last=False)
        head = P.task_header(chunk.cid, batch.bid, batch.kind, len(batch.func_parts))
        return P.TASK, [head, *batch.func_parts, *chunk.payload]

    def pump(self) -> None:
        """Hand queued chunks to workers with room, idle workers first; then steal if needed."""
        if self.shared.state == TERMINATE:
            return
        sends: dict[WorkerSlot, list[tuple[int, list[Any]]]] = {}
        while self.queue:
            chunk = self.queue[0]
            if chunk.done:
                self.queue.popleft()
                continue
            w = self._idle() if chunk.large else self._next_worker()
            if w is None:
                break
            self.queue.popleft()
            sends.setdefault(w, []).append(self._task_message(w, chunk))
            if not w.pending:
                w.busy_since = time.monotonic()
            w.pending[chunk.cid] = chunk
            w.sent += 1
            chunk.last_worker = w
            self.classify(w)
        channel = self.shared.channel
        for w, messages in sends.items():
            try:
                channel.send(messages, w.peer)
            except TransportError:  # the worker is going; its loss puts the chunks back
                pass
        if not self.queue and self.idle_q and self.prefetched and not self.packing:
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
                    self.shared.channel.send([(P.STEAL, [])], w.peer)
                except TransportError:
                    pass

    def requeue_front(self, chunks: Iterable[Chunk]) -> None:
        """Put chunks back at the head of the queue, oldest first (lock held)."""
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
        self.packing = self.avg_chunk < PACK_BELOW

    # -- answers (lock held, except delivery) -------------------------------------------------
    def on_result(self, w: WorkerSlot | None, header: Any, parts: list[Any],
                  deliveries: list[tuple[Chunk, bool, list[Any]]]) -> None:
        """A RESULT: the chunk leaves its pending table; the first result of a chunk is
        queued in ``deliveries`` (delivered by :meth:`deliver` once the lock is released)."""
        cid, ok, micros = P.read_result_header(header)
        chunk = w.pending.pop(cid, None) if w is not None else None
        if chunk is not None and w is not None and w.pending:
            w.busy_since = time.monotonic()  # its next chunk starts now
        if chunk is None:
            chunk = self.chunks.get(cid)
        if chunk is None or chunk.done:
            self.shared.stats["duplicate_results"] += 1
            return  # a duplicate: the chunk's first result already won
        self._note_time(micros)
        if not ok and chunk.errors < self.shared.settings.error_retries and self.shared.state != TERMINATE:
            # error_handling (the original fiber's resilient pool): the function raised; run
            # the chunk again, a bounded number of times, before its error is the result.
            chunk.errors += 1
            self.shared.stats["rerun_after_error"] += 1
            self.requeue_front([chunk])
            return
        chunk.done = True
        deliveries.append((chunk, ok, parts))

    def take_back(self, w: WorkerSlot, cids: list[int]) -> None:
        """Chunks ``w`` gave back unstarted (after STEAL or STOP) go to the queue's front."""
        back = [w.pending.pop(cid) for cid in cids if cid in w.pending]
        w.sent -= len(back)
        self.shared.stats["stolen_chunks"] += len(back)
        self.requeue_front(back)

    def deliver(self, chunk: Chunk, ok: bool, parts: list[Any]) -> None:
        """Unpickle a result and hand it to its result object (lock not held)."""
        try:
            value = self.shared.serializer.loads(parts)
        except Exception as exc:
            ok, value = False, SerializationError(
                f"the result of task {chunk.index} of {chunk.batch.name} arrived but could not be "
                f"unpickled in the master ({type(exc).__name__}: {exc}); results must be importable here"
            )
        self.settle(chunk, ok, value)

    def settle(self, chunk: Chunk, ok: bool, value: Any) -> None:
        """Hand a finished chunk's outcome to its result object; the chunk is no longer outstanding."""
        try:
            chunk.batch.sink._set(chunk.index, ok, value)
        finally:
            with self.shared.lock:
                self.chunks.pop(chunk.cid, None)
                self._count(chunk, ok, value)
                self.shared.changed.notify_all()

    def _count(self, chunk: Chunk, ok: bool, value: Any) -> None:
        """The pool's task counters (``Pool.stats``, fiber top) for one outcome (lock held)."""
        stats = self.shared.stats
        if ok:
            stats["done_tasks"] += chunk_items(chunk)
        elif isinstance(value, concurrent.futures.CancelledError):
            stats["cancelled_tasks"] += chunk_items(chunk)
        else:
            stats["failed_tasks"] += chunk_items(chunk)
            self.shared.last_error = (time.time(), f"{chunk.batch.name}: {type(value).__name__}: {value}"[:300])

    def fail(self, chunk: Chunk, exc: BaseException) -> None:
        """Fail ``chunk`` with ``exc`` unless it has an outcome already (lock not held)."""
        with self.shared.lock:
            if chunk.done:
                return
            chunk.done = True
        self.settle(chunk, False, exc)

    def cancel(self, batch: Batch, exc: BaseException, running: bool) -> tuple[list[Chunk], list[WorkerSlot]] | None:
        """Cancel ``batch``'s outstanding chunks (lock held): they are marked done (the pump
        skips a done chunk), and chunks still to be cut fail with ``exc``. Returns them, and
        the workers holding some, which the caller stops. With ``running`` False nothing
        changes when a worker holds one (None)."""
        outstanding = [c for c in self.chunks.values() if c.batch is batch and not c.done]
        held = [c for c in outstanding if c.last_worker is not None and c.cid in c.last_worker.pending]
        if held and not running:
            return None
        batch.cancelled = exc
        workers: dict[int, WorkerSlot] = {}
        for chunk in outstanding:
            chunk.done = True
        for chunk in held:
            w = chunk.last_worker
            assert w is not None
            w.pending.pop(chunk.cid, None)
            workers[w.wid] = w
        return outstanding, list(workers.values())

    def drop_all(self) -> list[Chunk]:
        """Empty the queue; the chunks still without an outcome (lock held)."""
        self.queue.clear()
        return [c for c in self.chunks.values() if not c.done]
