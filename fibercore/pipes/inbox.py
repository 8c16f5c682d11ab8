"""What one end received and has not read yet, its end flags, and its readiness descriptor."""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fibercore.errors import TransportTimeout
from fibercore.pipes import CLOSE

Message = tuple[int, list[Any]]


class Ready:
    """A pipe whose read end is readable while a flag is set (a connection's fileno())."""

    def __init__(self) -> None:
        self.r, self._w = os.pipe()
        os.set_blocking(self.r, False)
        os.set_blocking(self._w, False)
        self._set = False
        self._closed = False
        self._lock = threading.Lock()

    def set(self) -> None:
        with self._lock:
            # Never after close: the number may be another file's by then (a thread that
            # files for an end closed meanwhile would write into someone else's socket).
            if not self._set and not self._closed:
                try:
                    os.write(self._w, b"!")
                    self._set = True
                except OSError:  # closed
                    pass

    def clear(self) -> None:
        with self._lock:
            if self._set and not self._closed:
                try:
                    os.read(self.r, 64)
                except OSError:
                    pass
                self._set = False

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for fd in (self.r, self._w):
                try:
                    os.close(fd)
                except OSError:
                    pass


class Inbox:
    """Messages for one end, oldest first, and how the pipe ends for it.

    ``eof``: the other end is gone (frames still in flight are drained first);
    ``ended``: reads raise EOFError now. ``ready`` (made by :meth:`descriptor`) is
    readable while a message or the end waits.
    """

    def __init__(self) -> None:
        self.messages: deque[Message] = deque()
        self.eof = False
        self.ended = False
        self.ready: Ready | None = None

    def __len__(self) -> int:
        return len(self.messages)

    def take(self) -> Message:
        """The oldest message; the descriptor stays readable while more wait."""
        msg = self.messages.popleft()
        if not self.messages and self.ready is not None and not self.ended:
            self.ready.clear()
        return msg

    def put_back(self, msg: Message) -> None:
        """A message peeked at (``poll``) goes back in front."""
        self.messages.appendleft(msg)
        if self.ready is not None:
            self.ready.set()

    def deliver(self, op: int, parts: list[Any]) -> None:
        """One message handed over in memory by the other end."""
        self.messages.append((op, parts))
        if self.ready is not None:
            self.ready.set()

    def file(self, messages: list[Message], twin_still_writes: Callable[[], bool]) -> None:
        """Received messages in; a CLOSE ends the pipe unless the other end still writes."""
        for op, parts in messages:
            if op == CLOSE:
                if not twin_still_writes():
                    self.eof = True
            else:
                self.messages.append((op, parts))
        if self.messages and self.ready is not None:
            self.ready.set()

    def end(self) -> None:
        """Reads end now: the descriptor is readable, as an OS pipe's at EOF."""
        self.ended = True
        if self.ready is not None:
            self.ready.set()

    def descriptor(self) -> tuple[int, bool]:
        """The readiness descriptor, and whether it was made by this call."""
        made = self.ready is None
        if self.ready is None:
            self.ready = Ready()
            if self.messages or self.ended:
                self.ready.set()
        return self.ready.r, made

    def drain(self) -> list[Message]:
        """Every message still here, oldest first; the inbox is empty after."""
        pending = list(self.messages)
        self.messages.clear()
        return pending

    def forked(self) -> None:
        """In a forked child the descriptor is the parent's: forget it."""
        self.ready = None

    def close(self) -> None:
        if self.ready is not None:
            self.ready.close()




def wait_a_step(cond: threading.Condition, deadline: float | None, ended: bool, step: float) -> None:
    """Inside ``cond``, with nothing to read: EOFError at the end of the pipe,
    TransportTimeout past ``deadline``, else wait up to ``step`` for a delivery."""
    if ended:
        raise EOFError("the other end of the pipe is closed")
    remaining = None if deadline is None else deadline - time.monotonic()
    if remaining is not None and remaining <= 0:
        raise TransportTimeout("no message within the timeout")
    cond.wait(step if remaining is None else min(step, remaining))


__all__ = ["Inbox", "Message", "Ready", "wait_a_step"]
