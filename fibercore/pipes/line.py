"""A connected end's line: a message per frame, sent and read on the caller's thread with
nothing between the :class:`~fibercore.connection.Connection` and the transport.

A stepped simulator and its master exchange one small message at a time, and each layer a
message crosses (connection, network path, sender, lane, channel) costs a few function
calls of Python on both sides of every step. A line makes the checks those layers make in
two kinds:

* what changes rarely (the end has one peer, is open, in this process, with no thread
  receiving for it) is true while the line exists: :class:`~fibercore.pipes.network.NetworkPath`
  drops its line at every such change (a peer arriving or leaving, a fork, ``close()``,
  ``fileno()``, the sender starting), and the layers make a new one when they next run;
* what may change between two messages (the sender has a queue or a burst under way,
  messages or the end wait in the inbox, another thread reads) is looked at on each call,
  a few attribute reads; when one fails, the call says so and the caller takes the layers.

Frames are sealed, opened, counted and ordered exactly as through the layers, whose paths
stay usable beside it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fibercore.errors import TransportClosed
from fibercore.pipes import CLOSE
from fibercore.pipes.inbox import Inbox, Message
from fibercore.wire import Sender
from fibercore.wire.channel import Lane, send_deferred
from fibercore.wire.frames import SHORT, BadFrame, reject
from fibercore.wire.sender import BURST_GAP

_clock = time.perf_counter
_SHORT_CLOSE = SHORT | CLOSE  # the end of the pipe as a short frame: filed in the inbox
_get_ident = threading.get_ident


class Line:
    """One connected end's hot path (see the module's docstring)."""

    __slots__ = ("session", "_lock", "_seal_one", "_heads", "_write", "_write_two", "_read", "_open_one", "_open",
                 "_short", "_receiving", "_address", "sender", "inbox", "readable", "wait", "twin_still_writes")

    def __init__(self, lane: Lane, sender: Sender | None, inbox: Inbox, readable: bool, wait: float | None,
                 twin_still_writes: Callable[[], bool]) -> None:
        session = lane.session
        self.session = session
        self._lock = session.lock
        self._seal_one = session.sealer.seal_one
        self._write = lane._send_parts
        # A short frame (a stream's: its one-byte header and the message) goes to the
        # transport's write of two buffers as it is: no sealing call, no list of parts; so
        # does a frame sealed in two buffers (a network connection's small message).
        self._write_two = lane._send_two
        self._heads = session.sealer.short_heads if lane._send_two is not None else None
        self._read = lane._recv_frame
        self._open_one = session.opener.open_one
        self._open = session.opener.open
        self._short = session.opener.short
        self._receiving = lane.channel._receiving
        self._address = lane.channel.address
        #: The end's sender (None until it first sent): the line sends only while it is idle.
        self.sender = sender
        self.inbox = inbox
        self.readable = readable
        #: The longest wait for a frame (None: until one comes), as the layers would wait.
        self.wait = wait
        self.twin_still_writes = twin_still_writes

    def send(self, op: int, parts: list[Any]) -> bool:
        """Send one message now, in a frame of its own; False when the layers must take it
        (no sender yet, a queue or a burst under way, the other end gone, several parts,
        a send re-entered on this thread). TransportClosed when the connection ended."""
        sender = self.sender
        # ``queue`` before ``busy``: the sending thread marks itself busy before it empties it.
        if sender is None or sender.queue or sender.busy or self.inbox.eof or len(parts) != 1:
            return False
        now = _clock()
        if now - sender.last_put <= BURST_GAP:  # a burst: the sender packs it into frames
            return False
        session = self.session
        me = _get_ident()
        if session.sending == me:  # re-entered (a finalizer): transmit() defers it
            return False
        heads = self._heads
        with self._lock:  # transmit() of one message of one part, inlined
            session.sending = me
            try:
                if heads is not None and op < SHORT:  # seal_one's short frame, inlined
                    self._write_two(heads[op], parts[0])  # type: ignore[misc]
                else:
                    sealed = self._seal_one(op, parts[0])
                    if len(sealed) == 2 and type(sealed[1]) is memoryview and self._write_two is not None:
                        self._write_two(sealed[0], sealed[1])  # a sealed frame of two buffers, as it is
                    else:
                        self._write(sealed, session, True)
                if session.deferred:
                    send_deferred(session, self._write)
            finally:
                session.sending = None
        sender.last_put = now
        return True

    def recv(self) -> Message | None:
        """The next message, when it comes alone in a frame; None when the layers must look
        (something waits in the inbox, another thread reads, a frame brought several messages
        or the end, nothing came within :attr:`wait`). EOFError once the connection ended.
        A frame received marks the end's next send as an answer (never part of a burst)."""
        inbox = self.inbox
        if inbox.messages or inbox.eof or not self.readable or not self._receiving.acquire(False):
            return None
        try:  # taken and opened under the channel's receiving lock, as by the layers
            frame = self._read(self.wait, self.session)
            if frame is None:
                return None
            sender = self.sender
            if sender is not None:  # the next send answers this message: not part of a burst
                sender.last_put = 0.0
            if self._short and frame:  # a stream's short frame (open_one's first look, inlined)
                first = frame[0]
                if first & SHORT and first != _SHORT_CLOSE:
                    return first & ~SHORT, [frame[1:]]
            one = self._open_one(frame)
            if one is not None and one[0] != CLOSE:
                return one
            messages = self._open(frame) if one is None else [one]
        except TransportClosed:
            inbox.end()
            raise EOFError("the pipe was closed") from None
        except BadFrame as exc:
            reject(self._address, self.session, str(exc))
            return None
        finally:
            self._receiving.release()
        if len(messages) == 1 and messages[0][0] != CLOSE:
            return messages[0]
        inbox.file(messages, self.twin_still_writes)
        return None


__all__ = ["Line"]
