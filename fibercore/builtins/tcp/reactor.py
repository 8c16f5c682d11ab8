"""One thread per process that accepts and authenticates the connections of every listening
endpoint (an authenticated connection is then read by the thread waiting in the listener's
``recv``, :mod:`.listener`)."""

from __future__ import annotations

import collections
import os
import selectors
import socket
import threading
import time
from collections.abc import Callable
from typing import Protocol

from fibercore.wire.frames import reject


class Served(Protocol):
    """What the reactor asks of a listener it serves (:class:`.admission.Admission`)."""

    def next_expiry(self, now: float) -> float | None:
        """Seconds from ``now`` until its oldest unauthenticated connection times out."""

    def expire(self, now: float) -> None:
        """Close the connections that did not authenticate in time."""


class Reactor:
    """Accepts, authenticates and reads every listener's connections in one thread."""

    def __init__(self) -> None:
        self.sel = selectors.DefaultSelector()
        self.lock = threading.Lock()
        self._todo: collections.deque[Callable[[], None]] = collections.deque()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self.sel.register(self._wake_r, selectors.EVENT_READ, None)
        self.listeners: set[Served] = set()
        self.thread = threading.Thread(target=self._run, name="fiber-reactor", daemon=True)
        self.thread.start()

    def call(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the reactor thread (selector changes happen only there)."""
        self._todo.append(fn)
        try:
            self._wake_w.send(b"\0")
        except OSError:
            pass

    def serve(self, listener: Served) -> None:
        """Look at ``listener``'s handshakes' deadlines (on the reactor thread)."""
        self.listeners.add(listener)

    def forget(self, listener: Served) -> None:
        self.listeners.discard(listener)

    def _next_expiry(self) -> float | None:
        """Seconds until a pending handshake times out (None: none pending, sleep until woken)."""
        now = time.monotonic()
        soonest = None
        for listener in list(self.listeners):
            left = listener.next_expiry(now)
            if left is not None:
                soonest = left if soonest is None else min(soonest, left)
        return None if soonest is None else max(0.01, soonest + 0.01)

    def _run(self) -> None:
        while True:
            try:
                events = self.sel.select(self._next_expiry())
            except OSError:  # pragma: no cover - a descriptor closed under us
                events = []
            for key, _mask in events:
                if key.data is None:
                    try:
                        self._wake_r.recv(4096)
                    except OSError:
                        pass
                    continue
                try:
                    key.data()
                except Exception as exc:  # pragma: no cover - a handler bug must not stop the reactor
                    reject("reactor", key.data, f"internal error: {exc!r}", "reactor_errors")
            while self._todo:
                fn = self._todo.popleft()
                try:
                    fn()
                except Exception as exc:  # pragma: no cover
                    reject("reactor", fn, f"internal error: {exc!r}", "reactor_errors")
            now = time.monotonic()
            for listener in list(self.listeners):
                listener.expire(now)


_reactor: Reactor | None = None
_reactor_lock = threading.Lock()


def get_reactor() -> Reactor:
    global _reactor
    if _reactor is None:
        with _reactor_lock:
            if _reactor is None:
                _reactor = Reactor()
    return _reactor


def _after_fork_in_child() -> None:
    """The parent's reactor thread does not exist here: a new one starts when needed."""
    global _reactor, _reactor_lock
    _reactor = None
    _reactor_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)
