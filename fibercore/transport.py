"""The transport protocol: endpoints that move opaque frames between processes.

A transport plugin (``fiber_transport`` hook) opens two kinds of endpoint, both
with many connections on the listening side and one on the dialling side:

``pair``
    a Pipe's home: the core sends to its most recent peer.
``router``
    queue brokers, pools, managers, the admin channel: ``recv`` tells which peer
    sent a frame and ``send(parts, peer)`` answers that peer only.

Contract v2 (connection authentication, docs/security.md): ``listen`` and ``dial`` get
an :class:`~fibercore.wire.handshake.Authenticator`. For every connection, the
transport runs one of its handshakes (``auth.listener()`` on an accepted connection,
``auth.dialer()`` on one it opened): it sends ``hs.start()`` if not None, passes
every frame to ``hs.feed()`` and sends what it returns, closes the connection when
``feed`` raises, and only once ``hs.session`` is set does the connection become a
peer. The peer handle given to ``recv``, ``send_parts`` and peer callbacks is that
:class:`~fibercore.wire.handshake.Session`. Before then it accepts frames of at most
``MAX_HANDSHAKE_FRAME`` bytes and closes the connection after
``auth.limits.handshake_timeout`` seconds; it keeps at most
``auth.limits.max_pending`` such connections per listener
(``auth.limits.max_pending_per_peer`` per peer identity, all of loopback one; at a limit
the oldest goes, never one in progress for less than a second:
:mod:`fibercore.wire.admission`) and ``auth.limits.max_peers`` peers. ``dial`` returns
only after the handshake succeeded (``endpoint.peer`` is the session) and raises
``fibercore.errors.AuthenticationError`` when the other side refused it.

Listener identity (wire v4): the core draws ``auth.identity`` for each listener and
appends it to the endpoint's address (``<address>#<hex>``); ``dial`` gets the address
without it and ``auth.expect`` set. A transport never needs to parse it, but may name
per-listener resources after it (the built-in one names its Unix socket so); if such a
name is taken it calls ``auth.new_identity()`` before it returns the endpoint.

The core seals and opens frames with the session's keys, so a transport that skips
the handshake delivers nothing the core accepts: it cannot weaken authentication.
A transport may pass ``private=True`` to ``auth.listener``/``auth.dialer`` for a
connection no third process can write into (a Unix-domain stream whose peer's user it
checked); both ends' views enter the proofs, and frames on such a connection are counted
but carry no MAC. Frames on any other connection are encrypted by the core.

Streamed frames (optional): a transport that can write a frame piece by piece calls
``session.stream_large_frames()`` on each session it makes. The last part of such a
session's large frames may then be a :class:`Pieces`: ``len()`` of it is its size, and
iterating it gives the bytes one buffer at a time, each valid only until the next is asked
for (the core encrypts into one reused buffer while the transport sends). A transport that
never calls it never gets one.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol, runtime_checkable

# What a transport gets from the core and may name: the authenticator of an endpoint, the
# session a connection becomes, the limits, and the largest handshake message.
from fibercore.wire.admission import make_room, peer_identity
from fibercore.wire.frames import Pieces
from fibercore.wire.handshake import MAX_HANDSHAKE_FRAME, Authenticator, Limits, Session

PeerCallback = Callable[[Hashable, bool], None]  # (peer, added?)

__all__ = ["MAX_HANDSHAKE_FRAME", "Authenticator", "DialEndpoint", "Endpoint", "FlowControl", "LaneEndpoint",
           "LineEndpoint", "Limits", "PeerCallback", "Pieces", "Session", "Transport", "Wakeable", "make_room",
           "peer_identity"]


@runtime_checkable
class Endpoint(Protocol):
    """One socket: listening (``address`` is what to advertise) or dialling.

    Obligations (checked by :class:`fibercore.testing.TransportConformance`):

    1. Only authenticated connections are peers (the handshake above); a frame is
       delivered with the :class:`~fibercore.wire.handshake.Session` of its connection.
    2. Frames of one peer arrive whole and in the order they were sent, whatever their size
       up to ``auth.limits.max_frame``.
    3. ``on_peer_event`` callbacks: ``(peer, True)`` once a connection authenticated (on a
       listener), ``(peer, False)`` once it ended (both kinds), each once. A listener may
       notice an end only while a thread receives on it (the core always has one there).
    4. ``recv(timeout)`` raises ``TransportTimeout`` when nothing came within ``timeout``,
       and ``TransportClosed`` once the endpoint is closed; on a dialler also once its
       connection ended.
    5. ``close()`` ends every connection of the endpoint; the peers see their connection end.
    """

    address: str

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        """Send the concatenation of ``parts`` as one frame to ``peer`` (a dialler: its one peer).

        Blocks while buffers are full; ``block=False`` raises TransportTimeout rather than
        wait when nothing of the frame could be sent, and never waits long for the rest of
        a frame it began (a peer that stops reading mid-frame is dropped: TransportClosed).
        Raises TransportClosed when the endpoint or that peer's connection is closed.
        """

    def recv(self, timeout: float | None = None) -> tuple[bytes | memoryview, Hashable]:
        """Receive one frame (bytes, or a writable memoryview the caller may keep) and its peer.

        Raises ``TransportTimeout`` after ``timeout`` seconds and ``TransportClosed``
        once the endpoint is closed (a dialler: also once its connection ended).
        """

    def on_peer_event(self, callback: PeerCallback) -> None:
        """Call ``callback(peer, True)`` when a peer has authenticated (listeners) and
        ``(peer, False)`` when it goes (both kinds)."""

    def close(self) -> None:
        """Close the endpoint; pending and future calls raise ``TransportClosed``."""


@runtime_checkable
class DialEndpoint(Endpoint, Protocol):
    """A dialling endpoint: one connection, authenticated before ``dial`` returned."""

    @property
    def peer(self) -> Hashable:
        """The :class:`~fibercore.wire.handshake.Session` of its one connection (where
        ``send_parts`` without a peer goes, and what ``recv`` reports frames from)."""


@runtime_checkable
class FlowControl(Protocol):
    """Optional on listeners: act on one peer's connection. The core uses it where an
    endpoint has it (a queue's byte budget pauses writers; a misbehaving peer is dropped);
    without it, a queue over its budget still blocks local puts but cannot stop remote ones.

    1. ``pause(peer)``: stop reading ``peer``'s connection; its frames wait in the kernel's
       buffers, then its sends block (back-pressure). Frames already read are still delivered.
    2. ``resume(peer)``: read it again; nothing it sent is lost or reordered.
    3. ``drop(peer)``: close that connection (its peer event ``(peer, False)`` follows).
    Each is a no-op for a peer that is gone.
    """

    def pause(self, peer: Hashable) -> None: ...

    def resume(self, peer: Hashable) -> None: ...

    def drop(self, peer: Hashable) -> None: ...


@runtime_checkable
class LaneEndpoint(Protocol):
    """Optional: a receive for the caller's thread, without hand-offs (a connected Pipe end's
    hot path, :class:`fibercore.wire.channel.Lane`). The core uses it where an endpoint has it.

    ``recv_frame(timeout, peer)``:

    1. returns the next frame when it comes from ``peer`` (a dialler: its one peer) and the
       endpoint can read it on this thread now: ``peer`` is its only connection, no frame
       waits for ``recv`` and no other thread reads; it waits at most ``timeout`` seconds
       (None: until a frame comes or the connection ends);
    2. otherwise returns None, at once or after waiting (at most ``timeout``; with ``timeout``
       None, an endpoint whose read cannot be interrupted may also return None after a step of
       its own, so that what changed meanwhile is seen): what it read meanwhile stays queued
       for ``recv``, in order (a frame never overtakes an older one);
    3. raises TransportClosed once ``peer``'s connection ended.
    """

    def recv_frame(self, timeout: float | None, peer: Hashable) -> memoryview | None: ...


@runtime_checkable
class LineEndpoint(Protocol):
    """Optional, beside ``LaneEndpoint``: ``line(peer)`` gives that peer's connection as an
    object whose two methods skip the endpoint's look-ups (a connected Pipe end's every
    message goes through them), or None when the endpoint has none for ``peer`` now:

    1. ``write(parts, peer=None, block=True)``: what ``send_parts(parts, peer, block)`` does;
    2. ``read(timeout, peer)``: what ``recv_frame(timeout, peer)`` does (``peer``: the line's);
    3. optionally ``write_two(head, body)``: ``write([head, body])``, blocking (a Pipe message
       of one part is a frame of two buffers: what the core sends most).

    A line stays valid while its peer is connected; after that its calls raise
    TransportClosed or return None, as the endpoint's own would. The core calls ``write``
    holding the peer's :class:`~fibercore.wire.handshake.Session` lock (as it does around
    every ``send_parts``), and ``read`` holding the lock under which it reads the endpoint
    (its channel's receive lock): a line need not take locks of its own for either.
    """

    def line(self, peer: Hashable) -> Any: ...


@runtime_checkable
class Wakeable(Protocol):
    """Optional on listeners: ``wake()`` makes the thread waiting in ``recv`` raise
    ``TransportTimeout`` soon, before its timeout. The core uses it where an endpoint has it:
    a queue's creator then reads the broker's connections on the thread that waits in
    ``get`` (no hand-off from a receiving thread), and a ``put`` from another of its threads
    wakes that reader. Without it, a receiving thread hands items over.

    1. A ``recv`` waiting when ``wake()`` is called raises ``TransportTimeout`` within a
       fraction of a second, having lost no frame (what arrived is delivered by later calls).
    2. A ``wake()`` with nobody in ``recv`` may end the next ``recv`` early the same way.
    """

    def wake(self) -> None: ...


@runtime_checkable
class Transport(Protocol):
    """Opens endpoints. One instance per process, resolved once by the core."""

    name: str

    def listen(self, kind: str, bind_host: str, advertise_host: str | None = None,
               auth: Authenticator | None = None, port: int = 0) -> Endpoint:
        """Open a listening endpoint of ``kind`` ('pair' or 'router') on ``bind_host``.

        The port is chosen by the OS (never guessed) unless ``port`` is given (a manager
        created with a fixed address); a transport that cannot honour it raises. ``address`` of the result uses
        ``advertise_host`` when given.
        """

    def dial(self, kind: str, address: str, auth: Authenticator | None = None) -> DialEndpoint:
        """Connect to ``address`` and authenticate; the result's ``peer`` is the session.

        Raises ``AuthenticationError`` when the listener refused the handshake (another
        key) and ``TransportError`` when nothing listens there."""
