"""Factories for every multiprocessing object, in one context (as CPython's context.py).

fibercore has one start method, ``fiber``: every process is a job on the selected
backend. For drop-in compatibility, ``get_context()`` and ``set_start_method()``
also accept ``spawn``, ``fork`` and ``forkserver`` and return the same context (a
job is never forked; functions travel by value with cloudpickle).
"""

from __future__ import annotations

import os
from typing import Any

from fibercore import connection, process, queues

START_METHODS = ("fiber", "spawn", "fork", "forkserver")


class FiberContext:
    """The object behind the ``fibercore`` module namespace."""

    _name = "fiber"
    Process = process.Process
    ProcessError = process.ProcessError

    def __init__(self) -> None:
        from fibercore import errors

        self.TimeoutError = errors.TimeoutError
        self.AuthenticationError = errors.AuthenticationError
        self.BufferTooShort = __import__("multiprocessing").BufferTooShort

    # -- processes ---------------------------------------------------------------------
    @staticmethod
    def current_process() -> process.Process:
        return process.current_process()

    @staticmethod
    def parent_process() -> Any:
        return process.parent_process()

    @staticmethod
    def active_children() -> list[process.Process]:
        return process.active_children()

    @staticmethod
    def cpu_count() -> int:
        """CPUs of this machine (multiprocessing's answer); a cluster backend may differ."""
        count = os.cpu_count()
        if count is None:
            raise NotImplementedError("cannot determine number of cpus")
        return count

    # -- communication ----------------------------------------------------------------------
    @staticmethod
    def Pipe(duplex: bool = True) -> tuple[connection.Connection, connection.Connection]:
        return connection.Pipe(duplex)

    def Queue(self, maxsize: int = 0) -> queues.Queue:
        return queues.Queue(maxsize, ctx=self)

    def JoinableQueue(self, maxsize: int = 0) -> queues.JoinableQueue:
        return queues.JoinableQueue(maxsize, ctx=self)

    def SimpleQueue(self) -> queues.SimpleQueue:
        return queues.SimpleQueue(ctx=self)

    # -- synchronization and shared values (fibercore.sync) -------------------------------------
    def Lock(self) -> Any:
        from fibercore.sync import Lock

        return Lock(ctx=self)

    def RLock(self) -> Any:
        from fibercore.sync import RLock

        return RLock(ctx=self)

    def Semaphore(self, value: int = 1) -> Any:
        from fibercore.sync import Semaphore

        return Semaphore(value, ctx=self)

    def BoundedSemaphore(self, value: int = 1) -> Any:
        from fibercore.sync import BoundedSemaphore

        return BoundedSemaphore(value, ctx=self)

    def Condition(self, lock: Any = None) -> Any:
        from fibercore.sync import Condition

        return Condition(lock, ctx=self)

    def Event(self) -> Any:
        from fibercore.sync import Event

        return Event(ctx=self)

    def Barrier(self, parties: int, action: Any = None, timeout: float | None = None) -> Any:
        from fibercore.sync import Barrier

        return Barrier(parties, action, timeout, ctx=self)

    def Value(self, typecode_or_type: Any, *args: Any, lock: Any = True) -> Any:
        from fibercore.sync import Value

        return Value(typecode_or_type, *args, lock=lock, ctx=self)

    def Array(self, typecode_or_type: Any, size_or_initializer: Any, *, lock: Any = True) -> Any:
        from fibercore.sync import Array

        return Array(typecode_or_type, size_or_initializer, lock=lock, ctx=self)

    @staticmethod
    def RawValue(typecode_or_type: Any, *args: Any) -> Any:
        from fibercore.sync import RawValue

        return RawValue(typecode_or_type, *args)

    @staticmethod
    def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> Any:
        from fibercore.sync import RawArray

        return RawArray(typecode_or_type, size_or_initializer)

    # -- managers -------------------------------------------------------------------------
    @staticmethod
    def Manager() -> Any:
        """A started :class:`fibercore.managers.SyncManager` (its server is a job)."""
        from fibercore.managers import SyncManager

        manager = SyncManager()
        manager.start()
        return manager

    # -- pools ----------------------------------------------------------------------------
    def Pool(self, processes: int | None = None, initializer: Any = None, initargs: Any = (),
             maxtasksperchild: int | None = None, **kwargs: Any) -> Any:
        """A :class:`fibercore.pool.Pool` of worker jobs (see its docstring for extras)."""
        from fibercore.pool import Pool

        return Pool(processes, initializer, initargs, maxtasksperchild, context=self, **kwargs)

    # -- start methods (compatibility) ---------------------------------------------------------
    def get_context(self, method: str | None = None) -> FiberContext:
        if method is None or method in START_METHODS:
            return self
        raise ValueError(f"cannot find context for {method!r} (fibercore accepts: {', '.join(START_METHODS)})")

    def get_start_method(self, allow_none: bool = False) -> str:
        return self._name

    def set_start_method(self, method: str | None, force: bool = False) -> None:
        if method is not None and method not in START_METHODS:
            raise ValueError(f"cannot find context for {method!r} (fibercore accepts: {', '.join(START_METHODS)})")

    @staticmethod
    def get_all_start_methods() -> list[str]:
        return ["fiber"]

    @staticmethod
    def freeze_support() -> None:
        """Nothing to do: workers never re-run the main script."""

    @staticmethod
    def set_executable(executable: str | bytes | os.PathLike[str] | os.PathLike[bytes]) -> None:
        """Use ``executable`` as the workers' Python (same as config ``python_exe``); a str,
        bytes or path, as multiprocessing accepts."""
        from fibercore.runtime import init

        init(python_exe=os.fsdecode(executable))

    @staticmethod
    def set_forkserver_preload(module_names: list[str]) -> None:
        """Accepted for compatibility: jobs start fresh interpreters, not from a fork server."""
        if not all(isinstance(name, str) for name in module_names):
            raise TypeError("module_names must be a list of strings")

    @property
    def reducer(self) -> Any:
        """multiprocessing's ``reduction`` module, as ``multiprocessing.reducer`` is: its
        ``ForkingPickler.register`` does not reach fibercore's serializer (cloudpickle, where
        ``copyreg`` registrations and ``__reduce__`` apply)."""
        from multiprocessing import reduction

        return reduction

    @staticmethod
    def allow_connection_pickling() -> None:
        """Connections and queues always pickle (their addresses travel)."""

    @staticmethod
    def get_logger() -> Any:
        import logging

        return logging.getLogger("fibercore")

    @staticmethod
    def log_to_stderr(level: int | None = None) -> Any:
        import logging

        logger = logging.getLogger("fibercore")
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("[%(levelname)s/%(processName)s] %(message)s"))
        logger.addHandler(handler)
        if level:
            logger.setLevel(level)
        return logger


_default_context = FiberContext()

