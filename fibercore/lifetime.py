"""Clean-up of objects that own jobs (pools, manager servers): when collected, or at exit.

A user who forgets ``pool.terminate()`` or ``manager.shutdown()`` must still get a
program that ends, with no job left behind, as with multiprocessing (whose
``util.Finalize`` does this). Two rules make that safe:

* A collection never runs the clean-up itself. A garbage-collector callback can
  fire in any thread at any allocation, even while that thread holds the lock the
  clean-up needs (a Pool's scheduler lock: the program hung). The callback only
  writes a byte to a pipe (no Python lock involved); a reaper thread does the work.
* At exit, :func:`run_at_exit` runs every clean-up still due, highest priority
  first (pools before managers, whose proxies their tasks may use), before the
  exit handler terminates daemonic children and joins the others.
"""

from __future__ import annotations

import collections
import itertools
import logging
import os
import threading
import weakref
from collections.abc import Callable, Hashable
from typing import Any, Generic, TypeVar

log = logging.getLogger("fibercore.lifetime")

#: Priorities (higher runs first at exit), as multiprocessing's exitpriority.
POOL, MANAGER = 15, 0

_due: dict[int, tuple[int, Callable[[], None], Any]] = {}  # key -> (priority, clean-up, weakref)
_collected: collections.deque[int] = collections.deque()
_keys = itertools.count(1)
_lock = threading.Lock()
_wakeup: tuple[int, int] | None = None


class Handle:
    """The clean-up registered for one object; ``cancel()`` once the object was closed by hand."""

    __slots__ = ("key",)

    def __init__(self, key: int) -> None:
        self.key = key

    def cancel(self) -> None:
        _due.pop(self.key, None)


def track(obj: Any, cleanup: Callable[[], None], priority: int) -> Handle:
    """Run ``cleanup()`` once: when ``obj`` is collected (on the reaper thread) or at exit.

    ``cleanup`` must not refer to ``obj`` (it would never be collected).
    """
    _start_reaper()
    key = next(_keys)
    wakeup = _wakeup

    def collected(_ref: Any, key: int = key) -> None:
        # Called by the garbage collector, anywhere: no locks, no allocation-heavy work.
        _collected.append(key)
        try:
            os.write(wakeup[1], b"x")  # type: ignore[index]
        except OSError:
            pass

    _due[key] = (priority, cleanup, weakref.ref(obj, collected))
    return Handle(key)


def _start_reaper() -> None:
    global _wakeup
    if _wakeup is not None:
        return
    with _lock:
        if _wakeup is None:
            r, w = os.pipe()
            _wakeup = (r, w)
            threading.Thread(target=_reap, args=(r,), name="fiber-reaper", daemon=True).start()


_running: dict[int, int] = {}  # clean-ups under way: key -> the thread running it
_finished = threading.Condition(_lock)


def _run(key: int) -> None:
    with _lock:
        entry = _due.pop(key, None)
        if entry is None:
            return
        _running[key] = threading.get_ident()
    try:
        entry[1]()
    except Exception:
        log.exception("clean-up of a collected object failed")
    finally:
        with _lock:
            _running.pop(key, None)
            _finished.notify_all()


def _reap(fd: int) -> None:
    while True:
        try:
            os.read(fd, 512)
        except OSError:
            return
        while _collected:
            _run(_collected.popleft())


def run_collected(timeout: float = 30.0) -> None:
    """Run now, on this thread, the clean-ups of objects already collected, and wait for any
    the reaper is running: what this process started and dropped is gone when this returns
    (``active_children()`` calls it, as multiprocessing's finalizers run at collection).
    Never call it from a garbage-collector callback."""
    while _collected:
        try:
            key = _collected.popleft()
        except IndexError:
            break
        _run(key)
    me = threading.get_ident()
    with _lock:  # not for the clean-ups this thread itself is inside of
        _finished.wait_for(lambda: all(thread == me for thread in _running.values()), timeout)


def run_at_exit() -> None:
    """Run every clean-up still due, highest priority first (the master's exit handler)."""
    entries = sorted(list(_due.items()), key=lambda item: -item[1][0])
    for key, _entry in entries:
        _run(key)


_flushers: dict[tuple[int, Callable[[], None]], None] = {}  # in order of registration


def at_process_end(flush: Callable[[], None]) -> None:
    """Run ``flush`` when this process's work ends: deliver what a queue's or a pipe's
    sender thread still holds. Registered once per process and function.

    It runs in a job when its target returned (before the master hears the exit
    code), in a child started by ``multiprocessing`` (which leaves through
    ``os._exit`` without ``atexit`` handlers; its finalizers do run), and at the exit
    of any other process through ``atexit`` (the caller registers that itself).
    """
    key = (os.getpid(), flush)
    if key in _flushers:
        return
    _flushers[key] = None
    from multiprocessing import util

    util.Finalize(None, flush, exitpriority=10)


def run_process_end() -> None:
    """Run the :func:`at_process_end` hooks of this process (a job's target returned)."""
    pid = os.getpid()
    for key in list(_flushers):
        if key[0] == pid:
            try:
                key[1]()
            except Exception as exc:  # one failing flush must not stop the others
                log.warning("a flush at the end of the process failed: %r", exc)


_PID = [os.getpid()]


def current_pid() -> int:
    """This process's id, without a system call (hot paths check it to notice a fork)."""
    return _PID[0]


K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


class PerProcess(Generic[K, V]):
    """One object per key and process, made on first use (a client connection shared by
    every handle of a queue or manager here); a forked child makes its own."""

    def __init__(self) -> None:
        self._items: dict[tuple[int, K], V] = {}
        self._lock = threading.Lock()
        _per_process.append(weakref.ref(self))

    def get(self, key: K, make: Callable[[], V]) -> V:
        k = (current_pid(), key)
        value = self._items.get(k)  # made once, replaced only after discard(): no lock needed
        if value is not None:
            return value
        with self._lock:
            value = self._items.get(k)
            if value is None:
                value = self._items[k] = make()
            return value

    def peek(self, key: K) -> V | None:
        """The object for ``key`` if this process made one."""
        return self._items.get((current_pid(), key))

    def discard(self, value: V) -> None:
        with self._lock:
            for k, v in list(self._items.items()):
                if v is value:
                    del self._items[k]

    def here(self) -> list[V]:
        """Every object this process made."""
        pid = current_pid()
        return [v for (p, _), v in list(self._items.items()) if p == pid]

    def _forked(self) -> None:
        self._lock = threading.Lock()  # a parent's thread may have held it at the fork


_per_process: list[weakref.ref[PerProcess[Any, Any]]] = []


def _after_fork_in_child() -> None:
    """A forked child owns none of its parent's pools or servers, nor its reaper."""
    global _wakeup
    _PID[0] = os.getpid()
    for ref in _per_process:
        cache = ref()
        if cache is not None:
            cache._forked()
    _due.clear()
    _collected.clear()
    _wakeup = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
