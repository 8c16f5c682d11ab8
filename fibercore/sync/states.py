"""What the synchronization service keeps for each shared object, and its rules.

Each state is a small state machine run by :class:`~fibercore.sync.service.SyncService`
under the service's lock. An operation gets the :class:`Waiter` of its request (who
calls: ``(peer, thread)``) and either returns its answer at once or returns
:data:`PARKED` after storing the waiter, to be answered later through
:meth:`Waiter.finish` (a release grants a parked acquire, a ``set`` wakes waits). Every
request gets exactly one answer; a waiter whose caller gave up (a timeout) is
*cancelled* through :meth:`cancel`, which answers it unless it was answered already.

A caller's process that goes away (its connection closes) is handed to
:meth:`peer_lost`: the locks it held are released and marked *abandoned* (the next
acquirer is told), its waiters dropped, and a barrier it had joined is broken when it
died without saying goodbye.
"""

from __future__ import annotations

import ctypes
from collections import deque
from collections.abc import Callable, Hashable
from multiprocessing.sharedctypes import typecode_to_type  # type: ignore[attr-defined]
from typing import Any

from fibercore.errors import BrokenBarrierError

#: An operation's answer when it waits: the waiter is answered later.
PARKED = object()

LOCK, RLOCK, SEMAPHORE, BOUNDED = "Lock", "RLock", "Semaphore", "BoundedSemaphore"
RETURN, ERROR = 0, 1


class Waiter:
    """One request: who asked, and how to answer it (once)."""

    __slots__ = ("caller", "answer", "done", "state", "saved", "result", "then", "index")

    def __init__(self, caller: tuple[Hashable, int], answer: Callable[[int, Any], None]) -> None:
        self.caller = caller  # (peer, thread): a thread of a process
        self.answer = answer
        self.done = False
        self.state: Any = None  # the object it waits on (for cancel)
        self.saved = 0  # a Condition waiter: the lock's recursion count to restore
        self.result: Any = True  # a Condition waiter: what wait() returns
        self.then: Callable[[], Any] | None = None  # an operation to run while holding a lock
        self.index = 0  # a Barrier waiter: its arrival index

    def finish(self, kind: int, value: Any) -> None:
        if not self.done:
            self.done = True
            self.answer(kind, value)

    @property
    def peer(self) -> Hashable:
        return self.caller[0]


class State:
    """Base of every shared object's state."""

    kind = "object"

    def describe(self) -> str:
        """One line for ``fiber top`` and the dashboard (read without the service's lock: a
        view, not a decision)."""
        return ""

    def cancel(self, waiter: Waiter) -> None:
        """The caller stopped waiting (its timeout passed)."""

    def peer_lost(self, peer: Hashable, who: str, abrupt: bool) -> None:
        """A process that used this object is gone."""


class SemState(State):
    """Lock, RLock, Semaphore and BoundedSemaphore: a counter, an owner, a FIFO of waiters.

    A Lock records its owner (any thread may release it, as multiprocessing allows); an
    RLock counts its owner's recursion and only the owner may release it. Parked waiters
    are acquirers, Condition waiters taking the lock back (``saved``), and operations to
    run under the lock (``then``, for ``Value.value`` with a lock).
    """

    def __init__(self, kind: str, value: int = 1, maxvalue: int = 1) -> None:
        if kind in (SEMAPHORE, BOUNDED) and value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        self.kind = kind
        self.value = value  # Lock, Semaphore: free units; RLock: unused
        self.maxvalue = maxvalue
        self.owner: tuple[Hashable, int] | None = None
        self.count = 0  # RLock recursion
        self.queue: deque[Waiter] = deque()
        self.abandoned: str | None = None  # who died holding it, for the next acquirer

    # -- queries -------------------------------------------------------------------------------
    def free(self) -> bool:
        return self.owner is None if self.kind in (LOCK, RLOCK) else self.value > 0

    def describe(self) -> str:
        held = ("held" if self.owner is not None else "free") if self.kind in (LOCK, RLOCK) else f"value {self.value}"
        return f"{held}, {len(self.queue)} waiting" if self.queue else held

    def owned_by(self, caller: tuple[Hashable, int]) -> bool:
        return self.owner == caller

    # -- operations ------------------------------------------------------------------------------
    def op_acquire(self, w: Waiter, blocking: bool = True) -> Any:
        if not self.queue and self._take(w.caller):
            return self._granted()
        if self.kind == RLOCK and self.owner == w.caller:  # recursion never waits
            self.count += 1
            return True
        if not blocking:
            return False
        w.state = self
        self.queue.append(w)
        return PARKED

    def op_release(self, w: Waiter) -> None:
        if self.kind == RLOCK:
            if self.owner != w.caller:
                raise AssertionError("attempt to release recursive lock not owned by thread")
            self.count -= 1
            if self.count:
                return
            self.owner = None
        elif self.kind == LOCK:
            if self.owner is None:
                raise ValueError("semaphore or lock released too many times")
            self.owner = None
        else:
            if self.kind == BOUNDED and self.value >= self.maxvalue:
                raise ValueError("semaphore or lock released too many times")
            self.value += 1
        self.wake()

    def op_get_value(self, w: Waiter) -> int:
        if self.kind in (LOCK, RLOCK):
            return 0 if self.owner is not None else 1
        return self.value

    def op_count(self, w: Waiter) -> int:
        """An RLock's recursion count when the caller owns it, else 0 (for Condition)."""
        return self.count if self.owner == w.caller else 0

    def op_describe(self, w: Waiter) -> tuple[Any, int]:
        """(owner, count) for repr: the owner's (peer, thread), or None."""
        return (self.owner, self.count if self.kind == RLOCK else (1 if self.owner else 0))

    # -- rules ------------------------------------------------------------------------------------
    def _take(self, caller: tuple[Hashable, int], count: int = 1) -> bool:
        if self.kind in (LOCK, RLOCK):
            if self.owner is not None:
                return False
            self.owner, self.count = caller, count
            return True
        if self.value <= 0:
            return False
        self.value -= 1
        return True

    def _granted(self) -> Any:
        """True, or the story of an abandoned lock (the client warns, then returns True)."""
        if self.abandoned is not None:
            story, self.abandoned = self.abandoned, None
            return story
        return True

    def wake(self) -> None:
        """Grant parked waiters, in order, while the lock (or a unit) is free."""
        while self.queue and self.free():
            w = self.queue.popleft()
            if w.then is not None:  # run under the lock, which stays free
                try:
                    result = w.then()
                except Exception as exc:
                    w.finish(ERROR, exc)
                else:
                    w.finish(RETURN, result)
                continue
            if w.saved:  # a Condition waiter takes the lock back with its recursion count
                self._take(w.caller, w.saved)
                w.finish(RETURN, w.result)
                continue
            self._take(w.caller)
            w.finish(RETURN, self._granted())

    def run_locked(self, w: Waiter, op: Callable[[], Any]) -> Any:
        """Run ``op`` as if under this lock: now when the caller holds it or nobody does
        (and nobody waits), else in turn once it is released (without taking it)."""
        if self.owner == w.caller or (self.owner is None and not self.queue):
            return op()
        w.then = op
        w.state = self
        self.queue.append(w)
        return PARKED

    def cancel(self, w: Waiter) -> None:
        if w.saved:  # a Condition waiter: it waits for the lock whatever its timeout
            return
        try:
            self.queue.remove(w)
        except ValueError:
            return
        w.finish(RETURN, False)

    def peer_lost(self, peer: Hashable, who: str, abrupt: bool) -> None:
        self.queue = deque(w for w in self.queue if w.peer != peer)
        if self.owner is not None and self.owner[0] == peer:
            self.owner, self.count = None, 0
            self.abandoned = (
                f"{who} held this {self.kind} when its connection ended (it died or exited without "
                "releasing it); fibercore released it for you, but what it protects may be half-updated"
            )
            self.wake()


class CondState(State):
    """A Condition over a Lock or RLock of the same service."""

    kind = "Condition"

    def __init__(self, lock: SemState) -> None:
        self.lock = lock
        self.waiters: deque[Waiter] = deque()

    def describe(self) -> str:
        return f"{len(self.waiters)} waiting"

    def op_wait(self, w: Waiter) -> Any:
        lock = self.lock
        if lock.owner != w.caller:
            raise RuntimeError("cannot wait on un-acquired lock")
        w.saved = lock.count if lock.kind == RLOCK else 1
        lock.owner, lock.count = None, 0
        w.state, w.result = self, True
        self.waiters.append(w)
        lock.wake()
        return PARKED

    def op_notify(self, w: Waiter, n: int = 1) -> None:
        if self.lock.owner != w.caller:
            raise RuntimeError("cannot notify on un-acquired lock")
        while self.waiters and n > 0:
            self._to_lock(self.waiters.popleft(), True)
            n -= 1

    def op_notify_all(self, w: Waiter) -> None:
        self.op_notify(w, len(self.waiters))

    def op_waiters(self, w: Waiter) -> int:
        return len(self.waiters)

    def _to_lock(self, w: Waiter, result: bool) -> None:
        """Notified (or timed out): wait to take the lock back."""
        w.result = result
        w.state = self.lock
        self.lock.queue.append(w)

    def cancel(self, w: Waiter) -> None:
        try:
            self.waiters.remove(w)
        except ValueError:
            return  # notified already: it returns True once it has the lock again
        self._to_lock(w, False)
        self.lock.wake()

    def peer_lost(self, peer: Hashable, who: str, abrupt: bool) -> None:
        self.waiters = deque(w for w in self.waiters if w.peer != peer)


class EventState(State):
    kind = "Event"

    def __init__(self) -> None:
        self.flag = False
        self.waiters: list[Waiter] = []

    def describe(self) -> str:
        return "set" if self.flag else f"clear, {len(self.waiters)} waiting"

    def op_set(self, w: Waiter) -> None:
        self.flag = True
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter.finish(RETURN, True)

    def op_clear(self, w: Waiter) -> None:
        self.flag = False

    def op_is_set(self, w: Waiter) -> bool:
        return self.flag

    def op_wait(self, w: Waiter) -> Any:
        if self.flag:
            return True
        w.state = self
        self.waiters.append(w)
        return PARKED

    def cancel(self, w: Waiter) -> None:
        if w in self.waiters:
            self.waiters.remove(w)
            w.finish(RETURN, self.flag)

    def peer_lost(self, peer: Hashable, who: str, abrupt: bool) -> None:
        self.waiters = [w for w in self.waiters if w.peer != peer]


class BarrierState(State):
    """threading.Barrier's rules across processes.

    The last party to arrive runs the action (its answer says so) and reports back;
    then every party is released with its arrival index. A wait that times out, an
    ``abort()``, an action that raises, or a party that died breaks the barrier.
    """

    kind = "Barrier"

    def __init__(self, parties: int, has_action: bool) -> None:
        if parties <= 0:
            raise ValueError("parties must be > 0")
        self.parties = parties
        self.has_action = has_action
        self.waiters: list[Waiter] = []
        self.acting: Waiter | None = None  # the last arrival, running the action
        self.later: list[Waiter] = []  # arrivals while the action runs: the next round
        self.broken: str | None = None
        self.attached: set[Hashable] = set()

    def describe(self) -> str:
        return "broken" if self.broken else f"{len(self.waiters)} of {self.parties} waiting"

    def op_attach(self, w: Waiter) -> None:
        self.attached.add(w.peer)

    def op_wait(self, w: Waiter) -> Any:
        self.attached.add(w.peer)
        if self.broken is not None:
            raise BrokenBarrierError(self.broken)
        if self.acting is not None:
            w.state = self
            self.later.append(w)
            return PARKED
        w.index = len(self.waiters)
        w.state = self
        if w.index < self.parties - 1:
            self.waiters.append(w)
            return PARKED
        if self.has_action:  # the caller runs the action, then calls action_done
            self.acting = w
            return ("action", w.index)
        self._release()
        return w.index

    def op_action_done(self, w: Waiter, ok: bool, error: str = "") -> int | None:
        if self.acting is None or self.acting.caller != w.caller:
            return None
        index = self.acting.index
        self.acting = None
        if ok:
            self._release()
            return index
        self._break(f"the barrier's action raised in the last party to arrive: {error}")
        return None

    def _release(self) -> None:
        waiters, self.waiters = self.waiters, []
        for waiter in waiters:
            waiter.finish(RETURN, waiter.index)
        later, self.later = self.later, []
        for waiter in later:  # they arrived during the action: they start the next round
            result = self.op_wait(waiter)
            if result is not PARKED:
                waiter.finish(RETURN, result)

    def _break(self, why: str) -> None:
        self.broken = why
        waiters = self.waiters + self.later
        self.waiters, self.later = [], []
        for waiter in waiters:
            waiter.finish(ERROR, BrokenBarrierError(why))

    def op_abort(self, w: Waiter) -> None:
        if self.broken is None:
            self._break("the barrier was aborted")

    def op_reset(self, w: Waiter) -> None:
        waiters = self.waiters + self.later
        self.waiters, self.later, self.acting = [], [], None
        for waiter in waiters:
            waiter.finish(ERROR, BrokenBarrierError("the barrier was reset while parties waited"))
        self.broken = None

    def op_n_waiting(self, w: Waiter) -> int:
        return len(self.waiters)

    def op_broken(self, w: Waiter) -> bool:
        return self.broken is not None

    def cancel(self, w: Waiter) -> None:
        if w in self.waiters or w in self.later:
            self._break("a party's wait timed out")

    def peer_lost(self, peer: Hashable, who: str, abrupt: bool) -> None:
        self.waiters = [w for w in self.waiters if w.peer != peer]
        self.later = [w for w in self.later if w.peer != peer]
        acting_lost = self.acting is not None and self.acting.peer == peer
        if acting_lost:
            self.acting = None
        if peer in self.attached:
            self.attached.discard(peer)
            if (abrupt or acting_lost) and self.broken is None:
                self._break(f"{who} was a party of this barrier and died")


def ctype_of(typecode_or_type: Any) -> Any:
    """The ctypes type for a typecode ('i', 'd', 'c'...) or a ctypes type."""
    if isinstance(typecode_or_type, str):
        try:
            return typecode_to_type[typecode_or_type]
        except KeyError:
            raise TypeError(
                f"unknown typecode {typecode_or_type!r}: use one of "
                f"{', '.join(sorted(typecode_to_type))} or a ctypes type") from None
    if isinstance(typecode_or_type, type) and issubclass(typecode_or_type, ctypes._SimpleCData):
        return typecode_or_type
    raise TypeError(f"a shared Value or Array holds a typecode or a simple ctypes type, not {typecode_or_type!r}")


class DataState(State):
    """A ctypes value or array kept in the service (``Value``, ``Array`` and their raw forms):
    C semantics (an ``'i'`` wraps at 32 bits), every access one request."""

    kind = "data"
    READABLE = frozenset({"value", "raw"})

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def _with(self, w: Waiter, lock: SemState | None, op: Callable[[], Any]) -> Any:
        return op() if lock is None else lock.run_locked(w, op)

    def op_get(self, w: Waiter, attr: str, lock: SemState | None = None) -> Any:
        if attr not in self.READABLE:
            raise AttributeError(attr)
        return self._with(w, lock, lambda: getattr(self.obj, attr))

    def op_set(self, w: Waiter, attr: str, value: Any, lock: SemState | None = None) -> Any:
        if attr not in self.READABLE:
            raise AttributeError(attr)
        return self._with(w, lock, lambda: setattr(self.obj, attr, value))

    def op_getitem(self, w: Waiter, key: Any, lock: SemState | None = None) -> Any:
        return self._with(w, lock, lambda: self.obj[key])

    def op_setitem(self, w: Waiter, key: Any, value: Any, lock: SemState | None = None) -> Any:
        def put() -> None:
            if isinstance(key, slice):
                self.obj[key] = list(value) if not isinstance(value, (bytes, bytearray)) else value
            else:
                self.obj[key] = value
        return self._with(w, lock, put)

    def op_repr(self, w: Waiter) -> str:
        return repr(self.obj)
