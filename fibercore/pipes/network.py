"""Delivery over the transport: one end's connection, its lane and its sender.

In the creating process the first end used takes the pipe's listening channel (the
*home*) and the other dials it; in any other process an end dials. A dialled end has a
lane (the transport's direct path to its one peer) for good; the home end has one while
a single peer is connected (dropped at every peer event). On an idle line a message goes
out on the lane, or the channel, from the caller's thread; otherwise through the sender
thread, which packs what is queued into one frame.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.lifetime import current_pid
from fibercore.pipes import CLOSE
from fibercore.pipes.home import home_of
from fibercore.pipes.inbox import Inbox, Message
from fibercore.pipes.line import Line
from fibercore.runtime import get_runtime
from fibercore.wire import Channel, Sender
from fibercore.wire.channel import Lane


class NetworkPath:
    """One end's connection over the transport (made on first use)."""

    def __init__(self, pipe_id: str, address: str, creator_pid: int, side: int, inbox: Inbox,
                 twin_writes_here: Callable[[], bool]) -> None:
        self.pipe_id = pipe_id
        self.address = address
        self.creator_pid = creator_pid
        self.side = side
        self.inbox = inbox
        #: Whether the other end, open in this (the creating) process, still writes.
        self._twin_writes_here = twin_writes_here
        self.channel: Channel | None = None
        self.lane: Lane | None = None
        self.owns_home = False
        self.sender: Sender | None = None
        self.lock = threading.Lock()
        #: The hot path while the end has one peer (:mod:`fibercore.pipes.line`): made by
        #: :meth:`fit_line`, dropped at every change of peers, sender, process or state.
        self.line: Line | None = None
        self._peer_events = 0  # counted, so a line made while one happened is not kept

    def forked(self) -> None:
        """In a forked child, forget the parent's socket and threads (they are not ours)."""
        self.line = None
        self.lock = threading.Lock()
        self.channel = None
        self.lane = None
        self.sender = None
        self.owns_home = False

    # -- connecting ------------------------------------------------------------------------
    def connect(self) -> Channel:
        with self.lock:
            if self.channel is not None:
                return self.channel
            home = home_of(self.pipe_id, self.creator_pid)
            if home is not None and home.claim():
                channel = home.channel
                self.owns_home = True
            else:
                channel = get_runtime().dial("pair", self.address, service="pipe")
                self.lane = channel.lane()
            channel.on_peer_event(self._on_peer)
            self.channel = channel
            return channel

    def current_lane(self) -> Lane | None:
        """The direct path to the other end: a dialled end's, or the home end's while one
        peer is connected (None otherwise)."""
        if self.lane is not None or not self.owns_home:
            return self.lane
        channel = self.channel
        peer = channel.only_peer if channel is not None else None
        if peer is not None and channel is not None:
            self.lane = channel.lane(peer)
        return self.lane

    def fit_line(self, readable: bool) -> None:
        """Make the line once the end has a lane and no readiness descriptor; the end's own
        conditions (open, in this process, no thread receiving for it) are the caller's."""
        if self.line is not None or self.inbox.ready is not None:
            return
        seen = self._peer_events
        lane = self.current_lane()
        if lane is None:
            return
        sender = self.sender
        self.line = Line(lane, sender, self.inbox, readable, None if self._untimed() else 0.5,
                         self.twin_still_writes)
        # A peer came or went meanwhile (its lane may be stale), or the sender started (the
        # line must know it: it sends only while the sender is idle, and marks its answers).
        if self._peer_events != seen or self.sender is not sender:
            self.line = None

    def _on_peer(self, peer: Any, added: bool) -> None:
        self._peer_events += 1
        self.line = None
        if self.owns_home:
            self.lane = None  # made again for the one peer, if there is one
        channel = self.channel
        if added:
            self.inbox.eof = False
        elif (channel is None or not channel.listening or channel.peer_count == 0) and not self.twin_still_writes():
            self.inbox.eof = True  # the (last) process using the other end left
            if channel is not None:
                channel.wake()  # a reader waiting for a frame looks now (it may wait untimed)

    def twin_still_writes(self) -> bool:
        """A copy of the other end closed, but another may still write: more processes are
        connected, or the other end is still open here in the creator (as with an OS pipe,
        the end comes when every copy of the writing end is closed)."""
        channel = self.channel
        if channel is not None and channel.listening and channel.peer_count > 1:
            return True
        return self._twin_writes_here()

    # -- sending ---------------------------------------------------------------------------
    def start_sender(self, peer_gone: Callable[[], bool]) -> Sender:
        channel = self.connect()
        with self.lock:
            if self.sender is None:
                self.sender = Sender(channel, name=f"fiber-pipe-{self.pipe_id[:8]}", peer_gone=peer_gone)
                self.line = None  # made again with the sender
            return self.sender

    def send(self, sender: Sender, op: int, parts: list[Any]) -> None:
        """Send on a connected end: on an idle line, a message goes out here in one step;
        otherwise through the sender (order, bursts). TransportClosed when the peer is gone."""
        if sender.idle():
            lane = self.current_lane()
            if lane is not None:
                lane.send(op, parts)
                sender.sent_aside()
                return
            channel = self.channel
            if channel is not None and channel.has_peer:
                try:
                    channel.send([(op, parts)])
                    sender.sent_aside()
                    return
                except TransportTimeout:  # the peer left meanwhile: the sender waits for one
                    pass
        sender.put((op, parts))

    # -- receiving -------------------------------------------------------------------------
    def recv_on_lane(self, lane: Lane, timeout: float | None, direct: bool) -> Message | None:
        """Wait on the lane for one frame: its one message when ``direct`` (the hot path of
        a stepped simulator), else filed in the inbox. In the process holding the home it
        waits in steps, which also watches the other end closing there without a word, unless
        the transport can wake it (closing an end here wakes the home's reader then)."""
        wait = timeout if self._untimed() else 0.5 if timeout is None else min(timeout, 0.5)
        try:
            messages = lane.recv(wait)
        except TransportClosed:
            self.inbox.end()
            raise EOFError("the pipe was closed") from None
        if messages is None:
            return None
        if direct and len(messages) == 1 and messages[0][0] != CLOSE:
            return messages[0]
        self.inbox.file(messages, self.twin_still_writes)
        return None

    def _untimed(self) -> bool:
        """Whether a wait for a frame may sleep until one comes: nothing here needs a look in
        between (a dialled end), or what does wakes the home's reader (a Wakeable transport)."""
        if self.creator_pid != current_pid():
            return True
        channel = self.channel
        return channel is not None and channel.wakeable

    def pull(self, channel: Channel, deadline: float | None, step: float | None = 0.5,
             direct: bool = False) -> Message | None:
        """Receive one frame into the inbox; EOFError at the end, TransportTimeout after ``deadline``.

        ``direct``: a frame of one message (the usual one) is returned instead, when nothing
        waits in the inbox and no descriptor reports readiness. ``step``: the longest wait,
        unless nothing needs a look in between (then it waits for a frame or a wake-up)."""
        inbox = self.inbox
        if deadline is not None:
            step = min(step or deadline, max(0.0, deadline - time.monotonic()))
        elif self._untimed():
            step = None
        if not inbox.eof and current_pid() == self.creator_pid:
            home = home_of(self.pipe_id, self.creator_pid)
            if home is not None and (1 - self.side) in home.closed_sides:
                inbox.eof = True  # the other end was closed here without ever connecting
        if inbox.eof:
            step = 0.2  # drain frames still in flight when the peer left, then stop
        try:
            messages, _ = channel.recv(step)
        except TransportTimeout:
            if inbox.eof:
                inbox.end()
                raise EOFError("the other end of the pipe is closed") from None
            if deadline is not None and time.monotonic() >= deadline:
                raise
            return None
        except TransportClosed:
            inbox.end()
            raise EOFError("the pipe was closed") from None
        if direct and len(messages) == 1 and messages[0][0] != CLOSE and not inbox and inbox.ready is None:
            return messages[0]
        inbox.file(messages, self.twin_still_writes)
        return None

    # -- closing ---------------------------------------------------------------------------
    def say_close(self, flush_timeout: float | None, writable: bool) -> None:
        """Flush what was sent and tell the other end (never waiting on a peer that is gone);
        ``flush_timeout`` None: queue the word and return (the caller finishes the sender)."""
        if self.sender is not None:
            try:
                self.sender.put((CLOSE, []))
            except TransportClosed:
                pass
            if flush_timeout is not None:
                self.sender.close(flush=True, timeout=flush_timeout)
        elif self.channel is not None and writable:
            try:  # never wait: the other end may be gone (a pair's send would block)
                self.channel.send([(CLOSE, [])], block=False)
            except Exception:
                pass

    def release(self) -> None:
        """Close a dialled channel (the home's belongs to the pipe's home)."""
        self.line = None
        if self.channel is not None and not self.owns_home:
            self.channel.close()
        self.channel = None


__all__ = ["NetworkPath"]
