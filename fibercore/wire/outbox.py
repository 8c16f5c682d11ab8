"""Per-peer outboxes: a service that answers many peers never waits for one that reads slowly.

A reply goes out at once when the peer's connection has room and nothing of that peer
waits; otherwise it joins the peer's own outbox, sent in order by a thread of its own
(which alone may wait for the peer). A peer whose outbox has taken nothing for ``stuck_after``
seconds (:meth:`Outboxes.check_stuck`, called about every second by the service while
:meth:`Outboxes.any` is true), or holds more than ``max_bytes``, is dropped: its connection
ends, and the service's peer-lost handling takes back what it held. Used by the queue broker
and the synchronization service.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from typing import Any

from fibercore.errors import TransportTimeout

log = logging.getLogger("fibercore.wire")


class _Outbox:
    """One peer's replies that found its connection full, and when it last took a frame."""

    __slots__ = ("messages", "bytes", "since")

    def __init__(self) -> None:
        self.messages: deque[tuple[list[Any], int]] = deque()
        self.bytes = 0
        self.since = time.monotonic()


class Outboxes:
    """The slow peers of one channel, each with its outbox and sending thread."""

    def __init__(self, channel: Any, name: str, max_bytes: int, on_slow: Callable[[], None],
                 describe: Callable[[Hashable], str] = repr) -> None:
        self.channel = channel
        self.name = name  # for thread names and the log: "queue 1a2b3c4d", "synchronization service"
        self.max_bytes = max_bytes
        self.on_slow = on_slow  # a peer became slow: the service looks every second from now on
        self.describe = describe
        self._boxes: dict[Hashable, _Outbox] = {}
        self._lock = threading.Lock()

    def any(self) -> bool:
        """Whether a peer is slow now (the service then calls :meth:`check_stuck` every second)."""
        return bool(self._boxes)

    def deliver(self, peer: Hashable, message: list[Any], size: int, inline: bool = True) -> None:
        """Send ``message`` (a frame's messages) to ``peer`` now if it has room and nothing of it
        waits (and ``inline``), else queue it for the peer's sending thread."""
        with self._lock:
            box = self._boxes.get(peer)
            new = box is None
            if box is None:
                if inline:
                    try:
                        self.channel.send(message, peer, block=False)
                        return
                    except TransportTimeout:  # full: the peer is slow, stopped, or reading a big reply
                        pass
                    except Exception:  # the peer left: its loss is handled by the peer event
                        return
                box = self._boxes[peer] = _Outbox()
                threading.Thread(target=self._drain, args=(peer, box), name=f"fiber-{self.name.split()[0]}-slow",
                                 daemon=True).start()
            box.messages.append((message, size))
            box.bytes += size
            over = box.bytes
        if new:
            self.on_slow()
        if over > self.max_bytes:
            self.give_up(peer, f"{over >> 20} MiB of replies it does not read")

    def _drain(self, peer: Hashable, box: _Outbox) -> None:
        """A slow peer's sending thread: its replies in order, waiting for its connection."""
        while True:
            with self._lock:
                if not box.messages or self._boxes.get(peer) is not box:
                    if self._boxes.get(peer) is box:
                        del self._boxes[peer]
                    return
                message, size = box.messages[0]
                box.since = time.monotonic()
            try:
                self.channel.send(message, peer)
            except Exception:  # the peer left: its loss is handled by the peer event
                with self._lock:
                    if self._boxes.get(peer) is box:
                        del self._boxes[peer]
                return
            with self._lock:
                if box.messages:
                    box.messages.popleft()
                box.bytes -= size

    def check_stuck(self, stuck_after: float) -> None:
        """Drop peers whose sending thread has waited ``stuck_after`` seconds for room."""
        now = time.monotonic()
        with self._lock:
            stuck = [peer for peer, box in self._boxes.items() if now - box.since > stuck_after]
        for peer in stuck:
            self.give_up(peer, f"it read nothing for {stuck_after:.0f} s")

    def give_up(self, peer: Hashable, why: str) -> None:
        """Drop a peer that does not read (its connection ends; never under the service's lock)."""
        log.warning("%s: dropped %s: %s", self.name, self.describe(peer), why)
        with self._lock:
            box = self._boxes.pop(peer, None)
            if box is not None:
                box.messages.clear()
        self.channel.drop(peer)


__all__ = ["Outboxes"]
