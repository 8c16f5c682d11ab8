"""The fleet: the pool's worker jobs, how many it wants, and starting and stopping them.

* ``target`` workers are kept starting or ready; a missing one is started again
  (unless the backoff says wait: supervision records failed starts in it).
* Jobs start at most ``pool_start_concurrency`` at a time (the backend's default:
  jobs sharing this machine's CPUs are ready sooner a few at a time; a cluster
  creates them all at once).
* ``resize(n)`` starts jobs or retires workers: STOP asks a ready worker to finish its
  running chunk, give back the rest and exit; a job still starting is killed.

Collaborators: the pool's :class:`~fibercore.pool.shared.PoolShared` and its dispatch (is
work left?), read; what happens here that supervision must know (a job the backend
refused, a resize) goes through the callbacks the scheduler wires.

Lock rules: ``workers``, ``by_peer``, ``target``, the backoff, the launch window and each
slot's ``state``/``peer``/launch fields change under the pool's lock. Backend calls (creating
and killing jobs, which may be network calls) run on the launcher threads, never
under the lock.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections import deque
from collections.abc import Callable, Hashable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from fibercore.errors import TransportError
from fibercore.pool import protocol as P
from fibercore.pool.records import (
    CLOSE,
    DEAD,
    LEAVING,
    READY,
    RETIRING,
    STARTING,
    TERMINATE,
    WorkerSlot,
)
from fibercore.pool.worker import run_worker
from fibercore.process import Process
from fibercore.util import make_room_for_jobs

if TYPE_CHECKING:
    from fibercore.pool.dispatch import Dispatch
    from fibercore.pool.shared import PoolShared

log = logging.getLogger("fibercore.pool")


class Backoff:
    """Starts that failed in a row, and when the next may happen: 0.25 s doubling to 5 s (lock held)."""

    def __init__(self) -> None:
        self.failures_in_a_row = 0
        self.next_start_at = 0.0

    def allows_start(self) -> bool:
        return time.monotonic() >= self.next_start_at

    def succeeded(self) -> None:
        self.failures_in_a_row = 0

    def failed(self) -> int:
        """Count a failed start; how many failed in a row now."""
        self.failures_in_a_row += 1
        return self.failures_in_a_row

    def wait_before_next(self) -> None:
        self.next_start_at = time.monotonic() + min(5.0, 0.25 * 2 ** min(self.failures_in_a_row, 5))

    def clear(self) -> None:
        self.next_start_at = 0.0


class Fleet:
    """Starts, counts, retires and kills the pool's worker jobs."""

    def __init__(self, shared: PoolShared, dispatch: Dispatch, target: int, *,
                 on_launch_failed: Callable[[WorkerSlot], None], on_resized: Callable[[], None]) -> None:
        self.shared = shared
        self.dispatch = dispatch
        self._on_launch_failed = on_launch_failed
        self._on_resized = on_resized
        self.backoff = Backoff()
        #: Live slots by worker id (DEAD slots are removed).
        self.workers: dict[int, WorkerSlot] = {}
        #: Connected slots by their connection (the peer id of the pool's channel).
        self.by_peer: dict[Hashable, WorkerSlot] = {}
        #: How many workers the pool wants (resize, autoscaling).
        self.target = target
        self.start_timeout = shared.settings.start_timeout
        self.start_concurrency = shared.settings.start_concurrency
        self._unlaunched: deque[WorkerSlot] = deque()
        self._launching = 0
        self._wids = itertools.count(1)
        self._launcher = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"{shared.name}-launch")

    # -- counting (lock held) -----------------------------------------------------------
    def live_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.state in (STARTING, READY))

    def ready_count(self) -> int:
        return sum(1 for w in self.workers.values() if w.state == READY)

    def slot(self, wid: int) -> WorkerSlot | None:
        return self.workers.get(wid)

    def slot_for(self, peer: Hashable) -> WorkerSlot | None:
        """The connected worker behind ``peer``, if it is still one of ours."""
        return self.by_peer.get(peer)

    def slots(self) -> list[WorkerSlot]:
        """The live slots, as a list the caller may keep (lock held)."""
        return list(self.workers.values())

    def worker_processes(self) -> list[Process]:
        with self.shared.lock:
            return [w.process for w in self.workers.values() if w.process is not None and w.state != DEAD]

    # -- starting (lock held) ------------------------------------------------------------
    def spawn(self, n: int) -> None:
        """Add ``n`` worker slots and launch as many as the start window allows."""
        shared, settings = self.shared, self.shared.settings
        for _ in range(max(0, n)):
            wid = next(self._wids)
            process = Process(
                target=run_worker,
                args=(shared.address, wid, settings.initializer, settings.initargs, settings.maxtasks),
                name=f"{shared.name}-Worker-{wid}",
                daemon=True,
            )
            process.resources = dict(settings.resources)
            w = WorkerSlot(wid, process, float("inf"))
            self.workers[wid] = w
            self._unlaunched.append(w)
        self._launch_more()

    def reserve(self, n: int) -> list[int]:
        """Slots for ``n`` workers this pool does not start (a benchmark's harness connects
        them itself with their ids); they count towards ``target`` (lock held)."""
        wids = []
        for _ in range(n):
            wid = next(self._wids)
            self.workers[wid] = WorkerSlot(wid, None, float("inf"))
            wids.append(wid)
        self.target += n
        return wids

    def _launch_more(self) -> None:
        """Launch waiting slots while fewer than ``start_concurrency`` jobs are starting."""
        if self.shared.state == TERMINATE or self.shared.broken is not None:
            return
        window = self.start_concurrency or len(self._unlaunched)
        while self._unlaunched and self._launching < window:
            w = self._unlaunched.popleft()
            if w.state != STARTING:
                continue
            w.launched = True
            self._launching += 1
            w.deadline = time.monotonic() + self.start_timeout
            self.submit(self._launch, w)

    def settled(self, w: WorkerSlot) -> None:
        """``w`` is ready, failed or gone: let the next job start."""
        if w.launched and not w.settled:
            w.settled = True
            self._launching -= 1
            self._launch_more()

    def _launch(self, w: WorkerSlot) -> None:
        """On a launcher thread: hand the job to the backend (no waiting for it to connect)."""
        try:
            w.process.launch()  # type: ignore[union-attr]
        except BaseException as exc:
            w.launch_error = exc
            self._on_launch_failed(w)
            return
        if self.shared.state == TERMINATE or w.state in (RETIRING, DEAD):
            self.kill(w)

    def submit(self, fn: Callable[[WorkerSlot], None], w: WorkerSlot) -> None:
        """Run ``fn(w)`` on the launcher threads (job calls may be slow network calls)."""
        try:
            self._launcher.submit(fn, w)
        except RuntimeError:  # shut down: the pool is ending, do it here
            if fn == self.kill:
                fn(w)

    def maintain(self) -> None:
        """Start jobs until ``target`` workers are starting or ready (lock held)."""
        shared = self.shared
        if shared.state == TERMINATE or shared.broken is not None or shared.finished:
            return
        if shared.state == CLOSE and not self.dispatch.work_left():
            return
        missing = self.target - self.live_count()
        if missing > 0 and self.backoff.allows_start():
            self.spawn(missing)

    # -- connections (lock held) ------------------------------------------------------------
    def on_ready(self, wid: int, peer: Hashable) -> WorkerSlot | None:
        """Worker ``wid`` connected as ``peer`` and may take tasks."""
        w = self.workers.get(wid)
        if w is None or w.peer is not None:
            log.warning("%s: READY from an unknown or already connected worker %s; ignored", self.shared.name, wid)
            return None
        w.peer = peer
        self.by_peer[peer] = w
        self.settled(w)
        if w.state == STARTING:
            w.state = READY
            self.backoff.succeeded()
        elif w.state == RETIRING:  # retired while it was starting
            self.send_stop(w)
        return w

    def on_bye(self, w: WorkerSlot) -> None:
        """``w`` said it leaves (maxtasksperchild reached, or STOP answered)."""
        if w.state != DEAD:
            w.state = LEAVING
        self.maintain()

    # -- stopping ------------------------------------------------------------------------------
    def send_stop(self, w: WorkerSlot) -> None:
        try:
            self.shared.channel.send([(P.STOP, [])], w.peer)
        except TransportError:
            pass

    def retire(self, count: int) -> None:
        """Let ``count`` workers go: starting ones first, then the least busy (lock held)."""
        live = [w for w in self.workers.values() if w.state in (STARTING, READY)]
        live.sort(key=lambda w: (w.state != STARTING, len(w.pending), -w.wid))
        for w in live[:count]:
            if not w.launched:
                self.drop(w)
            elif w.state == STARTING and w.peer is None:
                w.state = RETIRING
                w.killed_by_pool = True
                self.submit(self.kill, w)
            else:
                w.state = RETIRING
                self.send_stop(w)

    def mark_dead(self, w: WorkerSlot) -> str | None:
        """Mark ``w`` DEAD; its state before, or None when it was dead already (lock held)."""
        if w.state == DEAD:
            return None
        was, w.state = w.state, DEAD
        return was

    def drop(self, w: WorkerSlot) -> None:
        """Forget a slot whose job was never launched (lock held)."""
        w.state = DEAD
        self.workers.pop(w.wid, None)

    def disconnect(self, w: WorkerSlot) -> None:
        """Messages from ``w``'s connection no longer reach its slot (lock held)."""
        if w.peer is not None:
            self.by_peer.pop(w.peer, None)

    def remove(self, w: WorkerSlot) -> None:
        """Forget a dead worker's slot and its connection (lock held)."""
        self.disconnect(w)
        self.workers.pop(w.wid, None)

    def resize(self, n: int) -> None:
        with self.shared.lock:
            if self.shared.state == TERMINATE:
                raise ValueError("Pool not running")
            self.target = n
            live = self.live_count()
            if live < n:
                make_room_for_jobs(n - live, f"{self.shared.name} resized to {n} workers")
                self.backoff.clear()
                self.spawn(n - live)
            elif live > n:
                self.retire(live - n)
        self._on_resized()

    def retire_all(self) -> list[WorkerSlot]:
        """Ask every worker to go (STOP; a starting job is killed) when the pool ends (lock held)."""
        workers = list(self.workers.values())
        for w in workers:
            if w.state == READY:
                w.state = RETIRING
                self.send_stop(w)
            elif w.state == STARTING and not w.launched:
                self.drop(w)
            elif w.state == STARTING:
                w.state = RETIRING
                w.killed_by_pool = True
                self.submit(self.kill, w)
        return workers

    def kill(self, w: WorkerSlot) -> None:
        if w.process is not None and w.process.launched:
            try:
                w.process.kill()
            except Exception as exc:  # the job may be gone already
                log.debug("%s: kill %s: %s", self.shared.name, w.name, exc)

    def kill_all(self, workers: list[WorkerSlot]) -> None:
        """Kill many jobs at once (each kill may be a network call on a cluster backend)."""
        if len(workers) > 1:
            try:
                with ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"{self.shared.name}-kill") as ex:
                    list(ex.map(self.kill, workers))
                return
            except RuntimeError:  # at interpreter exit no executor takes work: one by one
                pass
        for w in workers:
            self.kill(w)

    def stop_launching(self, wait: bool) -> None:
        """No more launches; with ``wait``, jobs being created now are created (and, the pool
        terminating, killed by :meth:`_launch`) before this returns."""
        self._launcher.shutdown(wait=wait, cancel_futures=wait)
