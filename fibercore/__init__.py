"""fibercore: ``import fibercore as mp`` runs multiprocessing programs on cluster jobs.

Every Process is a job on the selected backend (local processes by default; Docker,
Kubernetes or AWS Batch by setting ``FIBER_BACKEND``). Queues and pipes work between
jobs on any backend. See README.md and docs/.
"""

from __future__ import annotations

from typing import Any

from fibercore.connection import Connection
from fibercore.context import FiberContext, _default_context
from fibercore.errors import (
    AuthenticationError,
    ConfigError,
    FiberError,
    JobStartError,
    ProcessError,
    SerializationError,
    TimeoutError,
    WorkerLostError,
)
from fibercore.hookspecs import hookimpl
from fibercore.meta import meta
from fibercore.pool import Pool
from fibercore.process import Process, active_children, current_process, parent_process
from fibercore.queues import JoinableQueue, Queue, SimpleQueue
from fibercore.runtime import get_runtime, init, register_plugin, unregister_plugin
from fibercore.types import Job, JobSpec, JobStatus, Option

__version__ = "0.1.0"

import multiprocessing as _mp

BufferTooShort = _mp.BufferTooShort
del _mp

Pipe = _default_context.Pipe
cpu_count = _default_context.cpu_count
get_context = _default_context.get_context
get_start_method = _default_context.get_start_method
set_start_method = _default_context.set_start_method
get_all_start_methods = _default_context.get_all_start_methods
freeze_support = _default_context.freeze_support
set_executable = _default_context.set_executable
allow_connection_pickling = _default_context.allow_connection_pickling
get_logger = _default_context.get_logger
log_to_stderr = _default_context.log_to_stderr


def get_config() -> Any:
    """The effective configuration (typed; ``get_config().start_timeout``, ``.origin(key)``)."""
    return get_runtime().config


__all__ = [
    "AuthenticationError",
    "BufferTooShort",
    "ConfigError",
    "Connection",
    "FiberContext",
    "FiberError",
    "Job",
    "JobSpec",
    "JobStartError",
    "JobStatus",
    "JoinableQueue",
    "Option",
    "Pipe",
    "Pool",
    "Process",
    "ProcessError",
    "Queue",
    "SerializationError",
    "SimpleQueue",
    "TimeoutError",
    "WorkerLostError",
    "active_children",
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
    "register_plugin",
    "set_executable",
    "set_start_method",
    "unregister_plugin",
]
