"""Waiting on many results, and a ``concurrent.futures.Executor`` on a fibercore Pool.

* :func:`wait` (as Ray's ``ray.wait``) and :func:`as_completed` take the results of Pools
  (``apply_async``, ``map_async``), of an ``AsyncManager``'s calls and the Executor's
  futures, mixed, and sleep until one is ready: each result calls back when it completes,
  nothing polls.
* :class:`Executor` runs ``submit(fn, *args, resources=..., **kwargs)`` on a Pool: a dead
  worker's task runs again on a fresh one (``max_task_retries``), ``Future.cancel()`` stops
  a running task's worker (and replaces it), and ``shutdown(wait, cancel_futures)`` is the
  standard one. Tasks with their own ``resources`` run on a pool of workers started with
  them (one per distinct resources, which shrinks to none when idle).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from fibercore.errors import TimeoutError
from fibercore.results import ApplyResult

T = TypeVar("T")
#: What :func:`wait` and :func:`as_completed` accept: a Pool's or a manager's result, or a future.
Waitable = ApplyResult[Any] | concurrent.futures.Future[Any]


def _is_done(obj: Waitable) -> bool:
    return obj.done() if isinstance(obj, concurrent.futures.Future) else obj.ready()


def _when_done(obj: Waitable, fn: Callable[[Any], object]) -> None:
    if isinstance(obj, concurrent.futures.Future):
        obj.add_done_callback(fn)
    elif isinstance(obj, ApplyResult):
        obj._add_done_callback(fn)
    else:
        raise TypeError(f"{obj!r} is not a result of fibercore (AsyncResult) or a concurrent.futures.Future")


class _Readers:
    """Threads that wait on results nobody else reads for: a manager's answers are read off
    its connection by whichever thread waits (see :class:`fibercore.rpc.Client`), so one
    thread per server waits on that server's results, each in turn, until all are in or
    :meth:`stop` is called (within a step)."""

    STEP = 0.5

    def __init__(self, items: list[Waitable]) -> None:
        self._stop = threading.Event()
        by_reader: dict[int, list[ApplyResult[Any]]] = {}
        for obj in items:
            reader = getattr(obj, "_client", None)
            if isinstance(obj, ApplyResult) and reader is not None and not obj._event.is_set():
                by_reader.setdefault(id(reader), []).append(obj)
        for results in by_reader.values():
            threading.Thread(target=self._read, args=(results,), name="fiber-wait-reader", daemon=True).start()

    def _read(self, results: list[ApplyResult[Any]]) -> None:
        for result in results:
            while not self._stop.is_set() and not result._event.is_set():
                result.wait(self.STEP)

    def stop(self) -> None:
        self._stop.set()


def _forget(items: list[Waitable], fn: Callable[[Any], object]) -> None:
    """Take ``fn`` off the results still running: a loop of ``wait(not_ready)`` calls must not
    pile one callback per call on each result."""
    for obj in items:
        if isinstance(obj, ApplyResult):
            obj._remove_done_callback(fn)


def _check_unique(results: list[Waitable]) -> None:
    if len({id(r) for r in results}) != len(results):
        raise ValueError("wait() needs a list of distinct results (one appears more than once)")


def wait(results: Iterable[Waitable], num_returns: int = 1,
         timeout: float | None = None) -> tuple[list[Waitable], list[Waitable]]:
    """``(ready, not_ready)`` once ``num_returns`` of ``results`` are ready or ``timeout``
    seconds passed (None: no limit). Both lists keep the input's order; ``ready`` holds at
    most ``num_returns``, the first ready ones in that order (as ``ray.wait``)."""
    items = list(results)
    _check_unique(items)
    if not 0 <= num_returns <= len(items):
        raise ValueError(f"num_returns must be between 0 and the number of results ({len(items)}), not {num_returns}")
    cond = threading.Condition()
    count = [0]

    def one_done(_obj: Any) -> None:
        with cond:
            count[0] += 1
            cond.notify_all()

    for obj in items:
        _when_done(obj, one_done)
    deadline = None if timeout is None else time.monotonic() + timeout
    readers = _Readers(items)
    try:
        with cond:
            while count[0] < num_returns:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    break
                cond.wait(remaining)
    finally:
        readers.stop()
        _forget(items, one_done)
    ready: list[Waitable] = []
    not_ready: list[Waitable] = []
    for obj in items:
        (ready if len(ready) < num_returns and _is_done(obj) else not_ready).append(obj)
    return ready, not_ready


def as_completed(results: Iterable[Waitable], timeout: float | None = None) -> Iterator[Waitable]:
    """Each of ``results`` as it completes (finished first, first); :class:`fibercore.TimeoutError`
    when ``timeout`` seconds (from this call) pass with some still running."""
    items = list(results)
    _check_unique(items)
    deadline = None if timeout is None else time.monotonic() + timeout
    cond = threading.Condition()
    finished: list[Waitable] = []

    def one_done(obj: Any) -> None:
        with cond:
            finished.append(obj)
            cond.notify_all()

    for obj in items:
        _when_done(obj, one_done)
    readers = _Readers(items)
    try:
        for given in range(len(items)):
            with cond:
                while not finished:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise TimeoutError(f"{len(items) - given} of {len(items)} results were not ready "
                                           f"within {timeout} s")
                    cond.wait(remaining)
                obj = finished.pop(0)
            yield obj
    finally:
        readers.stop()
        _forget(items, one_done)


class Future(concurrent.futures.Future[T]):
    """A future whose ``cancel()`` also cancels a running task (its worker is stopped and
    replaced); ``result()`` then raises :class:`concurrent.futures.CancelledError`."""

    def __init__(self) -> None:
        super().__init__()
        self._task: ApplyResult[Any] | None = None
        self._settle_lock = threading.Lock()
        self._cancelling = False
        self._held: tuple[bool, Any] | None = None  # an outcome that arrived while cancelling

    def cancel(self) -> bool:
        """Cancel the call, queued or running; False once it finished."""
        return self._try_cancel(running=True)

    def _cancel_if_queued(self) -> bool:
        """``shutdown(cancel_futures=True)``: cancel only a call no worker holds yet."""
        return self._try_cancel(running=False)

    def _try_cancel(self, running: bool) -> bool:
        if self.done():
            return self.cancelled()
        task = self._task
        if task is None:  # not handed to a pool yet
            return super().cancel()
        with self._settle_lock:
            self._cancelling = True
        try:
            cancelled = task._cancel(running)
        finally:
            with self._settle_lock:
                self._cancelling = False
                held, self._held = self._held, None
        if cancelled:
            return super().cancel()
        if held is not None:  # the call finished meanwhile: its outcome stands
            self._apply(*held)
        return False

    def _settle(self, ok: bool, value: Any) -> None:
        """The pool's callback with the call's outcome."""
        with self._settle_lock:
            if self._cancelling:
                self._held = (ok, value)
                return
        self._apply(ok, value)

    def _apply(self, ok: bool, value: Any) -> None:
        if self.cancelled():
            return
        try:
            if ok:
                self.set_result(value)
            else:
                self.set_exception(value)
        except concurrent.futures.InvalidStateError:  # cancelled meanwhile
            pass


class Executor(concurrent.futures.Executor):
    """A ``concurrent.futures.Executor`` on fibercore Pools (jobs on the configured backend).

    ``max_workers`` workers (default: the Pool's default) run ``submit``-ted calls; the
    other arguments are the Pool's (``initializer``, ``initargs``, ``max_task_retries``,
    ``cpu``/``memory``/``gpu`` for every worker). ``submit(fn, *args, resources={...})``
    runs a call on workers started with those resources instead.
    """

    def __init__(self, max_workers: int | None = None, initializer: Callable[..., Any] | None = None,
                 initargs: Iterable[Any] = (), *, max_task_retries: int | None = None,
                 **pool_options: Any) -> None:
        from fibercore.pool import Pool

        if max_workers is not None and max_workers < 1:
            raise ValueError("max_workers must be at least 1")
        self._options: dict[str, Any] = dict(pool_options, initializer=initializer, initargs=tuple(initargs),
                                             max_task_retries=max_task_retries)
        self._max_workers = max_workers
        self._pool = Pool(max_workers, **self._options)
        self._pools: dict[tuple[tuple[str, Any], ...], Any] = {}
        self._lock = threading.Lock()
        self._shutdown = False
        self._futures: set[Future[Any]] = set()

    def _pool_for(self, resources: Mapping[str, Any] | None) -> Any:
        if not resources:
            return self._pool
        unknown = set(resources) - {"cpu", "memory", "gpu"}
        if unknown:
            raise TypeError(f"unknown resources {sorted(unknown)}: give cpu=, memory= (MiB) or gpu=")
        key = tuple(sorted(resources.items()))
        pool = self._pools.get(key)
        if pool is None:
            from fibercore.pool import Pool

            options = {k: v for k, v in self._options.items() if k not in ("cpu", "memory", "gpu")}
            most = self._max_workers or self._pool._processes
            pool = Pool(min_processes=0, max_processes=most, **options, **dict(resources))
            self._pools[key] = pool
        return pool

    def submit(self, fn: Callable[..., T], /, *args: Any,  # type: ignore[override]  # adds resources=
               resources: Mapping[str, Any] | None = None, **kwargs: Any) -> Future[T]:
        """Run ``fn(*args, **kwargs)`` in a worker; a :class:`Future` at once."""
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            pool = self._pool_for(resources)
            future: Future[T] = Future()
            self._futures.add(future)
        future.add_done_callback(self._futures.discard)
        future._task = pool.apply_async(fn, args, kwargs, callback=lambda v: future._settle(True, v),
                                        error_callback=lambda e: future._settle(False, e))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No more submits; ``cancel_futures``: tasks no worker holds yet are cancelled;
        ``wait``: return once the pools' work is done and their workers are gone."""
        with self._lock:
            self._shutdown = True
            pools = [self._pool, *self._pools.values()]
        if cancel_futures:
            for future in list(self._futures):
                future._cancel_if_queued()
        for pool in pools:
            pool.close()
        if wait:
            for pool in pools:
                pool.join()
        else:
            threading.Thread(target=lambda: [p.join() for p in pools], name="fiber-executor-shutdown",
                             daemon=True).start()


__all__ = ["Executor", "Future", "Waitable", "as_completed", "wait"]
