"""The queue protocol: what a broker and its clients send each other.

Every message is an op and its parts; integers are little-endian u64 (:func:`u64`), as in
the pool's and the managers' protocols. Requests that expect a reply start with a request id
(a u64), which the reply carries back.

    client -> broker                          broker -> client
    PUT item                                  ITEM item (a leased item, one per message)
    PUTSYNC req item (bounded queue)          PUTACK req (admitted)
    CANCEL req original_req                   CANCELLED req taken_back (0/1)
    GET want consumed nowait standing         EMPTY (a nowait GET found nothing)
    ACK consumed                              DONE (a standing GET is answered: ask again)
    RETURN consumed n (give n leased back)    RECALL (give back what you have not consumed)
    SIZE req consumed                         SIZEIS req size
    COUNTED req consumed                      COUNT req (what have you consumed?)
    TASKDONE n
    JOIN req                                  JOINED req
    INTRO host\0pid\0machine (once, first)

``consumed`` is how many lent items the client has taken so far: it acknowledges them.
A COUNT is sent by the broker to each reader holding lent items when the queue's creator
asks its size (``qsize``, ``empty``, ``full``); the reader answers at once with COUNTED, so
items a reader took before anything the creator saw it do are no longer counted.
A RETURN also withdraws the client's GET, if one is out: nothing is lent between a RECALL
and its RETURN, and a client counts its GET answered once it returned.

A *standing* GET (a blocking ``get``'s) stays open across items while its reader is the
queue's only one and keeps up: each item put is then sent to it at once, with no GET per
item, and the reader acknowledges what it consumed with an ACK every :data:`ACK_EVERY`
items (or after ``QUIET`` seconds without an item). The broker answers it for the last time,
with DONE after the items, once anything else is due: another reader (or a getter in the
creator), items left over after a grant, or :data:`STANDING_CREDIT` items lent and not
acknowledged.
"""

from __future__ import annotations

import itertools
import queue as _stdlib_queue
import struct
from typing import Any

from fibercore.wire.frames import nbytes

(PUT, PUTSYNC, PUTACK, CANCEL, CANCELLED, GET, ITEM, EMPTY, RECALL, RETURN, SIZE, SIZEIS,
 TASKDONE, JOIN, JOINED, ACK, DONE, COUNT, COUNTED, INTRO) = range(1, 21)


def intro() -> bytes:
    """What a client says of its process when it connects (INTRO): host, pid and machine
    identity, so that a job declared lost (:mod:`fibercore.liveness`) has its leases taken
    back at once."""
    import os
    import socket

    from fibercore.util import machine_identity

    return f"{socket.gethostname()}\0{os.getpid()}\0{machine_identity()}".encode()


def read_intro(part: Any) -> tuple[str, int, str] | None:
    """(host, pid, machine) from an INTRO's part; None when malformed."""
    try:
        host, pid, machine = bytes(part).decode().split("\0")
        return host, int(pid), machine
    except (UnicodeDecodeError, ValueError):
        return None

#: Most items, and bytes (at least one item), a reader is lent per request. A grant is one
#: frame: 1 MiB ones measured 1.5-1.9x the rate of 4 MiB ones for 10-1,000 KB items (a frame
#: over the transport's record size is joined from pieces, and a reader's fresh multi-MiB
#: buffer costs a page fault per page).
MAX_GRANT = 4096
GRANT_BYTES = 1 << 20
#: Items a standing GET may hold lent and unacknowledged before the broker ends it.
STANDING_CREDIT = 64
#: Seconds the creator's ``qsize`` waits for readers' answers to COUNT; a reader that did not
#: answer in time (stopped, or busy without releasing the GIL) is not asked again until it
#: next speaks, and its lent items count as still queued.
COUNT_WAIT = 2.0
#: A reader with a standing GET acknowledges after consuming this many items. Each ACK wakes
#: the broker's receiving thread in the creator (a GIL switch there, a send here): every 16
#: items instead of every 8 took a 100-byte Queue round trip from 1.15x to 1.08x fork's
#: (``bench_rl.py --paired queue``). What is lent and not acknowledged stays within the
#: credit and the queue's byte budget, and comes back through RECALL when another reader waits.
#: A reader also acknowledges within a quarter of a bounded queue's ``maxsize`` and of the
#: byte budget; a put that finds no room while items are lent asks their readers what they
#: consumed (COUNT, at most every QUIET seconds each), without waiting for the answers.
ACK_EVERY = 16
Empty = _stdlib_queue.Empty
Full = _stdlib_queue.Full

#: Seconds without a waiting thread after which a client's background thread reads its
#: connection (RECALLs, a late acknowledgement).
QUIET = 0.05

_U64 = struct.Struct("<Q")


def u64(n: int) -> bytes:
    """An integer (or a flag) as the protocol writes it."""
    return _U64.pack(n)


def read_u64(part: Any) -> int:
    """The integer :func:`u64` wrote."""
    return int(_U64.unpack(part)[0])


def item_bytes(parts: list[Any]) -> int:
    """The bytes of an item's parts (a broker counts each item three times: put, lent,
    acknowledged; most items are one pickle)."""
    if len(parts) == 1:
        part = parts[0]
        return part.nbytes if type(part) is memoryview else len(part)  # frames.nbytes, inlined
    return sum(map(nbytes, parts))


def items_bytes(items: list[list[Any]]) -> int:
    """The bytes of many items (a grant acknowledged): counted in C when every part is a
    pickle, as most are, else item by item."""
    parts = list(itertools.chain.from_iterable(items))
    if set(map(type, parts)) <= {bytes}:
        return sum(map(len, parts))
    return sum(map(item_bytes, items))
