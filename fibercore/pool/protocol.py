"""The pool's wire protocol between the master's scheduler and its workers.

Every message travels in an authenticated frame (:mod:`fibercore.wire`) over one
``router`` connection per worker; a frame may carry many messages, so a burst of
small tasks or results costs one transport call::

    worker                                        master (scheduler)
    READY(wid, pid)            ───────────────▶  worker may now receive tasks
    ◀─────── TASK(header, func parts?, payload)  up to `prefetch` chunks in flight
    RESULT(header, payload)    ───────────────▶  removes the chunk from the pending table
    ◀─────────────────────────────────── STEAL   give back chunks not yet started
    RETURNED(cid, ...)         ───────────────▶  they go back to the front of the queue
    ◀──────────────────────────────────── STOP   finish the running chunk, give back the rest
    BYE(reason)                ───────────────▶  the worker leaves (STOP or maxtasksperchild)
    INITFAIL(traceback, exc)   ───────────────▶  the initializer raised; the pool reports it

A chunk is a slice of one map (or one apply); its function travels once per worker
per batch (the worker keeps the last :data:`FUNC_CACHE` functions, and the master
mirrors that cache exactly, since both see the same messages in the same order).
"""

from __future__ import annotations

import struct

READY, TASK, RESULT, STEAL, RETURNED, STOP, BYE, INITFAIL = range(1, 9)

# Chunk kinds: how the worker calls the function on the payload.
APPLY, MAP, STARMAP = 0, 1, 2

#: Functions a worker keeps per batch id (first in, first out).
FUNC_CACHE = 64

# TASK header: chunk id, batch id, kind, how many parts of the frame are the pickled
# function (0: the worker has it already). A function pickle has one part per
# out-of-band buffer it holds (a numpy array it closes over), so this is a count.
_TASK = struct.Struct("<QQBI")
# RESULT header: chunk id, ok flag, microseconds spent running the chunk.
_RESULT = struct.Struct("<QBQ")


def task_header(cid: int, bid: int, kind: int, func_parts: int) -> bytes:
    return _TASK.pack(cid, bid, kind, func_parts)


def read_task_header(part: bytes | memoryview) -> tuple[int, int, int, int]:
    """(chunk id, batch id, kind, number of function parts that follow the header)."""
    return _TASK.unpack(part)


def result_header(cid: int, ok: bool, micros: int) -> bytes:
    return _RESULT.pack(cid, ok, micros)


def read_result_header(part: bytes | memoryview) -> tuple[int, bool, int]:
    cid, ok, micros = _RESULT.unpack(part)
    return cid, bool(ok), micros


def ids(values: list[int]) -> bytes:
    return struct.pack(f"<{len(values)}Q", *values)


def read_ids(part: bytes | memoryview) -> list[int]:
    return list(struct.unpack(f"<{len(part) // 8}Q", part))
