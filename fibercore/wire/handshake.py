"""Connection authentication: a mutual challenge–response before a connection counts.

Run by every transport on every new connection, before the connection is a peer
(no frame delivered, no peer event, no Pipe taken, no EOF)::

    listener → dialer   HELLO  = MAGIC(8) || nonce_l(32)
    dialer   → listener PROOF  = nonce_d(32) || HMAC(key, "fibercore dialer"   || via || kind || nonce_l || nonce_d)
    listener → dialer   PROOF  =              HMAC(key, "fibercore listener" || via || kind || nonce_l || nonce_d)

``key`` is the session secret (or a manager's authkey). Each side proves it holds
the key over the other's fresh nonce, as multiprocessing's ``deliver_challenge`` and
``answer_challenge`` do both ways; the two labels differ, so a proof cannot be
reflected. The connection's keys come from both nonces, one per direction::

    base = HMAC(key, "fibercore connection keys" || via || kind || nonce_l || nonce_d)
    key(listener → dialer) = HMAC(base, "listener to dialer"); key(dialer → listener) likewise

``via`` is one byte, each side's own view of the connection: ``P`` for a private
stream (a Unix-domain socket: only the two processes can write into it), ``N`` for a
network one. Frames on a private stream keep their counters but carry no MAC (the
kernel binds them to the connection and direction); since both views are in the
proofs, a relay that joins a Unix socket to a TCP one fails the handshake, so no
frame a third party could touch ever goes unauthenticated.

A handshake message is at most :data:`MAX_HANDSHAKE_FRAME` bytes; the listener
gives up on a dialer that has not proved itself within ``Limits.handshake_timeout``.
"""

from __future__ import annotations

import hmac
import os
import threading
from dataclasses import dataclass
from typing import Any

from fibercore.wire.frames import Opener, Sealer, StreamOpener, StreamSealer

MAGIC = b"FIBERv3\x00"
NONCE = 32
MAC = 32
#: The largest frame a transport may accept from a connection that has not authenticated.
MAX_HANDSHAKE_FRAME = 128


class HandshakeFailed(Exception):
    """The peer did not prove it holds the key (or spoke another protocol)."""


@dataclass(frozen=True)
class Limits:
    """What a peer may cost an endpoint; transports enforce them (the core checks them too)."""

    #: Seconds a new connection has to authenticate before it is closed.
    handshake_timeout: float = 10.0
    #: Connections that have not authenticated yet, per listening endpoint (the oldest is
    #: closed to make room for a new one).
    max_pending: int = 64
    #: Authenticated connections per listening endpoint.
    max_peers: int = 4096
    #: Largest frame an authenticated peer may send (bigger ones arrive as several records).
    max_frame: int = 1 << 30


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), "sha256")


class Session:
    """One authenticated connection: its keys, counters and send lock. Transports use it
    as the peer handle they report (hashable, by identity)."""

    __slots__ = ("sealer", "opener", "label", "lock", "sending", "deferred", "__weakref__")

    def __init__(self, tx_key: bytes, rx_key: bytes, label: str, private: bool = False) -> None:
        self.lock = threading.Lock()  # sealing and sending, so frames leave in counter order
        self.sending: int | None = None  # the thread inside the lock
        self.deferred: list[Any] = []  # messages sent re-entrantly (a GC finalizer) meanwhile
        # ``private``: the handshake proved both ends see a stream only their two processes
        # can write into; frames keep their counters and leave out the MAC.
        self.sealer = StreamSealer(tx_key) if private else Sealer(tx_key)
        self.opener = StreamOpener(rx_key) if private else Opener(rx_key)
        self.label = label

    def __repr__(self) -> str:
        return f"<peer {self.label}>"


class Handshake:
    """One side of one connection's handshake, driven by the transport frame by frame."""

    def __init__(self, key: bytes, kind: str, listening: bool, label: str, private: bool = False) -> None:
        self._key = key
        self._private = private
        self._kind = (b"P" if private else b"N") + kind.encode()  # ``via || kind`` in every MAC
        self._listening = listening
        self._label = label
        self._nonce = os.urandom(NONCE)
        self._other: bytes | None = None
        self.session: Session | None = None

    def start(self) -> bytes | None:
        """What to send as soon as the connection is open (the listener speaks first)."""
        return MAGIC + self._nonce if self._listening else None

    def feed(self, frame: bytes | memoryview) -> bytes | None:
        """Take the peer's next handshake frame; return the reply to send, if any.

        Sets :attr:`session` once the peer has proved itself. Raises HandshakeFailed on
        anything else: the transport must then close the connection.
        """
        data = bytes(frame)
        if self.session is not None or len(data) > MAX_HANDSHAKE_FRAME:
            raise HandshakeFailed("unexpected handshake frame")
        if self._listening:
            if self._other is not None or len(data) != NONCE + MAC:
                raise HandshakeFailed("malformed proof")
            nonce_l, nonce_d = self._nonce, data[:NONCE]
            if not hmac.compare_digest(data[NONCE:], _mac(self._key, b"fibercore dialer", self._kind,
                                                           nonce_l, nonce_d)):
                raise HandshakeFailed("wrong key")
            self._other = nonce_d
            self._finish(nonce_l, nonce_d)
            return _mac(self._key, b"fibercore listener", self._kind, nonce_l, nonce_d)
        if self._other is None:  # the listener's HELLO
            if len(data) != len(MAGIC) + NONCE or not data.startswith(MAGIC):
                raise HandshakeFailed("not a fibercore endpoint, or another protocol version")
            self._other = data[len(MAGIC):]
            return self._nonce + _mac(self._key, b"fibercore dialer", self._kind, self._other, self._nonce)
        nonce_l, nonce_d = self._other, self._nonce
        if len(data) != MAC or not hmac.compare_digest(
                data, _mac(self._key, b"fibercore listener", self._kind, nonce_l, nonce_d)):
            raise HandshakeFailed("the listener did not prove it holds the key")
        self._finish(nonce_l, nonce_d)
        return None

    def _finish(self, nonce_l: bytes, nonce_d: bytes) -> None:
        base = _mac(self._key, b"fibercore connection keys", self._kind, nonce_l, nonce_d)
        to_dialer = _mac(base, b"listener to dialer")
        to_listener = _mac(base, b"dialer to listener")
        if self._listening:
            self.session = Session(to_dialer, to_listener, self._label, self._private)
        else:
            self.session = Session(to_listener, to_dialer, self._label, self._private)


class Authenticator:
    """What a transport needs to admit connections to one endpoint: handshakes and limits."""

    def __init__(self, key: bytes, kind: str, limits: Limits | None = None) -> None:
        self._key = key
        self.kind = kind
        self.limits = limits or Limits()

    def listener(self, label: str = "?", private: bool = False) -> Handshake:
        """A handshake for a connection this endpoint accepted; ``private``: a stream only
        the two processes can write into (a Unix-domain socket), whose frames need no MAC."""
        return Handshake(self._key, self.kind, True, label, private)

    def dialer(self, label: str = "?", private: bool = False) -> Handshake:
        """A handshake for a connection this endpoint opened (``private`` as for listener)."""
        return Handshake(self._key, self.kind, False, label, private)

    def __repr__(self) -> str:  # never shows the key (hook traces print arguments)
        return f"<Authenticator {self.kind}>"

    def __reduce__(self) -> Any:
        raise TypeError("an Authenticator holds a secret and is never pickled")
