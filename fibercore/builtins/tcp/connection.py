"""One connection's bytes: frames written as length-prefixed records and read back, on a plain
socket or TLS, with its handshake state; :class:`Line` is a connected Pipe end's direct path
to it.

    record = u32 LE header (bits 0-30: length, bit 31: more records follow) || bytes
    frame  = the bytes of one or more records, the last without the "more" bit

A frame is at most :data:`RECORD_MAX` bytes per record, so memory grows only with bytes that
actually arrived, never with a claimed length.
"""

from __future__ import annotations

import mmap
import select
import socket
import ssl
import struct
import sys
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from fibercore.errors import TransportClosed, TransportTimeout
from fibercore.transport import Pieces
from fibercore.wire.handshake import MAX_HANDSHAKE_FRAME, Handshake, Session

from .spinning import DEFAULT_SPIN, SpinGate

#: Seconds a non-blocking write that got part of a frame out waits for room for the rest
#: before it gives the peer up (the stream cannot carry another frame before this one ends).
PARTIAL_WAIT = 5.0
#: Longest a waiting read sleeps before it looks again (closing an endpoint, and every change
#: a reader must see, wake it at once): an idle process does not wake up.
IDLE_STEP = 30.0
#: Bytes one :meth:`Conn.pump` reads at most before it returns (plain sockets).
PUMP_BYTES = 4 << 20
#: Largest record on the stream; bigger frames are sent as several records.
RECORD_MAX = 4 << 20
_MORE = 1 << 31
#: A frame of several records grows by remapping its memory (without mremap: a bytearray).
_REMAP = sys.platform.startswith("linux")
_HUGE: int | None = getattr(mmap, "MADV_HUGEPAGE", None)
#: Bytes of a frame that must have arrived before its memory asks for huge pages (:func:`_grown`).
HUGE_AFTER = 4 << 20
_HEADER = struct.Struct("<I")
_SCRATCH = 64 << 10  # read buffer of an authenticated connection (before: a handshake frame's size)
_IOV_MAX = 512
WOULD_BLOCK = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_TIMEVAL = struct.Struct("@ll")


class Broken(Exception):
    """The connection ended or broke its limits: close it."""


class Gone(Broken):
    """The peer closed or reset the connection (not a broken limit)."""


def _byte_view(part: Any) -> memoryview:
    view = part if isinstance(part, memoryview) else memoryview(part)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _after(iov: list[Any], n: int) -> list[Any]:
    """What is left of ``iov`` once its first ``n`` bytes went out, as non-empty byte views."""
    rest = []
    for part in iov:
        view = _byte_view(part)
        if n >= view.nbytes:
            n -= view.nbytes
            continue
        rest.append(view[n:])
        n = 0
    return rest


def _frame_buffer(size: int) -> mmap.mmap | bytearray:
    """Memory for the first record of a frame of several: private anonymous memory that
    :func:`_grown` remaps in place (Linux's ``mremap``); elsewhere a bytearray."""
    return mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE) if _REMAP else bytearray(size)


def _grown(frame: mmap.mmap | bytearray, size: int) -> mmap.mmap | bytearray:
    """``frame`` (every byte of it arrived) grown to ``size`` bytes: remapped in place, or
    (while a view of it is still held somewhere) copied into a new mapping.

    Once :data:`HUGE_AFTER` bytes arrived, the mapping asks for huge pages where the kernel
    gives them on request: the kernel's first write into fresh memory, page by page, is what a
    large frame's reader spends most on (100 MB: 50-90 ms in 4 kB pages, 17-19 ms in 2 MB ones,
    on the development VM). A huge page is taken whole at its first byte, so memory may run
    up to 2 MB ahead of what arrived; after :data:`HUGE_AFTER` that is at most half as much
    again, never a peer's claim multiplied."""
    if isinstance(frame, bytearray):
        frame += bytes(size - len(frame))
        return frame
    arrived = len(frame)
    try:
        frame.resize(size)
    except BufferError:
        bigger = _frame_buffer(size)
        bigger[:arrived] = frame
        frame = bigger
    if _HUGE is not None and arrived >= HUGE_AFTER and isinstance(frame, mmap.mmap):
        try:
            frame.madvise(_HUGE)
        except OSError:  # a kernel without transparent huge pages: 4 kB pages
            pass
    return frame


class Conn:
    """One connection: record framing in both directions, and its handshake state."""

    def __init__(self, sock: socket.socket, hs: Handshake, label: str, spin: float = DEFAULT_SPIN) -> None:
        self.sock = sock
        self.spin = spin
        self.spin_gate = SpinGate()
        self.tls = isinstance(sock, ssl.SSLSocket)
        self._rcvtimeo: float | None = -1.0  # SO_RCVTIMEO last set (-1: never)
        #: The ``seconds`` :meth:`wait_at_most` last made hold (-1: none holds now): a wait kept
        #: within the tolerance differs from SO_RCVTIMEO, so a caller asking the same again looks here.
        self.asked: float | None = -1.0
        self.hs = hs
        self.session: Session | None = None
        self.label = label
        self.who: Hashable = None  # the peer identity whose pending budget it uses (listeners)
        self.opened = time.monotonic()
        self.send_lock = threading.Lock()
        self.max_frame = MAX_HANDSHAKE_FRAME
        self.max_record = MAX_HANDSHAKE_FRAME
        self._max_one = MAX_HANDSHAKE_FRAME  # the largest one-record frame: both limits hold
        self._scratch = bytearray(MAX_HANDSHAKE_FRAME + 4)  # grown once authenticated
        self.fd = sock.fileno()
        self._recv_into_sock = sock.recv_into
        self._sendmsg = sock.sendmsg
        self._header = bytearray(4)
        self._hpos = 0
        #: The buffer the record being read goes into, at [_bpos, _bend) (None: between records).
        self._body: bytearray | mmap.mmap | None = None
        self._bpos = 0
        self._bend = 0
        self._more = False
        #: The frame so far, while its records say "more" follow (None between frames): each
        #: record is read into its end of an anonymous mapping grown in place (``mremap``), so
        #: a frame of many records is never held twice (as records, then joined), and no byte
        #: of it is written before the kernel writes what arrived.
        self._partial: mmap.mmap | bytearray | None = None

    # -- writing ----------------------------------------------------------------------------
    def write(self, parts: list[Any], block: bool = True, deadline: float | None = None) -> None:
        """Write one frame (the parts back to back) as records; all or, with block=False, nothing
        (once part of it is out, the rest within :data:`PARTIAL_WAIT`, or the connection breaks)."""
        total = 0
        for part in parts:  # frames.nbytes, inlined: this is every message's path
            total += part.nbytes if type(part) is memoryview else len(part)
        pieces = parts[-1] if parts else None
        if isinstance(pieces, Pieces):
            self._write_records(parts[:-1], pieces, total, block, deadline)
            return
        if total <= RECORD_MAX:
            iov: list[Any] = [_HEADER.pack(total), *parts]
            if deadline is None and not self.tls and len(iov) <= _IOV_MAX:  # the usual case: one call
                (self.write_record if block else self._try_record)(iov, total)
            else:
                self._write_all([iov[0], *(v for v in map(_byte_view, parts) if v.nbytes)], block, deadline)
            return
        self._write_records(parts, (), total, block, deadline)

    def _write_records(self, whole: list[Any], pieces: Pieces | tuple[()], total: int, block: bool,
                       deadline: float | None) -> None:
        """:meth:`write` of a frame of several records, or of one whose last part is
        :class:`Pieces`: the records are cut as the parts and pieces come, and each piece is
        out before the next is made (its buffer is reused). With ``block=False``, nothing goes
        out or the whole frame within :data:`PARTIAL_WAIT` (or the connection breaks); a write
        stopped in the middle of a frame by anything shuts the connection (the stream could
        carry nothing after a part of a frame)."""
        iov: list[Any] = []
        left, room, sent_any = total, 0, False
        if not block and deadline is None:  # nothing, or the whole frame within PARTIAL_WAIT
            deadline = time.monotonic() + PARTIAL_WAIT
        try:
            for source, reused in ((whole, False), (pieces, True)):
                for piece in source:
                    view = _byte_view(piece)
                    while view:
                        if room == 0:
                            if not left:
                                raise Broken(f"a frame's pieces came to more than the {total} bytes announced")
                            room = min(left, RECORD_MAX)
                            left -= room
                            iov.append(_HEADER.pack(room | (_MORE if left else 0)))
                        take = min(room, len(view))
                        iov.append(view[:take])
                        view = view[take:]
                        room -= take
                    if reused and iov:
                        self._write_all(iov, block, deadline, sent_any)
                        sent_any = True
                        iov = []
            if left or room:
                raise Broken(f"a frame's pieces came to fewer than the {total} bytes announced")
            if iov:
                self._write_all(iov, block, deadline, sent_any)
        except TransportTimeout:  # nothing of the frame went out (after that: Broken)
            raise
        except BaseException:  # perhaps a part went out (an interrupt, a broken limit): the end
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            raise

    def write_record(self, iov: list[Any], total: int) -> None:
        """Write one whole record (``iov``: its header, then ``total`` bytes) on a plain socket,
        blocking: in one call when the socket's buffer takes it, the rest as room comes (through
        the socket object, as every read: a closed one raises)."""
        try:
            n = self._sendmsg(iov)
        except WOULD_BLOCK:
            n = 0
        except OSError as exc:
            raise Gone(str(exc)) from None
        if n != total + 4:
            self._write_all(_after(iov, n), True, None)  # byte views only, none empty (a send of 0 bytes loops)

    def _try_record(self, iov: list[Any], total: int) -> None:
        """:meth:`write_record` without waiting: TransportTimeout when the socket takes none of
        it now; once a part is out, the rest within :data:`PARTIAL_WAIT` (as :meth:`_write_all`)."""
        try:
            n = self.sock.sendmsg(iov, [], _DONTWAIT)
        except WOULD_BLOCK:
            raise TransportTimeout(f"{self.label} cannot take a frame now") from None
        except OSError as exc:
            raise Gone(str(exc)) from None
        if n != total + 4:
            self._write_all(_after(iov, n), False, None, sent_any=True)

    def _write_all(self, iov: list[Any], block: bool, deadline: float | None, sent_any: bool = False) -> None:
        started = not block and deadline is None  # a non-blocking write that got a part out ...
        while iov:
            try:
                if self.tls:
                    chunk = b"".join(iov[:_IOV_MAX])
                    n = self.sock.send(chunk)
                else:  # a plain socket is in blocking mode: MSG_DONTWAIT when we must not wait
                    n = self.sock.sendmsg(iov[:_IOV_MAX], [], 0 if block and deadline is None else _DONTWAIT)
            except WOULD_BLOCK:
                if not block and not sent_any:
                    raise TransportTimeout(f"{self.label} cannot take a frame now") from None
                if started and deadline is None:  # ... finishes it within PARTIAL_WAIT, or the peer is stuck
                    deadline = time.monotonic() + PARTIAL_WAIT
                try:
                    self._wait(select.POLLOUT, deadline)
                except TransportTimeout:
                    if not sent_any:
                        raise
                    raise Broken(f"the peer stopped reading in the middle of a frame for {PARTIAL_WAIT:.0f} "
                                  "s") from None
                continue
            except OSError as exc:
                raise Gone(str(exc)) from None
            sent_any = True
            while n:
                first = iov[0]
                size = len(first)
                if n >= size:
                    n -= size
                    iov.pop(0)
                else:
                    iov[0] = memoryview(first)[n:]
                    n = 0

    def _wait(self, events: int, deadline: float | None) -> None:
        poller = select.poll()
        poller.register(self.sock.fileno(), events)
        remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
        if remaining is not None and remaining <= 0:
            raise TransportTimeout(f"{self.label}: timed out")
        ready = poller.poll(None if remaining is None else remaining * 1000)
        for _, ev in ready:
            if ev & (select.POLLERR | select.POLLNVAL):
                raise Broken("connection failed")

    # -- reading ----------------------------------------------------------------------------
    def pump(self, deliver: Callable[[memoryview], None], wait: bool = False) -> None:
        """Read what the socket has and ``deliver`` each complete frame.

        ``wait``: the first read blocks in the kernel up to the socket's receive timeout
        (:meth:`receive_timeout`; a plain socket only) — no poll(), which costs a
        multiple of a blocking read's wake-up on virtual machines. Raises Broken at EOF
        or when the peer breaks the limits; BlockingIOError-like errors mean "nothing
        (more) now".

        On a plain socket it returns after :data:`PUMP_BYTES` even if more waits (the socket
        stays readable): a peer that writes as fast as this reads would otherwise keep one
        call reading, and what the caller decides between reads (a queue pausing a writer
        past its byte budget) would come only after everything was in.
        """
        read = 0
        while True:
            body = self._body
            if body is not None and self._bend - self._bpos >= len(self._scratch):
                n = self._recv_into(memoryview(body)[self._bpos:self._bend], wait)
                wait = False
                self._bpos += n
                read += n
                if self._bpos == self._bend:
                    self._end_record(deliver)
                    if read >= PUMP_BYTES and not self.tls:
                        return
                continue
            n = self._recv_into(memoryview(self._scratch), wait)
            wait = False
            read += n
            self._parse(memoryview(self._scratch)[:n], deliver)
            if n < len(self._scratch) and not (self.tls and self.sock.pending()):  # type: ignore[attr-defined]
                return
            if read >= PUMP_BYTES and not self.tls:
                return

    @property
    def idle(self) -> bool:
        """Between frames (no record begun), authenticated, on a plain socket."""
        return (self._body is None and self._hpos == 0 and self._partial is None and not self.tls
                and self.session is not None)

    def read_one(self, deliver: Callable[[memoryview], None], wait: bool = True) -> memoryview | None:
        """One read (``wait``: a waiting one, or one of a socket seen readable): the frame,
        when it brought exactly one whole one-record frame; otherwise None, with what it
        brought parsed (whole frames to ``deliver``). The connection must be :attr:`idle`.
        Raises what :meth:`pump` raises."""
        scratch = self._scratch
        n = self._recv_into(scratch, wait)
        if n > 4:  # _whole_record, inlined: every step of a simulator comes here
            (word,) = _HEADER.unpack_from(scratch)  # the "more" bit set: over any max_record
            if word + 4 == n and word <= self._max_one:
                return memoryview(scratch[4:n])  # a copy: the scratch buffer is read into again
        view = memoryview(scratch)[:n]
        self._parse(view, deliver)
        if n == len(scratch):  # more may wait behind
            try:
                self.pump(deliver)
            except WOULD_BLOCK:
                pass
        return None

    def wait_at_most(self, seconds: float | None) -> None:
        """Let a waiting read block up to ``seconds`` (None: until data or EOF), at most
        :data:`IDLE_STEP`; a receive timeout already set within half of that (or a hair
        over) is kept, so waits of similar lengths cost no setsockopt() each; ``seconds`` is kept
        in :attr:`asked`."""
        if seconds is None:
            self.receive_timeout(None)
            return
        target = min(seconds, IDLE_STEP)
        current = self._rcvtimeo
        if not (current is not None and current > 0 and target * 0.5 <= current <= target * 1.001):
            self.receive_timeout(target)
        self.asked = seconds

    def receive_timeout(self, seconds: float | None) -> None:
        """How long a waiting read blocks (None: until data or EOF); a plain socket only."""
        self.asked = -1.0  # what wait_at_most was asked no longer holds
        if seconds is not None:
            seconds = max(0.001, seconds)  # 0 would mean "forever"
        if seconds == self._rcvtimeo:
            return
        whole = 0 if seconds is None else int(seconds)
        micros = 0 if seconds is None else int((seconds - whole) * 1e6)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, _TIMEVAL.pack(whole, micros))
        self._rcvtimeo = seconds

    def _recv_into(self, view: memoryview | bytearray, wait: bool = False) -> int:
        try:
            if self.tls:
                n = self.sock.recv_into(view)
            elif not wait:
                n = self.sock.recv_into(view, 0, _DONTWAIT)
            elif self.spin > 0 and self.spin_gate.open():
                n = self._spin_then_wait(view)
            else:  # through the socket object, never its number: once the reactor closed it, this
                n = self._recv_into_sock(view)  # raises, where a read of the number could reach another file
        except WOULD_BLOCK:
            raise
        except OSError as exc:
            raise Gone(str(exc)) from None
        if n == 0:
            raise Gone("closed by the peer")
        return n

    def _spin_then_wait(self, view: memoryview | bytearray) -> int:
        """A waiting read: poll for ``spin`` seconds, then block in the kernel.

        A reply often comes within tens of microseconds; a thread that sleeps for it
        pays the wake-up of an idle CPU (on virtual machines, a hypervisor exit costing
        more than the reply's own work), and so does the sender, whose write must wake
        it. Polling briefly first keeps both sides on the fast path; a longer wait costs
        at most ``spin`` seconds of one core.
        """
        end = time.perf_counter() + self.spin
        recv_into = self.sock.recv_into
        while True:
            try:
                n = recv_into(view, 0, _DONTWAIT)
                self.spin_gate.result(True)
                return n
            except WOULD_BLOCK:
                if time.perf_counter() > end:
                    self.spin_gate.result(False)
                    return recv_into(view, 0, 0)

    def _parse(self, view: memoryview, deliver: Callable[[memoryview], None]) -> None:
        while view:
            if self._body is None and self._hpos == 0 and self._partial is None:
                end = self._whole_record(view)
                if end:  # the usual case: a whole one-record frame in what was read (one copy)
                    frame = bytearray(view[4:end])
                    view = view[end:]
                    deliver(memoryview(frame))
                    continue
            if self._body is None:
                take = min(4 - self._hpos, len(view))
                self._header[self._hpos:self._hpos + take] = view[:take]
                self._hpos += take
                view = view[take:]
                if self._hpos < 4:
                    return
                self._hpos = 0
                (word,) = _HEADER.unpack(self._header)
                length, self._more = word & ~_MORE, bool(word & _MORE)
                if length > self.max_record or (self._more and self.session is None):
                    raise Broken(f"a record of {length} bytes is over the limit ({self.max_record})")
                if self._more and not length:  # no writer sends one (and a mapping cannot be empty)
                    raise Broken("an empty record in the middle of a frame")
                partial = self._partial
                start = 0 if partial is None else len(partial)
                if start + length > self.max_frame:
                    raise Broken(f"a frame of over {self.max_frame} bytes is over the limit")
                if partial is not None:  # grown in place: remapped, neither copied nor zero-filled
                    self._body = _grown(partial, start + length)
                    self._partial = self._body
                elif self._more:  # a frame of several records: anonymous memory that can grow
                    self._body = self._partial = _frame_buffer(length)
                else:
                    self._body = bytearray(length)
                self._bpos, self._bend = start, start + length
                if length == 0:
                    self._end_record(deliver)
                continue
            take = min(self._bend - self._bpos, len(view))
            self._body[self._bpos:self._bpos + take] = view[:take]
            self._bpos += take
            view = view[take:]
            if self._bpos == self._bend:
                self._end_record(deliver)

    def _whole_record(self, view: memoryview) -> int:
        """Where a one-record frame that ``view`` begins with ends, when it is all there and
        within the limits; 0 otherwise (then the record is parsed piece by piece)."""
        if len(view) < 4:
            return 0
        (word,) = _HEADER.unpack_from(view)  # the "more" bit set: over any max_record
        if word > self.max_record or word > self.max_frame or len(view) < 4 + word:
            return 0
        return 4 + word

    def _end_record(self, deliver: Callable[[memoryview], None]) -> None:
        body, self._body = self._body, None
        assert body is not None
        if self._more:
            return  # the frame goes on in the next record (body is self._partial)
        self._partial = None
        deliver(memoryview(body))

    def authenticated(self, session: Session, max_frame: int) -> None:
        self.session = session
        session.stream_large_frames()  # write() takes Pieces
        self._scratch = bytearray(_SCRATCH)
        self.max_record = RECORD_MAX
        self.max_frame = max_frame
        self._max_one = min(RECORD_MAX, max_frame)

    def close(self, shutdown: bool = True) -> None:
        try:
            if shutdown:
                self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        try:
            self.sock.close()
        except OSError:
            pass


class Line:
    """:class:`fibercore.transport.LineEndpoint`: one authenticated plain connection's frames,
    written and read on the caller's thread with no look-up per call (a connected Pipe end's
    every message). ``read`` is the endpoint's ``recv_frame`` for this connection."""

    __slots__ = ("_conn", "_broken", "read")

    def __init__(self, conn: Conn, broken: Callable[[Conn, str], TransportClosed],
                 read: Callable[..., memoryview | None]) -> None:
        self._conn = conn
        #: What the endpoint does with a connection that broke, and the error to raise.
        self._broken = broken
        self.read = read

    def write_two(self, head: Any, body: Any) -> None:
        """``write([head, body])``, blocking: a frame of one header and one body buffer (a Pipe's
        message; a streamed frame's :class:`Pieces` go through :meth:`write`) in one ``sendmsg``
        when the socket's buffer takes it."""
        conn = self._conn  # plain: a line is never made for a TLS connection
        try:
            total = ((head.nbytes if type(head) is memoryview else len(head))
                     + (len(body) if type(body) is bytes else body.nbytes if type(body) is memoryview
                        else _byte_view(body).nbytes))
            if total <= RECORD_MAX:
                conn.write_record([_HEADER.pack(total), head, body], total)
            else:
                conn.write([head, body], True)
        except Broken as exc:
            raise self._broken(conn, str(exc)) from None

    def write(self, parts: list[Any], peer: Hashable = None, block: bool = True) -> None:
        """The endpoint's ``send_parts`` to this connection, without its send lock: the
        caller holds the peer's session lock, as the core does for every frame it sends."""
        if block and len(parts) == 2 and not isinstance(parts[1], Pieces):  # a Pipe's message: no loop
            self.write_two(parts[0], parts[1])
            return
        conn = self._conn
        try:
            conn.write(parts, block)
        except Broken as exc:
            raise self._broken(conn, str(exc)) from None
