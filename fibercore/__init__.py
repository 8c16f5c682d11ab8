"""fibercore: ``import fibercore as mp`` runs multiprocessing programs on cluster jobs.

Every Process is a job on the selected backend (local processes by default; Docker,
Kubernetes or AWS Batch by setting ``FIBER_BACKEND``). Queues and pipes work between
jobs on any backend. See README.md and docs/.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from fibercore.errors import (
    AbandonedLockWarning,
    AuthenticationError,
    BrokenBarrierError,
    CancelledError,
    ConfigError,
    FiberError,
    JobStartError,
    ProcessError,
    SerializationError,
    TimeoutError,
    WeakAuthkeyWarning,
    WorkerLostError,
)
from fibercore.hookspecs import hookimpl
from fibercore.meta import meta
from fibercore.process import Process, active_children, current_process, parent_process
from fibercore.runtime import get_runtime, init, register_plugin, unregister_plugin
from fibercore.types import Job, JobSpec, JobStatus, Option

if TYPE_CHECKING:  # imported on first use below; a worker job only pays for what it uses
    from fibercore.connection import Connection
    from fibercore.context import FiberContext
    from fibercore.futures import Executor, as_completed, wait
    from fibercore.paramserver import ParameterServer
    from fibercore.pool import Pool
    from fibercore.queues import JoinableQueue, Queue, SimpleQueue
    from fibercore.ring import Ring
    from fibercore.sharing import Shared, shared


import multiprocessing as _mp

BufferTooShort = _mp.BufferTooShort
del _mp

#: Names loaded on first access: (module, attribute path).
_LAZY: dict[str, tuple[str, str]] = {
    "Connection": ("fibercore.connection", "Connection"),
    "FiberContext": ("fibercore.context", "FiberContext"),
    "Pool": ("fibercore.pool", "Pool"),
    "managers": ("fibercore.managers", ""),
    "experimental": ("fibercore.experimental", ""),
    "Ring": ("fibercore.ring", "Ring"),
    "shared": ("fibercore.sharing", "shared"),
    "Shared": ("fibercore.sharing", "Shared"),
    "Queue": ("fibercore.queues", "Queue"),
    "JoinableQueue": ("fibercore.queues", "JoinableQueue"),
    "SimpleQueue": ("fibercore.queues", "SimpleQueue"),
    "sync": ("fibercore.sync", ""),
    "futures": ("fibercore.futures", ""),
    "Executor": ("fibercore.futures", "Executor"),
    "wait": ("fibercore.futures", "wait"),
    "as_completed": ("fibercore.futures", "as_completed"),
    "ParameterServer": ("fibercore.paramserver", "ParameterServer"),
    **{
        name: ("fibercore.context", f"_default_context.{name}")
        for name in (
            "Lock", "RLock", "Semaphore", "BoundedSemaphore", "Condition", "Event", "Barrier",
            "Value", "Array", "RawValue", "RawArray",
            "Pipe", "Manager", "cpu_count", "get_context", "get_start_method", "set_start_method",
            "get_all_start_methods", "freeze_support", "set_executable",
            "allow_connection_pickling", "get_logger", "log_to_stderr", "set_forkserver_preload", "reducer",
        )
    },
}


class _StartMethod:
    """What ``multiprocessing.get_context("fiber")`` returns: fibercore's context, loaded on
    first use (registering it must not import the API layer into every job's start-up), so
    that a library taking a start-method name runs its processes as jobs (gymnasium's
    ``AsyncVectorEnv(..., context="fiber")``)."""

    def _check_available(self) -> None:
        """multiprocessing asks this of a context it returns from ``get_context(name)``."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("fibercore.context")._default_context, name)


def _register_start_method() -> None:
    import multiprocessing.context as mp_context

    mp_context._concrete_contexts.setdefault("fiber", _StartMethod())  # type: ignore[attr-defined]


_register_start_method()


def _distribution_version(distribution: str) -> str:
    """The installed version of ``distribution``: its ``pyproject.toml`` is the one place a
    version is written (read from the package metadata on first use, not at import)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = _distribution_version("fibercore")
        return globals()[name]
    try:
        module_name, path = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'fibercore' has no attribute {name!r}") from None
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, path.split(".")):
        obj = getattr(obj, part)
    globals()[name] = obj
    return obj


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


def reset() -> Any:
    """The original fiber's ``reset()``: rebuild the configuration from its sources."""
    return init()


def get_config() -> Any:
    """The effective configuration (typed; ``get_config().start_timeout``, ``.origin(key)``)."""
    return get_runtime().config


__all__ = [
    "AbandonedLockWarning",
    "Array",
    "AuthenticationError",
    "Barrier",
    "BoundedSemaphore",
    "BrokenBarrierError",
    "BufferTooShort",
    "Condition",
    "Event",
    "Lock",
    "RLock",
    "RawArray",
    "RawValue",
    "Semaphore",
    "Value",
    "CancelledError",
    "ConfigError",
    "Connection",
    "Executor",
    "FiberContext",
    "FiberError",
    "Job",
    "JobSpec",
    "JobStartError",
    "WeakAuthkeyWarning",
    "JobStatus",
    "JoinableQueue",
    "Manager",
    "Option",
    "ParameterServer",
    "Pipe",
    "Pool",
    "Process",
    "ProcessError",
    "Ring",
    "Queue",
    "SerializationError",
    "Shared",
    "SimpleQueue",
    "TimeoutError",
    "WorkerLostError",
    "active_children",
    "as_completed",
    "allow_connection_pickling",
    "get_config",
    "cpu_count",
    "current_process",
    "freeze_support",
    "get_all_start_methods",
    "get_context",
    "get_logger",
    "get_runtime",
    "get_start_method",
    "hookimpl",
    "init",
    "log_to_stderr",
    "meta",
    "parent_process",
    "reducer",
    "register_plugin",
    "reset",
    "set_executable",
    "set_forkserver_preload",
    "set_start_method",
    "shared",
    "unregister_plugin",
    "wait",
]
