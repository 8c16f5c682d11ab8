"""The master side of a Pool, built from three rooms with one job each::

    map_async ─▶ chunks ─▶ Dispatch: task queue ──pump──▶ worker W (≤ prefetch chunks)
                               ▲                               │ RESULT, READY, RETURNED, BYE
                               │ requeue                       ▼
                      pending table of W ◀── dispatcher thread (Scheduler._serve) ──▶ results
                               │ W died (connection lost / job exited)
                      Supervision thread: requeue W's chunks; Fleet starts a replacement

- :mod:`~fibercore.pool.dispatch`: the queue, pending tables, pump, STEAL, results.
- :mod:`~fibercore.pool.fleet`: the worker jobs: start (within a window), count,
  resize, retire, kill.
- :mod:`~fibercore.pool.supervision`: deaths, retries, start-failure backoff, a broken
  pool, autoscaling; its own thread.
- :mod:`~fibercore.pool.shared`: what every room reads (name, lock, life, health, settings).
- this module: makes the rooms and wires them, runs the dispatcher thread that routes
  each worker message to its room, and the pool's life (close, join, terminate).

The rooms form a DAG: shared <- dispatch <- fleet <- supervision <- scheduler. Each
is given the rooms below it and calls their methods; the fleet tells supervision of a
refused job through a callback wired here.

Lock rule: one RLock (``lock``, with the condition ``changed``) guards the state of
all three rooms, because a message usually changes two of them at once (a RESULT
frees a worker's room and pumps the queue). It is never held during a backend call,
while unpickling a result, or while user callbacks run.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from fibercore.errors import CancelledError, ProcessError, TransportError
from fibercore.pool import protocol as P
from fibercore.pool.dispatch import Dispatch
from fibercore.pool.fleet import Fleet
from fibercore.pool.records import (
    CLOSE,
    READY,
    RUN,
    TERMINATE,
    Batch,
    Chunk,
    WorkerSlot,
)
from fibercore.pool.shared import PoolSettings, PoolShared
from fibercore.pool.supervision import Supervision
from fibercore.process import Process
from fibercore.runtime import get_runtime
from fibercore.wire import malformed

log = logging.getLogger("fibercore.pool")


class Scheduler:
    """Owns the pool's endpoint and its rooms; what :class:`fibercore.pool.Pool` calls."""

    def __init__(self, *, processes: int, initializer: Callable[..., Any] | None, initargs: tuple[Any, ...],
                 maxtasks: int | None, resources: dict[str, Any], retries: int, name: str,
                 min_size: int | None = None, max_size: int | None = None, idle_timeout: float = 10.0,
                 error_retries: int = 0) -> None:
        rt = get_runtime()
        settings = PoolSettings(
            initializer=initializer, initargs=initargs, maxtasks=maxtasks, resources=resources,
            retries=retries, error_retries=error_retries,
            start_timeout=float(rt.config.get("start_timeout")),
            start_concurrency=int(rt.config.get("pool_start_concurrency") or 0))
        self.shared = shared = PoolShared(name, rt.listen("router", service="pool"), rt.serializer, settings,
                                          session=rt.session, backend=str(rt.backend))
        self.name = name
        self.serializer = shared.serializer
        self.channel = shared.channel
        self.address = shared.address
        self.lock = shared.lock
        self.changed = shared.changed
        self.stats = shared.stats

        self.dispatch = Dispatch(shared)
        self.fleet = Fleet(shared, self.dispatch, processes,
                           on_launch_failed=self._launch_failed, on_resized=self._resized)
        self.supervision = Supervision(shared, self.fleet, self.dispatch, min_size, max_size, idle_timeout)
        self.channel.on_peer_event(self.supervision.peer_event)
        self._dispatcher = threading.Thread(target=self._serve, name=f"{name}-dispatch", daemon=True)
        with self.lock:
            self.fleet.spawn(processes)
        self._dispatcher.start()
        self.supervision.start()

    @property
    def state(self) -> str:
        return self.shared.state

    @property
    def finished(self) -> bool:
        return self.shared.finished

    # -- what the fleet tells supervision (wired here: the fleet does not hold supervision) ----
    def _launch_failed(self, w: WorkerSlot) -> None:
        self.supervision.launch_failed(w)

    def _resized(self) -> None:
        self.supervision.wake()

    # -- what the Pool calls ---------------------------------------------------------------
    def check_running(self) -> None:
        if self.state != RUN:
            raise ValueError("Pool not running")
        broken = self.shared.broken
        if broken is not None:
            raise type(broken)(str(broken)) from broken  # the same error each call, a new traceback

    def new_batch(self, kind: int, func: Callable[..., Any] | None, sink: Any, what: str) -> Batch:
        return self.dispatch.new_batch(kind, func, sink, what)

    def add_chunk(self, batch: Batch, index: int, payload: list[Any]) -> None:
        self.dispatch.add_chunk(batch, index, payload)

    def submit_iterable(self, batch: Batch, kind: int, iterable: Iterable[Any], chunksize: int,
                        on_length: Callable[[int], None] | None, lazy: bool) -> None:
        self.dispatch.submit_iterable(batch, kind, iterable, chunksize, on_length, lazy)

    def cancel(self, batch: Batch, running: bool = True) -> bool:
        """Cancel what is left of ``batch``: queued chunks never run; a worker holding one is
        killed (its other chunks go back to the queue, uncounted) and replaced. With
        ``running`` False, only a batch no worker holds yet is cancelled. True when
        something was cancelled."""
        with self.lock:
            if self.state == TERMINATE:
                return False
            got = self.dispatch.cancel(batch, CancelledError(f"{batch.name} was cancelled"), running)
            if not got or not got[0]:
                return False
            chunks, workers = got
            for w in workers:
                w.killed_by_pool = True
                w.stopped_for_cancel = True
        for w in workers:
            self.fleet.submit(self.fleet.kill, w)
        for chunk in chunks:
            self.dispatch.settle(chunk, False, CancelledError(f"task {chunk.index} of {batch.name} was cancelled"))
        return True

    @property
    def target(self) -> int:
        return self.fleet.target

    def resize(self, n: int) -> None:
        self.fleet.resize(n)

    def ready_count(self) -> int:
        with self.lock:
            return self.fleet.ready_count()

    def worker_processes(self) -> list[Process]:
        return self.fleet.worker_processes()

    def view(self) -> dict[str, Any]:
        """What ``fiber top`` and the dashboard show of this pool: its workers and what each
        holds, tasks queued, counters, the last error (a copy, taken under the lock)."""
        with self.lock:
            workers = []
            for w in self.fleet.slots():
                held = self.dispatch.held_tasks(w)
                p = w.process
                job = p.job if p is not None and p.launched else None
                workers.append({
                    "name": w.name,
                    "state": ("busy" if held else "idle") if w.state == READY else w.state,
                    "tasks": held,
                    "jid": job.jid if job is not None else None,
                    "host": job.host if job is not None else None,
                })
            broken = self.shared.broken
            return {
                "name": self.name,
                "state": self.shared.state,
                "target": self.fleet.target,
                "workers": workers,
                "queued": self.dispatch.queued_tasks(),
                "running": sum(w["tasks"] for w in workers),
                "stats": dict(self.stats),
                "last_error": self.shared.last_error,
                "broken": f"{type(broken).__name__}: {broken}" if broken is not None else None,
            }

    # -- the dispatcher thread: each worker message to its room ---------------------------------
    def _serve(self) -> None:
        while True:
            try:
                messages, peer = self.channel.recv()
            except TransportError:  # the channel closed: the pool ended
                return
            try:
                self._handle_frame(messages, peer)
            except Exception:  # an authentic but malformed message must not stop the pool
                log.exception("%s: could not handle a message from %r", self.name, peer)

    def _handle_frame(self, messages: list[tuple[int, list[Any]]], peer: Hashable) -> None:
        deliveries: list[tuple[Chunk, bool, list[Any]]] = []
        with self.lock:
            w = self.fleet.slot_for(peer)
            for op, parts in messages:
                try:
                    w = self._handle_message(op, parts, peer, w, deliveries)
                except Exception as exc:  # authentic but malformed: counted, the rest still handled
                    malformed(self.address, peer, op, exc)
            if w is not None:
                self.dispatch.classify(w)
            self.dispatch.pump()
        for chunk, ok, parts in deliveries:
            self.dispatch.deliver(chunk, ok, parts)

    def _handle_message(self, op: int, parts: list[Any], peer: Hashable, w: WorkerSlot | None,
                        deliveries: list[tuple[Chunk, bool, list[Any]]]) -> WorkerSlot | None:
        """One message of a worker's frame (lock held); returns the worker slot it concerns."""
        if op == P.RESULT:
            self.dispatch.on_result(w, parts[0], parts[1:], deliveries)
        elif op == P.READY:
            w = self.fleet.on_ready(int(bytes(parts[0])), peer)
        elif op == P.INITFAIL:
            failed = self.fleet.slot(int(bytes(parts[0])))
            if failed is not None:
                self.supervision.on_initfail(failed, bytes(parts[1]).decode(errors="replace"), parts[2:])
        elif w is None:
            return w
        elif op == P.RETURNED:
            self.dispatch.take_back(w, P.read_ids(parts[0]))
            w.steal_sent = False
        elif op == P.BYE:
            self.dispatch.take_back(w, P.read_ids(parts[1]) if len(parts) > 1 else [])
            self.fleet.on_bye(w)
        return w

    # -- the pool's life ----------------------------------------------------------------------
    def close(self) -> None:
        with self.lock:
            if self.shared.state == RUN:
                self.shared.state = CLOSE
                self.changed.notify_all()

    def join(self, timeout: float | None = None) -> None:
        """Wait for outstanding tasks (after close), then let every worker go and wait for them."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self.state == TERMINATE:  # terminate() already killed and waited for every job
            return
        with self.changed:
            while self.state == CLOSE and self.dispatch.work_left() and self.shared.broken is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return
                self.changed.wait(0.2 if remaining is None else min(0.2, remaining))
            self.shared.finished = True
            workers = self.fleet.retire_all()
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
            self.shared.state = TERMINATE
            workers = self.fleet.slots()
            pending = self.dispatch.drop_all()
        for w in workers:
            w.killed_by_pool = True
        # Jobs being created now are killed once created (see Fleet._launch); wait for them.
        self.fleet.stop_launching(wait=True)
        self.fleet.kill_all(workers)
        for chunk in pending:
            self.dispatch.fail(chunk, ProcessError(
                f"{self.name} was terminated before task {chunk.index} of {chunk.batch.name} finished"))
        for w in workers:
            if w.process is not None and w.process.launched:
                w.process.join(10.0)
        self._shutdown()

    def _shutdown(self) -> None:
        self.shared.finished = True
        self.supervision.wake()
        self.channel.close()
        self.fleet.stop_launching(wait=False)


__all__ = ["Scheduler"]
