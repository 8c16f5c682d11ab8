"""A pure-Python dialler speaking nng's SP-over-TCP protocol, for forked children.

nng cannot be used in a process forked from one that initialised it ("nng is not
fork-reentrant safe": any nng call aborts the child). Libraries fork their own
children (gymnasium's ``AsyncVectorEnv`` and torch's ``DataLoader`` use
``multiprocessing``'s default start method, fork on Linux) and hand them the
queues and pipes they were given. In such a child the nng transport dials with
this endpoint instead; the listeners on the other side are unchanged nng sockets.

The protocol (nng's TCP transport and its pair protocols), step by step:
  1. each side sends ``00 'S' 'P' 00``, its protocol id (16-bit big-endian) and two
     zero bytes; pair v0 is 0x10, pair v1 is 0x11, and a peer of another protocol
     is refused;
  2. every message is a 64-bit big-endian length followed by that many bytes;
  3. pair v1 messages start with a 32-bit big-endian hop count (1 after one hop;
     the receiver drops anything above its TTL), which is stripped here.
Frames are authenticated above this layer (:mod:`fibercore.wire`), as over nng.
"""

from __future__ import annotations

import collections
import socket
import struct
import threading
import time
from collections.abc import Hashable
from typing import Any

from fibercore.errors import TransportClosed, TransportError, TransportTimeout
from fibercore.transport import PeerCallback

PROTOCOLS = {"pair": 0x10, "router": 0x11}
_LEN = struct.Struct(">Q")
_HOP = struct.Struct(">I")


def _nbytes(part: Any) -> int:
    return part.nbytes if isinstance(part, memoryview) else len(part)


def _split(address: str) -> tuple[str, int]:
    scheme, _, rest = address.partition("://")
    if scheme != "tcp":
        raise TransportError(
            f"cannot reach {address} from a forked child: only tcp is available without nng "
            "(TLS needs the nng transport). Start the child with the 'spawn' or 'forkserver' "
            "method of multiprocessing.")
    host, _, port = rest.rpartition(":")
    return host.strip("[]"), int(port)


class SPDialer:
    """A dialling endpoint (the :class:`~fibercore.transport.Endpoint` protocol)."""

    def __init__(self, kind: str, address: str) -> None:
        self.address = address
        self._proto = PROTOCOLS[kind]
        self._hop = kind == "router"
        self._sock = socket.create_connection(_split(address), timeout=30)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        hello = b"\x00SP\x00" + struct.pack(">H", self._proto) + b"\x00\x00"
        self._sock.sendall(hello)
        answer = self._read_exact(8)
        if answer[:4] != b"\x00SP\x00" or struct.unpack(">H", answer[4:6])[0] != self._proto:
            self._sock.close()
            raise TransportError(f"{address} does not speak the expected SP protocol")
        self._sock.settimeout(None)
        self._send_lock = threading.Lock()
        self._cv = threading.Condition(threading.Lock())
        self._inbox: collections.deque[memoryview] = collections.deque()
        self._closed = False
        self._callbacks: list[PeerCallback] = []
        threading.Thread(target=self._receive, name="fiber-sp-recv", daemon=True).start()

    def _read_exact(self, n: int) -> bytearray:
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            k = self._sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("connection closed")
            got += k
        return buf

    def _receive(self) -> None:
        try:
            while True:
                (size,) = _LEN.unpack(self._read_exact(8))
                body = self._read_exact(size)
                view = memoryview(body)
                if self._hop:
                    if size < 4 or _HOP.unpack(view[:4])[0] > 0xFF:
                        break
                    view = view[4:]
                with self._cv:
                    self._inbox.append(view)
                    self._cv.notify()
        except (OSError, ConnectionError):
            pass
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        for callback in list(self._callbacks):
            try:
                callback(self, False)
            except Exception:
                pass

    def send(self, data: bytes, peer: Hashable | None = None) -> None:
        self.send_parts([data], peer)

    def send_parts(self, parts: list[Any], peer: Hashable | None = None, block: bool = True) -> None:
        size = sum(_nbytes(p) for p in parts) + (4 if self._hop else 0)
        head = _LEN.pack(size) + (_HOP.pack(1) if self._hop else b"")
        with self._send_lock:
            if self._closed:
                raise TransportClosed(f"endpoint {self.address} is closed")
            try:
                self._sock.sendall(head)
                for part in parts:
                    if _nbytes(part):
                        self._sock.sendall(part)
            except OSError as exc:
                raise TransportClosed(f"endpoint {self.address} is closed: {exc}") from exc

    def recv(self, timeout: float | None = None) -> tuple[memoryview, Hashable]:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while not self._inbox:
                if self._closed:
                    raise TransportClosed(f"endpoint {self.address} is closed")
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise TransportTimeout(f"no frame on {self.address} within {timeout} s")
                self._cv.wait(remaining)
            return self._inbox.popleft(), None

    def on_peer_event(self, callback: PeerCallback) -> None:
        self._callbacks.append(callback)
        callback(self, True)

    def close(self) -> None:
        with self._cv:
            if self._closed:
                return
            self._closed = True
            self._cv.notify_all()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
