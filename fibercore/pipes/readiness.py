"""An end whose ``fileno()`` is used: a thread receives for it, and a descriptor is
readable while a message (or the end of the pipe) waits, for ``select``, ``selectors``
and :func:`fibercore.connection.wait`."""

from __future__ import annotations

import threading
from collections.abc import Callable

from fibercore.pipes.home import PipeHome
from fibercore.pipes.inbox import Inbox, Message, wait_a_step
from fibercore.pipes.network import NetworkPath
from fibercore.wire import Channel


class Watcher:
    """The receiving thread of one end; readers wait on ``filed`` for what it files."""

    def __init__(self, name: str, inbox: Inbox, network: NetworkPath, connect: Callable[[], Channel],
                 closed: Callable[[], bool], local_home: Callable[[], PipeHome | None]) -> None:
        self.inbox = inbox
        self.network = network
        #: The end's connect (OSError once it is closed: the thread then ends).
        self._connect = connect
        self._closed = closed
        #: The pipe's home while the other end is here in memory (senders signal then).
        self._local_home = local_home
        self.filed = threading.Condition()
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._closed():
            home = self._local_home()
            if home is not None:  # in memory: senders signal the descriptor themselves
                with home.arrived:
                    home.arrived.wait(0.2)
                continue
            try:
                self.network.pull(self._connect(), None, 0.2)
            except EOFError:
                with self.filed:
                    self.filed.notify_all()
                return
            except Exception:  # closed meanwhile
                return
            if self.inbox:
                with self.filed:
                    self.filed.notify_all()

    def next(self, deadline: float | None) -> Message:
        """The next message this thread filed; EOFError at the end, TransportTimeout past ``deadline``."""
        with self.filed:
            while not self.inbox:
                wait_a_step(self.filed, deadline, ended=self.inbox.ended, step=0.5)
            return self.inbox.take()


__all__ = ["Watcher"]
