"""``Lock``, ``RLock``, ``Semaphore``, ``BoundedSemaphore``, ``Condition``, ``Event`` and
``Barrier`` with ``multiprocessing.synchronize``'s API, usable from any job on any backend.

Differences from multiprocessing (docs/sync.md): every operation is a request to the
creating process's service (tens of microseconds across jobs, a few in the creating
process); handles may be passed to jobs as arguments and also through queues and pipes;
a lock whose holder's process dies is released, and its next acquirer gets an
:class:`~fibercore.errors.AbandonedLockWarning`; a barrier whose party died breaks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from fibercore.errors import BrokenBarrierError
from fibercore.sync.handles import Handle, _local, granted, owner_name
from fibercore.sync.states import (
    BOUNDED,
    LOCK,
    RLOCK,
    SEMAPHORE,
    BarrierState,
    CondState,
    EventState,
    SemState,
)

#: Acquires by this process not yet released, per (service, object): a release of what
#: this process holds cannot fail, so it is sent without waiting for its answer.
_held: dict[tuple[str, int], int] = {}
_held_lock = threading.Lock()


class _Acquirer(Handle):
    """acquire/release/with, shared by the locks and semaphores."""

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        """Take the lock (a unit of the semaphore); wait up to ``timeout`` s (None: forever)
        when ``block``; True when taken."""
        if not block or (timeout is not None and timeout <= 0):
            ok = granted(self._call("acquire", False, gave_up=False, undo="release"))
        else:
            ok = granted(self._call("acquire", True, timeout=timeout, wait=True, gave_up=False, undo="release"))
        if ok and self._remote():
            key = (self._address, self._oid)
            with _held_lock:
                _held[key] = _held.get(key, 0) + 1
        return ok

    def release(self) -> None:
        key = (self._address, self._oid)
        with _held_lock:
            mine = _held.get(key, 0)
            if mine:
                _held[key] = mine - 1
        if mine:
            self._send("release")
        else:  # maybe not held: the service says (ValueError, as multiprocessing)
            self._call("release")

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class Lock(_Acquirer):
    """A non-recursive lock (``multiprocessing.Lock``); any thread or job may release it."""

    def __init__(self, *, ctx: Any = None) -> None:
        self._create(SemState(LOCK))

    def __repr__(self) -> str:
        owner, _ = self._call("describe")
        return f"<{type(self).__name__}(owner={owner_name(owner, self._creator)})>"


#: This process's recursion count per (service, RLock, thread) for RLocks of other
#: processes: taking an RLock again, or releasing it but once, needs no request.
_depth: dict[tuple[str, int, int], int] = {}


class RLock(_Acquirer):
    """A recursive lock (``multiprocessing.RLock``): its owner (a thread of a job) may take
    it again; only the owner releases it."""

    def __init__(self, *, ctx: Any = None) -> None:
        self._create(SemState(RLOCK))

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        key = (self._address, self._oid, threading.get_ident())
        depth = _depth.get(key, 0)
        if depth:  # this thread holds it: the service knows it as the owner already
            _depth[key] = depth + 1
            return True
        ok = super().acquire(block, timeout)
        if ok and self._remote():
            _depth[key] = 1
        return ok

    def release(self) -> None:
        key = (self._address, self._oid, threading.get_ident())
        depth = _depth.get(key, 0)
        if depth > 1:
            _depth[key] = depth - 1
            return
        if depth == 1:
            del _depth[key]
        super().release()

    def _is_owned(self) -> bool:
        return bool(self._call("count"))

    def __repr__(self) -> str:
        owner, count = self._call("describe")
        return f"<{type(self).__name__}({owner_name(owner, self._creator)}, {count})>"


class Semaphore(_Acquirer):
    """A counting semaphore (``multiprocessing.Semaphore``)."""

    _kind = SEMAPHORE

    def __init__(self, value: int = 1, *, ctx: Any = None) -> None:
        self._maxvalue = value
        self._create(SemState(self._kind, value, value))

    def _extra(self) -> tuple[Any, ...]:
        return (self._maxvalue,)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        (self._maxvalue,) = extra

    def get_value(self) -> int:
        return int(self._call("get_value"))

    @property
    def _semlock(self) -> _SemLockView:
        """What ``multiprocessing.queues.Queue`` reads of its semaphore (``full()``, ``qsize()``)."""
        return _SemLockView(self)

    def __repr__(self) -> str:
        return f"<{type(self).__name__}(value={self.get_value()})>"


class _SemLockView:
    """The two ``_multiprocessing.SemLock`` queries that multiprocessing's Queue makes."""

    def __init__(self, sem: Semaphore) -> None:
        self._sem = sem

    def _is_zero(self) -> bool:
        return self._sem.get_value() == 0

    def _get_value(self) -> int:
        return self._sem.get_value()


class BoundedSemaphore(Semaphore):
    """A semaphore that refuses to be released above its initial value."""

    _kind = BOUNDED

    def __repr__(self) -> str:
        return f"<{type(self).__name__}(value={self.get_value()}, maxvalue={self._maxvalue})>"


class _Unavailable:
    """multiprocessing's Condition counts sleepers in semaphores (``_sleeping_count``...);
    this one keeps its waiters in the service, so those counters do not exist."""

    def get_value(self) -> int:
        raise NotImplementedError("fibercore's Condition keeps its waiters in its service")


class WithLock:
    """acquire/release/with of an object that has a lock (``_lock``): a Condition, a
    synchronized Value or Array."""

    _lock: Lock | RLock

    def acquire(self, block: bool = True, timeout: float | None = None) -> bool:
        return self._lock.acquire(block, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


class Condition(WithLock, Handle):
    """A condition variable (``multiprocessing.Condition``) over a Lock or RLock of the
    same creating process (a new RLock by default)."""

    _sleeping_count = _woken_count = _wait_semaphore = _Unavailable()

    def __init__(self, lock: Lock | RLock | None = None, *, ctx: Any = None) -> None:
        if lock is None:
            lock = RLock()
        if not isinstance(lock, (Lock, RLock)):
            raise TypeError(f"a shared Condition needs a fibercore Lock or RLock, not {type(lock).__name__}")
        svc = _local(lock._address)
        if svc is None:
            raise ValueError("a Condition's lock must be created by the same process as the Condition")
        self._lock = lock
        self._home = lock._address  # the condition lives in its lock's service
        self._create(CondState(svc.get(lock._oid)))  # type: ignore[arg-type]

    def _extra(self) -> tuple[Any, ...]:
        return (self._lock,)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        (self._lock,) = extra

    def wait(self, timeout: float | None = None) -> bool:
        """Release the lock, wait for a notify (or ``timeout``), take the lock back."""
        return bool(self._call("wait", timeout=timeout, wait=True))

    #: threading's own: it only calls :meth:`wait` and the predicate (checked here, lock held).
    wait_for = threading.Condition.wait_for

    def notify(self, n: int = 1) -> None:
        self._call("notify", n)

    def notify_all(self) -> None:
        self._call("notify_all")

    def __repr__(self) -> str:
        return f"<{type(self).__name__}({self._lock!r}, waiters={self._call('waiters')})>"


class Event(Handle):
    """An event flag (``multiprocessing.Event``)."""

    def __init__(self, *, ctx: Any = None) -> None:
        self._create(EventState())

    def is_set(self) -> bool:
        return bool(self._call("is_set"))

    def set(self) -> None:
        self._call("set")

    def clear(self) -> None:
        self._call("clear")

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the flag is set, or ``timeout`` s; the flag."""
        return bool(self._call("wait", timeout=timeout, wait=True, gave_up=False))

    def __repr__(self) -> str:
        set_or_not = "set" if self.is_set() else "unset"
        return f"<{type(self).__qualname__} at {id(self):#x} {set_or_not}>"


class Barrier(Handle):
    """A barrier for ``parties`` threads or jobs (``multiprocessing.Barrier``)."""

    def __init__(self, parties: int, action: Callable[[], Any] | None = None,
                 timeout: float | None = None, *, ctx: Any = None) -> None:
        self._parties, self._action, self._timeout = parties, action, timeout
        self._create(BarrierState(parties, action is not None))

    def _extra(self) -> tuple[Any, ...]:
        return (self._parties, self._action, self._timeout)

    def _restore(self, extra: tuple[Any, ...]) -> None:
        self._parties, self._action, self._timeout = extra
        try:  # this process is a party: if it dies, the barrier breaks
            self._call("attach")
        except Exception:
            pass  # a stale handle: its first real use says why

    def wait(self, timeout: float | None = None) -> int:
        """Wait until ``parties`` have called wait; the arrival index (0 .. parties-1).
        The last to arrive runs the action first."""
        if timeout is None:
            timeout = self._timeout
        answer = self._call("wait", timeout=timeout, wait=True)
        if isinstance(answer, tuple):  # the last to arrive: run the action, then release all
            try:
                assert self._action is not None
                self._action()
            except BaseException as exc:
                self._call("action_done", False, f"{type(exc).__name__}: {exc}")
                raise
            index = self._call("action_done", True)
            return int(index if index is not None else answer[1])
        return int(answer)

    def abort(self) -> None:
        self._call("abort")

    def reset(self) -> None:
        self._call("reset")

    @property
    def parties(self) -> int:
        return self._parties

    @property
    def n_waiting(self) -> int:
        return int(self._call("n_waiting"))

    @property
    def broken(self) -> bool:
        return bool(self._call("broken"))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} parties={self._parties} waiting={self.n_waiting} broken={self.broken}>"


__all__ = ["Barrier", "BoundedSemaphore", "BrokenBarrierError", "Condition", "Event", "Lock", "RLock",
           "Semaphore"]
