"""multiprocessing's own objects that are sent to a job, carried over onto fibercore's.

``concurrent.futures.ProcessPoolExecutor(mp_context=fibercore.get_context())`` builds a
``multiprocessing.queues.Queue`` subclass itself (an OS pipe and a feeder thread) and passes
it to its worker processes, which here are jobs, maybe on other machines: an OS pipe
cannot follow. When the serializer meets such a queue, it sends a fibercore ``Queue``
instead, and from then on the multiprocessing queue's ``put``/``put_nowait`` here put into
that fibercore queue (what was already in it is moved over first), where the jobs read.

This carries the way a queue handed to workers is used: this process puts, jobs get. A job
that puts into it puts into the fibercore queue (for the other jobs to read); ``get()`` on
the multiprocessing queue in this process does not see those items.
"""

from __future__ import annotations

import queue as _queue
import threading
import weakref
from typing import Any

_bridges: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def reduce_mp_queue(mp_queue: Any) -> Any:
    """The reduction of the fibercore Queue that stands for ``mp_queue`` in jobs."""
    with _lock:
        bridge = _bridges.get(mp_queue)
        if bridge is None:
            bridge = _bridges[mp_queue] = _carry_over(mp_queue)
    return bridge.__reduce__()


def _carry_over(mp_queue: Any) -> Any:
    from fibercore.queues import Queue

    bridge = Queue()
    while True:  # what was put before: in its buffer (the feeder thread sends it) or its pipe
        try:
            bridge.put(mp_queue.get(timeout=0.05 if mp_queue._buffer else 0.0))
        except (_queue.Empty, OSError, EOFError, ValueError):
            break

    def put(obj: Any, block: bool = True, timeout: float | None = None) -> None:
        if mp_queue._closed:
            raise ValueError(f"Queue {mp_queue!r} is closed")
        bridge.put(obj, block, timeout)

    mp_queue.put = put
    mp_queue.put_nowait = lambda obj: put(obj, False)
    return bridge
