"""Authenticated frames: how every byte crosses between fibercore processes.

A frame carries one or more messages (so that many small items cost one transport
call) and is authenticated with a key derived from the session secret before
anything in it is looked at, let alone unpickled (DESIGN.md §4)::

    frame   = tag(16) || body
    body    = version(1) || salt(16) || counter(8) || nwords(4, LE) || header(nwords × u64) || payload
    header  = nmsgs, then per message: op, nparts, len(part_0) .. len(part_n)
    payload = every part of every message, back to back
    tag     = AES-256-GCM tag over `body` as associated data (GMAC), with
              key   = HMAC-SHA256(secret, "fibercore frame key v2" || salt)
              nonce = counter (LE, 12 bytes)

Each sending endpoint draws a random salt, so it has a key of its own, and counts
its frames, so a nonce is never used twice under a key. GMAC runs at ~20 GB/s with
AES-NI (HMAC-SHA256 at ~1.7 GB/s was the bottleneck of 10 MB transfers); forging a
frame still needs the session secret.

Receiving, step by step:
  1. the transport hands over the raw frame and the peer it came from;
  2. the key for the frame's salt is derived (and cached once a frame verified)
     and the tag checked over the whole body (constant time, in OpenSSL);
  3. a frame that fails (wrong secret, truncated, garbage) is dropped, counted in
     :data:`stats` and logged (rate-limited); the receiver keeps serving;
  4. only then is the header parsed and the parts sliced (zero-copy memoryviews);
     the caller may now hand the parts to the serializer.

A part is typically one serialized object (a list of buffers is several parts).
Big parts are never joined here: a gathering transport copies each once.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import logging
import os
import sys
import threading
import time
from array import array
from collections.abc import Callable, Hashable, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.transport import Endpoint

log = logging.getLogger("fibercore.wire")

VERSION = 2
TAG_SIZE = 16
SALT_SIZE = 16
_PREFIX = 1 + SALT_SIZE + 8  # version, salt, counter
_KDF_LABEL = b"fibercore frame key v2"
_BIG = sys.byteorder == "big"
_ONE_SHOT_MAX = 64 << 10  # smaller frames are joined and tagged in one call

Message = tuple[int, Sequence[Any]]  # (op, parts)

#: Counters of frames this process refused; tests and `fiber` diagnostics read them.
stats: collections.Counter[str] = collections.Counter()
_last_warning = 0.0


class BadFrame(Exception):
    """A frame failed authentication or could not be parsed (never raised to users)."""


def _nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _derive(secret: bytes, salt: bytes) -> bytes:
    return hmac.digest(secret, _KDF_LABEL + salt, "sha256")


class Sealer:
    """One sender's key (from a random salt) and frame counter."""

    def __init__(self, secret: bytes) -> None:
        self.salt = os.urandom(SALT_SIZE)
        key = _derive(secret, self.salt)
        self._aead = AESGCM(key)
        self._aes = algorithms.AES(key)
        self._counter = itertools.count(1)  # next() is atomic: threads may share a sealer

    def seal_parts(self, messages: Sequence[Message]) -> list[Any]:
        header = array("Q", [len(messages)])
        payload: list[Any] = []
        size = 0
        for op, parts in messages:
            header.append(op)
            header.append(len(parts))
            for part in parts:
                n = _nbytes(part)
                header.append(n)
                payload.append(part)
                size += n
        if _BIG:
            header.byteswap()
        count = next(self._counter)
        head = b"".join([
            bytes((VERSION,)), self.salt, count.to_bytes(8, "little"),
            len(header).to_bytes(4, "little"), header.tobytes(),
        ])
        nonce = count.to_bytes(12, "little")
        if size <= _ONE_SHOT_MAX:
            body = b"".join([head, *payload])
            return [self._aead.encrypt(nonce, b"", body), body]
        mac = Cipher(self._aes, modes.GCM(nonce)).encryptor()
        mac.authenticate_additional_data(head)
        for part in payload:
            mac.authenticate_additional_data(part)
        mac.finalize()
        return [mac.tag, head, *payload]


_sealers: dict[bytes, Sealer] = {}
_verifiers: dict[tuple[bytes, bytes], AESGCM] = {}
_VERIFIERS_MAX = 4096


def sealer(secret: bytes) -> Sealer:
    """This process's shared sealer for ``secret``."""
    found = _sealers.get(secret)
    if found is None:
        found = _sealers.setdefault(secret, Sealer(secret))
    return found


def seal(key: bytes, messages: Sequence[Message]) -> bytes:
    """Encode ``messages`` into one authenticated frame under the session secret ``key``."""
    return b"".join(sealer(key).seal_parts(messages))


def unseal(key: bytes, frame: bytes | memoryview) -> list[tuple[int, list[memoryview]]]:
    """Authenticate ``frame`` and split it into messages; raise BadFrame otherwise."""
    view = memoryview(frame)
    if view.nbytes < TAG_SIZE + _PREFIX + 4:
        raise BadFrame("short frame")
    body = view[TAG_SIZE:]
    if body[0] != VERSION:
        raise BadFrame(f"unsupported frame version {body[0]}")
    salt = bytes(body[1:1 + SALT_SIZE])
    cache_key = (key, salt)
    aead = _verifiers.get(cache_key)
    fresh = aead is None
    if fresh:
        aead = AESGCM(_derive(key, salt))
    nonce = bytes(body[1 + SALT_SIZE:_PREFIX]) + b"\0\0\0\0"
    try:
        aead.decrypt(nonce, view[:TAG_SIZE], body)
    except InvalidTag:
        raise BadFrame("bad authentication tag") from None
    if fresh:  # cache keys of senders that proved they hold the secret only
        if len(_verifiers) >= _VERIFIERS_MAX:
            _verifiers.clear()
        _verifiers[cache_key] = aead
    nwords = int.from_bytes(body[_PREFIX:_PREFIX + 4], "little")
    start = _PREFIX + 4
    end_header = start + 8 * nwords
    if nwords < 1 or end_header > len(body):
        raise BadFrame("bad header length")
    header = array("Q")
    header.frombytes(body[start:end_header])
    if _BIG:
        header.byteswap()
    pos, i, out = end_header, 1, []
    try:
        for _ in range(header[0]):
            op, nparts = header[i], header[i + 1]
            i += 2
            parts = []
            for _ in range(nparts):
                size = header[i]
                i += 1
                parts.append(body[pos : pos + size])
                pos += size
            out.append((op, parts))
    except IndexError as exc:
        raise BadFrame("truncated header") from exc
    if pos != len(body):
        raise BadFrame("payload length does not match header")
    return out


def _reject(where: str, peer: Hashable, reason: str) -> None:
    global _last_warning
    stats["rejected_frames"] += 1
    now = time.monotonic()
    if now - _last_warning > 5.0:
        _last_warning = now
        log.warning(
            "dropped a frame on %s from %r: %s (%d rejected so far); a peer without the "
            "session secret is connected to this endpoint",
            where,
            peer,
            reason,
            stats["rejected_frames"],
        )


#: Reserved op: flow-control credit a spoke returns to its hub (never reaches callers).
OP_CREDIT = 0xFFFF_FFFF
#: Frames a hub may have in flight to one spoke before the spoke acknowledges them.
WINDOW = 2
#: How long a spoke waits for an outgoing frame to carry its acknowledgement.
ACK_DELAY = 0.001


class _PeerState:
    __slots__ = ("credit", "backlog", "lock")

    def __init__(self) -> None:
        self.credit = WINDOW
        self.backlog: list[Message] = []
        self.lock = threading.Lock()


class Channel:
    """An endpoint whose frames are sealed and unsealed with the session key.

    ``role`` adds flow control to router endpoints. A transport may drop frames a
    listener sends to one peer faster than that peer's connection drains them (nng's
    polyamorous pair keeps two per pipe and discards the rest). So a *hub* (the
    listening side) sends at most :data:`WINDOW` frames to a peer until the peer's
    *spoke* channel acknowledges them; messages sent meanwhile wait and leave
    together in one frame as credit returns. Spokes acknowledge on their next
    outgoing frame, or after :data:`ACK_DELAY`. A hub must be received from
    continuously (credit arrives with received frames); every hub here has a thread
    doing that.
    """

    def __init__(self, endpoint: Endpoint, key: bytes, role: str | None = None) -> None:
        self.endpoint = endpoint
        self.address = endpoint.address
        self._key = key
        self._sealer = Sealer(key)
        self._gather = getattr(endpoint, "send_parts", None)
        self._role = role
        self._peers: dict[Hashable, _PeerState] = {}
        self._peers_lock = threading.Lock()
        self._owed = 0
        self._owed_lock = threading.Lock()
        if role == "hub":
            endpoint.on_peer_event(self._hub_peer_event)

    # -- sending -------------------------------------------------------------------------
    def _send_frame(self, messages: Sequence[Message], peer: Hashable | None, block: bool = True) -> None:
        parts = self._sealer.seal_parts(messages)
        if self._gather is not None:
            self._gather(parts, peer, block=block)
        else:  # a transport without gathering sends always block
            self.endpoint.send(b"".join(parts), peer)

    def send(self, messages: Sequence[Message], peer: Hashable | None = None, block: bool = True) -> None:
        """Seal and send; ``block=False`` raises TransportTimeout instead of waiting for room.

        A blocking send may also raise TransportTimeout when the transport bounds its
        wait (pair endpoints do, so that a sender can give up on a departed peer).
        """
        if self._role == "hub" and peer is not None:
            state = self._state(peer)
            with state.lock:
                if state.credit <= 0 or state.backlog:
                    state.backlog.extend(messages)
                    return
                state.credit -= 1
                self._send_frame(messages, peer)
            return
        if self._role == "spoke":
            owed = self._take_owed()
            if owed:
                messages = [(OP_CREDIT, [str(owed).encode()]), *messages]
        self._send_frame(messages, peer, block)

    def _state(self, peer: Hashable) -> _PeerState:
        state = self._peers.get(peer)
        if state is None:
            with self._peers_lock:
                state = self._peers.setdefault(peer, _PeerState())
        return state

    def _grant(self, peer: Hashable, credit: int) -> None:
        state = self._state(peer)
        with state.lock:
            state.credit += credit
            if state.backlog and state.credit > 0:
                batch, state.backlog = state.backlog, []
                state.credit -= 1
                try:
                    self._send_frame(batch, peer)
                except TransportClosed:
                    pass

    def _hub_peer_event(self, peer: Hashable, added: bool) -> None:
        if not added:
            with self._peers_lock:
                self._peers.pop(peer, None)

    def _take_owed(self) -> int:
        with self._owed_lock:
            owed, self._owed = self._owed, 0
        return owed

    def flush_credit(self) -> bool:
        """Send owed acknowledgements now, without waiting (the acker thread calls this).

        Returns False when the transport could not take the frame at once (the peer
        may be gone): the credit stays owed and the acker tries again later.
        """
        owed = self._take_owed()
        if not owed:
            return True
        try:
            self._send_frame([(OP_CREDIT, [str(owed).encode()])], None, block=False)
        except TransportTimeout:
            with self._owed_lock:
                self._owed += owed
            return False
        except Exception:  # closed: the hub no longer needs them
            pass
        return True

    # -- receiving -------------------------------------------------------------------------
    def recv(self, timeout: float | None = None) -> tuple[list[tuple[int, list[memoryview]]], Hashable]:
        """Next authentic frame's messages and its peer; forged frames are skipped."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            data, peer = self.endpoint.recv(remaining)
            try:
                messages = unseal(self._key, data)
            except BadFrame as exc:
                _reject(self.address, peer, str(exc))
                if deadline is not None and time.monotonic() >= deadline:
                    raise TransportTimeout("only forged frames arrived") from None
                continue
            if self._role == "spoke":
                with self._owed_lock:
                    self._owed += 1
                _acker.due(self)
            elif self._role == "hub" and any(op == OP_CREDIT for op, _ in messages):
                credit = sum(int(bytes(parts[0])) for op, parts in messages if op == OP_CREDIT)
                messages = [m for m in messages if m[0] != OP_CREDIT]
                self._grant(peer, credit)
                if not messages:
                    if deadline is not None and time.monotonic() >= deadline:
                        raise TransportTimeout("only credit arrived")
                    continue
            return messages, peer

    def on_peer_event(self, callback: Any) -> None:
        self.endpoint.on_peer_event(callback)

    def close(self) -> None:
        self.endpoint.close()


class _Acker:
    """One thread per process that sends spokes' acknowledgements nobody carried."""

    def __init__(self) -> None:
        self._cv = threading.Condition(threading.Lock())
        self._due: dict[Channel, float] = {}
        self._retry: dict[Channel, float] = {}  # channels whose last try failed: next delay
        self._thread: threading.Thread | None = None

    def due(self, channel: Channel, delay: float = ACK_DELAY) -> None:
        with self._cv:
            if channel in self._due:
                return
            self._due[channel] = time.monotonic() + delay
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fiber-acker", daemon=True)
                self._thread.start()
            self._cv.notify()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._due:
                    self._cv.wait()
                now = time.monotonic()
                ready = [ch for ch, t in self._due.items() if t <= now]
                if not ready:
                    self._cv.wait(min(self._due.values()) - now)
                    continue
                for ch in ready:
                    del self._due[ch]
            for ch in ready:
                if ch.flush_credit():
                    self._retry.pop(ch, None)
                else:  # the peer is slow or gone: try again, less and less often (50 ms .. 2 s)
                    delay = self._retry.get(ch, 0.05)
                    self._retry[ch] = min(2.0, delay * 2)
                    self.due(ch, delay)


_acker = _Acker()


def _after_fork_in_child() -> None:
    """The parent's acker thread does not exist in a forked child: start afresh."""
    global _acker
    _acker = _Acker()


os.register_at_fork(after_in_child=_after_fork_in_child)


class Sender:
    """A background thread that packs queued messages into as few frames as it can.

    ``put`` returns at once (like ``multiprocessing.Queue``'s feeder); under load
    one frame carries many messages, which is what makes nng's per-call cost
    vanish. ``flush`` waits until everything queued has been handed to the
    transport. Above ``high_water`` bytes queued, ``put`` blocks (back-pressure).
    """

    def __init__(
        self,
        channel: Channel,
        name: str,
        max_frame: int = 4 << 20,
        high_water: int = 64 << 20,
        peer_gone: Callable[[], bool] | None = None,
    ) -> None:
        self._channel = channel
        self._peer_gone = peer_gone
        self._queue: collections.deque[tuple[Message, int]] = collections.deque()
        self._cv = threading.Condition(threading.Lock())
        self._bytes = 0
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._max_frame = max_frame
        self._high_water = high_water
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def put(self, message: Message) -> None:
        size = sum(_nbytes(p) for p in message[1]) + 16
        with self._cv:
            if self._error is not None:
                raise TransportClosed(f"cannot send: {self._error}")
            while self._bytes > self._high_water and not self._closed:
                self._cv.wait()
            if self._closed:
                raise TransportClosed("the connection is closed")
            self._queue.append((message, size))
            self._bytes += size
            if len(self._queue) == 1:
                self._cv.notify_all()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._queue and not self._closed:
                    self._cv.wait()
                if not self._queue:
                    return
                batch: list[Message] = []
                size = 0
                while self._queue and (not batch or size + self._queue[0][1] <= self._max_frame):
                    message, nbytes = self._queue.popleft()
                    batch.append(message)
                    size += nbytes
                self._bytes -= size
                self._busy = True
                self._cv.notify_all()
            try:
                self._send(batch)
            except BaseException as exc:  # closed endpoint: drop the rest, fail later puts
                with self._cv:
                    self._error = exc
                    self._queue.clear()
                    self._busy = False
                    self._cv.notify_all()
                return
            with self._cv:
                self._busy = False
                self._cv.notify_all()

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
            while (self._queue or self._busy) and self._error is None:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cv.wait(remaining)
        return True

    def close(self, flush: bool = True, timeout: float | None = 10.0) -> None:
        if flush:
            self.flush(timeout)
        with self._cv:
            self._closed = True
            self._queue.clear()
            self._cv.notify_all()

    @property
    def pending(self) -> int:
        return len(self._queue)
