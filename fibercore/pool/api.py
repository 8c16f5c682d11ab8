"""``Pool``: multiprocessing's process pool, on job-backed workers, resilient by default.

Every worker is a job on the selected backend. The API and its semantics are those
of ``multiprocessing.pool.Pool``; on top of it a dead worker's tasks run again on a
replacement (:mod:`fibercore.pool.supervision`), and ``resize(n)`` or an adaptive
size grows and shrinks the pool while it runs.
"""

from __future__ import annotations

import functools
import itertools
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sized
from typing import Any

from fibercore import lifetime
from fibercore.observe import registry
from fibercore.pool import protocol as P
from fibercore.pool.progress import PROGRESS_CHUNKS, Progress, ProgressArg
from fibercore.pool.progress import resolve as resolve_progress
from fibercore.pool.records import CLOSE, RUN, TERMINATE
from fibercore.pool.results import (
    ApplyResult,
    IMapIterator,
    IMapUnorderedIterator,
    MapResult,
)
from fibercore.pool.scheduler import Scheduler
from fibercore.runtime import get_runtime
from fibercore.serialization import dumps_or_explain
from fibercore.util import make_room_for_jobs

_pool_numbers = itertools.count(1)


def _check_resources(pool_meta: dict[str, Any], func: Any) -> None:
    wanted = getattr(func, "__fiber_meta__", None)
    if wanted and any(pool_meta.get(k) != v for k, v in wanted.items()):
        name = getattr(func, "__qualname__", repr(func))
        raise ValueError(
            f"{name} is decorated with @fibercore.meta({_kw(wanted)}) but this pool's workers were "
            f"started with ({_kw(pool_meta) or 'no resource requests'}). Resources belong to the "
            f"pool's jobs: create the pool with Pool(..., {_kw(wanted)}), or decorate its initializer."
        )


def _kw(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in values.items())


class Pool:
    """A pool of worker jobs: ``map``, ``imap``, ``apply_async``... as ``multiprocessing.Pool``.

    Beyond multiprocessing (keyword-only):
      ``cpu``, ``memory`` (MiB), ``gpu``: resources of this pool's jobs (or ``@meta`` on
      the initializer); ``max_task_retries``: reruns of a task whose worker died
      (config ``pool_max_task_retries``, default 3); ``min_processes`` /
      ``max_processes``: adaptive size between these bounds, following the backlog;
      ``idle_timeout``: seconds of low backlog before the adaptive mode shrinks;
      ``progress``: a tqdm bar for every map/imap of this pool (True, or a dict of tqdm
      arguments; config ``pool_progress``); each map/imap call also takes ``progress=``;
      ``error_handling``: the original fiber's resilient pool: a task whose function
      raised runs again, up to ``max_error_retries`` times (config
      ``pool_max_error_retries``, default 10: a function that fails 5% of the time
      then fails a task about once in 10^13), before its exception is the result
      (default False: raised at once, as multiprocessing).
    """

    def __init__(
        self,
        processes: int | None = None,
        initializer: Callable[..., Any] | None = None,
        initargs: Iterable[Any] = (),
        maxtasksperchild: int | None = None,
        context: Any = None,
        *,
        cpu: float | None = None,
        memory: int | None = None,
        gpu: int | None = None,
        max_task_retries: int | None = None,
        min_processes: int | None = None,
        max_processes: int | None = None,
        idle_timeout: float = 10.0,
        error_handling: bool | None = None,
        max_error_retries: int | None = None,
        progress: ProgressArg = None,
    ) -> None:
        self._core: Scheduler | None = None
        rt = get_runtime()
        cfg = rt.config
        adaptive = min_processes is not None or max_processes is not None
        if processes is None:
            if adaptive:
                processes = min_processes or 0
            else:
                processes = cfg.get("pool_processes") or os.cpu_count() or 1
        if not isinstance(processes, int) or isinstance(processes, bool):
            raise TypeError(f"processes must be an int, not {type(processes).__name__}")
        if processes < 1 and not adaptive:
            raise ValueError("Number of processes must be at least 1")
        if min_processes is not None and max_processes is not None and min_processes > max_processes:
            raise ValueError(f"min_processes ({min_processes}) is larger than max_processes ({max_processes})")
        if maxtasksperchild is not None:
            if not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0:
                raise ValueError("maxtasksperchild must be a positive int or None")
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        retries = cfg.get("pool_max_task_retries") if max_task_retries is None else max_task_retries
        if retries is None or retries < 0:
            raise ValueError("max_task_retries must be 0 or more")
        error_retries = cfg.get("pool_max_error_retries") if max_error_retries is None else max_error_retries
        if error_retries is None or error_retries < 0:
            raise ValueError("max_error_retries must be 0 or more")
        resources = dict(getattr(initializer, "__fiber_meta__", None) or {})
        resources.update({k: v for k, v in (("cpu", cpu), ("memory", memory), ("gpu", gpu)) if v is not None})
        self._resources = resources
        self._progress = progress
        self._progress_config = bool(cfg.get("pool_progress"))
        self._processes = processes
        self._maxtasks = maxtasksperchild  # (it counts chunks: a bar must not change how many)
        self._name = f"Pool-{next(_pool_numbers)}"
        initargs = tuple(initargs)
        if initializer is not None:
            dumps_or_explain(rt.serializer, (initializer, initargs), "the pool's initializer and initargs")
            share_at = int(cfg.get("share_arrays_from"))
            if share_at > 0:  # a large array: one copy on the machine, not one per worker
                from fibercore.sharing import share_large

                initargs = share_large(initargs, share_at)
        most = max(processes, max_processes or 0)
        make_room_for_jobs(most, f"{self._name} with {most} workers")
        self._core = Scheduler(
            processes=processes,
            initializer=initializer,
            initargs=initargs,
            maxtasks=maxtasksperchild,
            resources=resources,
            retries=int(retries),
            name=self._name,
            min_size=min_processes,
            max_size=max_processes,
            idle_timeout=idle_timeout,
            error_retries=int(error_retries) if error_handling else 0,
        )
        # A pool nobody closes is terminated when collected or at exit (never from
        # the collector's own thread: see fibercore.lifetime).
        self._finalizer = lifetime.track(self, self._core.terminate, lifetime.POOL)
        registry.track_pool(self)

    # ------------------------------------------------------------------ helpers
    def _view(self) -> dict[str, Any] | None:
        """What ``fiber top`` and the dashboard show of this pool (:mod:`fibercore.observe`)."""
        return self._core.view() if self._core is not None else None

    def _check_running(self) -> Scheduler:
        core = self._core
        assert core is not None
        core.check_running()
        return core

    def _check_func(self, func: Any) -> None:
        if not callable(func):
            raise TypeError(f"{func!r} is not callable")
        _check_resources(self._resources, func)

    # ------------------------------------------------------------------ apply
    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: Mapping[str, Any] | None = None) -> Any:
        """Call ``func(*args, **kwds)`` in a worker and return its result."""
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: Mapping[str, Any] | None = None,
                    callback: Callable[[Any], object] | None = None,
                    error_callback: Callable[[BaseException], object] | None = None) -> ApplyResult[Any]:
        """Like ``apply`` but returns an :class:`AsyncResult` at once."""
        core = self._check_running()
        self._check_func(func)
        result: ApplyResult[Any] = ApplyResult(callback, error_callback)
        batch = core.new_batch(P.APPLY, func, result, "apply")
        result._canceller = functools.partial(core.cancel, batch)
        payload = dumps_or_explain(core.serializer, (func, tuple(args), dict(kwds or {})),
                                   f"the call of {batch.name}")
        core.add_chunk(batch, 0, payload)
        return result

    # ------------------------------------------------------------------ map
    def _bar(self, progress: ProgressArg, what: str, total: int | None) -> Progress | None:
        """The progress bar of one call, if the call, the pool or the config asks for one."""
        options = resolve_progress(progress, self._progress, self._progress_config)
        return None if options is None else Progress(what, total, options)

    def _map_async(self, func: Callable[..., Any], iterable: Iterable[Any], kind: int, chunksize: int | None,
                   callback: Any, error_callback: Any, what: str, progress: ProgressArg = None) -> MapResult:
        core = self._check_running()
        self._check_func(func)
        if not hasattr(iterable, "__len__"):
            iterable = list(iterable)
        length = len(iterable)  # type: ignore[arg-type]
        if chunksize is not None and chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        bar = self._bar(progress, what, length)
        if chunksize is None:  # as multiprocessing: 4 chunks a worker (a bar: 8 times more, to move,
            # unless workers are replaced after so many chunks: a bar must not replace them more often)
            finer = PROGRESS_CHUNKS if bar is not None and self._maxtasks is None else 1
            chunksize, extra = divmod(length, max(1, core.target) * 4 * finer)
            if extra:
                chunksize += 1
        if length == 0:
            chunksize = 0
        result = MapResult(chunksize, length, callback, error_callback)
        if bar is not None:
            result._show(bar)
        if length:
            batch = core.new_batch(kind, func, result, what)
            result._canceller = functools.partial(core.cancel, batch)
            core.submit_iterable(batch, kind, iterable, chunksize, None, lazy=False)
        return result

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int | None = None, *,
            progress: ProgressArg = None) -> list[Any]:
        """``[func(x) for x in iterable]`` computed by the workers, in order."""
        return self._map_async(func, iterable, P.MAP, chunksize, None, None, "map", progress).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int | None = None,
                  callback: Callable[[Any], object] | None = None,
                  error_callback: Callable[[BaseException], object] | None = None, *,
                  progress: ProgressArg = None) -> MapResult:
        return self._map_async(func, iterable, P.MAP, chunksize, callback, error_callback, "map", progress)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]], chunksize: int | None = None, *,
                progress: ProgressArg = None) -> list[Any]:
        """``[func(*args) for args in iterable]`` computed by the workers, in order."""
        return self._map_async(func, iterable, P.STARMAP, chunksize, None, None, "starmap", progress).get()

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]], chunksize: int | None = None,
                      callback: Callable[[Any], object] | None = None,
                      error_callback: Callable[[BaseException], object] | None = None, *,
                      progress: ProgressArg = None) -> MapResult:
        return self._map_async(func, iterable, P.STARMAP, chunksize, callback, error_callback, "starmap", progress)

    def _imap(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int,
              result: IMapIterator, what: str, progress: ProgressArg) -> IMapIterator:
        core = self._check_running()
        self._check_func(func)
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        bar = self._bar(progress, what, len(iterable) if isinstance(iterable, Sized) else None)
        if bar is not None:
            result._show(bar)
        batch = core.new_batch(P.MAP, func, result, what)
        lazy = not isinstance(iterable, (list, tuple, range))
        core.submit_iterable(batch, P.MAP, iterable, chunksize, result._set_length, lazy=lazy)
        return result

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1, *,
             progress: ProgressArg = None) -> Iterator[Any]:
        """Results in order, each as soon as it (and those before it) is done."""
        return self._imap(func, iterable, chunksize, IMapIterator(chunksize), "imap", progress)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any], chunksize: int = 1, *,
                       progress: ProgressArg = None) -> Iterator[Any]:
        """Results in the order they complete."""
        return self._imap(func, iterable, chunksize, IMapUnorderedIterator(chunksize), "imap_unordered", progress)

    # ------------------------------------------------------------------ size
    def resize(self, processes: int) -> None:
        """Grow or shrink the running pool to ``processes`` workers.

        Growing starts the new jobs concurrently; shrinking lets the retired workers
        finish their current task (the tasks they had not started go back to the
        queue) and returns their jobs to the cluster.
        """
        if not isinstance(processes, int) or processes < 1:
            raise ValueError("a pool needs at least 1 process")
        assert self._core is not None
        self._core.resize(processes)
        self._processes = processes

    def start_workers(self) -> None:
        """The original fiber's explicit start: fibercore pools start their jobs when created."""
        self._check_running()

    def wait_until_workers_up(self, timeout: float | None = None) -> bool:
        """Block until every worker job of the pool has connected (the original fiber's
        ``Pool.wait_until_workers_up``); False if ``timeout`` seconds passed first."""
        core = self._check_running()
        deadline = None if timeout is None else time.monotonic() + timeout
        with core.changed:
            while core.ready_count() < core.target:
                core.check_running()
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                core.changed.wait(0.05 if remaining is None else min(0.05, remaining))
        return True

    @property
    def size(self) -> int:
        """The number of workers the pool is keeping (its target)."""
        assert self._core is not None
        return self._core.target

    def workers(self) -> list[Any]:
        """The worker Processes currently alive or starting."""
        assert self._core is not None
        return self._core.worker_processes()

    @property
    def _pool(self) -> list[Any]:
        """multiprocessing's introspection: the worker Process objects (alive or starting)."""
        return self.workers()

    @property
    def _state(self) -> str:
        """multiprocessing's state names: "RUN", "CLOSE" or "TERMINATE"."""
        override = self.__dict__.get("_state_override")
        if override is not None:
            return override
        core = self._core
        return {RUN: "RUN", CLOSE: "CLOSE", TERMINATE: "TERMINATE"}.get(core.state if core else RUN, "RUN")

    @_state.setter
    def _state(self, value: str) -> None:  # tests of multiprocessing set it
        self.__dict__["_state_override"] = value

    @property
    def stats(self) -> dict[str, int]:
        """Counters: chunks retried after a worker died, workers replaced, chunks stolen back."""
        assert self._core is not None
        return dict(self._core.stats)

    # ------------------------------------------------------------------ lifecycle
    def close(self) -> None:
        """No more tasks; the workers exit once the outstanding ones are done (see join)."""
        if self._core is not None:
            self._core.close()

    def terminate(self) -> None:
        """Stop the workers at once; outstanding tasks fail with ProcessError."""
        if self._core is not None:
            self._finalizer.cancel()
            self._core.terminate()

    def join(self) -> None:
        """Wait for the workers to exit; call close() or terminate() first."""
        core = self._core
        assert core is not None
        if core.state == RUN:
            raise ValueError("Pool is still running")
        if core.state not in (CLOSE, TERMINATE):
            raise ValueError("In unknown state")
        core.join()
        self._finalizer.cancel()

    def __enter__(self) -> Pool:
        self._check_running()
        return self

    def __exit__(self, *exc: object) -> None:
        self.terminate()

    def __reduce__(self) -> Any:
        raise NotImplementedError(
            "pool objects cannot be passed between processes or pickled"
        )

    def __repr__(self) -> str:
        core = self._core
        state = core.state if core is not None else "initial"
        size = core.target if core is not None else self._processes
        return f"<{type(self).__module__}.{type(self).__qualname__} state={state} pool_size={size}>"

    def __del__(self, _warn: Any = warnings.warn) -> None:
        # Only a warning here: the clean-up runs on the reaper thread (lifetime.track).
        if getattr(self, "_core", None) is not None and self._state == "RUN":
            _warn(f"unclosed running multiprocessing pool {self!r}", ResourceWarning, source=self)


class ThreadPool:
    """``multiprocessing.pool.ThreadPool``: threads in this process (no jobs involved)."""

    def __new__(cls, processes: int | None = None, initializer: Any = None, initargs: Iterable[Any] = ()) -> Any:
        from multiprocessing.pool import ThreadPool as _ThreadPool

        return _ThreadPool(processes, initializer, tuple(initargs))


__all__ = ["Pool", "ThreadPool"]
