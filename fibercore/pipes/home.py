"""The listening side of each Pipe, in the process that created it."""

from __future__ import annotations

import os
import threading
import uuid
import weakref
from typing import Any, Protocol

from fibercore.pipes.inbox import Inbox
from fibercore.runtime import get_runtime


class PipeEnd(Protocol):
    """What the paths read of a pipe's end (a :class:`fibercore.connection.Connection`)."""

    _pipe_id: str
    _creator_pid: int
    _side: int
    _closed: bool
    _pickled: bool
    _writable: bool
    _wrote_here: bool
    _inbox: Inbox

    def _stays_here(self) -> bool:
        """Neither sent to another process nor connected: messages may go in memory."""

    def _send(self, op: int, parts: list[Any]) -> None:
        """Send one message by whichever path applies now."""

#: The pipes created in this process, by id.
homes: dict[str, PipeHome] = {}


class PipeHome:
    """One Pipe's listening socket and its two ends, in the creating process."""

    def __init__(self) -> None:
        self.id = uuid.uuid4().hex
        self.channel = get_runtime().listen("pair", service="pipe")
        self.address = self.channel.address
        self.claimed = False
        self.closed_sides: set[int] = set()
        self.users = 2
        self.lock = threading.Lock()
        self.arrived = threading.Condition(self.lock)  # a message was delivered in memory
        self.ends: list[weakref.ref[PipeEnd] | None] = [None, None]
        # An end is (or may be) used by another process: someone dialled in, or this
        # process forked. Then every message goes over the network.
        self.shared = False
        self.channel.on_peer_event(self._peer_event)
        homes[self.id] = self

    def _peer_event(self, peer: Any, added: bool) -> None:
        if added:
            self.mark_shared()

    def mark_shared(self) -> None:
        with self.arrived:
            self.shared = True
            self.arrived.notify_all()

    def claim(self) -> bool:
        """True for the first end to use the listening socket in this process."""
        with self.lock:
            take = not self.claimed
            self.claimed = True
            return take

    def side_closed(self, side: int) -> None:
        """The end ``side`` was closed here and no copy of it went elsewhere."""
        self.closed_sides.add(side)

    def end(self, side: int) -> PipeEnd | None:
        ref = self.ends[side]
        return ref() if ref is not None else None

    def release(self) -> None:
        """An end closed; the last one closes the listening socket."""
        with self.lock:
            self.users -= 1
            if self.users > 0:
                return
        homes.pop(self.id, None)
        self.channel.close()


def home_of(pipe_id: str, creator_pid: int) -> PipeHome | None:
    """The pipe's home when this is the process that created it."""
    return homes.get(pipe_id) if os.getpid() == creator_pid else None


def _forking() -> None:
    """A forked child may use either end of every pipe that exists now."""
    for home in list(homes.values()):
        home.shared = True


os.register_at_fork(before=_forking)

__all__ = ["PipeEnd", "PipeHome", "home_of", "homes"]
