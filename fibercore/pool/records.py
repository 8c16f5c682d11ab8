"""The records a Pool's rooms share: the states, worker slots, batches and chunks.

Nothing here locks or runs: the rooms that change these records (dispatch, fleet,
supervision) say which lock guards which field.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Iterator
from typing import Any

from fibercore.pool import protocol as P
from fibercore.process import Process
from fibercore.wire.frames import nbytes

#: A worker's life: STARTING (job launched, not connected) -> READY (takes tasks) ->
#: RETIRING (asked to stop) or LEAVING (said goodbye) -> DEAD (forgotten).
STARTING, READY, RETIRING, LEAVING, DEAD = "starting", "ready", "retiring", "leaving", "dead"
#: The pool's life, as multiprocessing.Pool's.
RUN, CLOSE, TERMINATE = "running", "closed", "terminated"


class Batch:
    """One map/apply call: its function (pickled once) and the object its results go to."""

    __slots__ = ("bid", "kind", "func_parts", "sink", "name", "cancelled")

    def __init__(self, bid: int, kind: int, func_parts: list[Any] | None, sink: Any, name: str) -> None:
        self.bid = bid
        self.kind = kind
        self.func_parts = func_parts
        self.sink = sink
        self.name = name
        self.cancelled: BaseException | None = None  # the error its chunks fail with once cancelled


#: A chunk of this many bytes of arguments or more is not prefetched: a worker receives it
#: only when it holds nothing else, so it never keeps a large task's frame while it runs
#: another (a multiprocessing worker reads its next task only after the last). The cost, one
#: round trip between two such chunks, is small beside moving a megabyte.
LARGE_CHUNK = 1 << 20


class Chunk:
    """A slice of a batch; the unit that is queued, sent, retried and answered."""

    __slots__ = ("cid", "batch", "index", "payload", "large", "attempts", "errors", "done", "last_worker")

    def __init__(self, cid: int, batch: Batch, index: int, payload: list[Any]) -> None:
        self.cid = cid
        self.batch = batch
        self.index = index
        self.payload = payload
        #: Its arguments come to :data:`LARGE_CHUNK` bytes or more: it goes to a worker holding
        #: nothing (never prefetched behind a running chunk).
        self.large = sum(map(nbytes, payload)) >= LARGE_CHUNK
        self.attempts = 0
        self.errors = 0  # times its function raised and it was run again (error_handling)
        self.done = False
        self.last_worker: WorkerSlot | None = None


class WorkerSlot:
    """What the pool knows of one worker job.

    The fleet owns ``state``, ``peer``, the launch fields and ``exitcode``; dispatch owns
    ``pending``, ``known``, ``sent``, ``steal_sent``, ``busy_since``, ``in_idle`` and ``in_room``. All of
    them change under the pool's lock.
    """

    def __init__(self, wid: int, process: Process | None, deadline: float) -> None:
        self.wid = wid
        self.process = process  # None for an external worker (benchmark harness)
        self.state = STARTING
        self.peer: Hashable | None = None
        self.pending: dict[int, Chunk] = {}
        self.known: OrderedDict[int, None] = OrderedDict()  # mirror of the worker's function cache
        self.sent = 0  # chunks handed over and not given back (for maxtasksperchild)
        self.steal_sent = False
        #: When the worker began its current chunk, as the master sees it (the chunk was
        #: sent to it idle, or the result before it came back); 0.0 with nothing pending.
        self.busy_since = 0.0
        self.in_idle = self.in_room = False
        self.deadline = deadline
        self.launch_error: BaseException | None = None
        self.launched = False  # handed to the backend (see Fleet.start_concurrency)
        self.settled = False  # ready, failed or gone since its launch
        self.killed_by_pool = False
        self.stopped_for_cancel = False  # killed because a task it held was cancelled
        self.exitcode: int | None = None

    @property
    def name(self) -> str:
        return self.process.name if self.process is not None else f"external-worker-{self.wid}"

    def poll(self) -> int | None:
        if self.process is None or not self.process.launched:
            return None
        return self.process.exitcode

    def lost(self) -> str | None:
        """Why its job was declared lost by the heartbeat (a silent host), or None."""
        popen = getattr(self.process, "_popen", None) if self.process is not None else None
        return getattr(popen, "lost", None)


def _item_range(chunk: Chunk) -> tuple[int, int]:
    """The first and last index (inclusive) of the user's items a map chunk holds."""
    size = getattr(chunk.batch.sink, "_chunksize", 1) or 1
    first = chunk.index * size
    last = first + size - 1
    values = getattr(chunk.batch.sink, "_value", None)
    if isinstance(values, list) and values:  # a MapResult knows how many items there are
        last = min(last, len(values) - 1)
    return first, last


def items_text(chunk: Chunk) -> str:
    """Which items of the user's call a chunk holds: "item 7", "items 20-29"."""
    if chunk.batch.kind == P.APPLY:
        return "the call"
    first, last = _item_range(chunk)
    return f"item {first}" if last <= first else f"items {first}-{last}"


def chunk_items(chunk: Chunk) -> int:
    """How many of the user's tasks a chunk holds (1 for an apply; a map's last chunk may hold fewer)."""
    if chunk.batch.kind == P.APPLY:
        return 1
    first, last = _item_range(chunk)
    return max(0, last - first + 1)


def func_name(func: Any) -> str:
    return getattr(func, "__qualname__", None) or getattr(func, "__name__", None) or type(func).__name__


def chunked(iterable: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """Lists of ``size`` items (the last may be shorter)."""
    it = iter(iterable)
    while True:
        chunk = list(itertools.islice(it, size))
        if not chunk:
            return
        yield chunk
