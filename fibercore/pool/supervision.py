"""Supervision: the pool's failure policy, in its own thread (paper: Error Handling).

* A worker's death (SIGKILL, OOM, node loss, job deleted; seen as its connection
  closing or its job ending) puts its pending chunks back at the front of the queue;
  each such chunk is retried up to ``max_task_retries`` times, then fails with
  :class:`~fibercore.errors.WorkerLostError` naming the task, the worker's exit status
  and its logs. A task that *raises* is not retried: its exception goes to the caller.
* A job that fails to start is replaced after a backoff (0.25 s doubling to 5 s);
  when ``max(3, target)`` starts in a row fail and no worker runs, or the initializer
  raises, the pool is *broken*: every task fails with the reason.
* The adaptive mode (``min_processes``/``max_processes``) moves the target with the
  backlog.

Collaborators: the pool's :class:`~fibercore.pool.shared.PoolShared` (``broken`` and
``task_error`` are set here), the fleet and the dispatch, through their methods.

Lock rules: ``broken``, ``task_error`` and the fleet's backoff change under the pool's
lock; ``events`` is appended to from any thread without it (a deque) and
drained by the supervisor thread, which also owns the adaptive fields. Backend calls
(job status, kill, join, logs) run in this thread without the lock.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import TYPE_CHECKING, Any

from fibercore.errors import BackendUnavailableError, JobStartError, ProcessError, WorkerLostError
from fibercore.pool.records import (
    DEAD,
    LEAVING,
    READY,
    RETIRING,
    STARTING,
    TERMINATE,
    Chunk,
    WorkerSlot,
    items_text,
)
from fibercore.util import debug_enabled, describe_exit, log_tail

if TYPE_CHECKING:
    from fibercore.pool.dispatch import Dispatch
    from fibercore.pool.fleet import Fleet
    from fibercore.pool.shared import PoolShared

log = logging.getLogger("fibercore.pool")


def likely_cause(code: int | None) -> str:
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


#: Seconds between looks at the jobs of a pool whose workers are all connected (each look asks
#: the backend about every job; a dead worker is noticed by its connection first).
SETTLED_POLL = 5.0
#: The same when every worker runs on this machine: their private connections end the moment
#: their jobs do (which wakes the supervisor at once), so the look is only a safety net for a
#: connection a job's own forked child kept open; an idle pool then wakes no thread.
LOCAL_SETTLED_POLL = 60.0


class Supervision:
    """Notices dead and failed workers, reruns their tasks, backs off, autoscales."""

    def __init__(self, shared: PoolShared, fleet: Fleet, dispatch: Dispatch, min_size: int | None,
                 max_size: int | None, idle_timeout: float) -> None:
        self.shared = shared
        self.fleet = fleet
        self.dispatch = dispatch
        self.min_size = min_size
        self.max_size = max_size
        self.idle_timeout = idle_timeout
        self._low_since: float | None = None
        self._events: deque[tuple[str, Any]] = deque()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"{shared.name}-supervise", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    # -- what other threads report (no lock needed) ---------------------------------------
    def peer_event(self, peer: Hashable, added: bool) -> None:
        """The channel's callback: a connection closed means its worker may be gone."""
        if not added:
            self._events.append(("lost", peer))
            self._wake.set()

    def launch_failed(self, w: WorkerSlot) -> None:
        """The backend refused to create ``w``'s job (``w.launch_error``)."""
        self._events.append(("launch_failed", w))
        self._wake.set()

    # -- the supervisor thread ----------------------------------------------------------------
    def _run(self) -> None:
        shared, fleet = self.shared, self.fleet
        last_poll = 0.0
        poll_every = 0.1
        dispatch = self.dispatch
        dispatch.wake_checker = self._wake.set
        while True:
            timeout = poll_every
            straggle_at = dispatch.straggle_at
            if straggle_at is not None:
                timeout = min(timeout, max(0.0, straggle_at - time.monotonic()))
            self._wake.wait(timeout)
            self._wake.clear()
            if shared.state == TERMINATE or shared.finished:
                return
            try:
                straggle_at = dispatch.straggle_at
                if straggle_at is not None and time.monotonic() >= straggle_at:
                    with shared.lock:
                        dispatch.check_stragglers(time.monotonic())
                while self._events:
                    kind, what = self._events.popleft()
                    if kind == "lost":
                        with shared.lock:
                            w = fleet.slot_for(what)
                        if w is not None:
                            self.worker_gone(w, "its connection to the pool closed")
                    elif kind == "launch_failed":
                        self.start_failed(what, f"the backend could not create its job: {what.launch_error}")
                now = time.monotonic()
                poll_every = self._poll_interval()
                if now - last_poll >= poll_every:
                    last_poll = now
                    self._poll_workers(now)
                if self.min_size is not None or self.max_size is not None:
                    self._autoscale(now)
                with shared.lock:
                    fleet.maintain()
            except Exception:
                log.exception("%s: supervisor error (the pool keeps going)", shared.name)

    def _poll_interval(self) -> float:
        """How often job states are polled: often while jobs start (their start deadline) or
        the pool adapts its size; once a second when it only waits (a job that dies closes
        its connection, which wakes this thread at once; on another machine the heartbeat
        declares a silent one lost after ``heartbeat_timeout``): every :data:`SETTLED_POLL` seconds, or
        :data:`LOCAL_SETTLED_POLL` when every worker is on this machine."""
        fleet = self.fleet
        if self.min_size is not None or self.max_size is not None:
            return 0.1
        with self.shared.lock:
            slots = fleet.slots()
            settled = all(w.state == READY for w in slots)  # none starts, retires or leaves
            size = len(slots)
        if not settled:
            return 0.1 if size <= 64 else 0.5
        if size >= fleet.target and all(getattr(w.peer, "private", False) for w in slots):
            return LOCAL_SETTLED_POLL
        return SETTLED_POLL

    def _poll_workers(self, now: float) -> None:
        with self.shared.lock:
            workers = [w for w in self.fleet.slots() if w.state != DEAD and w.process is not None]
        for w in workers:
            if not w.process.launched:  # type: ignore[union-attr]
                continue
            code = w.poll()
            if code is not None:
                w.exitcode = code
                lost = w.lost()
                peer = w.peer
                if w.state == STARTING:
                    self.start_failed(w, f"its job ended ({lost or describe_exit(code)}) before it joined the pool")
                else:
                    self.worker_gone(w, lost or f"its job ended ({describe_exit(code)})")
                if lost is not None and peer is not None:  # nothing more is read from it
                    with self.shared.lock:
                        self.shared.stats["lost_silent"] += 1
                    self.shared.channel.drop(peer)
            elif w.state == STARTING and now > w.deadline:
                self.start_failed(w, f"it did not join the pool within {self.fleet.start_timeout:.0f} s "
                                     "(start_timeout)")

    def worker_gone(self, w: WorkerSlot, why: str) -> None:
        """``w`` died: its chunks go back to the queue (or fail after their retries), the
        fleet starts a replacement."""
        shared, fleet, dispatch = self.shared, self.fleet, self.dispatch
        retries = shared.settings.retries
        with shared.lock:
            was = fleet.mark_dead(w)
            if was is None:
                return
            fleet.disconnect(w)
            pending = dispatch.forget(w)
        if w.poll() is None:
            fleet.kill(w)
        if w.process is not None and w.process.launched:
            w.process.join(5.0)
            w.exitcode = w.process.exitcode
        clean = was in (LEAVING, RETIRING) and not pending
        failed: list[Chunk] = []
        with shared.lock:
            fleet.remove(w)
            fleet.settled(w)
            if w.stopped_for_cancel:
                log.debug("%s: worker %s stopped for a cancelled task; %d other chunk(s) go back to the queue",
                          shared.name, w.name, len(pending))
            elif not clean and shared.state != TERMINATE:
                log.warning("%s: worker %s is gone (%s; %s); %d task chunk(s) go back to the queue",
                            shared.name, w.name, why, describe_exit(w.exitcode), len(pending))
                shared.stats["replaced_workers"] += 1
            requeue = []
            for chunk in pending:
                if chunk.done:
                    continue
                if not w.killed_by_pool:
                    chunk.attempts += 1
                if chunk.attempts > retries:
                    failed.append(chunk)
                else:
                    requeue.append(chunk)
            shared.stats["retried_chunks"] += len(requeue)
            dispatch.requeue_front(requeue)
            fleet.maintain()
            dispatch.pump()
            shared.changed.notify_all()
        if failed:
            logs = self._logs(w)
            for chunk in failed:
                what = items_text(chunk)
                err = WorkerLostError(
                    f"{what} of {chunk.batch.name} {'were' if what.startswith('items') else 'was'} "
                    f"lost: its worker {w.name} ({self._job_name(w)}) died ({why}; "
                    f"{describe_exit(w.exitcode)}), and it had already been retried {retries} "
                    f"time(s) on fresh workers (max_task_retries={retries}). "
                    f"{likely_cause(w.exitcode)}\n  session: {shared.session}\n  last worker's logs:\n{logs}"
                )
                dispatch.fail(chunk, err)

    def _job_name(self, w: WorkerSlot) -> str:
        job = w.process.job if w.process is not None else None
        return f"job {job.jid} on {self.shared.backend}" if job is not None else "no job"

    def _logs(self, w: WorkerSlot) -> str:
        if w.process is None:
            return "(external worker: no logs)"
        try:
            text = w.process.logs().strip()
        except Exception as exc:
            return f"(logs unavailable: {exc})"
        return log_tail(text)

    def start_failed(self, w: WorkerSlot, what: str) -> None:
        """``w``'s job never joined: back off before the next start, or break the pool when
        starts keep failing and nothing runs."""
        shared, fleet = self.shared, self.fleet
        with shared.lock:
            was = fleet.mark_dead(w)
            if was is None:
                return
            fleet.remove(w)
            fleet.settled(w)
        if was == RETIRING or shared.broken is not None:
            return
        fleet.kill(w)
        if w.process is not None and w.process.launched:
            err: BaseException = w.process.start_error(what)
        elif isinstance(w.launch_error, BaseException):
            err = w.launch_error
        else:  # pragma: no cover - a slot without a job
            err = JobStartError(f"{w.name} failed to start: {what}")
        with shared.lock:
            k = fleet.backoff.failed()
            if isinstance(err, BackendUnavailableError) and fleet.ready_count() == 0:
                # Not a job's failure: no job can start until the backend is set up.
                self.break_pool(err, "no worker can start", same_kind=True)
                return
            log.warning("%s: worker %s failed to start: %s", shared.name, w.name, what)
            if fleet.ready_count() == 0 and k >= max(3, fleet.target):
                self.break_pool(err, f"{k} worker jobs in a row failed to start and none is running")
                return
            fleet.backoff.wait_before_next()

    def on_initfail(self, w: WorkerSlot, text: str, parts: list[Any]) -> None:
        """``w``'s initializer raised: the pool cannot run anything (lock held)."""
        from multiprocessing.pool import RemoteTraceback  # type: ignore[attr-defined]

        try:
            exc = self.shared.serializer.loads(parts)
        except Exception as load_error:
            exc = ProcessError(f"the pool initializer raised (and its exception could not be unpickled: {load_error})")
        exc.__cause__ = RemoteTraceback(text)
        self.break_pool(exc, f"its initializer raised {type(exc).__name__} in {w.name}", deliver_cause=True)

    def break_pool(self, exc: BaseException, why: str, deliver_cause: bool = False,
                   same_kind: bool = False) -> None:
        """Nothing can run (initializer raises, jobs never start): fail every task with why.

        Tasks get a ProcessError that says why and carries the cause, or the cause
        itself when it is the user's own exception (``deliver_cause``).
        """
        shared, fleet = self.shared, self.fleet
        with shared.lock:
            if shared.broken is not None:
                return
            kind = type(exc) if same_kind and isinstance(exc, ProcessError) else ProcessError
            broken = kind(f"{shared.name} cannot run tasks: {why}: {exc}")
            broken.__cause__ = exc if debug_enabled() or not same_kind else None
            shared.broken = broken
            if not deliver_cause:
                exc = broken
            shared.task_error = exc  # what every task gets, including ones submitted from now on
            pending = self.dispatch.drop_all()
            workers = fleet.slots()
        if not same_kind:  # a setup error is the tasks' own error: said once, by them
            log.error("%s: cannot run tasks: %s", shared.name, why)
        for w in workers:
            w.killed_by_pool = True
            fleet.submit(fleet.kill, w)
        for chunk in pending:
            self.dispatch.fail(chunk, exc)

    def _autoscale(self, now: float) -> None:
        fleet = self.fleet
        lo = self.min_size if self.min_size is not None else 0
        hi = self.max_size if self.max_size is not None else max(fleet.target, lo)
        with self.shared.lock:
            if self.shared.state == TERMINATE:
                return
            busy = sum(1 for w in fleet.slots() if w.state == READY and w.pending)
            want = max(lo, min(hi, busy + self.dispatch.queued()))
            if want > fleet.target:
                self._low_since = None
                fleet.resize(want)
            elif want < fleet.target:
                if self._low_since is None:
                    self._low_since = now
                elif now - self._low_since >= self.idle_timeout:
                    self._low_since = None
                    fleet.resize(want)
            else:
                self._low_since = None
