"""Exceptions that say what failed, where, and what to do.

Each subclasses the `multiprocessing` exception a user of multiprocessing already
catches, so `except multiprocessing.ProcessError` keeps working after the import swap.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import threading


class FiberError(Exception):
    """Base of every fibercore error."""


class ProcessError(multiprocessing.ProcessError, FiberError):
    """A job-backed process failed to start, run or stop."""


class JobStartError(ProcessError):
    """A job was created but its worker never connected back.

    Carries the job status and the job's logs, because that is where the cause is
    (an image without Python, a pod stuck in Pending, a crash on import).
    """

    def __init__(self, message: str, *, status: object = None, logs: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.logs = logs


class BackendUnavailableError(ProcessError):
    """The backend cannot be reached or is not set up (no daemon, no cluster configuration, no
    credentials, no region): no job starts until that is fixed, and the message says how.

    Backends raise a subclass from ``fiber_create_job``; an uncaught one ends a program with
    its one-line message (the traceback with ``FIBER_DEBUG=1``).
    """


class WorkerLostError(ProcessError):
    """A pool task's worker died (killed, out of memory, node lost) more often than allowed.

    Raised by ``get()`` for that task after ``max_task_retries`` retries on fresh
    workers; the message names the task, the worker's job, its exit status and logs.
    """


class TimeoutError(multiprocessing.TimeoutError, FiberError):
    """An operation did not finish in time."""


class CancelledError(concurrent.futures.CancelledError, FiberError):
    """The task was cancelled (``AsyncResult.cancel()``, ``Future.cancel()``) before it finished."""


class AuthenticationError(multiprocessing.AuthenticationError, FiberError):
    """A peer failed to prove it knows the session secret."""


class ConfigError(ValueError, FiberError):
    """A configuration key or value is wrong; the message lists what is valid."""


class BackendNotFoundError(ConfigError):
    """The selected backend is not installed; the message lists what is."""


class SerializationError(TypeError, FiberError):
    """An object could not be pickled to go to another process; names the object."""


class TransportError(OSError, FiberError):
    """The transport failed (closed socket, unreachable address)."""


class TransportTimeout(TransportError):
    """A transport send or receive timed out."""


class TransportClosed(TransportError):
    """The endpoint was closed."""


class BrokenBarrierError(threading.BrokenBarrierError, FiberError):
    """A shared ``Barrier`` is broken: aborted, reset, a party timed out, its action
    raised, or a party's process died (the message says which)."""


class AbandonedLockWarning(RuntimeWarning):
    """A shared lock was acquired after its previous holder's process ended while holding
    it: fibercore released it, but what it protected may be half-updated."""


class WeakAuthkeyWarning(UserWarning):
    """A manager ``authkey`` shorter than 16 bytes: anyone who sees one handshake made with
    it can guess it offline. Accepted (multiprocessing's own examples use short keys)."""
