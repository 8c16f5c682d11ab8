"""Channel: an endpoint whose connections are authenticated and whose frames are sealed.

A channel wraps one transport endpoint. Its peers are :class:`~fibercore.wire.handshake.Session`
objects, each an authenticated connection with its own keys; the transport reports
a connection only after the handshake, so every frame a channel opens comes from a
peer that proved it holds the key. A frame that fails its tag or counter check is
dropped and counted (:data:`fibercore.wire.stats`); no receive loop ever sees it.

Who a send goes to: a dialling channel has one peer. A listening ``router`` channel
answers the peer a frame came from. A listening ``pair`` channel (a Pipe's home)
sends to its most recent peer, waiting briefly for one to connect.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from fibercore.errors import TransportTimeout
from fibercore.transport import Endpoint, FlowControl, LaneEndpoint, LineEndpoint, Wakeable
from fibercore.wire.frames import BadFrame, Message, Messages, reject
from fibercore.wire.handshake import Session

#: Seconds a send on a listening pair waits for a peer before it raises TransportTimeout
#: (the Sender tries again until the other end is known gone).
PAIR_SEND_SLICE = 0.25


class Channel:
    """An authenticated endpoint: ``send`` messages to a peer, ``recv`` them from any."""

    def __init__(self, endpoint: Endpoint, kind: str, listening: bool, address: str | None = None) -> None:
        self.endpoint = endpoint
        #: What dialers use: the endpoint's address and the listener's identity.
        self.address = address or endpoint.address
        self.kind = kind
        self.listening = listening
        self._peers: list[Session] = []
        self._peers_cv = threading.Condition(threading.Lock())
        self._receiving = threading.Lock()  # held while a thread takes and opens a frame
        #: Whether :meth:`wake` can end a waiting :meth:`recv` (asked once: an isinstance
        #: check against a runtime protocol costs microseconds, and hot paths ask).
        self.wakeable = isinstance(endpoint, Wakeable)
        if listening:
            endpoint.on_peer_event(self._track)

    # -- peers ----------------------------------------------------------------------------
    def _track(self, peer: Hashable, added: bool) -> None:
        with self._peers_cv:
            if added:
                self._peers.append(peer)  # type: ignore[arg-type]
            elif peer in self._peers:
                self._peers.remove(peer)
            self._peers_cv.notify_all()

    def _default_peer(self) -> Session:
        if not self.listening:
            return self.endpoint.peer  # type: ignore[attr-defined]
        if self.kind != "pair":
            raise ValueError("a listening router channel needs the peer to send to")
        deadline = time.monotonic() + PAIR_SEND_SLICE
        with self._peers_cv:
            while not self._peers:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TransportTimeout(f"no peer connected to {self.address} yet")
                self._peers_cv.wait(remaining)
            return self._peers[-1]

    @property
    def has_peer(self) -> bool:
        """Whether a send without a peer would go out now (a listening pair may wait for one)."""
        return not self.listening or bool(self._peers)

    @property
    def peer_count(self) -> int:
        return len(self._peers)

    @property
    def only_peer(self) -> Session | None:
        """A listening channel's peer while it has exactly one (a Pipe's home and its child)."""
        peers = self._peers
        return peers[0] if len(peers) == 1 else None

    def on_peer_event(self, callback: Callable[[Hashable, bool], None]) -> None:
        """``callback(peer, added)`` when an authenticated peer arrives or leaves."""
        self.endpoint.on_peer_event(callback)

    # -- sending --------------------------------------------------------------------------
    def send(self, messages: Sequence[Message], peer: Hashable | None = None, block: bool = True) -> None:
        """Seal ``messages`` into one frame and send it (to ``peer`` on a router listener).

        ``block=False`` raises TransportTimeout rather than wait for room. A send on a
        listening pair raises TransportTimeout when no peer connected within
        :data:`PAIR_SEND_SLICE`.
        """
        if peer is not None:
            session = peer
        elif self.listening:
            session = self._default_peer()
        else:
            session = self.endpoint.peer  # type: ignore[attr-defined]
        assert isinstance(session, Session)
        transmit(session, messages, self.endpoint.send_parts, block)

    def lane(self, peer: Session | None = None) -> Lane | None:
        """The fast path to ``peer`` (a dialler: its one peer), when the transport offers one
        (:class:`~fibercore.transport.LaneEndpoint`); None otherwise."""
        if not isinstance(self.endpoint, LaneEndpoint):
            return None
        session = peer if peer is not None else None if self.listening else self.endpoint.peer  # type: ignore[attr-defined]
        if not isinstance(session, Session):
            return None
        return Lane(self, session)

    # -- receiving ------------------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> tuple[Messages, Hashable]:
        """The next authentic frame's messages and the peer that sent it.

        Raises TransportTimeout after ``timeout`` seconds, TransportClosed once closed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        # One thread at a time takes a frame and opens it, so frames are opened in the
        # order they arrived: a thread paused between the two while others opened many
        # later frames would find its own outside the replay window (and dropped).
        if not self._receiving.acquire(timeout=-1 if timeout is None else max(0.0, timeout)):
            raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
        try:
            while True:
                remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
                data, peer = self.endpoint.recv(remaining)
                if not isinstance(peer, Session):
                    reject(self.address, peer, "the transport delivered a frame from a connection that did not "
                                               "authenticate")
                    messages = []
                else:
                    messages = self.open_frame(data, peer)
                if messages:
                    return messages, peer
                if deadline is not None and time.monotonic() >= deadline:
                    raise TransportTimeout("only refused frames arrived") from None
        finally:
            self._receiving.release()

    def pause(self, peer: Hashable) -> None:
        """Stop reading from ``peer`` (its sends then block: back-pressure) until :meth:`resume`.

        A no-op on a transport without ``pause``.
        """
        if isinstance(self.endpoint, FlowControl):
            self.endpoint.pause(peer)

    def resume(self, peer: Hashable) -> None:
        if isinstance(self.endpoint, FlowControl):
            self.endpoint.resume(peer)

    def drop(self, peer: Hashable) -> None:
        """Disconnect one peer (it misbehaved)."""
        if isinstance(self.endpoint, FlowControl):
            self.endpoint.drop(peer)

    def wake(self) -> None:
        """End the waiting :meth:`recv` now (TransportTimeout), where :attr:`wakeable`."""
        if self.wakeable:
            self.endpoint.wake()  # type: ignore[attr-defined]

    def close(self) -> None:
        self.endpoint.close()

    def open_frame(self, frame: bytes | memoryview, peer: Session) -> Messages:
        """``frame``'s messages once authentic; a refused frame is counted and gives none."""
        try:
            return peer.opener.open(frame)
        except BadFrame as exc:
            reject(self.address, peer, str(exc))
            return []

    def __repr__(self) -> str:
        return f"<Channel {self.kind} {'listening on' if self.listening else 'to'} {self.address}>"


def transmit(session: Session, messages: Sequence[Message], send_parts: Callable[..., None],
             block: bool = True) -> None:
    """Seal ``messages`` into one frame of ``session`` and pass it to ``send_parts(parts, session, block)``.

    Sealing and sending happen under the session's lock, so frames leave in counter order.
    """
    me = threading.get_ident()
    if session.sending == me:
        # Re-entered on this thread while it sends (a GC finalizer, a proxy's decref):
        # the outer send carries these next, never bytes interleaved mid-frame.
        session.deferred.extend(messages)
        return
    with session.lock:
        session.sending = me
        try:
            send_parts(session.sealer.seal(messages), session, block)
            if session.deferred:
                send_deferred(session, send_parts)
        finally:
            session.sending = None


def send_deferred(session: Session, send_parts: Callable[..., None]) -> None:
    """Send what was sent re-entrantly while the session's lock was held (:func:`transmit`),
    before the lock is let go."""
    while session.deferred:
        batch, session.deferred = session.deferred, []
        send_parts(session.sealer.seal(batch), session, True)


class Lane:
    """One peer of a channel used on the caller's thread with the fewest layers: a connected
    Pipe end's sends and receives (a stepped simulator's hot path). Frames are sealed, opened
    and ordered exactly as through the channel, whose other paths stay usable beside it."""

    __slots__ = ("channel", "session", "_send_parts", "_send_two", "_recv_frame", "_receiving")

    def __init__(self, channel: Channel, session: Session) -> None:
        self.channel = channel
        self.session = session
        endpoint = channel.endpoint
        line = endpoint.line(session) if isinstance(endpoint, LineEndpoint) else None
        # The endpoint's own calls, or its line's (the same, without a look-up per call).
        self._send_parts = line.write if line is not None else endpoint.send_parts
        #: The line's write of a frame of two buffers (a Pipe message's), if it has one.
        self._send_two: Callable[[bytes, Any], None] | None = getattr(line, "write_two", None)
        self._recv_frame = line.read if line is not None else endpoint.recv_frame  # type: ignore[attr-defined]
        self._receiving = channel._receiving

    def send(self, op: int, parts: Sequence[Any]) -> None:
        """One message, in one frame, sent from this thread (blocks while buffers are full)."""
        transmit(self.session, [(op, parts)], self._send_parts)

    def recv(self, timeout: float | None) -> Messages | None:
        """The next frame's messages from this peer; None when this path is not open now (then
        :meth:`Channel.recv` takes what waits) or nothing came within ``timeout``.
        Raises TransportClosed when the connection ended."""
        if not self._receiving.acquire(False):
            return None
        try:
            frame = self._recv_frame(timeout, self.session)
            return None if frame is None else self.channel.open_frame(frame, self.session)
        finally:
            self._receiving.release()


__all__ = ["Channel", "Lane", "PAIR_SEND_SLICE", "send_deferred", "transmit"]
