"""Frames: many messages in one unit, sealed with one direction's key (authenticated; encrypted on a network
unless the program chose ``network_encryption=False``).

Every integer on the wire is an unsigned 64-bit little-endian word (one encoding)::

    frame  = tag(16) || body
    body   = words || payload
    words  = counter, nwords, nmsgs, then per message: op, nparts, len(part_0) .. len(part_n)

On a network stream everything in ``body`` after the counter is encrypted, and ``tag`` is
its AES-256-GCM tag (the counter as associated data; key = this connection's key for
this direction, :mod:`fibercore.wire.handshake`; nonce = counter, 12 bytes LE). What
crosses a network is so confidential even without TLS, and behind a TLS relay that
holds a certificate of the same CA.

A large frame on a transport that takes :class:`Pieces` (the built-in one) is *streamed*:
encrypted (or, without encryption, authenticated) piece by piece as the transport sends it,
so its first bytes leave before its last are sealed, and no second copy of it is made. Its
tag is known only at its end, so it goes there, and sixteen zero bytes stand where a tag
stands::

    streamed = zero(16) || counter || ciphertext || tag(16)

A real tag is all zeros with probability 2^-128, so the receiver tells the two apart by
them; a frame altered into that shape fails authentication as any other.

With ``network_encryption=False`` (:class:`ClearSealer`) nothing is encrypted: ``tag`` is
the AES-GMAC of the whole body (the GCM tag with the body as associated data), so a frame is
still authenticated, counted and bound to its connection and direction, but readable on the
network. Both ends agree on it in the handshake (it is in every proof).

On a private stream (a Unix-domain connection; the handshake proved both ends see
one, :mod:`fibercore.wire.handshake`) the tag is all zeros and not checked: only the
two processes can write into such a stream, so the kernel binds each frame to its
connection and direction; the counter is still checked. A message of one part sent on its
own (a connected Pipe's every step, :meth:`StreamSealer.seal_one`) goes as a *short* frame::

    short  = 0x80 | op (1 byte) || payload        (op < 0x80)

with no counter: the kernel keeps a stream's order and nothing but the two ends writes into
it, so a counter there proves nothing a short frame needs; counted frames between short ones
(a sender thread's batches) count among themselves as before. A counted frame begins with its
zero tag, so the first byte tells the two apart.

A sender counts its frames from 1; a receiver accepts each counter once, within a
window of the last :data:`REPLAY_WINDOW` (threads of one process may verify frames of
one connection in a different order than they arrived). Keys are per connection and per
direction, so a frame replayed on the same connection, sent back to its sender (reflected) or sent to another
endpoint fails. Nothing in a frame is looked at before the tag is checked.
"""

from __future__ import annotations

import collections
import itertools
import logging
import struct
import sys
import threading
import time
from array import array
from collections.abc import Hashable, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

log = logging.getLogger("fibercore.wire")

TAG_SIZE = 16
_NO_TAG = bytes(TAG_SIZE)
_BIG = sys.byteorder == "big"
_ONE_SHOT_MAX = 64 << 10  # smaller frames are joined and tagged in one call
#: Frames over this size are streamed where the transport takes :class:`Pieces`.
STREAM_MIN = 4 << 20
_PIECE = 1 << 20  # ciphertext made per piece of a streamed frame (one reused buffer)
_IN_PLACE_STEP = 1 << 20  # a large frame is decrypted over itself this much at a time ...
_IN_PLACE_TAIL = 1 << 10  # ... but for its last bytes, decrypted into a copy
_FIXED_WORDS = 3  # counter, nwords, nmsgs
#: Pickles below this size in a frame of many messages are joined into one payload part:
#: one copy in C instead of a part each for the writer to walk in Python (a queue's grant
#: carries hundreds of small items).
_JOIN_MAX = 8 << 10
#: How far behind the newest accepted counter a frame may be and still be accepted (once).
REPLAY_WINDOW = 64
_WINDOW_MASK = (1 << REPLAY_WINDOW) - 1

_ONE = struct.Struct("<6Q")  # the words of a frame of one message in one part
_STREAM_ONE = struct.Struct("<16x6Q")  # the same behind a private stream's all-zero tag
_U64 = struct.Struct("<Q")
_U64x3 = struct.Struct("<3Q")
_WORDS_ONE = struct.Struct("<5Q")  # _ONE's words after the counter

Message = tuple[int, Sequence[Any]]  # (op, parts)
Messages = list[tuple[int, list[memoryview]]]

#: Counters of what this process refused; tests and diagnostics read them.
stats: collections.Counter[str] = collections.Counter()
_last_warning = 0.0


class BadFrame(Exception):
    """A frame failed authentication or could not be parsed (never raised to users)."""


def nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _byte_view(part: Any) -> memoryview:
    """``part`` as a flat view of bytes (what the cipher and the slicing by bytes want)."""
    view = part if type(part) is memoryview else memoryview(part)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _tag_last(view: memoryview) -> tuple[memoryview, memoryview]:
    """A frame's tag and the frame without a tag at its end: a streamed frame (see the
    module's docstring) has sixteen zero bytes in front and its tag last."""
    tag = view[:TAG_SIZE]
    if len(view) > STREAM_MIN and tag == _NO_TAG:
        return view[-TAG_SIZE:], view[:-TAG_SIZE]
    return tag, view


def owned(parts: Sequence[Any]) -> list[Any]:
    """``parts`` with every buffer its sender could still change copied (a writable view: a
    numpy array's or a bytearray's memory, sent out of band): a message that leaves after
    ``send()`` or ``put()`` returned carries what it held then, as a pickle made in the call
    would. Immutable parts (bytes, read-only views) are kept as they are."""
    for part in parts:
        if type(part) is bytearray or (type(part) is memoryview and not part.readonly):
            return [bytes(p) if type(p) is bytearray or (type(p) is memoryview and not p.readonly) else p
                    for p in parts]
    return parts if type(parts) is list else list(parts)


def _words(values: array) -> bytes:
    if _BIG:
        values = array("Q", values)
        values.byteswap()
    return values.tobytes()


class Pieces:
    """The rest of a frame, made piece by piece as the transport asks for it (the transport
    contract, :mod:`fibercore.transport`): ``len()`` is its size in bytes, known before the
    first piece; iterating gives byte buffers, each valid only until the next is asked for
    (their memory is reused), so the transport writes each out before it asks again.
    Iterated once."""

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def __iter__(self) -> Any:
        raise NotImplementedError


class _Encrypting(Pieces):
    """A streamed frame's ciphertext and then its tag: the parts encrypted into one buffer of
    :data:`_PIECE` bytes, a piece at a time."""

    __slots__ = ("_enc", "_parts", "_size", "_out")

    def __init__(self, enc: Any, parts: list[Any], size: int) -> None:
        self._enc = enc
        self._parts = parts
        self._size = size + TAG_SIZE
        self._out = bytearray(_PIECE + TAG_SIZE)  # update_into wants a block's slack

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Any:
        enc, parts, out = self._enc, self._parts, memoryview(self._out)
        self._parts = []
        pos = 0
        for part in parts:
            view = _byte_view(part)
            while view:
                take = min(_PIECE - pos, len(view))
                pos += enc.update_into(view[:take], out[pos:])
                view = view[take:]
                if pos == _PIECE:
                    yield out[:pos]
                    pos = 0
        enc.finalize()
        out[pos:pos + TAG_SIZE] = enc.tag
        yield out[:pos + TAG_SIZE]


class Sealer:
    """One direction of one connection: its key and frame counter.

    Sealing and sending must happen under one lock (the channel's), so frames leave
    in counter order.
    """

    #: A stream's sealer: the one-byte header of a short frame of each op below 128, which
    #: :meth:`seal_one` gives as it is (see :class:`StreamSealer`); None: every frame is sealed.
    short_heads: list[bytes] | None = None
    #: The transport takes a frame's last part as :class:`Pieces` (set through
    #: :meth:`fibercore.wire.handshake.Session.stream_large_frames`): large frames are streamed.
    pieces = False

    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        self._aes = algorithms.AES(key)
        self._counter = 0

    def seal(self, messages: Sequence[Message]) -> list[Any]:
        """The frame as a list of buffers to send back to back: tag, counter, ciphertext."""
        self._counter += 1
        head, payload, size = self._layout(messages)
        counter, words = head[:8], head[8:]
        nonce = self._counter.to_bytes(12, "little")
        if size <= _ONE_SHOT_MAX:
            sealed = memoryview(self._aead.encrypt(nonce, b"".join([words, *payload]), counter))
            return [sealed[-TAG_SIZE:], counter, sealed[:-TAG_SIZE]]
        enc = Cipher(self._aes, modes.GCM(nonce)).encryptor()
        enc.authenticate_additional_data(counter)
        if size > STREAM_MIN and self.pieces:  # encrypted as the transport sends it, the tag last
            return [_NO_TAG + counter, _Encrypting(enc, [words, *payload], len(words) + size)]
        return self._seal_whole(enc, counter, words, payload)

    def seal_one(self, op: int, part: Any) -> list[Any]:
        """``seal([(op, [part])])``: one message of one part (a connected Pipe's), without
        the general layout's walk."""
        size = part.nbytes if type(part) is memoryview else len(part)
        if size > _ONE_SHOT_MAX:
            return self.seal([(op, [part])])
        self._counter += 1
        counter = _U64.pack(self._counter)
        sealed = self._aead.encrypt(self._counter.to_bytes(12, "little"),
                                    b"".join((_WORDS_ONE.pack(6, 1, op, 1, size), part)), counter)
        return [sealed[-TAG_SIZE:] + counter, memoryview(sealed)[:-TAG_SIZE]]  # two parts: one write, no walk

    def _layout(self, messages: Sequence[Message]) -> tuple[bytes, list[Any], int]:
        """The header words (counter first) and the payload parts of one frame."""
        if len(messages) == 1:
            op, parts = messages[0]
            if len(parts) == 1:  # the usual message (a pickle): its words in one call
                n = nbytes(parts[0])
                return _ONE.pack(self._counter, 6, 1, op, 1, n), [parts[0]], n
        small = self._layout_small(messages)
        if small is not None:
            return small
        words = array("Q", [self._counter, 0, len(messages)])
        payload: list[Any] = []
        run: list[bytes] = []  # small pickles not yet in payload: joined into one part
        size = 0
        for op, parts in messages:
            words.append(op)
            words.append(len(parts))
            for part in parts:
                if type(part) is bytes and len(part) < _JOIN_MAX:
                    n = len(part)
                    run.append(part)
                else:
                    n = nbytes(part)
                    if run:
                        payload.append(b"".join(run) if len(run) > 1 else run[0])
                        run = []
                    payload.append(part)
                words.append(n)
                size += n
        if run:
            payload.append(b"".join(run) if len(run) > 1 else run[0])
        words[1] = len(words)
        return _words(words), payload, size

    def _layout_small(self, messages: Sequence[Message]) -> tuple[bytes, list[Any], int] | None:
        """The layout of a frame whose messages carry at most one small pickle each (a queue's
        grant, a pool's batch), with the pickles joined into one part; None for other frames.
        A few passes in C instead of a few calls of Python per message."""
        counts = [len(parts) for _, parts in messages]
        if not counts or max(counts) > 1:
            return None
        body = [parts[0] for _, parts in messages if parts]
        if not body or set(map(type, body)) != {bytes}:
            return None
        sizes = list(map(len, body))
        if max(sizes) >= _JOIN_MAX:
            return None
        carrying = len(body)
        if min(counts[:carrying]) == 0:  # a message of none before one of a pickle: the loop's case
            return None
        ops = [op for op, _ in messages]
        words = array("Q", [self._counter, 0, len(messages)])
        words.extend(itertools.chain.from_iterable(zip(ops, itertools.repeat(1), sizes)))
        for op in ops[carrying:]:  # those that carry nothing come last (a queue's DONE)
            words.extend((op, 0))
        words[1] = len(words)
        return _words(words), [b"".join(body)], sum(sizes)

    @staticmethod
    def _seal_whole(enc: Any, counter: bytes, words: bytes, payload: list[Any]) -> list[Any]:
        # Big parts are encrypted one by one; runs of small ones are joined first (one call
        # per run instead of one per message).
        out: list[Any] = [None, counter]
        run: list[Any] = [words]
        for part in payload:
            if nbytes(part) < _ONE_SHOT_MAX:
                run.append(part)
                continue
            if run:
                out.append(enc.update(b"".join(run)))
                run = []
            out.append(enc.update(_byte_view(part)))
        if run:
            out.append(enc.update(b"".join(run)))
        enc.finalize()
        out[0] = enc.tag
        return out


class Opener:
    """The receiving direction of one connection: checks tags and that counters only grow."""

    #: A stream's opener: a frame whose first byte has the top bit set is a short frame, its
    #: op in the other bits and its message after it (see :class:`StreamOpener`).
    short = False

    def __init__(self, key: bytes) -> None:
        self._aes = algorithms.AES(key)
        self._aead = AESGCM(key)
        self._last = 0
        # bit i: counter last - i was accepted (counters up to 0 count as seen: a sender
        # counts from 1; a window all ones needs no shifting while frames come in order)
        self._seen = _WINDOW_MASK
        self._lock = threading.Lock()
        #: The frame :meth:`open_one` verified but could not take (several messages), its
        #: counter and body: :meth:`open`, called next with it, does not verify it again.
        self._verified: tuple[memoryview, int, memoryview] | None = None

    def open(self, frame: bytes | memoryview) -> Messages:
        """Authenticate (and decrypt) ``frame`` and split it into messages; raise BadFrame otherwise."""
        verified, self._verified = self._verified, None
        if verified is not None and verified[0] is frame:
            counter, body = verified[1], verified[2]
        else:
            view = memoryview(frame)
            if view.ndim != 1 or view.itemsize != 1:
                view = view.cast("B")
            if view.nbytes < TAG_SIZE + 8 * _FIXED_WORDS:
                raise BadFrame("short frame")
            (counter,) = _U64.unpack_from(view, TAG_SIZE)
            body = self._verify(view, counter)
        with self._lock:
            if counter > self._last:
                shift = counter - self._last
                self._seen = ((self._seen << shift) | 1) & _WINDOW_MASK
                self._last = counter
            else:
                behind = self._last - counter
                if behind >= REPLAY_WINDOW or (self._seen >> behind) & 1:
                    raise BadFrame(f"replayed frame (counter {counter}, newest {self._last})")
                self._seen |= 1 << behind
        return _split(body)

    def open_one(self, frame: memoryview) -> tuple[int, list[memoryview]] | None:
        """The message of ``frame`` when it is the next frame in order and holds one message
        of one part, without taking the lock (the caller holds its channel's receiving lock);
        None otherwise, having changed nothing (then :meth:`open` decides, and a frame this
        verified is not verified again)."""
        if frame.itemsize != 1 or frame.ndim != 1 or not TAG_SIZE + 48 <= len(frame) <= _ONE_SHOT_MAX:
            return None
        (counter,) = _U64.unpack_from(frame, TAG_SIZE)
        if counter != self._last + 1:
            return None
        one = self._one(frame, counter)
        if one is None:
            return None
        self._last = counter
        if self._seen != _WINDOW_MASK:
            self._seen = ((self._seen << 1) | 1) & _WINDOW_MASK
        return one

    def _one(self, frame: memoryview, counter: int) -> tuple[int, list[memoryview]] | None:
        """:meth:`open_one` once the counter is the next: the message of an authentic frame of
        one message of one part, in a writable buffer as every body :meth:`open` gives; None for
        a refused frame (:meth:`open` refuses it again, and counts it) or one of several
        messages (kept for :meth:`open`)."""
        try:
            clear = self._aead.decrypt(counter.to_bytes(12, "little"),
                                       b"".join((frame[TAG_SIZE + 8:], frame[:TAG_SIZE])), frame[TAG_SIZE:TAG_SIZE + 8])
        except (InvalidTag, ValueError):
            return None
        nwords, nmsgs, op, nparts, size = _WORDS_ONE.unpack_from(clear)
        if nwords != 6 or nmsgs != 1 or nparts != 1 or size != len(clear) - 40:
            body = bytearray(8 + len(clear))  # open() wants it writable (buffers out of band)
            body[:8] = frame[TAG_SIZE:TAG_SIZE + 8]
            body[8:] = clear
            self._verified = (frame, counter, memoryview(body))
            return None
        return op, [memoryview(bytearray(clear))[40:]]

    def _verify(self, view: memoryview, counter: int) -> memoryview:
        """The frame's body (counter, words, payload) in clear, into a new writable buffer."""
        head = TAG_SIZE + 8
        nonce = counter.to_bytes(12, "little") if counter < 1 << 96 else b""
        tag, view = _tag_last(view)
        if len(view) <= _ONE_SHOT_MAX:  # one call (a Cipher object per frame costs more than the copies)
            try:
                clear = self._aead.decrypt(nonce, b"".join((view[head:], tag)), view[TAG_SIZE:head])
            except (InvalidTag, ValueError):
                raise BadFrame("bad authentication tag") from None
            body = bytearray(8 + len(clear))
            body[:8] = view[TAG_SIZE:head]
            body[8:] = clear
            return memoryview(body)
        try:
            dec = Cipher(self._aes, modes.GCM(nonce, bytes(tag))).decryptor()
        except (ValueError, OverflowError):
            raise BadFrame("bad counter") from None
        dec.authenticate_additional_data(view[TAG_SIZE:head])
        if view.readonly:
            body = bytearray(len(view) - TAG_SIZE + 15)  # update_into wants a block's slack
            body[:8] = view[TAG_SIZE:head]
            n = dec.update_into(view[head:], memoryview(body)[8:])
            opened = memoryview(body)[:8 + n]
        else:  # in place: a large frame is not written out a second time into new memory
            _decrypt_in_place(dec, view[head:])
            opened = view[TAG_SIZE:]
        try:
            dec.finalize()
        except InvalidTag:
            raise BadFrame("bad authentication tag") from None
        return opened


def _decrypt_in_place(dec: Any, data: memoryview) -> None:
    """Decrypt ``data`` over itself, a step at a time (``update_into`` wants room for a block
    more than it is given, which the rest of the buffer provides; the last step is copied)."""
    end = len(data) - _IN_PLACE_TAIL
    pos = 0
    while pos < end:
        step = min(_IN_PLACE_STEP, end - pos)
        dec.update_into(data[pos:pos + step], data[pos:])
        pos += step
    data[pos:] = dec.update(data[pos:])


#: The bit that marks a short frame's first byte (a counted frame's is its tag's: zero).
SHORT = _SHORT = 0x80
_SHORT_HEAD = [bytes([_SHORT | op]) for op in range(_SHORT)]


class StreamSealer(Sealer):
    """For a connection no third process can write into (a Unix-domain stream, after the
    handshake proved the peer): frames are counted, and the kernel binds them to the
    connection and direction, so the MAC is left out (all zeros; 0.25 ms per MB each way)."""

    short_heads = _SHORT_HEAD

    def seal(self, messages: Sequence[Message]) -> list[Any]:
        self._counter += 1
        if len(messages) == 1:
            op, parts = messages[0]
            if len(parts) == 1:  # the usual message: zero tag and words in one call
                part = parts[0]
                size = part.nbytes if type(part) is memoryview else len(part)
                return [_STREAM_ONE.pack(self._counter, 6, 1, op, 1, size), part]
        head, payload, _ = self._layout(messages)
        return [_NO_TAG, head, *payload]

    def seal_one(self, op: int, part: Any) -> list[Any]:
        """A short frame (see the module's docstring): one byte of header, no counter."""
        if op < _SHORT:
            return [_SHORT_HEAD[op], part]
        self._counter += 1
        return [_STREAM_ONE.pack(self._counter, 6, 1, op, 1, part.nbytes if type(part) is memoryview else len(part)),
                part]


class StreamOpener(Opener):
    """The receiving side of :class:`StreamSealer`: counted frames' counters are still checked."""

    short = True

    def open_one(self, frame: memoryview) -> tuple[int, list[memoryview]] | None:
        if frame.itemsize != 1 or frame.ndim != 1 or not frame:
            return None
        first = frame[0]
        if first & _SHORT:  # a short frame (no counter)
            return first & ~_SHORT, [frame[1:]]
        size = len(frame) - 64
        if size < 0:
            return None
        counter, nwords, nmsgs, op, nparts, length = _STREAM_ONE.unpack_from(frame)
        if counter != self._last + 1 or length != size or nparts != 1 or nmsgs != 1 or nwords != 6:
            return None
        if self._seen != _WINDOW_MASK:
            self._seen = ((self._seen << 1) | 1) & _WINDOW_MASK
        self._last = counter
        return op, [frame[64:]]

    def _verify(self, view: memoryview, counter: int) -> memoryview:
        return view[TAG_SIZE:]

    def open(self, frame: bytes | memoryview) -> Messages:
        view = frame if type(frame) is memoryview else memoryview(frame)
        if view and view.ndim == 1 and view.itemsize == 1 and view[0] & _SHORT:  # a short frame (no counter)
            return [(view[0] & ~_SHORT, [view[1:]])]
        if view.ndim != 1 or view.itemsize != 1 or len(view) < TAG_SIZE + 48:
            return super().open(frame)
        counter, nwords, nmsgs, op, nparts, size = _STREAM_ONE.unpack_from(view)
        with self._lock:
            following = counter == self._last + 1  # the usual case: the next one
            if following:
                self._seen = ((self._seen << 1) | 1) & _WINDOW_MASK
                self._last = counter
        if not following:  # the general rule decides (a replay, or threads out of order)
            return super().open(frame)
        if nwords == 6 and nmsgs == 1 and nparts == 1 and size == len(view) - 64:
            return [(op, [view[64:]])]  # one message in one part, read in one call
        return _split(view[TAG_SIZE:])


class ClearSealer(Sealer):
    """For a network connection whose program chose ``network_encryption=False``: frames are
    authenticated (AES-GMAC: the GCM tag over the whole frame as associated data, nothing
    encrypted) and counted, but sent in clear. The tag costs about a sixth of encrypting."""

    def seal_one(self, op: int, part: Any) -> list[Any]:
        return self.seal([(op, [part])])

    def seal(self, messages: Sequence[Message]) -> list[Any]:
        self._counter += 1
        head, payload, size = self._layout(messages)
        nonce = self._counter.to_bytes(12, "little")
        if size <= _ONE_SHOT_MAX:
            return [self._aead.encrypt(nonce, b"", b"".join([head, *payload])), head, *payload]
        mac = Cipher(self._aes, modes.GCM(nonce)).encryptor()
        mac.authenticate_additional_data(head)
        if size > STREAM_MIN and self.pieces:  # streamed: tagged as it is sent, the tag last
            return [_NO_TAG, head, _Authenticating(mac, payload, size)]
        for part in payload:
            mac.authenticate_additional_data(_byte_view(part))
        mac.finalize()
        return [mac.tag, head, *payload]


class _Authenticating(Pieces):
    """A streamed clear frame's payload, given as it is (no copy) a piece at a time while each
    piece enters its GMAC, and then the tag."""

    __slots__ = ("_mac", "_parts", "_size")

    def __init__(self, mac: Any, parts: list[Any], size: int) -> None:
        self._mac = mac
        self._parts = parts
        self._size = size + TAG_SIZE

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Any:
        mac, parts = self._mac, self._parts
        self._parts = []
        for part in parts:
            view = _byte_view(part)
            for start in range(0, len(view), _PIECE):
                piece = view[start:start + _PIECE]
                mac.authenticate_additional_data(piece)
                yield piece
        mac.finalize()
        yield mac.tag


class ClearOpener(Opener):
    """The receiving side of :class:`ClearSealer`: the tag is checked over the whole frame
    before anything in it is looked at; the body is a view of the frame (no copy)."""

    def _one(self, frame: memoryview, counter: int) -> tuple[int, list[memoryview]] | None:
        try:
            body = self._verify(frame, counter)
        except BadFrame:
            return None
        nwords, nmsgs, op, nparts, size = _WORDS_ONE.unpack_from(body, 8)
        if nwords != 6 or nmsgs != 1 or nparts != 1 or size != len(body) - 48:
            self._verified = (frame, counter, body)
            return None
        return op, [body[48:]]

    def _verify(self, view: memoryview, counter: int) -> memoryview:
        nonce = counter.to_bytes(12, "little") if counter < 1 << 96 else b""
        tag, framed = _tag_last(view)
        body = framed[TAG_SIZE:]
        try:
            if len(view) <= _ONE_SHOT_MAX:
                self._aead.decrypt(nonce, bytes(tag), body)
            else:
                check = Cipher(self._aes, modes.GCM(nonce, bytes(tag))).decryptor()
                check.authenticate_additional_data(body)
                check.finalize()
        except (InvalidTag, ValueError, OverflowError):
            raise BadFrame("bad authentication tag") from None
        return body


def _split(body: memoryview) -> Messages:
    _counter, nwords, nmsgs = _U64x3.unpack_from(body)
    if nwords == 6 and nmsgs == 1 and len(body) >= 48:  # one message in one part: no loop
        op, nparts, size = _U64x3.unpack_from(body, 24)
        if nparts == 1 and 48 + size == len(body):
            return [(op, [body[48:]])]
    end_words = 8 * nwords
    if nwords < _FIXED_WORDS or end_words > len(body):
        raise BadFrame("bad header length")
    words = array("Q")
    words.frombytes(body[:end_words])
    if _BIG:
        words.byteswap()
    # The two usual shapes, cut with no loop in Python (where each part ends, from the sizes):
    if nmsgs == 1 and nwords >= _FIXED_WORDS + 2 and nwords == _FIXED_WORDS + 2 + words[_FIXED_WORDS + 1]:
        # one message of several parts (a request, an object with out-of-band buffers)
        ends = list(itertools.accumulate(words[_FIXED_WORDS + 2 :], initial=end_words))
        if ends[-1] != len(body):
            raise BadFrame("payload length does not match header")
        return [(words[_FIXED_WORDS], [body[a:b] for a, b in zip(ends[:-1], ends[1:], strict=True)])]
    if nwords == _FIXED_WORDS + 3 * nmsgs and words[_FIXED_WORDS + 1 :: 3].count(1) == nmsgs:
        # a batch of one-part messages (op, 1, size each)
        ends = list(itertools.accumulate(words[_FIXED_WORDS + 2 :: 3], initial=end_words))
        if ends[-1] != len(body):
            raise BadFrame("payload length does not match header")
        return [(op, [body[a:b]]) for op, a, b in zip(words[_FIXED_WORDS::3], ends[:-1], ends[1:], strict=True)]
    pos, i, out = end_words, _FIXED_WORDS, []
    try:
        for _ in range(words[2]):
            op, nparts = words[i], words[i + 1]
            i += 2
            parts = []
            for _ in range(nparts):
                size = words[i]
                i += 1
                parts.append(body[pos : pos + size])
                pos += size
            out.append((op, parts))
    except IndexError as exc:
        raise BadFrame("truncated header") from exc
    if pos != len(body) or i != nwords:
        raise BadFrame("payload length does not match header")
    return out


def malformed(where: str, peer: Hashable, op: int, exc: BaseException) -> None:
    """An authentic message the receiver could not handle: counted, logged, dropped; it keeps serving."""
    reject(where, peer, f"malformed message (op {op}): {exc!r}", "malformed_messages")


def reject(where: str, peer: Hashable, reason: str, counter: str = "rejected_frames", quiet: bool = False) -> None:
    """Count a refused frame or connection and log it (rate-limited): the receiver keeps serving.

    ``quiet``: counted and logged at DEBUG only (a connection that closed before it sent
    anything: a job that died while it started, a port scan)."""
    global _last_warning
    stats[counter] += 1
    if quiet:
        log.debug("refused on %s from %r: %s", where, peer, reason)
        return
    now = time.monotonic()
    if now - _last_warning > 5.0:
        _last_warning = now
        log.warning("refused on %s from %r: %s (%d %s so far)", where, peer, reason, stats[counter],
                    counter.replace("_", " "))
