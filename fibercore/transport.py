"""The transport protocol: endpoints that move opaque frames between processes.

A transport plugin (``fiber_transport`` hook) provides two kinds of endpoint:

``pair``
    exactly two ends; one listens, the other dials (a Pipe).
``router``
    one listening end with many dialling peers; ``recv`` tells which peer sent a
    frame and ``send(data, peer)`` answers that peer only (queue brokers, the
    process admin channel). The dialling side sees a single peer.

The transport moves bytes only. Authentication and framing are the core's job
(:mod:`fibercore.wire`), so a third-party transport cannot weaken them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Protocol, runtime_checkable

PeerCallback = Callable[[Hashable, bool], None]  # (peer, added?)


@runtime_checkable
class Endpoint(Protocol):
    """One socket: listening (``address`` is what to advertise) or dialling."""

    address: str

    def send(self, data: bytes, peer: Hashable | None = None) -> None:
        """Send one frame; to ``peer`` on a router listener. Blocks while buffers are full.

        Raises ``TransportClosed`` when the endpoint is closed.
        """

    def recv(self, timeout: float | None = None) -> tuple[bytes | memoryview, Hashable]:
        """Receive one frame (bytes, or a writable memoryview the caller may keep) and its peer.

        ``timeout=0`` polls: it returns a waiting frame or raises at once, and is safe
        while another thread of the process blocks in ``recv`` on the same endpoint.
        Raises ``TransportTimeout`` after ``timeout`` seconds and ``TransportClosed``
        once the endpoint is closed.
        """

    # Optional: ``send_parts(parts, peer=None, block=True)`` sends the concatenation of
    # ``parts`` as one frame, copying each part once (the core uses it when present);
    # with ``block=False`` it raises TransportTimeout rather than wait for room.

    def on_peer_event(self, callback: PeerCallback) -> None:
        """Call ``callback(peer, True)`` when a peer connects and ``(peer, False)`` when it goes."""

    def close(self) -> None:
        """Close the endpoint; pending and future calls raise ``TransportClosed``."""


@runtime_checkable
class Transport(Protocol):
    """Opens endpoints. One instance per process, resolved once by the core."""

    name: str

    def listen(self, kind: str, bind_host: str, advertise_host: str | None = None) -> Endpoint:
        """Open a listening endpoint of ``kind`` ('pair' or 'router') on ``bind_host``.

        The port is chosen by the OS (never guessed). ``address`` of the result uses
        ``advertise_host`` when given.
        """

    def dial(self, kind: str, address: str) -> Endpoint:
        """Open an endpoint of ``kind`` that connects to ``address`` (and reconnects)."""
