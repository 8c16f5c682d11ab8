"""Sender: messages leave from the caller's thread when the line is idle, in batches when busy.

A ``put`` on an idle line (nothing queued, nothing being sent, no put in the last
:data:`BURST_GAP` seconds, a peer connected) seals and sends at once, on the caller's thread: a round
trip then costs one socket write, no thread hand-off. Puts that come faster queue
up, and a background thread packs everything queued into as few frames as it can,
so many small messages cost one transport call (what makes 100-byte messages fast).
Above ``high_water`` bytes queued, ``put`` blocks (back-pressure, like a full pipe).
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.wire.channel import Channel
from fibercore.wire.frames import Message, nbytes, owned

#: A put this soon after the previous one is part of a burst: it is queued and batched.
BURST_GAP = 20e-6
#: Bytes of queued messages packed into one frame. Small frames keep the line a
#: pipeline: the receiver verifies and hands out one while the next is on its way
#: (4 MiB frames measured half the 100-byte message rate of 32 KiB ones). A bigger
#: message still travels alone, in one frame.
BATCH_BYTES = 32 << 10


class Sender:
    """Sends messages to one peer of a channel, in order, batching bursts."""

    def __init__(
        self,
        channel: Channel,
        name: str,
        max_frame: int = BATCH_BYTES,
        high_water: int = 64 << 20,
        peer_gone: Callable[[], bool] | None = None,
    ) -> None:
        self._channel = channel
        self._name = name
        self._peer_gone = peer_gone
        self.queue: collections.deque[tuple[Message, int]] = collections.deque()
        self._lock = threading.Lock()  # ``with self._lock`` where nothing waits: a C call, not Condition's
        self._cv = threading.Condition(self._lock)
        self._bytes = 0
        self.busy = False  # a batch (or an inline send) is being sent
        self._closed = False
        self._error: BaseException | None = None
        self._max_frame = max_frame
        self._high_water = high_water
        self.last_put = 0.0
        #: Messages that went through the sending thread (queued), not out on the caller's.
        self.queued = 0
        self._thread: threading.Thread | None = None
        self._waiting = 0  # callers blocked in put (back-pressure) or flush
        self._then: Callable[[], None] | None = None  # what finish() leaves to the sending thread

    def _wait(self, timeout: float | None = None) -> None:
        """Wait on the condition as a caller (not the sending thread): counted, so that an
        idle line's sends wake nobody (a wake-up per message costs more than the send)."""
        self._waiting += 1
        try:
            self._cv.wait(timeout)
        finally:
            self._waiting -= 1

    def put(self, message: Message) -> None:
        with self._lock:
            if self._error is not None:
                raise TransportClosed(f"cannot send: {self._error}")
            while self._bytes > self._high_water and not self._closed and self._error is None:
                self._wait()
            if self._closed:
                raise TransportClosed("the connection is closed")
            inline = (not self.busy and not self.queue and time.perf_counter() - self.last_put > BURST_GAP
                      and self._channel.has_peer)
            if inline:
                self.busy = True
            else:  # it leaves after put() returns: what the caller may still change is copied
                message = (message[0], owned(message[1]))
                self.queued += 1
                size = sum(map(nbytes, message[1])) + 16
                self.queue.append((message, size))
                self._bytes += size
                if self._thread is None:
                    self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                    self._thread.start()
                elif len(self.queue) == 1 and not self.busy:
                    self._cv.notify_all()  # the sending thread (a busy sender looks again when done)
        if not inline:
            return
        try:
            self._send([message])
        except BaseException as exc:
            with self._cv:
                self._error = exc
                self.queue.clear()
            raise TransportClosed(f"cannot send: {exc}") from exc
        finally:
            with self._lock:
                self.busy = False
                self.last_put = time.perf_counter()
                if self.queue or self._waiting:  # queued meanwhile, or a flush() waits
                    self._cv.notify_all()

    def idle(self) -> bool:
        """Whether a message may leave now without this sender (nothing queued or being sent,
        no burst under way): then the caller sends it itself and calls :meth:`sent_aside`."""
        return (not self.queue and not self.busy and self._error is None and not self._closed
                and time.perf_counter() - self.last_put > BURST_GAP)

    def sent_aside(self) -> None:
        """A message left without this sender (see :meth:`idle`): the next put within
        :data:`BURST_GAP` starts a burst, as after one of its own."""
        self.last_put = time.perf_counter()

    def _run(self) -> None:
        while True:
            with self._cv:
                batch = self._take_batch()
            if batch is None:
                break
            try:
                self._send(batch)
            except BaseException as exc:  # closed endpoint: drop the rest, fail later puts
                with self._cv:
                    self._error = exc
                    self.queue.clear()
                    self.busy = False
                    self._closed = self._closed or self._then is not None
                    self._cv.notify_all()
                break
            with self._cv:
                self.busy = False
                if self._waiting:
                    self._cv.notify_all()
        then, self._then = self._then, None
        if then is not None:  # finish(): everything was sent (or the connection failed)
            then()

    def _take_batch(self) -> list[Message] | None:
        """The next frame's messages, waiting for them (cv held); None once the thread ends:
        closed with nothing queued, or :meth:`finish` called and everything sent."""
        while not self.queue or self.busy:
            if not self.queue and (self._closed or self._then is not None):
                self._closed = True
                self._cv.notify_all()
                return None
            self._cv.wait()
        # Busy before the queue empties: a line that looks at ``queue`` and then at ``busy``
        # without the lock (:class:`fibercore.pipes.line.Line`) never finds both clear while a
        # batch is on its way.
        self.busy = True
        batch: list[Message] = []
        size = 0
        while self.queue and (not batch or size + self.queue[0][1] <= self._max_frame):
            message, n = self.queue.popleft()
            batch.append(message)
            size += n
        self._bytes -= size
        if self._waiting:  # a put blocked by back-pressure may go on
            self._cv.notify_all()
        return batch

    def _send(self, batch: list[Message]) -> None:
        """Send one batch; a send that times out is tried again until the peer is known gone."""
        while True:
            try:
                self._channel.send(batch)
                return
            except TransportTimeout:
                if self._closed or (self._peer_gone is not None and self._peer_gone()):
                    raise BrokenPipeError("the other end is gone; what was still queued is dropped") from None

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued message was sent; False on timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while (self.queue or self.busy) and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._wait(remaining)
        return True

    def finish(self, then: Callable[[], None]) -> None:
        """Send what is queued, then close and call ``then`` (on the sending thread), never
        waiting here: an end dropped without close() is let go from whatever thread dropped it.
        ``then`` runs at once when nothing is queued or the sender failed."""
        with self._cv:
            now = self._thread is None or self._closed or self._error is not None or not (self.queue or self.busy)
            if now:
                self._closed = True
                self.queue.clear()
            else:
                self._then = then
            self._cv.notify_all()
        if now:
            then()

    def close(self, flush: bool = True, timeout: float | None = 10.0) -> None:
        if flush:
            self.flush(timeout)
        with self._cv:
            self._closed = True
            self.queue.clear()
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        return len(self.queue)
