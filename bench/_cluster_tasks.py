"""Job side of bench_cluster.py (importable by reference on the cluster's hosts: the checkout
is mounted there at the same path, and jobs run in the master's working directory)."""

from __future__ import annotations

import socket
import struct
from typing import Any

_HEAD = struct.Struct("<cQ")  # kind, length


def _recv_exactly(conn: socket.socket, n: int, into: bytearray | None = None) -> bytes:
    buf = into if into is not None else bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = conn.recv_into(view[got:n])
        if not k:
            raise EOFError("the client closed")
        got += k
    return bytes(buf[:n]) if into is None else b""


def raw_server(ready: Any) -> None:
    """The floor: a plain TCP server in Python (no framing beyond a length, no
    authentication, no encryption). Messages: ``e`` + n: echo n bytes; ``b`` + n: take n
    bytes, answer one byte; ``n`` + k: take k messages (``m`` + length, then the bytes) one
    by one, answer one byte; ``q``: stop. Its port goes to ``ready``."""
    with socket.create_server(("0.0.0.0", 0)) as server:
        ready.put(server.getsockname()[1])
        conn, _ = server.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sink = bytearray(8 << 20)
        with conn:
            while True:
                kind, n = _HEAD.unpack(_recv_exactly(conn, _HEAD.size))
                if kind == b"e":
                    conn.sendall(_recv_exactly(conn, n))
                elif kind == b"n":
                    reader = conn.makefile("rb", buffering=1 << 16)
                    for _ in range(n):
                        _kind, length = _HEAD.unpack(reader.read(_HEAD.size))
                        reader.read(length)
                    conn.sendall(b"k")
                elif kind == b"b":
                    while n:
                        step = min(n, len(sink))
                        _recv_exactly(conn, step, sink)
                        n -= step
                    conn.sendall(b"k")
                else:
                    return


def sink(conn: Any, reps: int) -> None:
    """Take ``reps`` messages from a Pipe, answering each with one byte."""
    for _ in range(reps):
        conn.recv_bytes()
        conn.send_bytes(b"k")


def sink_objects(conn: Any, reps: int) -> None:
    """Take ``reps`` objects from a Pipe with ``recv()`` (an array arrives in the frame's own
    memory), answering each with one byte."""
    for _ in range(reps):
        conn.recv()
        conn.send_bytes(b"k")


def where() -> tuple[str, int]:
    import os

    return socket.gethostname(), os.getpid()
