"""Connection authentication: a mutual challenge–response before a connection counts.

Run by every transport on every new connection, before the connection is a peer
(no frame delivered, no peer event, no Pipe taken, no EOF)::

    listener → dialer   HELLO  = MAGIC(8) || nonce_l(32) || identity(16)
    dialer   → listener PROOF  = nonce_d(32) || HMAC(key, "fibercore dialer"   || context || nonce_l || nonce_d)
    listener → dialer   PROOF  =              HMAC(key, "fibercore listener" || context || nonce_l || nonce_d)
    context = via(1) || identity(16) || kind || "/" || service

``key`` is the session secret (or a manager's authkey). Each side proves it holds
the key over the other's fresh nonce, as multiprocessing's ``deliver_challenge`` and
``answer_challenge`` do both ways; the two labels differ, so a proof cannot be
reflected. The connection's keys come from both nonces, one per direction::

    base = HMAC(key, "fibercore connection keys" || context || nonce_l || nonce_d)
    key(listener → dialer) = HMAC(base, "listener to dialer"); key(dialer → listener) likewise

Every proof binds the listener the dialer meant. ``identity`` is a random 16-byte name
each listening endpoint draws (:attr:`Authenticator.identity`); the core appends it to
the endpoint's address (``…#<hex>``), so a dialer knows it before it connects
(:attr:`Authenticator.expect`) and refuses a HELLO that names another listener before it
sends any proof: a handshake relayed to another listener of the same session fails, and
a stranger answering in the listener's place learns nothing it could test keys against.
``service`` (``pool``, ``queue``, ``sync``, ``manager``, ``admin``, ``pipe``) enters every
MAC too, so a dialer without an identity to expect (a manager reached by its
``(host, port)``) still cannot be relayed to a listener of another service.

``via`` is one byte, each side's own view of the connection: ``P`` for a private
stream (a Unix-domain socket: only the two processes can write into it), ``N`` for a
network one, ``C`` for a network one whose frames go authenticated but unencrypted
(``network_encryption=False``: a side that did not choose it fails the handshake).
Frames on a private stream keep their counters but carry no MAC (the kernel binds
them to the connection and direction); since both views are in the proofs, a relay
that joins a Unix socket to a TCP one fails the handshake, so no
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

from fibercore.wire.frames import ClearOpener, ClearSealer, Opener, Sealer, StreamOpener, StreamSealer

#: The protocol version (v5: a private stream's short frames; v6: streamed large frames with
#: their tag last, :mod:`fibercore.wire.frames`): a peer of another version is refused in the
#: handshake, never left to misread frames.
MAGIC = b"FIBERv6\x00"
NONCE = 32
MAC = 32
IDENTITY = 16
#: The largest frame a transport may accept from a connection that has not authenticated.
MAX_HANDSHAKE_FRAME = 128


class HandshakeFailed(Exception):
    """The peer did not prove it holds the key (or spoke another protocol)."""


@dataclass(frozen=True)
class Limits:
    """What a peer may cost an endpoint; transports enforce them (the core checks them too)."""

    #: Seconds a new connection has to authenticate before it is closed.
    handshake_timeout: float = 10.0
    #: Connections that have not authenticated yet, per listening endpoint. When they are
    #: all taken, the oldest goes (of the peer holding the most first), never one younger
    #: than :data:`fibercore.wire.admission.SHED_AGE`; if all are, the newcomer is refused.
    max_pending: int = 64
    #: Unauthenticated connections one peer identity (a uid on Unix sockets, an address on
    #: TCP, all of loopback one) may hold on one listener; beyond it, its oldest goes (TCP)
    #: or the newcomer is refused, so one peer cannot starve the others.
    max_pending_per_peer: int = 32
    #: Authenticated connections per listening endpoint.
    max_peers: int = 4096
    #: Largest frame an authenticated peer may send (bigger ones arrive as several records).
    max_frame: int = 1 << 30


def _mac(key: bytes, *parts: bytes) -> bytes:
    return hmac.digest(key, b"".join(parts), "sha256")


class Session:
    """One authenticated connection: its keys, counters and send lock. Transports use it
    as the peer handle they report (hashable, by identity)."""

    __slots__ = ("sealer", "opener", "label", "lock", "sending", "deferred", "private", "__weakref__")

    def __init__(self, tx_key: bytes, rx_key: bytes, label: str, private: bool = False, clear: bool = False) -> None:
        self.lock = threading.Lock()  # sealing and sending, so frames leave in counter order
        self.sending: int | None = None  # the thread inside the lock
        self.deferred: list[Any] = []  # messages sent re-entrantly (a GC finalizer) meanwhile
        # ``private``: the handshake proved both ends see a stream only their two processes
        # can write into; frames keep their counters and leave out the MAC. ``clear``: a
        # network stream whose frames are authenticated but not encrypted (both ends chose it).
        if private:
            self.sealer: Sealer = StreamSealer(tx_key)
            self.opener: Opener = StreamOpener(rx_key)
        elif clear:
            self.sealer, self.opener = ClearSealer(tx_key), ClearOpener(rx_key)
        else:
            self.sealer, self.opener = Sealer(tx_key), Opener(rx_key)
        self.label = label
        #: Only the two processes can write into this connection (and both are on one
        #: machine: the kernel ends it at once when either exits).
        self.private = private

    def stream_large_frames(self) -> None:
        """Called by a transport that takes a frame's last part as
        :class:`fibercore.transport.Pieces`: this session's large frames are then encrypted
        as they are sent (:mod:`fibercore.wire.frames`)."""
        self.sealer.pieces = True

    def __repr__(self) -> str:
        return f"<peer {self.label}>"


class Handshake:
    """One side of one connection's handshake, driven by the transport frame by frame."""

    def __init__(self, key: bytes, context: bytes, identity: bytes | None, listening: bool, label: str,
                 private: bool = False, clear: bool = False) -> None:
        self._key = key
        self._private = private
        self._clear = clear and not private
        self._context = context  # ``kind / service``; ``via || identity`` go in front once known
        self._identity = identity  # the listener's own, or the one a dialer expects (None: any)
        self._listening = listening
        self._label = label
        self._nonce = os.urandom(NONCE)
        self._other: bytes | None = None
        #: The listener answered (a dialer got a well-formed HELLO): a refusal after this is a
        #: wrong key, one before it a listener that is busy or gone.
        self.greeted = False
        self.session: Session | None = None
        if identity is not None:
            self._bind(identity)

    def _bind(self, identity: bytes) -> None:
        """What every MAC of this handshake covers: ``via || identity || kind/service``."""
        self._bound = (b"P" if self._private else b"C" if self._clear else b"N") + identity + self._context

    def start(self) -> bytes | None:
        """What to send as soon as the connection is open (the listener speaks first)."""
        return MAGIC + self._nonce + self._identity if self._listening else None  # type: ignore[operator]

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
            if not hmac.compare_digest(data[NONCE:], _mac(self._key, b"fibercore dialer", self._bound,
                                                           nonce_l, nonce_d)):
                raise HandshakeFailed("wrong key (or the other side's network_encryption differs)")
            self._other = nonce_d
            self._finish(nonce_l, nonce_d)
            return _mac(self._key, b"fibercore listener", self._bound, nonce_l, nonce_d)
        if self._other is None:  # the listener's HELLO
            if len(data) != len(MAGIC) + NONCE + IDENTITY or not data.startswith(MAGIC):
                raise HandshakeFailed("not a fibercore endpoint, or another protocol version")
            identity = data[len(MAGIC) + NONCE:]
            if self._identity is None:
                self._bind(identity)
            elif not hmac.compare_digest(identity, self._identity):
                raise HandshakeFailed("another listener than the address names answered (a relay, or an "
                                      "address from an earlier run)")
            self.greeted = True
            self._other = data[len(MAGIC):len(MAGIC) + NONCE]
            return self._nonce + _mac(self._key, b"fibercore dialer", self._bound, self._other, self._nonce)
        nonce_l, nonce_d = self._other, self._nonce
        if len(data) != MAC or not hmac.compare_digest(
                data, _mac(self._key, b"fibercore listener", self._bound, nonce_l, nonce_d)):
            raise HandshakeFailed("the listener did not prove it holds the key (or its network_encryption "
                                  "setting differs from this side's)")
        self._finish(nonce_l, nonce_d)
        return None

    def _finish(self, nonce_l: bytes, nonce_d: bytes) -> None:
        base = _mac(self._key, b"fibercore connection keys", self._bound, nonce_l, nonce_d)
        to_dialer = _mac(base, b"listener to dialer")
        to_listener = _mac(base, b"dialer to listener")
        if self._listening:
            self.session = Session(to_dialer, to_listener, self._label, self._private, self._clear)
        else:
            self.session = Session(to_listener, to_dialer, self._label, self._private, self._clear)


class Authenticator:
    """What a transport needs to admit connections to one endpoint: handshakes and limits.

    A listening endpoint's authenticator carries its :attr:`identity`; a dialing one the
    identity it :attr:`expect` s (from the address), or None when the address names none.
    """

    def __init__(self, key: bytes, kind: str, limits: Limits | None = None, service: str | None = None,
                 expect: bytes | None = None, clear: bool = False) -> None:
        self._key = key
        #: Network frames authenticated but not encrypted (``network_encryption=False``).
        self.clear = clear
        self.kind = kind
        self.service = service or kind
        self.limits = limits or Limits()
        self._context = f"{kind}/{self.service}".encode()
        #: This listener's random name (every proof binds it); a transport may draw a new one
        #: with :meth:`new_identity` before it publishes its address (its first name was taken).
        self.identity = os.urandom(IDENTITY)
        #: The listener identity a dialer requires (None: any, bound into the proofs as sent).
        self.expect = expect

    def new_identity(self) -> bytes:
        self.identity = os.urandom(IDENTITY)
        return self.identity

    def listener(self, label: str = "?", private: bool = False) -> Handshake:
        """A handshake for a connection this endpoint accepted; ``private``: a stream only
        the two processes can write into (a Unix-domain socket whose peer's user was
        checked), whose frames need no MAC."""
        return Handshake(self._key, self._context, self.identity, True, label, private, self.clear)

    def dialer(self, label: str = "?", private: bool = False) -> Handshake:
        """A handshake for a connection this endpoint opened (``private`` as for listener)."""
        return Handshake(self._key, self._context, self.expect, False, label, private, self.clear)

    def __repr__(self) -> str:  # never shows the key (hook traces print arguments)
        return f"<Authenticator {self.kind}/{self.service}>"

    def __reduce__(self) -> Any:
        raise TypeError("an Authenticator holds a secret and is never pickled")
