"""``fibercore.pool``: the Pool and its result objects.

Layout: :mod:`~fibercore.pool.api` (the ``Pool`` class users call),
:mod:`~fibercore.pool.scheduler` (the master side: its endpoint, its lock and the thread
that routes worker messages to three rooms: :mod:`~fibercore.pool.dispatch` for the task
queue and pending tables, :mod:`~fibercore.pool.fleet` for the worker jobs,
:mod:`~fibercore.pool.supervision` for deaths, retries and backoff; their shared records
in :mod:`~fibercore.pool.records`),
:mod:`~fibercore.pool.worker` (the loop each worker job runs),
:mod:`~fibercore.pool.protocol` (the messages between them) and
:mod:`~fibercore.pool.results` (``AsyncResult``, ``IMapIterator``...).

Names are imported on first use, so a worker job imports only its own loop.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fibercore.pool.api import Pool, ThreadPool
    from fibercore.pool.results import (
        ApplyResult,
        AsyncResult,
        IMapIterator,
        IMapUnorderedIterator,
        MapResult,
    )

_LAZY = {
    "Pool": "fibercore.pool.api",
    "ThreadPool": "fibercore.pool.api",
    "ApplyResult": "fibercore.pool.results",
    "AsyncResult": "fibercore.pool.results",
    "IMapIterator": "fibercore.pool.results",
    "IMapUnorderedIterator": "fibercore.pool.results",
    "MapResult": "fibercore.pool.results",
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'fibercore.pool' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), name)
    globals()[name] = value
    return value


__all__ = [
    "ApplyResult",
    "AsyncResult",
    "IMapIterator",
    "IMapUnorderedIterator",
    "MapResult",
    "Pool",
    "ThreadPool",
]
